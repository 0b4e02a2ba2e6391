/*
 * proc_rseq: glibc registers an rseq area per thread (__rseq_size > 0).
 * After restore, in the main thread and in a second thread: the rseq area
 * is still registered with the kernel at the same address with glibc's
 * signature (re-registering it returns EBUSY; 0 would mean it was not
 * registered), and its cpu_id field matches sched_getcpu().
 */
#include "ferry_test.h"
#include <linux/rseq.h>
#include <sched.h>
#include <stddef.h>

extern const ptrdiff_t __rseq_offset;
extern const unsigned int __rseq_size;
#define RSEQ_SIG_X86 0x53053053

static struct rseq *area(void)
{
	return (struct rseq *)((char *)__builtin_thread_pointer() + __rseq_offset);
}

static void check(const char *who, struct rseq *before)
{
	struct rseq *r = area();
	FT_CHECK(r == before, "%s: rseq area %p -> %p", who, (void *)before, (void *)r);
	long ret = syscall(SYS_rseq, r, __rseq_size, 0, RSEQ_SIG_X86);
	int err = errno;
	if (ret != 0 && err == EINVAL) {
		ret = syscall(SYS_rseq, r, 32, 0, RSEQ_SIG_X86);
		err = errno;
	}
	FT_CHECK(ret == -1 && err == EBUSY, "%s: rseq re-register returned %ld (%s): area not registered", who,
		 ret, ret ? strerror(err) : "registered now");
	int ok = 0;
	int cpu = -1, rc = -1;
	for (int i = 0; i < 50 && !ok; i++) {
		cpu = sched_getcpu();
		rc = (int)__atomic_load_n(&r->cpu_id, __ATOMIC_RELAXED);
		ok = rc >= 0 && rc == cpu;
		if (!ok)
			sched_yield();
	}
	FT_CHECK(ok, "%s: rseq cpu_id %d, sched_getcpu %d", who, rc, cpu);
	FT_CHECK(r->rseq_cs == 0, "%s: rseq_cs not zero", who);
}

static pthread_barrier_t bar;
static struct rseq *t_before;

static void *thr(void *arg)
{
	(void)arg;
	t_before = area();
	pthread_barrier_wait(&bar);
	pthread_barrier_wait(&bar);
	check("thread", t_before);
	return NULL;
}

int main(void)
{
	ft_init();
	if (__rseq_size == 0) {
		ft_log("SKIP: glibc did not register rseq (__rseq_size == 0)");
		ft_ready();
		ft_wait_restored();
		return ft_finish();
	}
	FT_PT(pthread_barrier_init(&bar, NULL, 2));
	pthread_t t;
	FT_PT(pthread_create(&t, NULL, thr, NULL));
	struct rseq *m_before = area();
	pthread_barrier_wait(&bar);

	ft_ready();
	ft_wait_restored();

	FT_CHECK(__rseq_size > 0, "__rseq_size is 0");
	check("main", m_before);
	pthread_barrier_wait(&bar);
	ft_join(t, NULL, 5, "thread");
	return ft_finish();
}
