/*
 * mem_stack_deep: the main thread recurses ~2 MiB deep (1 KiB pattern per
 * frame, checked on the way back) and waits for SIGUSR2 at the bottom.
 * After restore: every frame's content is intact, the VMA is still labelled
 * [stack] and can still grow (the guard gap / VM_GROWSDOWN is kept):
 * recursing another ~3 MiB deeper works and the [stack] VMA start moves
 * down.
 */
#include "ferry_test.h"
#include <sys/resource.h>

#define FRAME 1024

static int depth1, depth2;
static unsigned long stack_lo_before, stack_lo_after_restore, stack_lo_deeper;
static int bad_frames;
static unsigned long deepest_sp;

static void __attribute__((noinline)) fill_frame(volatile unsigned char *b, int d)
{
	for (int i = 0; i < FRAME; i++)
		b[i] = (unsigned char)(d * 31 + i);
}

static int __attribute__((noinline)) check_frame(volatile unsigned char *b, int d)
{
	for (int i = 0; i < FRAME; i++)
		if (b[i] != (unsigned char)(d * 31 + i))
			return 0;
	return 1;
}

static int __attribute__((noinline)) deeper(int d)
{
	volatile unsigned char buf[FRAME];
	fill_frame(buf, d + 7);
	int r = 0;
	if (d < depth2)
		r = deeper(d + 1);
	else {
		unsigned long e;
		stack_lo_deeper = ft_find_named_vma("[stack]", &e);
		deepest_sp = (unsigned long)buf;
	}
	if (!check_frame(buf, d + 7))
		r++;
	return r;
}

/* touch 64 KiB below the current frame so that the wait itself does not grow the stack */
static void __attribute__((noinline)) prefault(void)
{
	volatile unsigned char pad[64 << 10];
	for (unsigned i = 0; i < sizeof(pad); i += 512)
		pad[i] = 1;
}

static int __attribute__((noinline)) recurse(int d)
{
	volatile unsigned char buf[FRAME];
	fill_frame(buf, d);
	int r = 0;
	if (d < depth1) {
		r = recurse(d + 1);
	} else {
		unsigned long e;
		prefault();
		stack_lo_before = ft_find_named_vma("[stack]", &e);
		ft_ready();
		ft_wait_restored();
		struct ft_vma v;
		if (ft_find_vma((void *)buf, &v) != 0 || strcmp(v.path, "[stack]") != 0)
			ft_fail("bottom frame's vma is not labelled [stack] ('%s')", v.path);
		stack_lo_after_restore = ft_find_named_vma("[stack]", &e);
		r = deeper(0);
		if (r)
			ft_fail("%d frames of the deeper recursion corrupted", r);
		r = 0;
	}
	if (!check_frame(buf, d))
		bad_frames++;
	return r;
}

int main(void)
{
	ft_init();
	struct rlimit rl;
	getrlimit(RLIMIT_STACK, &rl);
	unsigned long lim = rl.rlim_cur == RLIM_INFINITY ? (64UL << 20) : rl.rlim_cur;
	/* frames are a bit more than FRAME bytes; keep total under ~70% of the limit */
	unsigned long budget = lim * 7 / 10;
	unsigned long d1 = 2UL << 20, d2 = 3UL << 20;
	if (d1 + d2 > budget) {
		d1 = budget * 2 / 5;
		d2 = budget * 3 / 5;
	}
	depth1 = (int)(d1 / (FRAME + 64));
	depth2 = (int)(d2 / (FRAME + 64));
	recurse(0);
	FT_CHECK(bad_frames == 0, "%d stack frames corrupted across restore", bad_frames);
	FT_CHECK(stack_lo_after_restore == stack_lo_before, "[stack] start 0x%lx -> 0x%lx after restore",
		 stack_lo_before, stack_lo_after_restore);
	FT_CHECK(stack_lo_deeper != 0, "no [stack] vma at the deepest point");
	FT_CHECK(stack_lo_deeper < stack_lo_after_restore, "[stack] did not grow (0x%lx -> 0x%lx)",
		 stack_lo_after_restore, stack_lo_deeper);
	FT_CHECK(deepest_sp >= stack_lo_deeper, "deepest frame below [stack] start");
	return ft_finish();
}
