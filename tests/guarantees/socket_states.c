/*
 * socket_states MODE: socket states ferry cannot give back and refuses at
 * checkpoint, by name, while the process runs on (the guarantees test runs
 * it with each MODE). It sets the state up, prints READY, and after
 * SIGUSR2 checks that the refused checkpoint left it exactly as it was:
 *   tcp_reset         a connection reset by its peer, 5 bytes unread: the
 *                     bytes, then ECONNRESET, then EOF
 *   tcp_closed        closed both ways (this end shut down writing, then
 *                     the peer closed), 3 bytes unread: the bytes, then EOF
 *   tcp_disconnected  connected, then connect(AF_UNSPEC): connects again
 *   time_wait         a listener without SO_REUSEADDR whose port has a
 *                     TIME_WAIT connection: still accepts
 *   time_wait_reuse_later  the same, but the listener set SO_REUSEADDR
 *                     after it accepted that connection (which has none):
 *                     still accepts
 *   tcp_in_flight     an established connection in flight (SCM_RIGHTS)
 *                     while the sender still holds it: received, carries data
 *   addr_deleted      (in a network namespace of its own) a UDP socket bound
 *                     to an address deleted since: still bound there
 *   outside_listener, outside_udp, outside_tcp: a child (the test
 *                     checkpoints it alone) holds a socket its parent holds
 *                     too: the parent's copy still works
 *   tcp_oob           an unread urgent byte: recv(MSG_OOB) gets it
 *   tcp_oob_inline    the same with SO_OOBINLINE: read inline at the mark
 *   tcp_oob_read      an urgent byte already read with recv(MSG_OOB), with
 *                     bytes queued on both sides of its place: read, the
 *                     bytes before it, then those after it
 *   unix_oob          a unix stream MSG_OOB byte: recv(MSG_OOB) gets it
 *   connect_refused   a non-blocking connect refused, not read: SO_ERROR
 *   shut_rd           shutdown(SHUT_RD): recv gives EOF at once
 *   udp_icmp          a connected UDP socket with a port-unreachable error
 *                     pending: recv gives ECONNREFUSED
 *   udp_errqueue      IP_RECVERR with an error queued: MSG_ERRQUEUE reads it
 *   udp_cork          UDP_CORK with 3 bytes corked: uncorked, they arrive
 *   udp_shut_rd       a connected UDP socket shut down for reading: EOF
 *   tcp_shut_wr_early TCP sockets shut down for writing before connect
 *                     (no FIN): one connected since, one not: send gives
 *                     EPIPE on both (the second after its connect)
 *   udp_shut_wr       a connected and a bound UDP socket shut down for
 *                     writing: send and sendto give EPIPE
 */
#define _GNU_SOURCE
#include "../conformance/ferry_test.h"
#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/errqueue.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <netinet/udp.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/ioctl.h>
#include <sys/wait.h>

static const char *mode = "";
static int a = -1, b = -1, l = -1, extra = -1;
static pid_t child = -1;
static struct sockaddr_in laddr;

static void cleanup(void)
{
	if (child > 0) {
		kill(child, SIGKILL);
		waitpid(child, NULL, 0);
		child = -1;
	}
}

static int tcp_state(int fd)
{
	struct tcp_info ti;
	socklen_t tl = sizeof(ti);
	FT_SYS(getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &tl));
	return ti.tcpi_state;
}

static void wait_state(int fd, int state, const char *what)
{
	double deadline = ft_mono() + 5;
	while (tcp_state(fd) != state)
		if (ft_mono() > deadline)
			ft_die("%s: state %d, not %d", what, tcp_state(fd), state);
		else
			ft_sleep_ms(1);
}

