/*
 * sock_tcp_v4mapped: IPv6 sockets that carry IPv4 traffic, as the JVM,
 * Node and Go make them by default: a listener bound to the IPv4-mapped
 * address ::ffff:127.0.0.1 and a dual-stack listener on [::] (IPV6_V6ONLY
 * off), each reached over IPv4, each with one accepted connection (an
 * IPv6 socket whose addresses are IPv4-mapped) holding unread data both
 * ways at the checkpoint. After restore: both listeners keep their
 * address, family and IPV6_V6ONLY; each connection keeps its addresses,
 * delivers the unread bytes in order and carries new data both ways; a new
 * IPv4 client is accepted by each listener.
 */
#include "ferry_test.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#define UNREAD 1000

struct pair {
	const char *what;
	int l, srv, cli;
	struct sockaddr_in6 laddr;
	struct sockaddr_in6 srv_local, srv_peer;
};

static int listener(const struct in6_addr *addr, struct sockaddr_in6 *out)
{
	int off = 0;
	int l = (int)FT_SYS(socket(AF_INET6, SOCK_STREAM, 0));
	FT_SYS(setsockopt(l, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off)));
	struct sockaddr_in6 a = { .sin6_family = AF_INET6, .sin6_addr = *addr };
	FT_SYS(bind(l, (struct sockaddr *)&a, sizeof(a)));
	FT_SYS(listen(l, 8));
	socklen_t al = sizeof(*out);
	FT_SYS(getsockname(l, (struct sockaddr *)out, &al));
	return l;
}

/* An IPv4 client of listener `l` (port `port`), accepted. */
static int connect_v4(int l, in_port_t port, int *accepted)
{
	int c = (int)FT_SYS(socket(AF_INET, SOCK_STREAM, 0));
	struct sockaddr_in to = { .sin_family = AF_INET, .sin_port = port,
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	if (connect(c, (struct sockaddr *)&to, sizeof(to)) != 0)
		ft_die("connect to 127.0.0.1:%d: %s", ntohs(port), strerror(errno));
	struct pollfd p = { .fd = l, .events = POLLIN };
	if (poll(&p, 1, 3000) != 1)
		ft_die("no connection to accept on port %d", ntohs(port));
	*accepted = accept(l, NULL, NULL);
	if (*accepted < 0)
		ft_die("accept: %s", strerror(errno));
	return c;
}

static void setup(struct pair *p, const char *what, const struct in6_addr *addr)
{
	p->what = what;
	p->l = listener(addr, &p->laddr);
	p->cli = connect_v4(p->l, p->laddr.sin6_port, &p->srv);
	socklen_t sl = sizeof(p->srv_local);
	FT_SYS(getsockname(p->srv, (struct sockaddr *)&p->srv_local, &sl));
	sl = sizeof(p->srv_peer);
	FT_SYS(getpeername(p->srv, (struct sockaddr *)&p->srv_peer, &sl));
	if (!IN6_IS_ADDR_V4MAPPED(&p->srv_local.sin6_addr))
		ft_die("%s: the accepted socket's address is not IPv4-mapped", what);
	char buf[UNREAD];
	memset(buf, 's', sizeof(buf));
	FT_SYS(write(p->srv, buf, sizeof(buf)));
	memset(buf, 'c', sizeof(buf));
	FT_SYS(write(p->cli, buf, sizeof(buf)));
}

static int read_all(int fd, char *buf, size_t n)
{
	size_t got = 0;
	while (got < n) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		if (poll(&p, 1, 5000) != 1)
			return -1;
		ssize_t r = read(fd, buf + got, n - got);
		if (r <= 0)
			return -1;
		got += (size_t)r;
	}
	return 0;
}

static void check(struct pair *p)
{
	struct sockaddr_in6 a;
	socklen_t al = sizeof(a);
	FT_SYS(getsockname(p->l, (struct sockaddr *)&a, &al));
	FT_CHECK(al == sizeof(a) && a.sin6_family == AF_INET6 &&
			 !memcmp(&a.sin6_addr, &p->laddr.sin6_addr, sizeof(a.sin6_addr)) &&
			 a.sin6_port == p->laddr.sin6_port,
		 "%s: listener address changed", p->what);
	int v6only = -1;
	socklen_t vl = sizeof(v6only);
	FT_SYS(getsockopt(p->l, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, &vl));
	FT_EQ(v6only, 0, "IPV6_V6ONLY of the listener");
	al = sizeof(a);
	FT_SYS(getsockname(p->srv, (struct sockaddr *)&a, &al));
	FT_CHECK(!memcmp(&a, &p->srv_local, sizeof(a)), "%s: accepted socket's address changed", p->what);
	al = sizeof(a);
	FT_SYS(getpeername(p->srv, (struct sockaddr *)&a, &al));
	FT_CHECK(!memcmp(&a, &p->srv_peer, sizeof(a)), "%s: accepted socket's peer changed", p->what);
	char buf[UNREAD];
	FT_CHECK(read_all(p->cli, buf, sizeof(buf)) == 0 && buf[0] == 's' && buf[UNREAD - 1] == 's',
		 "%s: the client did not get the unread bytes", p->what);
	FT_CHECK(read_all(p->srv, buf, sizeof(buf)) == 0 && buf[0] == 'c' && buf[UNREAD - 1] == 'c',
		 "%s: the server did not get the unread bytes", p->what);
	FT_SYS(write(p->srv, "after", 5));
	FT_CHECK(read_all(p->cli, buf, 5) == 0 && !memcmp(buf, "after", 5), "%s: new data to the client",
		 p->what);
	FT_SYS(write(p->cli, "again", 5));
	FT_CHECK(read_all(p->srv, buf, 5) == 0 && !memcmp(buf, "again", 5), "%s: new data to the server",
		 p->what);
	int s2;
	int c2 = connect_v4(p->l, p->laddr.sin6_port, &s2);
	FT_SYS(write(c2, "x", 1));
	FT_CHECK(read_all(s2, buf, 1) == 0 && buf[0] == 'x', "%s: a new IPv4 client", p->what);
	close(c2);
	close(s2);
}

int main(void)
{
	ft_init();
	struct in6_addr mapped;
	inet_pton(AF_INET6, "::ffff:127.0.0.1", &mapped);
	struct pair m, any;
	setup(&m, "IPv4-mapped listener", &mapped);
	setup(&any, "dual-stack listener", &in6addr_any);

	ft_ready();
	ft_wait_restored();

	check(&m);
	check(&any);
	return ft_finish();
}
