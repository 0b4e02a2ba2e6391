/*
 * tree_pgid_later_sibling: a process in the group of a sibling forked
 * after it (zdtm pgid/session tests move processes between groups after
 * the fork). The root forks A, then B, which leads its own group; the
 * root then moves A into B's group with setpgid(A, B). After restore A
 * and B still have pgid B (A checks it itself), and kill(-B, SIGUSR1)
 * from the root reaches both (each waits for it with sigtimedwait before
 * exiting).
 */
#include "ferry_test.h"

int main(void)
{
	ft_init();
	ft_tree_begin();
	/* SIGUSR1 blocked before the forks: the children take it with sigtimedwait. */
	sigset_t s1;
	sigemptyset(&s1);
	sigaddset(&s1, SIGUSR1);
	sigprocmask(SIG_BLOCK, &s1, NULL);
	int bp[2];
	FT_SYS(pipe(bp));
	pid_t a = ft_fork();
	if (a == 0) {
		close(bp[1]);
		pid_t b = 0;
		if (read(bp[0], &b, sizeof(b)) != sizeof(b))
			ft_die("A: B's pid");
		close(bp[0]);
		/* Wait until the root has moved us. */
		for (int i = 0; i < 1000 && getpgid(0) != b; i++)
			ft_sleep_ms(2);
		if (getpgid(0) != b)
			ft_die("A: not moved into B's group");
		ft_child_ready();
		ft_child_wait_go();
		FT_CHECK(getpgid(0) == b, "A: pgid %d, expected B %d", (int)getpgid(0), (int)b);
		struct timespec to = { 10, 0 };
		int r = sigtimedwait(&s1, NULL, &to);
		FT_CHECK(r == SIGUSR1, "A: no SIGUSR1 from kill(-B) (%s)", r < 0 ? strerror(errno) : "other signal");
		ft_child_exit("A");
	}
	close(bp[0]);
	pid_t b = ft_fork();
	if (b == 0) {
		close(bp[1]);
		setpgid(0, 0);
		ft_child_ready();
		ft_child_wait_go();
		FT_CHECK(getpgid(0) == getpid(), "B: pgid %d, expected its own", (int)getpgid(0));
		struct timespec to = { 10, 0 };
		int r = sigtimedwait(&s1, NULL, &to);
		FT_CHECK(r == SIGUSR1, "B: no SIGUSR1 from kill(-B) (%s)", r < 0 ? strerror(errno) : "other signal");
		ft_child_exit("B");
	}
	setpgid(b, b);
	FT_SYS(setpgid(a, b));
	ft_write_all(bp[1], (char *)&b, sizeof(b));
	close(bp[1]);
	ft_tree_wait_ready(2);
	if (getpgid(a) != b || getpgid(b) != b)
		ft_die("setup: pgid A %d B %d", (int)getpgid(a), (int)getpgid(b));
	ft_log("A %d, B %d (group leader)", (int)a, (int)b);

	ft_ready();
	ft_tree_wait_restored();

	FT_CHECK(getpgid(a) == b, "A's pgid %d, expected %d", (int)getpgid(a), (int)b);
	FT_CHECK(getpgid(b) == b, "B's pgid %d, expected %d", (int)getpgid(b), (int)b);
	FT_CHECK(getpgid(0) != b, "the root is in B's group");
	ft_go(a, "A");
	ft_go(b, "B");
	ft_sleep_ms(100);
	FT_SYS(kill(-b, SIGUSR1));
	ft_reap(a, "A");
	ft_reap(b, "B");
	return ft_finish();
}
