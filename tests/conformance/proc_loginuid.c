/*
 * proc_loginuid: the audit loginuid and session id (/proc/self/loginuid,
 * /proc/self/sessionid) the program started with, unset, come back
 * unset although the ferry that checkpoints and restores it runs with
 * loginuid 4242 (the harness starts ferry so), which a restored process
 * would inherit with ferry's session. The restored process writes its
 * loginuid itself (the kernel takes it from no other), and an unset
 * loginuid has no session. A thread checks its own too.
 */
#include "ferry_test.h"
#include <sys/syscall.h>

static unsigned long read_id(const char *path)
{
	char b[32] = "";
	if (ft_read_file(path, b, sizeof(b)) <= 0)
		return 0;
	return strtoul(b, NULL, 10);
}

static int thread_tid;

static void *idle(void *arg)
{
	(void)arg;
	__atomic_store_n(&thread_tid, (int)syscall(SYS_gettid), __ATOMIC_SEQ_CST);
	for (;;)
		pause();
	return NULL;
}

int main(void)
{
	ft_init();
	unsigned long uid = read_id("/proc/self/loginuid"), session = read_id("/proc/self/sessionid");
	FT_CHECK(uid == 4294967295UL && session == 4294967295UL, "started with loginuid %lu session %lu, not unset", uid, session);
	pthread_t t;
	if (pthread_create(&t, NULL, idle, NULL) != 0)
		ft_die("pthread_create");
	while (!__atomic_load_n(&thread_tid, __ATOMIC_SEQ_CST))
		ft_sleep_ms(1);
	ft_ready();
	ft_wait_restored();
	FT_EQ(read_id("/proc/self/loginuid"), uid, "loginuid");
	FT_EQ(read_id("/proc/self/sessionid"), session, "audit session id");
	char path[64];
	snprintf(path, sizeof(path), "/proc/self/task/%d/loginuid", thread_tid);
	FT_EQ(read_id(path), uid, "the thread's loginuid");
	return ft_finish();
}
