/*
 * tree_memfd_shared: a memfd ("ferry-tree", 256 KiB) mapped MAP_SHARED by
 * the root before the fork; the fd and the mapping are inherited and kept
 * open in both, and the child maps it a second time itself (64 KiB at
 * offset 64 KiB). Pages written before READY by both. After restore, in
 * both processes: the fd is still "/memfd:ferry-tree (deleted)" with size
 * 256 KiB, every mapping is at the same address with the fd's inode, the
 * contents are intact; writes through a mapping in one process are visible
 * in the other through its mappings and through read()/pread() on the fd,
 * and pwrite() on the fd shows in the other's mapping.
 *
 * Synchronisation: report pipe before READY; after restore the root checks
 * and writes, sends the go, and reaps the child before looking for the
 * child's writes.
 */
#include "ferry_test.h"
#include <sys/mman.h>

#define SIZE (256UL << 10)
#define PG 4096UL

/* Inode column of the /proc/self/maps line containing addr (-1 if none). */
static long maps_inode(const void *addr)
{
	static char buf[1 << 18];
	unsigned long a = (unsigned long)addr;
	if (ft_read_file("/proc/self/maps", buf, sizeof(buf)) < 0)
		return -1;
	for (char *line = buf; line && *line;) {
		char *nl = strchr(line, '\n');
		if (nl)
			*nl = 0;
		unsigned long s, e, ino;
		if (sscanf(line, "%lx-%lx %*s %*s %*s %lu", &s, &e, &ino) == 3 && a >= s && a < e)
			return (long)ino;
		line = nl ? nl + 1 : NULL;
	}
	return -1;
}

/* Checks the fd and returns its inode (0 if unusable). */
static long check_fd(const char *who, int fd)
{
	char p[64], link[256];
	snprintf(p, sizeof(p), "/proc/self/fd/%d", fd);
	ssize_t n = readlink(p, link, sizeof(link) - 1);
	link[n > 0 ? n : 0] = 0;
	FT_CHECK(strcmp(link, "/memfd:ferry-tree (deleted)") == 0, "%s: fd %d links to '%s'", who, fd, link);
	struct stat st;
	if (fstat(fd, &st) != 0) {
		ft_fail("%s: fstat(memfd): %s", who, strerror(errno));
		return 0;
	}
	FT_CHECK(st.st_size == (off_t)SIZE, "%s: memfd size %lld, expected %lu", who, (long long)st.st_size, SIZE);
	return (long)st.st_ino;
}

static void check_mapping(const char *who, const char *what, const void *addr, const struct ft_vma *b, long ino)
{
	struct ft_vma v;
	if (ft_find_vma(addr, &v) != 0) {
		ft_fail("%s: %s at %p gone", who, what, addr);
		return;
	}
	FT_CHECK(v.start == b->start && v.end == b->end && v.offset == b->offset,
		 "%s: %s %lx-%lx off %lx, expected %lx-%lx off %lx", who, what, v.start, v.end, v.offset, b->start,
		 b->end, b->offset);
	FT_CHECK(strcmp(v.perms, "rw-s") == 0, "%s: %s perms %s, expected rw-s", who, what, v.perms);
	FT_CHECK(strcmp(v.path, "/memfd:ferry-tree (deleted)") == 0, "%s: %s path '%s'", who, what, v.path);
	long got = maps_inode(addr);
	FT_CHECK(got == ino, "%s: %s inode %ld, fd inode %ld (not the same memfd)", who, what, got, ino);
}

static void check_page(const char *who, const char *what, const char *p, uint64_t seed)
{
	long bad = ft_check_fill(p, PG, seed);
	FT_CHECK(bad < 0, "%s: %s (seed %llu) differs at word %ld", who, what, (unsigned long long)seed, bad);
}

/*
 * Pages: 0 root before READY (seed 1); 17 child through its own mapping
 * before READY (2); 2 root after restore through the mapping (3); 20 child
 * after restore through its own mapping (4); 5 child with pwrite (5).
 * The child's own mapping covers pages 16..31.
 */
int main(void)
{
	ft_init();
	int fd = (int)FT_SYS(memfd_create("ferry-tree", 0));
	FT_SYS(ftruncate(fd, SIZE));
	char *m = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED)
		ft_die("mmap: %s", strerror(errno));
	struct ft_vma mb;
	if (ft_find_vma(m, &mb) != 0)
		ft_die("mapping not in maps");
	ft_fill(m, PG, 1);

	ft_tree_begin();
	pid_t kid = ft_fork();
	if (kid == 0) {
		char *own = mmap(NULL, 16 * PG, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 16 * PG);
		if (own == MAP_FAILED)
			ft_die("child: mmap: %s", strerror(errno));
		struct ft_vma ob;
		if (ft_find_vma(own, &ob) != 0)
			ft_die("child: own mapping not in maps");
		ft_fill(own + PG, PG, 2);
		ft_child_ready();

		ft_child_wait_go();
		long ino = check_fd("child", fd);
		check_mapping("child", "inherited mapping", m, &mb, ino);
		check_mapping("child", "own mapping", own, &ob, ino);
		check_page("child", "inherited mapping page 0", m, 1);
		check_page("child", "inherited mapping page 17", m + 17 * PG, 2);
		check_page("child", "own mapping page 17", own + PG, 2);
		check_page("child", "inherited mapping page 2 (root's write after restore)", m + 2 * PG, 3);
		static char page[PG];
		FT_SYS(lseek(fd, 2 * PG, SEEK_SET));
		FT_EQ(read(fd, page, PG), PG, "child: read() page 2");
		check_page("child", "read() of page 2 (root's write after restore)", page, 3);
		ft_fill(own + 4 * PG, PG, 4);
		check_page("child", "inherited mapping page 20 (own mapping's write)", m + 20 * PG, 4);
		ft_fill(page, PG, 5);
		FT_EQ(pwrite(fd, page, PG, 5 * PG), PG, "child: pwrite page 5");
		check_page("child", "inherited mapping page 5 (its pwrite)", m + 5 * PG, 5);
		ft_child_exit("child");
	}
	ft_tree_wait_ready(1);
	if (ft_check_fill(m + 17 * PG, PG, 2) >= 0)
		ft_die("child's write before READY not visible in the root");

	ft_ready();
	ft_tree_wait_restored();

	long ino = check_fd("root", fd);
	check_mapping("root", "mapping", m, &mb, ino);
	check_page("root", "page 0", m, 1);
	check_page("root", "page 17 (child's write before READY)", m + 17 * PG, 2);
	ft_fill(m + 2 * PG, PG, 3);
	ft_go(kid, "child");
	ft_reap(kid, "child");
	check_page("root", "page 20 (child's write through its own mapping)", m + 20 * PG, 4);
	check_page("root", "page 5 (child's pwrite)", m + 5 * PG, 5);
	static char page[PG];
	FT_EQ(pread(fd, page, PG, 20 * PG), PG, "root: pread page 20");
	check_page("root", "pread of page 20 (child's write through its mapping)", page, 4);
	FT_EQ(lseek(fd, 0, SEEK_CUR), 3 * PG, "root: fd offset after the child's read() (shared description)");
	return ft_finish();
}
