/*
 * thread_ppoll_sigmask: a thread whose real mask blocks SIGUSR1 is blocked
 * in ppoll() on an empty pipe with a temporary mask that unblocks SIGUSR1
 * (and blocks SIGHUP instead) during the checkpoint. After restore:
 *  - SIGUSR1 sent to the thread must be delivered during ppoll (temporary
 *    mask still in effect), making ppoll return -1/EINTR;
 *  - afterwards the thread's mask must be its real mask again
 *    (SIGUSR1 blocked, SIGHUP not blocked).
 * An engine that dumps "blocked" while the thread is inside ppoll sees the
 * temporary mask; it must restore the saved (real) mask as the thread mask.
 */
#include "ferry_test.h"
#include <poll.h>

static int p[2];
static pid_t tid;
static int pret = -2, perr;
static volatile int handled;
static sigset_t mask_after;

static void on_usr1(int sig)
{
	(void)sig;
	handled = 1;
}

static void *poller(void *arg)
{
	(void)arg;
	sigset_t real, tmp;
	sigemptyset(&real);
	sigaddset(&real, SIGUSR2);
	sigaddset(&real, SIGUSR1);
	pthread_sigmask(SIG_SETMASK, &real, NULL);
	sigemptyset(&tmp);
	sigaddset(&tmp, SIGUSR2);
	sigaddset(&tmp, SIGHUP);
	tid = ft_gettid();
	struct pollfd pfd = { .fd = p[0], .events = POLLIN };
	pret = ppoll(&pfd, 1, NULL, &tmp);
	perr = errno;
	pthread_sigmask(SIG_BLOCK, NULL, &mask_after);
	return NULL;
}

int main(void)
{
	ft_init();
	struct sigaction sa = { .sa_handler = on_usr1 };
	FT_SYS(sigaction(SIGUSR1, &sa, NULL));
	FT_SYS(pipe(p));
	pthread_t t;
	FT_PT(pthread_create(&t, NULL, poller, NULL));
	while (!tid)
		ft_sleep_ms(1);
	ft_wait_in_syscall(tid, SYS_ppoll, 2);
	char blk[32];
	ft_status_field(tid, "SigBlk", blk, sizeof(blk));

	ft_ready();
	ft_wait_restored();

	FT_CHECK(pret == -2, "ppoll returned early: %d (%s)", pret, strerror(perr));
	ft_wait_in_syscall(tid, SYS_ppoll, 3);
	pthread_kill(t, SIGUSR1);
	double dl = ft_mono() + 2;
	while (!handled && ft_mono() < dl)
		ft_sleep_ms(2);
	FT_CHECK(handled, "SIGUSR1 not delivered while in ppoll: temporary ppoll mask lost");
	if (!handled)
		FT_SYS(write(p[1], "x", 1)); /* release the thread anyway */
	if (ft_join(t, NULL, 5, "poller") == 0) {
		if (handled)
			FT_CHECK(pret == -1 && perr == EINTR, "ppoll returned %d (%s), expected EINTR", pret,
				 strerror(perr));
		FT_CHECK(sigismember(&mask_after, SIGUSR1), "real mask lost after ppoll: SIGUSR1 unblocked");
		FT_CHECK(!sigismember(&mask_after, SIGHUP),
			 "ppoll's temporary mask leaked: SIGHUP still blocked after ppoll");
		FT_CHECK(sigismember(&mask_after, SIGUSR2), "SIGUSR2 unblocked after ppoll");
	}
	return ft_finish();
}
