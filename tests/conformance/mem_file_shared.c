/*
 * mem_file_shared: an 8-page file mapped MAP_SHARED; pages 1-3 are written
 * through the mapping before the checkpoint (no msync). After restore:
 * pread sees those writes, the mapping is still "rw-s" on that file, a write
 * through the mapping is seen by pread and a pwrite is seen through the
 * mapping.
 */
#include "ferry_test.h"
#include <sys/mman.h>

#define PG 4096UL
#define NP 8

int main(void)
{
	ft_init();
	int fd = (int)FT_SYS(open("shared.bin", O_RDWR | O_CREAT | O_TRUNC, 0644));
	char *page = malloc(PG);
	for (int pg = 0; pg < NP; pg++) {
		ft_fill(page, PG, 100 + pg);
		FT_SYS(pwrite(fd, page, PG, (off_t)(pg * PG)));
	}
	char *m = mmap(NULL, NP * PG, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED)
		ft_die("mmap");
	for (int pg = 1; pg <= 3; pg++)
		ft_fill(m + pg * PG, PG, 200 + pg);
	char path[4096];
	FT_SYS(getcwd(path, sizeof(path) - 32));
	strcat(path, "/shared.bin");

	ft_ready();
	ft_wait_restored();

	struct ft_vma v;
	if (ft_find_vma(m, &v) != 0)
		ft_die("mapping gone");
	FT_CHECK(strcmp(v.perms, "rw-s") == 0, "perms %s, expected rw-s", v.perms);
	FT_CHECK(strcmp(v.path, path) == 0, "path '%s'", v.path);
	FT_CHECK(v.start == (unsigned long)m && v.end == (unsigned long)m + NP * PG, "bounds changed");
	for (int pg = 0; pg < NP; pg++) {
		uint64_t seed = (pg >= 1 && pg <= 3) ? 200 + pg : 100 + pg;
		FT_SYS(pread(fd, page, PG, (off_t)(pg * PG)));
		FT_CHECK(ft_check_fill(page, PG, seed) < 0, "file page %d (pread) wrong", pg);
		FT_CHECK(ft_check_fill(m + pg * PG, PG, seed) < 0, "mapped page %d wrong", pg);
	}
	ft_fill(m + 5 * PG, PG, 555);
	FT_SYS(pread(fd, page, PG, 5 * PG));
	FT_CHECK(ft_check_fill(page, PG, 555) < 0, "write through mapping after restore not in file");
	ft_fill(page, PG, 666);
	FT_SYS(pwrite(fd, page, PG, 6 * PG));
	FT_CHECK(ft_check_fill(m + 6 * PG, PG, 666) < 0, "pwrite after restore not visible in mapping");
	return ft_finish();
}
