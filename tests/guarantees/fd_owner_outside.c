/*
 * fd_owner_outside: a pipe whose F_SETOWN owner is the parent process,
 * outside the checkpointed tree: after a restore that PID could be anyone,
 * so checkpoint must refuse the fd by number and leave it as it was.
 */
#include "../conformance/ferry_test.h"

int main(void)
{
	ft_init();
	int p[2];
	FT_SYS(pipe(p));
	pid_t parent = getppid();
	FT_SYS(fcntl(p[0], F_SETOWN, parent));
	ft_ready();
	ft_wait_restored();
	FT_EQ(fcntl(p[0], F_GETOWN), parent, "F_GETOWN after the refused checkpoint");
	return ft_finish();
}
