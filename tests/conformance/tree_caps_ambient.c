/*
 * tree_caps_ambient: ambient capabilities (zdtm caps01), in two shapes.
 * The root stays uid 0 but trims its sets: permitted and inheritable
 * without CAP_DAC_OVERRIDE, effective also without CAP_CHOWN, and every
 * permitted capability raised into the ambient set. Its child becomes
 * uid/gid 1000 keeping CAP_NET_BIND_SERVICE, CAP_NET_RAW and CAP_SYS_TIME
 * permitted and inheritable, CAP_NET_BIND_SERVICE effective, and
 * NET_BIND_SERVICE + NET_RAW ambient (what a service manager's
 * AmbientCapabilities gives a daemon). After restore each process reads
 * back the same effective/permitted/inheritable sets and ambient bits
 * (PR_CAP_AMBIENT_IS_SET for every capability), and its uids.
 */
#include "ferry_test.h"
#include <linux/capability.h>
#include <sys/prctl.h>

struct caps {
	uint64_t eff, prm, inh, amb;
};

static int last_cap(void)
{
	char buf[16];
	if (ft_read_file("/proc/sys/kernel/cap_last_cap", buf, sizeof(buf)) <= 0)
		return 40;
	return atoi(buf);
}

static void read_caps(struct caps *c)
{
	struct __user_cap_header_struct h = { _LINUX_CAPABILITY_VERSION_3, 0 };
	struct __user_cap_data_struct d[2];
	if (syscall(SYS_capget, &h, d) != 0)
		ft_die("capget: %s", strerror(errno));
	c->eff = d[0].effective | (uint64_t)d[1].effective << 32;
	c->prm = d[0].permitted | (uint64_t)d[1].permitted << 32;
	c->inh = d[0].inheritable | (uint64_t)d[1].inheritable << 32;
	c->amb = 0;
	for (int cap = 0; cap <= last_cap(); cap++) {
		int r = prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET, cap, 0, 0);
		if (r < 0)
			ft_die("PR_CAP_AMBIENT_IS_SET %d: %s", cap, strerror(errno));
		if (r)
			c->amb |= 1ULL << cap;
	}
}

static void set_caps(uint64_t eff, uint64_t prm, uint64_t inh)
{
	struct __user_cap_header_struct h = { _LINUX_CAPABILITY_VERSION_3, 0 };
	struct __user_cap_data_struct d[2] = {
		{ (uint32_t)eff, (uint32_t)prm, (uint32_t)inh },
		{ (uint32_t)(eff >> 32), (uint32_t)(prm >> 32), (uint32_t)(inh >> 32) },
	};
	if (syscall(SYS_capset, &h, d) != 0)
		ft_die("capset: %s", strerror(errno));
}

static void raise_ambient(uint64_t set)
{
	for (int cap = 0; cap <= last_cap(); cap++)
		if (set & (1ULL << cap))
			if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, cap, 0, 0) != 0)
				ft_die("PR_CAP_AMBIENT_RAISE %d: %s", cap, strerror(errno));
}

static void compare(const char *who, const struct caps *want, uid_t uid)
{
	struct caps got;
	read_caps(&got);
	FT_CHECK(got.eff == want->eff, "%s: effective %#llx, expected %#llx", who, (unsigned long long)got.eff, (unsigned long long)want->eff);
	FT_CHECK(got.prm == want->prm, "%s: permitted %#llx, expected %#llx", who, (unsigned long long)got.prm, (unsigned long long)want->prm);
	FT_CHECK(got.inh == want->inh, "%s: inheritable %#llx, expected %#llx", who, (unsigned long long)got.inh, (unsigned long long)want->inh);
	FT_CHECK(got.amb == want->amb, "%s: ambient %#llx, expected %#llx", who, (unsigned long long)got.amb, (unsigned long long)want->amb);
	uid_t r, e, s;
	FT_SYS(syscall(SYS_getresuid, &r, &e, &s));
	FT_CHECK(r == uid && e == uid && s == uid, "%s: uids %d %d %d, expected %d", who, r, e, s, uid);
}

int main(void)
{
	ft_init();
	if (geteuid() != 0) {
		ft_log("not root: nothing to test");
		ft_ready();
		ft_wait_restored();
		return ft_finish();
	}
	ft_tree_begin();
	pid_t c = ft_fork();
	if (c == 0) {
		uint64_t keep = 1ULL << CAP_NET_BIND_SERVICE | 1ULL << CAP_NET_RAW | 1ULL << CAP_SYS_TIME;
		uint64_t amb = 1ULL << CAP_NET_BIND_SERVICE | 1ULL << CAP_NET_RAW;
		/* Keep the permitted set across setresuid, then trim it. */
		if (prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0)
			ft_die("PR_SET_KEEPCAPS");
		if (syscall(SYS_setgroups, 0, NULL) != 0 || syscall(SYS_setresgid, 1000, 1000, 1000) != 0 ||
		    syscall(SYS_setresuid, 1000, 1000, 1000) != 0)
			ft_die("dropping to uid 1000: %s", strerror(errno));
		set_caps(1ULL << CAP_NET_BIND_SERVICE, keep, keep);
		raise_ambient(amb);
		struct caps want;
		read_caps(&want);
		FT_CHECK(want.amb == amb, "child: ambient %#llx right after raising", (unsigned long long)want.amb);
		ft_child_ready();
		ft_child_wait_go();
		compare("child", &want, 1000);
		ft_child_exit("child");
	}
	struct caps now;
	read_caps(&now);
	uint64_t prm = now.prm & ~(1ULL << CAP_DAC_OVERRIDE);
	set_caps(now.eff & ~(1ULL << CAP_DAC_OVERRIDE | 1ULL << CAP_CHOWN), prm, prm);
	raise_ambient(prm);
	struct caps want;
	read_caps(&want);
	FT_CHECK(want.amb == prm, "root: ambient %#llx right after raising", (unsigned long long)want.amb);
	ft_tree_wait_ready(1);

	ft_ready();
	ft_tree_wait_restored();

	compare("root", &want, 0);
	ft_go(c, "child");
	ft_reap(c, "child");
	return ft_finish();
}
