/*
 * sock_tcp_listen: a listening TCP socket on 127.0.0.1 (port chosen with
 * port 0) with SO_REUSEADDR, SO_REUSEPORT, TCP_NODELAY, SO_KEEPALIVE, a
 * SO_RCVBUF and O_NONBLOCK set. After restore: same local address/port,
 * SO_ACCEPTCONN, every option reads back the same, accept says EAGAIN,
 * a new connect() succeeds, accept returns it (peer = client) and data
 * flows both ways; the accepted socket inherited TCP_NODELAY.
 */
#include "ferry_test.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

static int getopt_int(int fd, int lvl, int opt)
{
	int v = -1;
	socklen_t l = sizeof(v);
	if (getsockopt(fd, lvl, opt, &v, &l) != 0)
		return -12345;
	return v;
}

int main(void)
{
	ft_init();
	int one = 1;
	int l = (int)FT_SYS(socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0));
	FT_SYS(setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)));
	FT_SYS(setsockopt(l, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)));
	FT_SYS(setsockopt(l, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)));
	FT_SYS(setsockopt(l, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one)));
	int rcv = 96 * 1024;
	FT_SYS(setsockopt(l, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof(rcv)));
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	FT_SYS(bind(l, (struct sockaddr *)&a, sizeof(a)));
	FT_SYS(listen(l, 16));
	socklen_t al = sizeof(a);
	FT_SYS(getsockname(l, (struct sockaddr *)&a, &al));
	static const struct {
		int lvl, opt;
		const char *n;
	} opts[] = { { SOL_SOCKET, SO_REUSEADDR, "SO_REUSEADDR" }, { SOL_SOCKET, SO_REUSEPORT, "SO_REUSEPORT" },
		     { IPPROTO_TCP, TCP_NODELAY, "TCP_NODELAY" },   { SOL_SOCKET, SO_KEEPALIVE, "SO_KEEPALIVE" },
		     { SOL_SOCKET, SO_RCVBUF, "SO_RCVBUF" },       { SOL_SOCKET, SO_ACCEPTCONN, "SO_ACCEPTCONN" },
		     { SOL_SOCKET, SO_TYPE, "SO_TYPE" },           { SOL_SOCKET, SO_DOMAIN, "SO_DOMAIN" } };
	int nopt = sizeof(opts) / sizeof(opts[0]);
	int vals[16];
	for (int i = 0; i < nopt; i++)
		vals[i] = getopt_int(l, opts[i].lvl, opts[i].opt);
	int fl = fcntl(l, F_GETFL);

	ft_ready();
	ft_wait_restored();

	struct sockaddr_in b;
	socklen_t bl = sizeof(b);
	FT_SYS(getsockname(l, (struct sockaddr *)&b, &bl));
	FT_CHECK(b.sin_addr.s_addr == a.sin_addr.s_addr && b.sin_port == a.sin_port, "local address %s:%d -> :%d",
		 inet_ntoa(b.sin_addr), ntohs(a.sin_port), ntohs(b.sin_port));
	for (int i = 0; i < nopt; i++)
		FT_EQ(getopt_int(l, opts[i].lvl, opts[i].opt), vals[i], opts[i].n);
	FT_EQ(getopt_int(l, SOL_SOCKET, SO_ACCEPTCONN), 1, "SO_ACCEPTCONN");
	FT_EQ(fcntl(l, F_GETFL), fl, "F_GETFL");
	FT_CHECK(accept(l, NULL, NULL) < 0 && errno == EAGAIN, "accept without a client: %s", strerror(errno));
	int c = (int)FT_SYS(socket(AF_INET, SOCK_STREAM, 0));
	if (connect(c, (struct sockaddr *)&a, sizeof(a)) != 0) {
		ft_fail("connect after restore: %s", strerror(errno));
		return ft_finish();
	}
	struct sockaddr_in cl;
	socklen_t cll = sizeof(cl);
	getsockname(c, (struct sockaddr *)&cl, &cll);
	struct pollfd pfd = { .fd = l, .events = POLLIN };
	FT_EQ(poll(&pfd, 1, 3000), 1, "poll on listener");
	struct sockaddr_in peer;
	socklen_t pl = sizeof(peer);
	int s = accept(l, (struct sockaddr *)&peer, &pl);
	FT_CHECK(s >= 0, "accept: %s", strerror(errno));
	if (s >= 0) {
		FT_CHECK(peer.sin_port == cl.sin_port, "peer port %d, client port %d", ntohs(peer.sin_port),
			 ntohs(cl.sin_port));
		FT_EQ(getopt_int(s, IPPROTO_TCP, TCP_NODELAY), 1, "accepted socket TCP_NODELAY");
		fcntl(s, F_SETFL, 0);
		FT_EQ(send(c, "hello", 5, 0), 5, "client send");
		char buf[8] = { 0 };
		FT_EQ(recv(s, buf, 5, MSG_WAITALL), 5, "server recv");
		FT_CHECK(memcmp(buf, "hello", 5) == 0, "server got '%s'", buf);
		FT_EQ(send(s, "world", 5, 0), 5, "server send");
		FT_EQ(recv(c, buf, 5, MSG_WAITALL), 5, "client recv");
	}
	return ft_finish();
}
