/*
 * probe_server: a one-process TCP server for the `ferry replace` tests.
 * It answers over connections that outlive a replacement, so a test can
 * ask the new tree what it sees from the inside.
 *
 * Usage: probe_server PORT [own-filter | bind-unix PATH | threads | own-uts NAME]
 *   Listens on 127.0.0.1:PORT. With own-filter it first installs a seccomp
 *   filter of its own (allow everything, with no_new_privs), so a filter
 *   stacked by a replacement comes on top of one the service already had.
 *   With bind-unix it also holds a unix socket bound to PATH, which a
 *   trial restore cannot make while the server holds it. With threads it
 *   starts two more threads that wait in pause(2), so that per-thread
 *   state (nice, CPU affinity) is checked on more than one thread. With
 *   own-uts it first moves into a new UTS namespace (unshare) and sets
 *   its hostname to NAME and its domainname to NAME.test.
 *
 * One command per line, one reply line each:
 *   INCR  -> the counter plus one (the first INCR answers 1)
 *   PPID  -> what getppid(2) returned: the number, or E<errno>
 *   PING  -> PONG
 *   UNAME -> the nodename and domainname uname(2) returns, one space between
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/utsname.h>
#include <unistd.h>

#define MAX_CONNS 32

static long counter;

static void own_filter(void)
{
    struct sock_filter allow[] = {BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)};
    struct sock_fprog prog = {.len = 1, .filter = allow};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) != 0) {
        perror("seccomp");
        exit(1);
    }
}

static void answer(int fd, const char *cmd)
{
    char out[160];
    if (strcmp(cmd, "INCR") == 0) {
        snprintf(out, sizeof out, "%ld\n", ++counter);
    } else if (strcmp(cmd, "PPID") == 0) {
        long r = syscall(SYS_getppid);
        if (r < 0)
            snprintf(out, sizeof out, "E%d\n", errno);
        else
            snprintf(out, sizeof out, "%ld\n", r);
    } else if (strcmp(cmd, "PING") == 0) {
        snprintf(out, sizeof out, "PONG\n");
    } else if (strcmp(cmd, "UNAME") == 0) {
        struct utsname u;
        if (uname(&u) != 0)
            snprintf(out, sizeof out, "E%d\n", errno);
        else
            snprintf(out, sizeof out, "%.64s %.64s\n", u.nodename, u.domainname);
    } else {
        snprintf(out, sizeof out, "ERR\n");
    }
    size_t len = strlen(out), done = 0;
    while (done < len) {
        ssize_t n = write(fd, out + done, len - done);
        if (n <= 0)
            return;
        done += n;
    }
}

static void *waiter(void *arg)
{
    (void)arg;
    for (;;)
        pause();
    return NULL;
}

static void own_uts(const char *name)
{
    char domain[80];
    snprintf(domain, sizeof domain, "%s.test", name);
    if (unshare(CLONE_NEWUTS) != 0 || sethostname(name, strlen(name)) != 0 ||
        setdomainname(domain, strlen(domain)) != 0) {
        perror("own UTS namespace");
        exit(1);
    }
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    if (argc > 3 && strcmp(argv[2], "own-uts") == 0)
        own_uts(argv[3]);
    if (argc > 2 && strcmp(argv[2], "threads") == 0) {
        for (int i = 0; i < 2; i++) {
            pthread_t t;
            if (pthread_create(&t, NULL, waiter, NULL) != 0) {
                perror("pthread_create");
                return 1;
            }
        }
    }
    if (argc > 2 && strcmp(argv[2], "own-filter") == 0)
        own_filter();
    if (argc > 3 && strcmp(argv[2], "bind-unix") == 0) {
        int u = socket(AF_UNIX, SOCK_STREAM, 0);
        struct sockaddr_un ua = {.sun_family = AF_UNIX};
        strncpy(ua.sun_path, argv[3], sizeof ua.sun_path - 1);
        if (u < 0 || bind(u, (struct sockaddr *)&ua, sizeof ua) != 0 || listen(u, 1) != 0) {
            perror("unix socket");
            return 1;
        }
    }
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1]))};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(lfd, (struct sockaddr *)&a, sizeof a) != 0 || listen(lfd, 16) != 0) {
        perror("listen");
        return 1;
    }
    struct pollfd p[MAX_CONNS + 1];
    char buf[MAX_CONNS + 1][256];
    size_t used[MAX_CONNS + 1];
    int n = 1;
    p[0].fd = lfd;
    p[0].events = POLLIN;
    for (;;) {
        if (poll(p, n, -1) < 0)
            continue;
        if ((p[0].revents & POLLIN) && n <= MAX_CONNS) {
            int c = accept(lfd, NULL, NULL);
            if (c >= 0) {
                p[n].fd = c;
                p[n].events = POLLIN;
                p[n].revents = 0;
                used[n] = 0;
                n++;
            }
        }
        for (int i = 1; i < n; i++) {
            if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            ssize_t r = read(p[i].fd, buf[i] + used[i], sizeof buf[i] - 1 - used[i]);
            if (r <= 0) {
                close(p[i].fd);
                p[i] = p[n - 1];
                memcpy(buf[i], buf[n - 1], used[n - 1]);
                used[i] = used[n - 1];
                n--;
                i--;
                continue;
            }
            used[i] += r;
            char *start = buf[i], *nl;
            while ((nl = memchr(start, '\n', buf[i] + used[i] - start))) {
                *nl = 0;
                if (nl > start && nl[-1] == '\r')
                    nl[-1] = 0;
                answer(p[i].fd, start);
                start = nl + 1;
            }
            used[i] -= start - buf[i];
            memmove(buf[i], start, used[i]);
            if (used[i] == sizeof buf[i] - 1)
                used[i] = 0;
        }
    }
}
