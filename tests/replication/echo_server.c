/*
 * echo_server ADDR PORT: a single-threaded TCP echo server for the
 * replication tests. Every connection carries the same byte pattern
 * (pattern() below, offset by offset from the connection's first byte);
 * the server checks each byte it reads against it and writes it back.
 * A byte out of place (a sync that captured a receive queue holding bytes
 * past its sequence number, or missing some) ends the server with status 3
 * and a line on stderr naming the offset. A failed system call ends it
 * with status 1.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_CONNS 64
#define PERIOD 1000003u

static unsigned char pattern(uint64_t n)
{
	uint64_t i = n % PERIOD;
	return (unsigned char)((i * 2654435761ull) >> 13);
}

static int write_all(int fd, const unsigned char *buf, size_t len)
{
	while (len > 0) {
		ssize_t w = write(fd, buf, len);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		buf += w;
		len -= (size_t)w;
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: echo_server ADDR PORT\n");
		return 2;
	}
	int l = socket(AF_INET, SOCK_STREAM, 0);
	int one = 1;
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[2])) };
	if (l < 0 || inet_pton(AF_INET, argv[1], &sa.sin_addr) != 1 ||
	    bind(l, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(l, 64) < 0) {
		perror("echo_server: listen");
		return 1;
	}
	printf("echo_server listening on %s:%s pid %d\n", argv[1], argv[2], getpid());
	fflush(stdout);
	struct pollfd fds[MAX_CONNS + 1] = { { .fd = l, .events = POLLIN } };
	uint64_t offset[MAX_CONNS + 1] = { 0 };
	int n = 1;
	static unsigned char buf[16384];
	for (;;) {
		if (poll(fds, (nfds_t)n, -1) < 0) {
			if (errno == EINTR)
				continue;
			perror("echo_server: poll");
			return 1;
		}
		if ((fds[0].revents & POLLIN) && n <= MAX_CONNS) {
			int c = accept(l, NULL, NULL);
			if (c >= 0) {
				fds[n] = (struct pollfd){ .fd = c, .events = POLLIN };
				offset[n++] = 0;
			}
		}
		for (int i = 1; i < n; i++) {
			if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR)))
				continue;
			ssize_t r = read(fds[i].fd, buf, sizeof(buf));
			if (r < 0 && errno == EINTR)
				continue;
			if (r > 0) {
				for (ssize_t k = 0; k < r; k++) {
					if (buf[k] != pattern(offset[i] + (uint64_t)k)) {
						fprintf(stderr, "echo_server: byte %llu of a connection is %u, not %u\n",
							(unsigned long long)(offset[i] + (uint64_t)k), buf[k],
							pattern(offset[i] + (uint64_t)k));
						return 3;
					}
				}
				offset[i] += (uint64_t)r;
				if (write_all(fds[i].fd, buf, (size_t)r) == 0)
					continue;
			}
			close(fds[i].fd);
			fds[i] = fds[n - 1];
			offset[i] = offset[n - 1];
			n--;
			i--;
		}
	}
}
