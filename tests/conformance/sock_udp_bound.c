/*
 * sock_udp_bound: UDP socket S bound to 127.0.0.1:0 with SO_RCVBUF,
 * SO_SNDBUF, SO_BROADCAST, SO_PRIORITY, IP_TOS, IP_TTL, SO_RCVTIMEO set.
 * After restore: same address (getsockname) and all options unchanged; a
 * datagram sent to it from a new socket is received by recvfrom with the
 * sender's address as source, and S can sendto the sender.
 */
#include "ferry_test.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>

static int geti(int fd, int lvl, int opt)
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
	int s = (int)FT_SYS(socket(AF_INET, SOCK_DGRAM, 0));
	int v = 65536;
	FT_SYS(setsockopt(s, SOL_SOCKET, SO_RCVBUF, &v, sizeof(v)));
	v = 32768;
	FT_SYS(setsockopt(s, SOL_SOCKET, SO_SNDBUF, &v, sizeof(v)));
	v = 1;
	FT_SYS(setsockopt(s, SOL_SOCKET, SO_BROADCAST, &v, sizeof(v)));
	v = 3;
	FT_SYS(setsockopt(s, SOL_SOCKET, SO_PRIORITY, &v, sizeof(v)));
	v = 0x10;
	FT_SYS(setsockopt(s, IPPROTO_IP, IP_TOS, &v, sizeof(v)));
	v = 17;
	FT_SYS(setsockopt(s, IPPROTO_IP, IP_TTL, &v, sizeof(v)));
	struct timeval tv = { 2, 500000 };
	FT_SYS(setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)));
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	FT_SYS(bind(s, (struct sockaddr *)&sa, sizeof(sa)));
	socklen_t l = sizeof(sa);
	FT_SYS(getsockname(s, (struct sockaddr *)&sa, &l));
	static const struct {
		int lvl, opt;
		const char *n;
	} opts[] = { { SOL_SOCKET, SO_RCVBUF, "SO_RCVBUF" }, { SOL_SOCKET, SO_SNDBUF, "SO_SNDBUF" },
		     { SOL_SOCKET, SO_BROADCAST, "SO_BROADCAST" }, { SOL_SOCKET, SO_PRIORITY, "SO_PRIORITY" },
		     { IPPROTO_IP, IP_TOS, "IP_TOS" }, { IPPROTO_IP, IP_TTL, "IP_TTL" },
		     { SOL_SOCKET, SO_TYPE, "SO_TYPE" } };
	int n = sizeof(opts) / sizeof(opts[0]), vals[16];
	for (int i = 0; i < n; i++)
		vals[i] = geti(s, opts[i].lvl, opts[i].opt);

	ft_ready();
	ft_wait_restored();

	for (int i = 0; i < n; i++)
		FT_EQ(geti(s, opts[i].lvl, opts[i].opt), vals[i], opts[i].n);
	struct timeval tv2 = { 0, 0 };
	l = sizeof(tv2);
	getsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv2, &l);
	FT_CHECK(tv2.tv_sec == 2 && tv2.tv_usec == 500000, "SO_RCVTIMEO %ld.%06ld", (long)tv2.tv_sec,
		 (long)tv2.tv_usec);
	struct sockaddr_in x;
	l = sizeof(x);
	FT_SYS(getsockname(s, (struct sockaddr *)&x, &l));
	FT_CHECK(x.sin_port == sa.sin_port && x.sin_addr.s_addr == sa.sin_addr.s_addr, "S address changed");
	int c = (int)FT_SYS(socket(AF_INET, SOCK_DGRAM, 0));
	struct sockaddr_in ca = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	FT_SYS(bind(c, (struct sockaddr *)&ca, sizeof(ca)));
	l = sizeof(ca);
	FT_SYS(getsockname(c, (struct sockaddr *)&ca, &l));
	FT_EQ(sendto(c, "dgram-1", 7, 0, (struct sockaddr *)&sa, sizeof(sa)), 7, "sendto S");
	char buf[32] = { 0 };
	struct sockaddr_in from;
	l = sizeof(from);
	FT_EQ(recvfrom(s, buf, sizeof(buf), 0, (struct sockaddr *)&from, &l), 7, "S recvfrom");
	FT_CHECK(memcmp(buf, "dgram-1", 7) == 0, "S got '%s'", buf);
	FT_CHECK(from.sin_port == ca.sin_port, "source port %d, expected %d", ntohs(from.sin_port),
		 ntohs(ca.sin_port));
	FT_EQ(sendto(s, "reply", 5, 0, (struct sockaddr *)&from, l), 5, "S sendto sender");
	memset(buf, 0, sizeof(buf));
	struct timeval ctv = { 3, 0 };
	setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &ctv, sizeof(ctv));
	FT_EQ(recv(c, buf, sizeof(buf), 0), 5, "sender recv reply");
	return ft_finish();
}
