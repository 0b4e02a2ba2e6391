/*
 * tree_stopped: a child stopped by SIGSTOP (job control). The root forks C,
 * stops it and sees the stop with waitpid(WUNTRACED). After restore C is
 * still stopped (state T in /proc/C/stat); SIGCONT wakes it, waitpid
 * reports WIFCONTINUED, and C gets its go and exits 0.
 */
#include "ferry_test.h"

static char state_of(pid_t pid)
{
	char path[64], buf[512];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	if (ft_read_file(path, buf, sizeof(buf)) < 0)
		return '?';
	char *p = strrchr(buf, ')');
	return p ? p[2] : '?';
}

int main(void)
{
	ft_init();
	ft_tree_begin();
	pid_t c = ft_fork();
	if (c == 0) {
		ft_child_ready();
		ft_child_wait_go();
		ft_child_exit("child");
	}
	ft_tree_wait_ready(1);
	FT_SYS(kill(c, SIGSTOP));
	int st = 0;
	if (waitpid(c, &st, WUNTRACED) != c || !WIFSTOPPED(st))
		ft_die("child did not stop");

	ft_ready();
	ft_tree_wait_restored();

	char s = state_of(c);
	FT_CHECK(s == 'T', "child state '%c' after restore, expected 'T' (stopped)", s);
	FT_SYS(kill(c, SIGCONT));
	st = 0;
	pid_t r = waitpid(c, &st, WCONTINUED);
	FT_CHECK(r == c && WIFCONTINUED(st), "waitpid(WCONTINUED): %d status 0x%x", (int)r, st);
	ft_go(c, "child");
	ft_reap(c, "child");
	return ft_finish();
}
