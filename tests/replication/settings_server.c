/* settings_server ADDR PORT: a line server for replication tests, each
 * command a setting changed between syncs and read back after a
 * failover. On each connection:
 *   "keepidle N"  sets SO_KEEPALIVE and TCP_KEEPIDLE N on that connection;
 *   "slack N"     sets the thread's timer slack (PR_SET_TIMERSLACK);
 *   "action"      installs a SIGUSR1 handler;
 *   "altstack"    sets an alternate signal stack of 65536 bytes;
 *   "cloexec"     sets that connection's close-on-exec flag (F_SETFD);
 *   "owner"       makes this process that connection's owner (F_SETOWN);
 * each answering "ok" (or "error"). "get" answers "keepalive A keepidle
 * N" as getsockopt reads them now, "state" answers "slack S action A
 * altstack Z" (state ferry reads by calls injected into the process),
 * "fd" answers "cloexec C owner O" for that connection (O "self" when
 * F_GETOWN names this process, else its number).
 * One thread, poll(). Prints "listening" once it listens. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX 32

static void on_usr1(int sig) { (void)sig; }

/* A setting changed: 1, or 0 when the call failed; -1: not a change. */
static int change(int fd, const char *line) {
    int v = 0;
    long slack = 0;
    if (sscanf(line, "keepidle %d", &v) == 1) {
        int one = 1;
        return !setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one) &&
               !setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &v, sizeof v);
    }
    if (sscanf(line, "slack %ld", &slack) == 1)
        return prctl(PR_SET_TIMERSLACK, slack, 0, 0, 0) == 0;
    if (strcmp(line, "action") == 0) {
        struct sigaction sa = {.sa_handler = on_usr1, .sa_flags = SA_RESTART};
        return sigaction(SIGUSR1, &sa, NULL) == 0;
    }
    if (strcmp(line, "cloexec") == 0)
        return fcntl(fd, F_SETFD, FD_CLOEXEC) == 0;
    if (strcmp(line, "owner") == 0)
        return fcntl(fd, F_SETOWN, getpid()) == 0;
    if (strcmp(line, "altstack") == 0) {
        stack_t ss = {.ss_sp = malloc(65536), .ss_size = 65536};
        return ss.ss_sp && sigaltstack(&ss, NULL) == 0;
    }
    return -1;
}

static void answer(int fd, const char *line) {
    char out[128];
    int changed = change(fd, line);
    if (changed >= 0) {
        snprintf(out, sizeof out, changed ? "ok\n" : "error\n");
    } else if (strcmp(line, "state") == 0) {
        struct sigaction sa;
        stack_t ss;
        sigaction(SIGUSR1, NULL, &sa);
        sigaltstack(NULL, &ss);
        snprintf(out, sizeof out, "slack %d action %d altstack %zu\n",
                 prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0), sa.sa_handler == on_usr1,
                 (ss.ss_flags & SS_DISABLE) ? (size_t)0 : ss.ss_size);
    } else if (strcmp(line, "fd") == 0) {
        int owner = fcntl(fd, F_GETOWN);
        char who[32];
        if (owner == getpid())
            snprintf(who, sizeof who, "self");
        else
            snprintf(who, sizeof who, "%d", owner);
        snprintf(out, sizeof out, "cloexec %d owner %s\n",
                 (fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0, who);
    } else {
        int alive = -1, idle = -1;
        socklen_t l = sizeof alive;
        getsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &alive, &l);
        l = sizeof idle;
        getsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, &l);
        snprintf(out, sizeof out, "keepalive %d keepidle %d\n", alive, idle);
    }
    if (write(fd, out, strlen(out)) < 0)
        perror("write");
}

int main(int argc, char **argv) {
    if (argc != 3)
        return 2;
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
    inet_pton(AF_INET, argv[1], &a.sin_addr);
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 16)) {
        perror("bind/listen");
        return 1;
    }
    printf("listening\n");
    fflush(stdout);
    struct pollfd p[MAX + 1] = {{.fd = l, .events = POLLIN}};
    char buf[MAX + 1][256];
    size_t have[MAX + 1] = {0};
    int n = 1;
    for (;;) {
        if (poll(p, n, -1) < 0)
            continue;
        if ((p[0].revents & POLLIN) && n <= MAX) {
            int c = accept(l, NULL, NULL);
            if (c >= 0) {
                p[n] = (struct pollfd){.fd = c, .events = POLLIN};
                have[n++] = 0;
            }
        }
        for (int i = 1; i < n; i++) {
            if (!(p[i].revents & (POLLIN | POLLHUP)))
                continue;
            ssize_t r = read(p[i].fd, buf[i] + have[i], sizeof buf[i] - 1 - have[i]);
            if (r <= 0) {
                close(p[i].fd);
                p[i] = p[--n];
                have[i] = have[n];
                memcpy(buf[i], buf[n], have[n]);
                i--;
                continue;
            }
            have[i] += r;
            char *nl;
            while ((nl = memchr(buf[i], '\n', have[i]))) {
                *nl = 0;
                answer(p[i].fd, buf[i]);
                size_t used = nl + 1 - buf[i];
                memmove(buf[i], nl + 1, have[i] - used);
                have[i] -= used;
            }
        }
    }
}
