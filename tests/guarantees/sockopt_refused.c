/*
 * sockopt_refused MODE: fd 3 is a socket carrying state ferry does not
 * restore; checkpoint must refuse it by name before the freeze and leave
 * it as it was. Before the option check each of these came back without
 * the state (a filter's dropped packets delivered, an MD5-signed
 * connection dead, a multicast group no longer received).
 *   filter     UDP socket with a classic BPF filter and SO_LOCK_FILTER
 *   md5        TCP listener with a TCP_MD5SIG key (seen only by sock_diag)
 *   savesyn    TCP listener with TCP_SAVE_SYN
 *   multicast  UDP socket that joined 239.7.7.7 on lo
 *   unixbuf    unix stream socket with SO_SNDBUF, SO_RCVTIMEO, SO_KEEPALIVE
 */
#include "../conformance/ferry_test.h"
#include <arpa/inet.h>
#include <linux/filter.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>

#ifndef SO_LOCK_FILTER
#define SO_LOCK_FILTER 44
#endif

static int one = 1;

static int setup(const char *mode)
{
	if (strcmp(mode, "filter") == 0) {
		int s = FT_SYS(socket(AF_INET, SOCK_DGRAM, 0));
		struct sock_filter code[] = { BPF_STMT(BPF_RET | BPF_K, 0) };
		struct sock_fprog prog = { 1, code };
		FT_SYS(setsockopt(s, SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof(prog)));
		FT_SYS(setsockopt(s, SOL_SOCKET, SO_LOCK_FILTER, &one, sizeof(one)));
		return s;
	}
	if (strcmp(mode, "md5") == 0 || strcmp(mode, "savesyn") == 0) {
		int s = FT_SYS(socket(AF_INET, SOCK_STREAM, 0));
		if (mode[0] == 'm') {
			struct tcp_md5sig sig = { 0 };
			struct sockaddr_in *a = (struct sockaddr_in *)&sig.tcpm_addr;
			a->sin_family = AF_INET;
			a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
			sig.tcpm_keylen = 6;
			memcpy(sig.tcpm_key, "secret", 6);
			FT_SYS(setsockopt(s, IPPROTO_TCP, TCP_MD5SIG, &sig, sizeof(sig)));
		} else {
			FT_SYS(setsockopt(s, IPPROTO_TCP, TCP_SAVE_SYN, &one, sizeof(one)));
		}
		struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
		FT_SYS(bind(s, (struct sockaddr *)&a, sizeof(a)));
		FT_SYS(listen(s, 4));
		return s;
	}
	if (strcmp(mode, "multicast") == 0) {
		int s = FT_SYS(socket(AF_INET, SOCK_DGRAM, 0));
		struct ip_mreqn m = { .imr_ifindex = 1 };
		m.imr_multiaddr.s_addr = inet_addr("239.7.7.7");
		FT_SYS(setsockopt(s, IPPROTO_IP, IP_ADD_MEMBERSHIP, &m, sizeof(m)));
		return s;
	}
	if (strcmp(mode, "unixbuf") == 0) {
		int s = FT_SYS(socket(AF_UNIX, SOCK_STREAM, 0));
		int size = 65536;
		struct timeval tv = { 3, 0 };
		FT_SYS(setsockopt(s, SOL_SOCKET, SO_SNDBUF, &size, sizeof(size)));
		FT_SYS(setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)));
		FT_SYS(setsockopt(s, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one)));
		return s;
	}
	ft_die("unknown mode %s", mode);
	return -1;
}

int main(int argc, char **argv)
{
	ft_init();
	if (argc < 2)
		ft_die("usage: sockopt_refused MODE");
	int s = setup(argv[1]);
	if (s != 3)
		ft_die("socket is fd %d, expected 3", s);
	ft_ready();
	ft_wait_restored();
	/* Still the same socket, with its state: a filter still locked. */
	int v = 0;
	socklen_t l = sizeof(v);
	if (strcmp(argv[1], "filter") == 0) {
		FT_SYS(getsockopt(s, SOL_SOCKET, SO_LOCK_FILTER, &v, &l));
		FT_EQ(v, 1, "SO_LOCK_FILTER");
	} else if (strcmp(argv[1], "savesyn") == 0) {
		FT_SYS(getsockopt(s, IPPROTO_TCP, TCP_SAVE_SYN, &v, &l));
		FT_EQ(v, 1, "TCP_SAVE_SYN");
	} else if (strcmp(argv[1], "multicast") == 0) {
		/* MCAST_MSFILTER answers only for a group this socket joined. */
		struct group_filter gf = { .gf_interface = 1 };
		struct sockaddr_in *g = (struct sockaddr_in *)&gf.gf_group;
		g->sin_family = AF_INET;
		g->sin_addr.s_addr = inet_addr("239.7.7.7");
		socklen_t gl = sizeof(gf);
		if (getsockopt(s, IPPROTO_IP, MCAST_MSFILTER, &gf, &gl) != 0)
			ft_fail("no longer a member of 239.7.7.7: %s", strerror(errno));
	} else if (strcmp(argv[1], "unixbuf") == 0) {
		FT_SYS(getsockopt(s, SOL_SOCKET, SO_KEEPALIVE, &v, &l));
		FT_EQ(v, 1, "SO_KEEPALIVE");
	}
	return ft_finish();
}