/* A listener on 127.0.0.1 (an ephemeral port) in l, its address in laddr. */
static void listen_loopback(void)
{
	l = (int)FT_SYS(socket(AF_INET, SOCK_STREAM, 0));
	laddr = (struct sockaddr_in){ .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	FT_SYS(bind(l, (struct sockaddr *)&laddr, sizeof(laddr)));
	FT_SYS(listen(l, 8));
	socklen_t al = sizeof(laddr);
	FT_SYS(getsockname(l, (struct sockaddr *)&laddr, &al));
}

/* A connected pair through l: a the client end, b the accepted one. */
static void tcp_pair(void)
{
	if (l < 0)
		listen_loopback();
	a = (int)FT_SYS(socket(AF_INET, SOCK_STREAM, 0));
	FT_SYS(connect(a, (struct sockaddr *)&laddr, sizeof(laddr)));
	b = (int)FT_SYS(accept(l, NULL, NULL));
}

/* A loopback port nothing listens on. */
static struct sockaddr_in closed_port(int type)
{
	int s = (int)FT_SYS(socket(AF_INET, type, 0));
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	FT_SYS(bind(s, (struct sockaddr *)&sa, sizeof(sa)));
	socklen_t al = sizeof(sa);
	FT_SYS(getsockname(s, (struct sockaddr *)&sa, &al));
	close(s);
	return sa;
}

static void expect_bytes(int fd, const char *want, int flags)
{
	char buf[16] = { 0 };
	size_t n = strlen(want);
	FT_EQ(recv(fd, buf, n, flags | MSG_WAITALL), (ssize_t)n, "unread bytes");
	FT_CHECK(memcmp(buf, want, n) == 0, "read '%s', not '%s'", buf, want);
}

static void expect_error(int fd, int err)
{
	char c;
	errno = 0;
	FT_EQ(recv(fd, &c, 1, MSG_DONTWAIT), -1, "recv");
	FT_CHECK(errno == err, "recv gives %s, not %s", strerror(errno), strerror(err));
}

static void expect_eof(int fd)
{
	char c;
	FT_EQ(recv(fd, &c, 1, MSG_DONTWAIT), 0, "recv at EOF");
}

static void connects_to_l(void)
{
	int c = (int)FT_SYS(socket(AF_INET, SOCK_STREAM, 0));
	FT_CHECK(connect(c, (struct sockaddr *)&laddr, sizeof(laddr)) == 0, "connect: %s", strerror(errno));
	int s = accept(l, NULL, NULL);
	FT_CHECK(s >= 0, "accept: %s", strerror(errno));
	FT_EQ(write(c, "n", 1), 1, "write on a new connection");
	expect_bytes(s, "n", 0);
	close(c);
	close(s);
}

static void send_fd(int via, int fd)
{
	char cbuf[CMSG_SPACE(sizeof(int))] = { 0 };
	struct iovec iov = { .iov_base = "f", .iov_len = 1 };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
	struct cmsghdr *c = CMSG_FIRSTHDR(&m);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &fd, sizeof(int));
	FT_EQ(sendmsg(via, &m, 0), 1, "sendmsg");
}

static int recv_fd(int via)
{
	char cbuf[CMSG_SPACE(sizeof(int))] = { 0 };
	char c;
	struct iovec iov = { .iov_base = &c, .iov_len = 1 };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
	FT_EQ(recvmsg(via, &m, MSG_DONTWAIT), 1, "recvmsg");
	struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
	FT_CHECK(cm && cm->cmsg_type == SCM_RIGHTS, "no descriptor in flight");
	int got = -1;
	if (cm)
		memcpy(&got, CMSG_DATA(cm), sizeof(int));
	return got;
}

