/* A line server for `ferry replace --exec` tests: listens on
 * 127.0.0.1:PORT (argv[1]), answers each line it reads with
 * "VERSION PID\n" (VERSION is argv[2]) on the same connection, any number
 * of connections at once (epoll, non-blocking, one process). The line
 * "FORK" instead makes it fork a child that closes its descriptors and
 * sleeps until killed, and answers "forked CHILD_PID\n". */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAXFD 65536
static char pending[MAXFD][256];
static int pending_len[MAXFD];

static void serve(int fd, const char *reply) {
    char buf[4096];
    for (;;) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
            close(fd);
            pending_len[fd] = 0;
            return;
        }
        if (n < 0)
            return;
        for (ssize_t i = 0; i < n; i++) {
            if (buf[i] == '\n') {
                const char *answer = reply;
                char forked[64];
                if (pending_len[fd] == 4 && memcmp(pending[fd], "FORK", 4) == 0) {
                    pid_t child = fork();
                    if (child == 0) {
                        syscall(SYS_close_range, 0u, ~0u, 0u);
                        for (;;)
                            pause();
                    }
                    snprintf(forked, sizeof forked, "forked %d\n", (int)child);
                    answer = forked;
                }
                pending_len[fd] = 0;
                if (write(fd, answer, strlen(answer)) < 0) {
                    close(fd);
                    return;
                }
            } else if (pending_len[fd] < 255) {
                pending[fd][pending_len[fd]++] = buf[i];
            }
        }
    }
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s PORT VERSION\n", argv[0]);
        return 2;
    }
    char reply[128];
    snprintf(reply, sizeof reply, "%s %d\n", argv[2], (int)getpid());
    int l = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1]))};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(l, (struct sockaddr *)&a, sizeof a) < 0) {
        perror("bind");
        return 1;
    }
    if (listen(l, 128) < 0) {
        perror("listen");
        return 1;
    }
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = l};
    epoll_ctl(ep, EPOLL_CTL_ADD, l, &ev);
    struct epoll_event got[64];
    for (;;) {
        int n = epoll_wait(ep, got, 64, -1);
        for (int i = 0; i < n; i++) {
            int fd = got[i].data.fd;
            if (fd != l) {
                serve(fd, reply);
                continue;
            }
            for (;;) {
                int c = accept4(l, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                if (c < 0)
                    break;
                if (c >= MAXFD) {
                    close(c);
                    continue;
                }
                struct epoll_event cev = {.events = EPOLLIN, .data.fd = c};
                epoll_ctl(ep, EPOLL_CTL_ADD, c, &cev);
            }
        }
    }
}
