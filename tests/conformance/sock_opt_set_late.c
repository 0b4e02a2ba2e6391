/*
 * sock_opt_set_late: an established TCP connection over IPv4 loopback
 * (both ends in this process) whose options the application changes
 * while ferry checkpoints it: on SIGUSR1 (sent by the harness after ferry
 * read the tree's socket options, before the freeze) the server end gets
 * TCP_NODELAY, SO_KEEPALIVE and TCP_KEEPIDLE 77, and "SET" is printed.
 * After restore: those values read back (ferry must see that a setsockopt
 * happened after its early read and read the options again in the
 * freeze). Without SIGUSR1 the options keep their defaults, which must
 * read back too.
 */
#include "ferry_test.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

static int srv = -1;
static volatile sig_atomic_t set_late;

static int opt_int(int fd, int lvl, int opt)
{
	int v = -1;
	socklen_t l = sizeof(v);
	if (getsockopt(fd, lvl, opt, &v, &l) != 0)
		return -12345;
	return v;
}

static void on_usr1(int sig)
{
	(void)sig;
	int one = 1, idle = 77;
	if (setsockopt(srv, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0 ||
	    setsockopt(srv, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one)) != 0 ||
	    setsockopt(srv, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle)) != 0)
		return;
	set_late = 1;
	ft_write_all(1, "SET\n", 4);
}

int main(void)
{
	ft_init();
	int l = socket(AF_INET, SOCK_STREAM, 0);
	if (l < 0)
		ft_die("socket: %s", strerror(errno));
	struct sockaddr_in a = { .sin_family = AF_INET };
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	socklen_t al = sizeof(a);
	if (bind(l, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(l, 1) != 0 ||
	    getsockname(l, (struct sockaddr *)&a, &al) != 0)
		ft_die("listen: %s", strerror(errno));
	int cli = socket(AF_INET, SOCK_STREAM, 0);
	if (cli < 0 || connect(cli, (struct sockaddr *)&a, sizeof(a)) != 0)
		ft_die("connect: %s", strerror(errno));
	srv = accept(l, NULL, NULL);
	if (srv < 0)
		ft_die("accept: %s", strerror(errno));
	close(l);
	struct sigaction sa = { .sa_handler = on_usr1 };
	FT_SYS(sigaction(SIGUSR1, &sa, NULL));
	ft_ready();
	ft_wait_restored();

	int want = set_late ? 1 : 0;
	if (opt_int(srv, IPPROTO_TCP, TCP_NODELAY) != want)
		ft_fail("TCP_NODELAY reads %d, expected %d", opt_int(srv, IPPROTO_TCP, TCP_NODELAY), want);
	if (opt_int(srv, SOL_SOCKET, SO_KEEPALIVE) != want)
		ft_fail("SO_KEEPALIVE reads %d, expected %d", opt_int(srv, SOL_SOCKET, SO_KEEPALIVE), want);
	if (set_late && opt_int(srv, IPPROTO_TCP, TCP_KEEPIDLE) != 77)
		ft_fail("TCP_KEEPIDLE reads %d, expected 77", opt_int(srv, IPPROTO_TCP, TCP_KEEPIDLE));
	ft_log("options set while checkpointing: %s", set_late ? "yes" : "no");
	/* The connection still carries data both ways. */
	if (write(cli, "ping", 4) != 4 || write(srv, "pong", 4) != 4)
		ft_fail("write after restore: %s", strerror(errno));
	char b[4];
	if (read(srv, b, 4) != 4 || memcmp(b, "ping", 4) != 0)
		ft_fail("server end did not read ping");
	if (read(cli, b, 4) != 4 || memcmp(b, "pong", 4) != 0)
		ft_fail("client end did not read pong");
	return ft_finish();
}
