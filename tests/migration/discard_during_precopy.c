/*
 * discard_during_precopy: memory a process discards (MADV_DONTNEED) while
 * a migration's pre-copy has already sent it. 256 pages of a private
 * anonymous mapping are filled with a per-page pattern; READY. On SIGUSR1
 * (the test sends it once the pre-copy rounds are done, before the
 * freeze) the first 128 pages are discarded, which makes them read as
 * zeros: DISCARDED. On SIGUSR2 (at the destination) the first half must
 * read zero and the second half keep its pattern: PASS, or FAIL lines.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define PG 4096UL
#define PAGES 256

static void say(const char *s)
{
	(void)!write(1, s, strlen(s));
}

static int wait_signal(int sig)
{
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, sig);
	for (;;) {
		int got = sigwaitinfo(&set, NULL);
		if (got == sig)
			return 0;
	}
}

int main(void)
{
	sigset_t block;
	sigemptyset(&block);
	sigaddset(&block, SIGUSR1);
	sigaddset(&block, SIGUSR2);
	sigprocmask(SIG_BLOCK, &block, NULL);
	uint64_t *m = mmap(NULL, PAGES * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED) {
		say("FAIL: mmap\n");
		return 1;
	}
	for (size_t i = 0; i < PAGES * PG / 8; i++)
		m[i] = 0x5a5a000000000000ULL | i;
	say("READY\n");
	wait_signal(SIGUSR1);
	if (madvise(m, PAGES / 2 * PG, MADV_DONTNEED) != 0) {
		say("FAIL: madvise\n");
		return 1;
	}
	say("DISCARDED\n");
	wait_signal(SIGUSR2);
	int bad = 0;
	for (size_t i = 0; i < PAGES * PG / 8; i++) {
		uint64_t want = i < PAGES / 2 * PG / 8 ? 0 : (0x5a5a000000000000ULL | i);
		if (m[i] != want) {
			char line[128];
			snprintf(line, sizeof(line), "FAIL: page %zu word %zu: %#llx, want %#llx\n",
				 i * 8 / PG, i % (PG / 8), (unsigned long long)m[i], (unsigned long long)want);
			say(line);
			if (++bad == 4)
				break;
		}
	}
	say(bad ? "" : "PASS\n");
	return bad != 0;
}
