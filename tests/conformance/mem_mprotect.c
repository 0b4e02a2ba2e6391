/*
 * mem_mprotect: an 8-page anonymous region filled with a pattern (and a
 * tiny function in pages 4-5) is split by mprotect into RW (0-1), R (2-3),
 * RX (4-5) and PROT_NONE (6-7). After restore: /proc/self/maps shows the
 * four VMAs with exactly those bounds and permissions, contents are kept
 * (including the PROT_NONE pages, checked after mprotect back to R), the RX
 * code runs, writing the R page raises SIGSEGV (SEGV_ACCERR at that address,
 * caught with siglongjmp) and reading a PROT_NONE page raises SIGSEGV.
 */
#include "ferry_test.h"
#include <setjmp.h>
#include <sys/mman.h>

#define PG 4096UL

static sigjmp_buf jb;
static volatile void *fault_addr;
static volatile int fault_code;

static void on_segv(int sig, siginfo_t *si, void *uc)
{
	(void)sig;
	(void)uc;
	fault_addr = si->si_addr;
	fault_code = si->si_code;
	siglongjmp(jb, 1);
}

static int try_write(volatile char *p)
{
	fault_addr = NULL;
	if (sigsetjmp(jb, 1) == 0) {
		*p = 1;
		return 0;
	}
	return 1;
}

static int try_read(volatile char *p)
{
	fault_addr = NULL;
	if (sigsetjmp(jb, 1) == 0) {
		volatile char c = *p;
		(void)c;
		return 0;
	}
	return 1;
}

/* mov $42, %eax ; ret */
static const unsigned char code[] = { 0xb8, 0x2a, 0x00, 0x00, 0x00, 0xc3 };

int main(void)
{
	ft_init();
	char *m = mmap(NULL, 8 * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		ft_die("mmap");
	ft_fill(m, 8 * PG, 808);
	memcpy(m + 4 * PG + 100, code, sizeof(code));
	FT_SYS(mprotect(m + 2 * PG, 2 * PG, PROT_READ));
	FT_SYS(mprotect(m + 4 * PG, 2 * PG, PROT_READ | PROT_EXEC));
	FT_SYS(mprotect(m + 6 * PG, 2 * PG, PROT_NONE));
	struct sigaction sa = { .sa_sigaction = on_segv, .sa_flags = SA_SIGINFO | SA_NODEFER };
	FT_SYS(sigaction(SIGSEGV, &sa, NULL));
	uint64_t exp_rx[PG * 2 / 8];
	memcpy(exp_rx, m + 4 * PG, 2 * PG);

	ft_ready();
	ft_wait_restored();

	static const struct {
		int pg;
		const char *perms;
	} parts[] = { { 0, "rw-p" }, { 2, "r--p" }, { 4, "r-xp" }, { 6, "---p" } };
	for (int i = 0; i < 4; i++) {
		struct ft_vma v;
		if (ft_find_vma(m + parts[i].pg * PG, &v) != 0) {
			ft_fail("no vma for page %d", parts[i].pg);
			continue;
		}
		FT_CHECK(strcmp(v.perms, parts[i].perms) == 0, "pages %d-%d perms %s, expected %s", parts[i].pg,
			 parts[i].pg + 1, v.perms, parts[i].perms);
		FT_CHECK(v.start == (unsigned long)(m + parts[i].pg * PG) &&
				 v.end == (unsigned long)(m + (parts[i].pg + 2) * PG),
			 "pages %d-%d vma %lx-%lx (expected exact split)", parts[i].pg, parts[i].pg + 1, v.start,
			 v.end);
	}
	FT_CHECK(ft_check_fill(m, 4 * PG, 808) < 0, "RW/R pages content differs");
	FT_CHECK(memcmp(m + 4 * PG, exp_rx, 2 * PG) == 0, "RX pages content differs");
	int (*fn)(void) = (int (*)(void))(m + 4 * PG + 100);
	FT_EQ(fn(), 42, "code in RX page");

	FT_CHECK(try_write(m + 2 * PG + 8), "write to read-only page did not fault");
	FT_CHECK(fault_addr == m + 2 * PG + 8, "fault address %p, expected %p", fault_addr, m + 2 * PG + 8);
	FT_EQ(fault_code, SEGV_ACCERR, "si_code of write to read-only page");
	FT_CHECK(try_read(m + 6 * PG + 16), "read of PROT_NONE page did not fault");
	FT_CHECK(fault_addr == m + 6 * PG + 16, "fault address %p", fault_addr);
	FT_CHECK(!try_write(m + 8), "write to RW page faulted");

	FT_SYS(mprotect(m + 6 * PG, 2 * PG, PROT_READ));
	/* pattern indices are relative to the start of the fill (page 0) */
	long bad = -1;
	const uint64_t *w = (const uint64_t *)(m + 6 * PG);
	for (unsigned long i = 0; i < 2 * PG / 8; i++)
		if (w[i] != ft_pat(808, 6 * PG / 8 + i)) {
			bad = (long)i;
			break;
		}
	FT_CHECK(bad < 0, "PROT_NONE pages lost their content (word %ld)", bad);
	return ft_finish();
}
