/* bench/migrate_mem.c: the memory workloads of bench/migrate.py.
 *
 *   migrate_mem idle MIB            write MIB MiB once, then sleep
 *   migrate_mem hot MIB PCT [MIBS]  write MIB MiB, then loop forever over the
 *                                   first PCT % of its pages, incrementing one
 *                                   8-byte word per page (MIBS: at most that
 *                                   many MiB of pages written per second;
 *                                   0 or absent = as fast as it can)
 *   migrate_mem seed MIB            seed 001's program: write MIB MiB, then
 *                                   `for (;;) for (i...) buf[i]++` over every
 *                                   byte
 *   migrate_mem warm MIB            touch MIB MiB and exit (warms the VM's
 *                                   memory, see kernel-facts.md)
 *
 * Every 8-byte word starts as a pattern of its index (no page is zero or
 * equal to another). It prints "READY <pid>" once all memory is written.
 * On SIGUSR1 it checks all of its memory at the next pass boundary (the
 * pattern, plus what its loop added: `passes` to each hot page's first word,
 * or to every byte) and prints "VERIFY OK passes=N" or "VERIFY BAD ...", so
 * a migrated copy can show that its memory arrived intact.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096u

static volatile sig_atomic_t verify_requested;

static void on_usr1(int sig)
{
	(void)sig;
	verify_requested = 1;
}

static uint64_t pat(uint64_t i)
{
	uint64_t x = i * 0xBF58476D1CE4E5B9ULL + 0x1234567ULL;
	x ^= x >> 31;
	x *= 0x94D049BB133111EBULL;
	x ^= x >> 29;
	return x | 1; /* never zero */
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint64_t *mem;
static size_t bytes, words, hot_pages;
static uint64_t passes;
static enum { IDLE, HOT, SEED } mode;

static void verify(void)
{
	const size_t wpp = PAGE / 8;
	for (size_t i = 0; i < words; i++) {
		uint64_t want = pat(i);
		if (mode == HOT && i % wpp == 0 && i / wpp < hot_pages)
			want += passes;
		if (mode == SEED) {
			/* every byte was incremented `passes` times */
			uint64_t w = 0;
			for (int b = 0; b < 8; b++)
				w |= (uint64_t)(uint8_t)((uint8_t)(want >> (8 * b)) + (uint8_t)passes) << (8 * b);
			want = w;
		}
		if (mem[i] != want) {
			printf("VERIFY BAD word %zu (byte %zu): %016llx, expected %016llx, passes=%llu\n", i, i * 8,
			       (unsigned long long)mem[i], (unsigned long long)want, (unsigned long long)passes);
			fflush(stdout);
			return;
		}
	}
	printf("VERIFY OK passes=%llu\n", (unsigned long long)passes);
	fflush(stdout);
}

static void maybe_verify(void)
{
	if (verify_requested) {
		verify_requested = 0;
		verify();
	}
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: %s idle|hot|seed|warm MIB [PCT [MIBS]]\n", argv[0]);
		return 2;
	}
	bytes = (size_t)strtoull(argv[2], NULL, 10) << 20;
	words = bytes / 8;
	mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (mem == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	if (!strcmp(argv[1], "warm")) {
		for (size_t i = 0; i < bytes; i += PAGE)
			((volatile char *)mem)[i] = 1;
		return 0;
	}
	double pct = 0, mibs = 0;
	if (!strcmp(argv[1], "idle"))
		mode = IDLE;
	else if (!strcmp(argv[1], "seed"))
		mode = SEED;
	else if (!strcmp(argv[1], "hot") && argc >= 4) {
		mode = HOT;
		pct = atof(argv[3]);
		if (argc >= 5)
			mibs = atof(argv[4]);
	} else {
		fprintf(stderr, "%s: unknown mode %s\n", argv[0], argv[1]);
		return 2;
	}
	for (size_t i = 0; i < words; i++)
		mem[i] = pat(i);
	hot_pages = (size_t)((double)(bytes / PAGE) * pct / 100.0);
	if (mode == HOT && hot_pages == 0)
		hot_pages = 1;
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_usr1;
	sigaction(SIGUSR1, &sa, NULL);
	printf("READY %d\n", (int)getpid());
	fflush(stdout);

	if (mode == IDLE) {
		for (;;) {
			maybe_verify();
			sleep(1); /* a signal ends it early */
		}
	}
	if (mode == SEED) {
		volatile uint8_t *b = (volatile uint8_t *)mem;
		for (;;) {
			for (size_t i = 0; i < bytes; i++)
				b[i]++;
			passes++;
			maybe_verify();
		}
	}
	/* HOT: one word per hot page per pass; with a rate, in slices of 1 ms. */
	const size_t wpp = PAGE / 8;
	double pages_per_s = mibs > 0 ? mibs * 256.0 : 0;
	double start = now();
	uint64_t done = 0; /* pages written since start */
	for (;;) {
		for (size_t p = 0; p < hot_pages; p++) {
			((volatile uint64_t *)mem)[p * wpp]++;
			if (pages_per_s > 0 && (++done & 63) == 0) {
				double ahead = (double)done / pages_per_s - (now() - start);
				if (ahead > 0.001) {
					struct timespec ts = {0, (long)(ahead * 1e9)};
					nanosleep(&ts, NULL);
				}
			}
		}
		passes++;
		maybe_verify();
	}
}
