/*
 * sock_unix_scm_orphan: descriptors in flight that only the message holds
 * (zdtm scm00): on a STREAM socketpair, "f" passes a regular file
 * ("scm_orphan.dat", 100 bytes, offset 30, O_APPEND) and an eventfd
 * (count 7); "g" passes the same file description again and /dev/null;
 * on a DGRAM socketpair, "d" passes a directory. The sender closes every
 * copy of them. After restore the
 * receiver gets each message with its descriptors: the file's offset,
 * flags and content, the eventfd's count, one description for both
 * copies of the file (kcmp, and a seek through one moves the other),
 * /dev/null and the directory; then nothing more on either socket, and
 * the stream pair still carries data.
 */
#include "ferry_test.h"
#include <linux/kcmp.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>

static void send_fds(int sock, const char *data, const int *fds, int n)
{
	struct iovec iov = { (void *)data, strlen(data) };
	union {
		char buf[CMSG_SPACE(4 * sizeof(int))];
		struct cmsghdr align;
	} u;
	memset(&u, 0, sizeof(u));
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
			     .msg_controllen = CMSG_SPACE(n * sizeof(int)) };
	struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(n * sizeof(int));
	memcpy(CMSG_DATA(cm), fds, n * sizeof(int));
	FT_SYS(sendmsg(sock, &mh, 0));
}

/* One message: its data must be `data`, its descriptors go to fds. */
static int recv_fds(int sock, const char *data, int *fds, int max)
{
	char b[16] = { 0 };
	struct iovec iov = { b, sizeof(b) - 1 };
	union {
		char buf[CMSG_SPACE(4 * sizeof(int))];
		struct cmsghdr align;
	} u;
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf) };
	ssize_t r = recvmsg(sock, &mh, MSG_DONTWAIT);
	FT_CHECK(r == (ssize_t)strlen(data) && memcmp(b, data, strlen(data)) == 0, "message '%s': recvmsg %zd '%s' (%s)",
		 data, r, b, r < 0 ? strerror(errno) : "-");
	struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
	if (!cm || cm->cmsg_type != SCM_RIGHTS) {
		ft_fail("message '%s': no descriptors", data);
		return 0;
	}
	int n = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
	if (n > max)
		n = max;
	memcpy(fds, CMSG_DATA(cm), n * sizeof(int));
	return n;
}

int main(void)
{
	ft_init();
	char content[100];
	for (int i = 0; i < 100; i++)
		content[i] = (char)('a' + i % 26);
	int st[2], dg[2];
	FT_SYS(socketpair(AF_UNIX, SOCK_STREAM, 0, st));
	FT_SYS(socketpair(AF_UNIX, SOCK_DGRAM, 0, dg));
	int file = (int)FT_SYS(open("scm_orphan.dat", O_RDWR | O_CREAT | O_TRUNC | O_APPEND, 0600));
	FT_SYS(write(file, content, sizeof(content)));
	FT_SYS(lseek(file, 30, SEEK_SET));
	int ev = (int)FT_SYS(eventfd(7, 0));
	int null = (int)FT_SYS(open("/dev/null", O_WRONLY));
	int dir = (int)FT_SYS(open(".", O_RDONLY | O_DIRECTORY));
	int m1[2] = { file, ev }, m2[2] = { file, null };
	send_fds(st[0], "f", m1, 2);
	send_fds(st[0], "g", m2, 2);
	send_fds(dg[0], "d", &dir, 1);
	close(file);
	close(ev);
	close(null);
	close(dir);

	ft_ready();
	ft_wait_restored();

	int a[4] = { -1, -1, -1, -1 }, b[4] = { -1, -1, -1, -1 }, d[4] = { -1, -1, -1, -1 };
	FT_EQ(recv_fds(st[1], "f", a, 4), 2, "descriptors of 'f'");
	FT_EQ(recv_fds(st[1], "g", b, 4), 2, "descriptors of 'g'");
	FT_EQ(recv_fds(dg[1], "d", d, 4), 1, "descriptors of 'd'");
	FT_EQ(lseek(a[0], 0, SEEK_CUR), 30, "file offset");
	FT_CHECK(fcntl(a[0], F_GETFL) & O_APPEND, "O_APPEND lost");
	FT_CHECK((fcntl(a[0], F_GETFL) & O_ACCMODE) == O_RDWR, "access mode");
	char got[100];
	FT_EQ(pread(a[0], got, sizeof(got), 0), 100, "file size");
	FT_CHECK(memcmp(got, content, sizeof(got)) == 0, "file content");
	pid_t me = getpid();
	FT_EQ(syscall(SYS_kcmp, me, me, KCMP_FILE, a[0], b[0]), 0, "the file passed twice is one description");
	FT_SYS(lseek(b[0], 44, SEEK_SET));
	FT_EQ(lseek(a[0], 0, SEEK_CUR), 44, "a seek through one copy moves the other");
	uint64_t v = 0;
	FT_EQ(read(a[1], &v, sizeof(v)), 8, "eventfd read");
	FT_EQ(v, 7, "eventfd count");
	char link[256] = { 0 }, path[64];
	snprintf(path, sizeof(path), "/proc/self/fd/%d", b[1]);
	FT_CHECK(readlink(path, link, sizeof(link) - 1) > 0 && strcmp(link, "/dev/null") == 0, "second fd of 'g' is '%s'",
		 link);
	FT_EQ(write(b[1], "x", 1), 1, "/dev/null write");
	struct stat sd, here;
	FT_SYS(stat(".", &here));
	FT_CHECK(fstat(d[0], &sd) == 0 && S_ISDIR(sd.st_mode) && sd.st_ino == here.st_ino, "the directory passed");
	char e;
	FT_CHECK(recv(st[1], &e, 1, MSG_DONTWAIT) < 0 && errno == EAGAIN, "stream data left");
	FT_EQ(send(st[0], "h", 1, 0), 1, "stream send after restore");
	FT_EQ(recv(st[1], &e, 1, MSG_DONTWAIT), 1, "stream recv after restore");
	FT_CHECK(recv(dg[1], &e, 1, MSG_DONTWAIT) < 0 && errno == EAGAIN, "datagram left");
	unlink("scm_orphan.dat");
	return ft_finish();
}
