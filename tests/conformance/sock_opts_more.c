/*
 * sock_opts_more: the socket options ferry restores beyond the common
 * ones, each set to a value that is not its default: on an AF_INET6 TCP
 * listener (IPv4 options included, for its v4-mapped traffic: IP_TOS,
 * IP_TTL, IP_MINTTL...; the IPv6 hop limit, DONTFRAG and recv flags; TCP's
 * window clamp, RTO and delayed-ACK bounds, TX delay, INQ; SOL_SOCKET's
 * busy poll, pacing rate, zerocopy...), an AF_INET6 UDP socket (UDP_SEGMENT,
 * UDP_GRO, IPv6 multicast hops...) and an AF_INET UDP socket (IP multicast
 * TTL/loop/all, IP_CHECKSUM...). After restore every option reads back the
 * same bytes. Before ferry read these options, each came back at its
 * default.
 */
#include "ferry_test.h"
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <netinet/udp.h>
#include <sys/socket.h>
#include <arpa/inet.h>

#ifndef SO_BUSY_POLL
#define SO_BUSY_POLL 46
#endif
#define SO_MAX_PACING_RATE_ 47
#define SO_ZEROCOPY_ 60
#define SO_PREFER_BUSY_POLL_ 69
#define SO_RCVMARK_ 75
#define IP_RECVFRAGSIZE_ 25
#define IP_RECVERR_RFC4884_ 26
#define IP_LOCAL_PORT_RANGE_ 51
#define IPV6_RECVERR_RFC4884_ 31
#define IPV6_MINHOPCOUNT_ 73
#define IPV6_UNICAST_IF_ 76
#define IPV6_RECVFRAGSIZE_ 77
#define TCP_INQ_ 36
#define TCP_TX_DELAY_ 37
#define TCP_RTO_MAX_MS_ 44
#define TCP_RTO_MIN_US_ 45
#define TCP_DELACK_MAX_US_ 46
#define UDP_NO_CHECK6_TX_ 101
#define UDP_NO_CHECK6_RX_ 102
#define UDP_SEGMENT_ 103
#define UDP_GRO_ 104
#ifndef IPV6_FLOWINFO
#define IPV6_FLOWINFO 11
#endif
#ifndef IPV6_FLOWINFO_SEND
#define IPV6_FLOWINFO_SEND 33
#endif

static int tcp6, udp6, udp4;

struct opt {
	int *fd;
	int level, name;
	const char *what;
	int value;
	unsigned char want[64];
	socklen_t want_len;
};

#define O(fd, l, n, v) { &fd, l, n, #fd " " #n, v, {0}, 0 }

