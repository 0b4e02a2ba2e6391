/*
 * proc_ioprio: I/O priorities (ioprio_set) per thread: the main thread
 * best effort level 7, one thread best effort level 2, one idle, one
 * real time level 3 (root only), one left at the default (class NONE).
 * After restore each thread reads its own value back, and the default
 * thread is still class NONE (a restored thread would otherwise inherit
 * its restorer's).
 */
#include "ferry_test.h"
#include <sys/syscall.h>

#define PRIO(class, level) (((class) << 13) | (level))
#define WHO_PROCESS 1

static const int wanted[] = { PRIO(2, 2), PRIO(3, 0), PRIO(1, 3), -1 };
#define NTHREADS 4
static int tids[NTHREADS];
static volatile int set_up;
static volatile int go;
static int results[NTHREADS];

static void *worker(void *arg)
{
	int i = (int)(long)arg;
	tids[i] = (int)syscall(SYS_gettid);
	if (wanted[i] >= 0 && syscall(SYS_ioprio_set, WHO_PROCESS, 0, wanted[i]) != 0)
		ft_die("thread %d: ioprio_set %#x: %s", i, wanted[i], strerror(errno));
	__atomic_add_fetch(&set_up, 1, __ATOMIC_SEQ_CST);
	while (!__atomic_load_n(&go, __ATOMIC_SEQ_CST))
		ft_sleep_ms(5);
	/* Its own value, read by the thread itself after restore. */
	results[i] = (int)syscall(SYS_ioprio_get, WHO_PROCESS, 0);
	return NULL;
}

int main(void)
{
	ft_init();
	pthread_t t[NTHREADS];
	for (long i = 0; i < NTHREADS; i++)
		if (pthread_create(&t[i], NULL, worker, (void *)i) != 0)
			ft_die("pthread_create");
	while (__atomic_load_n(&set_up, __ATOMIC_SEQ_CST) < NTHREADS)
		ft_sleep_ms(1);
	/* After the threads were made: they would inherit it. */
	FT_SYS(syscall(SYS_ioprio_set, WHO_PROCESS, 0, PRIO(2, 7)));
	ft_ready();
	ft_wait_restored();
	__atomic_store_n(&go, 1, __ATOMIC_SEQ_CST);
	for (int i = 0; i < NTHREADS; i++)
		pthread_join(t[i], NULL);
	FT_EQ(syscall(SYS_ioprio_get, WHO_PROCESS, 0), PRIO(2, 7), "main thread's I/O priority");
	for (int i = 0; i < NTHREADS; i++) {
		char what[64];
		snprintf(what, sizeof(what), "thread %d's I/O priority", tids[i]);
		if (wanted[i] >= 0)
			FT_EQ(results[i], wanted[i], what);
		else
			FT_CHECK(results[i] >> 13 == 0, "%s: class %d, not NONE", what, results[i] >> 13);
	}
	return ft_finish();
}
