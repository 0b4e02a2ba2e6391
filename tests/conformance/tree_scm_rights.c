/*
 * tree_scm_rights: an open file description that reached the child only
 * through SCM_RIGHTS. After the fork the root opens "scm.dat" (O_RDWR, 200
 * bytes, offset 50) and sends the fd to the child over a unix socketpair;
 * the child receives it (under another fd number) and sends its number
 * back; both close the socketpair before READY; the root keeps its fd. So
 * both processes hold one file description that the child never inherited.
 * After restore: kcmp says the two fds are one description, the child's fd
 * is at its number with O_RDWR and the right path; the root lseeks to 77,
 * the child sees 77 and reads 10 bytes (offset 87), then lseeks to 123;
 * the root sees 123.
 *
 * Synchronisation: report pipe before READY; after restore the root does
 * its part, sends the go, and reaps the child before checking the offset
 * the child set.
 */
#include "ferry_test.h"
#include <linux/kcmp.h>
#include <sys/socket.h>

static void send_fd(int sock, int fd)
{
	char c = 'F';
	struct iovec iov = { &c, 1 };
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	memset(&u, 0, sizeof(u));
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf) };
	struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &fd, sizeof(int));
	if (sendmsg(sock, &mh, 0) != 1)
		ft_die("sendmsg(SCM_RIGHTS): %s", strerror(errno));
}

static int recv_fd(int sock)
{
	char c;
	struct iovec iov = { &c, 1 };
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf) };
	if (recvmsg(sock, &mh, MSG_CMSG_CLOEXEC) != 1)
		ft_die("child: recvmsg: %s", strerror(errno));
	struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
	if (!cm || cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS || cm->cmsg_len != CMSG_LEN(sizeof(int)))
		ft_die("child: no SCM_RIGHTS fd received");
	int fd;
	memcpy(&fd, CMSG_DATA(cm), sizeof(int));
	return fd;
}

int main(void)
{
	ft_init();
	ft_tree_begin();
	char cwd[400], want_path[512];
	if (!getcwd(cwd, sizeof(cwd)))
		ft_die("getcwd: %s", strerror(errno));
	snprintf(want_path, sizeof(want_path), "%s/scm.dat", cwd);
	int sp[2];
	FT_SYS(socketpair(AF_UNIX, SOCK_STREAM, 0, sp));

	pid_t kid = ft_fork();
	if (kid == 0) {
		close(sp[0]);
		/* occupy a few numbers so that the received fd differs from the root's */
		for (int i = 0; i < 4; i++)
			FT_SYS(open("/dev/null", O_RDONLY));
		int fd = recv_fd(sp[1]);
		FT_SYS(write(sp[1], &fd, sizeof(fd)));
		close(sp[1]);
		if (lseek(fd, 0, SEEK_CUR) != 50)
			ft_die("child: received fd at offset %ld, expected 50", (long)lseek(fd, 0, SEEK_CUR));
		ft_child_ready();

		ft_child_wait_go();
		FT_EQ(lseek(fd, 0, SEEK_CUR), 77, "child: offset of the received fd after the root's lseek");
		FT_EQ(fcntl(fd, F_GETFL) & O_ACCMODE, O_RDWR, "child: access mode of the received fd");
		FT_EQ(fcntl(fd, F_GETFD), FD_CLOEXEC, "child: FD_CLOEXEC of the received fd (MSG_CMSG_CLOEXEC)");
		char p[64], link[600];
		snprintf(p, sizeof(p), "/proc/self/fd/%d", fd);
		ssize_t n = readlink(p, link, sizeof(link) - 1);
		link[n > 0 ? n : 0] = 0;
		FT_CHECK(strcmp(link, want_path) == 0, "child: fd %d links to '%s', expected '%s'", fd, link, want_path);
		char b[11] = { 0 };
		FT_EQ(read(fd, b, 10), 10, "child: read 10 bytes");
		char want[11] = { 0 };
		for (int i = 0; i < 10; i++)
			want[i] = (char)('a' + (77 + i) % 26);
		FT_CHECK(memcmp(b, want, 10) == 0, "child: bytes at 77 are '%s', expected '%s'", b, want);
		FT_EQ(lseek(fd, 0, SEEK_CUR), 87, "child: offset after reading 10 bytes");
		FT_SYS(lseek(fd, 123, SEEK_SET));
		ft_child_exit("child");
	}
	close(sp[1]);
	int fd = (int)FT_SYS(open("scm.dat", O_RDWR | O_CREAT | O_TRUNC, 0600));
	char data[200];
	for (int i = 0; i < 200; i++)
		data[i] = (char)('a' + i % 26);
	FT_SYS(write(fd, data, 200));
	FT_SYS(lseek(fd, 50, SEEK_SET));
	send_fd(sp[0], fd);
	int kfd = -1;
	if (read(sp[0], &kfd, sizeof(kfd)) != (ssize_t)sizeof(kfd))
		ft_die("child did not report its fd number");
	close(sp[0]);
	ft_tree_wait_ready(1);
	long k = syscall(SYS_kcmp, getpid(), kid, KCMP_FILE, fd, kfd);
	int have_kcmp = k >= 0;
	if (!have_kcmp)
		ft_log("kcmp not available (%s): not checked", strerror(errno));
	else if (k != 0)
		ft_die("kcmp says root fd %d and child fd %d differ before READY", fd, kfd);
	ft_log("root fd %d, child fd %d", fd, kfd);

	ft_ready();
	ft_tree_wait_restored();

	if (have_kcmp)
		FT_EQ(syscall(SYS_kcmp, getpid(), kid, KCMP_FILE, fd, kfd), 0,
		      "kcmp(root fd, child's received fd): one file description");
	FT_EQ(lseek(fd, 0, SEEK_CUR), 50, "root: offset before its lseek");
	FT_SYS(lseek(fd, 77, SEEK_SET));
	ft_go(kid, "child");
	ft_reap(kid, "child");
	FT_EQ(lseek(fd, 0, SEEK_CUR), 123, "root: offset after the child's lseek");
	return ft_finish();
}
