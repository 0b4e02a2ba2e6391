/*
 * child_process: a process with a child. Process trees are not supported
 * yet, so checkpoint must refuse it, naming the child, and leave both
 * running: after the refusal the program still checks its state and PASSes.
 */
#include "../conformance/ferry_test.h"
#include <sys/wait.h>

int main(void)
{
	ft_init();
	pid_t child = fork();
	if (child == 0) {
		for (;;)
			pause();
	}
	FT_CHECK(child > 0, "fork failed");
	ft_ready();
	ft_wait_restored();
	FT_CHECK(kill(child, 0) == 0, "child %d is gone", child);
	kill(child, SIGKILL);
	waitpid(child, NULL, 0);
	return ft_finish();
}
