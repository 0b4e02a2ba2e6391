/*
 * sock_tcp_established_pair: established TCP connections with both ends in
 * this process, over IPv4 and IPv6 loopback, with data in flight both ways
 * at the checkpoint: each end wrote a patterned stream until its send
 * queue was full, and nobody read, so each side's receive queue holds
 * unread data and each send queue holds unacknowledged and unsent data.
 * The server ends carry options set by the application (TCP_NODELAY,
 * keepalive and its parameters, TCP_USER_TIMEOUT, TCP_NOTSENT_LOWAT,
 * congestion control "reno", IP_TOS / IPV6_TCLASS, SO_LINGER, SO_MARK,
 * SO_PRIORITY, O_NONBLOCK).
 * The IPv6 client end has a receive buffer the application fixed
 * (SO_RCVBUF: SO_BUF_LOCK 2), the other ends auto-tuned ones.
 * After restore: same addresses and peers, every option reads back the
 * same, SO_BUF_LOCK too (0 where buffers stay auto-tuned), and both streams
 * arrive complete, in order and unchanged, followed by new data written
 * after the restore; then each end closes and the other sees EOF.
 */
#include "ferry_test.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#ifndef SO_BUF_LOCK
#define SO_BUF_LOCK 72
#endif
#define AFTER 65536

struct conn {
	int fam;
	int srv, cli;
	size_t srv_sent, cli_sent; /* bytes written before the checkpoint */
};

static unsigned char pat(uint64_t seed, size_t i)
{
	return (unsigned char)(ft_pat(seed, i / 8) >> (8 * (i % 8)));
}

static int opt_int(int fd, int lvl, int opt)
{
	int v = -1;
	socklen_t l = sizeof(v);
	if (getsockopt(fd, lvl, opt, &v, &l) != 0)
		return -12345;
	return v;
}

/* Writes the pattern from `*off` until the socket takes no more. */
static void fill(int fd, uint64_t seed, size_t *off, size_t limit)
{
	unsigned char buf[16384];
	while (*off < limit) {
		size_t n = sizeof(buf);
		if (n > limit - *off)
			n = limit - *off;
		for (size_t i = 0; i < n; i++)
			buf[i] = pat(seed, *off + i);
		ssize_t w = send(fd, buf, n, MSG_DONTWAIT);
		if (w <= 0)
			break;
		*off += (size_t)w;
	}
}

/* Reads `total` bytes of the pattern, writing our own remaining bytes
 * meanwhile so neither side blocks. Returns 0 if all matched. */
static int drain(int rfd, uint64_t seed, size_t total, const char *what)
{
	unsigned char buf[16384];
	size_t got = 0;
	double end = ft_mono() + 20;
	while (got < total && ft_mono() < end) {
		struct pollfd p = { .fd = rfd, .events = POLLIN };
		if (poll(&p, 1, 200) <= 0)
			continue;
		ssize_t r = recv(rfd, buf, sizeof(buf), MSG_DONTWAIT);
		if (r == 0) {
			ft_fail("%s: EOF after %zu of %zu bytes", what, got, total);
			return -1;
		}
		if (r < 0) {
			if (errno == EAGAIN)
				continue;
			ft_fail("%s: recv after %zu bytes: %s", what, got, strerror(errno));
			return -1;
		}
		for (ssize_t i = 0; i < r; i++)
			if (buf[i] != pat(seed, got + (size_t)i)) {
				ft_fail("%s: byte %zu differs", what, got + (size_t)i);
				return -1;
			}
		got += (size_t)r;
	}
	if (got != total) {
		ft_fail("%s: %zu of %zu bytes arrived", what, got, total);
		return -1;
	}
	return 0;
}