static struct opt opts[] = {
	O(udp4, SOL_SOCKET, SO_TIMESTAMP, 1),
	O(tcp6, SOL_SOCKET, SO_TIMESTAMPNS, 1),
	O(udp6, SOL_SOCKET, SO_RXQ_OVFL, 1),
	O(tcp6, SOL_SOCKET, SO_SELECT_ERR_QUEUE, 1),
	O(tcp6, SOL_SOCKET, SO_BUSY_POLL, 50),
	O(tcp6, SOL_SOCKET, SO_MAX_PACING_RATE_, 1000000),
	O(tcp6, SOL_SOCKET, SO_ZEROCOPY_, 1),
	O(tcp6, SOL_SOCKET, SO_PREFER_BUSY_POLL_, 1),
	O(tcp6, SOL_SOCKET, SO_RCVMARK_, 1),
	O(tcp6, IPPROTO_IP, IP_TOS, 0x28),
	O(tcp6, IPPROTO_IP, IP_TTL, 33),
	O(tcp6, IPPROTO_IP, IP_MINTTL, 7),
	O(tcp6, IPPROTO_IP, IP_RECVTTL, 1),
	O(tcp6, IPPROTO_IP, IP_RECVOPTS, 1),
	O(tcp6, IPPROTO_IP, IP_RETOPTS, 1),
	O(tcp6, IPPROTO_IP, IP_PKTINFO, 1),
	O(tcp6, IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO),
	O(tcp6, IPPROTO_IP, IP_RECVERR, 1),
	O(tcp6, IPPROTO_IP, IP_RECVTOS, 1),
	O(tcp6, IPPROTO_IP, IP_FREEBIND, 1),
	O(tcp6, IPPROTO_IP, IP_PASSSEC, 1),
	O(tcp6, IPPROTO_IP, IP_TRANSPARENT, 1),
	O(tcp6, IPPROTO_IP, IP_RECVORIGDSTADDR, 1),
	O(tcp6, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1),
	O(tcp6, IPPROTO_IP, IP_RECVERR_RFC4884_, 1),
	O(tcp6, IPPROTO_IP, IP_LOCAL_PORT_RANGE_, (50000 << 16) | 40000),
	O(tcp6, IPPROTO_IPV6, IPV6_2292PKTINFO, 1),
	O(tcp6, IPPROTO_IPV6, IPV6_2292HOPOPTS, 1),
	O(tcp6, IPPROTO_IPV6, IPV6_2292DSTOPTS, 1),
	O(tcp6, IPPROTO_IPV6, IPV6_2292RTHDR, 1),
	O(tcp6, IPPROTO_IPV6, IPV6_2292HOPLIMIT, 1),
	O(tcp6, IPPROTO_IPV6, IPV6_FLOWINFO, 1),
	O(tcp6, IPPROTO_IPV6, IPV6_UNICAST_HOPS, 9),
	O(tcp6, IPPROTO_IPV6, IPV6_MTU_DISCOVER, IPV6_PMTUDISC_DO),
	O(tcp6, IPPROTO_IPV6, IPV6_RECVERR, 1),
	O(tcp6, IPPROTO_IPV6, IPV6_RECVERR_RFC4884_, 1),
	O(tcp6, IPPROTO_IPV6, IPV6_FLOWINFO_SEND, 1),
	O(tcp6, IPPROTO_IPV6, IPV6_RECVPKTINFO, 1),
	O(tcp6, IPPROTO_IPV6, IPV6_RECVHOPLIMIT, 1),
	O(tcp6, IPPROTO_IPV6, IPV6_RECVHOPOPTS, 1),
	O(tcp6, IPPROTO_IPV6, IPV6_RECVRTHDR, 1),
	O(tcp6, IPPROTO_IPV6, IPV6_RECVDSTOPTS, 1),
	O(tcp6, IPPROTO_IPV6, IPV6_RECVPATHMTU, 1),
	O(tcp6, IPPROTO_IPV6, IPV6_DONTFRAG, 1),
	O(tcp6, IPPROTO_IPV6, IPV6_RECVTCLASS, 1),
	O(tcp6, IPPROTO_IPV6, IPV6_MINHOPCOUNT_, 5),
	O(tcp6, IPPROTO_IPV6, IPV6_RECVORIGDSTADDR, 1),
	O(tcp6, IPPROTO_IPV6, IPV6_UNICAST_IF_, 0x01000000),
	O(tcp6, IPPROTO_TCP, TCP_CORK, 1),
	O(tcp6, IPPROTO_TCP, TCP_SYNCNT, 3),
	O(tcp6, IPPROTO_TCP, TCP_LINGER2, 10),
	O(tcp6, IPPROTO_TCP, TCP_DEFER_ACCEPT, 5),
	O(tcp6, IPPROTO_TCP, TCP_WINDOW_CLAMP, 40000),
	O(tcp6, IPPROTO_TCP, TCP_THIN_LINEAR_TIMEOUTS, 1),
	O(tcp6, IPPROTO_TCP, TCP_FASTOPEN, 5),
	O(tcp6, IPPROTO_TCP, TCP_INQ_, 1),
	O(tcp6, IPPROTO_TCP, TCP_TX_DELAY_, 100),
	O(tcp6, IPPROTO_TCP, TCP_RTO_MAX_MS_, 5000),
	O(tcp6, IPPROTO_TCP, TCP_RTO_MIN_US_, 50000),
	O(tcp6, IPPROTO_TCP, TCP_DELACK_MAX_US_, 40000),
	O(udp6, IPPROTO_IPV6, IPV6_MULTICAST_IF, 1),
	O(udp6, IPPROTO_IPV6, IPV6_MULTICAST_HOPS, 4),
	O(udp6, IPPROTO_IPV6, IPV6_MULTICAST_LOOP, 0),
	O(udp6, IPPROTO_IPV6, IPV6_MULTICAST_ALL, 0),
	O(udp6, IPPROTO_IPV6, IPV6_RECVFRAGSIZE_, 1),
	O(udp6, IPPROTO_UDP, UDP_CORK, 1),
	O(udp6, IPPROTO_UDP, UDP_NO_CHECK6_TX_, 1),
	O(udp6, IPPROTO_UDP, UDP_NO_CHECK6_RX_, 1),
	O(udp6, IPPROTO_UDP, UDP_SEGMENT_, 1200),
	O(udp6, IPPROTO_UDP, UDP_GRO_, 1),
	O(udp4, IPPROTO_IP, IP_MULTICAST_TTL, 5),
	O(udp4, IPPROTO_IP, IP_MULTICAST_LOOP, 0),
	O(udp4, IPPROTO_IP, IP_MULTICAST_ALL, 0),
	O(udp4, IPPROTO_IP, IP_RECVFRAGSIZE_, 1),
	O(udp4, IPPROTO_IP, IP_CHECKSUM, 1),
	O(udp4, IPPROTO_IP, IP_UNICAST_IF, 0x01000000),
};
#define NOPTS (int)(sizeof(opts) / sizeof(opts[0]))

