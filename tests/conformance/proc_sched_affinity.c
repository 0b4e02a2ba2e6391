/*
 * proc_sched_affinity: per-thread scheduling state. The main thread runs
 * at nice 7 pinned to CPU 0; a second thread runs SCHED_BATCH at nice 3
 * pinned to the last CPU. After restore each thread reads its own policy,
 * nice value and CPU mask back.
 */
#include "ferry_test.h"
#include <sched.h>
#include <sys/resource.h>

static pthread_barrier_t bar;
static int last_cpu;

static void check_self(const char *who, int policy, int nice, int cpu)
{
	pid_t tid = (pid_t)syscall(SYS_gettid);
	FT_CHECK(sched_getscheduler(0) == policy, "%s: policy %d, expected %d", who, sched_getscheduler(0), policy);
	errno = 0;
	int n = getpriority(PRIO_PROCESS, (id_t)tid);
	FT_CHECK(n == nice, "%s: nice %d, expected %d", who, n, nice);
	cpu_set_t set;
	CPU_ZERO(&set);
	FT_SYS(sched_getaffinity(0, sizeof(set), &set));
	FT_CHECK(CPU_COUNT(&set) == 1 && CPU_ISSET(cpu, &set), "%s: affinity is not CPU %d only (%d CPUs set)", who,
		 cpu, CPU_COUNT(&set));
}

static void *worker(void *arg)
{
	(void)arg;
	struct sched_param p = { 0 };
	FT_SYS(sched_setscheduler(0, SCHED_BATCH, &p));
	FT_SYS(setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 3));
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(last_cpu, &set);
	FT_SYS(sched_setaffinity(0, sizeof(set), &set));
	pthread_barrier_wait(&bar); /* state set */
	pthread_barrier_wait(&bar); /* restored */
	check_self("worker", SCHED_BATCH, 3, last_cpu);
	return NULL;
}

int main(void)
{
	ft_init();
	last_cpu = (int)sysconf(_SC_NPROCESSORS_ONLN) - 1;
	FT_SYS(setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 7));
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(0, &set);
	FT_SYS(sched_setaffinity(0, sizeof(set), &set));
	pthread_barrier_init(&bar, NULL, 2);
	pthread_t t;
	pthread_create(&t, NULL, worker, NULL);
	pthread_barrier_wait(&bar);
	ft_ready();
	ft_wait_restored();
	pthread_barrier_wait(&bar);
	check_self("main", SCHED_OTHER, 7, 0);
	pthread_join(t, NULL);
	return ft_finish();
}
