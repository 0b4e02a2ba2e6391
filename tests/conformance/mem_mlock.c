/*
 * mem_mlock: a locked mapping. Three pages are mlock()ed, the mapping
 * next to them is not. After restore the first still shows "lo" in its
 * smaps VmFlags (VmLck at least 12 kB), the other does not, and both keep
 * their content.
 */
#include "ferry_test.h"
#include <sys/mman.h>

/* Whether the smaps entry starting at addr has VmFlags flag fl. */
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
	snprintf(want, sizeof(want), " %s", fl);
	char *hit = strstr(vf, want);
	return hit && (!end || hit < end);
}

int main(void)
{
	ft_init();
	char *locked = mmap(NULL, 3 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	char *plain = mmap(NULL, 2 * 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (locked == MAP_FAILED || plain == MAP_FAILED)
		ft_die("mmap");
	memset(locked, 'L', 3 * 4096);
	FT_SYS(mlock(locked, 3 * 4096));
	if (vma_has_flag(locked, "lo") != 1 || vma_has_flag(plain, "lo") != 0)
		ft_die("setup not visible in smaps");

	ft_ready();
	ft_wait_restored();

	FT_EQ(vma_has_flag(locked, "lo"), 1, "mlocked mapping has VmFlags lo");
	FT_EQ(vma_has_flag(plain, "lo"), 0, "plain mapping has no VmFlags lo");
	char v[64] = "";
	ft_status_field(0, "VmLck", v, sizeof(v));
	FT_CHECK(atoi(v) >= 12, "VmLck '%s', expected >= 12 kB", v);
	FT_CHECK(locked[0] == 'L' && locked[3 * 4096 - 1] == 'L', "locked content");
	return ft_finish();
}
