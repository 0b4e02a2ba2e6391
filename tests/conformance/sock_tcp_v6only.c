/*
 * sock_tcp_v6only: the other sides of dual-stack sockets. An IPv6 client
 * (as a JVM's or Node's HTTP client makes it) connected to the
 * IPv4-mapped address ::ffff:127.0.0.1 of an IPv4 listener, with unread
 * data queued both ways; a listener on [::] with IPV6_V6ONLY on that
 * shares its port with an IPv4 listener on 0.0.0.0 (possible only while
 * the IPv6 one stays IPv6-only), and a dual-stack listener on [::] next
 * to them. After restore: the client keeps its IPv4-mapped addresses, the
 * bytes arrive in order and new data goes both ways; IPV6_V6ONLY reads
 * 1 and 0 as before; an IPv4 client of the shared port reaches the IPv4
 * listener and an IPv6 one (::1) the IPv6 listener; the dual-stack one
 * still takes IPv4.
 */
#include "ferry_test.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#define UNREAD 3000

static int v6_listener(int v6only, in_port_t port)
{
	int one = 1;
	int l = (int)FT_SYS(socket(AF_INET6, SOCK_STREAM, 0));
	FT_SYS(setsockopt(l, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof(v6only)));
	FT_SYS(setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)));
	struct sockaddr_in6 a = { .sin6_family = AF_INET6, .sin6_addr = in6addr_any, .sin6_port = port };
	FT_SYS(bind(l, (struct sockaddr *)&a, sizeof(a)));
	FT_SYS(listen(l, 8));
	return l;
}

static int v4_listener(in_port_t port)
{
	int one = 1;
	int l = (int)FT_SYS(socket(AF_INET, SOCK_STREAM, 0));
	FT_SYS(setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)));
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = port };
	FT_SYS(bind(l, (struct sockaddr *)&a, sizeof(a)));
	FT_SYS(listen(l, 8));
	return l;
}

static in_port_t port_of(int fd)
{
	struct sockaddr_storage a;
	socklen_t al = sizeof(a);
	FT_SYS(getsockname(fd, (struct sockaddr *)&a, &al));
	return a.ss_family == AF_INET ? ((struct sockaddr_in *)&a)->sin_port
				      : ((struct sockaddr_in6 *)&a)->sin6_port;
}

static int accept_one(int l, const char *what)
{
	struct pollfd p = { .fd = l, .events = POLLIN };
	if (poll(&p, 1, 3000) != 1)
		ft_die("%s: no connection to accept", what);
	int s = accept(l, NULL, NULL);
	if (s < 0)
		ft_die("%s: accept: %s", what, strerror(errno));
	return s;
}

/* A client of `family` to `addr`:`port` (an IPv6 text address for
 * AF_INET6), or -errno when connect fails. */
static int connect_to(int family, const char *addr, in_port_t port)
{
	int c = (int)FT_SYS(socket(family, SOCK_STREAM, 0));
	int r;
	if (family == AF_INET6) {
		struct sockaddr_in6 to = { .sin6_family = AF_INET6, .sin6_port = port };
		inet_pton(AF_INET6, addr, &to.sin6_addr);
		r = connect(c, (struct sockaddr *)&to, sizeof(to));
	} else {
		struct sockaddr_in to = { .sin_family = AF_INET, .sin_port = port };
		inet_pton(AF_INET, addr, &to.sin_addr);
		r = connect(c, (struct sockaddr *)&to, sizeof(to));
	}
	if (r != 0) {
		int e = errno;
		close(c);
		return -e;
	}
	return c;
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

static int v6only_of(int fd)
{
	int v = -1;
	socklen_t vl = sizeof(v);
	FT_SYS(getsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v, &vl));
	return v;
}

/* One byte from a new client (family, addr) on `port` must arrive at
 * listener `l`. */
static void reaches(int l, int family, const char *addr, in_port_t port, const char *what)
{
	int c = connect_to(family, addr, port);
	if (c < 0) {
		FT_CHECK(0, "%s: connect to %s port %d: %s", what, addr, ntohs(port), strerror(-c));
		return;
	}
	struct pollfd p = { .fd = l, .events = POLLIN };
	if (poll(&p, 1, 3000) != 1) {
		FT_CHECK(0, "%s: the connection did not arrive at its listener", what);
		close(c);
		return;
	}
	int s = (int)FT_SYS(accept(l, NULL, NULL));
	char b = 0;
	FT_SYS(write(c, "y", 1));
	FT_CHECK(read_all(s, &b, 1) == 0 && b == 'y', "%s: a byte from the new client", what);
	close(s);
	close(c);
}

