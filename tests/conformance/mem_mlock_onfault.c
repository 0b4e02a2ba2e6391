/*
 * mem_mlock_onfault: a 64 MiB mapping locked with mlock2(MLOCK_ONFAULT)
 * of which 4 pages were touched. After restore it still shows VmFlags
 * "lo" and "lf", the same 4 pages are resident and no other (mincore),
 * their content is kept, and a page touched now is locked in too. A
 * restore that locks it with plain mlock() faults in all 64 MiB.
 */
#define _GNU_SOURCE
#include "ferry_test.h"
#include <sys/mman.h>

#define PG 4096UL
#define LEN (64UL << 20)

/* Whether the VmFlags of the smaps entry starting at addr list fl. */
static int vma_has_flag(void *addr, const char *fl)
{
	static char buf[1 << 20];
	if (ft_read_file("/proc/self/smaps", buf, sizeof(buf)) < 0)
		return -1;
	char key[32];
	snprintf(key, sizeof(key), "%lx-", (unsigned long)addr);
	char *p = strstr(buf, key);
	if (!p || (p != buf && p[-1] != '\n'))
		return -1;
	char *vf = strstr(p, "VmFlags:");
	if (!vf)
		return -1;
	char *end = strchr(vf, '\n');
	char want[8];
	snprintf(want, sizeof(want), " %s ", fl);
	char *hit = strstr(vf, want);
	return hit && (!end || hit < end);
}

static unsigned char vec[LEN / PG];

static long resident(char *m)
{
	if (mincore(m, LEN, vec) != 0)
		return -1;
	long n = 0;
	for (size_t i = 0; i < LEN / PG; i++)
		n += vec[i] & 1;
	return n;
}

static const size_t touched[4] = { 0, 1, 1000, LEN / PG - 1 };

int main(void)
{
	ft_init();
	char *m = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		ft_die("mmap: %s", strerror(errno));
	/* Small pages only: a huge page would make one touch 512 pages. */
	FT_SYS(madvise(m, LEN, MADV_NOHUGEPAGE));
	FT_SYS(syscall(SYS_mlock2, m, LEN, 1 /* MLOCK_ONFAULT */));
	for (int i = 0; i < 4; i++)
		m[touched[i] * PG] = (char)('A' + i);
	if (vma_has_flag(m, "lf") != 1 || resident(m) != 4)
		ft_die("setup: lf %d, %ld pages resident", vma_has_flag(m, "lf"), resident(m));

	ft_ready();
	ft_wait_restored();

	FT_EQ(vma_has_flag(m, "lo"), 1, "VmFlags lo");
	FT_EQ(vma_has_flag(m, "lf"), 1, "VmFlags lf (MLOCK_ONFAULT)");
	FT_EQ(resident(m), 4, "resident pages of the 64 MiB mapping");
	for (int i = 0; i < 4; i++)
		FT_CHECK(m[touched[i] * PG] == 'A' + i, "page %zu content", touched[i]);
	m[5000 * PG] = 'x';
	FT_EQ(resident(m), 5, "resident pages after touching one more");
	char v[64] = "";
	ft_status_field(0, "VmLck", v, sizeof(v));
	/* MLOCK_ONFAULT counts the whole range as locked. */
	FT_CHECK(atol(v) >= (long)(LEN >> 10), "VmLck '%s', expected >= %lu kB", v, LEN >> 10);
	return ft_finish();
}
