/*
 * mem_madvise_flags: eight private anonymous mappings, each with one
 * madvise(2) flag: MADV_DONTFORK, MADV_DONTDUMP, MADV_WIPEONFORK,
 * MADV_HUGEPAGE, MADV_NOHUGEPAGE, MADV_MERGEABLE (only where the kernel
 * has KSM; EINVAL otherwise, logged), MADV_SEQUENTIAL, MADV_RANDOM, with a
 * page of data in each. After restore: each mapping shows its flag in
 * /proc/self/smaps VmFlags (dc, dd, wf, hg, nh, mg, sr, rr) and no other
 * of the eight, its data is intact,
 * and the flags still act: a forked child reads zeros in the WIPEONFORK
 * mapping and does not have the DONTFORK one.
 */
#include "ferry_test.h"
#include <sys/mman.h>

#define PG 4096UL
#define LEN (4 * PG)

struct flag {
	int advice;
	const char *name;
	const char *vmflag;
	char *addr;
	int set;
};

static struct flag flags[] = {
	{ MADV_DONTFORK, "DONTFORK", "dc", NULL, 0 },
	{ MADV_DONTDUMP, "DONTDUMP", "dd", NULL, 0 },
	{ MADV_WIPEONFORK, "WIPEONFORK", "wf", NULL, 0 },
	{ MADV_HUGEPAGE, "HUGEPAGE", "hg", NULL, 0 },
	{ MADV_NOHUGEPAGE, "NOHUGEPAGE", "nh", NULL, 0 },
	{ MADV_MERGEABLE, "MERGEABLE", "mg", NULL, 0 },
	{ MADV_SEQUENTIAL, "SEQUENTIAL", "sr", NULL, 0 },
	{ MADV_RANDOM, "RANDOM", "rr", NULL, 0 },
};
#define NFLAGS (sizeof(flags) / sizeof(flags[0]))

/* The VmFlags line of the smaps entry that starts at addr, into out. */
static int vmflags_of(const char *addr, char *out, size_t n)
{
	static char buf[1 << 20];
	char head[32];
	snprintf(head, sizeof(head), "%lx-", (unsigned long)addr);
	if (ft_read_file("/proc/self/smaps", buf, sizeof(buf)) < 0)
		return -1;
	char *p = buf;
	while ((p = strstr(p, head)) != NULL) {
		if (p == buf || p[-1] == '\n')
			break;
		p++;
	}
	if (!p)
		return -1;
	char *v = strstr(p, "VmFlags:");
	if (!v)
		return -1;
	char *nl = strchr(v, '\n');
	size_t len = nl ? (size_t)(nl - v) : strlen(v);
	if (len >= n)
		len = n - 1;
	memcpy(out, v, len);
	out[len] = 0;
	return 0;
}

static int has_flag(const char *line, const char *f)
{
	char want[8];
	snprintf(want, sizeof(want), " %s", f);
	const char *p = line;
	while ((p = strstr(p, want)) != NULL) {
		if (p[3] == ' ' || p[3] == 0)
			return 1;
		p++;
	}
	return 0;
}

int main(void)
{
	ft_init();
	for (size_t i = 0; i < NFLAGS; i++) {
		/* A guard page between mappings keeps them from merging. */
		char *a = mmap(NULL, LEN + PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (a == MAP_FAILED)
			ft_die("mmap: %s", strerror(errno));
		FT_SYS(munmap(a + LEN, PG));
		flags[i].addr = a;
		if (madvise(a, LEN, flags[i].advice) == 0) {
			flags[i].set = 1;
		} else if (errno == EINVAL) {
			ft_log("MADV_%s not supported here: %s", flags[i].name, strerror(errno));
		} else {
			ft_die("madvise(MADV_%s): %s", flags[i].name, strerror(errno));
		}
		memset(a, 'a' + (int)i, LEN);
	}
	ft_ready();
	ft_wait_restored();

	for (size_t i = 0; i < NFLAGS; i++) {
		char line[512];
		if (vmflags_of(flags[i].addr, line, sizeof(line)) != 0) {
			ft_fail("MADV_%s mapping at %p: no smaps entry starts there", flags[i].name,
				(void *)flags[i].addr);
			continue;
		}
		for (size_t j = 0; j < NFLAGS; j++) {
			int want = j == i && flags[i].set;
			FT_CHECK(has_flag(line, flags[j].vmflag) == want,
				 "MADV_%s mapping: VmFlags %s %s (%s)", flags[i].name,
				 want ? "lacks" : "has", flags[j].vmflag, line);
		}
		for (size_t k = 0; k < LEN; k++) {
			if (flags[i].addr[k] != 'a' + (int)i) {
				ft_fail("MADV_%s mapping: byte %zu is %#x", flags[i].name, k,
					(unsigned char)flags[i].addr[k]);
				break;
			}
		}
	}
	/* The flags still act on a fork. */
	pid_t pid = fork();
	if (pid < 0)
		ft_die("fork: %s", strerror(errno));
	if (pid == 0) {
		struct ft_vma v;
		int bad = 0;
		if (flags[2].addr[0] != 0)
			bad |= 1; /* WIPEONFORK: zero in the child */
		if (ft_find_vma(flags[0].addr, &v) == 0)
			bad |= 2; /* DONTFORK: not mapped in the child */
		_exit(bad);
	}
	int st = 0;
	FT_SYS(waitpid(pid, &st, 0));
	FT_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0,
		 "forked child: WIPEONFORK data not wiped (bit 1) or DONTFORK mapping present (bit 2): status %#x",
		 st);
	return ft_finish();
}
