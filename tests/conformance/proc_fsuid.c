/*
 * proc_fsuid: the filesystem uid/gid differ from the effective ones:
 * setfsgid(4321), setfsuid(1234) in a root process. After restore:
 * setfsuid(-1)/setfsgid(-1) report 1234/4321 and the fourth field of Uid:
 * and Gid: in /proc/self/status too; the effective ids are still 0.
 * The securebits SECBIT_NOROOT and SECBIT_KEEP_CAPS (PR_SET_KEEPCAPS) are
 * set too and read back the same.
 */
#include "ferry_test.h"
#include <sys/fsuid.h>
#include <sys/prctl.h>

int main(void)
{
	ft_init();
	if (geteuid() != 0)
		ft_die("needs root");
	FT_SYS(prctl(PR_SET_SECUREBITS, 1 /* SECBIT_NOROOT */, 0, 0, 0));
	FT_SYS(prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0));
	long bits = prctl(PR_GET_SECUREBITS, 0, 0, 0, 0);
	setfsgid(4321);
	setfsuid(1234);
	if (setfsuid(-1) != 1234 || setfsgid(-1) != 4321)
		ft_die("setfsuid/setfsgid did not take");

	ft_ready();
	ft_wait_restored();

	FT_EQ(setfsuid(-1), 1234, "fsuid");
	FT_EQ(setfsgid(-1), 4321, "fsgid");
	char u[64] = "", g[64] = "";
	ft_status_field(0, "Uid", u, sizeof(u));
	ft_status_field(0, "Gid", g, sizeof(g));
	unsigned a, b, c, d;
	if (sscanf(u, "%u %u %u %u", &a, &b, &c, &d) != 4 || b != 0 || d != 1234)
		ft_fail("Uid: '%s', expected euid 0 and fsuid 1234", u);
	if (sscanf(g, "%u %u %u %u", &a, &b, &c, &d) != 4 || b != 0 || d != 4321)
		ft_fail("Gid: '%s', expected egid 0 and fsgid 4321", g);
	FT_EQ(geteuid(), 0, "euid");
	FT_EQ(prctl(PR_GET_SECUREBITS, 0, 0, 0, 0), bits, "PR_GET_SECUREBITS");
	FT_EQ(prctl(PR_GET_KEEPCAPS, 0, 0, 0, 0), 1, "PR_GET_KEEPCAPS");
	return ft_finish();
}
