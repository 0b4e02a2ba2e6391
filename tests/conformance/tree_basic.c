/*
 * tree_basic: the shape of a process tree and its ids. The root becomes a
 * session leader (unless it already is), then forks
 *   child 1: setsid() (own session and group), forks grandchild 1
 *   child 2: forks grandchild 2 (stays in the root's group and session)
 *   child 3: setpgid(0, 0) (own group, in the root's session)
 * Every process records getpid/getppid/getpgid/getsid before READY and
 * checks them (and that /proc/self is getpid()) after restore (the root's ppid is not checked: its parent is
 * then ferry restore). Each parent also checks its children's pgid/sid as
 * seen from outside and its /proc/self/task/<pid>/children list.
 * Grandchildren report to their parent, which propagates a failure.
 *
 * Synchronisation: report pipe before READY (ft_tree_*); after restore the
 * root sends SIGUSR2 to each child, each child with a grandchild forwards a
 * SIGUSR2 to it after its own checks, and every parent reaps its children.
 */
#include "ferry_test.h"

struct ids {
	pid_t pid, ppid, pgid, sid;
};

static void get_ids(struct ids *r)
{
	r->pid = getpid();
	r->ppid = getppid();
	r->pgid = getpgid(0);
	r->sid = getsid(0);
}

static void check_ids(const char *who, const struct ids *b, int check_ppid)
{
	struct ids a;
	get_ids(&a);
	FT_CHECK(a.pid == b->pid, "%s: getpid %d, expected %d", who, (int)a.pid, (int)b->pid);
	if (check_ppid)
		FT_CHECK(a.ppid == b->ppid, "%s: getppid %d, expected %d", who, (int)a.ppid, (int)b->ppid);
	FT_CHECK(a.pgid == b->pgid, "%s: getpgid %d, expected %d", who, (int)a.pgid, (int)b->pgid);
	FT_CHECK(a.sid == b->sid, "%s: getsid %d, expected %d", who, (int)a.sid, (int)b->sid);
	/* /proc must show the PID namespace the process is in (restore
	 * --new-pid-ns mounts one for its namespace). */
	char self[32] = "";
	ssize_t n = readlink("/proc/self", self, sizeof(self) - 1);
	if (n > 0)
		self[n] = 0;
	FT_CHECK(n > 0 && atoi(self) == a.pid, "%s: /proc/self is %s, getpid %d", who, self, (int)a.pid);
}

/* Expected ids of a child as seen by its parent. */
struct kid {
	const char *name;
	pid_t pid, pgid, sid;
};

static void record_kid(struct kid *k)
{
	k->pgid = getpgid(k->pid);
	k->sid = getsid(k->pid);
	if (k->pgid < 0 || k->sid < 0)
		ft_die("getpgid/getsid(%s): %s", k->name, strerror(errno));
}

static void check_kid(const char *who, const struct kid *k)
{
	pid_t pg = getpgid(k->pid), s = getsid(k->pid);
	FT_CHECK(pg == k->pgid, "%s: getpgid(%s pid %d) = %d, expected %d", who, k->name, (int)k->pid, (int)pg,
		 (int)k->pgid);
	FT_CHECK(s == k->sid, "%s: getsid(%s pid %d) = %d, expected %d", who, k->name, (int)k->pid, (int)s, (int)k->sid);
}

/* /proc/self/task/<pid>/children must be exactly the (sorted) list want. */
static void check_children(const char *who, const pid_t *want, int n)
{
	pid_t got[16];
	int m = ft_children(got, 16);
	if (m < 0) {
		ft_fail("%s: cannot read /proc/self/task/%d/children", who, (int)getpid());
		return;
	}
	int same = m == n;
	for (int i = 0; same && i < n; i++)
		same = got[i] == want[i];
	if (!same) {
		char b[256];
		int o = 0;
		for (int i = 0; i < m && o < 200; i++)
			o += snprintf(b + o, sizeof(b) - (size_t)o, " %d", (int)got[i]);
		b[o] = 0;
		ft_fail("%s: children are [%s ], expected %d children starting with %d", who, b, n,
			n ? (int)want[0] : 0);
	}
}

static void grandchild(const char *who)
{
	struct ids b;
	get_ids(&b);
	ft_child_ready();
	ft_child_wait_go();
	check_ids(who, &b, 1);
	ft_child_exit(who);
}

