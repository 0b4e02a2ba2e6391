/*
 * tree_zombie_pgid: the process group and session of zombies (zdtm
 * zombie00/zombie01). The root forks a live child L that leads its own
 * process group, then three children that exit at once (left unreaped,
 * waited for with waitid(WNOWAIT)): Z1 after setpgid(0, 0) (status 1),
 * Z2 after setsid() (status 2), Z3 after joining L's group (status 3).
 * After restore: getpgid/getsid of each zombie as before; waitpid(-pgid)
 * finds them by group: waitpid(-Z1) reaps Z1, waitpid(-L) reaps Z3 (L
 * still runs), waitpid(-Z2) reaps Z2, each with its status. L then gets
 * its go and exits.
 */
#include "ferry_test.h"

static void wait_exited(pid_t z, int status)
{
	siginfo_t si;
	memset(&si, 0, sizeof(si));
	FT_SYS(waitid(P_PID, (id_t)z, &si, WEXITED | WNOWAIT));
	if (si.si_pid != z || si.si_code != CLD_EXITED || si.si_status != status)
		ft_die("child %d: waitid code %d status %d", (int)z, si.si_code, si.si_status);
}

static void reap_group(pid_t pgid, pid_t want, int status, const char *what)
{
	int st = 0;
	pid_t w = waitpid(-pgid, &st, WNOHANG);
	if (w <= 0)
		ft_fail("%s: waitpid(-%d, WNOHANG) returned %d (%s): no zombie in that group", what, (int)pgid, (int)w,
			w < 0 ? strerror(errno) : "nothing");
	else
		FT_CHECK(w == want && WIFEXITED(st) && WEXITSTATUS(st) == status,
			 "%s: waitpid(-%d) reaped %d status 0x%x, expected %d exit %d", what, (int)pgid, (int)w, st,
			 (int)want, status);
	if (w != want)
		waitpid(want, &st, 0);
}

int main(void)
{
	ft_init();
	ft_tree_begin();
	pid_t l = ft_fork();
	if (l == 0) {
		setpgid(0, 0);
		ft_child_ready();
		ft_child_wait_go();
		FT_CHECK(getpgid(0) == getpid(), "live child: pgid %d", (int)getpgid(0));
		ft_child_exit("live child");
	}
	/* Either of the two calls wins the race; both make L a group leader. */
	setpgid(l, l);
	pid_t z1 = ft_fork();
	if (z1 == 0) {
		if (setpgid(0, 0) != 0)
			_exit(100);
		_exit(1);
	}
	pid_t z2 = ft_fork();
	if (z2 == 0) {
		if (setsid() < 0)
			_exit(100);
		_exit(2);
	}
	pid_t z3 = ft_fork();
	if (z3 == 0) {
		if (setpgid(0, l) != 0)
			_exit(100);
		_exit(3);
	}
	wait_exited(z1, 1);
	wait_exited(z2, 2);
	wait_exited(z3, 3);
	ft_tree_wait_ready(1);
	pid_t pg[3] = { getpgid(z1), getpgid(z2), getpgid(z3) };
	pid_t sid[3] = { getsid(z1), getsid(z2), getsid(z3) };
	if (pg[0] != z1 || pg[1] != z2 || sid[1] != z2 || pg[2] != l)
		ft_die("setup: pgids %d %d %d sid %d", (int)pg[0], (int)pg[1], (int)pg[2], (int)sid[1]);
	ft_log("zombies %d %d %d, live %d, root sid %d", (int)z1, (int)z2, (int)z3, (int)l, (int)getsid(0));

	ft_ready();
	ft_tree_wait_restored();

	pid_t zs[3] = { z1, z2, z3 };
	for (int i = 0; i < 3; i++) {
		FT_CHECK(getpgid(zs[i]) == pg[i], "zombie %d: pgid %d, expected %d", (int)zs[i], (int)getpgid(zs[i]), (int)pg[i]);
		FT_CHECK(getsid(zs[i]) == sid[i], "zombie %d: sid %d, expected %d", (int)zs[i], (int)getsid(zs[i]), (int)sid[i]);
	}
	reap_group(z1, z1, 1, "Z1 (own group)");
	reap_group(l, z3, 3, "Z3 (in L's group)");
	reap_group(z2, z2, 2, "Z2 (own session)");

	ft_go(l, "live child");
	ft_reap(l, "live child");
	return ft_finish();
}
