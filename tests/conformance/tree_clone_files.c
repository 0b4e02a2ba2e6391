/*
 * tree_clone_files: a child made with clone(CLONE_FILES) without
 * CLONE_THREAD shares the root's fd table. After restore it still does:
 * an fd the root closes is gone in the child, and an fd the child opens
 * is there in the root. (The ft_tree_* helpers close their report pipe
 * in the child, which would close it for the root too: this program
 * synchronises over its own pipe.)
 */
#include "ferry_test.h"
#include <sched.h>

static char stack[65536] __attribute__((aligned(16)));
static int shared_fd = -1;
static int report[2];

static int child_fn(void *arg)
{
	(void)arg;
	ft_failures = 0;
	ft_start_ticks = ft_proc_start_ticks();
	ft_ready_done = 1;
	alarm(FT_TREE_GO_S);
	ft_write_all(report[1], "r", 1);
	ft_child_wait_go();
	/* The root closed shared_fd before the go. */
	FT_CHECK(fcntl(shared_fd, F_GETFD) < 0 && errno == EBADF, "child: fd %d closed by the root is still open here", shared_fd);
	int n = open("/dev/null", O_RDONLY);
	FT_CHECK(n >= 0, "child: open");
	ft_write_all(report[1], (char *)&n, sizeof(n));
	ft_child_exit("child");
}

int main(void)
{
	ft_init();
	FT_SYS(pipe(report));
	shared_fd = (int)FT_SYS(open("/dev/zero", O_RDONLY));
	pid_t c = clone(child_fn, stack + sizeof(stack), CLONE_FILES | SIGCHLD, NULL);
	if (c < 0)
		ft_die("clone: %s", strerror(errno));
	char r = 0;
	if (read(report[0], &r, 1) != 1 || r != 'r')
		ft_die("child did not report");

	ft_ready();
	ft_wait_restored();
	alarm(FT_TREE_ROOT_CHECK_S);

	FT_SYS(close(shared_fd));
	ft_go(c, "child");
	int n = -1;
	FT_CHECK(read(report[0], &n, sizeof(n)) == sizeof(n), "no report from the child");
	FT_CHECK(n >= 0 && fcntl(n, F_GETFD) >= 0, "fd %d the child opened is not in the root's table", n);
	ft_reap(c, "child");
	return ft_finish();
}
