/* bench/migrate_echo_server.c: an epoll echo server for bench/migrate.py.
 *
 *   migrate_echo_server ADDR PORT
 *
 * Single-threaded, level-triggered epoll: every byte a client sends comes
 * back on the same connection, in order (what cannot be written at once is
 * kept per connection until the socket takes it). Prints "LISTENING <pid>"
 * when it accepts connections. Raises its descriptor limit to the hard
 * limit (10,000 connections need more than the default 1,024).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#define BUF 4096

struct conn {
	size_t len; /* bytes waiting in buf to be written back */
	char buf[BUF];
};

static struct conn **conns; /* by fd */
static int nconns_max;

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: %s ADDR PORT\n", argv[0]);
		return 2;
	}
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	getrlimit(RLIMIT_NOFILE, &rl);
	nconns_max = (int)rl.rlim_cur;
	conns = calloc((size_t)nconns_max, sizeof(*conns));

	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[2]))};
	if (inet_pton(AF_INET, argv[1], &sa.sin_addr) != 1) {
		fprintf(stderr, "bad address %s\n", argv[1]);
		return 2;
	}
	int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	int one = 1;
	setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(ls, (struct sockaddr *)&sa, sizeof(sa)) || listen(ls, 4096)) {
		perror("bind/listen");
		return 1;
	}
	int ep = epoll_create1(0);
	struct epoll_event ev = {.events = EPOLLIN, .data.fd = ls};
	epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
	printf("LISTENING %d\n", (int)getpid());
	fflush(stdout);

	struct epoll_event evs[256];
	for (;;) {
		int n = epoll_wait(ep, evs, 256, -1);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			perror("epoll_wait");
			return 1;
		}
		for (int i = 0; i < n; i++) {
			int fd = evs[i].data.fd;
			if (fd == ls) {
				for (;;) {
					int c = accept4(ls, NULL, NULL, SOCK_NONBLOCK);
					if (c < 0)
						break;
					if (c >= nconns_max) {
						close(c);
						continue;
					}
					conns[c] = calloc(1, sizeof(struct conn));
					struct epoll_event cev = {.events = EPOLLIN, .data.fd = c};
					epoll_ctl(ep, EPOLL_CTL_ADD, c, &cev);
				}
				continue;
			}
			struct conn *c = conns[fd];
			int dead = 0;
			if (c->len == 0 && (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))) {
				ssize_t r = read(fd, c->buf, BUF);
				if (r > 0)
					c->len = (size_t)r;
				else if (r == 0 || (errno != EAGAIN && errno != EINTR))
					dead = 1;
			}
			if (!dead && c->len > 0) {
				ssize_t w = send(fd, c->buf, c->len, MSG_NOSIGNAL);
				if (w > 0) {
					memmove(c->buf, c->buf + w, c->len - (size_t)w);
					c->len -= (size_t)w;
				} else if (w < 0 && errno != EAGAIN && errno != EINTR) {
					dead = 1;
				}
				/* wait for room to write, or for more to read */
				struct epoll_event cev = {.events = c->len ? EPOLLOUT : EPOLLIN, .data.fd = fd};
				epoll_ctl(ep, EPOLL_CTL_MOD, fd, &cev);
			}
			if (dead) {
				epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
				close(fd);
				free(c);
				conns[fd] = NULL;
			}
		}
	}
}
