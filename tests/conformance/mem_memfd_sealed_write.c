/*
 * mem_memfd_sealed_write: a memfd sealed against writes (F_SEAL_WRITE,
 * then F_SEAL_SEAL) and mapped MAP_SHARED read-only afterwards, as a
 * service shares a frozen blob; a second memfd sealed with
 * F_SEAL_FUTURE_WRITE while a writable shared mapping of it existed.
 * After restore: the seals, the content through fd and mappings, writes
 * through the fd refused (EPERM), a new writable shared mapping of the
 * first refused, the old writable mapping of the second still writes.
 */
#include "ferry_test.h"
#include <sys/mman.h>

#define PG 4096

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

int main(void)
{
	ft_init();
	int a = (int)FT_SYS(memfd_create("ferry-sealed", MFD_ALLOW_SEALING));
	FT_SYS(ftruncate(a, 2 * PG));
	char page[PG];
	ft_fill(page, PG, 7);
	FT_SYS(pwrite(a, page, PG, PG));
	FT_SYS(fcntl(a, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL));
	char *ma = mmap(NULL, 2 * PG, PROT_READ, MAP_SHARED, a, 0);
	if (ma == MAP_FAILED)
		ft_die("mmap sealed: %s", strerror(errno));

	int b = (int)FT_SYS(memfd_create("ferry-future", MFD_ALLOW_SEALING));
	FT_SYS(ftruncate(b, PG));
	char *mb = mmap(NULL, PG, PROT_READ | PROT_WRITE, MAP_SHARED, b, 0);
	if (mb == MAP_FAILED)
		ft_die("mmap future: %s", strerror(errno));
	memcpy(mb, "before", 6);
	FT_SYS(fcntl(b, F_ADD_SEALS, F_SEAL_FUTURE_WRITE));
	int seals_a = (int)FT_SYS(fcntl(a, F_GET_SEALS));
	int seals_b = (int)FT_SYS(fcntl(b, F_GET_SEALS));

	ft_ready();
	ft_wait_restored();

	FT_EQ(fcntl(a, F_GET_SEALS), seals_a, "seals of the write-sealed memfd");
	FT_EQ(fcntl(b, F_GET_SEALS), seals_b, "seals of the future-write-sealed memfd");
	FT_CHECK(ft_check_fill(ma + PG, PG, 7) < 0, "content of the sealed memfd's mapping");
	FT_CHECK(ft_is_zero(ma, PG), "first page of the sealed memfd not zero");
	FT_CHECK(pwrite(a, "x", 1, 0) < 0 && errno == EPERM, "write to the sealed memfd not refused");
	FT_CHECK(mmap(NULL, PG, PROT_READ | PROT_WRITE, MAP_SHARED, a, 0) == MAP_FAILED,
		 "writable shared mapping of the sealed memfd not refused");
	FT_CHECK(memcmp(mb, "before", 6) == 0, "content of the future-write-sealed memfd");
	memcpy(mb, "after!", 6);
	char buf[6] = "";
	FT_CHECK(pread(b, buf, 6, 0) == 6 && memcmp(buf, "after!", 6) == 0,
		 "the writable mapping made before F_SEAL_FUTURE_WRITE no longer writes the memfd");
	FT_CHECK(pwrite(b, "x", 1, 0) < 0 && errno == EPERM, "write to the future-write-sealed memfd not refused");
	return ft_finish();
}
