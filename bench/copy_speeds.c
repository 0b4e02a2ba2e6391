/* bench/copy_speeds.c: the copy's own speed on this machine, for the bytes
 * a local checkpoint + restore of bench/heap100.c moves (100 MiB), each
 * step the way ferry does it, median of N runs (argument 1, default 5):
 *
 *   memcpy between two buffers already backed (the copy alone)
 *   process_vm_readv from another process into a 512 KiB buffer
 *     (checkpoint: reading the frozen process), 1 and 2 threads
 *   pwrite from a 512 KiB buffer into a new /dev/shm file (checkpoint:
 *     writing pages.img: page allocation + copy), 1 thread, 2 threads on
 *     the one file, 2 threads on two files (the inode lock)
 *   pwrite over the same file again (its pages exist: the copy alone)
 *   UFFDIO_COPY from a backed buffer into new anonymous memory
 *     (restore: allocation + copy, no zeroing), 1 and 2 threads
 *   process_vm_writev into another process's new anonymous memory
 *     (restore's fallback: fault + zero + copy) and into the same memory
 *     again (the copy alone)
 *   munmap of 100 MiB of written anonymous memory (what the kill frees)
 *
 * Prints a markdown table.
 * cc -O2 -pthread -o /tmp/copy_speeds bench/copy_speeds.c && /tmp/copy_speeds 7
 * (bench/copy_speeds.sh builds it, runs it and writes the table to a file) */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SZ (100ul << 20)
#define BATCH (512ul << 10)
#define MAXREP 31

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void die(const char *what) {
    perror(what);
    exit(1);
}

/* Fills with a pattern of its own (xorshift from `seed`), as
 * bench/heap100.c does: pages of one constant byte could be merged
 * (same-page merging in the host or the kernel) and then cost a
 * copy-on-write fault at the first write. */
static void fill(char *p, size_t n, uint32_t seed) {
    uint32_t x = 2463534242u ^ seed;
    for (size_t i = 0; i < n; i += sizeof x) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        memcpy(p + i, &x, sizeof x);
    }
}

static char *backed(size_t n, int seed) {
    char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        die("mmap");
    fill(p, n, seed);
    return p;
}

/* A job for one thread: bytes [off, off + len) of the 100 MiB. */
struct job {
    int kind, fd, uffd;
    pid_t pid;
    char *local, *remote;
    size_t off, len;
    size_t fbase; /* file offset = memory offset - fbase */
};

enum { READV, PWRITE, UFFD_COPY, WRITEV, READV_PWRITE };

static void *run_job(void *arg) {
    struct job *j = arg;
    char *buf = j->kind == UFFD_COPY ? j->local : backed(BATCH, 3);
    for (size_t o = j->off; o < j->off + j->len; o += BATCH) {
        struct iovec l = {buf, BATCH}, r = {j->remote + o, BATCH};
        int rd = j->kind == READV || j->kind == READV_PWRITE;
        if (rd && process_vm_readv(j->pid, &l, 1, &r, 1, 0) != (ssize_t)BATCH)
            die("process_vm_readv");
        int wr = j->kind == PWRITE || j->kind == READV_PWRITE;
        if (wr && pwrite(j->fd, buf, BATCH, o - j->fbase) != (ssize_t)BATCH)
            die("pwrite");
        if (j->kind == WRITEV && process_vm_writev(j->pid, &l, 1, &r, 1, 0) != (ssize_t)BATCH)
            die("process_vm_writev");
        if (j->kind == UFFD_COPY) {
            struct uffdio_copy c = {.dst = (uintptr_t)(j->remote + o),
                                    .src = (uintptr_t)(j->local + o),
                                    .len = BATCH};
            if (ioctl(j->uffd, UFFDIO_COPY, &c) || c.copy != (int64_t)BATCH)
                die("UFFDIO_COPY");
        }
    }
    if (j->kind != UFFD_COPY)
        munmap(buf, BATCH);
    return NULL;
}

