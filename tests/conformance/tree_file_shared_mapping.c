/*
 * tree_file_shared_mapping: the regular file "shared.map" (16 pages, in the
 * test dir) mapped MAP_SHARED by the root before the fork (the root closes
 * its fd; the child inherits the mapping), and mapped a second time by the
 * child itself (pages 8..15, opened and closed by the child). Pages written
 * through the mappings before READY by both. After restore, in both
 * processes: the mappings are at the same addresses and offsets on
 * <cwd>/shared.map (rw-s, the file's inode), contents intact; writes through
 * a mapping in one process are visible in the other process's mappings and
 * in the file (pread on a fresh fd), and a pwrite to the file shows in the
 * mappings of both.
 *
 * Synchronisation: report pipe before READY; after restore the root checks
 * and writes, sends the go, and reaps the child before looking for the
 * child's writes.
 */
#include "ferry_test.h"
#include <sys/mman.h>

#define PG 4096UL
#define NP 16

static char fpath[512];

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

static long file_inode(void)
{
	struct stat st;
	if (stat("shared.map", &st) != 0)
		return -2;
	return (long)st.st_ino;
}

static void check_mapping(const char *who, const char *what, const void *addr, const struct ft_vma *b)
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
	FT_CHECK(strcmp(v.path, fpath) == 0, "%s: %s path '%s', expected '%s'", who, what, v.path, fpath);
	long ino = maps_inode(addr), fino = file_inode();
	FT_CHECK(ino == fino, "%s: %s inode %ld, file's inode %ld", who, what, ino, fino);
}

static void check_page(const char *who, const char *what, const char *p, uint64_t seed)
{
	long bad = ft_check_fill(p, PG, seed);
	FT_CHECK(bad < 0, "%s: %s (seed %llu) differs at word %ld", who, what, (unsigned long long)seed, bad);
}

static void check_file_page(const char *who, const char *what, unsigned long pg, uint64_t seed)
{
	static char page[PG];
	int fd = open("shared.map", O_RDONLY);
	if (fd < 0) {
		ft_fail("%s: open shared.map: %s", who, strerror(errno));
		return;
	}
	ssize_t n = pread(fd, page, PG, (off_t)(pg * PG));
	close(fd);
	if (n != (ssize_t)PG) {
		ft_fail("%s: pread page %lu of shared.map: %zd", who, pg, n);
		return;
	}
	check_page(who, what, page, seed);
}

static void pwrite_page(const char *who, unsigned long pg, uint64_t seed)
{
	static char page[PG];
	ft_fill(page, PG, seed);
	int fd = open("shared.map", O_WRONLY);
	if (fd < 0 || pwrite(fd, page, PG, (off_t)(pg * PG)) != (ssize_t)PG)
		ft_fail("%s: pwrite page %lu of shared.map: %s", who, pg, strerror(errno));
	if (fd >= 0)
		close(fd);
}

/*
 * Pages (seeds): file content 50+i; 0 root through its mapping before READY
 * (1); 9 child through its own mapping before READY (2); 3 root after
 * restore (3); 12 child after restore through its own mapping (4); 4 child
 * pwrite (5); 6 root pwrite (6).
 */
int main(void)
{
	ft_init();
	char cwd[400];
	if (!getcwd(cwd, sizeof(cwd)))
		ft_die("getcwd: %s", strerror(errno));
	snprintf(fpath, sizeof(fpath), "%s/shared.map", cwd);
	int fd = (int)FT_SYS(open("shared.map", O_RDWR | O_CREAT | O_TRUNC, 0600));
	static char page[PG];
	for (unsigned long i = 0; i < NP; i++) {
		ft_fill(page, PG, 50 + i);
		FT_SYS(write(fd, page, PG));
	}
	char *m = mmap(NULL, NP * PG, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED)
		ft_die("mmap: %s", strerror(errno));
	close(fd);
	struct ft_vma mb;
	if (ft_find_vma(m, &mb) != 0)
		ft_die("mapping not in maps");
	ft_fill(m, PG, 1);

	ft_tree_begin();
	pid_t kid = ft_fork();
	if (kid == 0) {
		int cfd = (int)FT_SYS(open("shared.map", O_RDWR));
		char *own = mmap(NULL, 8 * PG, PROT_READ | PROT_WRITE, MAP_SHARED, cfd, 8 * PG);
		if (own == MAP_FAILED)
			ft_die("child: mmap: %s", strerror(errno));
		close(cfd);
		struct ft_vma ob;
		if (ft_find_vma(own, &ob) != 0)
			ft_die("child: own mapping not in maps");
		ft_fill(own + PG, PG, 2);
		ft_child_ready();

		ft_child_wait_go();
		check_mapping("child", "inherited mapping", m, &mb);
		check_mapping("child", "own mapping", own, &ob);
		check_page("child", "inherited mapping page 0", m, 1);
		check_page("child", "inherited mapping page 9", m + 9 * PG, 2);
		check_page("child", "own mapping page 9", own + PG, 2);
		check_page("child", "own mapping page 10 (file content)", own + 2 * PG, 60);
		check_page("child", "inherited mapping page 3 (root's write after restore)", m + 3 * PG, 3);
		check_page("child", "inherited mapping page 6 (root's pwrite after restore)", m + 6 * PG, 6);
		check_file_page("child", "file page 3 (root's write through its mapping)", 3, 3);
		ft_fill(own + 4 * PG, PG, 4);
		check_page("child", "inherited mapping page 12 (own mapping's write)", m + 12 * PG, 4);
		pwrite_page("child", 4, 5);
		check_page("child", "inherited mapping page 4 (its pwrite)", m + 4 * PG, 5);
		ft_child_exit("child");
	}
	ft_tree_wait_ready(1);
	if (ft_check_fill(m + 9 * PG, PG, 2) >= 0)
		ft_die("child's write before READY not visible in the root");

	ft_ready();
	ft_tree_wait_restored();

	check_mapping("root", "mapping", m, &mb);
	check_page("root", "page 0", m, 1);
	check_page("root", "page 9 (child's write before READY)", m + 9 * PG, 2);
	check_page("root", "page 1 (file content)", m + PG, 51);
	check_file_page("root", "file page 0 (root's write before READY)", 0, 1);
	check_file_page("root", "file page 9 (child's write before READY)", 9, 2);
	ft_fill(m + 3 * PG, PG, 3);
	pwrite_page("root", 6, 6);
	ft_go(kid, "child");
	ft_reap(kid, "child");
	check_page("root", "page 12 (child's write through its own mapping)", m + 12 * PG, 4);
	check_page("root", "page 4 (child's pwrite)", m + 4 * PG, 5);
	check_file_page("root", "file page 12 (child's write through its mapping)", 12, 4);
	return ft_finish();
}
