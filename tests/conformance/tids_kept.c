/*
 * tids_kept: main + 5 threads record getpid(), gettid(), pthread_self() and
 * the set of /proc/self/task entries. Threads wait in a barrier while
 * checkpointed. After restore all must be identical, and pthread_kill()
 * (which uses the TID cached inside glibc's struct pthread) must reach the
 * right thread: a SIGUSR1 handler records gettid() and it must equal the
 * target thread's TID.
 */
#include "ferry_test.h"
#include <dirent.h>

#define NT 5

static pthread_barrier_t bar;
static pid_t tid_before[NT + 1], tid_after[NT + 1];
static volatile pid_t handler_tid[NT + 1];
static __thread int my_id;

static void on_usr1(int sig)
{
	(void)sig;
	handler_tid[my_id] = ft_gettid();
}

static int list_tasks(pid_t *out, int max)
{
	DIR *d = opendir("/proc/self/task");
	if (!d)
		ft_die("opendir /proc/self/task");
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		if (n < max)
			out[n] = atoi(e->d_name);
		n++;
	}
	closedir(d);
	/* sort */
	for (int i = 0; i < n && i < max; i++)
		for (int k = i + 1; k < n && k < max; k++)
			if (out[k] < out[i]) {
				pid_t t = out[i];
				out[i] = out[k];
				out[k] = t;
			}
	return n;
}

static void *thr(void *arg)
{
	my_id = (int)(long)arg;
	tid_before[my_id] = ft_gettid();
	pthread_barrier_wait(&bar);
	pthread_barrier_wait(&bar); /* restored */
	tid_after[my_id] = ft_gettid();
	pthread_barrier_wait(&bar); /* main sends pthread_kill */
	pthread_barrier_wait(&bar);
	return NULL;
}

int main(void)
{
	ft_init();
	struct sigaction sa = { .sa_handler = on_usr1 };
	FT_SYS(sigaction(SIGUSR1, &sa, NULL));
	FT_PT(pthread_barrier_init(&bar, NULL, NT + 1));
	pthread_t th[NT + 1];
	th[0] = pthread_self();
	for (int i = 1; i <= NT; i++)
		FT_PT(pthread_create(&th[i], NULL, thr, (void *)(long)i));
	pid_t pid_before = getpid();
	tid_before[0] = ft_gettid();
	pthread_barrier_wait(&bar);
	pid_t tasks_before[16], tasks_after[16];
	int n_before = list_tasks(tasks_before, 16);

	ft_ready();
	ft_wait_restored();

	FT_EQ(getpid(), pid_before, "getpid");
	FT_EQ(syscall(SYS_getpid), pid_before, "raw getpid");
	tid_after[0] = ft_gettid();
	FT_EQ(tid_after[0], pid_before, "main thread tid == pid");
	FT_CHECK(pthread_self() == th[0], "main pthread_self changed");
	int n_after = list_tasks(tasks_after, 16);
	FT_EQ(n_after, n_before, "number of /proc/self/task entries");
	for (int i = 0; i < n_before && i < n_after && i < 16; i++)
		FT_CHECK(tasks_before[i] == tasks_after[i], "task list differs at %d: %d vs %d", i,
			 tasks_before[i], tasks_after[i]);
	pthread_barrier_wait(&bar);
	pthread_barrier_wait(&bar);
	for (int i = 0; i <= NT; i++)
		FT_CHECK(tid_after[i] == tid_before[i], "thread %d tid %d -> %d", i, tid_before[i],
			 tid_after[i]);
	/* threads are now blocked in the 4th barrier: signal each of them */
	for (int i = 1; i <= NT; i++) {
		int e = pthread_kill(th[i], SIGUSR1);
		FT_CHECK(e == 0, "pthread_kill(thread %d): %s", i, strerror(e));
		double dl = ft_mono() + 3;
		while (handler_tid[i] == 0 && ft_mono() < dl)
			ft_sleep_ms(1);
		FT_CHECK(handler_tid[i] == tid_before[i],
			 "pthread_kill to thread %d (tid %d) ran the handler in tid %d", i, tid_before[i],
			 handler_tid[i]);
	}
	pthread_barrier_wait(&bar);
	for (int i = 1; i <= NT; i++)
		ft_join(th[i], NULL, 5, "thread");
	return ft_finish();
}
