/*
 * proc_creds_caps: credentials in every thread. The process drops to uid
 * and gid 4242 with supplementary groups {4242, 4343}, keeping only
 * CAP_NET_BIND_SERVICE (permitted and effective) and a reduced bounding
 * set, in all its threads (raw syscalls: glibc would broadcast them
 * itself). After restore, each thread checks its own ids, groups and
 * capability sets.
 */
#include "ferry_test.h"
#include <grp.h>
#include <linux/capability.h>
#include <sys/prctl.h>

static pthread_barrier_t bar;

static void drop_privileges(void)
{
	/* Per-thread: the raw syscalls change only the calling thread. */
	FT_SYS(syscall(SYS_prctl, PR_SET_KEEPCAPS, 1, 0, 0, 0));
	FT_SYS(syscall(SYS_prctl, PR_CAPBSET_DROP, CAP_SYS_ADMIN, 0, 0, 0));
	gid_t groups[2] = { 4242, 4343 };
	FT_SYS(syscall(SYS_setgroups, 2, groups));
	FT_SYS(syscall(SYS_setresgid, 4242, 4242, 4242));
	FT_SYS(syscall(SYS_setresuid, 4242, 4242, 4242));
	struct __user_cap_header_struct h = { _LINUX_CAPABILITY_VERSION_3, 0 };
	struct __user_cap_data_struct d[2] = { { 0 } };
	d[0].effective = d[0].permitted = 1u << CAP_NET_BIND_SERVICE;
	FT_SYS(syscall(SYS_capset, &h, d));
}

static void check_self(const char *who)
{
	uid_t r, e, s;
	gid_t gr, ge, gs;
	FT_SYS(syscall(SYS_getresuid, &r, &e, &s));
	FT_SYS(syscall(SYS_getresgid, &gr, &ge, &gs));
	FT_CHECK(r == 4242 && e == 4242 && s == 4242, "%s: uids %d %d %d", who, r, e, s);
	FT_CHECK(gr == 4242 && ge == 4242 && gs == 4242, "%s: gids %d %d %d", who, gr, ge, gs);
	gid_t groups[8];
	int n = (int)syscall(SYS_getgroups, 8, groups);
	FT_CHECK(n == 2 && groups[0] == 4242 && groups[1] == 4343, "%s: %d supplementary groups", who, n);
	struct __user_cap_header_struct h = { _LINUX_CAPABILITY_VERSION_3, 0 };
	struct __user_cap_data_struct d[2];
	FT_SYS(syscall(SYS_capget, &h, d));
	FT_CHECK(d[0].effective == (1u << CAP_NET_BIND_SERVICE) && d[0].permitted == (1u << CAP_NET_BIND_SERVICE) &&
			 d[0].inheritable == 0 && d[1].effective == 0 && d[1].permitted == 0,
		 "%s: capabilities eff %#x prm %#x inh %#x", who, d[0].effective, d[0].permitted, d[0].inheritable);
	FT_CHECK(prctl(PR_CAPBSET_READ, CAP_SYS_ADMIN) == 0, "%s: CAP_SYS_ADMIN back in the bounding set", who);
	FT_CHECK(prctl(PR_CAPBSET_READ, CAP_NET_BIND_SERVICE) == 1, "%s: CAP_NET_BIND_SERVICE not in the bounding set", who);
}

static void *worker(void *arg)
{
	(void)arg;
	drop_privileges();
	pthread_barrier_wait(&bar);
	pthread_barrier_wait(&bar);
	check_self("worker");
	return NULL;
}

int main(void)
{
	ft_init();
	pthread_barrier_init(&bar, NULL, 2);
	pthread_t t;
	pthread_create(&t, NULL, worker, NULL);
	drop_privileges();
	pthread_barrier_wait(&bar);
	ft_ready();
	ft_wait_restored();
	pthread_barrier_wait(&bar);
	check_self("main");
	pthread_join(t, NULL);
	return ft_finish();
}
