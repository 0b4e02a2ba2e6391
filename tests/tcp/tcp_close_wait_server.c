/*
 * tcp_close_wait_server ADDR PORT
 *
 * A server holding a connection whose client sent its request and shut
 * down its sending side (HTTP/1.0 style) while the server has read none of
 * it: the connection is in CLOSE_WAIT with the request unread. Prints
 * LISTENING, accepts one connection, waits until it is in CLOSE_WAIT,
 * prints READY and waits for SIGUSR2 (checkpoint and restore happen then).
 * Afterwards it reads the request to EOF, checks every byte (stream seed 7
 * of tcp_stream.h), answers "GOT <bytes>\n" and closes; PASS and exit 0,
 * or FAIL lines and exit 1.
 */
#include "tcp_stream.h"
#include <netinet/tcp.h>
#include <poll.h>

static int tcp_state(int fd)
{
	struct tcp_info ti;
	socklen_t tl = sizeof(ti);
	FT_SYS(getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &tl));
	return ti.tcpi_state;
}

int main(int argc, char **argv)
{
	ft_init();
	if (argc != 3)
		ft_die("usage: tcp_close_wait_server ADDR PORT");
	struct sockaddr_storage ss;
	socklen_t sl;
	int fam = parse_addr(argv[1], argv[2], &ss, &sl);
	int one = 1;
	int l = (int)FT_SYS(socket(fam, SOCK_STREAM, 0));
	FT_SYS(setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)));
	FT_SYS(bind(l, (struct sockaddr *)&ss, sl));
	FT_SYS(listen(l, 1));
	ft_write_all(1, "LISTENING\n", 10);
	int c = (int)FT_SYS(accept(l, NULL, NULL));
	double deadline = ft_mono() + 30;
	while (tcp_state(c) != TCP_CLOSE_WAIT) {
		if (ft_mono() > deadline)
			ft_die("the client did not shut down its side within 30 s");
		ft_sleep_ms(2);
	}
	ft_ready();
	ft_wait_restored();
	FT_EQ(tcp_state(c), TCP_CLOSE_WAIT, "state after restore");
	size_t got = 0;
	unsigned char buf[16384];
	for (;;) {
		struct pollfd p = { .fd = c, .events = POLLIN };
		if (poll(&p, 1, 5000) != 1) {
			ft_fail("no EOF within 5 s after %zu bytes", got);
			break;
		}
		ssize_t r = read(c, buf, sizeof(buf));
		if (r == 0)
			break;
		if (r < 0) {
			ft_fail("read after %zu bytes: %s", got, strerror(errno));
			break;
		}
		for (ssize_t i = 0; i < r; i++)
			if (buf[i] != pat(7, got + (size_t)i)) {
				ft_fail("request byte %zu differs", got + (size_t)i);
				break;
			}
		got += (size_t)r;
	}
	char reply[64];
	int n = snprintf(reply, sizeof(reply), "GOT %zu\n", got);
	if (write(c, reply, (size_t)n) != n)
		ft_fail("writing the answer: %s", strerror(errno));
	close(c);
	return ft_finish();
}
