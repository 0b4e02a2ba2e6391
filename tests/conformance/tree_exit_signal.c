/*
 * tree_exit_signal: a child made with clone() whose exit signal is
 * SIGUSR1 instead of SIGCHLD. After restore field 38 of its stat is still
 * SIGUSR1, and when it exits the root gets SIGUSR1 (blocked, taken with
 * sigtimedwait) and reaps it with __WALL.
 */
#include "ferry_test.h"
#include <sched.h>

static char stack[65536] __attribute__((aligned(16)));

static int child_fn(void *arg)
{
	(void)arg;
	ft_failures = 0;
	ft_ready_done = 0;
	ft_start_ticks = 0;
	ft_child_ready();
	ft_child_wait_go();
	ft_child_exit("child");
}

static int exit_signal_of(pid_t pid)
{
	char path[64], buf[1024];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	if (ft_read_file(path, buf, sizeof(buf)) < 0)
		return -1;
	char *p = strrchr(buf, ')');
	if (!p)
		return -1;
	p += 2; /* field 3 */
	for (int f = 3; f < 38 && p; f++) {
		p = strchr(p, ' ');
		if (p)
			p++;
	}
	return p ? atoi(p) : -1;
}

int main(void)
{
	ft_init();
	sigset_t s;
	sigemptyset(&s);
	sigaddset(&s, SIGUSR1);
	sigprocmask(SIG_BLOCK, &s, NULL);
	ft_tree_begin();
	pid_t c = clone(child_fn, stack + sizeof(stack), SIGUSR1, NULL);
	if (c < 0)
		ft_die("clone: %s", strerror(errno));
	ft_tree_wait_ready(1);
	if (exit_signal_of(c) != SIGUSR1)
		ft_die("exit signal %d before the checkpoint", exit_signal_of(c));

	ft_ready();
	ft_tree_wait_restored();

	FT_EQ(exit_signal_of(c), SIGUSR1, "child's exit signal (stat field 38)");
	ft_go(c, "child");
	struct timespec to = { 5, 0 };
	FT_EQ(sigtimedwait(&s, NULL, &to), SIGUSR1, "SIGUSR1 when the child exits");
	int st = 0;
	FT_EQ(waitpid(c, &st, __WALL), c, "waitpid(__WALL)");
	FT_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status 0x%x", st);
	return ft_finish();
}