/* kind 1: setsid + grandchild, 2: grandchild, 3: setpgid(0,0). */
static void child(int kind, const char *who, const char *gwho)
{
	struct kid g = { gwho, 0, 0, 0 };
	if (kind == 1)
		FT_SYS(setsid());
	if (kind == 3)
		FT_SYS(setpgid(0, 0)); /* the root does it too: whichever runs first */
	if (kind == 1 || kind == 2) {
		g.pid = ft_fork();
		if (g.pid == 0)
			grandchild(gwho);
		record_kid(&g);
	}
	struct ids b;
	get_ids(&b);
	if (kind == 1)
		FT_CHECK(b.sid == b.pid && b.pgid == b.pid, "%s: setsid did not take (sid %d pgid %d)", who, (int)b.sid,
			 (int)b.pgid);
	if (kind == 3)
		FT_CHECK(b.pgid == b.pid, "%s: setpgid did not take (pgid %d)", who, (int)b.pgid);
	ft_child_ready();

	ft_child_wait_go();
	check_ids(who, &b, 1);
	if (g.pid) {
		check_kid(who, &g);
		check_children(who, &g.pid, 1);
		ft_go(g.pid, gwho);
		ft_reap(g.pid, gwho);
	} else {
		check_children(who, NULL, 0);
	}
	ft_child_exit(who);
}

int main(void)
{
	ft_init();
	if (getsid(0) != getpid())
		FT_SYS(setsid());
	ft_tree_begin();

	struct kid k[3] = { { "child 1", 0, 0, 0 }, { "child 2", 0, 0, 0 }, { "child 3", 0, 0, 0 } };
	k[0].pid = ft_fork();
	if (k[0].pid == 0)
		child(1, "child 1", "grandchild 1");
	k[1].pid = ft_fork();
	if (k[1].pid == 0)
		child(2, "child 2", "grandchild 2");
	k[2].pid = ft_fork();
	if (k[2].pid == 0)
		child(3, "child 3", NULL);
	/* the usual race-free idiom: parent and child both call setpgid; EACCES
	 * cannot happen (no exec), ESRCH neither (the child waits for its go) */
	FT_SYS(setpgid(k[2].pid, k[2].pid));

	ft_tree_wait_ready(5);
	struct ids b;
	get_ids(&b);
	FT_CHECK(b.sid == b.pid && b.pgid == b.pid, "root: not a session leader (sid %d pgid %d)", (int)b.sid,
		 (int)b.pgid);
	for (int i = 0; i < 3; i++)
		record_kid(&k[i]);
	FT_CHECK(k[0].sid == k[0].pid && k[0].pgid == k[0].pid, "setup: child 1 sid %d pgid %d", (int)k[0].sid,
		 (int)k[0].pgid);
	FT_CHECK(k[1].sid == b.pid && k[1].pgid == b.pid, "setup: child 2 sid %d pgid %d", (int)k[1].sid,
		 (int)k[1].pgid);
	FT_CHECK(k[2].sid == b.pid && k[2].pgid == k[2].pid, "setup: child 3 sid %d pgid %d", (int)k[2].sid,
		 (int)k[2].pgid);
	pid_t sorted[3] = { k[0].pid, k[1].pid, k[2].pid };
	for (int i = 1; i < 3; i++)
		for (int j = i; j > 0 && sorted[j - 1] > sorted[j]; j--) {
			pid_t t = sorted[j];
			sorted[j] = sorted[j - 1];
			sorted[j - 1] = t;
		}
	check_children("root (before READY)", sorted, 3);
	ft_log("root %d (ppid %d), children %d %d %d", (int)b.pid, (int)b.ppid, (int)k[0].pid, (int)k[1].pid,
	       (int)k[2].pid);

	ft_ready();
	ft_tree_wait_restored();

	check_ids("root", &b, 0);
	ft_log("root ppid now %d (was %d)", (int)getppid(), (int)b.ppid);
	check_children("root", sorted, 3);
	for (int i = 0; i < 3; i++)
		check_kid("root", &k[i]);
	for (int i = 0; i < 3; i++)
		ft_go(k[i].pid, k[i].name);
	for (int i = 0; i < 3; i++)
		ft_reap(k[i].pid, k[i].name);
	return ft_finish();
}
