/*
 * tree_scm_in_flight: unix messages with SCM_RIGHTS and SCM_CREDENTIALS
 * sent and not yet received at checkpoint time, both peers in the tree.
 *
 * Before the fork the root opens "scm_flight.dat" (200 bytes, offset 50)
 * and a pipe holding "hello", then queues on a DGRAM socketpair: "one"
 * (plain), "two" with [file, pipe read end], "three" with [file]; and on a
 * STREAM socketpair whose receiving end has SO_PASSCRED on: "AAAA" with
 * explicit credentials (root's pid, uid 1234, gid 5678), "BB" with the
 * root's own (uid 0, gid 0), "CC" with [file], "DD" (the kernel gives
 * "BBCC" with the file in one read: same credentials, fds end a read). The
 * child keeps only the receiving ends (it closes its copies of the file
 * and the pipe); the root keeps the file and the pipe.
 *
 * After restore the child reads everything: boundaries, data, the fds
 * (kcmp with the root's fds: same descriptions, offset 50, the pipe gives
 * "hello") and credentials (pid of the restored root, uid, gid), then
 * EAGAIN on both sockets.
 */
#include "ferry_test.h"
#include <linux/kcmp.h>
#include <sys/socket.h>

static void send_msg(int sock, const char *data, const int *fds, int nfds, const struct ucred *cr)
{
	struct iovec iov = { (void *)data, strlen(data) };
	union {
		char buf[CMSG_SPACE(4 * sizeof(int)) + CMSG_SPACE(sizeof(struct ucred))];
		struct cmsghdr align;
	} u;
	memset(&u, 0, sizeof(u));
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	size_t len = (nfds ? CMSG_SPACE(nfds * sizeof(int)) : 0) + (cr ? CMSG_SPACE(sizeof(*cr)) : 0);
	if (len) {
		mh.msg_control = u.buf;
		mh.msg_controllen = len;
		struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
		if (nfds) {
			cm->cmsg_level = SOL_SOCKET;
			cm->cmsg_type = SCM_RIGHTS;
			cm->cmsg_len = CMSG_LEN(nfds * sizeof(int));
			memcpy(CMSG_DATA(cm), fds, nfds * sizeof(int));
			cm = CMSG_NXTHDR(&mh, cm);
		}
		if (cr) {
			cm->cmsg_level = SOL_SOCKET;
			cm->cmsg_type = SCM_CREDENTIALS;
			cm->cmsg_len = CMSG_LEN(sizeof(*cr));
			memcpy(CMSG_DATA(cm), cr, sizeof(*cr));
		}
	}
	if (sendmsg(sock, &mh, MSG_DONTWAIT) != (ssize_t)strlen(data))
		ft_die("sendmsg(%s): %s", data, strerror(errno));
}

struct got {
	char data[64];
	int fds[8];
	int nfds;
	int has_cred;
	struct ucred cred;
};

static ssize_t recv_msg(int sock, struct got *g)
{
	memset(g, 0, sizeof(*g));
	struct iovec iov = { g->data, sizeof(g->data) - 1 };
	union {
		char buf[CMSG_SPACE(8 * sizeof(int)) + CMSG_SPACE(sizeof(struct ucred))];
		struct cmsghdr align;
	} u;
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf) };
	ssize_t n = recvmsg(sock, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
	if (n < 0)
		return n;
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
		if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
			g->nfds = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			memcpy(g->fds, CMSG_DATA(cm), g->nfds * sizeof(int));
		} else if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_CREDENTIALS) {
			g->has_cred = 1;
			memcpy(&g->cred, CMSG_DATA(cm), sizeof(g->cred));
		}
	}
	return n;
}

static void check_file_fd(pid_t root, int root_fd, int fd, const char *what)
{
	long k = syscall(SYS_kcmp, root, getpid(), KCMP_FILE, root_fd, fd);
	FT_CHECK(k == 0, "child: %s: kcmp with the root's file fd gives %ld (%s)", what, k, k < 0 ? strerror(errno) : "");
	FT_EQ(lseek(fd, 0, SEEK_CUR), 50, "child: offset of the passed file");
	FT_EQ(fcntl(fd, F_GETFL) & O_ACCMODE, O_RDWR, "child: access mode of the passed file");
}

