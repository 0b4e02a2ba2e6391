/*
 * mem_memfd: a memfd ("ferry-memfd", MFD_ALLOW_SEALING) holding 3 pages of
 * pattern, ftruncate'd to 1 MiB (sparse), file offset 100, sealed with
 * F_SEAL_SHRINK|F_SEAL_GROW, and mapped MAP_SHARED. The fd is then also
 * kept as a second, read-only mapping only (fd closed) for a second memfd.
 * After restore: size, offset, seals, /proc/self/fd link name, content via
 * pread and via the mapping, sharing between fd and mapping, and the
 * content of the memfd that is only mapped.
 */
#include "ferry_test.h"
#include <sys/mman.h>

#define PG 4096UL

int main(void)
{
	ft_init();
	int fd = (int)FT_SYS(memfd_create("ferry-memfd", MFD_ALLOW_SEALING));
	char *page = malloc(PG * 3);
	ft_fill(page, 3 * PG, 31337);
	FT_SYS(pwrite(fd, page, 3 * PG, 0));
	FT_SYS(ftruncate(fd, 1 << 20));
	FT_SYS(lseek(fd, 100, SEEK_SET));
	FT_SYS(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW));
	char *m = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED)
		ft_die("mmap");
	ft_fill(m + 10 * PG, PG, 10);
	int seals = (int)FT_SYS(fcntl(fd, F_GET_SEALS));
	char link_before[256] = "", lpath[64];
	snprintf(lpath, sizeof(lpath), "/proc/self/fd/%d", fd);
	FT_SYS(readlink(lpath, link_before, sizeof(link_before) - 1));

	/* a second memfd that is only mapped (no fd left) */
	int fd2 = (int)FT_SYS(memfd_create("ferry-mapped-only", 0));
	FT_SYS(ftruncate(fd2, 4 * PG));
	char *m2 = mmap(NULL, 4 * PG, PROT_READ | PROT_WRITE, MAP_SHARED, fd2, 0);
	if (m2 == MAP_FAILED)
		ft_die("mmap 2");
	close(fd2);
	ft_fill(m2, 4 * PG, 2222);

	ft_ready();
	ft_wait_restored();

	struct stat st;
	FT_SYS(fstat(fd, &st));
	FT_EQ(st.st_size, 1 << 20, "memfd size");
	FT_EQ(lseek(fd, 0, SEEK_CUR), 100, "memfd offset");
	FT_EQ(fcntl(fd, F_GET_SEALS), seals, "memfd seals");
	char link_after[256] = "";
	FT_SYS(readlink(lpath, link_after, sizeof(link_after) - 1));
	FT_CHECK(strcmp(link_before, link_after) == 0, "fd link '%s' -> '%s'", link_before, link_after);
	FT_CHECK(strstr(link_after, "memfd:ferry-memfd") != NULL, "fd link '%s' lacks memfd name", link_after);
	char *got = malloc(3 * PG);
	FT_SYS(pread(fd, got, 3 * PG, 0));
	FT_CHECK(memcmp(got, page, 3 * PG) == 0, "memfd content (pread) differs");
	FT_CHECK(memcmp(m, page, 3 * PG) == 0, "memfd content (mapping) differs");
	FT_CHECK(ft_check_fill(m + 10 * PG, PG, 10) < 0, "page written via mapping differs");
	FT_CHECK(ft_is_zero(m + 20 * PG, 100 * PG), "sparse part not zero");
	FT_SYS(pread(fd, got, PG, 10 * PG));
	FT_CHECK(ft_check_fill(got, PG, 10) < 0, "mapping write not visible via fd");
	ft_fill(m + 30 * PG, PG, 30);
	FT_SYS(pread(fd, got, PG, 30 * PG));
	FT_CHECK(ft_check_fill(got, PG, 30) < 0, "mapping no longer shared with the memfd");
	FT_CHECK(ftruncate(fd, PG) < 0 && errno == EPERM, "F_SEAL_SHRINK not enforced");
	struct ft_vma v;
	if (ft_find_vma(m2, &v) == 0) {
		FT_CHECK(strstr(v.path, "memfd:ferry-mapped-only") != NULL, "mapped-only memfd path '%s'",
			 v.path);
		FT_CHECK(strcmp(v.perms, "rw-s") == 0, "mapped-only memfd perms %s", v.perms);
	} else {
		ft_fail("mapped-only memfd mapping gone");
	}
	FT_CHECK(ft_check_fill(m2, 4 * PG, 2222) < 0, "mapped-only memfd content differs");
	return ft_finish();
}
