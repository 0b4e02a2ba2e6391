/*
 * proc_fsuid: the filesystem uid/gid differ from the effective ones:
 * setfsgid(4321), setfsuid(1234) in a root process. After restore:
 * setfsuid(-1)/setfsgid(-1) report 1234/4321 and the fourth field of Uid:
 * and Gid: in /proc/self/status too; the effective ids are still 0.
 */
#include "ferry_test.h"
#include <sys/fsuid.h>

int main(void)
{
	ft_init();
	if (geteuid() != 0)
		ft_die("needs root");
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
	return ft_finish();
}
