/*
 * tree_unix_pair: unix sockets whose two ends live in different processes
 * of the tree, with data queued both ways at checkpoint time:
 *   - socketpair(AF_UNIX, SOCK_STREAM): 1000 bytes root->child, 1500 bytes
 *     child->root;
 *   - socketpair(AF_UNIX, SOCK_DGRAM): 3 datagrams root->child (10, 200 and
 *     3000 bytes), 4 child->root (1, 50, 700, 2000 bytes);
 *   - a listener bound to "tree.sock" (in the test dir) in the root; the
 *     child connect()ed to it and the root accept()ed; 333 bytes
 *     root->child and 444 child->root queued.
 * After restore: queued bytes (SIOCINQ, content) and datagrams (order,
 * sizes, content, then EAGAIN) intact on both sides, addresses of the named
 * connection and the listener kept; then new messages both ways on all
 * three, a second connection to the listener, and EOF on the stream
 * sockets once the child has exited.
 *
 * Synchronisation: report pipe before READY; after restore the root checks
 * its queued data before the go (the child sends nothing before its go);
 * then the child's new messages and the root's replies order the exchange
 * (blocking reads); the root reaps the child before the EOF checks.
 */
#include "ferry_test.h"
#include <stddef.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <linux/sockios.h>

static void fill(unsigned char *b, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		b[i] = (unsigned char)(seed * 151u + i * 13u + (i >> 7));
}

static void send_n(const char *who, int fd, size_t n, unsigned seed)
{
	static unsigned char b[4096];
	fill(b, n, seed);
	ssize_t w = send(fd, b, n, 0);
	if (w != (ssize_t)n)
		ft_die("%s: send %zu bytes (seed %u): %zd %s", who, n, seed, w, strerror(errno));
}

/* Stream: SIOCINQ == n, then exactly n bytes of fill(seed). */
static void expect_stream(const char *who, int fd, size_t n, unsigned seed, int check_inq)
{
	static unsigned char got[4096], want[4096];
	if (check_inq) {
		int q = -1;
		if (ioctl(fd, SIOCINQ, &q) != 0)
			ft_fail("%s: SIOCINQ: %s", who, strerror(errno));
		else
			FT_CHECK(q == (int)n, "%s: %d bytes queued, expected %zu", who, q, n);
	}
	ssize_t r = recv(fd, got, n, MSG_WAITALL);
	if (r != (ssize_t)n) {
		ft_fail("%s: recv %zu bytes: %zd (%s)", who, n, r, r < 0 ? strerror(errno) : "short");
		return;
	}
	fill(want, n, seed);
	FT_CHECK(memcmp(got, want, n) == 0, "%s: %zu bytes (seed %u) differ", who, n, seed);
}

/* Datagrams: exactly these sizes in this order (seeds seed0, seed0+1, ...), then EAGAIN. */
static void expect_dgrams(const char *who, int fd, const size_t *sizes, int count, unsigned seed0)
{
	static unsigned char got[8192], want[4096];
	for (int i = 0; i < count; i++) {
		ssize_t r = recv(fd, got, sizeof(got), MSG_DONTWAIT);
		if (r < 0) {
			ft_fail("%s: datagram %d of %d: %s", who, i + 1, count, strerror(errno));
			return;
		}
		if (r != (ssize_t)sizes[i]) {
			ft_fail("%s: datagram %d is %zd bytes, expected %zu (boundaries lost?)", who, i + 1, r,
				sizes[i]);
			return;
		}
		fill(want, sizes[i], seed0 + (unsigned)i);
		FT_CHECK(memcmp(got, want, sizes[i]) == 0, "%s: datagram %d content differs", who, i + 1);
	}
	ssize_t r = recv(fd, got, sizeof(got), MSG_DONTWAIT);
	FT_CHECK(r < 0 && errno == EAGAIN, "%s: more than %d datagrams queued (recv %zd)", who, count, r);
}

static void send_dgrams(const char *who, int fd, const size_t *sizes, int count, unsigned seed0)
{
	for (int i = 0; i < count; i++)
		send_n(who, fd, sizes[i], seed0 + (unsigned)i);
}

/* Blocking receive of one short message equal to s. */
static void expect_msg(const char *who, int fd, const char *s, int stream)
{
	char b[64] = { 0 };
	size_t n = strlen(s);
	ssize_t r = recv(fd, b, stream ? n : sizeof(b) - 1, stream ? MSG_WAITALL : 0);
	FT_CHECK(r == (ssize_t)n && memcmp(b, s, n) == 0, "%s: got %zd bytes '%s', expected '%s' (%s)", who, r, b, s,
		 r < 0 ? strerror(errno) : "");
}

static void send_msg(const char *who, int fd, const char *s)
{
	ssize_t w = send(fd, s, strlen(s), 0);
	FT_CHECK(w == (ssize_t)strlen(s), "%s: send '%s': %zd (%s)", who, s, w, strerror(errno));
}

static socklen_t path_addr(struct sockaddr_un *a)
{
	memset(a, 0, sizeof(*a));
	a->sun_family = AF_UNIX;
	strcpy(a->sun_path, "tree.sock");
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen("tree.sock") + 1);
}