static void setup(struct conn *c, int fam)
{
	c->fam = fam;
	int one = 1;
	int l = (int)FT_SYS(socket(fam, SOCK_STREAM, 0));
	struct sockaddr_storage ss = { 0 };
	socklen_t sl;
	if (fam == AF_INET) {
		struct sockaddr_in *a = (struct sockaddr_in *)&ss;
		a->sin_family = AF_INET;
		a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		sl = sizeof(*a);
	} else {
		struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
		a->sin6_family = AF_INET6;
		a->sin6_addr = in6addr_loopback;
		sl = sizeof(*a);
	}
	FT_SYS(bind(l, (struct sockaddr *)&ss, sl));
	FT_SYS(listen(l, 4));
	FT_SYS(getsockname(l, (struct sockaddr *)&ss, &sl));
	c->cli = (int)FT_SYS(socket(fam, SOCK_STREAM, 0));
	if (fam == AF_INET6) {
		int rcv = 200000;
		FT_SYS(setsockopt(c->cli, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof(rcv)));
	}
	FT_SYS(connect(c->cli, (struct sockaddr *)&ss, sl));
	c->srv = (int)FT_SYS(accept(l, NULL, NULL));
	close(l);

	int s = c->srv;
	FT_SYS(setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)));
	FT_SYS(setsockopt(s, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one)));
	int idle = 321, intvl = 17, cnt = 4, uto = 45000, lowat = 200000, mark = 7, prio = 3;
	FT_SYS(setsockopt(s, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle)));
	FT_SYS(setsockopt(s, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl)));
	FT_SYS(setsockopt(s, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt)));
	FT_SYS(setsockopt(s, IPPROTO_TCP, TCP_USER_TIMEOUT, &uto, sizeof(uto)));
	FT_SYS(setsockopt(s, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &lowat, sizeof(lowat)));
	FT_SYS(setsockopt(s, IPPROTO_TCP, TCP_CONGESTION, "reno", 4));
	FT_SYS(setsockopt(s, SOL_SOCKET, SO_MARK, &mark, sizeof(mark)));
	int tos = 0x28;
	if (fam == AF_INET)
		FT_SYS(setsockopt(s, IPPROTO_IP, IP_TOS, &tos, sizeof(tos)));
	else
		FT_SYS(setsockopt(s, IPPROTO_IPV6, IPV6_TCLASS, &tos, sizeof(tos)));
	FT_SYS(setsockopt(s, SOL_SOCKET, SO_PRIORITY, &prio, sizeof(prio)));
	struct linger lg = { .l_onoff = 1, .l_linger = 5 };
	FT_SYS(setsockopt(s, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)));
	FT_SYS(fcntl(s, F_SETFL, O_NONBLOCK));

	/* Each side writes until its send queue and the peer's receive queue
	 * are full; nobody reads yet. */
	c->srv_sent = c->cli_sent = 0;
	for (int round = 0; round < 50; round++) {
		size_t a = c->srv_sent, b = c->cli_sent;
		fill(c->srv, 1, &c->srv_sent, 64 << 20);
		fill(c->cli, 2, &c->cli_sent, 64 << 20);
		if (a == c->srv_sent && b == c->cli_sent && round > 3)
			break;
		ft_sleep_ms(10);
	}
}

struct snapshot {
	int ints[12];
	char cc[16];
	struct linger lg;
	struct sockaddr_storage local, peer;
};

static const struct {
	int lvl, opt;
	const char *n;
} int_opts[] = {
	{ IPPROTO_TCP, TCP_NODELAY, "TCP_NODELAY" },	     { SOL_SOCKET, SO_KEEPALIVE, "SO_KEEPALIVE" },
	{ IPPROTO_TCP, TCP_KEEPIDLE, "TCP_KEEPIDLE" },	     { IPPROTO_TCP, TCP_KEEPINTVL, "TCP_KEEPINTVL" },
	{ IPPROTO_TCP, TCP_KEEPCNT, "TCP_KEEPCNT" },	     { IPPROTO_TCP, TCP_USER_TIMEOUT, "TCP_USER_TIMEOUT" },
	{ IPPROTO_TCP, TCP_NOTSENT_LOWAT, "TCP_NOTSENT_LOWAT" }, { SOL_SOCKET, SO_MARK, "SO_MARK" },
	{ SOL_SOCKET, SO_PRIORITY, "SO_PRIORITY" },	     { SOL_SOCKET, SO_BUF_LOCK, "SO_BUF_LOCK" },
	{ SOL_SOCKET, SO_REUSEADDR, "SO_REUSEADDR" },
};
#define NINT (int)(sizeof(int_opts) / sizeof(int_opts[0]))

static void snap(int fd, int fam, struct snapshot *s)
{
	memset(s, 0, sizeof(*s));
	for (int i = 0; i < NINT; i++)
		s->ints[i] = opt_int(fd, int_opts[i].lvl, int_opts[i].opt);
	s->ints[NINT] = fam == AF_INET ? opt_int(fd, IPPROTO_IP, IP_TOS) : opt_int(fd, IPPROTO_IPV6, IPV6_TCLASS);
	socklen_t l = sizeof(s->cc);
	getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, s->cc, &l);
	l = sizeof(s->lg);
	getsockopt(fd, SOL_SOCKET, SO_LINGER, &s->lg, &l);
	l = sizeof(s->local);
	getsockname(fd, (struct sockaddr *)&s->local, &l);
	l = sizeof(s->peer);
	getpeername(fd, (struct sockaddr *)&s->peer, &l);
}

