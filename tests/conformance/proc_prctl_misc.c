/*
 * proc_prctl_misc: per-process/per-thread prctl state: PR_SET_TIMERSLACK
 * (main 123456 ns, thread 777000 ns), PR_SET_THP_DISABLE 1,
 * PR_SET_CHILD_SUBREAPER 1, PR_SET_DUMPABLE 0. After restore each reads
 * back the same (PR_GET_*), including the thread's own timer slack, and
 * /proc/self/status shows THP_enabled: 0.
 */
#include "ferry_test.h"
#include <sys/prctl.h>

static pthread_barrier_t bar;
static long t_slack = -1;

static void *thr(void *arg)
{
	(void)arg;
	if (prctl(PR_SET_TIMERSLACK, 777000UL, 0, 0, 0) != 0)
		ft_die("PR_SET_TIMERSLACK thread");
	pthread_barrier_wait(&bar);
	pthread_barrier_wait(&bar);
	t_slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
	return NULL;
}

int main(void)
{
	ft_init();
	FT_SYS(prctl(PR_SET_TIMERSLACK, 123456UL, 0, 0, 0));
	FT_SYS(prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0));
	FT_SYS(prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0));
	FT_PT(pthread_barrier_init(&bar, NULL, 2));
	pthread_t t;
	FT_PT(pthread_create(&t, NULL, thr, NULL));
	pthread_barrier_wait(&bar);
	FT_SYS(prctl(PR_SET_DUMPABLE, 0, 0, 0, 0));
	char thp0[16] = "";
	ft_status_field(0, "THP_enabled", thp0, sizeof(thp0));

	ft_ready();
	ft_wait_restored();

	FT_EQ(prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0), 123456, "main timer slack");
	FT_EQ(prctl(PR_GET_THP_DISABLE, 0, 0, 0, 0), 1, "PR_GET_THP_DISABLE");
	int sub = -1;
	prctl(PR_GET_CHILD_SUBREAPER, &sub, 0, 0, 0);
	FT_EQ(sub, 1, "PR_GET_CHILD_SUBREAPER");
	FT_EQ(prctl(PR_GET_DUMPABLE, 0, 0, 0, 0), 0, "PR_GET_DUMPABLE");
	char thp[16] = "";
	ft_status_field(0, "THP_enabled", thp, sizeof(thp));
	FT_CHECK(strcmp(thp, thp0) == 0 && strcmp(thp, "0") == 0, "THP_enabled '%s' (before '%s')", thp, thp0);
	pthread_barrier_wait(&bar);
	ft_join(t, NULL, 5, "thread");
	FT_EQ(t_slack, 777000, "thread timer slack");
	return ft_finish();
}
