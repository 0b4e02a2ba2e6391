/*
 * fd_epoll_dup_closed: one file registered in an epoll twice, under two
 * fd numbers (a pipe's read end as fd a, data 7, and as fd 999 =
 * dup2(a, 999), data 8), then fd 999 closed: the kernel keeps both
 * entries, keyed by file and number. After restore: fdinfo lists the same
 * two entries, and data in the pipe makes epoll_wait report both (7 and
 * 8).
 */
#include "ferry_test.h"
#include <sys/epoll.h>

int main(void)
{
	ft_init();
	int p[2];
	FT_SYS(pipe(p));
	int ep = (int)FT_SYS(epoll_create1(0));
	int a = (int)FT_SYS(dup(p[0]));
	struct epoll_event ev = { .events = EPOLLIN, .data.u64 = 7 };
	FT_SYS(epoll_ctl(ep, EPOLL_CTL_ADD, a, &ev));
	int b = (int)FT_SYS(dup2(a, 999));
	ev.data.u64 = 8;
	FT_SYS(epoll_ctl(ep, EPOLL_CTL_ADD, b, &ev));
	FT_SYS(close(b));
	char before[1024], after[1024];
	ft_epoll_entries(ep, before, sizeof(before));

	ft_ready();
	ft_wait_restored();

	ft_epoll_entries(ep, after, sizeof(after));
	FT_CHECK(strcmp(before, after) == 0, "epoll entries: before %s, after %s", before, after);
	FT_SYS(write(p[1], "x", 1));
	struct epoll_event got[4];
	int n = epoll_wait(ep, got, 4, 2000);
	uint64_t seen = 0;
	for (int i = 0; i < n; i++)
		seen |= 1ULL << got[i].data.u64;
	FT_EQ(n, 2, "entries reported ready");
	FT_EQ(seen, (1ULL << 7) | (1ULL << 8), "data of the ready entries (bit mask)");
	return ft_finish();
}