static void setup_tcp(void)
{
	if (strcmp(mode, "tcp_reset") == 0) {
		tcp_pair();
		FT_EQ(write(b, "abcde", 5), 5, "write");
		struct linger lg = { 1, 0 };
		FT_SYS(setsockopt(b, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)));
		ft_sleep_ms(20);
		close(b);
		wait_state(a, TCP_CLOSE, "reset end");
	} else if (strcmp(mode, "tcp_closed") == 0) {
		tcp_pair();
		FT_SYS(shutdown(a, SHUT_WR));
		FT_EQ(write(b, "abc", 3), 3, "write");
		wait_state(b, TCP_CLOSE_WAIT, "peer");
		close(b);
		wait_state(a, TCP_CLOSE, "closed end");
	} else if (strcmp(mode, "tcp_disconnected") == 0) {
		tcp_pair();
		struct sockaddr sa = { .sa_family = AF_UNSPEC };
		FT_SYS(connect(a, &sa, sizeof(sa)));
		close(b);
		wait_state(a, TCP_CLOSE, "disconnected end");
	} else if (strcmp(mode, "time_wait") == 0 || strcmp(mode, "time_wait_reuse_later") == 0) {
		tcp_pair();
		if (strcmp(mode, "time_wait_reuse_later") == 0) {
			int on = 1;
			FT_SYS(setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on)));
		}
		/* The server closes first: its end waits in TIME_WAIT on l's port. */
		close(b);
		wait_state(a, TCP_CLOSE_WAIT, "client");
		close(a);
		ft_sleep_ms(20);
	} else if (strcmp(mode, "tcp_in_flight") == 0) {
		tcp_pair();
		int sv[2];
		FT_SYS(socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
		send_fd(sv[0], b);
		extra = sv[1];
	} else if (strcmp(mode, "tcp_oob") == 0 || strcmp(mode, "tcp_oob_inline") == 0) {
		tcp_pair();
		int on = 1;
		if (strcmp(mode, "tcp_oob_inline") == 0)
			FT_SYS(setsockopt(b, SOL_SOCKET, SO_OOBINLINE, &on, sizeof(on)));
		FT_EQ(send(a, "ab", 2, 0), 2, "send");
		FT_EQ(send(a, "u", 1, MSG_OOB), 1, "send MSG_OOB");
		ft_sleep_ms(20);
	} else if (strcmp(mode, "tcp_oob_read") == 0) {
		tcp_pair();
		FT_EQ(send(a, "ab", 2, 0), 2, "send");
		FT_EQ(send(a, "u", 1, MSG_OOB), 1, "send MSG_OOB");
		FT_EQ(send(a, "cd", 2, 0), 2, "send after the urgent byte");
		ft_sleep_ms(20);
		expect_bytes(b, "u", MSG_OOB);
	} else if (strcmp(mode, "connect_refused") == 0) {
		struct sockaddr_in to = closed_port(SOCK_STREAM);
		a = (int)FT_SYS(socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0));
		FT_CHECK(connect(a, (struct sockaddr *)&to, sizeof(to)) < 0 && errno == EINPROGRESS,
			 "non-blocking connect: %s", strerror(errno));
		ft_sleep_ms(20);
	} else if (strcmp(mode, "shut_rd") == 0) {
		tcp_pair();
		FT_SYS(shutdown(b, SHUT_RD));
	} else if (strcmp(mode, "tcp_shut_wr_early") == 0) {
		/* Shut down before connect: ENOTCONN, and the socket is shut
		 * down all the same; b is connected after that, a never. */
		listen_loopback();
		a = (int)FT_SYS(socket(AF_INET, SOCK_STREAM, 0));
		b = (int)FT_SYS(socket(AF_INET, SOCK_STREAM, 0));
		FT_CHECK(shutdown(a, SHUT_WR) < 0 && errno == ENOTCONN, "shutdown of an unconnected socket");
		FT_CHECK(shutdown(b, SHUT_WR) < 0 && errno == ENOTCONN, "shutdown of an unconnected socket");
		FT_SYS(connect(b, (struct sockaddr *)&laddr, sizeof(laddr)));
		extra = (int)FT_SYS(accept(l, NULL, NULL));
	}
}

static void setup_udp(void)
{
	if (strcmp(mode, "udp_icmp") == 0 || strcmp(mode, "udp_errqueue") == 0) {
		struct sockaddr_in to = closed_port(SOCK_DGRAM);
		a = (int)FT_SYS(socket(AF_INET, SOCK_DGRAM, 0));
		int on = 1;
		if (strcmp(mode, "udp_errqueue") == 0) {
			FT_SYS(setsockopt(a, IPPROTO_IP, IP_RECVERR, &on, sizeof(on)));
			FT_EQ(sendto(a, "x", 1, 0, (struct sockaddr *)&to, sizeof(to)), 1, "sendto");
		} else {
			FT_SYS(connect(a, (struct sockaddr *)&to, sizeof(to)));
			FT_EQ(send(a, "x", 1, 0), 1, "send");
		}
		ft_sleep_ms(20);
	} else if (strcmp(mode, "udp_cork") == 0 || strcmp(mode, "udp_shut_rd") == 0 ||
		   strcmp(mode, "udp_shut_wr") == 0) {
		b = (int)FT_SYS(socket(AF_INET, SOCK_DGRAM, 0));
		struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
		FT_SYS(bind(b, (struct sockaddr *)&sa, sizeof(sa)));
		socklen_t al = sizeof(sa);
		FT_SYS(getsockname(b, (struct sockaddr *)&sa, &al));
		a = (int)FT_SYS(socket(AF_INET, SOCK_DGRAM, 0));
		FT_SYS(connect(a, (struct sockaddr *)&sa, sizeof(sa)));
		int on = 1;
		if (strcmp(mode, "udp_shut_rd") == 0) {
			FT_SYS(shutdown(a, SHUT_RD));
			return;
		}
		if (strcmp(mode, "udp_shut_wr") == 0) {
			/* Shown by poll only with both sides shut down. */
			FT_SYS(shutdown(a, SHUT_WR));
			/* Unconnected: ENOTCONN, and the socket is shut down all the same. */
			FT_CHECK(shutdown(b, SHUT_WR) < 0 && errno == ENOTCONN, "shutdown of the unconnected socket");
			return;
		}
		FT_SYS(setsockopt(a, IPPROTO_UDP, UDP_CORK, &on, sizeof(on)));
		FT_EQ(send(a, "abc", 3, 0), 3, "corked send");
	} else if (strcmp(mode, "unix_oob") == 0) {
		int sv[2];
		FT_SYS(socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
		a = sv[0];
		b = sv[1];
		FT_EQ(send(a, "ab", 2, 0), 2, "send");
		FT_EQ(send(a, "u", 1, MSG_OOB), 1, "send MSG_OOB");
	} else if (strcmp(mode, "addr_deleted") == 0) {
		FT_SYS(unshare(CLONE_NEWNET));
		FT_CHECK(system("ip link set lo up && ip addr add 10.77.0.1/32 dev lo") == 0, "adding 10.77.0.1");
		a = (int)FT_SYS(socket(AF_INET, SOCK_DGRAM, 0));
		struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(7070) };
		inet_pton(AF_INET, "10.77.0.1", &sa.sin_addr);
		FT_SYS(bind(a, (struct sockaddr *)&sa, sizeof(sa)));
		FT_CHECK(system("ip addr del 10.77.0.1/32 dev lo") == 0, "deleting 10.77.0.1");
	}
}

