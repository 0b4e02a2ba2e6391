/*
 * thread_futex_condwait: two threads are blocked in pthread_cond_wait (futex
 * wait) on one condition variable during the checkpoint. After restore the
 * main thread sets the predicate and broadcasts; both threads must wake up
 * (within 5 s) and see the predicate. A third thread blocked in
 * pthread_mutex_lock on a mutex held by main is released by an unlock.
 */
#include "ferry_test.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t held = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int go, waiting;
static pid_t tids[3];
static volatile int woke[3];
static volatile int saw_go[3];

static void *waiter(void *arg)
{
	int id = (int)(long)arg;
	tids[id] = ft_gettid();
	pthread_mutex_lock(&mu);
	waiting++;
	while (!go)
		pthread_cond_wait(&cv, &mu);
	saw_go[id] = go;
	pthread_mutex_unlock(&mu);
	woke[id] = 1;
	return NULL;
}

static void *locker(void *arg)
{
	(void)arg;
	tids[2] = ft_gettid();
	pthread_mutex_lock(&held);
	saw_go[2] = __atomic_load_n(&go, __ATOMIC_SEQ_CST);
	woke[2] = 1;
	pthread_mutex_unlock(&held);
	return NULL;
}

int main(void)
{
	ft_init();
	pthread_mutex_lock(&held);
	pthread_t t[3];
	for (int i = 0; i < 2; i++)
		FT_PT(pthread_create(&t[i], NULL, waiter, (void *)(long)i));
	FT_PT(pthread_create(&t[2], NULL, locker, NULL));
	for (;;) {
		pthread_mutex_lock(&mu);
		int w = waiting;
		pthread_mutex_unlock(&mu);
		if (w == 2 && tids[2])
			break;
		ft_sleep_ms(1);
	}
	for (int i = 0; i < 3; i++)
		ft_wait_in_syscall(tids[i], SYS_futex, 2);

	ft_ready();
	ft_wait_restored();

	for (int i = 0; i < 3; i++)
		FT_CHECK(!woke[i], "thread %d woke before the broadcast", i);
	pthread_mutex_lock(&mu);
	go = 1;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
	pthread_mutex_unlock(&held);
	for (int i = 0; i < 3; i++)
		if (ft_join(t[i], NULL, 5, "futex waiter") == 0)
			FT_CHECK(woke[i] && saw_go[i], "thread %d woke=%d saw_go=%d", i, woke[i], saw_go[i]);
	return ft_finish();
}
