/*
 * mem_prot_none_toggle: PROT_NONE memory that a thread keeps opening,
 * writing and closing again, as a JVM or V8 commits and uncommits parts
 * of its reserved heap. 64 pages of a private anonymous mapping stay
 * PROT_NONE except while the writer, in a loop, makes one page writable,
 * writes the round number into every word of it, makes it PROT_NONE
 * again, and then records the round in ordinary memory (round N writes
 * page N % 64); every 16th round it also replaces the whole mapping by a
 * fresh PROT_NONE one (mmap MAP_FIXED, its pages then zero) and writes
 * its pages again from the record. After restore the writer is stopped
 * and every page must hold the last round that wrote it: a copy of a page
 * taken before its last write, or from the mapping before a replacement,
 * shows as a stale round (a live migration sends memory while the
 * writer runs).
 */
#include "ferry_test.h"
#include <pthread.h>
#include <stdatomic.h>
#include <sys/mman.h>

#define PG 4096UL
#define PAGES 64

static char *region;
static uint64_t last[PAGES];	  /* the round that last wrote each page */
static atomic_int stop;
static atomic_ulong rounds;

static void write_page(unsigned long p, uint64_t round)
{
	char *page = region + p * PG;
	FT_SYS(mprotect(page, PG, PROT_READ | PROT_WRITE));
	for (size_t w = 0; w < PG / 8; w++)
		((uint64_t *)page)[w] = round;
	FT_SYS(mprotect(page, PG, PROT_NONE));
	last[p] = round;
}

static void *writer(void *arg)
{
	(void)arg;
	for (uint64_t round = 1; !atomic_load(&stop); round++) {
		if (round % 16 == 0) {
			void *m = mmap(region, PAGES * PG, PROT_NONE,
				       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
			if (m != region)
				ft_die("mmap over the region: %s", strerror(errno));
			for (unsigned long p = 0; p < PAGES; p++)
				if (last[p])
					write_page(p, last[p]);
		}
		write_page(round % PAGES, round);
		atomic_store(&rounds, round);
		ft_sleep_ms(1);
	}
	return NULL;
}

int main(void)
{
	ft_init();
	region = mmap(NULL, PAGES * PG, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (region == MAP_FAILED)
		ft_die("mmap: %s", strerror(errno));
	pthread_t th;
	FT_SYS(pthread_create(&th, NULL, writer, NULL));
	while (atomic_load(&rounds) < 3 * PAGES)
		ft_sleep_ms(5);

	ft_ready();
	ft_wait_restored();

	unsigned long at_restore = atomic_load(&rounds);
	ft_sleep_ms(50);
	atomic_store(&stop, 1);
	ft_join(th, NULL, 5, "writer");
	FT_CHECK(atomic_load(&rounds) > at_restore, "the writer made no progress after restore");
	FT_SYS(mprotect(region, PAGES * PG, PROT_READ));
	int bad = 0;
	for (unsigned long p = 0; p < PAGES && bad < 4; p++) {
		const uint64_t *page = (const uint64_t *)(region + p * PG);
		for (size_t w = 0; w < PG / 8; w++) {
			if (page[w] != last[p]) {
				ft_fail("page %lu word %zu: round %llu, last written by round %llu", p, w,
					(unsigned long long)page[w], (unsigned long long)last[p]);
				bad++;
				break;
			}
		}
	}
	return ft_finish();
}
