/*
 * tty_ctty: a session whose controlling terminal is a pty slave. The root
 * holds the master; its child calls setsid(), opens the slave (which makes
 * it the session's controlling terminal) on fd 0, forks a grandchild into
 * a process group of its own and makes that group the foreground one
 * (tcsetpgrp). After restore the child checks getsid, TIOCGSID and
 * tcgetpgrp on fd 0, tty_nr in /proc/self/stat, that /dev/tty opens, and
 * that a ^C written to the master reaches the foreground group: the
 * grandchild dies of SIGINT (the child ignores it). The root checks
 * TIOCGSID and TIOCGPGRP through the master.
 */
#define _GNU_SOURCE
#include "ferry_test.h"
#include <sys/ioctl.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <termios.h>

static void grandchild(void)
{
	signal(SIGINT, SIG_DFL);
	ft_child_ready();
	for (;;)
		pause();
}

static void child(int m, const char *name)
{
	if (setsid() < 0)
		ft_die("setsid: %s", strerror(errno));
	int s = open(name, O_RDWR); /* the session's controlling terminal */
	if (s < 0)
		ft_die("open %s: %s", name, strerror(errno));
	FT_SYS(dup2(s, 0));
	close(s);
	signal(SIGINT, SIG_IGN);
	signal(SIGTTOU, SIG_IGN);
	pid_t g = ft_fork();
	if (g == 0) {
		setpgid(0, 0);
		grandchild();
	}
	setpgid(g, g);
	if (tcsetpgrp(0, g) < 0)
		ft_die("tcsetpgrp: %s", strerror(errno));
	ft_child_ready();

	ft_child_wait_go();
	FT_EQ(getsid(0), getpid(), "child: getsid");
	pid_t sid = 0;
	FT_CHECK(ioctl(0, TIOCGSID, &sid) == 0, "child: TIOCGSID: %s", strerror(errno));
	FT_EQ(sid, getpid(), "child: TIOCGSID");
	FT_EQ(tcgetpgrp(0), g, "child: tcgetpgrp");
	struct stat st;
	FT_SYS(fstat(0, &st));
	unsigned long long nr = (major(st.st_rdev) << 8) | (minor(st.st_rdev) & 0xff) |
				((minor(st.st_rdev) & ~0xffu) << 12);
	FT_EQ(ft_stat_field(7), nr, "child: tty_nr");
	int t = open("/dev/tty", O_RDWR | O_NOCTTY);
	FT_CHECK(t >= 0, "child: open /dev/tty: %s", strerror(errno));
	FT_SYS(write(m, "\003", 1)); /* ^C: SIGINT to the foreground group */
	int status = 0;
	FT_SYS(waitpid(g, &status, 0));
	FT_CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGINT,
		 "grandchild wait status %#x, expected SIGINT", status);
	ft_child_exit("child (session leader)");
}

int main(void)
{
	ft_init();
	int m = (int)FT_SYS(posix_openpt(O_RDWR | O_NOCTTY));
	FT_SYS(grantpt(m));
	FT_SYS(unlockpt(m));
	char name[64];
	snprintf(name, sizeof(name), "%s", ptsname(m));
	ft_tree_begin();
	pid_t c = ft_fork();
	if (c == 0)
		child(m, name);
	ft_tree_wait_ready(2);
	pid_t fg = 0;
	FT_SYS(ioctl(m, TIOCGPGRP, &fg));
	FT_CHECK(fg != c && fg > 0, "foreground group %d before checkpoint", (int)fg);

	ft_ready();
	ft_tree_wait_restored();

	pid_t sid = 0, fg2 = 0;
	FT_SYS(ioctl(m, TIOCGSID, &sid));
	FT_EQ(sid, c, "master: TIOCGSID");
	FT_SYS(ioctl(m, TIOCGPGRP, &fg2));
	FT_EQ(fg2, fg, "master: TIOCGPGRP");
	ft_go(c, "child");
	ft_reap(c, "child");
	return ft_finish();
}
