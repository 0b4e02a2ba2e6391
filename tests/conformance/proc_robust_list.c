/*
 * proc_robust_list: records get_robust_list() (head pointer and length) of
 * the main thread and of threads T and U, where U installed its own robust
 * list head with set_robust_list. T holds a PTHREAD_MUTEX_ROBUST mutex
 * during the checkpoint. After restore: all heads/lengths are unchanged;
 * T exits with a raw SYS_exit (so only the kernel's robust-list walk can
 * release the mutex) and main's pthread_mutex_lock on it returns
 * EOWNERDEAD.
 */
#include "ferry_test.h"
#include <linux/futex.h>

static pthread_barrier_t bar;
static pthread_mutex_t rm;
static pid_t ttid, utid;
static struct robust_list_head u_head;
static volatile int u_done;

static long get_rl(pid_t tid, void **head, size_t *len)
{
	return syscall(SYS_get_robust_list, tid, head, len);
}

static void *thr_t(void *arg)
{
	(void)arg;
	ttid = ft_gettid();
	pthread_mutex_lock(&rm);
	pthread_barrier_wait(&bar);
	pthread_barrier_wait(&bar); /* restored */
	pthread_barrier_wait(&bar); /* main checked heads */
	syscall(SYS_exit, 0);       /* no glibc cleanup: kernel walks the robust list */
	return NULL;
}

static void *thr_u(void *arg)
{
	(void)arg;
	utid = ft_gettid();
	u_head.list.next = &u_head.list;
	u_head.futex_offset = 16;
	u_head.list_op_pending = NULL;
	if (syscall(SYS_set_robust_list, &u_head, sizeof(u_head)) != 0)
		ft_die("set_robust_list: %s", strerror(errno));
	pthread_barrier_wait(&bar);
	pthread_barrier_wait(&bar); /* restored */
	pthread_barrier_wait(&bar); /* main checked heads */
	while (!u_done) /* keep running until main is done with us */
		ft_sleep_ms(1);
	return NULL;
}

int main(void)
{
	ft_init();
	pthread_mutexattr_t ma;
	pthread_mutexattr_init(&ma);
	pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
	FT_PT(pthread_mutex_init(&rm, &ma));
	FT_PT(pthread_barrier_init(&bar, NULL, 3));
	pthread_t t, u;
	FT_PT(pthread_create(&t, NULL, thr_t, NULL));
	FT_PT(pthread_create(&u, NULL, thr_u, NULL));
	pthread_barrier_wait(&bar);
	void *h[3];
	size_t l[3];
	pid_t who[3] = { 0, ttid, utid };
	for (int i = 0; i < 3; i++)
		FT_SYS(get_rl(who[i], &h[i], &l[i]));
	FT_CHECK(h[2] == &u_head, "setup: U robust head %p", h[2]);

	ft_ready();
	ft_wait_restored();

	pthread_barrier_wait(&bar);
	for (int i = 0; i < 3; i++) {
		void *hh = NULL;
		size_t ll = 0;
		if (get_rl(who[i], &hh, &ll) != 0) {
			ft_fail("get_robust_list(%d): %s", who[i], strerror(errno));
			continue;
		}
		FT_CHECK(hh == h[i] && ll == l[i], "thread %d robust list %p/%zu -> %p/%zu", i, h[i], l[i], hh, ll);
	}
	pthread_barrier_wait(&bar); /* T exits now */
	ft_join(t, NULL, 5, "T (raw exit)");
	struct timespec dl;
	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += 3;
	int e = pthread_mutex_timedlock(&rm, &dl);
	FT_CHECK(e == EOWNERDEAD, "locking the robust mutex of the dead thread: %s (expected EOWNERDEAD)",
		 strerror(e));
	if (e == EOWNERDEAD) {
		pthread_mutex_consistent(&rm);
		pthread_mutex_unlock(&rm);
	}
	u_done = 1;
	ft_join(u, NULL, 5, "U");
	return ft_finish();
}