/* outside_*: the socket is made before the fork; the child (checkpointed
 * alone by the test) and this process both hold it. */
static void setup_outside(void)
{
	if (strcmp(mode, "outside_listener") == 0) {
		listen_loopback();
	} else if (strcmp(mode, "outside_udp") == 0) {
		a = (int)FT_SYS(socket(AF_INET, SOCK_DGRAM, 0));
		struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
		FT_SYS(bind(a, (struct sockaddr *)&sa, sizeof(sa)));
	} else {
		tcp_pair();
	}
	child = fork();
	if (child < 0)
		ft_die("fork: %s", strerror(errno));
	if (child == 0) {
		int null = open("/dev/null", O_RDWR);
		dup2(null, 1);
		dup2(null, 2);
		close(null);
		alarm(60);
		for (;;)
			pause();
	}
	ft_log("CHILD %d", (int)child);
}

static void check_tcp(void)
{
	if (strcmp(mode, "tcp_reset") == 0) {
		expect_bytes(a, "abcde", 0);
		expect_error(a, ECONNRESET);
		expect_eof(a);
	} else if (strcmp(mode, "tcp_closed") == 0) {
		expect_bytes(a, "abc", 0);
		expect_eof(a);
	} else if (strcmp(mode, "tcp_disconnected") == 0) {
		FT_CHECK(connect(a, (struct sockaddr *)&laddr, sizeof(laddr)) == 0, "connecting again: %s",
			 strerror(errno));
		close(accept(l, NULL, NULL));
	} else if (strcmp(mode, "time_wait") == 0 || strcmp(mode, "time_wait_reuse_later") == 0) {
		connects_to_l();
	} else if (strcmp(mode, "tcp_in_flight") == 0) {
		int got = recv_fd(extra);
		FT_EQ(write(got, "z", 1), 1, "write on the received connection");
		expect_bytes(a, "z", 0);
	} else if (strcmp(mode, "tcp_oob") == 0) {
		expect_bytes(b, "ab", 0);
		expect_bytes(b, "u", MSG_OOB);
	} else if (strcmp(mode, "tcp_oob_inline") == 0) {
		expect_bytes(b, "ab", 0);
		int mark = 0;
		FT_SYS(ioctl(b, SIOCATMARK, &mark));
		FT_CHECK(mark == 1, "not at the urgent mark");
		expect_bytes(b, "u", 0);
	} else if (strcmp(mode, "tcp_oob_read") == 0) {
		expect_bytes(b, "ab", 0);
		expect_bytes(b, "cd", 0);
	} else if (strcmp(mode, "connect_refused") == 0) {
		int err = 0;
		socklen_t el = sizeof(err);
		FT_SYS(getsockopt(a, SOL_SOCKET, SO_ERROR, &err, &el));
		FT_CHECK(err == ECONNREFUSED, "SO_ERROR is %d (%s), not ECONNREFUSED", err, strerror(err));
	} else if (strcmp(mode, "shut_rd") == 0) {
		expect_eof(b);
	} else if (strcmp(mode, "tcp_shut_wr_early") == 0) {
		FT_CHECK(send(b, "x", 1, MSG_NOSIGNAL) < 0 && errno == EPIPE, "send on the connection shut down for writing: %s", strerror(errno));
		FT_CHECK(connect(a, (struct sockaddr *)&laddr, sizeof(laddr)) == 0, "connect: %s", strerror(errno));
		close(accept(l, NULL, NULL));
		FT_CHECK(send(a, "x", 1, MSG_NOSIGNAL) < 0 && errno == EPIPE, "send on the socket shut down for writing before its connect: %s", strerror(errno));
	}
}

