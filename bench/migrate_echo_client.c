/* bench/migrate_echo_client.c: N connections with traffic to an echo
 * server, for bench/migrate.py.
 *
 *   migrate_echo_client ADDR PORT N RATE
 *
 * Opens N connections to ADDR:PORT, checks one echo on each, prints
 * "READY", then sends RATE messages per second in total (16 bytes each:
 * connection id, sequence number and a pattern of both), round-robin over
 * the connections that have no message in flight, and checks every echo
 * byte for byte. On SIGUSR1 it stops that traffic, waits for what is in
 * flight, sends one more message on every connection and waits up to 20 s
 * for all of them. Then it prints
 *
 *   RESULT conns=N ok=K broken=B msgs=M max_rtt_ms=X
 *
 * (broken: a connection that was reset, closed, gave a wrong byte or no
 * echo in time; max_rtt_ms: the longest time a message waited for its echo,
 * i.e. the longest stall any client saw) and exits 0 if B is 0. Gives up
 * after 30 minutes.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MSG 16

struct conn {
	int fd;
	uint32_t seq;     /* of the message in flight / last sent */
	int inflight;     /* a message waits for its echo */
	int broken;
	size_t got;       /* bytes of the echo received so far */
	double sent_at;
	unsigned char want[MSG];
};

static volatile sig_atomic_t stop_requested;
static void on_usr1(int s) { (void)s; stop_requested = 1; }

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint64_t pat(uint64_t a, uint64_t b)
{
	uint64_t x = a * 0x9E3779B97F4A7C15ULL + b * 0xBF58476D1CE4E5B9ULL + 0x1234567ULL;
	x ^= x >> 31;
	x *= 0x94D049BB133111EBULL;
	x ^= x >> 29;
	return x;
}

static struct conn *conns;
static int n, ep, nbroken;
static unsigned long long msgs;
static double max_rtt;

static void mark_broken(struct conn *c, const char *why)
{
	if (c->broken)
		return;
	c->broken = 1;
	nbroken++;
	if (nbroken <= 5)
		fprintf(stderr, "conn %ld broken: %s\n", (long)(c - conns), why);
	epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
	close(c->fd);
}

static void send_one(struct conn *c)
{
	uint32_t id = (uint32_t)(c - conns);
	c->seq++;
	memcpy(c->want, &id, 4);
	memcpy(c->want + 4, &c->seq, 4);
	uint64_t p = pat(id, c->seq);
	memcpy(c->want + 8, &p, 8);
	ssize_t w = send(c->fd, c->want, MSG, MSG_NOSIGNAL | MSG_DONTWAIT);
	if (w != MSG) {
		/* 16 bytes into an empty send queue: anything else is an error */
		mark_broken(c, w < 0 ? strerror(errno) : "short send");
		return;
	}
	c->inflight = 1;
	c->got = 0;
	c->sent_at = now();
}

static void on_readable(struct conn *c)
{
	unsigned char buf[MSG];
	for (;;) {
		ssize_t r = recv(c->fd, buf, sizeof(buf), MSG_DONTWAIT);
		if (r < 0 && (errno == EAGAIN || errno == EINTR))
			return;
		if (r <= 0) {
			mark_broken(c, r == 0 ? "closed by the server" : strerror(errno));
			return;
		}
		if (!c->inflight || c->got + (size_t)r > MSG || memcmp(buf, c->want + c->got, (size_t)r)) {
			mark_broken(c, "wrong bytes");
			return;
		}
		c->got += (size_t)r;
		if (c->got == MSG) {
			double rtt = now() - c->sent_at;
			if (rtt > max_rtt)
				max_rtt = rtt;
			c->inflight = 0;
			msgs++;
		}
	}
}

static int inflight_count(void)
{
	int k = 0;
	for (int i = 0; i < n; i++)
		k += !conns[i].broken && conns[i].inflight;
	return k;
}

static void poll_once(int ms)
{
	struct epoll_event evs[512];
	int k = epoll_wait(ep, evs, 512, ms);
	for (int i = 0; i < k; i++)
		on_readable(&conns[evs[i].data.u32]);
}

/* Waits until no message is in flight or `limit` s passed; returns 1 when
 * drained. */
static int drain(double limit)
{
	double end = now() + limit;
	while (inflight_count() > 0) {
		if (now() > end)
			return 0;
		poll_once(10);
	}
	return 1;
}

int main(int argc, char **argv)
{
	if (argc != 5) {
		fprintf(stderr, "usage: %s ADDR PORT N RATE\n", argv[0]);
		return 2;
	}
	n = atoi(argv[3]);
	double rate = atof(argv[4]);
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_usr1;
	sigaction(SIGUSR1, &sa, NULL);
	alarm(1800);

	struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[2]))};
	if (inet_pton(AF_INET, argv[1], &addr.sin_addr) != 1) {
		fprintf(stderr, "bad address %s\n", argv[1]);
		return 2;
	}
	conns = calloc((size_t)n + 1, sizeof(*conns));
	ep = epoll_create1(0);
	for (int i = 0; i < n; i++) {
		int fd = socket(AF_INET, SOCK_STREAM, 0);
		if (fd < 0) {
			fprintf(stderr, "socket %d: %s\n", i, strerror(errno));
			return 1;
		}
		if (connect(fd, (struct sockaddr *)&addr, sizeof(addr))) {
			fprintf(stderr, "connect %d: %s\n", i, strerror(errno));
			return 1;
		}
		int one = 1;
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		conns[i].fd = fd;
		struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
		epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
	}
	/* One echo on every connection before READY. */
	for (int i = 0; i < n; i++)
		send_one(&conns[i]);
	if (!drain(60) || nbroken) {
		fprintf(stderr, "not every connection echoed before READY (%d broken)\n", nbroken);
		return 1;
	}
	max_rtt = 0;
	msgs = 0;
	printf("READY %d\n", n);
	fflush(stdout);

	/* Paced traffic until SIGUSR1. */
	double start = now();
	unsigned long long sent = 0;
	int next = 0;
	while (!stop_requested) {
		double due = (now() - start) * rate;
		int tries = 0;
		while (n > 0 && (double)sent < due && tries < n) {
			struct conn *c = &conns[next];
			next = (next + 1) % n;
			tries++;
			if (c->broken || c->inflight)
				continue;
			send_one(c);
			sent++;
			tries = 0;
		}
		if ((double)sent < due - rate) /* all busy: do not pile up a backlog */
			sent = (unsigned long long)(due - rate);
		poll_once(1);
	}

	/* Check: every connection echoes one more message. */
	int drained = drain(20);
	double traffic_max_rtt = max_rtt; /* what the paced traffic saw */
	for (int i = 0; i < n; i++)
		if (!conns[i].broken) {
			if (conns[i].inflight)
				mark_broken(&conns[i], "no echo within 20 s");
			else
				send_one(&conns[i]);
		}
	(void)drained;
	if (!drain(20))
		for (int i = 0; i < n; i++)
			if (!conns[i].broken && conns[i].inflight)
				mark_broken(&conns[i], "no echo within 20 s (final message)");
	printf("RESULT conns=%d ok=%d broken=%d msgs=%llu max_rtt_ms=%.1f\n", n, n - nbroken, nbroken, msgs, traffic_max_rtt * 1e3);
	fflush(stdout);
	return nbroken ? 1 : 0;
}
