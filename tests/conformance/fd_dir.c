/*
 * fd_dir: a directory fd (O_RDONLY|O_DIRECTORY) on ./d and an O_PATH fd on
 * ./d/f.txt. After restore: fstat gives the same device/inode, openat(dirfd,
 * "f.txt") reads the file, readlink of /proc/self/fd/N is unchanged, the
 * O_PATH fd still has O_PATH and fstat works, and fchdir(dirfd) makes
 * getcwd end in "/d".
 */
#include "ferry_test.h"

int main(void)
{
	ft_init();
	FT_SYS(mkdir("d", 0755));
	int f = (int)FT_SYS(open("d/f.txt", O_WRONLY | O_CREAT, 0644));
	FT_SYS(write(f, "directory content", 17));
	close(f);
	int dfd = (int)FT_SYS(open("d", O_RDONLY | O_DIRECTORY));
	int pfd = (int)FT_SYS(open("d/f.txt", O_PATH));
	struct stat ds, ps;
	FT_SYS(fstat(dfd, &ds));
	FT_SYS(fstat(pfd, &ps));
	char l1[4096] = "", l2[4096] = "", p1[64], p2[64];
	snprintf(p1, sizeof(p1), "/proc/self/fd/%d", dfd);
	snprintf(p2, sizeof(p2), "/proc/self/fd/%d", pfd);
	FT_SYS(readlink(p1, l1, sizeof(l1) - 1));
	FT_SYS(readlink(p2, l2, sizeof(l2) - 1));
	int pfl = fcntl(pfd, F_GETFL), dfl = fcntl(dfd, F_GETFL);

	ft_ready();
	ft_wait_restored();

	struct stat s;
	FT_CHECK(fstat(dfd, &s) == 0 && S_ISDIR(s.st_mode) && s.st_ino == ds.st_ino && s.st_dev == ds.st_dev,
		 "directory fd fstat differs");
	FT_CHECK(fstat(pfd, &s) == 0 && S_ISREG(s.st_mode) && s.st_ino == ps.st_ino, "O_PATH fd fstat differs");
	FT_EQ(fcntl(pfd, F_GETFL), pfl, "O_PATH fd F_GETFL");
	FT_CHECK(fcntl(pfd, F_GETFL) & O_PATH, "O_PATH flag lost");
	FT_EQ(fcntl(dfd, F_GETFL), dfl, "dir fd F_GETFL");
	char r1[4096] = "", r2[4096] = "";
	readlink(p1, r1, sizeof(r1) - 1);
	readlink(p2, r2, sizeof(r2) - 1);
	FT_CHECK(strcmp(l1, r1) == 0, "dir fd link '%s' -> '%s'", l1, r1);
	FT_CHECK(strcmp(l2, r2) == 0, "O_PATH fd link '%s' -> '%s'", l2, r2);
	int g = openat(dfd, "f.txt", O_RDONLY);
	char buf[32] = { 0 };
	FT_CHECK(g >= 0 && read(g, buf, 31) == 17 && strcmp(buf, "directory content") == 0,
		 "openat(dirfd) read '%s'", buf);
	FT_CHECK(faccessat(dfd, "f.txt", R_OK, 0) == 0, "faccessat(dirfd) failed");
	FT_CHECK(read(pfd, buf, 1) < 0 && errno == EBADF, "read on O_PATH fd did not fail with EBADF");
	FT_SYS(fchdir(dfd));
	char cwd[4096];
	FT_CHECK(getcwd(cwd, sizeof(cwd)) && strcmp(cwd, l1) == 0, "getcwd after fchdir '%s', expected '%s'", cwd,
		 l1);
	return ft_finish();
}
