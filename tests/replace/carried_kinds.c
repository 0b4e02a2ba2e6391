/*
 * carried_kinds: holds one object of each kind `ferry replace` carries
 * over, each with state in it, for the conformance test of carried
 * descriptors (crates/ferry/tests/replace.rs,
 * every_carried_kind_is_the_same_object_with_its_state_after_replace).
 *
 * Usage: carried_kinds PORT DIR
 *   Listens on 127.0.0.1:PORT (the main listener) and on a second,
 *   ephemeral port (the backlog listener, whose waiting connection is
 *   accepted only after the replacement). The first connection on PORT
 *   is the control connection; commands, one line each:
 *     READY    -> "READY <backlog port>"
 *     ACCEPT   -> accepts the data connection waiting on PORT, writes
 *                 "S2C" to it (the client reads it only after the
 *                 replacement) and reads nothing from it; "OK"
 *     FDS      -> "name=fd ..." for every object held
 *     IDS      -> "name=dev:ino:cookie ..." (cookie: SO_COOKIE, 0 for
 *                 what is not a socket)
 *     CHECK    -> "CHECKED" once every object holds the state it was
 *                 given (read and checked now), else "FAIL <what>"
 *   After CHECK the data connection has "C2S" read from it and gets
 *   "D-OK", and the backlog connection is accepted, its "waiting" read,
 *   and it gets "B-OK".
 *
 * Objects: the two listeners, the data connection, a unix stream
 * socketpair with "to-b"/"to-a" queued, a pipe with "piped" in it, an
 * eventfd at 7, a timerfd armed (1 h, 1 h interval), a signalfd on
 * SIGUSR2, an inotify watching DIR with one IN_CREATE event queued, a
 * memfd holding "memfd-content", and an epoll watching the main
 * listener, socketpair end a, the pipe's read end, the eventfd, the
 * timerfd and the inotify. A second epoll (epoll_sig) watches the
 * signalfd and the eventfd: ferry rebuilds it (a signalfd's wakeups come
 * from the registering process), registering the carried files in the
 * new process; a signal queued after the replacement must wake it.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <unistd.h>

#ifndef SO_COOKIE
#define SO_COOKIE 57
#endif

enum { LISTEN, BACKLOG, DATA, UNIX_A, UNIX_B, PIPE_R, PIPE_W, EVENT, TIMER, SIGNAL, INOTIFY, MEMFD, EPOLL, EPOLL_SIG, N };
static const char *names[N] = {"listen", "backlog", "data", "unix_a", "unix_b", "pipe_r", "pipe_w",
                               "eventfd", "timerfd", "signalfd", "inotify", "memfd", "epoll", "epoll_sig"};
static int fds[N];
static int control = -1;
static char dir[4096];

static void die(const char *what)
{
    perror(what);
    exit(1);
}

static int listener(int port)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) || listen(s, 8))
        die("listen");
    return s;
}

static int port_of(int s)
{
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    if (getsockname(s, (struct sockaddr *)&a, &len))
        die("getsockname");
    return ntohs(a.sin_port);
}

static void put(int fd, const char *s)
{
    if (write(fd, s, strlen(s)) != (ssize_t)strlen(s))
        die("write");
}

static void setup(void)
{
    int sv[2], p[2];
    char path[4200];
    fds[BACKLOG] = listener(0);
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) || pipe(p))
        die("socketpair/pipe");
    fds[UNIX_A] = sv[0];
    fds[UNIX_B] = sv[1];
    put(sv[0], "to-b");
    put(sv[1], "to-a");
    fds[PIPE_R] = p[0];
    fds[PIPE_W] = p[1];
    put(p[1], "piped");
    fds[EVENT] = eventfd(7, EFD_NONBLOCK);
    fds[TIMER] = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK);
    struct itimerspec its = {.it_interval = {3600, 0}, .it_value = {3600, 0}};
    if (fds[EVENT] < 0 || fds[TIMER] < 0 || timerfd_settime(fds[TIMER], 0, &its, NULL))
        die("eventfd/timerfd");
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR2);
    sigprocmask(SIG_BLOCK, &set, NULL);
    fds[SIGNAL] = signalfd(-1, &set, SFD_NONBLOCK);
    fds[INOTIFY] = inotify_init1(IN_NONBLOCK);
    if (fds[SIGNAL] < 0 || fds[INOTIFY] < 0 || inotify_add_watch(fds[INOTIFY], dir, IN_CREATE) < 0)
        die("signalfd/inotify");
    snprintf(path, sizeof path, "%s/created", dir);
    int f = open(path, O_CREAT | O_WRONLY, 0600);
    if (f < 0)
        die("create");
    close(f);
    fds[MEMFD] = memfd_create("carried", 0);
    if (fds[MEMFD] < 0)
        die("memfd");
    put(fds[MEMFD], "memfd-content");
    fds[EPOLL] = epoll_create1(0);
    int watched[] = {LISTEN, UNIX_A, PIPE_R, EVENT, TIMER, INOTIFY};
    for (unsigned i = 0; i < sizeof watched / sizeof *watched; i++) {
        struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 0xE000 + watched[i]};
        if (epoll_ctl(fds[EPOLL], EPOLL_CTL_ADD, fds[watched[i]], &ev))
            die("epoll_ctl");
    }
    fds[EPOLL_SIG] = epoll_create1(0);
    struct epoll_event sev = {.events = EPOLLIN, .data.u64 = 0x5160};
    struct epoll_event eev = {.events = EPOLLIN, .data.u64 = 0xE7E7};
    if (fds[EPOLL_SIG] < 0 || epoll_ctl(fds[EPOLL_SIG], EPOLL_CTL_ADD, fds[SIGNAL], &sev) ||
        epoll_ctl(fds[EPOLL_SIG], EPOLL_CTL_ADD, fds[EVENT], &eev))
        die("epoll_sig");
}

/* The rebuilt epoll over the signalfd: quiet until a signal is queued,
 * then ready with the entry's own data. */
