/*
 * tree_uts_namespace: a tree in a UTS namespace of its own. The root
 * unshares CLONE_NEWUTS, sets hostname "ferry-uts-conf" and domainname
 * "ferry.test", then forks a child, which inherits the namespace. After
 * restore both read uname(2) back, the child checks that it is in its
 * parent's namespace (the /proc/PID/ns/uts links are equal), and the root
 * that the namespace is still its own: a hostname it sets is seen by the
 * child and not outside (the restoring ferry's hostname is not it).
 *
 * Synchronisation: report pipe before READY; after restore the root sets
 * the new hostname, then sends the go to the child, which checks and exits.
 */
#include "ferry_test.h"
#include <sched.h>
#include <sys/utsname.h>

static void check_names(const char *who, const char *host, const char *domain)
{
	struct utsname u;
	FT_SYS(uname(&u));
	FT_CHECK(strcmp(u.nodename, host) == 0, "%s: hostname '%s', expected '%s'", who, u.nodename, host);
	FT_CHECK(strcmp(u.domainname, domain) == 0, "%s: domainname '%s', expected '%s'", who, u.domainname,
		 domain);
}

static void ns_link(pid_t pid, char *out, size_t n)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/ns/uts", (int)pid);
	ssize_t r = readlink(path, out, n - 1);
	out[r > 0 ? r : 0] = 0;
}

int main(void)
{
	ft_init();
	FT_SYS(unshare(CLONE_NEWUTS));
	FT_SYS(sethostname("ferry-uts-conf", 14));
	FT_SYS(setdomainname("ferry.test", 10));
	ft_tree_begin();
	pid_t c = ft_fork();
	if (c == 0) {
		ft_child_ready();
		ft_child_wait_go();
		check_names("child", "ferry-uts-conf-2", "ferry.test");
		char mine[64], parent[64];
		ns_link(getpid(), mine, sizeof(mine));
		ns_link(getppid(), parent, sizeof(parent));
		FT_CHECK(strcmp(mine, parent) == 0, "child: in %s, its parent in %s", mine, parent);
		ft_child_exit("child");
	}
	ft_tree_wait_ready(1);
	ft_ready();
	ft_tree_wait_restored();
	check_names("root", "ferry-uts-conf", "ferry.test");
	FT_SYS(sethostname("ferry-uts-conf-2", 16));
	check_names("root", "ferry-uts-conf-2", "ferry.test");
	ft_go(c, "child");
	ft_reap(c, "child");
	return ft_finish();
}
