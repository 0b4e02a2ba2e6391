/*
 * counter_server: the example server used by `make demo`.
 *
 * A single-process, epoll-driven TCP server on 127.0.0.1:<port> that keeps
 * all of its state in memory, so a checkpoint/restore that loses anything
 * is immediately visible:
 *   - a counter,
 *   - a small key/value table,
 *   - a heartbeat counter ticked by a background thread (10 times a second).
 *
 * Protocol: one command per line, one reply line per command.
 *   INCR          -> new counter value
 *   GET           -> counter value
 *   SET <k> <v>   -> OK            (k: no spaces, <= 63 bytes; v: rest of line)
 *   GET <k>       -> value, or NOTFOUND
 *   HEARTBEAT     -> heartbeat tick count
 *   STATS         -> "counter=N keys=N heartbeat=N pid=N"
 *   PING          -> PONG
 *   QUIT          -> BYE, then the server closes that connection
 *   anything else -> ERR unknown command
 *
 * Usage: counter_server <port>   (port 0 picks a free port)
 * The only stdout output is one line at startup:
 *   counter_server listening on 127.0.0.1:<port> pid <pid>
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_CONNS 1024
#define IN_CAP 4096
#define OUT_CAP 8192
#define KV_SLOTS 64
#define KEY_MAX 64
#define VAL_MAX 256

struct conn {
    int fd; /* -1 when the slot is free */
    size_t in_len;
    char in[IN_CAP];
    size_t out_len;
    char out[OUT_CAP];
    int closing; /* close once the output is flushed */
};

struct kv {
    int used;
    char key[KEY_MAX];
    char val[VAL_MAX];
};

static struct conn *conns[MAX_CONNS]; /* indexed by fd */
static struct kv table[KV_SLOTS];
static uint64_t counter;
static _Atomic uint64_t heartbeat;
static int epfd;

static void die(const char *what) {
    fprintf(stderr, "counter_server: %s: %s\n", what, strerror(errno));
    exit(1);
}

static void *heartbeat_thread(void *arg) {
    (void)arg;
    struct timespec ts = {0, 100 * 1000 * 1000};
    for (;;) {
        struct timespec rem;
        while (nanosleep(&ts, &rem) == -1 && errno == EINTR)
            ts = rem;
        ts.tv_sec = 0;
        ts.tv_nsec = 100 * 1000 * 1000;
        atomic_fetch_add(&heartbeat, 1);
    }
    return NULL;
}

static struct kv *kv_find(const char *key) {
    for (int i = 0; i < KV_SLOTS; i++)
        if (table[i].used && strcmp(table[i].key, key) == 0)
            return &table[i];
    return NULL;
}

static int kv_count(void) {
    int n = 0;
    for (int i = 0; i < KV_SLOTS; i++)
        n += table[i].used;
    return n;
}

static void conn_close(struct conn *c) {
    epoll_ctl(epfd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    conns[c->fd] = NULL;
    free(c);
}

static void update_events(struct conn *c) {
    struct epoll_event ev = {0};
    ev.events = EPOLLIN | (c->out_len ? EPOLLOUT : 0);
    ev.data.fd = c->fd;
    epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &ev);
}

/* Returns 0 on success, -1 if the connection died. */
static int flush_out(struct conn *c) {
    while (c->out_len > 0) {
        ssize_t n = send(c->fd, c->out, c->out_len, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            return -1;
        }
        memmove(c->out, c->out + n, c->out_len - (size_t)n);
        c->out_len -= (size_t)n;
    }
    update_events(c);
    return 0;
}