static const char *check_signal_epoll(void)
{
    struct epoll_event ev[2] = {{.events = EPOLLIN}};
    if (epoll_ctl(fds[EPOLL_SIG], EPOLL_CTL_ADD, fds[EVENT], &ev[0]) == 0 || errno != EEXIST)
        return "epoll_sig lost its eventfd entry";
    int n = epoll_wait(fds[EPOLL_SIG], ev, 2, 0);
    for (int i = 0; i < n; i++)
        if (ev[i].data.u64 == 0x5160)
            return "epoll_sig ready before any signal";
    union sigval v = {.sival_int = 6};
    if (sigqueue(getpid(), SIGUSR2, v))
        return "sigqueue";
    n = epoll_wait(fds[EPOLL_SIG], ev, 2, 1000);
    for (int i = 0; i < n; i++)
        if (ev[i].data.u64 == 0x5160)
            return NULL;
    return "a signal does not wake the epoll over the signalfd";
}

static void ids(char *out, size_t size)
{
    size_t n = 0;
    for (int i = 0; i < N; i++) {
        struct stat st;
        uint64_t cookie = 0;
        socklen_t len = sizeof cookie;
        if (fds[i] < 0 || fstat(fds[i], &st))
            die("fstat");
        if (S_ISSOCK(st.st_mode) && getsockopt(fds[i], SOL_SOCKET, SO_COOKIE, &cookie, &len))
            die("SO_COOKIE");
        n += snprintf(out + n, size - n, "%s%s=%lu:%lu:%lu", i ? " " : "", names[i],
                      (unsigned long)st.st_dev, (unsigned long)st.st_ino, (unsigned long)cookie);
    }
}

/* Reads exactly `want` from fd (blocking up to its timeout). */
static int read_is(int fd, const char *want)
{
    char buf[64] = {0};
    size_t len = strlen(want), got = 0;
    while (got < len) {
        ssize_t r = read(fd, buf + got, len - got);
        if (r <= 0)
            return 0;
        got += r;
    }
    return memcmp(buf, want, len) == 0;
}

