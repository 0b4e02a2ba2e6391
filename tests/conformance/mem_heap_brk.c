/*
 * mem_heap_brk: the program grows the heap with sbrk(1 MiB) and fills it,
 * and also keeps malloc'd blocks with patterns. After restore: sbrk(0) and
 * start_brk (/proc/self/stat field 47) are unchanged, [heap] spans the same
 * range, the contents are kept, sbrk can grow the heap further (new memory
 * is zero and writable) and shrink it again, and malloc/free still work.
 */
#include "ferry_test.h"
#include <sys/mman.h>

#define GROW (1 << 20)

int main(void)
{
	ft_init();
	void *blocks[32];
	for (int i = 0; i < 32; i++) {
		blocks[i] = malloc(1000 + 313 * i);
		ft_fill(blocks[i], (1000 + 313 * i) & ~7, 10 + i);
	}
	char *b0 = sbrk(0);
	char *grown = sbrk(GROW);
	if (grown == (void *)-1)
		ft_die("sbrk grow");
	ft_fill(grown, GROW, 4321);
	char *b1 = sbrk(0);
	unsigned long start_brk = (unsigned long)ft_stat_field(47);
	unsigned long hs = 0, he = 0;
	hs = ft_find_named_vma("[heap]", &he);

	ft_ready();
	ft_wait_restored();

	char *a1 = sbrk(0);
	FT_CHECK(a1 == b1, "sbrk(0) %p -> %p", (void *)b1, (void *)a1);
	FT_CHECK(b1 == b0 + GROW, "setup: sbrk grow mismatch");
	unsigned long sb = (unsigned long)ft_stat_field(47);
	FT_CHECK(sb == start_brk, "start_brk 0x%lx -> 0x%lx", start_brk, sb);
	unsigned long he2 = 0, hs2 = ft_find_named_vma("[heap]", &he2);
	FT_CHECK(hs2 == hs && he2 == he, "[heap] %lx-%lx -> %lx-%lx", hs, he, hs2, he2);
	long bad = ft_check_fill(grown, GROW, 4321);
	FT_CHECK(bad < 0, "sbrk'ed memory differs at word %ld", bad);
	for (int i = 0; i < 32; i++)
		FT_CHECK(ft_check_fill(blocks[i], (1000 + 313 * i) & ~7, 10 + i) < 0,
			 "malloc block %d differs", i);
	/* grow further */
	char *more = sbrk(256 << 10);
	FT_CHECK(more == a1, "sbrk(+256K) after restore returned %p, expected %p", (void *)more, (void *)a1);
	if (more != (void *)-1) {
		FT_CHECK(ft_is_zero(more, 256 << 10), "new brk memory is not zero");
		ft_fill(more, 256 << 10, 77);
		FT_CHECK(ft_check_fill(more, 256 << 10, 77) < 0, "new brk memory not writable");
		FT_CHECK(sbrk(0) == a1 + (256 << 10), "sbrk(0) after growth wrong");
		unsigned long he3 = 0;
		ft_find_named_vma("[heap]", &he3);
		FT_CHECK(he3 >= (unsigned long)(a1 + (256 << 10)), "[heap] end 0x%lx did not grow", he3);
		FT_CHECK(sbrk(-(128 << 10)) != (void *)-1, "sbrk shrink failed");
		FT_CHECK(sbrk(0) == a1 + (128 << 10), "sbrk(0) after shrink wrong");
	}
	for (int i = 0; i < 32; i += 2)
		free(blocks[i]);
	void *big = malloc(3 << 20);
	void *small = malloc(100);
	FT_CHECK(big && small, "malloc after restore failed");
	if (big)
		ft_fill(big, 3 << 20, 1);
	free(big);
	free(small);
	return ft_finish();
}
