/*
 * tree_sysv_shm: SysV shared memory used by the root and a child.
 *   seg 1: key from ftok("shm.key" in the test dir), 64 KiB, mode 0640,
 *          attached by the root before the fork (inherited by the child);
 *   seg 2: IPC_PRIVATE, 128 KiB, mode 0600, attached likewise;
 *   seg 3: IPC_PRIVATE, 32 KiB, mode 0604, attached by the root before the
 *          fork; the child attaches it again itself (at another address)
 *          and detaches the inherited attachment.
 * Contents written before READY (segs 1 and 2 by the root, seg 3 by the
 * child). After restore: shmget(key, 0, 0) returns the same id; IPC_STAT
 * size, mode, key and nattch (2) unchanged; each attachment is at the same
 * address with the shmid as its inode in /proc/self/maps; contents intact;
 * writes by the root are seen by the child and the other way round.
 * Seg 2 is IPC_RMID'd just before READY and must still be marked for
 * removal (SHM_DEST) after restore, the others not.
 * Everything is IPC_RMID'd at the end, and by ft_die/the safety alarm.
 *
 * Synchronisation: report pipe before READY; after restore the root checks
 * and writes, sends the go, and reaps the child before looking for the
 * child's writes.
 */
#include "ferry_test.h"
#include <sys/ipc.h>
#include <sys/shm.h>

#define NSEG 3
static const size_t seg_size[NSEG] = { 64 << 10, 128 << 10, 32 << 10 };
static const int seg_mode[NSEG] = { 0640, 0600, 0604 };
static int ids[NSEG] = { -1, -1, -1 };
static key_t key1;

static void cleanup(void)
{
	for (int i = 0; i < NSEG; i++)
		if (ids[i] >= 0 && shmctl(ids[i], IPC_RMID, NULL) != 0)
			ft_log("shmctl(%d, IPC_RMID): %s", ids[i], strerror(errno));
}

/* Inode column of the /proc/self/maps line containing addr, or -1. */
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

static void check_attach(const char *who, int i, const void *addr)
{
	char path[256] = "";
	long ino = maps_inode(addr, path, sizeof(path));
	if (ino < 0) {
		ft_fail("%s: seg %d attachment at %p not in /proc/self/maps", who, i + 1, addr);
		return;
	}
	FT_CHECK(ino == ids[i], "%s: seg %d mapping at %p has inode %ld, expected the shmid %d", who, i + 1, addr,
		 ino, ids[i]);
	FT_CHECK(strncmp(path, "/SYSV", 5) == 0, "%s: seg %d mapping path '%s', expected /SYSV...", who, i + 1, path);
}

static void check_content(const char *who, int i, const void *addr, uint64_t seed, size_t off, size_t len,
			  const char *what)
{
	long bad = ft_check_fill((const char *)addr + off, len, seed);
	FT_CHECK(bad < 0, "%s: seg %d %s differs at word %ld", who, i + 1, what, bad);
}

static void *attach(int id, const char *what)
{
	void *p = shmat(id, NULL, 0);
	if (p == (void *)-1)
		ft_die("shmat(%s): %s", what, strerror(errno));
	return p;
}

/* Page 0: pattern from before READY (seed 10+i); page 1: root's after restore
 * (seed 20+i); page 2: child's after restore (seed 30+i). */
#define PG 4096

