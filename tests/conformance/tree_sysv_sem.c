/*
 * tree_sysv_sem: a SysV semaphore set (IPC_PRIVATE, 3 semaphores, mode
 * 0600, SETALL {5, 0, 2}) and a child blocked in semop at checkpoint time:
 * it waits for {sem 1 -= 1, sem 0 -= 2} (atomically), which cannot proceed
 * while sem 1 is 0. After restore the root finds the set under the same
 * id (IPC_STAT nsems 3, mode 0600), values {5, 0, 2}, GETNCNT(1) == 1 (the
 * child is waiting again); it does semop(sem 1 += 2); the child's semop
 * returns 0 (not EINTR), it sees {3, 1, 2}, adds 10 to sem 2 and exits;
 * the root then sees {3, 1, 12} with sempid of sems 0-2 the child's pid.
 * IPC_RMID at the end, and by ft_die/the safety alarm.
 *
 * Synchronisation: the child reports on the report pipe, then blocks in
 * semop; the root polls GETNCNT(1) until the child is really waiting (a
 * state check, not a delay), then waits for the report pipe, before
 * READY. After restore the root's semop is the child's go; the root reaps
 * it.
 */
#include "ferry_test.h"
#include <sys/ipc.h>
#include <sys/sem.h>

union semun {
	int val;
	struct semid_ds *buf;
	unsigned short *array;
};

static int semid = -1;

static void cleanup(void)
{
	if (semid >= 0 && semctl(semid, 0, IPC_RMID) != 0)
		ft_log("semctl(%d, IPC_RMID): %s", semid, strerror(errno));
	semid = -1;
}

static void check_values(const char *who, const unsigned short *want)
{
	unsigned short v[3] = { 0xffff, 0xffff, 0xffff };
	union semun a = { .array = v };
	if (semctl(semid, 0, GETALL, a) != 0) {
		ft_fail("%s: semctl(GETALL): %s", who, strerror(errno));
		return;
	}
	FT_CHECK(v[0] == want[0] && v[1] == want[1] && v[2] == want[2], "%s: values {%u, %u, %u}, expected {%u, %u, %u}",
		 who, v[0], v[1], v[2], want[0], want[1], want[2]);
}

int main(void)
{
	ft_init();
	ft_set_cleanup(cleanup);
	semid = semget(IPC_PRIVATE, 3, IPC_CREAT | 0600);
	if (semid < 0)
		ft_die("semget: %s", strerror(errno));
	unsigned short init[3] = { 5, 0, 2 };
	union semun a = { .array = init };
	FT_SYS(semctl(semid, 0, SETALL, a));

	ft_tree_begin();
	pid_t kid = ft_fork();
	if (kid == 0) {
		struct sembuf ops[2] = { { 1, -1, 0 }, { 0, -2, 0 } };
		ft_child_ready();
		int r = semop(semid, ops, 2);
		alarm(FT_TREE_CHECK_S); /* released: now the checks */
		if (r != 0)
			ft_fail("child: semop returned %d (%s), expected 0 (was it restarted after restore?)", r,
				strerror(errno));
		static const unsigned short after[3] = { 3, 1, 2 };
		check_values("child", after);
		struct sembuf add = { 2, 10, 0 };
		FT_CHECK(semop(semid, &add, 1) == 0, "child: semop(sem 2 += 10): %s", strerror(errno));
		ft_child_exit("child");
	}
	/* wait until the child sleeps in semop (bounded by the setup alarm, still armed) */
	for (;;) {
		int n = semctl(semid, 1, GETNCNT);
		if (n < 0)
			ft_die("semctl(GETNCNT): %s", strerror(errno));
		if (n == 1)
			break;
		int st;
		if (waitpid(kid, &st, WNOHANG) == kid)
			ft_die("child exited (status 0x%x) instead of waiting in semop", st);
		ft_sleep_ms(1);
	}
	ft_tree_wait_ready(1);

	ft_ready();
	ft_tree_wait_restored();

	struct semid_ds ds;
	union semun da = { .buf = &ds };
	if (semctl(semid, 0, IPC_STAT, da) != 0) {
		ft_fail("semctl(%d, IPC_STAT) after restore: %s", semid, strerror(errno));
	} else {
		FT_EQ(ds.sem_nsems, 3, "sem_nsems");
		FT_EQ(ds.sem_perm.mode & 0777, 0600, "mode");
		FT_EQ(ds.sem_perm.__key, IPC_PRIVATE, "key");
	}
	static const unsigned short same[3] = { 5, 0, 2 };
	check_values("root", same);
	FT_EQ(semctl(semid, 1, GETNCNT), 1, "GETNCNT(sem 1): the child waiting in semop");
	FT_EQ(semctl(semid, 0, GETZCNT), 0, "GETZCNT(sem 0)");
	struct sembuf rel = { 1, 2, 0 };
	FT_CHECK(semop(semid, &rel, 1) == 0, "root: semop(sem 1 += 2): %s", strerror(errno));
	ft_reap(kid, "child");
	static const unsigned short final[3] = { 3, 1, 12 };
	check_values("root (after the child)", final);
	for (int i = 0; i < 3; i++) {
		char what[48];
		snprintf(what, sizeof(what), "GETPID(sem %d) (last semop by the child)", i);
		FT_EQ(semctl(semid, i, GETPID), kid, what);
	}
	ft_run_cleanup();
	return ft_finish();
}
