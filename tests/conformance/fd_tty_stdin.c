/*
 * fd_tty_stdin: the program opens a pty pair (posix_openpt) and dup2()s the
 * slave onto fd 0, keeping the master. Both ends are in the process, so
 * the pair is restored (it was replaced by /dev/null before, silently):
 * after restore fd 0 is still the pty slave, keeps its access mode, and
 * data written to the master is read from fd 0.
 */
#include "ferry_test.h"
#include <termios.h>

int main(void)
{
	ft_init();
	int master = (int)FT_SYS(posix_openpt(O_RDWR | O_NOCTTY));
	FT_SYS(grantpt(master));
	FT_SYS(unlockpt(master));
	char *name = ptsname(master);
	if (!name)
		ft_die("ptsname");
	int slave = (int)FT_SYS(open(name, O_RDWR | O_NOCTTY));
	FT_SYS(dup2(slave, 0));
	close(slave);
	if (!isatty(0))
		ft_die("fd 0 is not a tty after dup2");
	int fl = fcntl(0, F_GETFL);

	ft_ready();
	ft_wait_restored();

	FT_CHECK(isatty(0), "fd 0 is not a tty");
	FT_EQ(fcntl(0, F_GETFL) & O_ACCMODE, fl & O_ACCMODE, "fd 0 access mode");
	FT_SYS(write(master, "ping\n", 5));
	char b[16] = { 0 };
	FT_EQ(read(0, b, sizeof(b)), 5, "read(0) from pty");
	FT_CHECK(memcmp(b, "ping\n", 5) == 0, "pty data '%s'", b);
	return ft_finish();
}
