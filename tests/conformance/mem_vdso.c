/*
 * mem_vdso: after restore the vDSO is at the same address
 * (getauxval(AT_SYSINFO_EHDR) == [vdso] start in /proc/self/maps, same as
 * before), [vvar] exists, the vDSO code is byte-identical, and the clocks
 * read through it (clock_gettime MONOTONIC/REALTIME/BOOTTIME, gettimeofday,
 * time) agree with the raw syscalls within 0.5 s and did not go backwards.
 */
#include "ferry_test.h"
#include <sys/auxv.h>
#include <sys/time.h>

static double raw_clock(clockid_t c)
{
	struct timespec ts;
	syscall(SYS_clock_gettime, c, &ts);
	return ft_ts2d(&ts);
}

int main(void)
{
	ft_init();
	unsigned long ehdr = getauxval(AT_SYSINFO_EHDR);
	unsigned long vend = 0, vstart = ft_find_named_vma("[vdso]", &vend);
	unsigned long vvend = 0, vvar = ft_find_named_vma("[vvar]", &vvend);
	if (!ehdr || !vstart)
		ft_die("no vdso (ehdr %lx, maps %lx)", ehdr, vstart);
	FT_CHECK(ehdr == vstart, "setup: AT_SYSINFO_EHDR %lx != [vdso] %lx", ehdr, vstart);
	size_t vlen = vend - vstart;
	unsigned char *copy = malloc(vlen);
	memcpy(copy, (void *)vstart, vlen);
	double mono0 = ft_clock(CLOCK_MONOTONIC);
	double real0 = ft_clock(CLOCK_REALTIME);

	ft_ready();
	ft_wait_restored();

	unsigned long vend2 = 0, vstart2 = ft_find_named_vma("[vdso]", &vend2);
	unsigned long vvend2 = 0, vvar2 = ft_find_named_vma("[vvar]", &vvend2);
	FT_EQ(getauxval(AT_SYSINFO_EHDR), ehdr, "getauxval(AT_SYSINFO_EHDR)");
	FT_CHECK(vstart2 == vstart && vend2 == vend, "[vdso] %lx-%lx -> %lx-%lx", vstart, vend, vstart2,
		 vend2);
	FT_CHECK(vvar2 != 0, "[vvar] missing after restore");
	FT_CHECK(vvar2 == vvar && vvend2 - vvar2 == vvend - vvar, "[vvar] %lx-%lx -> %lx-%lx", vvar, vvend,
		 vvar2, vvend2);
	if (vstart2 == vstart && vend2 == vend)
		FT_CHECK(memcmp(copy, (void *)vstart, vlen) == 0, "vdso content changed");

	static const struct {
		clockid_t c;
		const char *n;
	} clocks[] = { { CLOCK_MONOTONIC, "MONOTONIC" },
		       { CLOCK_REALTIME, "REALTIME" },
		       { CLOCK_BOOTTIME, "BOOTTIME" },
		       { CLOCK_MONOTONIC_RAW, "MONOTONIC_RAW" } };
	for (unsigned i = 0; i < sizeof(clocks) / sizeof(clocks[0]); i++) {
		double v = ft_clock(clocks[i].c);
		double r = raw_clock(clocks[i].c);
		FT_CHECK(r - v >= -0.001 && r - v < 0.5, "clock %s: vdso %.6f vs syscall %.6f", clocks[i].n, v,
			 r);
	}
	double mono1 = ft_clock(CLOCK_MONOTONIC);
	FT_CHECK(mono1 >= mono0, "CLOCK_MONOTONIC went backwards: %.6f -> %.6f", mono0, mono1);
	FT_CHECK(mono1 - mono0 < 60, "CLOCK_MONOTONIC jumped %.3f s", mono1 - mono0);
	double real1 = ft_clock(CLOCK_REALTIME);
	FT_CHECK(real1 >= real0 - 0.5 && real1 - real0 < 60, "CLOCK_REALTIME %.3f -> %.3f", real0, real1);
	struct timeval tv, rtv;
	gettimeofday(&tv, NULL);
	syscall(SYS_gettimeofday, &rtv, NULL);
	FT_CHECK(ft_tv2d(&rtv) - ft_tv2d(&tv) >= -0.001 && ft_tv2d(&rtv) - ft_tv2d(&tv) < 0.5,
		 "gettimeofday vdso %.6f vs syscall %.6f", ft_tv2d(&tv), ft_tv2d(&rtv));
	time_t t = time(NULL);
	FT_CHECK(labs((long)(t - (time_t)real1)) <= 1, "time() %ld vs %.0f", (long)t, real1);
	struct timespec res;
	FT_CHECK(clock_getres(CLOCK_MONOTONIC, &res) == 0 && res.tv_sec == 0 && res.tv_nsec > 0,
		 "clock_getres failed");
	return ft_finish();
}
