/*
 * regs_gp_spin: a thread spins in an asm loop (no syscalls) with known
 * values in every general purpose register it can own (rbx, rbp, rsi, rdi,
 * rdx, rcx, r8-r15) and the direction flag set. The checkpoint interrupts it
 * in user mode; after restore the loop is told to stop and dumps the
 * registers, which must be unchanged. rsp must also be unchanged.
 */
#include "ferry_test.h"

volatile int stop_flag __attribute__((used));
volatile uint64_t spin_count __attribute__((used));
uint64_t out[24] __attribute__((used));

static const uint64_t expect[] = {
	0x1111111111111111ULL, /* rbx */
	0x2222222222222222ULL, /* rbp */
	0x3333333333333333ULL, /* rsi */
	0x4444444444444444ULL, /* rdi */
	0x5555555555555555ULL, /* rdx */
	0x6666666666666666ULL, /* rcx */
	0x8888888888888888ULL, /* r8 */
	0x9999999999999999ULL, /* r9 */
	0xAAAAAAAAAAAAAAAAULL, /* r10 */
	0xBBBBBBBBBBBBBBBBULL, /* r11 */
	0xCCCCCCCCCCCCCCCCULL, /* r12 */
	0xDDDDDDDDDDDDDDDDULL, /* r13 */
	0xEEEEEEEEEEEEEEEEULL, /* r14 */
	0xFEDCBA9876543210ULL, /* r15 */
};
static const char *names[] = { "rbx", "rbp", "rsi", "rdi", "rdx", "rcx", "r8",
			       "r9",  "r10", "r11", "r12", "r13", "r14", "r15" };

static void *spin(void *arg)
{
	(void)arg;
	__asm__ volatile(
		"sub $256, %%rsp\n\t"
		"push %%rbp\n\t"
		"mov %%rsp, out+112(%%rip)\n\t" /* rsp before */
		"movabs $0x1111111111111111, %%rbx\n\t"
		"movabs $0x2222222222222222, %%rbp\n\t"
		"movabs $0x3333333333333333, %%rsi\n\t"
		"movabs $0x4444444444444444, %%rdi\n\t"
		"movabs $0x5555555555555555, %%rdx\n\t"
		"movabs $0x6666666666666666, %%rcx\n\t"
		"movabs $0x8888888888888888, %%r8\n\t"
		"movabs $0x9999999999999999, %%r9\n\t"
		"movabs $0xAAAAAAAAAAAAAAAA, %%r10\n\t"
		"movabs $0xBBBBBBBBBBBBBBBB, %%r11\n\t"
		"movabs $0xCCCCCCCCCCCCCCCC, %%r12\n\t"
		"movabs $0xDDDDDDDDDDDDDDDD, %%r13\n\t"
		"movabs $0xEEEEEEEEEEEEEEEE, %%r14\n\t"
		"movabs $0xFEDCBA9876543210, %%r15\n\t"
		"xor %%eax, %%eax\n\t"
		"std\n\t"
		"1:\n\t"
		"incq %%rax\n\t"
		"incq spin_count(%%rip)\n\t"
		"pause\n\t"
		"cmpl $0, stop_flag(%%rip)\n\t"
		"je 1b\n\t"
		"pushfq\n\t"
		"popq out+120(%%rip)\n\t" /* rflags */
		"cld\n\t"
		"mov %%rbx, out+0(%%rip)\n\t"
		"mov %%rbp, out+8(%%rip)\n\t"
		"mov %%rsi, out+16(%%rip)\n\t"
		"mov %%rdi, out+24(%%rip)\n\t"
		"mov %%rdx, out+32(%%rip)\n\t"
		"mov %%rcx, out+40(%%rip)\n\t"
		"mov %%r8, out+48(%%rip)\n\t"
		"mov %%r9, out+56(%%rip)\n\t"
		"mov %%r10, out+64(%%rip)\n\t"
		"mov %%r11, out+72(%%rip)\n\t"
		"mov %%r12, out+80(%%rip)\n\t"
		"mov %%r13, out+88(%%rip)\n\t"
		"mov %%r14, out+96(%%rip)\n\t"
		"mov %%r15, out+104(%%rip)\n\t"
		"mov %%rax, out+128(%%rip)\n\t" /* loop count */
		"mov %%rsp, out+136(%%rip)\n\t" /* rsp after */
		"pop %%rbp\n\t"
		"add $256, %%rsp\n\t"
		:
		:
		: "rax", "rbx", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10", "r11", "r12", "r13",
		  "r14", "r15", "memory", "cc");
	return NULL;
}

int main(void)
{
	ft_init();
	pthread_t th;
	FT_PT(pthread_create(&th, NULL, spin, NULL));
	double dl = ft_mono() + 10;
	while (spin_count < 100000 && ft_mono() < dl)
		ft_sleep_ms(1);
	if (spin_count < 100000)
		ft_die("spinner did not start");

	ft_ready();
	ft_wait_restored();

	uint64_t c0 = spin_count;
	ft_sleep_ms(100);
	uint64_t c1 = spin_count;
	FT_CHECK(c1 > c0, "spinner not running after restore (%llu -> %llu)", (unsigned long long)c0,
		 (unsigned long long)c1);
	stop_flag = 1;
	if (ft_join(th, NULL, 5, "spinner") == 0) {
		for (int i = 0; i < 14; i++)
			if (out[i] != expect[i])
				ft_fail("%s = 0x%016llx, expected 0x%016llx", names[i],
					(unsigned long long)out[i], (unsigned long long)expect[i]);
		FT_CHECK(out[14] == out[17], "rsp changed: 0x%llx -> 0x%llx", (unsigned long long)out[14],
			 (unsigned long long)out[17]);
		FT_CHECK(out[15] & 0x400, "direction flag lost (rflags 0x%llx)", (unsigned long long)out[15]);
		/* the loop counter lives only in rax: it must be >= the memory counter seen before */
		FT_CHECK(out[16] >= c1, "rax loop counter %llu < memory counter %llu (rax lost)",
			 (unsigned long long)out[16], (unsigned long long)c1);
		FT_CHECK(out[16] == spin_count, "rax loop counter %llu != memory counter %llu",
			 (unsigned long long)out[16], (unsigned long long)spin_count);
	}
	return ft_finish();
}
