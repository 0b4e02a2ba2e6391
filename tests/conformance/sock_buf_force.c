/*
 * sock_buf_force: socket buffers set with SO_SNDBUFFORCE/SO_RCVBUFFORCE
 * (root may go above net.core.wmem_max/rmem_max) and odd sizes set with
 * SO_SNDBUF/SO_RCVBUF, on a UDP socket and a TCP listener. After restore
 * getsockopt reads the same sizes (the kernel's doubled values), not the
 * sizes clamped to the sysctl maximum.
 */
#include "ferry_test.h"
#include <netinet/in.h>
#include <sys/socket.h>

static int read_max(const char *path)
{
	char buf[32];
	if (ft_read_file(path, buf, sizeof(buf)) <= 0)
		ft_die("reading %s", path);
	return atoi(buf);
}

static int get(int fd, int name)
{
	int v = 0;
	socklen_t l = sizeof(v);
	FT_SYS(getsockopt(fd, SOL_SOCKET, name, &v, &l));
	return v;
}

int main(void)
{
	ft_init();
	int big_snd = read_max("/proc/sys/net/core/wmem_max") * 2;
	int big_rcv = read_max("/proc/sys/net/core/rmem_max") * 2;
	int udp = (int)FT_SYS(socket(AF_INET, SOCK_DGRAM, 0));
	FT_SYS(setsockopt(udp, SOL_SOCKET, SO_SNDBUFFORCE, &big_snd, sizeof(big_snd)));
	FT_SYS(setsockopt(udp, SOL_SOCKET, SO_RCVBUFFORCE, &big_rcv, sizeof(big_rcv)));
	int tcp = (int)FT_SYS(socket(AF_INET, SOCK_STREAM, 0));
	int odd_snd = 12345, odd_rcv = 54321;
	FT_SYS(setsockopt(tcp, SOL_SOCKET, SO_SNDBUF, &odd_snd, sizeof(odd_snd)));
	FT_SYS(setsockopt(tcp, SOL_SOCKET, SO_RCVBUF, &odd_rcv, sizeof(odd_rcv)));
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	FT_SYS(bind(tcp, (struct sockaddr *)&a, sizeof(a)));
	FT_SYS(listen(tcp, 4));
	int want[4] = { get(udp, SO_SNDBUF), get(udp, SO_RCVBUF), get(tcp, SO_SNDBUF), get(tcp, SO_RCVBUF) };
	if (want[0] <= big_snd)
		ft_die("SO_SNDBUFFORCE did not go above wmem_max (%d)", want[0]);
	ft_ready();
	ft_wait_restored();
	FT_EQ(get(udp, SO_SNDBUF), want[0], "UDP SO_SNDBUF (forced above wmem_max)");
	FT_EQ(get(udp, SO_RCVBUF), want[1], "UDP SO_RCVBUF (forced above rmem_max)");
	FT_EQ(get(tcp, SO_SNDBUF), want[2], "TCP listener SO_SNDBUF 12345");
	FT_EQ(get(tcp, SO_RCVBUF), want[3], "TCP listener SO_RCVBUF 54321");
	return ft_finish();
}
