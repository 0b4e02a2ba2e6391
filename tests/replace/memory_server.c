/*
 * memory_server: a one-process TCP server holding N MiB of anonymous
 * memory filled with a pattern, for the pre-copy tests and bench of
 * `ferry replace`.
 *
 * Usage: memory_server PORT MIB [hot]
 *   Every 8-byte word of page i holds (i << 32) | version[i]; with hot,
 *   the server rewrites the first 16th of its pages (at least one) in a
 *   loop, a new version each time, between the requests it answers.
 *
 * One command per line, one reply line each:
 *   INCR  -> the counter plus one
 *   PING  -> PONG
 *   CHECK -> OK <pages> if every page holds its pattern, else BAD <page>
 *   FORK  -> the PID of a child forked now, which sleeps until killed
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_CONNS 16
#define PAGE 4096
#define WORDS (PAGE / 8)

static long counter;
static uint64_t *mem;
static uint32_t *version;
static size_t pages, hot_pages, hot_at;

static void fill(size_t i)
{
    uint64_t w = ((uint64_t)i << 32) | version[i];
    for (size_t k = 0; k < WORDS; k++)
        mem[i * WORDS + k] = w;
}

static long check(void)
{
    for (size_t i = 0; i < pages; i++) {
        uint64_t w = ((uint64_t)i << 32) | version[i];
        for (size_t k = 0; k < WORDS; k++)
            if (mem[i * WORDS + k] != w)
                return (long)i;
    }
    return -1;
}

static void answer(int fd, const char *cmd)
{
    char out[64];
    if (strcmp(cmd, "INCR") == 0) {
        snprintf(out, sizeof out, "%ld\n", ++counter);
    } else if (strcmp(cmd, "PING") == 0) {
        snprintf(out, sizeof out, "PONG\n");
    } else if (strcmp(cmd, "CHECK") == 0) {
        long bad = check();
        if (bad < 0)
            snprintf(out, sizeof out, "OK %zu\n", pages);
        else
            snprintf(out, sizeof out, "BAD %ld\n", bad);
    } else if (strcmp(cmd, "FORK") == 0) {
        pid_t c = fork();
        if (c == 0) {
            for (;;)
                pause();
        }
        snprintf(out, sizeof out, "%d\n", (int)c);
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

int main(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    pages = (size_t)atol(argv[2]) * 256;
    int hot = argc > 3 && strcmp(argv[3], "hot") == 0;
    hot_pages = hot ? (pages / 16 ? pages / 16 : 1) : 0;
    mem = mmap(NULL, pages * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    version = calloc(pages, sizeof *version);
    if (mem == MAP_FAILED || !version)
        return 1;
    for (size_t i = 0; i < pages; i++)
        fill(i);
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1]))};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(lfd, (struct sockaddr *)&a, sizeof a) != 0 || listen(lfd, 16) != 0)
        return 1;
    struct pollfd p[MAX_CONNS + 1];
    char buf[MAX_CONNS + 1][256];
    size_t used[MAX_CONNS + 1];
    int n = 1;
    p[0].fd = lfd;
    p[0].events = POLLIN;
    for (;;) {
        for (size_t k = 0; k < 64 && hot_pages; k++) {
            size_t i = hot_at++ % hot_pages;
            version[i]++;
            fill(i);
        }
        if (poll(p, n, hot_pages ? 0 : -1) <= 0)
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
