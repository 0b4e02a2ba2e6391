/*
 * mem_1g_sparse: 1 GiB private anonymous mapping with MAP_NORESERVE and
 * MADV_NOHUGEPAGE; 10 MiB (2560 pages) touched at scattered places with a
 * per-page pattern. After restore: same bounds, VmFlags still has "nr"
 * (noreserve) and "nh" (nohugepage), touched pages keep their pattern and
 * every untouched page reads as zero.
 */
#include "ferry_test.h"
#include <sys/mman.h>

#define PG 4096UL
#define SIZE (1UL << 30)
#define NPAGES (SIZE / PG)
#define NTOUCH 2560

static unsigned char touched[NPAGES / 8];

static int vmflags_has(unsigned long start, const char *flag)
{
	static char buf[1 << 20];
	if (ft_read_file("/proc/self/smaps", buf, sizeof(buf)) < 0)
		return -1;
	char hdr[32];
	snprintf(hdr, sizeof(hdr), "%lx-", start);
	char *p = strstr(buf, hdr);
	while (p && p != buf && p[-1] != '\n')
		p = strstr(p + 1, hdr);
	if (!p)
		return -1;
	char *vf = strstr(p, "VmFlags:");
	if (!vf)
		return -1;
	char *nl = strchr(vf, '\n');
	if (nl)
		*nl = 0;
	char pat[8];
	snprintf(pat, sizeof(pat), " %s", flag);
	char *q = vf;
	while ((q = strstr(q, pat))) {
		if (q[strlen(pat)] == ' ' || q[strlen(pat)] == 0)
			return 1;
		q++;
	}
	return 0;
}

int main(void)
{
	ft_init();
	char *m = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
		       -1, 0);
	if (m == MAP_FAILED)
		ft_die("mmap 1G: %s", strerror(errno));
	FT_SYS(madvise(m, SIZE, MADV_NOHUGEPAGE));
	for (unsigned long i = 0; i < NTOUCH; i++) {
		unsigned long pg = (i * 104729UL + 77) % NPAGES;
		touched[pg / 8] |= (unsigned char)(1 << (pg % 8));
		ft_fill(m + pg * PG, PG, pg);
	}
	struct ft_vma before;
	ft_find_vma(m, &before);
	FT_CHECK(vmflags_has(before.start, "nr") == 1, "setup: VmFlags lacks nr");
	FT_CHECK(vmflags_has(before.start, "nh") == 1, "setup: VmFlags lacks nh");

	ft_ready();
	ft_wait_restored();

	struct ft_vma after;
	if (ft_find_vma(m, &after) != 0)
		ft_die("mapping gone after restore");
	FT_CHECK(after.start == before.start && after.end == before.end, "vma %lx-%lx became %lx-%lx",
		 before.start, before.end, after.start, after.end);
	FT_CHECK(strcmp(after.perms, "rw-p") == 0, "perms %s", after.perms);
	FT_CHECK(vmflags_has(after.start, "nr") == 1, "VmFlags lost nr (MAP_NORESERVE)");
	FT_CHECK(vmflags_has(after.start, "nh") == 1, "VmFlags lost nh (MADV_NOHUGEPAGE)");
	long bad_touched = 0, bad_zero = 0, first_t = -1, first_z = -1;
	for (unsigned long pg = 0; pg < NPAGES; pg++) {
		if (touched[pg / 8] & (1 << (pg % 8))) {
			if (ft_check_fill(m + pg * PG, PG, pg) >= 0) {
				if (first_t < 0)
					first_t = (long)pg;
				bad_touched++;
			}
		} else {
			const uint64_t *w = (const uint64_t *)(m + pg * PG);
			for (unsigned k = 0; k < PG / 8; k++)
				if (w[k]) {
					if (first_z < 0)
						first_z = (long)pg;
					bad_zero++;
					break;
				}
		}
	}
	FT_CHECK(bad_touched == 0, "%ld touched pages differ (first: page %ld)", bad_touched, first_t);
	FT_CHECK(bad_zero == 0, "%ld untouched pages are not zero (first: page %ld)", bad_zero, first_z);
	return ft_finish();
}
