/*
 * tree_cow_memory: copy-on-write sharing kept across checkpoint/restore.
 * The root fills 64 MiB of private anonymous memory (its own VMA, between
 * two PROT_NONE guard pages so that it merges with nothing) with a pattern,
 * then forks 4 children that only read it. After restore every process
 * reads its /proc/self/smaps entry for the region FIRST (before touching
 * anything) and requires Private_Clean + Private_Dirty < 8 MiB, i.e. the
 * pages are still shared with the other processes (printed as # lines);
 * then verifies the pattern. Finally each child writes one page of its own
 * (copy-on-write must still separate them: the root's pattern stays
 * intact after the children exit, so the region was not turned into shared
 * memory either).
 *
 * Synchronisation: report pipe before READY; after restore the root does
 * its checks before sending the go to the 4 children (which do theirs
 * concurrently), then reaps them all.
 */
#include "ferry_test.h"
#include <sys/mman.h>

#define PG 4096UL
#define SIZE (64UL << 20)
#define NKIDS 4
#define LIMIT_KB (8UL << 10)
#define SEED 777

static char *region;

struct smaps {
	unsigned long rss, pclean, pdirty, sclean, sdirty, anonhuge;
	unsigned long start, end;
};

/* The smaps entry of the VMA containing region; 0 on success. */
static int read_smaps(struct smaps *s)
{
	static char buf[1 << 20];
	unsigned long a = (unsigned long)region;
	memset(s, 0, sizeof(*s));
	if (ft_read_file("/proc/self/smaps", buf, sizeof(buf)) < 0)
		return -1;
	int in = 0;
	for (char *line = buf; line && *line;) {
		char *nl = strchr(line, '\n');
		if (nl)
			*nl = 0;
		unsigned long st, en, v;
		char key[64];
		if (sscanf(line, "%lx-%lx ", &st, &en) == 2 && strchr(line, ' ') > strchr(line, '-')) {
			if (in)
				return 0; /* next VMA */
			if (a >= st && a < en) {
				in = 1;
				s->start = st;
				s->end = en;
			}
		} else if (in && sscanf(line, "%63[^:]: %lu", key, &v) == 2) {
			if (!strcmp(key, "Rss"))
				s->rss = v;
			else if (!strcmp(key, "Private_Clean"))
				s->pclean = v;
			else if (!strcmp(key, "Private_Dirty"))
				s->pdirty = v;
			else if (!strcmp(key, "Shared_Clean"))
				s->sclean = v;
			else if (!strcmp(key, "Shared_Dirty"))
				s->sdirty = v;
			else if (!strcmp(key, "AnonHugePages"))
				s->anonhuge = v;
		}
		line = nl ? nl + 1 : NULL;
	}
	return in ? 0 : -1;
}

/* Reads smaps, logs the numbers, fails if too much of the region is private. */
static void check_shared(const char *who)
{
	struct smaps s;
	if (read_smaps(&s) != 0) {
		ft_fail("%s: region %p not found in /proc/self/smaps", who, (void *)region);
		return;
	}
	ft_log("%s: smaps %lx-%lx Rss %lu kB Private_Clean %lu kB Private_Dirty %lu kB Shared_Clean %lu kB "
	       "Shared_Dirty %lu kB AnonHugePages %lu kB",
	       who, s.start, s.end, s.rss, s.pclean, s.pdirty, s.sclean, s.sdirty, s.anonhuge);
	FT_CHECK(s.start == (unsigned long)region && s.end == (unsigned long)region + SIZE,
		 "%s: region VMA is %lx-%lx, expected %lx-%lx", who, s.start, s.end, (unsigned long)region,
		 (unsigned long)region + SIZE);
	FT_CHECK(s.pclean + s.pdirty < LIMIT_KB,
		 "%s: %lu kB of the 64 MiB region are private (Private_Clean %lu + Private_Dirty %lu kB): "
		 "copy-on-write sharing with the other processes lost",
		 who, s.pclean + s.pdirty, s.pclean, s.pdirty);
	FT_CHECK(s.rss >= (SIZE >> 10) - LIMIT_KB, "%s: only %lu kB of the region resident", who, s.rss);
}

static void check_pattern(const char *who)
{
	long bad = ft_check_fill(region, SIZE, SEED);
	FT_CHECK(bad < 0, "%s: pattern differs at word %ld", who, bad);
}

static void child(int me)
{
	char who[16];
	snprintf(who, sizeof(who), "child %d", me);
	check_pattern(who); /* read only */
	ft_child_ready();

	ft_child_wait_go();
	check_shared(who); /* before anything touches the region */
	check_pattern(who);
	/* a page of its own: must not show in the root (or the other children) */
	char *p = region + (size_t)me * (4UL << 20);
	ft_fill(p, PG, 1000 + (uint64_t)me);
	FT_CHECK(ft_check_fill(p, PG, 1000 + (uint64_t)me) < 0, "%s: its own write did not stick", who);
	ft_child_exit(who);
}

int main(void)
{
	ft_init();
	char *base = mmap(NULL, SIZE + 2 * PG, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (base == MAP_FAILED)
		ft_die("mmap: %s", strerror(errno));
	region = base + PG;
	FT_SYS(mprotect(region, SIZE, PROT_READ | PROT_WRITE));
	ft_fill(region, SIZE, SEED);

	ft_tree_begin();
	pid_t kids[NKIDS];
	for (int i = 0; i < NKIDS; i++) {
		kids[i] = ft_fork();
		if (kids[i] == 0)
			child(i + 1);
	}
	ft_tree_wait_ready(NKIDS);
	struct smaps s;
	if (read_smaps(&s) != 0)
		ft_die("region not in smaps");
	ft_log("root before READY: Private_Clean %lu kB Private_Dirty %lu kB Shared_Dirty %lu kB", s.pclean, s.pdirty,
	       s.sdirty);
	if (s.pclean + s.pdirty >= LIMIT_KB)
		ft_die("region not shared with the children before READY (%lu kB private)", s.pclean + s.pdirty);

	ft_ready();
	ft_tree_wait_restored();

	check_shared("root");
	check_pattern("root");
	for (int i = 0; i < NKIDS; i++)
		ft_go(kids[i], "child");
	for (int i = 0; i < NKIDS; i++) {
		char who[16];
		snprintf(who, sizeof(who), "child %d", i + 1);
		ft_reap(kids[i], who);
	}
	check_pattern("root (after the children wrote their pages)");
	return ft_finish();
}
