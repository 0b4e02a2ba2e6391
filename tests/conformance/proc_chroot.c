/*
 * proc_chroot: the process chroot()s into a directory of its working
 * directory ("jail", holding a file "inside" and a directory "sub") and
 * chdir()s into "/sub". After restore: /proc/self/root still points at
 * the jail (same device and inode as before), "/" is the jail (the file
 * /inside is there, stat("/") is the jail's inode), getcwd gives "/sub",
 * and ".." from the root stays in the jail. Then it leaves the jail
 * through a descriptor of the real root it kept open (fchdir, chroot
 * "."), so that ft_finish can read /proc.
 */
#include "ferry_test.h"

int main(void)
{
	ft_init();
	FT_SYS(mkdir("jail", 0755));
	FT_SYS(mkdir("jail/sub", 0755));
	int fd = (int)FT_SYS(open("jail/inside", O_WRONLY | O_CREAT | O_TRUNC, 0644));
	FT_SYS(write(fd, "jailed\n", 7));
	close(fd);
	struct stat jail;
	FT_SYS(stat("jail", &jail));
	int outer = (int)FT_SYS(open("/", O_RDONLY | O_DIRECTORY));
	FT_SYS(chroot("jail"));
	FT_SYS(chdir("/sub"));
	ft_ready();
	ft_wait_restored();

	struct stat root, inside, up;
	FT_SYS(stat("/", &root));
	FT_CHECK(root.st_dev == jail.st_dev && root.st_ino == jail.st_ino,
		 "\"/\" is inode %lu, not the jail's %lu", (unsigned long)root.st_ino,
		 (unsigned long)jail.st_ino);
	FT_CHECK(stat("/inside", &inside) == 0, "/inside is not there: %s", strerror(errno));
	FT_CHECK(stat("/..", &up) == 0 && up.st_ino == jail.st_ino, "\"/..\" leaves the jail");
	char cwd[256];
	FT_CHECK(getcwd(cwd, sizeof(cwd)) && strcmp(cwd, "/sub") == 0, "cwd is %s, not /sub",
		 getcwd(cwd, sizeof(cwd)) ? cwd : strerror(errno));
	/* /proc is not in the jail: leave it for ft_finish. */
	FT_SYS(fchdir(outer));
	FT_SYS(chroot("."));
	return ft_finish();
}
