/*
 * fpu_avx512_regs: (only if cpuid/xgetbv report AVX-512F usable; otherwise
 * SKIP + PASS) a thread spins in asm with known 512-bit values in
 * zmm0-zmm31 and known masks in k1-k7. After restore all of them (the
 * ZMM_Hi256, Hi16_ZMM and opmask xsave components) must be bit-exact.
 */
#include "ferry_test.h"
#include <cpuid.h>

volatile int z_stop __attribute__((used));
volatile uint64_t z_count __attribute__((used));
unsigned char zmm_in[32 * 64] __attribute__((used, aligned(64)));
unsigned char zmm_out[32 * 64] __attribute__((used, aligned(64)));
uint64_t k_in[8] __attribute__((used));
uint64_t k_out[8] __attribute__((used));

static int have_avx512(void)
{
	unsigned a, b, c, d;
	if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE))
		return 0;
	if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(b & bit_AVX512F))
		return 0;
	unsigned lo, hi;
	__asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
	return (lo & 0xE6) == 0xE6;
}

#define LD(n) "vmovdqu64 zmm_in+" #n "*64(%%rip), %%zmm" #n "\n\t"
#define ST(n) "vmovdqu64 %%zmm" #n ", zmm_out+" #n "*64(%%rip)\n\t"

static void *spin(void *arg)
{
	(void)arg;
	__asm__ volatile(
		LD(0) LD(1) LD(2) LD(3) LD(4) LD(5) LD(6) LD(7) LD(8) LD(9) LD(10) LD(11) LD(12)
		LD(13) LD(14) LD(15) LD(16) LD(17) LD(18) LD(19) LD(20) LD(21) LD(22) LD(23) LD(24)
		LD(25) LD(26) LD(27) LD(28) LD(29) LD(30) LD(31)
		"kmovw k_in+8(%%rip), %%k1\n\t"
		"kmovw k_in+16(%%rip), %%k2\n\t"
		"kmovw k_in+24(%%rip), %%k3\n\t"
		"kmovw k_in+32(%%rip), %%k4\n\t"
		"kmovw k_in+40(%%rip), %%k5\n\t"
		"kmovw k_in+48(%%rip), %%k6\n\t"
		"kmovw k_in+56(%%rip), %%k7\n\t"
		"1:\n\t"
		"incq z_count(%%rip)\n\t"
		"pause\n\t"
		"cmpl $0, z_stop(%%rip)\n\t"
		"je 1b\n\t"
		ST(0) ST(1) ST(2) ST(3) ST(4) ST(5) ST(6) ST(7) ST(8) ST(9) ST(10) ST(11) ST(12)
		ST(13) ST(14) ST(15) ST(16) ST(17) ST(18) ST(19) ST(20) ST(21) ST(22) ST(23) ST(24)
		ST(25) ST(26) ST(27) ST(28) ST(29) ST(30) ST(31)
		"kmovw %%k1, k_out+8(%%rip)\n\t"
		"kmovw %%k2, k_out+16(%%rip)\n\t"
		"kmovw %%k3, k_out+24(%%rip)\n\t"
		"kmovw %%k4, k_out+32(%%rip)\n\t"
		"kmovw %%k5, k_out+40(%%rip)\n\t"
		"kmovw %%k6, k_out+48(%%rip)\n\t"
		"kmovw %%k7, k_out+56(%%rip)\n\t"
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
	if (!have_avx512()) {
		ft_log("SKIP: AVX-512F not available");
		ft_ready();
		ft_wait_restored();
		return ft_finish();
	}
	for (int i = 0; i < 32 * 64; i++)
		zmm_in[i] = (unsigned char)(i * 31 + 17 + (i >> 8));
	for (int i = 1; i < 8; i++)
		k_in[i] = (uint64_t)(0x1234 * i + 0x0F0F) & 0xFFFF;
	pthread_t th;
	FT_PT(pthread_create(&th, NULL, spin, NULL));
	double dl = ft_mono() + 10;
	while (z_count < 100000 && ft_mono() < dl)
		ft_sleep_ms(1);
	if (z_count < 100000)
		ft_die("spinner did not start");

	ft_ready();
	ft_wait_restored();

	uint64_t c0 = z_count;
	ft_sleep_ms(100);
	FT_CHECK(z_count > c0, "spinner not running after restore");
	z_stop = 1;
	if (ft_join(th, NULL, 5, "spinner") == 0) {
		for (int r = 0; r < 32; r++)
			for (int part = 0; part < 4; part++)
				if (memcmp(zmm_in + 64 * r + 16 * part, zmm_out + 64 * r + 16 * part, 16) != 0)
					ft_fail("zmm%d bits %d..%d changed", r, part * 128, part * 128 + 127);
		for (int i = 1; i < 8; i++)
			if ((k_out[i] & 0xFFFF) != k_in[i])
				ft_fail("k%d = 0x%llx, expected 0x%llx", i, (unsigned long long)k_out[i],
					(unsigned long long)k_in[i]);
	}
	return ft_finish();
}
