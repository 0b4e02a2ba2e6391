/*
 * proc_seccomp_filter: seccomp filters, stacked, per thread and with TSYNC.
 * A thread is started, then F1 (getppid -> errno 101) is installed with
 * SECCOMP_FILTER_FLAG_TSYNC, so both threads have it. Main then adds F2
 * (getpgrp -> 102) and F5 (getppid -> 105, the newer filter wins); the
 * thread adds F3 (getpgrp -> 103) and F4 (getsid -> 104). After restore:
 * Seccomp is 2 and Seccomp_filters is 3 in /proc/self/task/TID/status of
 * both threads, and each thread's raw syscalls fail with its own errnos.
 */
#include "ferry_test.h"
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>

static pthread_barrier_t bar;
static long t_res[3];
static char t_status[2][32];

static void install(int nr, int err, unsigned flags)
{
	struct sock_filter f[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)nr, 0, 1),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (unsigned)err),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_fprog p = { .len = 4, .filter = f };
	if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, flags, &p) != 0)
		ft_die("seccomp(nr %d, flags %u): %s", nr, flags, strerror(errno));
}

static long err_of(long nr)
{
	errno = 0;
	long r = syscall(nr, 0);
	return r == -1 ? errno : 0;
}

static void *thr(void *arg)
{
	(void)arg;
	pthread_barrier_wait(&bar); /* F1 installed by main with TSYNC */
	install(SYS_getpgrp, 103, 0);
	install(SYS_getsid, 104, 0);
	pthread_barrier_wait(&bar);
	pthread_barrier_wait(&bar); /* restored */
	t_res[0] = err_of(SYS_getppid);
	t_res[1] = err_of(SYS_getpgrp);
	t_res[2] = err_of(SYS_getsid);
	ft_status_field(ft_gettid(), "Seccomp", t_status[0], 32);
	ft_status_field(ft_gettid(), "Seccomp_filters", t_status[1], 32);
	return NULL;
}

int main(void)
{
	ft_init();
	FT_SYS(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0));
	FT_PT(pthread_barrier_init(&bar, NULL, 2));
	pthread_t t;
	FT_PT(pthread_create(&t, NULL, thr, NULL));
	install(SYS_getppid, 101, SECCOMP_FILTER_FLAG_TSYNC);
	pthread_barrier_wait(&bar);
	install(SYS_getpgrp, 102, 0);
	install(SYS_getppid, 105, 0);
	pthread_barrier_wait(&bar);

	ft_ready();
	ft_wait_restored();

	char s[32] = "", n[32] = "";
	ft_status_field(0, "Seccomp", s, sizeof(s));
	ft_status_field(0, "Seccomp_filters", n, sizeof(n));
	FT_CHECK(strcmp(s, "2") == 0, "main: Seccomp '%s', expected 2", s);
	FT_CHECK(strcmp(n, "3") == 0, "main: Seccomp_filters '%s', expected 3", n);
	FT_EQ(err_of(SYS_getppid), 105, "main getppid errno (F5 over F1)");
	FT_EQ(err_of(SYS_getpgrp), 102, "main getpgrp errno (F2)");
	FT_EQ(err_of(SYS_getsid), 0, "main getsid errno (no filter)");
	pthread_barrier_wait(&bar);
	ft_join(t, NULL, 5, "thread");
	FT_CHECK(strcmp(t_status[0], "2") == 0, "thread: Seccomp '%s', expected 2", t_status[0]);
	FT_CHECK(strcmp(t_status[1], "3") == 0, "thread: Seccomp_filters '%s', expected 3", t_status[1]);
	FT_EQ(t_res[0], 101, "thread getppid errno (F1, TSYNC)");
	FT_EQ(t_res[1], 103, "thread getpgrp errno (F3)");
	FT_EQ(t_res[2], 104, "thread getsid errno (F4)");
	return ft_finish();
}
