/*
 * sock_opts_unbound: socket options on sockets that were never bound or
 * connected (their options are all there is to them). A TCP socket with
 * SO_PRIORITY 3, SO_RCVLOWAT 7, SO_MARK 77, SO_DONTROUTE, SO_NO_CHECK,
 * SO_OOBINLINE and SO_BINDTODEVICE "lo"; a UDP socket with SO_DONTROUTE
 * and SO_NO_CHECK; a unix stream socket with SO_PASSCRED (SO_PASSSEC is
 * refused at checkpoint: tests/guarantees/unix_passsec.c).
 * After restore getsockopt returns the same value for every one, and the
 * sockets are still unbound.
 */
#include "ferry_test.h"
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>

#ifndef SO_NO_CHECK
#define SO_NO_CHECK 11
#endif

struct opt {
	int *fd;
	int name;
	const char *what;
	int value;
};

static int tcp, udp, usk;

static struct opt opts[] = {
	{ &tcp, SO_PRIORITY, "tcp SO_PRIORITY", 3 },
	{ &tcp, SO_RCVLOWAT, "tcp SO_RCVLOWAT", 7 },
	{ &tcp, SO_MARK, "tcp SO_MARK", 77 },
	{ &tcp, SO_DONTROUTE, "tcp SO_DONTROUTE", 1 },
	{ &tcp, SO_NO_CHECK, "tcp SO_NO_CHECK", 1 },
	{ &tcp, SO_OOBINLINE, "tcp SO_OOBINLINE", 1 },
	{ &udp, SO_DONTROUTE, "udp SO_DONTROUTE", 1 },
	{ &udp, SO_NO_CHECK, "udp SO_NO_CHECK", 1 },
	{ &usk, SO_PASSCRED, "unix SO_PASSCRED", 1 },
};
#define NOPTS (int)(sizeof(opts) / sizeof(opts[0]))

static int get(int fd, int name)
{
	int v = -1;
	socklen_t l = sizeof(v);
	if (getsockopt(fd, SOL_SOCKET, name, &v, &l) != 0)
		return -1000 - errno;
	return v;
}

int main(void)
{
	ft_init();
	tcp = FT_SYS(socket(AF_INET, SOCK_STREAM, 0));
	udp = FT_SYS(socket(AF_INET, SOCK_DGRAM, 0));
	usk = FT_SYS(socket(AF_UNIX, SOCK_STREAM, 0));
	int want[NOPTS];
	for (int i = 0; i < NOPTS; i++) {
		FT_SYS(setsockopt(*opts[i].fd, SOL_SOCKET, opts[i].name, &opts[i].value, sizeof(int)));
		/* The kernel may normalise a value on set: expect what it kept. */
		want[i] = get(*opts[i].fd, opts[i].name);
		if (want[i] == 0)
			ft_die("%s: set to %d but reads 0", opts[i].what, opts[i].value);
	}
	FT_SYS(setsockopt(tcp, SOL_SOCKET, SO_BINDTODEVICE, "lo", 3));
	char dev[IFNAMSIZ] = "";
	socklen_t dl = sizeof(dev);
	FT_SYS(getsockopt(tcp, SOL_SOCKET, SO_BINDTODEVICE, dev, &dl));

	ft_ready();
	ft_wait_restored();

	for (int i = 0; i < NOPTS; i++) {
		int got = get(*opts[i].fd, opts[i].name);
		FT_EQ(got, want[i], opts[i].what);
	}
	char dev2[IFNAMSIZ] = "";
	socklen_t dl2 = sizeof(dev2);
	if (getsockopt(tcp, SOL_SOCKET, SO_BINDTODEVICE, dev2, &dl2) != 0)
		ft_fail("getsockopt(SO_BINDTODEVICE): %s", strerror(errno));
	else
		FT_CHECK(dl2 == dl && strcmp(dev, dev2) == 0, "SO_BINDTODEVICE '%s' (len %u), expected '%s' (len %u)", dev2, dl2, dev, dl);
	struct sockaddr_in a;
	socklen_t al = sizeof(a);
	FT_SYS(getsockname(tcp, (struct sockaddr *)&a, &al));
	FT_EQ(ntohs(a.sin_port), 0, "tcp still unbound (port)");
	return ft_finish();
}