static void compare(const char *who, const struct snapshot *a, const struct snapshot *b)
{
	for (int i = 0; i < NINT; i++)
		if (a->ints[i] != b->ints[i])
			ft_fail("%s: %s %d -> %d", who, int_opts[i].n, a->ints[i], b->ints[i]);
	if (a->ints[NINT] != b->ints[NINT])
		ft_fail("%s: TOS/TCLASS %d -> %d", who, a->ints[NINT], b->ints[NINT]);
	if (strcmp(a->cc, b->cc) != 0)
		ft_fail("%s: TCP_CONGESTION %s -> %s", who, a->cc, b->cc);
	if (a->lg.l_onoff != b->lg.l_onoff || a->lg.l_linger != b->lg.l_linger)
		ft_fail("%s: SO_LINGER %d/%d -> %d/%d", who, a->lg.l_onoff, a->lg.l_linger, b->lg.l_onoff, b->lg.l_linger);
	if (memcmp(&a->local, &b->local, sizeof(a->local)) != 0)
		ft_fail("%s: local address changed", who);
	if (memcmp(&a->peer, &b->peer, sizeof(a->peer)) != 0)
		ft_fail("%s: peer address changed", who);
}

int main(void)
{
	ft_init();
	struct conn c[2];
	setup(&c[0], AF_INET);
	setup(&c[1], AF_INET6);
	struct snapshot before[2][2];
	for (int i = 0; i < 2; i++) {
		snap(c[i].srv, c[i].fam, &before[i][0]);
		snap(c[i].cli, c[i].fam, &before[i][1]);
		ft_log("# %s: server wrote %zu bytes, client %zu", c[i].fam == AF_INET ? "IPv4" : "IPv6", c[i].srv_sent,
		       c[i].cli_sent);
		if (c[i].srv_sent < 100000 || c[i].cli_sent < 100000)
			ft_fail("setup: too little data in flight");
	}
	FT_EQ(opt_int(c[1].cli, SOL_SOCKET, SO_BUF_LOCK), 2, "IPv6 client SO_BUF_LOCK before");
	FT_EQ(opt_int(c[0].cli, SOL_SOCKET, SO_BUF_LOCK), 0, "IPv4 client SO_BUF_LOCK before");
	int srv_fl = fcntl(c[0].srv, F_GETFL);

	ft_ready();
	ft_wait_restored();

	FT_EQ(fcntl(c[0].srv, F_GETFL), srv_fl, "server F_GETFL");
	for (int i = 0; i < 2; i++) {
		const char *fam = c[i].fam == AF_INET ? "IPv4" : "IPv6";
		struct snapshot after[2];
		snap(c[i].srv, c[i].fam, &after[0]);
		snap(c[i].cli, c[i].fam, &after[1]);
		char who[32];
		snprintf(who, sizeof(who), "%s server", fam);
		compare(who, &before[i][0], &after[0]);
		snprintf(who, sizeof(who), "%s client", fam);
		compare(who, &before[i][1], &after[1]);
		FT_EQ(opt_int(c[i].srv, SOL_SOCKET, SO_ERROR), 0, "server SO_ERROR");
		FT_EQ(opt_int(c[i].cli, SOL_SOCKET, SO_ERROR), 0, "client SO_ERROR");
	}
	/* Each side writes AFTER more bytes, then reads the other's whole
	 * stream; the writes are small enough to fit once the reader drains. */
	for (int i = 0; i < 2; i++) {
		fcntl(c[i].srv, F_SETFL, 0);
		size_t s_total = c[i].srv_sent + AFTER, c_total = c[i].cli_sent + AFTER;
		pid_t kid = fork();
		if (kid == 0) {
			/* The child writes both tails while the parent reads. */
			fill(c[i].srv, 1, &c[i].srv_sent, s_total);
			fill(c[i].cli, 2, &c[i].cli_sent, c_total);
			for (int k = 0; k < 2000 && (c[i].srv_sent < s_total || c[i].cli_sent < c_total); k++) {
				ft_sleep_ms(5);
				fill(c[i].srv, 1, &c[i].srv_sent, s_total);
				fill(c[i].cli, 2, &c[i].cli_sent, c_total);
			}
			_exit(c[i].srv_sent == s_total && c[i].cli_sent == c_total ? 0 : 1);
		}
		const char *fam = c[i].fam == AF_INET ? "IPv4" : "IPv6";
		char what[48];
		snprintf(what, sizeof(what), "%s server->client", fam);
		drain(c[i].cli, 1, s_total, what);
		snprintf(what, sizeof(what), "%s client->server", fam);
		drain(c[i].srv, 2, c_total, what);
		int st = 0;
		waitpid(kid, &st, 0);
		FT_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: writer child status %#x", fam, st);
		shutdown(c[i].srv, SHUT_WR);
		char b;
		FT_EQ(recv(c[i].cli, &b, 1, 0), 0, "client sees EOF");
	}
	return ft_finish();
}