int main(void)
{
	ft_init();
	ft_set_cleanup(cleanup);
	int kf = (int)FT_SYS(open("shm.key", O_WRONLY | O_CREAT | O_TRUNC, 0600));
	close(kf);
	/* the key may collide with someone else's segment: try other project ids */
	for (int proj = 'F'; ids[0] < 0; proj++) {
		if (proj > 'Z')
			ft_die("no free ftok key for shm.key");
		key1 = ftok("shm.key", proj);
		if (key1 == (key_t)-1)
			ft_die("ftok: %s", strerror(errno));
		ids[0] = shmget(key1, seg_size[0], IPC_CREAT | IPC_EXCL | seg_mode[0]);
		if (ids[0] < 0 && errno != EEXIST)
			ft_die("shmget(key): %s", strerror(errno));
	}
	for (int i = 1; i < NSEG; i++) {
		ids[i] = shmget(IPC_PRIVATE, seg_size[i], IPC_CREAT | seg_mode[i]);
		if (ids[i] < 0)
			ft_die("shmget(IPC_PRIVATE): %s", strerror(errno));
	}
	void *ra[NSEG];
	for (int i = 0; i < NSEG; i++)
		ra[i] = attach(ids[i], "root");
	ft_fill(ra[0], PG, 10);
	ft_fill(ra[1], PG, 11);
	struct shmid_ds before[NSEG];
	for (int i = 0; i < NSEG; i++)
		FT_SYS(shmctl(ids[i], IPC_STAT, &before[i]));

	ft_tree_begin();
	pid_t kid = ft_fork();
	if (kid == 0) {
		void *own = attach(ids[2], "child seg 3");
		if (own == ra[2])
			ft_die("child: seg 3 attached at the inherited address");
		FT_SYS(shmdt(ra[2]));
		ft_fill(own, PG, 12);
		ft_child_ready();

		ft_child_wait_go();
		void *ca[NSEG] = { ra[0], ra[1], own };
		for (int i = 0; i < NSEG; i++) {
			check_attach("child", i, ca[i]);
			check_content("child", i, ca[i], 10 + (uint64_t)i, 0, PG, "content from before READY");
			check_content("child", i, ca[i], 20 + (uint64_t)i, PG, PG, "root's write after restore");
		}
		char path[256];
		FT_CHECK(maps_inode(ra[2], path, sizeof(path)) != ids[2],
			 "child: the detached seg 3 attachment at %p is back", ra[2]);
		for (int i = 0; i < NSEG; i++)
			ft_fill((char *)ca[i] + 2 * PG, PG, 30 + (uint64_t)i);
		ft_child_exit("child");
	}
	ft_tree_wait_ready(1);
	if (ft_check_fill(ra[2], PG, 12) >= 0)
		ft_die("seg 3 content written by the child not visible in the root");
	/* seg 2 is marked for removal while both still use it (the usual
	 * "private segment that goes away with its users" idiom) */
	FT_SYS(shmctl(ids[1], IPC_RMID, NULL));

	ft_ready();
	ft_tree_wait_restored();

	FT_EQ(shmget(key1, 0, 0), ids[0], "shmget(key, 0, 0) (the id of seg 1)");
	for (int i = 0; i < NSEG; i++) {
		struct shmid_ds d;
		char what[64];
		if (shmctl(ids[i], IPC_STAT, &d) != 0) {
			ft_fail("shmctl(seg %d id %d, IPC_STAT): %s", i + 1, ids[i], strerror(errno));
			continue;
		}
		snprintf(what, sizeof(what), "seg %d size", i + 1);
		FT_EQ(d.shm_segsz, before[i].shm_segsz, what);
		snprintf(what, sizeof(what), "seg %d mode", i + 1);
		FT_EQ(d.shm_perm.mode & 0777, seg_mode[i], what);
		snprintf(what, sizeof(what), "seg %d key", i + 1);
		FT_EQ(d.shm_perm.__key, i == 0 ? key1 : IPC_PRIVATE, what);
		FT_CHECK(!!(d.shm_perm.mode & SHM_DEST) == (i == 1), "seg %d: SHM_DEST is %s after restore", i + 1,
			 d.shm_perm.mode & SHM_DEST ? "set" : "clear");
		snprintf(what, sizeof(what), "seg %d nattch (root and child)", i + 1);
		FT_EQ(d.shm_nattch, 2, what);
		ft_log("seg %d: id %d cpid %d (was %d) lpid %d (was %d)", i + 1, ids[i], (int)d.shm_cpid,
		       (int)before[i].shm_cpid, (int)d.shm_lpid, (int)before[i].shm_lpid);
	}
	for (int i = 0; i < NSEG; i++) {
		check_attach("root", i, ra[i]);
		check_content("root", i, ra[i], 10 + (uint64_t)i, 0, PG, "content from before READY");
		ft_fill((char *)ra[i] + PG, PG, 20 + (uint64_t)i);
	}
	ft_go(kid, "child");
	ft_reap(kid, "child");
	for (int i = 0; i < NSEG; i++)
		check_content("root", i, ra[i], 30 + (uint64_t)i, 2 * PG, PG, "child's write after restore");
	/* the child has exited: one attachment left each */
	for (int i = 0; i < NSEG; i++) {
		struct shmid_ds d;
		if (shmctl(ids[i], IPC_STAT, &d) == 0)
			FT_CHECK(d.shm_nattch == 1, "seg %d nattch %lu after the child exited, expected 1", i + 1,
				 (unsigned long)d.shm_nattch);
	}
	ft_run_cleanup();
	return ft_finish();
}
