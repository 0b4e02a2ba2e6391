/*
 * proc_rlimits: lowers RLIMIT_NOFILE soft to 200, sets RLIMIT_CORE to
 * 4096/8192, RLIMIT_MSGQUEUE soft to 4096 and RLIMIT_NICE to 5/10. After
 * restore: every resource limit (prlimit on all RLIM_NLIMITS) equals the
 * one before, and NOFILE is enforced (fd 199 can be used, fd 200 cannot).
 */
#include "ferry_test.h"
#include <sys/resource.h>

int main(void)
{
	ft_init();
	struct rlimit r;
	FT_SYS(getrlimit(RLIMIT_NOFILE, &r));
	r.rlim_cur = 200;
	if (r.rlim_max < 200)
		r.rlim_max = 200;
	FT_SYS(setrlimit(RLIMIT_NOFILE, &r));
	r.rlim_cur = 4096;
	r.rlim_max = 8192;
	FT_SYS(setrlimit(RLIMIT_CORE, &r));
	FT_SYS(getrlimit(RLIMIT_MSGQUEUE, &r));
	r.rlim_cur = r.rlim_max < 4096 ? r.rlim_max : 4096;
	FT_SYS(setrlimit(RLIMIT_MSGQUEUE, &r));
	FT_SYS(getrlimit(RLIMIT_NICE, &r));
	if (r.rlim_max >= 10 || geteuid() == 0) {
		r.rlim_cur = 5;
		r.rlim_max = 10;
		setrlimit(RLIMIT_NICE, &r);
	}
	struct rlimit before[RLIM_NLIMITS];
	for (int i = 0; i < RLIM_NLIMITS; i++)
		FT_SYS(prlimit(0, i, NULL, &before[i]));

	ft_ready();
	ft_wait_restored();

	for (int i = 0; i < RLIM_NLIMITS; i++) {
		struct rlimit a;
		FT_SYS(prlimit(0, i, NULL, &a));
		if (a.rlim_cur != before[i].rlim_cur || a.rlim_max != before[i].rlim_max)
			ft_fail("rlimit %d: %llu/%llu -> %llu/%llu", i, (unsigned long long)before[i].rlim_cur,
				(unsigned long long)before[i].rlim_max, (unsigned long long)a.rlim_cur,
				(unsigned long long)a.rlim_max);
	}
	FT_CHECK(dup2(1, 199) == 199, "dup2 to fd 199 failed: %s", strerror(errno));
	FT_CHECK(dup2(1, 200) < 0 && errno == EBADF, "dup2 to fd 200 not refused (NOFILE not enforced)");
	return ft_finish();
}