/* Runs `threads` jobs over the 100 MiB; ms. fds[i] is thread i's file. */
static double run(int kind, int threads, pid_t pid, int *fds, int uffd, char *local, char *remote) {
    pthread_t t[2];
    struct job j[2];
    size_t per = SZ / threads;
    double t0 = now();
    for (int i = 0; i < threads; i++) {
        j[i] = (struct job){kind, fds ? fds[i] : -1, uffd, pid, local, remote, per * i, per, 0};
        if (fds && fds[0] != fds[threads - 1])
            j[i].fbase = j[i].off; /* separate files: each from its own offset 0 */
        if (pthread_create(&t[i], NULL, run_job, &j[i]))
            die("pthread_create");
    }
    for (int i = 0; i < threads; i++)
        pthread_join(t[i], NULL);
    return now() - t0;
}

static int new_shm(int i) {
    char path[64];
    snprintf(path, sizeof path, "/dev/shm/ferry-copy-speeds.%d.%d", (int)getpid(), i);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0)
        die(path);
    unlink(path);
    return fd;
}

static int uffd_over(char *area) {
    int fd = syscall(SYS_userfaultfd, O_CLOEXEC);
    struct uffdio_api api = {.api = UFFD_API};
    if (fd < 0 || ioctl(fd, UFFDIO_API, &api))
        die("userfaultfd");
    struct uffdio_register reg = {.range = {(uintptr_t)area, SZ},
                                  .mode = UFFDIO_REGISTER_MODE_MISSING};
    if (ioctl(fd, UFFDIO_REGISTER, &reg))
        die("UFFDIO_REGISTER");
    return fd;
}

