/*
 * proc_cwd_deleted: the working directory is removed while the process is
 * in it (zdtm cwd01/cwd02), and an O_DIRECTORY fd on that same directory is
 * held open. After restore: /proc/self/cwd still names the old path
 * followed by " (deleted)", the cwd and the fd are one inode with nlink 0,
 * relative creates fail with ENOENT (as in any removed directory), and
 * nothing reappears at the old path.
 */
#include "ferry_test.h"

int main(void)
{
	ft_init();
	FT_SYS(mkdir("gone", 0751));
	int dfd = FT_SYS(open("gone", O_RDONLY | O_DIRECTORY));
	FT_SYS(chdir("gone"));
	FT_SYS(rmdir("../gone"));
	char link0[4096] = "";
	FT_SYS(readlink("/proc/self/cwd", link0, sizeof(link0) - 1));
	struct stat st0;
	FT_SYS(fstat(dfd, &st0));
	FT_CHECK(strstr(link0, " (deleted)") != NULL, "setup: cwd link '%s' not deleted", link0);

	ft_ready();
	ft_wait_restored();

	char link[4096] = "";
	FT_CHECK(readlink("/proc/self/cwd", link, sizeof(link) - 1) > 0, "readlink cwd: %s", strerror(errno));
	FT_CHECK(strcmp(link, link0) == 0, "/proc/self/cwd '%s' -> '%s'", link0, link);
	struct stat cw, fd;
	FT_CHECK(stat(".", &cw) == 0, "stat(.): %s", strerror(errno));
	FT_CHECK(fstat(dfd, &fd) == 0, "fstat(dir fd): %s", strerror(errno));
	FT_CHECK(cw.st_ino == fd.st_ino && cw.st_dev == fd.st_dev, "cwd and dir fd differ (%lu vs %lu)",
		 (unsigned long)cw.st_ino, (unsigned long)fd.st_ino);
	FT_CHECK(cw.st_nlink == 0, "cwd nlink %lu, want 0", (unsigned long)cw.st_nlink);
	FT_CHECK(fd.st_nlink == 0, "dir fd nlink %lu, want 0", (unsigned long)fd.st_nlink);
	FT_CHECK((fd.st_mode & 07777) == (st0.st_mode & 07777), "dir mode %o -> %o", st0.st_mode & 07777,
		 fd.st_mode & 07777);
	FT_CHECK(S_ISDIR(fd.st_mode), "dir fd is not a directory");
	int r = open("x", O_CREAT | O_WRONLY, 0644);
	FT_CHECK(r < 0 && errno == ENOENT, "create in removed cwd: %d %s (want ENOENT)", r, strerror(errno));
	int flags = fcntl(dfd, F_GETFL);
	FT_CHECK((flags & O_ACCMODE) == O_RDONLY && (flags & O_DIRECTORY), "dir fd flags 0%o", flags);
	FT_CHECK(faccessat(dfd, "..", F_OK, 0) == 0, "dir fd '..': %s", strerror(errno));
	/* back to the test dir: nothing reappeared there */
	const char *td = getenv("FERRY_TEST_DIR");
	if (td && *td)
		FT_CHECK(chdir(td) == 0, "chdir test dir: %s", strerror(errno));
	FT_CHECK(access("gone", F_OK) != 0 && errno == ENOENT, "'gone' reappeared in the test dir");
	return ft_finish();
}
