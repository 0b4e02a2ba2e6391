/*
 * proc_cwd: the program chdir()s into ./sub/deeper (created in the test
 * dir). After restore: getcwd() and /proc/self/cwd are unchanged, relative
 * paths resolve there (a file created relatively appears at the absolute
 * path), and /proc/self/root is still "/".
 */
#include "ferry_test.h"

int main(void)
{
	ft_init();
	char base[4096];
	FT_SYS(getcwd(base, sizeof(base)));
	FT_SYS(mkdir("sub", 0755));
	FT_SYS(mkdir("sub/deeper", 0755));
	FT_SYS(chdir("sub/deeper"));
	char cwd0[4096], link0[4096] = "";
	FT_SYS(getcwd(cwd0, sizeof(cwd0)));
	FT_SYS(readlink("/proc/self/cwd", link0, sizeof(link0) - 1));

	ft_ready();
	ft_wait_restored();

	char cwd[4096] = "", link[4096] = "", root[4096] = "";
	FT_CHECK(getcwd(cwd, sizeof(cwd)) && strcmp(cwd, cwd0) == 0, "getcwd '%s' -> '%s'", cwd0, cwd);
	readlink("/proc/self/cwd", link, sizeof(link) - 1);
	FT_CHECK(strcmp(link, link0) == 0, "/proc/self/cwd '%s' -> '%s'", link0, link);
	readlink("/proc/self/root", root, sizeof(root) - 1);
	FT_CHECK(strcmp(root, "/") == 0, "/proc/self/root is '%s'", root);
	int fd = open("rel.txt", O_CREAT | O_WRONLY, 0644);
	FT_CHECK(fd >= 0, "create relative file: %s", strerror(errno));
	char abs[8192];
	snprintf(abs, sizeof(abs), "%s/sub/deeper/rel.txt", base);
	FT_CHECK(access(abs, F_OK) == 0, "relative file not found at %s", abs);
	return ft_finish();
}
