/*
 * proc_names: prctl(PR_SET_NAME, "ferry-main") on the main thread and
 * pthread_setname_np("worker-1", "w2", "a-15-char-name!") on three threads
 * that wait in a barrier. After restore: PR_GET_NAME, pthread_getname_np
 * and /proc/self/task/<tid>/comm give the same names; /proc/self/comm is
 * "ferry-main".
 */
#include "ferry_test.h"
#include <sys/prctl.h>

#define NT 3
static const char *names[NT + 1] = { "ferry-main", "worker-1", "w2", "a-15-char-name!" };
static pthread_barrier_t bar;
static pid_t tids[NT + 1];
static char got[NT + 1][32];

static void *thr(void *arg)
{
	int id = (int)(long)arg;
	tids[id] = ft_gettid();
	pthread_setname_np(pthread_self(), names[id]);
	pthread_barrier_wait(&bar);
	pthread_barrier_wait(&bar);
	prctl(PR_GET_NAME, got[id]);
	return NULL;
}

static void comm(pid_t tid, char *out, size_t n)
{
	char p[64];
	snprintf(p, sizeof(p), "/proc/self/task/%d/comm", (int)tid);
	if (ft_read_file(p, out, n) < 0)
		out[0] = 0;
	char *nl = strchr(out, '\n');
	if (nl)
		*nl = 0;
}

int main(void)
{
	ft_init();
	FT_SYS(prctl(PR_SET_NAME, names[0]));
	tids[0] = ft_gettid();
	FT_PT(pthread_barrier_init(&bar, NULL, NT + 1));
	pthread_t th[NT + 1];
	th[0] = pthread_self();
	for (int i = 1; i <= NT; i++)
		FT_PT(pthread_create(&th[i], NULL, thr, (void *)(long)i));
	pthread_barrier_wait(&bar);

	ft_ready();
	ft_wait_restored();

	prctl(PR_GET_NAME, got[0]);
	char comms[NT + 1][64];
	for (int i = 0; i <= NT; i++)
		comm(tids[i], comms[i], sizeof(comms[i]));
	pthread_barrier_wait(&bar);
	for (int i = 1; i <= NT; i++)
		ft_join(th[i], NULL, 5, "thread");
	for (int i = 0; i <= NT; i++) {
		FT_CHECK(strcmp(got[i], names[i]) == 0, "thread %d PR_GET_NAME '%s', expected '%s'", i, got[i],
			 names[i]);
		FT_CHECK(strcmp(comms[i], names[i]) == 0, "task %d comm '%s', expected '%s'", tids[i], comms[i],
			 names[i]);
	}
	char c[64];
	ft_read_file("/proc/self/comm", c, sizeof(c));
	FT_CHECK(strcmp(c, "ferry-main\n") == 0, "/proc/self/comm '%s'", c);
	char buf[32] = "";
	FT_CHECK(pthread_getname_np(pthread_self(), buf, sizeof(buf)) == 0 && strcmp(buf, names[0]) == 0,
		 "pthread_getname_np(main) '%s'", buf);
	return ft_finish();
}
