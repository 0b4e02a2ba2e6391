/*
 * proc_dumpable_setuid: the dumpable flag of a process that changed its
 * uid (zdtm dumpable01 run as a non-root user). Changing the effective
 * uid resets the flag to /proc/sys/fs/suid_dumpable; the process then sets
 * it back with PR_SET_DUMPABLE 1, as an ordinary user process has it.
 * A restore that sets the flag before the credentials loses it the same
 * way. After restore: PR_GET_DUMPABLE 1, uids 1000, and /proc/self/status
 * is owned by uid 1000 (a non-dumpable process's /proc files belong to
 * root).
 */
#include "ferry_test.h"
#include <sys/prctl.h>

int main(void)
{
	ft_init();
	if (geteuid() != 0) {
		ft_log("not root: cannot change uid, checking the flag only");
	} else {
		FT_SYS(syscall(SYS_setresgid, 1000, 1000, 1000));
		FT_SYS(syscall(SYS_setresuid, 1000, 1000, 1000));
	}
	int after_setuid = prctl(PR_GET_DUMPABLE, 0, 0, 0, 0);
	ft_log("dumpable right after setresuid: %d", after_setuid);
	FT_SYS(prctl(PR_SET_DUMPABLE, 1, 0, 0, 0));
	uid_t uid = getuid();

	ft_ready();
	ft_wait_restored();

	FT_EQ(prctl(PR_GET_DUMPABLE, 0, 0, 0, 0), 1, "PR_GET_DUMPABLE");
	uid_t r, e, s;
	FT_SYS(syscall(SYS_getresuid, &r, &e, &s));
	FT_CHECK(r == uid && e == uid && s == uid, "uids %d %d %d (want %d)", r, e, s, uid);
	struct stat st;
	FT_SYS(stat("/proc/self/status", &st));
	FT_EQ(st.st_uid, uid, "owner of /proc/self/status");
	return ft_finish();
}
