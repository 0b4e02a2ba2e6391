/*
 * mem_anon_private: several private anonymous mappings (1 page, 100 pages,
 * 4 MiB with MAP_POPULATE, a 64-page region where only every other page is
 * touched and one page was MADV_DONTNEED'ed after being written) plus a
 * 1 MiB malloc buffer, all filled with address-dependent patterns. After
 * restore: each range inside one mapping of the same permissions in
 * /proc/self/maps (neighbours may be merged, as the kernel may do on either
 * side), same contents, untouched/dropped pages read as zero.
 */
#include "ferry_test.h"
#include <sys/mman.h>

#define PG 4096UL

struct reg {
	const char *name;
	size_t len;
	int flags;
	char *p;
	struct ft_vma vma;
};

int main(void)
{
	ft_init();
	struct reg r[] = {
		{ "one page", PG, 0, NULL, { 0 } },
		{ "100 pages", 100 * PG, 0, NULL, { 0 } },
		{ "4 MiB populated", 4 << 20, MAP_POPULATE, NULL, { 0 } },
	};
	int nr = sizeof(r) / sizeof(r[0]);
	for (int i = 0; i < nr; i++) {
		r[i].p = mmap(NULL, r[i].len, PROT_READ | PROT_WRITE,
			      MAP_PRIVATE | MAP_ANONYMOUS | r[i].flags, -1, 0);
		if (r[i].p == MAP_FAILED)
			ft_die("mmap %s", r[i].name);
		ft_fill(r[i].p, r[i].len, 100 + i);
	}
	/* sparse region: even pages written, page 10 written then dropped */
	char *sp = mmap(NULL, 64 * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (sp == MAP_FAILED)
		ft_die("mmap sparse");
	for (int pg = 0; pg < 64; pg += 2)
		ft_fill(sp + pg * PG, PG, 500 + pg);
	FT_SYS(madvise(sp + 10 * PG, PG, MADV_DONTNEED));
	char *heap = malloc(1 << 20);
	ft_fill(heap, 1 << 20, 900);
	for (int i = 0; i < nr; i++)
		if (ft_find_vma(r[i].p, &r[i].vma) != 0)
			ft_die("vma");
	struct ft_vma spv;
	ft_find_vma(sp, &spv);

	ft_ready();
	ft_wait_restored();

	for (int i = 0; i < nr; i++) {
		struct ft_vma v;
		if (ft_find_vma(r[i].p, &v) != 0) {
			ft_fail("%s: mapping at %p gone", r[i].name, r[i].p);
			continue;
		}
		/* The kernel may merge neighbouring anonymous mappings of the
		 * same protection and flags on either side (whether it did in
		 * the original depends on its fault history); the restore's own
		 * check merges them on both sides too. So the range must lie in
		 * one mapping, not be its exact bounds. */
		FT_CHECK(v.start <= r[i].vma.start && v.end >= r[i].vma.end,
			 "%s: vma %lx-%lx became %lx-%lx", r[i].name, r[i].vma.start, r[i].vma.end, v.start,
			 v.end);
		FT_CHECK(strcmp(v.perms, r[i].vma.perms) == 0, "%s: perms %s -> %s", r[i].name,
			 r[i].vma.perms, v.perms);
		long bad = ft_check_fill(r[i].p, r[i].len, 100 + i);
		FT_CHECK(bad < 0, "%s: content differs at byte offset %ld", r[i].name, bad * 8);
	}
	struct ft_vma v;
	FT_CHECK(ft_find_vma(sp, &v) == 0 && v.start <= spv.start && v.end >= spv.end,
		 "sparse region vma changed");
	for (int pg = 0; pg < 64; pg++) {
		if (pg % 2 == 0 && pg != 10) {
			long bad = ft_check_fill(sp + pg * PG, PG, 500 + pg);
			FT_CHECK(bad < 0, "sparse page %d content differs at word %ld", pg, bad);
		} else {
			FT_CHECK(ft_is_zero(sp + pg * PG, PG), "sparse page %d (%s) is not zero", pg,
				 pg == 10 ? "MADV_DONTNEED" : "never touched");
		}
	}
	long bad = ft_check_fill(heap, 1 << 20, 900);
	FT_CHECK(bad < 0, "malloc buffer differs at word %ld", bad);
	/* memory is still private and writable */
	ft_fill(r[1].p, r[1].len, 7);
	FT_CHECK(ft_check_fill(r[1].p, r[1].len, 7) < 0, "rewrite after restore failed");
	return ft_finish();
}