int main(void)
{
	ft_init();
	/* An IPv6 client of an IPv4 listener, through a v4-mapped address. */
	int l4 = v4_listener(0);
	in_port_t p4 = port_of(l4);
	int cli = connect_to(AF_INET6, "::ffff:127.0.0.1", p4);
	if (cli < 0)
		ft_die("connect to ::ffff:127.0.0.1: %s", strerror(-cli));
	int srv = accept_one(l4, "IPv4 listener");
	struct sockaddr_in6 cli_local, cli_peer;
	socklen_t sl = sizeof(cli_local);
	FT_SYS(getsockname(cli, (struct sockaddr *)&cli_local, &sl));
	sl = sizeof(cli_peer);
	FT_SYS(getpeername(cli, (struct sockaddr *)&cli_peer, &sl));
	if (!IN6_IS_ADDR_V4MAPPED(&cli_local.sin6_addr) || !IN6_IS_ADDR_V4MAPPED(&cli_peer.sin6_addr))
		ft_die("the IPv6 client's addresses are not IPv4-mapped");
	char buf[UNREAD];
	memset(buf, 'q', sizeof(buf));
	FT_SYS(write(cli, buf, sizeof(buf)));
	memset(buf, 'r', sizeof(buf));
	FT_SYS(write(srv, buf, sizeof(buf)));

	/* [::]:P IPv6-only beside 0.0.0.0:P, and a dual-stack [::]. */
	int shared4 = v4_listener(0);
	in_port_t ps = port_of(shared4);
	int only6 = v6_listener(1, ps);
	int dual = v6_listener(0, 0);
	in_port_t pd = port_of(dual);

	ft_ready();
	ft_wait_restored();

	struct sockaddr_in6 a;
	sl = sizeof(a);
	FT_SYS(getsockname(cli, (struct sockaddr *)&a, &sl));
	FT_CHECK(sl == sizeof(a) && !memcmp(&a, &cli_local, sizeof(a)), "the IPv6 client's address changed");
	sl = sizeof(a);
	FT_SYS(getpeername(cli, (struct sockaddr *)&a, &sl));
	FT_CHECK(sl == sizeof(a) && !memcmp(&a, &cli_peer, sizeof(a)), "the IPv6 client's peer changed");
	FT_CHECK(read_all(srv, buf, sizeof(buf)) == 0 && buf[0] == 'q' && buf[UNREAD - 1] == 'q',
		 "the IPv4 server did not get the unread bytes");
	FT_CHECK(read_all(cli, buf, sizeof(buf)) == 0 && buf[0] == 'r' && buf[UNREAD - 1] == 'r',
		 "the IPv6 client did not get the unread bytes");
	FT_SYS(write(cli, "later", 5));
	FT_CHECK(read_all(srv, buf, 5) == 0 && !memcmp(buf, "later", 5), "new data to the server");
	FT_SYS(write(srv, "reply", 5));
	FT_CHECK(read_all(cli, buf, 5) == 0 && !memcmp(buf, "reply", 5), "new data to the client");

	FT_EQ(v6only_of(only6), 1, "IPV6_V6ONLY of the IPv6-only listener");
	FT_EQ(v6only_of(dual), 0, "IPV6_V6ONLY of the dual-stack listener");
	FT_EQ(v6only_of(cli), 0, "IPV6_V6ONLY of the IPv6 client");
	FT_CHECK(port_of(only6) == ps && port_of(shared4) == ps && port_of(dual) == pd,
		 "a listener's port changed");
	reaches(shared4, AF_INET, "127.0.0.1", ps, "IPv4 client of the shared port");
	reaches(only6, AF_INET6, "::1", ps, "IPv6 client of the shared port");
	reaches(dual, AF_INET, "127.0.0.1", pd, "IPv4 client of the dual-stack listener");
	reaches(dual, AF_INET6, "::1", pd, "IPv6 client of the dual-stack listener");
	return ft_finish();
}
