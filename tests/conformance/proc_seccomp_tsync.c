/*
 * proc_seccomp_tsync: a seccomp filter shared by threads must still be one
 * filter after restore, so that SECCOMP_FILTER_FLAG_TSYNC keeps working.
 * Main installs F1 (getppid -> errno 111) and then starts two threads,
 * which inherit F1 (one filter object, three users). Main then adds F2
 * (getpgrp -> 112) for itself only. The kernel lets a TSYNC install
 * through only when every other thread's filter is an ancestor of the
 * caller's: true here (the threads have F1, main F1+F2). After restore
 * main installs F3 (getsid -> 113) with TSYNC: it must return 0 (a
 * restore that gives each thread its own copy of F1 makes it return the
 * TID of a thread), and then both threads run main's whole chain F1+F2+F3.
 */
#include "ferry_test.h"
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>

#define NT 2

static pthread_barrier_t bar;
static long t_res[NT][3];
static char t_count[NT][32];

static long install(int nr, int err, unsigned flags)
{
	struct sock_filter f[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)nr, 0, 1),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (unsigned)err),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_fprog p = { .len = 4, .filter = f };
	return syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, flags, &p);
}

static long err_of(long nr)
{
	errno = 0;
	long r = syscall(nr, 0);
	return r == -1 ? errno : 0;
}

static void *thr(void *arg)
{
	long i = (long)arg;
	pthread_barrier_wait(&bar); /* set up */
	pthread_barrier_wait(&bar); /* restored, F3 installed by main */
	t_res[i][0] = err_of(SYS_getppid);
	t_res[i][1] = err_of(SYS_getpgrp);
	t_res[i][2] = err_of(SYS_getsid);
	ft_status_field(ft_gettid(), "Seccomp_filters", t_count[i], sizeof(t_count[i]));
	return NULL;
}

int main(void)
{
	ft_init();
	FT_SYS(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0));
	if (install(SYS_getppid, 111, 0) != 0)
		ft_die("seccomp F1: %s", strerror(errno));
	FT_PT(pthread_barrier_init(&bar, NULL, NT + 1));
	pthread_t t[NT];
	for (long i = 0; i < NT; i++)
		FT_PT(pthread_create(&t[i], NULL, thr, (void *)i));
	if (install(SYS_getpgrp, 112, 0) != 0)
		ft_die("seccomp F2: %s", strerror(errno));
	pthread_barrier_wait(&bar);

	ft_ready();
	ft_wait_restored();

	char n[32] = "";
	ft_status_field(0, "Seccomp_filters", n, sizeof(n));
	FT_CHECK(strcmp(n, "2") == 0, "main: Seccomp_filters '%s' before TSYNC, expected 2", n);
	errno = 0;
	long r = install(SYS_getsid, 113, SECCOMP_FILTER_FLAG_TSYNC);
	if (r != 0)
		ft_fail("seccomp(TSYNC) after restore returned %ld (errno %d): %s", r, errno,
			r > 0 ? "a thread's filter is no longer an ancestor of main's (shared filter split into copies)" : strerror(errno));
	pthread_barrier_wait(&bar);
	for (int i = 0; i < NT; i++)
		ft_join(t[i], NULL, 5, "thread");
	FT_EQ(err_of(SYS_getppid), 111, "main getppid errno (F1)");
	FT_EQ(err_of(SYS_getpgrp), 112, "main getpgrp errno (F2)");
	if (r == 0) {
		FT_EQ(err_of(SYS_getsid), 113, "main getsid errno (F3)");
		for (int i = 0; i < NT; i++) {
			FT_EQ(t_res[i][0], 111, "thread getppid errno (F1)");
			FT_EQ(t_res[i][1], 112, "thread getpgrp errno (F2, from main's chain by TSYNC)");
			FT_EQ(t_res[i][2], 113, "thread getsid errno (F3 by TSYNC)");
			/* TSYNC gives each thread main's whole chain: F1, F2, F3. */
			FT_CHECK(strcmp(t_count[i], "3") == 0, "thread %d: Seccomp_filters '%s' after TSYNC, expected 3", i, t_count[i]);
		}
	}
	return ft_finish();
}
