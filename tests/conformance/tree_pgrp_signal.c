/*
 * tree_pgrp_signal: a process group led by a child. The root forks child 1
 * and makes it a group leader (setpgid(c1, c1), child 1 does setpgid(0, 0)
 * too), then forks child 2 into that group (setpgid(c2, c1), child 2 does
 * setpgid(0, c1) too). The root stays in its own group. Every process has
 * a SIGUSR1 handler that counts. After restore: getpgid of both children
 * is still c1 (seen by the root and by themselves), the root is not in
 * that group, and kill(-c1, SIGUSR1) reaches both children exactly once
 * and not the root.
 *
 * Synchronisation: report pipe before READY. After restore the root sends
 * kill(-c1, SIGUSR1) and then the go (SIGUSR2) to each child: both signals
 * are pending before the child can return to user mode, and the SIGUSR1
 * handler runs before sigwaitinfo's return (or its EINTR, on which
 * ft_wait_restored loops) reaches the program, so the count is final when
 * the child checks it. The root reaps both children.
 */
#include "ferry_test.h"

static volatile sig_atomic_t count;

static void on_usr1(int sig)
{
	(void)sig;
	count++;
}

static void child(const char *who, pid_t leader)
{
	if (setpgid(0, leader ? leader : 0) != 0)
		ft_die("%s: setpgid: %s", who, strerror(errno));
	pid_t want = leader ? leader : getpid();
	if (getpgid(0) != want)
		ft_die("%s: pgid %d, expected %d", who, (int)getpgid(0), (int)want);
	ft_child_ready();

	ft_child_wait_go();
	FT_EQ(getpgid(0), want, who);
	FT_CHECK(count == 1, "%s: SIGUSR1 to the group arrived %d times, expected once", who, (int)count);
	ft_child_exit(who);
}

int main(void)
{
	ft_init();
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_usr1;
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = SA_RESTART;
	FT_SYS(sigaction(SIGUSR1, &sa, NULL));
	ft_tree_begin();

	pid_t c1 = ft_fork();
	if (c1 == 0)
		child("child 1 (group leader)", 0);
	FT_SYS(setpgid(c1, c1)); /* race-free idiom: both sides set it */
	pid_t c2 = ft_fork();
	if (c2 == 0)
		child("child 2", c1);
	FT_SYS(setpgid(c2, c1));
	ft_tree_wait_ready(2);
	pid_t my_pgid = getpgid(0);
	if (my_pgid == c1)
		ft_die("root in the children's group");
	if (getpgid(c1) != c1 || getpgid(c2) != c1)
		ft_die("groups before READY: c1 %d c2 %d", (int)getpgid(c1), (int)getpgid(c2));
	ft_log("root pgid %d, group %d: children %d %d", (int)my_pgid, (int)c1, (int)c1, (int)c2);

	ft_ready();
	ft_tree_wait_restored();

	FT_EQ(getpgid(c1), c1, "getpgid(child 1)");
	FT_EQ(getpgid(c2), c1, "getpgid(child 2)");
	FT_CHECK(getpgid(0) != c1, "the root is now in the children's group %d", (int)c1);
	if (kill(-c1, SIGUSR1) != 0)
		ft_fail("kill(-%d, SIGUSR1): %s", (int)c1, strerror(errno));
	ft_go(c1, "child 1");
	ft_go(c2, "child 2");
	ft_reap(c1, "child 1");
	ft_reap(c2, "child 2");
	FT_CHECK(count == 0, "the root (not in the group) got SIGUSR1 %d times", (int)count);
	return ft_finish();
}
