/*
 * mem_anon_shared: a 64-page MAP_SHARED|MAP_ANONYMOUS region with a pattern
 * in the first 48 pages (last 16 untouched). After restore: same bounds,
 * perms "rw-s", content kept, untouched pages zero, writable.
 */
#include "ferry_test.h"
#include <sys/mman.h>

#define PG 4096UL
#define NP 64

int main(void)
{
	ft_init();
	char *m = mmap(NULL, NP * PG, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		ft_die("mmap");
	ft_fill(m, 48 * PG, 4242);
	struct ft_vma before;
	ft_find_vma(m, &before);

	ft_ready();
	ft_wait_restored();

	struct ft_vma v;
	if (ft_find_vma(m, &v) != 0)
		ft_die("mapping gone");
	FT_CHECK(v.start == before.start && v.end == before.end, "bounds %lx-%lx -> %lx-%lx",
		 before.start, before.end, v.start, v.end);
	FT_CHECK(strcmp(v.perms, "rw-s") == 0, "perms %s, expected rw-s", v.perms);
	FT_CHECK(strncmp(v.path, "/dev/zero", 9) == 0 || strncmp(v.path, "/SYSV", 5) == 0,
		 "path column '%s' (expected /dev/zero (deleted))", v.path);
	long bad = ft_check_fill(m, 48 * PG, 4242);
	FT_CHECK(bad < 0, "content differs at word %ld", bad);
	FT_CHECK(ft_is_zero(m + 48 * PG, 16 * PG), "untouched pages not zero");
	ft_fill(m + 60 * PG, PG, 1);
	FT_CHECK(ft_check_fill(m + 60 * PG, PG, 1) < 0, "write after restore failed");
	return ft_finish();
}