int main(void)
{
	ft_init();
	ft_tree_begin();
	int dg[2], st[2], pp[2];
	FT_SYS(socketpair(AF_UNIX, SOCK_DGRAM, 0, dg));
	FT_SYS(socketpair(AF_UNIX, SOCK_STREAM, 0, st));
	int one = 1;
	FT_SYS(setsockopt(st[1], SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)));
	FT_SYS(pipe(pp));
	FT_SYS(write(pp[1], "hello", 5));
	int file = (int)FT_SYS(open("scm_flight.dat", O_RDWR | O_CREAT | O_TRUNC, 0600));
	char data[200];
	for (int i = 0; i < 200; i++)
		data[i] = (char)('a' + i % 26);
	FT_SYS(write(file, data, 200));
	FT_SYS(lseek(file, 50, SEEK_SET));

	pid_t root = getpid();
	send_msg(dg[0], "one", NULL, 0, NULL);
	int two[2] = { file, pp[0] };
	send_msg(dg[0], "two", two, 2, NULL);
	send_msg(dg[0], "three", &file, 1, NULL);
	struct ucred cr = { .pid = root, .uid = 1234, .gid = 5678 };
	send_msg(st[0], "AAAA", NULL, 0, &cr);
	send_msg(st[0], "BB", NULL, 0, NULL);
	send_msg(st[0], "CC", &file, 1, NULL);
	send_msg(st[0], "DD", NULL, 0, NULL);

	pid_t kid = ft_fork();
	if (kid == 0) {
		close(dg[0]);
		close(st[0]);
		close(pp[0]);
		close(pp[1]);
		close(file);
		ft_child_ready();
		ft_child_wait_go();
		struct got g;
		FT_EQ(recv_msg(dg[1], &g), 3, "child: dgram 1 length");
		FT_CHECK(strcmp(g.data, "one") == 0 && g.nfds == 0, "child: dgram 1 is '%s' with %d fds", g.data, g.nfds);
		FT_EQ(recv_msg(dg[1], &g), 3, "child: dgram 2 length");
		FT_CHECK(strcmp(g.data, "two") == 0 && g.nfds == 2, "child: dgram 2 is '%s' with %d fds", g.data, g.nfds);
		if (g.nfds == 2) {
			check_file_fd(root, file, g.fds[0], "dgram 2 fd 0");
			char b[8] = { 0 };
			FT_EQ(read(g.fds[1], b, sizeof(b)), 5, "child: read from the passed pipe end");
			FT_CHECK(memcmp(b, "hello", 5) == 0, "child: passed pipe holds '%s'", b);
			long k = syscall(SYS_kcmp, root, getpid(), KCMP_FILE, pp[0], g.fds[1]);
			FT_EQ(k, 0, "child: kcmp of the passed pipe end with the root's");
		}
		FT_EQ(recv_msg(dg[1], &g), 5, "child: dgram 3 length");
		FT_CHECK(strcmp(g.data, "three") == 0 && g.nfds == 1, "child: dgram 3 is '%s' with %d fds", g.data, g.nfds);
		if (g.nfds == 1)
			check_file_fd(root, file, g.fds[0], "dgram 3 fd");
		FT_CHECK(recv_msg(dg[1], &g) < 0 && errno == EAGAIN, "child: dgram queue empty afterwards");

		FT_EQ(recv_msg(st[1], &g), 4, "child: stream message 1 length");
		FT_CHECK(strcmp(g.data, "AAAA") == 0 && g.nfds == 0, "child: stream 1 is '%s' with %d fds", g.data, g.nfds);
		FT_CHECK(g.has_cred && g.cred.pid == root && g.cred.uid == 1234 && g.cred.gid == 5678,
			 "child: stream 1 credentials %d pid %d uid %d gid %d, expected pid %d uid 1234 gid 5678", g.has_cred,
			 g.cred.pid, g.cred.uid, g.cred.gid, root);
		/* The kernel joins "BB" and "CC" (same credentials); the fds end the read. */
		FT_EQ(recv_msg(st[1], &g), 4, "child: stream message 2 length");
		FT_CHECK(strcmp(g.data, "BBCC") == 0 && g.nfds == 1, "child: stream 2 is '%s' with %d fds", g.data, g.nfds);
		FT_CHECK(g.has_cred && g.cred.pid == root && g.cred.uid == 0 && g.cred.gid == 0,
			 "child: stream 2 credentials %d pid %d uid %d gid %d, expected pid %d uid 0 gid 0", g.has_cred, g.cred.pid,
			 g.cred.uid, g.cred.gid, root);
		if (g.nfds == 1)
			check_file_fd(root, file, g.fds[0], "stream 2 fd");
		FT_EQ(recv_msg(st[1], &g), 2, "child: stream message 3 length");
		FT_CHECK(strcmp(g.data, "DD") == 0 && g.nfds == 0, "child: stream 3 is '%s' with %d fds", g.data, g.nfds);
		FT_CHECK(g.has_cred && g.cred.pid == root, "child: stream 3 credentials pid %d, expected %d", g.cred.pid, root);
		FT_CHECK(recv_msg(st[1], &g) < 0 && errno == EAGAIN, "child: stream queue empty afterwards");
		ft_child_exit("child");
	}
	close(dg[1]);
	close(st[1]);
	ft_tree_wait_ready(1);
	ft_ready();
	ft_tree_wait_restored();
	ft_go(kid, "child");
	ft_reap(kid, "child");
	return ft_finish();
}
