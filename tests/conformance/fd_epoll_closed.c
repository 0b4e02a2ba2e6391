/*
 * fd_epoll_closed: epoll entries whose fd number was closed while the
 * file lives on. Entry A: pipe read end registered as fd a (data 7), then
 * dup'ed and fd a closed. Entry C: another pipe's read end registered as
 * fd c (data 9), dup'ed, fd c closed and the number reused by /dev/null.
 * The kernel keeps both entries, keyed by the old numbers. After restore:
 * fdinfo of the epoll lists the same tfd/events/data, fd c is /dev/null
 * again, and data written to each pipe makes epoll_wait report its data
 * (7, then 9).
 */
#include "ferry_test.h"
#include <sys/epoll.h>

static uint64_t wait_data(int ep, int ms)
{
	struct epoll_event ev;
	int n = epoll_wait(ep, &ev, 1, ms);
	return n == 1 ? ev.data.u64 : (uint64_t)-1;
}

int main(void)
{
	ft_init();
	int ep = (int)FT_SYS(epoll_create1(EPOLL_CLOEXEC));
	int p[2], q[2];
	FT_SYS(pipe(p));
	FT_SYS(pipe(q));
	struct epoll_event ev = { .events = EPOLLIN, .data.u64 = 7 };
	int a = p[0];
	FT_SYS(epoll_ctl(ep, EPOLL_CTL_ADD, a, &ev));
	int a2 = (int)FT_SYS(dup(a));
	FT_SYS(close(a));
	ev.data.u64 = 9;
	int c = q[0];
	FT_SYS(epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev));
	int c2 = (int)FT_SYS(dup(c));
	FT_SYS(close(c));
	int nul = (int)FT_SYS(open("/dev/null", O_RDONLY));
	if (nul != a && nul != c)
		ft_die("/dev/null got fd %d, not a reused number (%d or %d)", nul, a, c);
	char before[512];
	ft_epoll_entries(ep, before, sizeof(before));
	ft_log("entries %s; a=%d c=%d nul=%d a2=%d c2=%d", before, a, c, nul, a2, c2);

	ft_ready();
	ft_wait_restored();

	char after[512];
	ft_epoll_entries(ep, after, sizeof(after));
	/* fdinfo lists entries in the kernel's tree order (by file address): compare as sets. */
	int same = strlen(before) == strlen(after);
	for (char *e = before; same && (e = strchr(e, '[')); e++) {
		char one[128];
		char *end = strchr(e, ']');
		snprintf(one, sizeof(one), "%.*s", end ? (int)(end - e + 1) : 0, e);
		same = strstr(after, one) != NULL;
	}
	FT_CHECK(same, "epoll entries %s -> %s", before, after);
	char link[64] = "", path[64];
	snprintf(path, sizeof(path), "/proc/self/fd/%d", nul);
	ssize_t n = readlink(path, link, sizeof(link) - 1);
	FT_CHECK(n > 0 && strcmp(link, "/dev/null") == 0, "fd %d is '%s', expected /dev/null", nul, link);
	FT_EQ(wait_data(ep, 0), (uint64_t)-1, "epoll reports nothing before any write");
	FT_SYS(write(p[1], "x", 1));
	FT_EQ(wait_data(ep, 2000), 7, "data of the entry whose number was closed");
	char b;
	FT_SYS(read(a2, &b, 1));
	FT_SYS(write(q[1], "y", 1));
	FT_EQ(wait_data(ep, 2000), 9, "data of the entry whose number was reused");
	return ft_finish();
}