/* getsockname (peer = 0) or getpeername (peer = 1) must be "tree.sock". */
static void expect_addr(const char *who, int fd, int peer)
{
	struct sockaddr_un want, got;
	socklen_t wl = path_addr(&want), gl = sizeof(got);
	memset(&got, 0, sizeof(got));
	int r = peer ? getpeername(fd, (struct sockaddr *)&got, &gl) : getsockname(fd, (struct sockaddr *)&got, &gl);
	if (r != 0) {
		ft_fail("%s: %s: %s", who, peer ? "getpeername" : "getsockname", strerror(errno));
		return;
	}
	if (gl == wl && memcmp(&got, &want, wl) == 0)
		return;
	ft_fail("%s: %s is '%s' (len %u), expected 'tree.sock' (len %u)", who, peer ? "peer address" : "address", got.sun_path, gl, wl);
}

static const size_t r2c_sizes[3] = { 10, 200, 3000 };
static const size_t c2r_sizes[4] = { 1, 50, 700, 2000 };

int main(void)
{
	ft_init();
	ft_tree_begin();
	int st[2], dg[2];
	FT_SYS(socketpair(AF_UNIX, SOCK_STREAM, 0, st));
	FT_SYS(socketpair(AF_UNIX, SOCK_DGRAM, 0, dg));
	struct sockaddr_un a;
	socklen_t al = path_addr(&a);
	int lis = (int)FT_SYS(socket(AF_UNIX, SOCK_STREAM, 0));
	FT_SYS(bind(lis, (struct sockaddr *)&a, al));
	FT_SYS(listen(lis, 4));

	pid_t kid = ft_fork();
	if (kid == 0) {
		close(st[0]);
		close(dg[0]);
		close(lis);
		int c = (int)FT_SYS(socket(AF_UNIX, SOCK_STREAM, 0));
		FT_SYS(connect(c, (struct sockaddr *)&a, al));
		send_n("child", st[1], 1500, 11);
		send_dgrams("child", dg[1], c2r_sizes, 4, 20);
		send_n("child", c, 444, 12);
		ft_child_ready();

		ft_child_wait_go();
		expect_stream("child: stream pair", st[1], 1000, 1, 1);
		expect_dgrams("child: dgram pair", dg[1], r2c_sizes, 3, 30);
		expect_stream("child: named connection", c, 333, 2, 1);
		expect_addr("child: named connection", c, 1);
		send_msg("child", st[1], "c2r stream");
		send_msg("child", dg[1], "c2r dgram");
		send_msg("child", c, "c2r named");
		expect_msg("child: reply on stream pair", st[1], "r2c stream", 1);
		expect_msg("child: reply on dgram pair", dg[1], "r2c dgram", 0);
		expect_msg("child: reply on named connection", c, "r2c named", 1);
		/* a new connection to the (restored) listener */
		int c2 = socket(AF_UNIX, SOCK_STREAM, 0);
		if (connect(c2, (struct sockaddr *)&a, al) != 0)
			ft_fail("child: connect to tree.sock after restore: %s", strerror(errno));
		else
			send_msg("child", c2, "second");
		close(c2);
		ft_child_exit("child");
	}
	close(st[1]);
	close(dg[1]);
	int conn = (int)FT_SYS(accept(lis, NULL, NULL));
	send_n("root", st[0], 1000, 1);
	send_dgrams("root", dg[0], r2c_sizes, 3, 30);
	send_n("root", conn, 333, 2);
	ft_tree_wait_ready(1);

	ft_ready();
	ft_tree_wait_restored();

	expect_stream("root: stream pair", st[0], 1500, 11, 1);
	expect_dgrams("root: dgram pair", dg[0], c2r_sizes, 4, 20);
	expect_stream("root: named connection", conn, 444, 12, 1);
	expect_addr("root: listener", lis, 0);
	expect_addr("root: accepted connection", conn, 0);
	ft_go(kid, "child");
	expect_msg("root: new message on stream pair", st[0], "c2r stream", 1);
	expect_msg("root: new message on dgram pair", dg[0], "c2r dgram", 0);
	expect_msg("root: new message on named connection", conn, "c2r named", 1);
	send_msg("root", st[0], "r2c stream");
	send_msg("root", dg[0], "r2c dgram");
	send_msg("root", conn, "r2c named");
	int c2 = accept(lis, NULL, NULL);
	if (c2 < 0)
		ft_fail("root: accept after restore: %s", strerror(errno));
	else
		expect_msg("root: second connection", c2, "second", 1);
	ft_reap(kid, "child");

	/* the child is gone: its ends are closed, so the stream sockets read EOF */
	char b;
	FT_EQ(recv(st[0], &b, 1, MSG_DONTWAIT), 0, "root: stream pair after the child exited (EOF)");
	FT_EQ(recv(conn, &b, 1, MSG_DONTWAIT), 0, "root: named connection after the child exited (EOF)");
	if (c2 >= 0)
		FT_EQ(recv(c2, &b, 1, MSG_DONTWAIT), 0, "root: second connection after the child exited (EOF)");
	return ft_finish();
}