static double uffd_copy(int threads, char *src) {
    char *dst = mmap(NULL, SZ, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    int fd = uffd_over(dst);
    double ms = run(UFFD_COPY, threads, 0, NULL, fd, src, dst);
    close(fd);
    munmap(dst, SZ);
    return ms;
}

/* A child holding 100 MiB of written memory at *at (same address as ours:
 * it is mapped before the fork). */
static pid_t holder(char **at) {
    *at = backed(SZ, 7);
    pid_t p = fork();
    if (p < 0)
        die("fork");
    if (p == 0) {
        fill(*at, SZ, 9); /* its own pages, not shared with the parent */
        for (;;)
            pause();
    }
    usleep(300000);
    munmap(*at, SZ);
    return p;
}

#define NROWS 17
static const char *names[NROWS] = {
    "memcpy between two backed buffers (the copy alone)",
    "process_vm_readv from another process, 512 KiB batches, 1 thread",
    "process_vm_readv from another process, 512 KiB batches, 2 threads",
    "pwrite into a new /dev/shm file, 512 KiB batches, 1 thread",
    "pwrite into a new /dev/shm file, 2 threads, one file",
    "pwrite into new /dev/shm files, 2 threads, two files of 50 MiB",
    "pwrite over the same /dev/shm file again (pages exist: copy alone)",
    "UFFDIO_COPY into new anonymous memory, 1 thread",
    "UFFDIO_COPY into new anonymous memory, 2 threads",
    "process_vm_writev into another process's new anonymous memory, 1 thread",
    "process_vm_writev into the same memory again (copy alone), 1 thread",
    "MADV_POPULATE_WRITE of 100 MiB of new anonymous memory",
    "munmap of 100 MiB of written anonymous memory",
    "fallocate of a new /dev/shm file of 100 MiB",
    "checkpoint's copy: process_vm_readv + pwrite to a new /dev/shm file per 512 KiB, 2 threads",
    "restore's copy: UFFDIO_COPY from a MAP_SHARED mapping of that file, 2 threads",
    "checkpoint's copy into two /dev/shm files of 50 MiB, one per thread",
};

static void one_round(double *row, char *a, char *b) {
    double t0 = now();
    memcpy(b, a, SZ);
    row[0] = now() - t0;
    char *rem;
    pid_t p = holder(&rem);
    row[1] = run(READV, 1, p, NULL, -1, NULL, rem);
    row[2] = run(READV, 2, p, NULL, -1, NULL, rem);
    int img = new_shm(2), imgs[2] = {img, img};
    row[14] = run(READV_PWRITE, 2, p, imgs, -1, NULL, rem);
    char *file = mmap(NULL, SZ, PROT_READ, MAP_SHARED, img, 0);
    if (file == MAP_FAILED)
        die("mmap of the file");
    row[15] = uffd_copy(2, file);
    munmap(file, SZ);
    close(img);
    int halves[2] = {new_shm(3), new_shm(4)};
    row[16] = run(READV_PWRITE, 2, p, halves, -1, NULL, rem);
    close(halves[0]);
    close(halves[1]);
    kill(p, SIGKILL);
    waitpid(p, NULL, 0);
    int f1 = new_shm(0), f2 = new_shm(1), two[2] = {f1, f2}, one[2] = {f1, f1};
    row[3] = run(PWRITE, 1, 0, one, -1, NULL, NULL);
    row[6] = run(PWRITE, 1, 0, one, -1, NULL, NULL);
    close(f1);
    f1 = new_shm(0);
    one[0] = one[1] = f1;
    row[4] = run(PWRITE, 2, 0, one, -1, NULL, NULL);
    close(f1);
    f1 = new_shm(0);
    two[0] = f1;
    row[5] = run(PWRITE, 2, 0, two, -1, NULL, NULL);
    close(f1);
    close(f2);
    row[7] = uffd_copy(1, a);
    row[8] = uffd_copy(2, a);
    /* A child with 100 MiB mapped and not yet touched. */
    char *fresh = mmap(NULL, SZ, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    pid_t c = fork();
    if (c == 0)
        for (;;)
            pause();
    munmap(fresh, SZ);
    row[9] = run(WRITEV, 1, c, NULL, -1, NULL, fresh);
    row[10] = run(WRITEV, 1, c, NULL, -1, NULL, fresh);
    kill(c, SIGKILL);
    waitpid(c, NULL, 0);
    char *m = mmap(NULL, SZ, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    t0 = now();
    if (madvise(m, SZ, 23 /* MADV_POPULATE_WRITE */))
        die("madvise");
    row[11] = now() - t0;
    fill(m, SZ, 5);
    t0 = now();
    munmap(m, SZ);
    row[12] = now() - t0;
    f1 = new_shm(0);
    t0 = now();
    if (fallocate(f1, 0, 0, SZ))
        die("fallocate");
    row[13] = now() - t0;
    close(f1);
}

static int cmp(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 5;
    if (reps < 1 || reps > MAXREP)
        reps = 5;
    char *a = backed(SZ, 1), *b = backed(SZ, 2);
    /* Kept out of the forks below: after a fork each page of `b` would be
     * write-protected, and the memcpy would time 25,600 write faults. */
    if (madvise(a, SZ, MADV_DONTFORK) || madvise(b, SZ, MADV_DONTFORK))
        die("madvise(MADV_DONTFORK)");
    static double ms[NROWS][MAXREP];
    for (int r = 0; r < reps; r++) {
        double row[NROWS];
        one_round(row, a, b);
        for (int i = 0; i < NROWS; i++)
            ms[i][r] = row[i];
    }
    printf("| 100 MiB, median of %d runs | ms (min-max) | GB/s |\n| --- | ---: | ---: |\n", reps);
    for (int i = 0; i < NROWS; i++) {
        qsort(ms[i], reps, sizeof(double), cmp);
        double med = ms[i][reps / 2];
        printf("| %s | %.1f (%.1f-%.1f) | %.1f |\n", names[i], med, ms[i][0], ms[i][reps - 1],
               SZ / med / 1e6);
    }
    return 0;
}
