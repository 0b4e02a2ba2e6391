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
 *   unixnew    unix stream socket with SO_TIMESTAMP_NEW (its _OLD twin is
 *              restored)
 *   ipopts     UDP socket with IP_OPTIONS (four NOPs)
 *   tfo_connect  TCP socket with TCP_FASTOPEN_CONNECT
 *   tfo_nocookie TCP socket with TCP_FASTOPEN_NO_COOKIE
 *   tfo_key    TCP listener with its own TCP_FASTOPEN_KEY
 *   txrehash   TCP socket with SO_TXREHASH 0
 *   tcp_peekoff  TCP socket with SO_PEEK_OFF 0
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
#ifndef SO_TIMESTAMP_NEW
#define SO_TIMESTAMP_NEW 63
#endif
#ifndef SO_TXREHASH
#define SO_TXREHASH 74
#endif
#ifndef SO_PEEK_OFF
#define SO_PEEK_OFF 42
#endif

/* One option of the table-driven modes: set on a fresh socket, read back after. */
static const struct {
	const char *mode;
	int family, type, listen, level, name, value;
} simple[] = {
	{ "unixnew", AF_UNIX, SOCK_STREAM, 0, SOL_SOCKET, SO_TIMESTAMP_NEW, 1 },
	{ "tfo_connect", AF_INET, SOCK_STREAM, 0, IPPROTO_TCP, TCP_FASTOPEN_CONNECT, 1 },
	{ "tfo_nocookie", AF_INET, SOCK_STREAM, 0, IPPROTO_TCP, TCP_FASTOPEN_NO_COOKIE, 1 },
	{ "txrehash", AF_INET, SOCK_STREAM, 0, SOL_SOCKET, SO_TXREHASH, 0 },
	{ "tcp_peekoff", AF_INET, SOCK_STREAM, 0, SOL_SOCKET, SO_PEEK_OFF, 0 },
};
#define NSIMPLE ((int)(sizeof(simple) / sizeof(simple[0])))

static int simple_mode(const char *mode)
{
	for (int i = 0; i < NSIMPLE; i++)
		if (strcmp(mode, simple[i].mode) == 0)
			return i;
	return -1;
}

static const unsigned char nops[4] = { 1, 1, 1, 1 };
static const unsigned char tfo_key[16] = "ferry-tfo-key-01";

static void listen_on_loopback(int s)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	FT_SYS(bind(s, (struct sockaddr *)&a, sizeof(a)));
	FT_SYS(listen(s, 4));
}

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
	if (strcmp(mode, "ipopts") == 0) {
		int s = FT_SYS(socket(AF_INET, SOCK_DGRAM, 0));
		FT_SYS(setsockopt(s, IPPROTO_IP, IP_OPTIONS, nops, sizeof(nops)));
		return s;
	}
	if (strcmp(mode, "tfo_key") == 0) {
		int s = FT_SYS(socket(AF_INET, SOCK_STREAM, 0));
		listen_on_loopback(s);
		FT_SYS(setsockopt(s, IPPROTO_TCP, TCP_FASTOPEN_KEY, tfo_key, sizeof(tfo_key)));
		return s;
	}
	int i = simple_mode(mode);
	if (i >= 0) {
		int s = FT_SYS(socket(simple[i].family, simple[i].type, 0));
		FT_SYS(setsockopt(s, simple[i].level, simple[i].name, &simple[i].value, sizeof(int)));
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
	} else if (strcmp(argv[1], "ipopts") == 0) {
		unsigned char b[40];
		socklen_t bl = sizeof(b);
		FT_SYS(getsockopt(s, IPPROTO_IP, IP_OPTIONS, b, &bl));
		FT_CHECK(bl == sizeof(nops) && memcmp(b, nops, bl) == 0, "IP_OPTIONS: %u bytes", bl);
	} else if (strcmp(argv[1], "tfo_key") == 0) {
		unsigned char b[32];
		socklen_t bl = sizeof(b);
		FT_SYS(getsockopt(s, IPPROTO_TCP, TCP_FASTOPEN_KEY, b, &bl));
		FT_CHECK(bl == sizeof(tfo_key) && memcmp(b, tfo_key, bl) == 0, "TCP_FASTOPEN_KEY: %u bytes", bl);
	} else if (simple_mode(argv[1]) >= 0) {
		int i = simple_mode(argv[1]);
		FT_SYS(getsockopt(s, simple[i].level, simple[i].name, &v, &l));
		FT_EQ(v, simple[i].value, "the option");
	}
	return ft_finish();
}