static const char *check_epoll(void)
{
    /* Every registration is still there: adding it again says EEXIST. */
    int watched[] = {LISTEN, UNIX_A, PIPE_R, EVENT, TIMER, INOTIFY};
    for (unsigned i = 0; i < sizeof watched / sizeof *watched; i++) {
        struct epoll_event ev = {.events = EPOLLIN};
        if (epoll_ctl(fds[EPOLL], EPOLL_CTL_ADD, fds[watched[i]], &ev) == 0 || errno != EEXIST)
            return "epoll registration lost";
    }
    /* The eventfd (count 7) is ready, with its data. */
    struct epoll_event evs[8];
    int n = epoll_wait(fds[EPOLL], evs, 8, 0), seen = 0;
    for (int i = 0; i < n; i++)
        seen |= evs[i].data.u64 == 0xE000 + EVENT;
    return seen ? NULL : "epoll does not report the eventfd ready";
}

static const char *check(void)
{
    const char *e = check_epoll();
    if (!e)
        e = check_signal_epoll();
    if (e)
        return e;
    if (!read_is(fds[UNIX_B], "to-b") || !read_is(fds[UNIX_A], "to-a"))
        return "unix socketpair queue";
    if (!read_is(fds[PIPE_R], "piped"))
        return "pipe data";
    uint64_t count = 0;
    if (read(fds[EVENT], &count, 8) != 8 || count != 7)
        return "eventfd count";
    struct itimerspec its;
    if (timerfd_gettime(fds[TIMER], &its) || its.it_interval.tv_sec != 3600 || its.it_value.tv_sec < 3000)
        return "timerfd not armed";
    union sigval v = {.sival_int = 5};
    struct signalfd_siginfo si;
    if (sigqueue(getpid(), SIGUSR2, v) || read(fds[SIGNAL], &si, sizeof si) != sizeof si ||
        si.ssi_signo != SIGUSR2)
        return "signalfd";
    char ev[sizeof(struct inotify_event) + 256];
    ssize_t r = read(fds[INOTIFY], ev, sizeof ev);
    struct inotify_event *ie = (struct inotify_event *)ev;
    if (r < (ssize_t)sizeof *ie || !(ie->mask & IN_CREATE) || strcmp(ie->name, "created"))
        return "inotify event";
    char m[32] = {0};
    if (pread(fds[MEMFD], m, 13, 0) != 13 || strcmp(m, "memfd-content"))
        return "memfd content";
    if (!read_is(fds[DATA], "C2S"))
        return "data connection's queued bytes";
    put(fds[DATA], "D-OK\n");
    int b = accept(fds[BACKLOG], NULL, NULL);
    if (b < 0 || !read_is(b, "waiting"))
        return "backlog connection";
    put(b, "B-OK\n");
    close(b);
    return NULL;
}

static void command(const char *cmd)
{
    char out[4096];
    if (strcmp(cmd, "READY") == 0) {
        snprintf(out, sizeof out, "READY %d\n", port_of(fds[BACKLOG]));
    } else if (strcmp(cmd, "ACCEPT") == 0) {
        fds[DATA] = accept(fds[LISTEN], NULL, NULL);
        if (fds[DATA] < 0)
            die("accept data");
        put(fds[DATA], "S2C");
        snprintf(out, sizeof out, "OK\n");
    } else if (strcmp(cmd, "FDS") == 0) {
        size_t n = 0;
        for (int i = 0; i < N; i++)
            n += snprintf(out + n, sizeof out - n, "%s%s=%d", i ? " " : "", names[i], fds[i]);
        snprintf(out + n, sizeof out - n, "\n");
    } else if (strcmp(cmd, "IDS") == 0) {
        ids(out, sizeof out - 1);
        strcat(out, "\n");
    } else if (strcmp(cmd, "CHECK") == 0) {
        const char *e = check();
        snprintf(out, sizeof out, e ? "FAIL %s\n" : "CHECKED\n", e);
    } else {
        snprintf(out, sizeof out, "ERR\n");
    }
    put(control, out);
}

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    snprintf(dir, sizeof dir, "%s", argv[2]);
    for (int i = 0; i < N; i++)
        fds[i] = -1;
    fds[LISTEN] = listener(atoi(argv[1]));
    control = accept(fds[LISTEN], NULL, NULL);
    if (control < 0)
        die("accept control");
    setup();
    char line[256];
    size_t len = 0;
    for (;;) {
        ssize_t r = read(control, line + len, 1);
        if (r <= 0)
            return 0;
        if (line[len] == '\n') {
            line[len] = 0;
            command(line);
            len = 0;
        } else if (len < sizeof line - 1) {
            len++;
        }
    }
}
