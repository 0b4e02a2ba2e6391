/*
 * thread_epoll_wait: a thread is blocked in epoll_wait(timeout=-1) on an
 * epoll set with an eventfd (data 0xfeed) during the checkpoint. After
 * restore the main thread writes the eventfd; epoll_wait must return
 * exactly 1 event with EPOLLIN and data 0xfeed (not -1/EINTR: the kernel
 * returns EINTR when the call is interrupted by a ptrace stop, so the engine
 * must restart it).
 */
#include "ferry_test.h"
#include <sys/epoll.h>
#include <sys/eventfd.h>

static int ep, efd;
static pid_t tid;
static int ret = -2, err;
static struct epoll_event got[4];

static void *waiter(void *arg)
{
	(void)arg;
	tid = ft_gettid();
	ret = epoll_wait(ep, got, 4, -1);
	err = errno;
	return NULL;
}

int main(void)
{
	ft_init();
	ep = (int)FT_SYS(epoll_create1(EPOLL_CLOEXEC));
	efd = (int)FT_SYS(eventfd(0, EFD_NONBLOCK));
	struct epoll_event ev = { .events = EPOLLIN, .data.u64 = 0xfeed };
	FT_SYS(epoll_ctl(ep, EPOLL_CTL_ADD, efd, &ev));
	pthread_t t;
	FT_PT(pthread_create(&t, NULL, waiter, NULL));
	while (!tid)
		ft_sleep_ms(1);
	ft_wait_in_syscall2(tid, SYS_epoll_wait, SYS_epoll_pwait, 2);

	ft_ready();
	ft_wait_restored();

	FT_CHECK(ret == -2, "epoll_wait returned early: %d (%s)", ret, strerror(err));
	ft_sleep_ms(50);
	uint64_t one = 1;
	FT_SYS(write(efd, &one, 8));
	if (ft_join(t, NULL, 5, "epoll waiter") == 0) {
		FT_CHECK(ret == 1, "epoll_wait returned %d (%s)", ret, ret < 0 ? strerror(err) : "");
		if (ret == 1) {
			FT_EQ(got[0].data.u64, 0xfeed, "event data");
			FT_CHECK(got[0].events & EPOLLIN, "event mask 0x%x lacks EPOLLIN", got[0].events);
		}
	}
	return ft_finish();
}
