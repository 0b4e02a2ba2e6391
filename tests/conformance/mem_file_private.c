/*
 * mem_file_private: a 16-page file written by the program is mapped
 * MAP_PRIVATE read-write; pages 2, 5 and 11 are modified in memory, pages
 * 0-7 otherwise only read, the rest never touched. A second private mapping
 * covers file pages 4-7 (offset 4 pages) read-only. After restore: modified
 * pages keep the in-memory content, all other pages equal the file (pread),
 * /proc/self/maps shows the file path and offsets, and a pwrite to a clean
 * page of the file is visible through the private mapping (clean pages are
 * still backed by the file's page cache, as in the kernel).
 */
#include "ferry_test.h"
#include <sys/mman.h>

#define PG 4096UL
#define NP 16

static int modified(int pg)
{
	return pg == 2 || pg == 5 || pg == 11;
}

int main(void)
{
	ft_init();
	int fd = (int)FT_SYS(open("private.bin", O_RDWR | O_CREAT | O_TRUNC, 0644));
	char *page = malloc(PG);
	for (int pg = 0; pg < NP; pg++) {
		ft_fill(page, PG, 1000 + pg);
		FT_SYS(pwrite(fd, page, PG, (off_t)(pg * PG)));
	}
	char *m = mmap(NULL, NP * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
	char *ro = mmap(NULL, 4 * PG, PROT_READ, MAP_PRIVATE, fd, 4 * PG);
	if (m == MAP_FAILED || ro == MAP_FAILED)
		ft_die("mmap");
	volatile uint64_t sink = 0;
	for (int pg = 0; pg < 8; pg++)
		sink += *(uint64_t *)(m + pg * PG);
	for (int pg = 0; pg < NP; pg++)
		if (modified(pg))
			ft_fill(m + pg * PG, PG, 5000 + pg);
	sink += *(uint64_t *)ro;
	(void)sink;
	char path[4096];
	FT_SYS(getcwd(path, sizeof(path) - 32));
	strcat(path, "/private.bin");

	ft_ready();
	ft_wait_restored();

	struct ft_vma v;
	if (ft_find_vma(m, &v) != 0)
		ft_die("mapping gone");
	FT_CHECK(strcmp(v.path, path) == 0, "rw mapping path '%s', expected '%s'", v.path, path);
	FT_CHECK(strcmp(v.perms, "rw-p") == 0, "rw mapping perms %s", v.perms);
	FT_CHECK(v.start == (unsigned long)m && v.end == (unsigned long)m + NP * PG,
		 "rw mapping bounds %lx-%lx", v.start, v.end);
	FT_CHECK(v.offset == 0, "rw mapping offset %lx", v.offset);
	if (ft_find_vma(ro, &v) == 0) {
		FT_CHECK(strcmp(v.path, path) == 0, "ro mapping path '%s'", v.path);
		FT_CHECK(strcmp(v.perms, "r--p") == 0, "ro mapping perms %s", v.perms);
		FT_CHECK(v.offset == 4 * PG, "ro mapping offset 0x%lx, expected 0x%lx", v.offset, 4 * PG);
	} else {
		ft_fail("ro mapping gone");
	}
	for (int pg = 0; pg < NP; pg++) {
		if (modified(pg)) {
			long bad = ft_check_fill(m + pg * PG, PG, 5000 + pg);
			FT_CHECK(bad < 0, "modified page %d lost its memory content (word %ld)", pg, bad);
		} else {
			FT_SYS(pread(fd, page, PG, (off_t)(pg * PG)));
			FT_CHECK(memcmp(page, m + pg * PG, PG) == 0, "clean page %d differs from the file", pg);
		}
	}
	FT_CHECK(memcmp(ro, m + 4 * PG, PG) == 0, "ro mapping page 0 differs from file page 4");
	/* the file itself was never modified by the private writes */
	FT_SYS(pread(fd, page, PG, 2 * PG));
	FT_CHECK(ft_check_fill(page, PG, 1002) < 0, "private write leaked into the file");
	/* clean pages are still file-backed */
	ft_fill(page, PG, 7777);
	FT_SYS(pwrite(fd, page, PG, 7 * PG));
	FT_CHECK(memcmp(m + 7 * PG, page, PG) == 0,
		 "pwrite to file page 7 not visible through the private mapping (clean page not file-backed)");
	FT_CHECK(memcmp(ro + 3 * PG, page, PG) == 0,
		 "pwrite to file page 7 not visible through the read-only private mapping");
	FT_CHECK(ft_check_fill(m + 5 * PG, PG, 5005) < 0, "modified page 5 changed by pwrite");
	return ft_finish();
}