static void reply(struct conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void reply(struct conn *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    size_t room = OUT_CAP - c->out_len;
    int n = vsnprintf(c->out + c->out_len, room, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= room) {
        /* Client is not reading its replies: give up on it. */
        c->closing = 1;
        return;
    }
    c->out_len += (size_t)n;
}

static void handle_line(struct conn *c, char *line) {
    size_t len = strlen(line);
    if (len > 0 && line[len - 1] == '\r')
        line[--len] = '\0';

    if (strcmp(line, "INCR") == 0) {
        reply(c, "%llu\n", (unsigned long long)++counter);
    } else if (strcmp(line, "GET") == 0) {
        reply(c, "%llu\n", (unsigned long long)counter);
    } else if (strncmp(line, "GET ", 4) == 0) {
        struct kv *e = kv_find(line + 4);
        if (e)
            reply(c, "%s\n", e->val);
        else
            reply(c, "NOTFOUND\n");
    } else if (strncmp(line, "SET ", 4) == 0) {
        char *key = line + 4;
        char *sp = strchr(key, ' ');
        if (!sp || sp == key) {
            reply(c, "ERR usage: SET <key> <value>\n");
            return;
        }
        *sp = '\0';
        const char *val = sp + 1;
        if (strlen(key) >= KEY_MAX || strlen(val) >= VAL_MAX) {
            reply(c, "ERR too long\n");
            return;
        }
        struct kv *e = kv_find(key);
        if (!e) {
            for (int i = 0; i < KV_SLOTS && !e; i++)
                if (!table[i].used)
                    e = &table[i];
            if (!e) {
                reply(c, "ERR table full\n");
                return;
            }
            e->used = 1;
            strcpy(e->key, key);
        }
        strcpy(e->val, val);
        reply(c, "OK\n");
    } else if (strcmp(line, "HEARTBEAT") == 0) {
        reply(c, "%llu\n", (unsigned long long)atomic_load(&heartbeat));
    } else if (strcmp(line, "STATS") == 0) {
        reply(c, "counter=%llu keys=%d heartbeat=%llu pid=%d\n", (unsigned long long)counter,
              kv_count(), (unsigned long long)atomic_load(&heartbeat), (int)getpid());
    } else if (strcmp(line, "PING") == 0) {
        reply(c, "PONG\n");
    } else if (strcmp(line, "QUIT") == 0) {
        reply(c, "BYE\n");
        c->closing = 1;
    } else if (len == 0) {
        /* ignore empty lines */
    } else {
        reply(c, "ERR unknown command\n");
    }
}

static void on_readable(struct conn *c) {
    for (;;) {
        if (c->in_len == IN_CAP) {
            /* Line longer than the buffer: protocol error. */
            reply(c, "ERR line too long\n");
            c->closing = 1;
            break;
        }
        ssize_t n = recv(c->fd, c->in + c->in_len, IN_CAP - c->in_len, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            conn_close(c);
            return;
        }
        if (n == 0) { /* peer closed */
            c->closing = 1;
            break;
        }
        c->in_len += (size_t)n;
        char *start = c->in;
        char *nl;
        while (!c->closing && (nl = memchr(start, '\n', c->in_len - (size_t)(start - c->in)))) {
            *nl = '\0';
            handle_line(c, start);
            start = nl + 1;
        }
        size_t rest = c->in_len - (size_t)(start - c->in);
        memmove(c->in, start, rest);
        c->in_len = rest;
        if (c->closing)
            break;
    }
    if (flush_out(c) < 0 || (c->closing && c->out_len == 0))
        conn_close(c);
}

static void on_accept(int lfd) {
    for (;;) {
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR)
                continue;
            return; /* EAGAIN or a transient error */
        }
        if (fd >= MAX_CONNS) {
            close(fd);
            continue;
        }
        struct conn *c = calloc(1, sizeof(*c));
        if (!c) {
            close(fd);
            continue;
        }
        c->fd = fd;
        conns[fd] = c;
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
        if (epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
            close(fd);
            conns[fd] = NULL;
            free(c);
        }
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s <port>\n", argv[0]);
        return 2;
    }
    char *end;
    long port = strtol(argv[1], &end, 10);
    if (*end || port < 0 || port > 65535) {
        fprintf(stderr, "counter_server: bad port '%s'\n", argv[1]);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);

    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (lfd < 0)
        die("socket");
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in addr = {0};
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(lfd, (struct sockaddr *)&addr, sizeof(addr)) < 0)
        die("bind");
    if (listen(lfd, 128) < 0)
        die("listen");
    socklen_t alen = sizeof(addr);
    if (getsockname(lfd, (struct sockaddr *)&addr, &alen) < 0)
        die("getsockname");

    epfd = epoll_create1(EPOLL_CLOEXEC);
    if (epfd < 0)
        die("epoll_create1");
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = lfd};
    if (epoll_ctl(epfd, EPOLL_CTL_ADD, lfd, &ev) < 0)
        die("epoll_ctl");

    pthread_t tid;
    if ((errno = pthread_create(&tid, NULL, heartbeat_thread, NULL)) != 0)
        die("pthread_create");

    printf("counter_server listening on 127.0.0.1:%u pid %d\n", (unsigned)ntohs(addr.sin_port),
           (int)getpid());
    fflush(stdout);

    struct epoll_event events[64];
    for (;;) {
        int n = epoll_wait(epfd, events, 64, -1);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            die("epoll_wait");
        }
        for (int i = 0; i < n; i++) {
            int fd = events[i].data.fd;
            if (fd == lfd) {
                on_accept(lfd);
                continue;
            }
            struct conn *c = (fd >= 0 && fd < MAX_CONNS) ? conns[fd] : NULL;
            if (!c)
                continue;
            if (events[i].events & EPOLLIN) {
                on_readable(c); /* may close c */
                continue;
            }
            if (events[i].events & EPOLLOUT) {
                if (flush_out(c) < 0 || (c->closing && c->out_len == 0))
                    conn_close(c);
                continue;
            }
            if (events[i].events & (EPOLLERR | EPOLLHUP))
                conn_close(c);
        }
    }
}
