/*
 * sock_udp_connected: UDP socket S bound to 127.0.0.1:0 and UDP socket C
 * bound to an ephemeral port and connect()ed to S. After restore: C's local
 * address and peer (getpeername) are unchanged; send from C is received by
 * S with C's address as source; sendto from S to C is received by C; C
 * still filters out datagrams from other sources (connected).
 */
#include "ferry_test.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

int main(void)
{
	ft_init();
	int s = (int)FT_SYS(socket(AF_INET, SOCK_DGRAM, 0));
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	FT_SYS(bind(s, (struct sockaddr *)&sa, sizeof(sa)));
	socklen_t l = sizeof(sa);
	FT_SYS(getsockname(s, (struct sockaddr *)&sa, &l));
	int c = (int)FT_SYS(socket(AF_INET, SOCK_DGRAM, 0));
	struct sockaddr_in ca = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	FT_SYS(bind(c, (struct sockaddr *)&ca, sizeof(ca)));
	FT_SYS(connect(c, (struct sockaddr *)&sa, sizeof(sa)));
	l = sizeof(ca);
	FT_SYS(getsockname(c, (struct sockaddr *)&ca, &l));

	ft_ready();
	ft_wait_restored();

	struct sockaddr_in x;
	l = sizeof(x);
	FT_SYS(getsockname(c, (struct sockaddr *)&x, &l));
	FT_CHECK(x.sin_port == ca.sin_port, "C local port %d -> %d", ntohs(ca.sin_port), ntohs(x.sin_port));
	l = sizeof(x);
	FT_CHECK(getpeername(c, (struct sockaddr *)&x, &l) == 0 && x.sin_port == sa.sin_port,
		 "C lost its peer (connected UDP)");
	FT_EQ(send(c, "dgram-1", 7, 0), 7, "C send");
	char buf[32] = { 0 };
	struct sockaddr_in from;
	l = sizeof(from);
	FT_EQ(recvfrom(s, buf, sizeof(buf), MSG_DONTWAIT, (struct sockaddr *)&from, &l), 7, "S recvfrom");
	FT_CHECK(from.sin_port == ca.sin_port, "source port %d, expected %d", ntohs(from.sin_port),
		 ntohs(ca.sin_port));
	FT_EQ(sendto(s, "reply", 5, 0, (struct sockaddr *)&ca, sizeof(ca)), 5, "S sendto C");
	memset(buf, 0, sizeof(buf));
	ft_sleep_ms(10);
	FT_EQ(recv(c, buf, sizeof(buf), MSG_DONTWAIT), 5, "C recv");
	int o = socket(AF_INET, SOCK_DGRAM, 0);
	sendto(o, "intruder", 8, 0, (struct sockaddr *)&ca, sizeof(ca));
	ft_sleep_ms(10);
	FT_CHECK(recv(c, buf, sizeof(buf), MSG_DONTWAIT) < 0 && errno == EAGAIN,
		 "connected UDP socket accepted a datagram from another peer");
	return ft_finish();
}
