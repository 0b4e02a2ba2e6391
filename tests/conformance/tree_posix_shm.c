/*
 * tree_posix_shm: a POSIX shared memory object "/ferry-conf-<pid>" (1 MiB,
 * ftruncate'd) mapped MAP_SHARED by the root before the fork (the root
 * then closes its fd: it keeps only the mapping, inherited by the child);
 * the child shm_open()s it again itself, keeps that fd and maps it a
 * second time. Contents written before READY by both. After restore: the
 * mappings are at the same addresses on /dev/shm/ferry-conf-<pid> with the
 * inode of the object that shm_open now finds, the child's fd is that
 * object with size 1 MiB, contents intact, and writes by one process are
 * visible in the other (through both child mappings, its fd and a fresh
 * shm_open in the root). shm_unlink at the end, and by ft_die/the safety
 * alarm.
 *
 * Synchronisation: report pipe before READY; after restore the root checks
 * and writes, sends the go, and reaps the child before looking for the
 * child's writes.
 */
#include "ferry_test.h"
#include <sys/mman.h>

#define SIZE (1UL << 20)
#define PG 4096UL

static char name[64];
static int created;

static void cleanup(void)
{
	if (created && shm_unlink(name) != 0)
		ft_log("shm_unlink(%s): %s", name, strerror(errno));
	created = 0;
}

/* Inode column and path of the /proc/self/maps line containing addr (-1 if none). */
static long maps_inode(const void *addr, char *path, size_t psz)
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
		int pos = 0;
		if (sscanf(line, "%lx-%lx %*s %*s %*s %lu%n", &s, &e, &ino, &pos) == 3 && a >= s && a < e) {
			const char *p = line + pos;
			while (*p == ' ')
				p++;
			snprintf(path, psz, "%s", p);
			return (long)ino;
		}
		line = nl ? nl + 1 : NULL;
	}
	return -1;
}

/* The mapping at addr must be the shm object (inode ino) mapped shared. */
static void check_mapping(const char *who, const char *what, const void *addr, const struct ft_vma *b, long ino)
{
	struct ft_vma v;
	char path[512], want[128];
	if (ft_find_vma(addr, &v) != 0) {
		ft_fail("%s: %s at %p gone", who, what, addr);
		return;
	}
	FT_CHECK(v.start == b->start && v.end == b->end, "%s: %s bounds %lx-%lx, expected %lx-%lx", who, what, v.start,
		 v.end, b->start, b->end);
	FT_CHECK(strcmp(v.perms, "rw-s") == 0, "%s: %s perms %s, expected rw-s", who, what, v.perms);
	long got = maps_inode(addr, path, sizeof(path));
	snprintf(want, sizeof(want), "/dev/shm%s", name);
	FT_CHECK(strcmp(path, want) == 0, "%s: %s path '%s', expected '%s'", who, what, path, want);
	FT_CHECK(got == ino, "%s: %s inode %ld, expected %ld (the object shm_open finds)", who, what, got, ino);
}

static void check_content(const char *who, const char *what, const char *addr, size_t off, uint64_t seed)
{
	long bad = ft_check_fill(addr + off, PG, seed);
	FT_CHECK(bad < 0, "%s: %s: page at offset %zu (seed %llu) differs at word %ld", who, what, off,
		 (unsigned long long)seed, bad);
}

/*
 * Page layout: 0 root before READY (seed 1), 1 child before READY (2),
 * 2 root after restore (3), 3 child after restore through its own mapping
 * (4), 4 child after restore with pwrite (5), 100 root with pwrite on a
 * fresh fd (6).
 */
