/*
 * sock_tcp_close_wait: connections whose peer closed while the program
 * still holds its socket (CLOSE_WAIT), as a server has between a client's
 * close and its own. Three accepted connections whose clients closed:
 * one over IPv4 with 300 unread bytes before the EOF, one over IPv6 with
 * none, one on an IPv4-mapped IPv6 socket with 5 bytes. After restore each
 * is still in CLOSE_WAIT with its addresses, polls readable with
 * POLLRDHUP, reads its bytes and then EOF; the listeners accept anew.
 */
#include "ferry_test.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

struct conn {
	const char *what;
	int l, srv;
	size_t unread;
	struct sockaddr_storage local, peer;
	struct sockaddr_storage laddr;
	socklen_t laddr_len;
};

static int tcp_state(int fd)
{
	struct tcp_info ti;
	socklen_t tl = sizeof(ti);
	FT_SYS(getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &tl));
	return ti.tcpi_state;
}

static void listen_on(struct conn *c, int family, const char *addr)
{
	memset(&c->laddr, 0, sizeof(c->laddr));
	if (family == AF_INET) {
		struct sockaddr_in *a = (struct sockaddr_in *)&c->laddr;
		a->sin_family = AF_INET;
		inet_pton(AF_INET, addr, &a->sin_addr);
		c->laddr_len = sizeof(*a);
	} else {
		struct sockaddr_in6 *a = (struct sockaddr_in6 *)&c->laddr;
		a->sin6_family = AF_INET6;
		inet_pton(AF_INET6, addr, &a->sin6_addr);
		c->laddr_len = sizeof(*a);
	}
	c->l = (int)FT_SYS(socket(family, SOCK_STREAM, 0));
	int off = 0;
	if (family == AF_INET6)
		FT_SYS(setsockopt(c->l, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off)));
	FT_SYS(bind(c->l, (struct sockaddr *)&c->laddr, c->laddr_len));
	FT_SYS(listen(c->l, 8));
	FT_SYS(getsockname(c->l, (struct sockaddr *)&c->laddr, &c->laddr_len));
}

/* Connects a client of `family` to c's listener (at `to` of that family)
 * and returns the client; c->srv is the accepted end. */
static int connect_client(struct conn *c, int family, const char *to)
{
	struct sockaddr_storage ss = { 0 };
	socklen_t sl;
	in_port_t port = c->laddr.ss_family == AF_INET ? ((struct sockaddr_in *)&c->laddr)->sin_port
						      : ((struct sockaddr_in6 *)&c->laddr)->sin6_port;
	if (family == AF_INET) {
		struct sockaddr_in *a = (struct sockaddr_in *)&ss;
		a->sin_family = AF_INET;
		a->sin_port = port;
		inet_pton(AF_INET, to, &a->sin_addr);
		sl = sizeof(*a);
	} else {
		struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
		a->sin6_family = AF_INET6;
		a->sin6_port = port;
		inet_pton(AF_INET6, to, &a->sin6_addr);
		sl = sizeof(*a);
	}
	int cli = (int)FT_SYS(socket(family, SOCK_STREAM, 0));
	if (connect(cli, (struct sockaddr *)&ss, sl) != 0)
		ft_die("%s: connect: %s", c->what, strerror(errno));
	c->srv = (int)FT_SYS(accept(c->l, NULL, NULL));
	socklen_t al = sizeof(c->local);
	FT_SYS(getsockname(c->srv, (struct sockaddr *)&c->local, &al));
	al = sizeof(c->peer);
	FT_SYS(getpeername(c->srv, (struct sockaddr *)&c->peer, &al));
	return cli;
}

/* The client sends `unread` bytes and closes: the accepted end goes to
 * CLOSE_WAIT with those bytes queued before the EOF. */
static void close_client(struct conn *c, int cli, size_t unread)
{
	char buf[512];
	memset(buf, 'u', sizeof(buf));
	c->unread = unread;
	if (unread)
		FT_SYS(write(cli, buf, unread));
	close(cli);
	double deadline = ft_mono() + 5;
	while (tcp_state(c->srv) != TCP_CLOSE_WAIT)
		if (ft_mono() > deadline)
			ft_die("%s: no CLOSE_WAIT after the client's close", c->what);
		else
			ft_sleep_ms(1);
}

static void check(struct conn *c)
{
	FT_EQ(tcp_state(c->srv), TCP_CLOSE_WAIT, "TCP state after restore");
	struct sockaddr_storage a;
	socklen_t al = sizeof(a);
	FT_SYS(getsockname(c->srv, (struct sockaddr *)&a, &al));
	FT_CHECK(!memcmp(&a, &c->local, al), "%s: local address changed", c->what);
	al = sizeof(a);
	FT_CHECK(getpeername(c->srv, (struct sockaddr *)&a, &al) == 0, "%s: getpeername: %s", c->what,
		 strerror(errno));
	FT_CHECK(!memcmp(&a, &c->peer, al), "%s: peer address changed", c->what);
	struct pollfd p = { .fd = c->srv, .events = POLLIN | POLLRDHUP };
	FT_CHECK(poll(&p, 1, 0) == 1 && (p.revents & POLLIN) && (p.revents & POLLRDHUP),
		 "%s: poll gives %#x, not POLLIN|POLLRDHUP", c->what, p.revents);
	char buf[1024];
	size_t got = 0;
	for (;;) {
		ssize_t r = recv(c->srv, buf, sizeof(buf), MSG_DONTWAIT);
		if (r == 0)
			break;
		if (r < 0) {
			ft_fail("%s: recv after %zu bytes: %s (EOF expected)", c->what, got, strerror(errno));
			return;
		}
		for (ssize_t i = 0; i < r; i++)
			FT_CHECK(buf[i] == 'u', "%s: byte %zu differs", c->what, got + (size_t)i);
		got += (size_t)r;
	}
	FT_EQ(got, c->unread, "bytes read before the EOF");
}

static void accepts_again(struct conn *c, int family, const char *to)
{
	int l = c->l;
	int cli = connect_client(c, family, to);
	FT_SYS(write(cli, "x", 1));
	char b;
	FT_CHECK(read(c->srv, &b, 1) == 1 && b == 'x', "%s: a new connection carries no data", c->what);
	close(cli);
	close(c->srv);
	c->l = l;
}

int main(void)
{
	ft_init();
	struct conn v4 = { .what = "IPv4, 300 unread bytes" };
	struct conn v6 = { .what = "IPv6, no unread byte" };
	struct conn mapped = { .what = "IPv4-mapped, 5 unread bytes" };
	listen_on(&v4, AF_INET, "127.0.0.1");
	listen_on(&v6, AF_INET6, "::1");
	listen_on(&mapped, AF_INET6, "::");
	close_client(&v4, connect_client(&v4, AF_INET, "127.0.0.1"), 300);
	close_client(&v6, connect_client(&v6, AF_INET6, "::1"), 0);
	close_client(&mapped, connect_client(&mapped, AF_INET, "127.0.0.1"), 5);
	ft_ready();
	ft_wait_restored();
	check(&v4);
	check(&v6);
	check(&mapped);
	accepts_again(&v4, AF_INET, "127.0.0.1");
	accepts_again(&v6, AF_INET6, "::1");
	accepts_again(&mapped, AF_INET, "127.0.0.1");
	return ft_finish();
}
