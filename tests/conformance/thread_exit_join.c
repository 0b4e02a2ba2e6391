/*
 * thread_exit_join: three threads wait in a barrier during the checkpoint.
 * Before and after, each records prctl(PR_GET_TID_ADDRESS) (its
 * clear_child_tid). After restore they exit (return, pthread_exit, and
 * return from a thread with a large return value) and the main thread
 * joins them with a 5 s timeout: joining relies on the kernel clearing the
 * TID word at thread exit, so clear_child_tid must be restored. A thread
 * created after restore must also work.
 */
#include "ferry_test.h"
#include <sys/prctl.h>

#define NT 3
static pthread_barrier_t bar;
static void *tidaddr_before[NT + 1], *tidaddr_after[NT + 1];

static void *thr(void *arg)
{
	int id = (int)(long)arg;
	prctl(PR_GET_TID_ADDRESS, &tidaddr_before[id]);
	pthread_barrier_wait(&bar);
	pthread_barrier_wait(&bar);
	prctl(PR_GET_TID_ADDRESS, &tidaddr_after[id]);
	if (id == 2)
		pthread_exit((void *)0x2222L);
	return (void *)(0x1000L + id);
}

static void *late(void *arg)
{
	return (void *)((long)arg * 3);
}

int main(void)
{
	ft_init();
	FT_PT(pthread_barrier_init(&bar, NULL, NT + 1));
	pthread_t th[NT + 1];
	for (int i = 1; i <= NT; i++)
		FT_PT(pthread_create(&th[i], NULL, thr, (void *)(long)i));
	prctl(PR_GET_TID_ADDRESS, &tidaddr_before[0]);
	pthread_barrier_wait(&bar);

	ft_ready();
	ft_wait_restored();

	prctl(PR_GET_TID_ADDRESS, &tidaddr_after[0]);
	pthread_barrier_wait(&bar);
	for (int i = 1; i <= NT; i++) {
		void *ret = NULL;
		if (ft_join(th[i], &ret, 5, "thread") != 0)
			continue;
		long exp = i == 2 ? 0x2222L : 0x1000L + i;
		FT_CHECK((long)ret == exp, "thread %d returned %p, expected 0x%lx", i, ret, exp);
	}
	for (int i = 0; i <= NT; i++)
		FT_CHECK(tidaddr_before[i] == tidaddr_after[i], "thread %d clear_child_tid %p -> %p", i,
			 tidaddr_before[i], tidaddr_after[i]);
	pthread_t l;
	FT_PT(pthread_create(&l, NULL, late, (void *)14L));
	void *ret = NULL;
	if (ft_join(l, &ret, 5, "thread created after restore") == 0)
		FT_CHECK((long)ret == 42, "late thread returned %p", ret);
	return ft_finish();
}
