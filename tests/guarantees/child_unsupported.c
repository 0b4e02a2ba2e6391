/*
 * child_unsupported: a tree whose child holds something ferry cannot
 * capture (a userfaultfd descriptor). Checkpoint must refuse, naming the
 * child and the object, and leave the whole tree running: the child still
 * answers after the refusal and the program PASSes.
 */
#include "../conformance/ferry_test.h"
#include <linux/userfaultfd.h>
#include <sys/wait.h>

int main(void)
{
	ft_init();
	int up[2], down[2];
	FT_CHECK(pipe(up) == 0 && pipe(down) == 0, "pipe failed");
	pid_t child = fork();
	if (child == 0) {
		int in = (int)syscall(SYS_userfaultfd, O_CLOEXEC);
		char c = in >= 0 ? 'r' : 'x';
		if (write(up[1], &c, 1) != 1)
			_exit(2);
		/* Echo one byte back once asked: proves it was not harmed. */
		if (read(down[0], &c, 1) != 1 || write(up[1], &c, 1) != 1)
			_exit(3);
		_exit(0);
	}
	FT_CHECK(child > 0, "fork failed");
	char c = 0;
	FT_CHECK(read(up[0], &c, 1) == 1 && c == 'r', "child could not set up userfaultfd");
	ft_ready();
	ft_wait_restored();
	c = 'e';
	FT_CHECK(write(down[1], &c, 1) == 1, "write to child failed");
	c = 0;
	FT_CHECK(read(up[0], &c, 1) == 1 && c == 'e', "child did not answer after the refusal");
	int st = 0;
	FT_CHECK(waitpid(child, &st, 0) == child && WIFEXITED(st) && WEXITSTATUS(st) == 0, "child exit status %#x", st);
	return ft_finish();
}
