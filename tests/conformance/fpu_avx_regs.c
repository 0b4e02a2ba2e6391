/*
 * fpu_avx_regs: (only if cpuid/xgetbv report AVX usable; otherwise prints
 * SKIP and passes) a thread spins in asm with known 256-bit values in
 * ymm0-ymm15; the main thread waits for SIGUSR2 with a raw rt_sigtimedwait
 * syscall from asm with known values in ymm6-ymm9. After restore every
 * ymm register, including the upper 128 bits, must be bit-exact.
 */
#include "ferry_test.h"
#include <cpuid.h>

volatile int avx_stop __attribute__((used));
volatile uint64_t avx_count __attribute__((used));
unsigned char ymm_in[512] __attribute__((used, aligned(32)));
unsigned char ymm_out[512] __attribute__((used, aligned(32)));
unsigned char mymm_in[128] __attribute__((used, aligned(32)));
unsigned char mymm_out[128] __attribute__((used, aligned(32)));

static int have_avx(void)
{
	unsigned a, b, c, d;
	if (!__get_cpuid(1, &a, &b, &c, &d))
		return 0;
	if (!(c & bit_OSXSAVE) || !(c & bit_AVX))
		return 0;
	unsigned lo, hi;
	__asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
	return (lo & 6) == 6;
}

static void *spin(void *arg)
{
	(void)arg;
	__asm__ volatile(
#define LD(n) "vmovdqu ymm_in+" #n "*32(%%rip), %%ymm" #n "\n\t"
		LD(0) LD(1) LD(2) LD(3) LD(4) LD(5) LD(6) LD(7)
		LD(8) LD(9) LD(10) LD(11) LD(12) LD(13) LD(14) LD(15)
		"1:\n\t"
		"incq avx_count(%%rip)\n\t"
		"pause\n\t"
		"cmpl $0, avx_stop(%%rip)\n\t"
		"je 1b\n\t"
#define ST(n) "vmovdqu %%ymm" #n ", ymm_out+" #n "*32(%%rip)\n\t"
		ST(0) ST(1) ST(2) ST(3) ST(4) ST(5) ST(6) ST(7)
		ST(8) ST(9) ST(10) ST(11) ST(12) ST(13) ST(14) ST(15)
		"vzeroupper\n\t"
		:
		:
		: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
		  "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "memory", "cc");
	return NULL;
}

int main(void)
{
	ft_init();
	if (!have_avx()) {
		ft_log("SKIP: AVX not available");
		ft_ready();
		ft_wait_restored();
		return ft_finish();
	}
	for (int i = 0; i < 512; i++)
		ymm_in[i] = (unsigned char)(i * 13 + 5);
	for (int i = 0; i < 128; i++)
		mymm_in[i] = (unsigned char)(0xF0 ^ (i * 29));
	pthread_t th;
	FT_PT(pthread_create(&th, NULL, spin, NULL));
	double dl = ft_mono() + 10;
	while (avx_count < 100000 && ft_mono() < dl)
		ft_sleep_ms(1);
	if (avx_count < 100000)
		ft_die("spinner did not start");

	sigset_t set;
	siginfo_t si;
	sigemptyset(&set);
	sigaddset(&set, SIGUSR2);
	ft_ready();
	long ret;
	int rounds = 0;
	do {
		rounds++;
		register long a_rdi __asm__("rdi") = (long)&set;
		register long a_rsi __asm__("rsi") = (long)&si;
		register long a_rdx __asm__("rdx") = 0;
		register long a_r10 __asm__("r10") = 8;
		__asm__ volatile("vmovdqu mymm_in+0(%%rip), %%ymm6\n\t"
				 "vmovdqu mymm_in+32(%%rip), %%ymm7\n\t"
				 "vmovdqu mymm_in+64(%%rip), %%ymm8\n\t"
				 "vmovdqu mymm_in+96(%%rip), %%ymm9\n\t"
				 "mov $128, %%eax\n\t"
				 "syscall\n\t"
				 "vmovdqu %%ymm6, mymm_out+0(%%rip)\n\t"
				 "vmovdqu %%ymm7, mymm_out+32(%%rip)\n\t"
				 "vmovdqu %%ymm8, mymm_out+64(%%rip)\n\t"
				 "vmovdqu %%ymm9, mymm_out+96(%%rip)\n\t"
				 "vzeroupper\n\t"
				 : "=a"(ret), "+r"(a_rdi), "+r"(a_rsi), "+r"(a_rdx), "+r"(a_r10)
				 :
				 : "rcx", "r11", "xmm6", "xmm7", "xmm8", "xmm9", "memory", "cc");
		for (int r = 0; r < 4; r++)
			if (memcmp(mymm_in + 32 * r, mymm_out + 32 * r, 32) != 0)
				ft_fail("main thread ymm%d changed across the wait (low128 %s, high128 %s)",
					6 + r,
					memcmp(mymm_in + 32 * r, mymm_out + 32 * r, 16) ? "differs" : "ok",
					memcmp(mymm_in + 32 * r + 16, mymm_out + 32 * r + 16, 16) ? "differs"
												   : "ok");
	} while (ret == -EINTR && rounds < 100);
	FT_EQ(ret, SIGUSR2, "rt_sigtimedwait return value");

	uint64_t c0 = avx_count;
	ft_sleep_ms(100);
	FT_CHECK(avx_count > c0, "spinner not running after restore");
	avx_stop = 1;
	if (ft_join(th, NULL, 5, "spinner") == 0)
		for (int r = 0; r < 16; r++)
			if (memcmp(ymm_in + 32 * r, ymm_out + 32 * r, 32) != 0)
				ft_fail("ymm%d changed (low128 %s, high128 %s)", r,
					memcmp(ymm_in + 32 * r, ymm_out + 32 * r, 16) ? "differs" : "ok",
					memcmp(ymm_in + 32 * r + 16, ymm_out + 32 * r + 16, 16) ? "differs"
												 : "ok");
	return ft_finish();
}
