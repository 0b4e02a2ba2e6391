/*
 * sig_sigaction_flags: installs SIGUSR1 (SA_SIGINFO|SA_RESTART|SA_ONSTACK,
 * sa_mask {SIGHUP, SIGRTMIN+5}), SIGHUP (SA_NODEFER|SA_RESETHAND), SIGPIPE
 * ignored, SIGCHLD with SA_NOCLDSTOP, SIGRTMIN+1 plain handler, plus an
 * alternate stack. After restore: the raw kernel sigaction (handler, flags,
 * restorer, mask) of every signal 1..64 equals the one before; SIGUSR1's
 * handler runs with siginfo, on the altstack, with SIGHUP and SIGRTMIN+5
 * blocked; SA_RESTART still restarts a read() interrupted by SIGUSR1;
 * SIGHUP's handler runs once and the disposition resets to SIG_DFL.
 */
#include "ferry_test.h"

struct ksa {
	void *handler;
	unsigned long flags;
	void *restorer;
	uint64_t mask;
};

static struct ksa before[65];
static char *altstack;
#define ALTSZ (64 * 1024)

static volatile int usr1_count, usr1_signo, usr1_onstack, usr1_mask_ok, usr1_code;
static volatile int hup_count, hup_nodefer;

static void on_usr1(int sig, siginfo_t *si, void *uc)
{
	(void)uc;
	char here;
	usr1_count++;
	usr1_signo = si->si_signo;
	usr1_code = si->si_code;
	usr1_onstack = &here >= altstack && &here < altstack + ALTSZ;
	sigset_t cur;
	pthread_sigmask(SIG_BLOCK, NULL, &cur);
	usr1_mask_ok = sigismember(&cur, SIGHUP) && sigismember(&cur, SIGRTMIN + 5) && sigismember(&cur, sig);
}

static void on_hup(int sig)
{
	sigset_t cur;
	pthread_sigmask(SIG_BLOCK, NULL, &cur);
	hup_nodefer = !sigismember(&cur, sig);
	hup_count++;
}

static void on_rt(int sig)
{
	(void)sig;
}

static int get_ksa(int sig, struct ksa *k)
{
	return (int)syscall(SYS_rt_sigaction, sig, NULL, k, 8);
}

static int rfd[2];
static ssize_t rret = -2;
static int rerr;
static pid_t rtid;

static void *reader(void *arg)
{
	(void)arg;
	sigset_t s;
	sigemptyset(&s);
	sigaddset(&s, SIGUSR1);
	pthread_sigmask(SIG_UNBLOCK, &s, NULL);
	char b[8];
	rtid = ft_gettid();
	rret = read(rfd[0], b, sizeof(b));
	rerr = errno;
	return NULL;
}

int main(void)
{
	ft_init();
	altstack = malloc(ALTSZ);
	stack_t ss = { .ss_sp = altstack, .ss_size = ALTSZ, .ss_flags = 0 };
	FT_SYS(sigaltstack(&ss, NULL));
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_usr1;
	sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
	sigemptyset(&sa.sa_mask);
	sigaddset(&sa.sa_mask, SIGHUP);
	sigaddset(&sa.sa_mask, SIGRTMIN + 5);
	FT_SYS(sigaction(SIGUSR1, &sa, NULL));
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_hup;
	sa.sa_flags = SA_NODEFER | SA_RESETHAND;
	FT_SYS(sigaction(SIGHUP, &sa, NULL));
	signal(SIGPIPE, SIG_IGN);
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = SIG_DFL;
	sa.sa_flags = SA_NOCLDSTOP;
	FT_SYS(sigaction(SIGCHLD, &sa, NULL));
	signal(SIGRTMIN + 1, on_rt);
	for (int sig = 1; sig <= 64; sig++)
		if (get_ksa(sig, &before[sig]) != 0)
			memset(&before[sig], 0xff, sizeof(before[sig]));
	FT_SYS(pipe(rfd));

	ft_ready();
	ft_wait_restored();

	for (int sig = 1; sig <= 64; sig++) {
		struct ksa k;
		if (get_ksa(sig, &k) != 0)
			memset(&k, 0xff, sizeof(k));
		if (memcmp(&k, &before[sig], sizeof(k)) != 0)
			ft_fail("signal %d: sigaction handler %p flags 0x%lx restorer %p mask 0x%llx, was %p 0x%lx "
				"%p 0x%llx",
				sig, k.handler, k.flags, k.restorer, (unsigned long long)k.mask, before[sig].handler,
				before[sig].flags, before[sig].restorer, (unsigned long long)before[sig].mask);
	}
	struct sigaction r;
	sigaction(SIGUSR1, NULL, &r);
	FT_CHECK((r.sa_flags & (SA_SIGINFO | SA_RESTART | SA_ONSTACK)) == (SA_SIGINFO | SA_RESTART | SA_ONSTACK),
		 "SIGUSR1 flags 0x%x", r.sa_flags);
	FT_CHECK(sigismember(&r.sa_mask, SIGHUP) && sigismember(&r.sa_mask, SIGRTMIN + 5), "SIGUSR1 sa_mask");
	FT_CHECK(r.sa_sigaction == on_usr1, "SIGUSR1 handler address changed");

	raise(SIGUSR1);
	FT_EQ(usr1_count, 1, "SIGUSR1 handler runs");
	FT_EQ(usr1_signo, SIGUSR1, "siginfo si_signo");
	FT_EQ(usr1_code, SI_TKILL, "siginfo si_code (raise = tgkill)");
	FT_CHECK(usr1_onstack, "SIGUSR1 handler not on the alternate stack");
	FT_CHECK(usr1_mask_ok, "sa_mask not applied in handler");

	raise(SIGHUP);
	FT_EQ(hup_count, 1, "SIGHUP handler runs");
	FT_CHECK(hup_nodefer, "SA_NODEFER: SIGHUP blocked in its own handler");
	sigaction(SIGHUP, NULL, &r);
	FT_CHECK(r.sa_handler == SIG_DFL, "SA_RESETHAND: SIGHUP not reset to SIG_DFL");

	/* SA_RESTART: a read interrupted by SIGUSR1 continues */
	pthread_t t;
	FT_PT(pthread_create(&t, NULL, reader, NULL));
	while (!rtid)
		ft_sleep_ms(1);
	ft_wait_in_syscall(rtid, SYS_read, 3);
	pthread_kill(t, SIGUSR1);
	double dl = ft_mono() + 3;
	while (usr1_count < 2 && ft_mono() < dl)
		ft_sleep_ms(1);
	FT_EQ(usr1_count, 2, "SIGUSR1 delivered to reader thread");
	ft_sleep_ms(50);
	FT_CHECK(rret == -2, "read returned %zd (%s) after SIGUSR1 despite SA_RESTART", rret, strerror(rerr));
	FT_SYS(write(rfd[1], "ok", 2));
	if (ft_join(t, NULL, 5, "reader") == 0)
		FT_EQ(rret, 2, "restarted read result");
	return ft_finish();
}
