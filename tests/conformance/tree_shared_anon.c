/*
 * tree_shared_anon: one 4 MiB MAP_SHARED|MAP_ANONYMOUS region mapped before
 * the root forks 3 children; slice i (1 MiB) belongs to process i (root 0,
 * children 1-3), each fills its slice with its own pattern before READY.
 * After restore every process finds the mapping at the same address (rw-s)
 * and all four slices intact. Then the root rewrites its slice and, one
 * child at a time, each child checks the root's new slice and the new
 * slices of the children before it, rewrites its own slice and exits; the
 * root then sees the child's new slice. So the pages are still one shared
 * object in all four processes (copies would hide the new values).
 *
 * Synchronisation: report pipe before READY; after restore the root sends
 * the go to one child at a time and reaps it before the next (the exit and
 * waitpid order the writes).
 */
#include "ferry_test.h"
#include <sys/mman.h>

#define SLICE (1UL << 20)
#define NKIDS 3

static unsigned char *m;
static struct ft_vma before;

static void check_vma(const char *who)
{
	struct ft_vma v;
	if (ft_find_vma(m, &v) != 0) {
		ft_fail("%s: mapping at %p gone", who, (void *)m);
		return;
	}
	FT_CHECK(v.start == before.start && v.end == before.end, "%s: bounds %lx-%lx, expected %lx-%lx", who, v.start,
		 v.end, before.start, before.end);
	FT_CHECK(strcmp(v.perms, "rw-s") == 0, "%s: perms %s, expected rw-s", who, v.perms);
}

/* Slice i must hold pattern seed. */
static void check_slice(const char *who, int i, uint64_t seed, const char *what)
{
	long bad = ft_check_fill(m + (size_t)i * SLICE, SLICE, seed);
	FT_CHECK(bad < 0, "%s: slice %d (%s) differs at word %ld", who, i, what, bad);
}

static uint64_t old_seed(int i)
{
	return 100 + (uint64_t)i;
}

static uint64_t new_seed(int i)
{
	return 200 + (uint64_t)i;
}

static void child(int me)
{
	char who[16];
	snprintf(who, sizeof(who), "child %d", me);
	ft_fill(m + (size_t)me * SLICE, SLICE, old_seed(me));
	ft_child_ready();

	ft_child_wait_go();
	check_vma(who);
	/* the root rewrote slice 0 and children 1..me-1 theirs before this go */
	check_slice(who, 0, new_seed(0), "root's write after restore");
	for (int i = 1; i <= NKIDS; i++)
		check_slice(who, i, i < me ? new_seed(i) : old_seed(i), i < me ? "written after restore" : "from before");
	ft_fill(m + (size_t)me * SLICE, SLICE, new_seed(me));
	ft_child_exit(who);
}

int main(void)
{
	ft_init();
	ft_tree_begin();
	m = mmap(NULL, (NKIDS + 1) * SLICE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		ft_die("mmap: %s", strerror(errno));
	if (ft_find_vma(m, &before) != 0)
		ft_die("mapping not in /proc/self/maps");

	pid_t kids[NKIDS];
	for (int i = 0; i < NKIDS; i++) {
		kids[i] = ft_fork();
		if (kids[i] == 0)
			child(i + 1);
	}
	ft_fill(m, SLICE, old_seed(0));
	ft_tree_wait_ready(NKIDS);
	for (int i = 0; i <= NKIDS; i++)
		if (ft_check_fill(m + (size_t)i * SLICE, SLICE, old_seed(i)) >= 0)
			ft_die("slice %d not shared before READY", i);

	ft_ready();
	ft_tree_wait_restored();

	check_vma("root");
	for (int i = 0; i <= NKIDS; i++)
		check_slice("root", i, old_seed(i), "from before");
	ft_fill(m, SLICE, new_seed(0));
	for (int i = 0; i < NKIDS; i++) {
		char who[16];
		snprintf(who, sizeof(who), "child %d", i + 1);
		ft_go(kids[i], who);
		ft_reap(kids[i], who);
		check_slice("root", i + 1, new_seed(i + 1), "written by the child after restore");
	}
	return ft_finish();
}
