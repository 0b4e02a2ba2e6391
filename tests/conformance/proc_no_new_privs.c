/*
 * proc_no_new_privs: prctl(PR_SET_NO_NEW_PRIVS, 1) in the main thread
 * before creating a thread. After restore: PR_GET_NO_NEW_PRIVS is 1 in both
 * threads and NoNewPrivs is 1 in /proc/self/task/<tid>/status.
 */
#include "ferry_test.h"
#include <sys/prctl.h>

static pthread_barrier_t bar;
static pid_t ttid;
static int t_nnp = -1;

static void *thr(void *arg)
{
	(void)arg;
	ttid = ft_gettid();
	pthread_barrier_wait(&bar);
	pthread_barrier_wait(&bar);
	t_nnp = prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0);
	return NULL;
}

int main(void)
{
	ft_init();
	FT_SYS(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0));
	FT_PT(pthread_barrier_init(&bar, NULL, 2));
	pthread_t t;
	FT_PT(pthread_create(&t, NULL, thr, NULL));
	pthread_barrier_wait(&bar);

	ft_ready();
	ft_wait_restored();

	FT_EQ(prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0), 1, "main PR_GET_NO_NEW_PRIVS");
	char s[16] = "";
	ft_status_field(getpid(), "NoNewPrivs", s, sizeof(s));
	FT_CHECK(strcmp(s, "1") == 0, "main NoNewPrivs '%s'", s);
	ft_status_field(ttid, "NoNewPrivs", s, sizeof(s));
	FT_CHECK(strcmp(s, "1") == 0, "thread NoNewPrivs '%s'", s);
	pthread_barrier_wait(&bar);
	ft_join(t, NULL, 5, "thread");
	FT_EQ(t_nnp, 1, "thread PR_GET_NO_NEW_PRIVS");
	return ft_finish();
}
