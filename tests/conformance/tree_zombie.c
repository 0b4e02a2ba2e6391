/*
 * tree_zombie: a zombie child at checkpoint time. The root forks child Z,
 * which exits at once with status 42; the root waits for that exit with
 * waitid(WEXITED | WNOWAIT), so Z is a zombie (state Z, not reaped) when
 * READY is printed. A second child L stays alive. After restore: Z is
 * still a zombie child of the root (/proc/<Z>/stat state Z, ppid root,
 * in the root's children list); waitid(WNOWAIT) reports CLD_EXITED 42
 * without waiting; waitpid(Z, WNOHANG) reaps it with WEXITSTATUS 42; then
 * /proc/<Z> is gone and another waitpid(Z) fails with ECHILD. L gets its go
 * and exits normally.
 *
 * Synchronisation: report pipe (only L reports; Z's end closes when it
 * exits) and waitid(WNOWAIT) for Z before READY; after restore the root
 * checks Z, sends the go to L and reaps it.
 */
#include "ferry_test.h"

/* State letter and ppid of pid from /proc/<pid>/stat; returns 0 on success. */
static int proc_state(pid_t pid, char *state, pid_t *ppid)
{
	char path[64], buf[1024];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	if (ft_read_file(path, buf, sizeof(buf)) < 0)
		return -1;
	char *p = strrchr(buf, ')');
	int pp;
	if (!p || sscanf(p + 2, "%c %d", state, &pp) != 2)
		return -1;
	*ppid = pp;
	return 0;
}

static int in_children(pid_t pid)
{
	pid_t k[16];
	int n = ft_children(k, 16);
	for (int i = 0; i < n; i++)
		if (k[i] == pid)
			return 1;
	return 0;
}

int main(void)
{
	ft_init();
	ft_tree_begin();
	pid_t z = ft_fork();
	if (z == 0)
		_exit(42);
	pid_t l = ft_fork();
	if (l == 0) {
		pid_t ppid = getppid();
		ft_child_ready();
		ft_child_wait_go();
		FT_CHECK(getppid() == ppid, "live child: ppid %d, expected %d", (int)getppid(), (int)ppid);
		ft_child_exit("live child");
	}
	siginfo_t si;
	memset(&si, 0, sizeof(si));
	FT_SYS(waitid(P_PID, (id_t)z, &si, WEXITED | WNOWAIT));
	if (si.si_pid != z || si.si_code != CLD_EXITED || si.si_status != 42)
		ft_die("zombie: waitid pid %d code %d status %d", (int)si.si_pid, si.si_code, si.si_status);
	ft_tree_wait_ready(1);
	char state = '?';
	pid_t zp = 0;
	if (proc_state(z, &state, &zp) != 0 || state != 'Z' || zp != getpid())
		ft_die("child %d is not a zombie of ours before READY (state %c ppid %d)", (int)z, state, (int)zp);
	ft_log("zombie %d, live child %d", (int)z, (int)l);

	ft_ready();
	ft_tree_wait_restored();

	state = '?';
	zp = 0;
	if (proc_state(z, &state, &zp) != 0)
		ft_fail("zombie %d: /proc/%d/stat missing after restore (%s)", (int)z, (int)z, strerror(errno));
	else {
		FT_CHECK(state == 'Z', "zombie %d: state '%c' after restore, expected 'Z'", (int)z, state);
		FT_CHECK(zp == getpid(), "zombie %d: ppid %d, expected the root %d", (int)z, (int)zp, (int)getpid());
	}
	FT_CHECK(in_children(z), "zombie %d not in the root's children list", (int)z);
	FT_CHECK(in_children(l), "live child %d not in the root's children list", (int)l);
	memset(&si, 0, sizeof(si));
	int r = waitid(P_PID, (id_t)z, &si, WEXITED | WNOWAIT | WNOHANG);
	if (r != 0)
		ft_fail("waitid(zombie, WNOWAIT|WNOHANG): %s", strerror(errno));
	else
		FT_CHECK(si.si_pid == z && si.si_code == CLD_EXITED && si.si_status == 42,
			 "waitid(zombie, WNOWAIT|WNOHANG): pid %d code %d status %d, expected pid %d CLD_EXITED 42",
			 (int)si.si_pid, si.si_code, si.si_status, (int)z);
	int st = 0;
	pid_t w = waitpid(z, &st, WNOHANG);
	if (w == 0) {
		ft_fail("zombie %d is running again (waitpid WNOHANG returned 0); reaping it", (int)z);
		w = waitpid(z, &st, 0);
	}
	if (w != z)
		ft_fail("waitpid(zombie %d): %d (%s)", (int)z, (int)w, strerror(errno));
	else
		FT_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 42, "zombie %d: wait status 0x%x, expected exit 42", (int)z,
			 st);
	FT_CHECK(access("/proc/self", F_OK) == 0 && proc_state(z, &state, &zp) != 0,
		 "zombie %d still in /proc after being reaped", (int)z);
	errno = 0;
	FT_CHECK(waitpid(z, &st, WNOHANG) < 0 && errno == ECHILD, "second waitpid(zombie) did not fail with ECHILD");

	ft_go(l, "live child");
	ft_reap(l, "live child");
	return ft_finish();
}
