/*
 * fd_epoll: one epoll instance with: pipe A read end (EPOLLIN, data 0x1111),
 * eventfd E (EPOLLIN|EPOLLET, data 0x2222), pipe B write end (EPOLLOUT, data
 * 0x3333, always ready), pipe C read end S (EPOLLIN|EPOLLONESHOT, data
 * 0x4444). Nothing but B is ready at checkpoint time. After restore:
 * fdinfo tfd/events/data lines unchanged; epoll_wait(0) reports only B;
 * after writing A and E it reports A, E, B with the right data; a second
 * wait reports A and B but not E (edge-triggered); S fires once after its
 * write end is written and not again (one-shot) until re-armed with EPOLL_CTL_MOD.
 */
#include "ferry_test.h"
#include <sys/epoll.h>
#include <sys/eventfd.h>

static int ep;

static unsigned wait_mask(unsigned *evA)
{
	struct epoll_event ev[8];
	int n = epoll_wait(ep, ev, 8, 0);
	unsigned m = 0;
	for (int i = 0; i < n; i++) {
		switch (ev[i].data.u64) {
		case 0x1111: m |= 1; if (evA) *evA = ev[i].events; break;
		case 0x2222: m |= 2; break;
		case 0x3333: m |= 4; break;
		case 0x4444: m |= 8; break;
		default: m |= 0x100; break;
		}
	}
	return m;
}

/* "tfd: N events: X data: Y" entries of the epoll fdinfo, sorted (the
 * kernel lists them in an order that depends on struct file addresses). */
static int tfd_lines(int fd, char *out, size_t n)
{
	char path[64], buf[8192];
	char ent[16][128];
	int ne = 0;
	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", fd);
	if (ft_read_file(path, buf, sizeof(buf)) < 0)
		return -1;
	char *line = buf;
	while (line && *line) {
		char *nl = strchr(line, '\n');
		if (nl)
			*nl = 0;
		if (strncmp(line, "tfd:", 4) == 0 && ne < 16) {
			char *cut = strstr(line, " pos:");
			if (cut)
				*cut = 0;
			strncpy(ent[ne], line, sizeof(ent[0]) - 1);
			ent[ne++][sizeof(ent[0]) - 1] = 0;
		}
		line = nl ? nl + 1 : NULL;
	}
	for (int i = 0; i < ne; i++)
		for (int k = i + 1; k < ne; k++)
			if (strcmp(ent[k], ent[i]) < 0) {
				char t[128];
				memcpy(t, ent[i], sizeof(t));
				memcpy(ent[i], ent[k], sizeof(t));
				memcpy(ent[k], t, sizeof(t));
			}
	out[0] = 0;
	for (int i = 0; i < ne; i++) {
		strncat(out, ent[i], n - strlen(out) - 2);
		strcat(out, ";");
	}
	return 0;
}

int main(void)
{
	ft_init();
	int pa[2], pb[2], sp[2];
	FT_SYS(pipe(pa));
	FT_SYS(pipe(pb));
	FT_SYS(pipe(sp));
	int e = (int)FT_SYS(eventfd(0, EFD_NONBLOCK));
	ep = (int)FT_SYS(epoll_create1(0));
	struct epoll_event ev;
	ev.events = EPOLLIN;
	ev.data.u64 = 0x1111;
	FT_SYS(epoll_ctl(ep, EPOLL_CTL_ADD, pa[0], &ev));
	ev.events = EPOLLIN | EPOLLET;
	ev.data.u64 = 0x2222;
	FT_SYS(epoll_ctl(ep, EPOLL_CTL_ADD, e, &ev));
	ev.events = EPOLLOUT;
	ev.data.u64 = 0x3333;
	FT_SYS(epoll_ctl(ep, EPOLL_CTL_ADD, pb[1], &ev));
	ev.events = EPOLLIN | EPOLLONESHOT;
	ev.data.u64 = 0x4444;
	FT_SYS(epoll_ctl(ep, EPOLL_CTL_ADD, sp[0], &ev));
	char before[2048], after[2048];
	tfd_lines(ep, before, sizeof(before));
	FT_CHECK(wait_mask(NULL) == 4, "setup: unexpected ready set");

	ft_ready();
	ft_wait_restored();

	tfd_lines(ep, after, sizeof(after));
	FT_CHECK(strcmp(before, after) == 0, "epoll fdinfo differs:\n  before: %s\n  after:  %s", before, after);
	unsigned m = wait_mask(NULL);
	FT_EQ(m, 4, "ready set right after restore (only pipe B writable)");
	FT_SYS(write(pa[1], "a", 1));
	uint64_t one = 1;
	FT_SYS(write(e, &one, 8));
	unsigned evA = 0;
	m = wait_mask(&evA);
	FT_EQ(m, 1 | 2 | 4, "ready set after making A and E ready");
	FT_CHECK(evA == EPOLLIN, "A events 0x%x", evA);
	m = wait_mask(NULL);
	FT_EQ(m, 1 | 4, "second wait (E is edge-triggered)");
	FT_SYS(write(e, &one, 8));
	FT_EQ(wait_mask(NULL), 1 | 2 | 4, "E reported again after a new edge");
	FT_SYS(write(sp[1], "s", 1));
	FT_EQ(wait_mask(NULL) & 8, 8, "S (oneshot) reported");
	FT_EQ(wait_mask(NULL) & 8, 0, "S (oneshot) reported twice");
	ev.events = EPOLLIN | EPOLLONESHOT;
	ev.data.u64 = 0x4444;
	FT_SYS(epoll_ctl(ep, EPOLL_CTL_MOD, sp[0], &ev));
	FT_EQ(wait_mask(NULL) & 8, 8, "S reported after re-arm");
	return ft_finish();
}
