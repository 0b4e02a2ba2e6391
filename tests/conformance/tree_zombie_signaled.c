/*
 * tree_zombie_signaled: a zombie child that was killed by a signal (it
 * raised SIGTERM). The root waits for it with waitid(WNOWAIT), so it is a
 * zombie at READY. After restore waitpid(Z) reports WIFSIGNALED with
 * WTERMSIG SIGTERM.
 */
#include "ferry_test.h"

int main(void)
{
	ft_init();
	ft_tree_begin();
	pid_t z = ft_fork();
	if (z == 0) {
		close(ft_tree_pipe[0]);
		close(ft_tree_pipe[1]);
		raise(SIGTERM);
		_exit(9);
	}
	siginfo_t si;
	memset(&si, 0, sizeof(si));
	FT_SYS(waitid(P_PID, (id_t)z, &si, WEXITED | WNOWAIT));
	if (si.si_code != CLD_KILLED || si.si_status != SIGTERM)
		ft_die("zombie: code %d status %d", si.si_code, si.si_status);
	ft_tree_wait_ready(0);

	ft_ready();
	ft_tree_wait_restored();

	int st = 0;
	pid_t r = waitpid(z, &st, WNOHANG);
	FT_EQ(r, z, "waitpid(zombie, WNOHANG)");
	FT_CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM, "zombie wait status 0x%x, expected killed by SIGTERM", st);
	return ft_finish();
}
