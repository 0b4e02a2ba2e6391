/*
 * tcp_hold_server ADDR PORT N CLIENT_BYTES SERVER_BYTES
 *
 * A server that holds N established connections with data in flight both
 * ways while it is checkpointed, then checks every byte.
 *
 * Each client connects, sends a 4-byte connection id, then a patterned
 * stream of CLIENT_BYTES (seed 2*id) and shuts down its sending side; the
 * server sends SERVER_BYTES of its own pattern (seed 2*id+1) and shuts
 * down too. Before the checkpoint the server reads only the ids (so the
 * client's data waits unread in its receive queues) and writes half of
 * its stream or until the send queue is full (so its send queues hold
 * unacknowledged and unsent data). It prints READY and waits for SIGUSR2
 * (the checkpoint and restore happen then). Afterwards it serves every
 * connection with epoll: every client byte is checked, in order, and the
 * rest of its own stream is written. It prints PASS and exits 0 when all
 * N connections delivered exactly CLIENT_BYTES and an EOF, without any
 * error; otherwise FAIL lines and exit 1. Gives up after 120 s.
 *
 * With a sixth argument PROBE_PORT, a thread answers the probe connection
 * of tcp_stream.h on that port (the client's longest wait).
 */
#include "tcp_stream.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>

struct conn {
	int fd;
	uint32_t id;
	size_t got, sent;
	int eof, shut, failed;
};

static size_t server_bytes, client_bytes;

static void write_some(struct conn *c, size_t limit)
{
	unsigned char buf[16384];
	while (c->sent < limit) {
		size_t n = sizeof(buf);
		if (n > limit - c->sent)
			n = limit - c->sent;
		for (size_t i = 0; i < n; i++)
			buf[i] = pat(2 * (uint64_t)c->id + 1, c->sent + i);
		ssize_t w = send(c->fd, buf, n, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (w <= 0) {
			if (w < 0 && errno != EAGAIN && !c->failed) {
				ft_fail("conn %u: send after %zu bytes: %s", c->id, c->sent, strerror(errno));
				c->failed = 1;
			}
			return;
		}
		c->sent += (size_t)w;
	}
}

static void read_some(struct conn *c)
{
	unsigned char buf[16384];
	for (;;) {
		ssize_t r = recv(c->fd, buf, sizeof(buf), MSG_DONTWAIT);
		if (r == 0) {
			if (c->got != client_bytes && !c->failed) {
				ft_fail("conn %u: EOF after %zu of %zu bytes", c->id, c->got, client_bytes);
				c->failed = 1;
			}
			c->eof = 1;
			return;
		}
		if (r < 0) {
			if (errno != EAGAIN && !c->failed) {
				ft_fail("conn %u: recv after %zu bytes: %s", c->id, c->got, strerror(errno));
				c->failed = 1;
				c->eof = 1;
			}
			return;
		}
		for (ssize_t i = 0; i < r && !c->failed; i++)
			if (buf[i] != pat(2 * (uint64_t)c->id, c->got + (size_t)i)) {
				ft_fail("conn %u: byte %zu differs", c->id, c->got + (size_t)i);
				c->failed = 1;
			}
		c->got += (size_t)r;
	}
}

int main(int argc, char **argv)
{
	ft_init();
	if (argc != 6 && argc != 7)
		ft_die("usage: tcp_hold_server ADDR PORT N CLIENT_BYTES SERVER_BYTES [PROBE_PORT]");
	int n = atoi(argv[3]);
	client_bytes = strtoull(argv[4], NULL, 10);
	server_bytes = strtoull(argv[5], NULL, 10);
	struct sockaddr_storage ss;
	socklen_t sl;
	int fam = parse_addr(argv[1], argv[2], &ss, &sl);
	raise_fd_limit();
	int one = 1;
	int l = (int)FT_SYS(socket(fam, SOCK_STREAM, 0));
	FT_SYS(setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)));
	FT_SYS(bind(l, (struct sockaddr *)&ss, sl));
	FT_SYS(listen(l, 4096));
	pthread_t probe = 0;
	if (argc == 7)
		probe = probe_serve(argv[1], argv[6]);
	ft_write_all(1, "LISTENING\n", 10);

	struct conn *conns = calloc((size_t)n, sizeof(*conns));
	if (!conns)
		ft_die("calloc");
	double deadline = ft_mono() + 60;
	for (int i = 0; i < n; i++) {
		int fd = accept(l, NULL, NULL);
		if (fd < 0)
			ft_die("accept %d: %s", i, strerror(errno));
		uint32_t id;
		if (recv(fd, &id, sizeof(id), MSG_WAITALL) != sizeof(id))
			ft_die("reading the id of connection %d: %s", i, strerror(errno));
		if (id >= (uint32_t)n || conns[id].fd)
			ft_die("bad connection id %u", id);
		conns[id].fd = fd;
		conns[id].id = id;
		if (ft_mono() > deadline)
			ft_die("only %d of %d connections within 60 s", i, n);
	}
	for (int i = 0; i < n; i++)
		write_some(&conns[i], server_bytes / 2);
	ft_log("# %d connections, %zu bytes in the server's send queues", n, ({
		       size_t t = 0;
		       for (int i = 0; i < n; i++)
			       t += conns[i].sent;
		       t;
	       }));
	ft_ready();
	ft_wait_restored();

	int ep = (int)FT_SYS(epoll_create1(0));
	for (int i = 0; i < n; i++) {
		struct epoll_event ev = { .events = EPOLLIN | EPOLLOUT | EPOLLET, .data.u32 = (uint32_t)i };
		FT_SYS(epoll_ctl(ep, EPOLL_CTL_ADD, conns[i].fd, &ev));
	}
	int done = 0;
	deadline = ft_mono() + 120;
	struct epoll_event evs[256];
	while (done < n && ft_mono() < deadline) {
		int k = epoll_wait(ep, evs, 256, 200);
		for (int e = 0; e < k; e++) {
			struct conn *c = &conns[evs[e].data.u32];
			if (c->shut && c->eof)
				continue;
			read_some(c);
			write_some(c, server_bytes);
			if (c->sent == server_bytes && !c->shut) {
				shutdown(c->fd, SHUT_WR);
				c->shut = 1;
			}
			if ((c->shut || c->failed) && c->eof)
				done++;
		}
	}
	int ok = 0;
	for (int i = 0; i < n; i++) {
		struct conn *c = &conns[i];
		if (!c->failed && c->eof && c->shut && c->got == client_bytes)
			ok++;
		else if (!c->failed)
			ft_fail("conn %u: unfinished: got %zu of %zu, sent %zu of %zu", c->id, c->got, client_bytes, c->sent,
				server_bytes);
	}
	ft_log("# %d of %d connections complete", ok, n);
	if (probe)
		pthread_join(probe, NULL);
	return ft_finish();
}
