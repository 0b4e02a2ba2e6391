/*
 * tree_pdeathsig: the parent-death signal. The root (a child subreaper)
 * forks C; C forks G, which sets PR_SET_PDEATHSIG(SIGUSR1) and waits for
 * SIGUSR1 in sigtimedwait (20 s). After restore, the root sends C its go;
 * C exits; G must receive SIGUSR1 (and PR_GET_PDEATHSIG still says
 * SIGUSR1); G is reparented to the root, which reaps both.
 */
#include "ferry_test.h"
#include <sys/prctl.h>

int main(void)
{
	ft_init();
	FT_SYS(prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0));
	ft_tree_begin();
	int gp[2];
	FT_SYS(pipe(gp));
	pid_t c = ft_fork();
	if (c == 0) {
		pid_t g = ft_fork();
		if (g == 0) {
			sigset_t s;
			sigemptyset(&s);
			sigaddset(&s, SIGUSR1);
			sigprocmask(SIG_BLOCK, &s, NULL);
			if (prctl(PR_SET_PDEATHSIG, SIGUSR1, 0, 0, 0) != 0)
				ft_die("PR_SET_PDEATHSIG");
			close(gp[0]);
			ft_write_all(gp[1], (char *)&(pid_t){ getpid() }, sizeof(pid_t));
			close(gp[1]);
			ft_child_ready();
			struct timespec to = { 20, 0 };
			int r;
			do
				r = sigtimedwait(&s, NULL, &to);
			while (r < 0 && errno == EINTR);
			FT_CHECK(r == SIGUSR1, "grandchild: no SIGUSR1 when its parent died (sigtimedwait %d: %s)", r, r < 0 ? strerror(errno) : "");
			int d = -1;
			prctl(PR_GET_PDEATHSIG, &d, 0, 0, 0);
			FT_EQ(d, SIGUSR1, "grandchild PR_GET_PDEATHSIG");
			ft_child_exit("grandchild");
		}
		close(gp[0]);
		close(gp[1]);
		ft_child_ready();
		ft_child_wait_go();
		ft_child_exit("child");
	}
	close(gp[1]);
	pid_t g = 0;
	if (read(gp[0], &g, sizeof(g)) != sizeof(g))
		ft_die("grandchild pid");
	close(gp[0]);
	ft_tree_wait_ready(2);

	ft_ready();
	ft_tree_wait_restored();

	ft_go(c, "child");
	ft_reap(c, "child");
	ft_reap(g, "grandchild");
	return ft_finish();
}