static void read_opt(struct opt *o, unsigned char *buf, socklen_t *len)
{
	*len = 64;
	memset(buf, 0, 64);
	if (getsockopt(*o->fd, o->level, o->name, buf, len) != 0)
		ft_die("%s: getsockopt: %s", o->what, strerror(errno));
}

int main(void)
{
	ft_init();
	tcp6 = FT_SYS(socket(AF_INET6, SOCK_STREAM, 0));
	udp6 = FT_SYS(socket(AF_INET6, SOCK_DGRAM, 0));
	udp4 = FT_SYS(socket(AF_INET, SOCK_DGRAM, 0));
	for (int i = 0; i < NOPTS; i++) {
		struct opt *o = &opts[i];
		if (setsockopt(*o->fd, o->level, o->name, &o->value, sizeof(int)) != 0)
			ft_die("%s: setsockopt(%d): %s", o->what, o->value, strerror(errno));
		read_opt(o, o->want, &o->want_len);
	}
	struct timeval tv = { 7, 250000 };
	FT_SYS(setsockopt(tcp6, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)));
	/* Kept in jiffies: expect what the kernel reads back. */
	socklen_t tl = sizeof(tv);
	FT_SYS(getsockopt(tcp6, SOL_SOCKET, SO_SNDTIMEO, &tv, &tl));
	struct sockaddr_in6 a = { .sin6_family = AF_INET6, .sin6_addr = IN6ADDR_ANY_INIT };
	FT_SYS(bind(tcp6, (struct sockaddr *)&a, sizeof(a)));
	FT_SYS(listen(tcp6, 8));

	ft_ready();
	ft_wait_restored();

	for (int i = 0; i < NOPTS; i++) {
		unsigned char got[64];
		socklen_t len;
		read_opt(&opts[i], got, &len);
		if (len != opts[i].want_len || memcmp(got, opts[i].want, len) != 0)
			ft_fail("%s: reads %d, was %d", opts[i].what, *(int *)got,
				*(int *)opts[i].want);
	}
	struct timeval tv2 = { 0, 0 };
	tl = sizeof(tv2);
	FT_SYS(getsockopt(tcp6, SOL_SOCKET, SO_SNDTIMEO, &tv2, &tl));
	if (tv2.tv_sec != tv.tv_sec || tv2.tv_usec != tv.tv_usec)
		ft_fail("SO_SNDTIMEO reads %ld.%06ld", (long)tv2.tv_sec, (long)tv2.tv_usec);
	return ft_finish();
}
