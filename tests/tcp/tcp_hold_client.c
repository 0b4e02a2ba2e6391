/*
 * tcp_hold_client ADDR PORT N CLIENT_BYTES SERVER_BYTES
 *
 * The other end of tcp_hold_server: opens N connections, sends each one's
 * id and the first half of its stream (seed 2*id) as far as the queues
 * take it, prints READY and waits for SIGUSR2 (the server is checkpointed
 * and restored meanwhile). Then it reads the server's stream (seed 2*id+1)
 * to EOF, checking every byte, writes the rest of its own and shuts down.
 * Prints PASS and exits 0 when every connection completed without a
 * reset or a wrong byte; otherwise FAIL lines (the first 20) and a count.
 *
 * With a sixth argument PROBE_PORT, it also pings the server's probe
 * thread every millisecond from READY to 300 ms after SIGUSR2 and prints
 * the longest wait ("# probe: longest wait X ms").
 */
#include "tcp_stream.h"
#include <arpa/inet.h>
#include <netinet/in.h>
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

static size_t client_bytes, server_bytes;
static int reported;

static void fail(struct conn *c, const char *fmt, const char *what)
{
	c->failed = 1;
	if (reported++ < 20)
		ft_fail(fmt, c->id, what);
	else
		__atomic_add_fetch(&ft_failures, 1, __ATOMIC_SEQ_CST);
}

static void push(struct conn *c, size_t limit)
{
	unsigned char buf[16384];
	while (c->sent < limit && !c->failed) {
		size_t n = sizeof(buf) < limit - c->sent ? sizeof(buf) : limit - c->sent;
		for (size_t i = 0; i < n; i++)
			buf[i] = pat(2 * (uint64_t)c->id, c->sent + i);
		ssize_t w = send(c->fd, buf, n, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (w <= 0) {
			if (w < 0 && errno != EAGAIN)
				fail(c, "conn %u: send: %s", strerror(errno));
			return;
		}
		c->sent += (size_t)w;
	}
}

static void pull(struct conn *c)
{
	unsigned char buf[65536];
	while (!c->eof && !c->failed) {
		ssize_t r = recv(c->fd, buf, sizeof(buf), MSG_DONTWAIT);
		if (r == 0) {
			c->eof = 1;
			if (c->got != server_bytes)
				fail(c, "conn %u: %s", "early EOF");
			return;
		}
		if (r < 0) {
			if (errno != EAGAIN)
				fail(c, "conn %u: recv: %s", strerror(errno));
			return;
		}
		for (ssize_t i = 0; i < r; i++)
			if (buf[i] != pat(2 * (uint64_t)c->id + 1, c->got + (size_t)i)) {
				fail(c, "conn %u: %s", "a byte differs");
				return;
			}
		c->got += (size_t)r;
	}
}

int main(int argc, char **argv)
{
	ft_init();
	if (argc != 6 && argc != 7)
		ft_die("usage: tcp_hold_client ADDR PORT N CLIENT_BYTES SERVER_BYTES [PROBE_PORT]");
	int n = atoi(argv[3]);
	client_bytes = strtoull(argv[4], NULL, 10);
	server_bytes = strtoull(argv[5], NULL, 10);
	raise_fd_limit();
	struct sockaddr_storage ss;
	socklen_t sl;
	int fam = parse_addr(argv[1], argv[2], &ss, &sl);
	struct conn *conns = calloc((size_t)n + 1, sizeof(*conns));
	if (!conns)
		ft_die("calloc");
	for (int i = 0; i < n; i++) {
		int fd = (int)FT_SYS(socket(fam, SOCK_STREAM, 0));
		if (connect(fd, (struct sockaddr *)&ss, sl) != 0)
			ft_die("connect %d: %s", i, strerror(errno));
		uint32_t id = (uint32_t)i;
		if (send(fd, &id, sizeof(id), 0) != sizeof(id))
			ft_die("send id %d: %s", i, strerror(errno));
		conns[i] = (struct conn){ .fd = fd, .id = id };
		push(&conns[i], client_bytes / 2);
	}
	pthread_t probe_thread;
	struct probe *probe = argc == 7 ? probe_start(argv[1], argv[6], &probe_thread) : NULL;
	ft_ready();
	ft_wait_restored();
	if (probe) {
		/* The answers held up by the pause arrive in the next moments;
		 * stopped before the streams end, the probe never races the
		 * server's exit. */
		ft_sleep_ms(300);
		probe_finish(probe, probe_thread);
	}
	double t0 = ft_mono(), deadline = t0 + 120;
	int done = 0;
	while (done < n && ft_mono() < deadline) {
		done = 0;
		int progress = 0;
		for (int i = 0; i < n; i++) {
			struct conn *c = &conns[i];
			if (c->failed || (c->eof && c->shut)) {
				done++;
				continue;
			}
			size_t g = c->got, s = c->sent;
			pull(c);
			push(c, client_bytes);
			if (c->sent == client_bytes && !c->shut && !c->failed) {
				shutdown(c->fd, SHUT_WR);
				c->shut = 1;
			}
			progress |= g != c->got || s != c->sent;
		}
		if (!progress)
			ft_sleep_ms(1);
	}
	int ok = 0;
	for (int i = 0; i < n; i++)
		ok += !conns[i].failed && conns[i].eof && conns[i].shut;
	ft_log("# %d of %d connections complete in %.1f ms", ok, n, (ft_mono() - t0) * 1e3);
	if (ok != n)
		ft_fail("%d connections failed or did not finish", n - ok);
	return ft_finish();
}