int main(void)
{
	ft_init();
	ft_set_cleanup(cleanup);
	snprintf(name, sizeof(name), "/ferry-conf-%d", (int)getpid());
	int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
	if (fd < 0)
		ft_die("shm_open(%s): %s", name, strerror(errno));
	created = 1;
	FT_SYS(ftruncate(fd, SIZE));
	char *m = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
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
		int cfd = shm_open(name, O_RDWR, 0);
		if (cfd < 0)
			ft_die("child: shm_open(%s): %s", name, strerror(errno));
		char *own = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, cfd, 0);
		if (own == MAP_FAILED)
			ft_die("child: mmap: %s", strerror(errno));
		struct ft_vma ob;
		if (ft_find_vma(own, &ob) != 0)
			ft_die("child: own mapping not in maps");
		ft_fill(own + PG, PG, 2);
		ft_child_ready();

		ft_child_wait_go();
		struct stat st;
		if (fstat(cfd, &st) != 0) {
			ft_fail("child: fstat of its shm fd: %s", strerror(errno));
			st.st_ino = 0;
		} else {
			FT_EQ(st.st_size, SIZE, "child: size of the shm object (fstat)");
		}
		char link[128], fdp[64], want[128];
		snprintf(fdp, sizeof(fdp), "/proc/self/fd/%d", cfd);
		ssize_t ln = readlink(fdp, link, sizeof(link) - 1);
		link[ln > 0 ? ln : 0] = 0;
		snprintf(want, sizeof(want), "/dev/shm%s", name);
		FT_CHECK(strcmp(link, want) == 0, "child: fd %d links to '%s', expected '%s'", cfd, link, want);
		check_mapping("child", "inherited mapping", m, &mb, (long)st.st_ino);
		check_mapping("child", "own mapping", own, &ob, (long)st.st_ino);
		const char *views[2] = { m, own };
		const char *vname[2] = { "inherited mapping", "own mapping" };
		for (int v = 0; v < 2; v++) {
			check_content("child", vname[v], views[v], 0, 1);
			check_content("child", vname[v], views[v], PG, 2);
			check_content("child", vname[v], views[v], 2 * PG, 3);
		}
		static char page[PG];
		FT_EQ(pread(cfd, page, PG, 2 * PG), PG, "child: pread");
		check_content("child", "pread of the root's page", page, 0, 3);
		ft_fill(own + 3 * PG, PG, 4);
		ft_fill(page, PG, 5);
		FT_EQ(pwrite(cfd, page, PG, 4 * PG), PG, "child: pwrite");
		check_content("child", "inherited mapping after its pwrite", m, 4 * PG, 5);
		ft_child_exit("child");
	}
	ft_tree_wait_ready(1);
	if (ft_check_fill(m + PG, PG, 2) >= 0)
		ft_die("child's write before READY not visible in the root");

	ft_ready();
	ft_tree_wait_restored();

	int nfd = shm_open(name, O_RDWR, 0);
	struct stat st;
	if (nfd < 0 || fstat(nfd, &st) != 0) {
		ft_fail("root: shm_open(%s) after restore: %s", name, strerror(errno));
		st.st_ino = 0;
		nfd = -1;
	} else {
		FT_EQ(st.st_size, SIZE, "root: size of the shm object");
	}
	check_mapping("root", "mapping", m, &mb, (long)st.st_ino);
	check_content("root", "mapping", m, 0, 1);
	check_content("root", "mapping", m, PG, 2);
	ft_fill(m + 2 * PG, PG, 3);
	ft_go(kid, "child");
	ft_reap(kid, "child");
	check_content("root", "mapping (child's write through its own mapping)", m, 3 * PG, 4);
	check_content("root", "mapping (child's pwrite)", m, 4 * PG, 5);
	if (nfd >= 0) {
		static char page[PG];
		ft_fill(page, PG, 6);
		FT_EQ(pwrite(nfd, page, PG, 100 * PG), PG, "root: pwrite on a fresh fd");
		check_content("root", "mapping (pwrite on a fresh fd)", m, 100 * PG, 6);
		FT_EQ(pread(nfd, page, PG, 3 * PG), PG, "root: pread on a fresh fd");
		check_content("root", "pread on a fresh fd (child's write)", page, 0, 4);
		close(nfd);
	}
	ft_run_cleanup();
	return ft_finish();
}
