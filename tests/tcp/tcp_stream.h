/*
 * What tcp_hold_server and tcp_hold_client share: the byte pattern of each
 * connection's stream and the parsing of ADDR PORT arguments.
 */
#ifndef FERRY_TCP_STREAM_H
#define FERRY_TCP_STREAM_H
#include "../conformance/ferry_test.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/socket.h>

/* Byte i of stream `seed`: the client's stream of connection id is seed
 * 2*id, the server's 2*id+1. */
static FT_UNUSED unsigned char pat(uint64_t seed, size_t i)
{
	return (unsigned char)(ft_pat(seed, i / 8) >> (8 * (i % 8)));
}

/* Fills *ss from "ADDR" (IPv4 or IPv6) and "PORT"; returns the family. */
static FT_UNUSED int parse_addr(const char *addr, const char *port, struct sockaddr_storage *ss, socklen_t *sl)
{
	memset(ss, 0, sizeof(*ss));
	int fam = strchr(addr, ':') ? AF_INET6 : AF_INET;
	if (fam == AF_INET) {
		struct sockaddr_in *a = (struct sockaddr_in *)ss;
		a->sin_family = AF_INET;
		a->sin_port = htons((uint16_t)atoi(port));
		if (inet_pton(AF_INET, addr, &a->sin_addr) != 1)
			ft_die("bad address %s", addr);
		*sl = sizeof(*a);
	} else {
		struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;
		a->sin6_family = AF_INET6;
		a->sin6_port = htons((uint16_t)atoi(port));
		if (inet_pton(AF_INET6, addr, &a->sin6_addr) != 1)
			ft_die("bad address %s", addr);
		*sl = sizeof(*a);
	}
	return fam;
}

/* 10,000 connections need more than the default 1,024 descriptors; the
 * hard limit decides how far this gets. */
static FT_UNUSED void raise_fd_limit(void)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
}
/* The probe: one more connection, on its own port, that the client uses
 * as a user would, a request every millisecond, answered at once by a
 * thread of the server. Its longest wait is what a client sees of the
 * checkpoint and restore, measured with the client's own clock. */
struct probe {
	struct sockaddr_storage ss;
	socklen_t sl;
	int fd;
	volatile int stop;
	double longest_ms;
	long pings;
};

static void *probe_echo(void *arg)
{
	struct probe *p = arg;
	int one = 1;
	int l = socket(p->ss.ss_family, SOCK_STREAM, 0);
	if (l < 0 || setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
	    bind(l, (struct sockaddr *)&p->ss, p->sl) != 0 || listen(l, 1) != 0)
		ft_die("probe listener: %s", strerror(errno));
	int fd = accept(l, NULL, NULL);
	if (fd < 0)
		ft_die("probe accept: %s", strerror(errno));
	close(l);
	char buf[8];
	while (recv(fd, buf, sizeof(buf), MSG_WAITALL) == sizeof(buf))
		if (send(fd, buf, sizeof(buf), MSG_NOSIGNAL) != sizeof(buf))
			break;
	close(fd);
	return NULL;
}

static void *probe_ping(void *arg)
{
	struct probe *p = arg;
	char buf[8] = "ping....";
	while (!p->stop) {
		double t = ft_mono();
		ssize_t r = -1;
		if (send(p->fd, buf, sizeof(buf), MSG_NOSIGNAL) == sizeof(buf))
			r = recv(p->fd, buf, sizeof(buf), MSG_WAITALL);
		if (r != sizeof(buf)) {
			ft_fail("probe connection: %s", r < 0 ? strerror(errno) : "short answer");
			return NULL;
		}
		double ms = (ft_mono() - t) * 1e3;
		if (ms > p->longest_ms)
			p->longest_ms = ms;
		p->pings++;
		ft_sleep_ms(1);
	}
	return NULL;
}

/* Server side: answers the probe on PORT from a thread of its own, until
 * the client closes it; join the thread before exiting, so that the
 * client's last request is answered. */
static FT_UNUSED pthread_t probe_serve(const char *addr, const char *port)
{
	static struct probe p;
	pthread_t t;
	parse_addr(addr, port, &p.ss, &p.sl);
	if (pthread_create(&t, NULL, probe_echo, &p) != 0)
		ft_die("probe thread");
	return t;
}

/* Client side: connects to PORT and pings until probe_finish(). */
static FT_UNUSED struct probe *probe_start(const char *addr, const char *port, pthread_t *t)
{
	static struct probe p;
	int fam = parse_addr(addr, port, &p.ss, &p.sl);
	p.fd = socket(fam, SOCK_STREAM, 0);
	double deadline = ft_mono() + 10;
	while (connect(p.fd, (struct sockaddr *)&p.ss, p.sl) != 0) {
		if (ft_mono() > deadline)
			ft_die("probe connect: %s", strerror(errno));
		close(p.fd);
		p.fd = socket(fam, SOCK_STREAM, 0);
		ft_sleep_ms(10);
	}
	if (pthread_create(t, NULL, probe_ping, &p) != 0)
		ft_die("probe thread");
	return &p;
}

static FT_UNUSED void probe_finish(struct probe *p, pthread_t t)
{
	p->stop = 1;
	pthread_join(t, NULL);
	close(p->fd);
	ft_log("# probe: longest wait %.1f ms over %ld requests", p->longest_ms, p->pings);
}
#endif
