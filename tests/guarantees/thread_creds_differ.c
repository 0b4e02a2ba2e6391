/*
 * thread_creds_differ: one thread changed its own filesystem uid (the raw
 * syscall changes only the calling thread), so the threads' credentials
 * differ. ferry restores one set for all threads: checkpoint must refuse
 * the thread by name and leave both threads as they were.
 */
#include "../conformance/ferry_test.h"

static pthread_barrier_t bar;
static long t_fsuid = -2;

static void *thr(void *arg)
{
	(void)arg;
	syscall(SYS_setfsuid, 4242);
	pthread_barrier_wait(&bar);
	pthread_barrier_wait(&bar);
	t_fsuid = syscall(SYS_setfsuid, -1);
	return NULL;
}

int main(void)
{
	ft_init();
	FT_PT(pthread_barrier_init(&bar, NULL, 2));
	pthread_t t;
	FT_PT(pthread_create(&t, NULL, thr, NULL));
	pthread_barrier_wait(&bar);
	ft_ready();
	ft_wait_restored();
	pthread_barrier_wait(&bar);
	ft_join(t, NULL, 5, "thread");
	FT_EQ(t_fsuid, 4242, "thread fsuid");
	FT_EQ(syscall(SYS_setfsuid, -1), 0, "main fsuid");
	return ft_finish();
}
