/*
 * fd_change_late: established TCP connections over IPv4 loopback (both
 * ends in this process) whose fds the application changes while ferry
 * checkpoints it: on SIGUSR1 (sent by the harness after ferry described
 * the connections, before the freeze) it sets FD_CLOEXEC on one
 * connection's fd and O_NONBLOCK on another's, puts a third connection's
 * description at an fd that held a fourth's (dup2), closes a second fd of
 * one connection, accepts a new connection, and prints "SET".
 * After restore: every fd is as the application left it (flags, which
 * connection each number holds, the closed fd closed, the new connection
 * there and carrying data). Ferry must see that fds changed after it
 * described them and read them again in the freeze.
 * Without SIGUSR1 the fds stay as they were set up, which must read back.
 */
#include "ferry_test.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

static struct sockaddr_in addr;
static int lst = -1;
static int cli[3] = { -1, -1, -1 }, srv[3] = { -1, -1, -1 };
/* A second fd of connection 2 (dup2'ed over with connection 0), and one
 * of connection 1 (closed). */
static int other = -1, extra = -1;
static int new_cli = -1, new_srv = -1;
static volatile sig_atomic_t set_late;

static void pair(int *c, int *s)
{
	*c = socket(AF_INET, SOCK_STREAM, 0);
	if (*c < 0 || connect(*c, (struct sockaddr *)&addr, sizeof(addr)) != 0)
		ft_die("connect: %s", strerror(errno));
	*s = accept(lst, NULL, NULL);
	if (*s < 0)
		ft_die("accept: %s", strerror(errno));
}

static void on_usr1(int sig)
{
	(void)sig;
	if (fcntl(srv[0], F_SETFD, FD_CLOEXEC) != 0 || fcntl(srv[1], F_SETFL, O_NONBLOCK) != 0 ||
	    dup2(srv[0], other) != other)
		return;
	/* Before the close: the new fds do not take the closed fd's number. */
	new_cli = socket(AF_INET, SOCK_STREAM, 0);
	if (new_cli < 0 || connect(new_cli, (struct sockaddr *)&addr, sizeof(addr)) != 0)
		return;
	new_srv = accept(lst, NULL, NULL);
	if (new_srv < 0 || close(extra) != 0)
		return;
	set_late = 1;
	ft_write_all(1, "SET\n", 4);
}

/* The local port of the peer of fd's connection, from fd's side. */
static int peer_port(int fd)
{
	struct sockaddr_in a;
	socklen_t l = sizeof(a);
	if (getpeername(fd, (struct sockaddr *)&a, &l) != 0)
		return -1;
	return ntohs(a.sin_port);
}

static int local_port(int fd)
{
	struct sockaddr_in a;
	socklen_t l = sizeof(a);
	if (getsockname(fd, (struct sockaddr *)&a, &l) != 0)
		return -1;
	return ntohs(a.sin_port);
}

static void exchange(int a, int b, const char *what)
{
	char buf[4];
	if (write(a, "ping", 4) != 4 || write(b, "pong", 4) != 4)
		ft_fail("%s: write after restore: %s", what, strerror(errno));
	if (read(b, buf, 4) != 4 || memcmp(buf, "ping", 4) != 0)
		ft_fail("%s: did not read ping", what);
	if (read(a, buf, 4) != 4 || memcmp(buf, "pong", 4) != 0)
		ft_fail("%s: did not read pong", what);
}

int main(void)
{
	ft_init();
	lst = socket(AF_INET, SOCK_STREAM, 0);
	int one = 1;
	addr.sin_family = AF_INET;
	addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	socklen_t al = sizeof(addr);
	if (lst < 0 || setsockopt(lst, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
	    bind(lst, (struct sockaddr *)&addr, sizeof(addr)) != 0 || listen(lst, 4) != 0 ||
	    getsockname(lst, (struct sockaddr *)&addr, &al) != 0)
		ft_die("listen: %s", strerror(errno));
	for (int i = 0; i < 3; i++)
		pair(&cli[i], &srv[i]);
	other = dup(srv[2]);
	extra = dup(srv[1]);
	if (other < 0 || extra < 0)
		ft_die("dup: %s", strerror(errno));
	struct sigaction sa = { .sa_handler = on_usr1 };
	FT_SYS(sigaction(SIGUSR1, &sa, NULL));
	ft_ready();
	ft_wait_restored();

	int late = set_late;
	FT_EQ(fcntl(srv[0], F_GETFD) & FD_CLOEXEC, late ? FD_CLOEXEC : 0, "srv[0] FD_CLOEXEC");
	FT_EQ(fcntl(srv[1], F_GETFL) & O_NONBLOCK, late ? O_NONBLOCK : 0, "srv[1] O_NONBLOCK");
	FT_EQ(fcntl(srv[2], F_GETFL) & O_NONBLOCK, 0, "srv[2] O_NONBLOCK");
	/* Which connection the dup2'ed fd holds: its peer is that client. */
	int held = late ? 0 : 2;
	FT_EQ(peer_port(other), local_port(cli[held]), "the dup2'ed fd's peer port");
	if (late) {
		FT_EQ(fcntl(extra, F_GETFD) == -1 && errno == EBADF, 1, "the closed fd is closed");
		FT_EQ(peer_port(new_srv), local_port(new_cli), "the new connection's peer port");
		exchange(new_cli, new_srv, "the connection accepted late");
	} else {
		FT_EQ(peer_port(extra), local_port(cli[1]), "the second fd's peer port");
	}
	ft_log("fds changed while checkpointing: %s", late ? "yes" : "no");
	/* O_NONBLOCK on srv[1]: its read finds the ping written first. */
	for (int i = 0; i < 3; i++)
		exchange(cli[i], srv[i], "a connection");
	return ft_finish();
}
