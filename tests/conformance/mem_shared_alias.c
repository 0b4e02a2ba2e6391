/*
 * mem_shared_alias: one MAP_SHARED|MAP_ANONYMOUS object (16 pages) mapped
 * twice in the process (second view made with mremap(old_size=0)), and a
 * shared file mapping mapped twice too. After restore both views of each
 * object must still be the same memory: a write through one is seen through
 * the other, and /proc/self/maps shows the same inode for both views.
 */
#include "ferry_test.h"
#include <sys/mman.h>

#define PG 4096UL
#define NP 16

static unsigned long maps_inode(void *addr)
{
	char buf[1 << 16];
	if (ft_read_file("/proc/self/maps", buf, sizeof(buf)) < 0)
		return 0;
	unsigned long a = (unsigned long)addr;
	char *line = buf;
	while (line && *line) {
		char *nl = strchr(line, '\n');
		if (nl)
			*nl = 0;
		unsigned long s, e, ino;
		if (sscanf(line, "%lx-%lx %*s %*s %*s %lu", &s, &e, &ino) == 3 && a >= s && a < e)
			return ino;
		line = nl ? nl + 1 : NULL;
	}
	return 0;
}

int main(void)
{
	ft_init();
	char *a = mmap(NULL, NP * PG, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (a == MAP_FAILED)
		ft_die("mmap");
	ft_fill(a, NP * PG, 31);
	char *b = mremap(a, 0, NP * PG, MREMAP_MAYMOVE);
	if (b == MAP_FAILED)
		ft_die("mremap alias: %s", strerror(errno));
	FT_CHECK(ft_check_fill(b, NP * PG, 31) < 0, "setup: alias does not show content");

	int fd = (int)FT_SYS(open("alias.bin", O_RDWR | O_CREAT | O_TRUNC, 0644));
	FT_SYS(ftruncate(fd, 4 * PG));
	char *f1 = mmap(NULL, 4 * PG, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	char *f2 = mmap(NULL, 4 * PG, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (f1 == MAP_FAILED || f2 == MAP_FAILED)
		ft_die("mmap file");
	ft_fill(f1, 4 * PG, 77);
	close(fd);
	unsigned long ino_a = maps_inode(a);

	ft_ready();
	ft_wait_restored();

	FT_CHECK(ft_check_fill(a, NP * PG, 31) < 0, "view 1 content differs");
	FT_CHECK(ft_check_fill(b, NP * PG, 31) < 0, "view 2 content differs");
	ft_fill(a + 3 * PG, PG, 99);
	FT_CHECK(ft_check_fill(b + 3 * PG, PG, 99) < 0, "write via view 1 not visible in view 2");
	ft_fill(b + 9 * PG, PG, 98);
	FT_CHECK(ft_check_fill(a + 9 * PG, PG, 98) < 0, "write via view 2 not visible in view 1");
	unsigned long ia = maps_inode(a), ib = maps_inode(b);
	FT_CHECK(ia == ib && ia != 0, "views have different inodes in maps: %lu vs %lu", ia, ib);
	if (ia != ino_a)
		ft_log("shmem inode changed %lu -> %lu (allowed)", ino_a, ia);
	FT_CHECK(ft_check_fill(f2, 4 * PG, 77) < 0, "file view 2 content differs");
	ft_fill(f2 + PG, PG, 55);
	FT_CHECK(ft_check_fill(f1 + PG, PG, 55) < 0, "file views no longer share memory");
	return ft_finish();
}
