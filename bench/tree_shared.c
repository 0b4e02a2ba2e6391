/* bench/tree_shared.c: a process tree sharing one private anonymous region
 * copy-on-write.
 *
 *   tree_shared [MIB [WORKERS [LIFETIME_S]]]     defaults: 200 8 600
 *
 * The parent maps MIB MiB of private anonymous memory and writes a non-zero,
 * non-repeating pattern into every page, then forks WORKERS children. Each
 * child only reads the whole region (so every page is mapped in it, still
 * shared with the parent: RSS counts it in every process, PSS splits it),
 * checks the pattern's checksum, reports over a pipe, and blocks in pause().
 * Once every worker reported, the parent closes the pipe, prints
 * "READY <pid> workers=<n> mib=<m>" and blocks in pause() too. No descriptor
 * besides stdin, stdout and stderr is left open.
 *
 * Every process arms alarm(LIFETIME_S), so a tree a crashed benchmark left
 * behind ends by itself. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static uint64_t checksum(const volatile uint64_t *p, size_t words) {
    uint64_t sum = 0;
    for (size_t i = 0; i < words; i++)
        sum = sum * 31 + p[i];
    return sum;
}

static long arg(int argc, char **argv, int i, long def, long min, long max) {
    if (argc <= i)
        return def;
    char *end;
    errno = 0;
    long v = strtol(argv[i], &end, 10);
    if (errno || *end || v < min || v > max) {
        fprintf(stderr, "tree_shared: bad argument %d '%s' (want %ld..%ld)\n", i, argv[i], min, max);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv) {
    long mib = arg(argc, argv, 1, 200, 1, 65536);
    long workers = arg(argc, argv, 2, 8, 0, 1024);
    long lifetime = arg(argc, argv, 3, 600, 1, 86400);
    size_t len = (size_t)mib << 20;
    size_t words = len / sizeof(uint64_t);

    alarm((unsigned)lifetime);
    volatile uint64_t *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
        perror("tree_shared: mmap");
        return 1;
    }
    /* xorshift64: never zero, no two pages alike. */
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < words; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        mem[i] = x;
    }
    uint64_t want = checksum(mem, words);

    int fds[2];
    if (pipe(fds) < 0) {
        perror("tree_shared: pipe");
        return 1;
    }
    for (long w = 0; w < workers; w++) {
        pid_t pid = fork();
        if (pid < 0) {
            perror("tree_shared: fork");
            return 1;
        }
        if (pid == 0) {
            close(fds[0]);
            alarm((unsigned)lifetime);
            char ok = checksum(mem, words) == want ? '1' : '0';
            if (write(fds[1], &ok, 1) != 1)
                _exit(1);
            close(fds[1]);
            for (;;)
                pause();
        }
    }
    close(fds[1]);
    long up = 0;
    while (up < workers) {
        char c;
        ssize_t n = read(fds[0], &c, 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n != 1) {
            fprintf(stderr, "tree_shared: only %ld of %ld workers reported\n", up, workers);
            return 1;
        }
        if (c != '1') {
            fprintf(stderr, "tree_shared: a worker read a wrong checksum\n");
            return 1;
        }
        up++;
    }
    close(fds[0]);
    printf("READY %d workers=%ld mib=%ld\n", (int)getpid(), workers, mib);
    fflush(stdout);
    for (;;)
        pause();
}
