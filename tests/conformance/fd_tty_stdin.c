/*
 * fd_tty_stdin: the program opens a pty pair (posix_openpt) and dup2()s the
 * slave onto fd 0. Before the checkpoint fd 0 is a tty. After a restore with
 * the default --tty-to (/dev/null): fd 0 is not a tty, is the /dev/null
 * character device, keeps its access mode (O_RDWR), and read() returns 0
 * (EOF). Without a checkpoint (selfcheck) fd 0 is still the pty slave and
 * data written to the master is read from fd 0.
 */
#include "ferry_test.h"
#include <sys/sysmacros.h>
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

	if (ft_restored()) {
		FT_CHECK(!isatty(0), "fd 0 is still a tty after restore");
		struct stat st;
		FT_SYS(fstat(0, &st));
		FT_CHECK(S_ISCHR(st.st_mode) && major(st.st_rdev) == 1 && minor(st.st_rdev) == 3,
			 "fd 0 is not /dev/null (rdev %u:%u)", major(st.st_rdev), minor(st.st_rdev));
		FT_EQ(fcntl(0, F_GETFL) & O_ACCMODE, fl & O_ACCMODE, "fd 0 access mode");
		char b[8];
		FT_EQ(read(0, b, sizeof(b)), 0, "read(0) after restore (EOF)");
	} else {
		ft_log("not restored: checking the pty is still fd 0");
		FT_CHECK(isatty(0), "fd 0 is not a tty");
		FT_SYS(write(master, "ping\n", 5));
		char b[16] = { 0 };
		FT_EQ(read(0, b, sizeof(b)), 5, "read(0) from pty");
		FT_CHECK(memcmp(b, "ping\n", 5) == 0, "pty data '%s'", b);
	}
	return ft_finish();
}