static void check_other(void)
{
	if (strcmp(mode, "udp_icmp") == 0) {
		expect_error(a, ECONNREFUSED);
	} else if (strcmp(mode, "udp_errqueue") == 0) {
		char c, cbuf[256];
		struct iovec iov = { .iov_base = &c, .iov_len = 1 };
		struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
		FT_CHECK(recvmsg(a, &m, MSG_ERRQUEUE | MSG_DONTWAIT) >= 0, "MSG_ERRQUEUE: %s", strerror(errno));
		struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
		FT_CHECK(cm && cm->cmsg_type == IP_RECVERR, "no IP_RECVERR entry");
		if (cm) {
			struct sock_extended_err ee;
			memcpy(&ee, CMSG_DATA(cm), sizeof(ee));
			FT_EQ(ee.ee_errno, ECONNREFUSED, "queued error");
		}
	} else if (strcmp(mode, "udp_cork") == 0) {
		int off = 0;
		FT_SYS(setsockopt(a, IPPROTO_UDP, UDP_CORK, &off, sizeof(off)));
		char buf[8] = { 0 };
		FT_EQ(recv(b, buf, sizeof(buf), 0), 3, "the corked datagram");
		FT_CHECK(memcmp(buf, "abc", 3) == 0, "corked datagram '%s'", buf);
	} else if (strcmp(mode, "udp_shut_wr") == 0) {
		struct sockaddr_in to;
		socklen_t al = sizeof(to);
		FT_SYS(getsockname(b, (struct sockaddr *)&to, &al));
		FT_CHECK(send(a, "x", 1, MSG_NOSIGNAL) < 0 && errno == EPIPE, "send on the connected socket shut down for writing: %s", strerror(errno));
		FT_CHECK(sendto(b, "x", 1, MSG_NOSIGNAL, (struct sockaddr *)&to, sizeof(to)) < 0 && errno == EPIPE,
			 "sendto on the bound socket shut down for writing: %s", strerror(errno));
	} else if (strcmp(mode, "udp_shut_rd") == 0) {
		struct pollfd p = { .fd = a, .events = POLLIN | POLLRDHUP };
		FT_CHECK(poll(&p, 1, 0) == 1 && (p.revents & POLLRDHUP), "poll gives %#x, not POLLRDHUP",
			 p.revents);
		if (p.revents & POLLRDHUP)
			FT_EQ(recv(a, &p, 1, 0), 0, "recv after SHUT_RD");
	} else if (strcmp(mode, "unix_oob") == 0) {
		expect_bytes(b, "ab", 0);
		expect_bytes(b, "u", MSG_OOB);
	} else if (strcmp(mode, "addr_deleted") == 0) {
		struct sockaddr_in sa;
		socklen_t al = sizeof(sa);
		FT_SYS(getsockname(a, (struct sockaddr *)&sa, &al));
		FT_EQ(ntohs(sa.sin_port), 7070, "bound port");
		FT_EQ(ntohl(sa.sin_addr.s_addr), 0x0a4d0001u, "bound address");
	} else if (strcmp(mode, "outside_listener") == 0) {
		connects_to_l();
	} else if (strcmp(mode, "outside_udp") == 0) {
		struct sockaddr_in sa;
		socklen_t al = sizeof(sa);
		FT_SYS(getsockname(a, (struct sockaddr *)&sa, &al));
		FT_EQ(sendto(a, "d", 1, 0, (struct sockaddr *)&sa, sizeof(sa)), 1, "sendto itself");
		expect_bytes(a, "d", 0);
	} else if (strcmp(mode, "outside_tcp") == 0) {
		FT_EQ(write(b, "o", 1), 1, "write (EINVAL if left in repair mode)");
		expect_bytes(a, "o", 0);
	}
}

int main(int argc, char **argv)
{
	if (argc > 1)
		mode = argv[1];
	ft_init();
	ft_cleanup_fn = cleanup;
	if (strncmp(mode, "outside_", 8) == 0)
		setup_outside();
	else {
		setup_tcp();
		setup_udp();
	}
	ft_ready();
	ft_wait_restored();
	check_tcp();
	check_other();
	cleanup();
	return ft_finish();
}
