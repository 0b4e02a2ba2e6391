/*
 * thread_sigmask: main and 4 threads each have a different blocked signal
 * mask (all include SIGUSR2). Threads wait in a barrier while checkpointed.
 * After restore each thread's mask, read with pthread_sigmask and from
 * /proc/self/task/<tid>/status SigBlk, must equal the one before.
 */
#include "ferry_test.h"

#define NT 4

struct m {
	pid_t tid;
	sigset_t before, after;
	char blk_before[32], blk_after[32];
};
static struct m ms[NT + 1];
static pthread_barrier_t bar;

static void make_mask(int id, sigset_t *s)
{
	sigemptyset(s);
	switch (id) {
	case 0: sigaddset(s, SIGTERM); sigaddset(s, SIGRTMAX); break;
	case 1: sigaddset(s, SIGUSR1); break;
	case 2: sigaddset(s, SIGHUP); sigaddset(s, SIGRTMIN + 3); sigaddset(s, SIGWINCH); break;
	case 3: sigfillset(s); break;
	case 4: break; /* only SIGUSR2 */
	}
	sigaddset(s, SIGUSR2);
}

static void record(int id, int after)
{
	struct m *m = &ms[id];
	m->tid = ft_gettid();
	pthread_sigmask(SIG_BLOCK, NULL, after ? &m->after : &m->before);
	if (ft_status_field(m->tid, "SigBlk", after ? m->blk_after : m->blk_before, 32) != 0)
		ft_die("read SigBlk");
}

static void *thr(void *arg)
{
	int id = (int)(long)arg;
	sigset_t s;
	make_mask(id, &s);
	pthread_sigmask(SIG_SETMASK, &s, NULL);
	record(id, 0);
	pthread_barrier_wait(&bar);
	pthread_barrier_wait(&bar);
	record(id, 1);
	return NULL;
}

int main(void)
{
	ft_init();
	FT_PT(pthread_barrier_init(&bar, NULL, NT + 1));
	pthread_t th[NT + 1];
	for (int i = 1; i <= NT; i++)
		FT_PT(pthread_create(&th[i], NULL, thr, (void *)(long)i));
	sigset_t s;
	make_mask(0, &s);
	pthread_sigmask(SIG_SETMASK, &s, NULL);
	record(0, 0);
	pthread_barrier_wait(&bar);

	ft_ready();
	ft_wait_restored();

	record(0, 1);
	pthread_barrier_wait(&bar);
	for (int i = 1; i <= NT; i++)
		ft_join(th[i], NULL, 5, "thread");
	for (int i = 0; i <= NT; i++) {
		FT_CHECK(strcmp(ms[i].blk_before, ms[i].blk_after) == 0,
			 "thread %d: SigBlk %s -> %s", i, ms[i].blk_before, ms[i].blk_after);
		for (int sig = 1; sig < NSIG; sig++) {
			if (sig == 32 || sig == 33 || sig == SIGKILL || sig == SIGSTOP)
				continue; /* glibc-internal / unblockable */
			int b = sigismember(&ms[i].before, sig), a = sigismember(&ms[i].after, sig);
			if (a != b)
				ft_fail("thread %d: signal %d blocked %d -> %d", i, sig, b, a);
			sigset_t exp;
			make_mask(i, &exp);
			if (sigismember(&exp, sig) != a)
				ft_fail("thread %d: signal %d blocked=%d, expected %d", i, sig, a,
					sigismember(&exp, sig));
		}
	}
	for (int i = 1; i <= NT; i++)
		FT_CHECK(strcmp(ms[i].blk_before, ms[i - 1].blk_before) != 0, "masks %d and %d equal", i - 1, i);
	return ft_finish();
}
