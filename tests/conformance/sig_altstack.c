/*
 * sig_altstack: main has a 64 KiB alternate signal stack, thread T a 32 KiB
 * one with SS_AUTODISARM; SIGUSR1 has an SA_ONSTACK handler that records
 * the address of a local and sigaltstack() from inside. After restore:
 * sigaltstack() reads back the same ss_sp/ss_size/ss_flags in both
 * threads, and the handler runs on the right stack in each thread (with
 * SS_ONSTACK reported inside the handler).
 */
#include "ferry_test.h"

#ifndef SS_AUTODISARM
#define SS_AUTODISARM (1U << 31)
#endif

#define MSZ (64 * 1024)
#define TSZ (32 * 1024)

static char *mstack, *tstack;
static __thread volatile uintptr_t h_local;
static __thread volatile int h_flags, h_ran;
static pthread_barrier_t bar;
static stack_t t_before, t_after;
static volatile int t_onstack, t_flags_ok;

static void on_usr1(int sig)
{
	(void)sig;
	char here;
	stack_t cur;
	sigaltstack(NULL, &cur);
	h_local = (uintptr_t)&here;
	h_flags = cur.ss_flags;
	h_ran = 1;
}

static void *thr(void *arg)
{
	(void)arg;
	stack_t ss = { .ss_sp = tstack, .ss_size = TSZ, .ss_flags = SS_AUTODISARM };
	if (sigaltstack(&ss, NULL) != 0)
		ft_die("thread sigaltstack: %s", strerror(errno));
	sigaltstack(NULL, &t_before);
	pthread_barrier_wait(&bar);
	pthread_barrier_wait(&bar);
	sigaltstack(NULL, &t_after);
	raise(SIGUSR1);
	t_onstack = h_ran && h_local >= (uintptr_t)tstack && h_local < (uintptr_t)(tstack + TSZ);
	t_flags_ok = (h_flags & SS_ONSTACK) != 0 || (h_flags & SS_AUTODISARM) != 0;
	return NULL;
}

int main(void)
{
	ft_init();
	mstack = malloc(MSZ);
	tstack = malloc(TSZ);
	stack_t ss = { .ss_sp = mstack, .ss_size = MSZ, .ss_flags = 0 };
	FT_SYS(sigaltstack(&ss, NULL));
	struct sigaction sa = { .sa_handler = on_usr1, .sa_flags = SA_ONSTACK };
	FT_SYS(sigaction(SIGUSR1, &sa, NULL));
	FT_PT(pthread_barrier_init(&bar, NULL, 2));
	pthread_t t;
	FT_PT(pthread_create(&t, NULL, thr, NULL));
	stack_t m_before;
	sigaltstack(NULL, &m_before);
	pthread_barrier_wait(&bar);

	ft_ready();
	ft_wait_restored();

	stack_t m_after;
	sigaltstack(NULL, &m_after);
	FT_CHECK(m_after.ss_sp == m_before.ss_sp && m_after.ss_size == m_before.ss_size &&
			 m_after.ss_flags == m_before.ss_flags,
		 "main altstack %p/%zu/%d -> %p/%zu/%d", m_before.ss_sp, m_before.ss_size, m_before.ss_flags,
		 m_after.ss_sp, m_after.ss_size, m_after.ss_flags);
	raise(SIGUSR1);
	FT_CHECK(h_ran, "main handler did not run");
	FT_CHECK(h_local >= (uintptr_t)mstack && h_local < (uintptr_t)(mstack + MSZ), "main handler ran at %p, not on altstack %p",
		 (void *)h_local, mstack);
	FT_CHECK(h_flags & SS_ONSTACK, "main: SS_ONSTACK not reported inside the handler");
	pthread_barrier_wait(&bar);
	ft_join(t, NULL, 5, "thread");
	FT_CHECK(t_after.ss_sp == t_before.ss_sp && t_after.ss_size == t_before.ss_size &&
			 t_after.ss_flags == t_before.ss_flags,
		 "thread altstack %p/%zu/%d -> %p/%zu/%d", t_before.ss_sp, t_before.ss_size, t_before.ss_flags,
		 t_after.ss_sp, t_after.ss_size, t_after.ss_flags);
	FT_CHECK(t_before.ss_flags & SS_AUTODISARM, "setup: SS_AUTODISARM not reported");
	FT_CHECK(t_onstack, "thread handler not on the thread's altstack");
	return ft_finish();
}
