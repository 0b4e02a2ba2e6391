/*
 * fd_flags: fds with assorted status and descriptor flags: a file opened
 * O_RDONLY|O_NONBLOCK, a file opened O_CLOEXEC, a pipe2(O_NONBLOCK|
 * O_CLOEXEC), an eventfd with EFD_NONBLOCK|EFD_CLOEXEC, a file whose
 * O_APPEND|O_NONBLOCK were set later with F_SETFL, a file whose FD_CLOEXEC
 * was cleared later, F_DUPFD_CLOEXEC copies at fd >= 100 and a dup2 to fd
 * 1000, leaving gaps. After restore: exactly the same set of open fd
 * numbers and, for each, the same F_GETFL and F_GETFD values.
 */
#include "ferry_test.h"
#include <dirent.h>
#include <sys/eventfd.h>

#define MAXFD 1024

static int collect(int *fl, int *fdf, char *open_)
{
	int n = 0;
	for (int fd = 0; fd < MAXFD; fd++) {
		int f = fcntl(fd, F_GETFD);
		open_[fd] = f >= 0;
		if (f >= 0) {
			fdf[fd] = f;
			fl[fd] = fcntl(fd, F_GETFL);
			n++;
		}
	}
	return n;
}

int main(void)
{
	ft_init();
	int f = open("x.txt", O_RDWR | O_CREAT, 0644);
	close(f);
	FT_SYS(open("x.txt", O_RDONLY | O_NONBLOCK));
	FT_SYS(open("x.txt", O_RDONLY | O_CLOEXEC));
	int p[2];
	FT_SYS(pipe2(p, O_NONBLOCK | O_CLOEXEC));
	FT_SYS(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
	int later = (int)FT_SYS(open("x.txt", O_WRONLY));
	FT_SYS(fcntl(later, F_SETFL, O_APPEND | O_NONBLOCK));
	int cleared = (int)FT_SYS(open("x.txt", O_RDWR | O_CLOEXEC));
	FT_SYS(fcntl(cleared, F_SETFD, 0));
	FT_SYS(fcntl(p[0], F_DUPFD_CLOEXEC, 100));
	FT_SYS(fcntl(later, F_DUPFD, 200));
	FT_SYS(dup2(cleared, 1000));
	int sync_fd = (int)FT_SYS(open("x.txt", O_WRONLY | O_DSYNC | O_NOATIME));
	(void)sync_fd;

	static int fl0[MAXFD], fd0[MAXFD], fl1[MAXFD], fd1[MAXFD];
	static char o0[MAXFD], o1[MAXFD];
	int n0 = collect(fl0, fd0, o0);

	ft_ready();
	ft_wait_restored();

	int n1 = collect(fl1, fd1, o1);
	FT_EQ(n1, n0, "number of open fds");
	for (int fd = 0; fd < MAXFD; fd++) {
		if (o0[fd] != o1[fd]) {
			ft_fail("fd %d %s after restore", fd, o0[fd] ? "missing" : "appeared");
			continue;
		}
		if (!o0[fd])
			continue;
		if (fl0[fd] != fl1[fd])
			ft_fail("fd %d F_GETFL 0%o -> 0%o", fd, fl0[fd], fl1[fd]);
		if (fd0[fd] != fd1[fd])
			ft_fail("fd %d F_GETFD %d -> %d", fd, fd0[fd], fd1[fd]);
	}
	FT_CHECK(o1[1000] && fd1[1000] == 0, "fd 1000 lost or has FD_CLOEXEC");
	FT_CHECK(o1[100] && fd1[100] == FD_CLOEXEC, "fd 100 lost FD_CLOEXEC");
	FT_CHECK(o1[later] && (fl1[later] & (O_APPEND | O_NONBLOCK)) == (O_APPEND | O_NONBLOCK),
		 "F_SETFL flags lost");
	return ft_finish();
}
