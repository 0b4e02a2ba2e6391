/*
 * fpu_sse_x87: a thread spins in asm with known values in xmm0-xmm15, three
 * values on the x87 register stack, a non-default x87 control word
 * (round up, 53-bit precision) and a non-default MXCSR (round toward zero,
 * FTZ, DAZ). After restore it stops and dumps them: all must be bit-exact.
 * The main thread (blocked in sigwaitinfo) has its own rounding mode set
 * (x87 CW 0x077F, MXCSR 0x3F80: round down) which must also be kept.
 */
#include "ferry_test.h"

volatile int fpu_stop __attribute__((used));
volatile uint64_t fpu_count __attribute__((used));
unsigned char xmm_in[256] __attribute__((used, aligned(16)));
unsigned char xmm_out[256] __attribute__((used, aligned(16)));
double x87_in[3] __attribute__((used)) = { 1.5, -2.25, 3.0e100 };
double x87_out[3] __attribute__((used));
uint16_t fcw_in __attribute__((used)) = 0x0A7F;
uint16_t fcw_out __attribute__((used));
uint16_t fcw_saved __attribute__((used));
uint32_t mxcsr_in __attribute__((used)) = 0xFFC0;
uint32_t mxcsr_out __attribute__((used));
uint32_t mxcsr_saved __attribute__((used));

static void *spin(void *arg)
{
	(void)arg;
	__asm__ volatile(
		"fnstcw fcw_saved(%%rip)\n\t"
		"stmxcsr mxcsr_saved(%%rip)\n\t"
		"fldcw fcw_in(%%rip)\n\t"
		"ldmxcsr mxcsr_in(%%rip)\n\t"
		"fldl x87_in+0(%%rip)\n\t"
		"fldl x87_in+8(%%rip)\n\t"
		"fldl x87_in+16(%%rip)\n\t"
		"movdqu xmm_in+0(%%rip), %%xmm0\n\t"
		"movdqu xmm_in+16(%%rip), %%xmm1\n\t"
		"movdqu xmm_in+32(%%rip), %%xmm2\n\t"
		"movdqu xmm_in+48(%%rip), %%xmm3\n\t"
		"movdqu xmm_in+64(%%rip), %%xmm4\n\t"
		"movdqu xmm_in+80(%%rip), %%xmm5\n\t"
		"movdqu xmm_in+96(%%rip), %%xmm6\n\t"
		"movdqu xmm_in+112(%%rip), %%xmm7\n\t"
		"movdqu xmm_in+128(%%rip), %%xmm8\n\t"
		"movdqu xmm_in+144(%%rip), %%xmm9\n\t"
		"movdqu xmm_in+160(%%rip), %%xmm10\n\t"
		"movdqu xmm_in+176(%%rip), %%xmm11\n\t"
		"movdqu xmm_in+192(%%rip), %%xmm12\n\t"
		"movdqu xmm_in+208(%%rip), %%xmm13\n\t"
		"movdqu xmm_in+224(%%rip), %%xmm14\n\t"
		"movdqu xmm_in+240(%%rip), %%xmm15\n\t"
		"1:\n\t"
		"incq fpu_count(%%rip)\n\t"
		"pause\n\t"
		"cmpl $0, fpu_stop(%%rip)\n\t"
		"je 1b\n\t"
		"movdqu %%xmm0, xmm_out+0(%%rip)\n\t"
		"movdqu %%xmm1, xmm_out+16(%%rip)\n\t"
		"movdqu %%xmm2, xmm_out+32(%%rip)\n\t"
		"movdqu %%xmm3, xmm_out+48(%%rip)\n\t"
		"movdqu %%xmm4, xmm_out+64(%%rip)\n\t"
		"movdqu %%xmm5, xmm_out+80(%%rip)\n\t"
		"movdqu %%xmm6, xmm_out+96(%%rip)\n\t"
		"movdqu %%xmm7, xmm_out+112(%%rip)\n\t"
		"movdqu %%xmm8, xmm_out+128(%%rip)\n\t"
		"movdqu %%xmm9, xmm_out+144(%%rip)\n\t"
		"movdqu %%xmm10, xmm_out+160(%%rip)\n\t"
		"movdqu %%xmm11, xmm_out+176(%%rip)\n\t"
		"movdqu %%xmm12, xmm_out+192(%%rip)\n\t"
		"movdqu %%xmm13, xmm_out+208(%%rip)\n\t"
		"movdqu %%xmm14, xmm_out+224(%%rip)\n\t"
		"movdqu %%xmm15, xmm_out+240(%%rip)\n\t"
		"fstpl x87_out+16(%%rip)\n\t"
		"fstpl x87_out+8(%%rip)\n\t"
		"fstpl x87_out+0(%%rip)\n\t"
		"fnstcw fcw_out(%%rip)\n\t"
		"stmxcsr mxcsr_out(%%rip)\n\t"
		"fldcw fcw_saved(%%rip)\n\t"
		"ldmxcsr mxcsr_saved(%%rip)\n\t"
		:
		:
		: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
		  "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "memory", "cc");
	return NULL;
}

int main(void)
{
	ft_init();
	for (int i = 0; i < 256; i++)
		xmm_in[i] = (unsigned char)(i * 7 + 3);
	uint16_t main_cw = 0x077F, main_cw_out = 0;
	uint32_t main_mx = 0x3F80, main_mx_out = 0;
	__asm__ volatile("fldcw %0\n\tldmxcsr %1" : : "m"(main_cw), "m"(main_mx));
	pthread_t th;
	FT_PT(pthread_create(&th, NULL, spin, NULL));
	double dl = ft_mono() + 10;
	while (fpu_count < 100000 && ft_mono() < dl)
		ft_sleep_ms(1);
	if (fpu_count < 100000)
		ft_die("spinner did not start");

	ft_ready();
	ft_wait_restored();

	__asm__ volatile("fnstcw %0\n\tstmxcsr %1" : "=m"(main_cw_out), "=m"(main_mx_out));
	FT_EQ(main_cw_out, main_cw, "main thread x87 control word");
	FT_EQ(main_mx_out & ~0x3Fu, main_mx, "main thread MXCSR (ignoring status flags)");
	uint64_t c0 = fpu_count;
	ft_sleep_ms(100);
	FT_CHECK(fpu_count > c0, "spinner not running after restore");
	fpu_stop = 1;
	if (ft_join(th, NULL, 5, "spinner") == 0) {
		for (int r = 0; r < 16; r++)
			if (memcmp(xmm_in + 16 * r, xmm_out + 16 * r, 16) != 0)
				ft_fail("xmm%d changed", r);
		for (int i = 0; i < 3; i++)
			if (memcmp(&x87_in[i], &x87_out[i], 8) != 0)
				ft_fail("x87 stack value %d changed: %g, expected %g", i, x87_out[i], x87_in[i]);
		FT_EQ(fcw_out, fcw_in, "x87 control word");
		FT_EQ(mxcsr_out, mxcsr_in, "MXCSR");
	}
	return ft_finish();
}
