/*
 * regs_gp_syscall: the main thread waits for SIGUSR2 with a raw
 * rt_sigtimedwait syscall issued from inline asm, with known values in
 * rbx, rbp, r8, r9, r12-r15 (and the syscall arguments in rdi, rsi, rdx, r10).
 * The kernel preserves all of these across a syscall, so after the
 * checkpoint/restore (which happens while the thread is in that syscall)
 * every one of them must still hold its value.
 */
#include "ferry_test.h"

uint64_t regs_out[16] __attribute__((used));

static const uint64_t expect[] = {
	0x0123456789ABCDEFULL, /* rbx */
	0x1122334455667788ULL, /* rbp */
	0x8888000088880000ULL, /* r8 */
	0x9999000099990000ULL, /* r9 */
	0xC0C0C0C0C0C0C0C0ULL, /* r12 */
	0xD0D0D0D0D0D0D0D0ULL, /* r13 */
	0xE0E0E0E0E0E0E0E0ULL, /* r14 */
	0xF0F0F0F0F0F0F0F0ULL, /* r15 */
};
static const char *names[] = { "rbx", "rbp", "r8", "r9", "r12", "r13", "r14", "r15" };

int main(void)
{
	ft_init();
	sigset_t set;
	siginfo_t si;
	sigemptyset(&set);
	sigaddset(&set, SIGUSR2);
	ft_ready();

	long ret;
	int rounds = 0;
	do {
		rounds++;
		memset(regs_out, 0, sizeof(regs_out));
		register long a_rdi __asm__("rdi") = (long)&set;
		register long a_rsi __asm__("rsi") = (long)&si;
		register long a_rdx __asm__("rdx") = 0;
		register long a_r10 __asm__("r10") = 8;
		__asm__ volatile(
			"sub $128, %%rsp\n\t"
			"push %%rbp\n\t"
			"mov %%rsp, regs_out+80(%%rip)\n\t"
			"movabs $0x0123456789ABCDEF, %%rbx\n\t"
			"movabs $0x1122334455667788, %%rbp\n\t"
			"movabs $0x8888000088880000, %%r8\n\t"
			"movabs $0x9999000099990000, %%r9\n\t"
			"movabs $0xC0C0C0C0C0C0C0C0, %%r12\n\t"
			"movabs $0xD0D0D0D0D0D0D0D0, %%r13\n\t"
			"movabs $0xE0E0E0E0E0E0E0E0, %%r14\n\t"
			"movabs $0xF0F0F0F0F0F0F0F0, %%r15\n\t"
			"mov $128, %%eax\n\t" /* __NR_rt_sigtimedwait */
			"syscall\n\t"
			"mov %%rbx, regs_out+0(%%rip)\n\t"
			"mov %%rbp, regs_out+8(%%rip)\n\t"
			"mov %%r8, regs_out+16(%%rip)\n\t"
			"mov %%r9, regs_out+24(%%rip)\n\t"
			"mov %%r12, regs_out+32(%%rip)\n\t"
			"mov %%r13, regs_out+40(%%rip)\n\t"
			"mov %%r14, regs_out+48(%%rip)\n\t"
			"mov %%r15, regs_out+56(%%rip)\n\t"
			"mov %%rsp, regs_out+88(%%rip)\n\t"
			"pop %%rbp\n\t"
			"add $128, %%rsp\n\t"
			: "=a"(ret), "+r"(a_rdi), "+r"(a_rsi), "+r"(a_rdx), "+r"(a_r10)
			:
			: "rbx", "rcx", "r8", "r9", "r11", "r12", "r13", "r14", "r15", "memory", "cc");
		for (int i = 0; i < 8; i++)
			if (regs_out[i] != expect[i])
				ft_fail("%s = 0x%016llx after syscall (round %d), expected 0x%016llx", names[i],
					(unsigned long long)regs_out[i], rounds,
					(unsigned long long)expect[i]);
		FT_CHECK(regs_out[10] == regs_out[11], "rsp changed across syscall: 0x%llx -> 0x%llx",
			 (unsigned long long)regs_out[10], (unsigned long long)regs_out[11]);
		FT_CHECK(a_rdi == (long)&set, "rdi (arg1) changed: 0x%lx", a_rdi);
		FT_CHECK(a_rsi == (long)&si, "rsi (arg2) changed: 0x%lx", a_rsi);
		FT_CHECK(a_rdx == 0, "rdx (arg3) changed: 0x%lx", a_rdx);
		FT_CHECK(a_r10 == 8, "r10 (arg4) changed: 0x%lx", a_r10);
	} while (ret == -EINTR && rounds < 100);

	FT_EQ(ret, SIGUSR2, "rt_sigtimedwait return value");
	FT_EQ(si.si_signo, SIGUSR2, "siginfo si_signo");
	if (rounds > 1)
		ft_log("rt_sigtimedwait returned EINTR %d time(s)", rounds - 1);
	return ft_finish();
}
