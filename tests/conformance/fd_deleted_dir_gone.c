/*
 * fd_deleted_dir_gone: files deleted while open whose directories were
 * removed too, as when a service's temporary directory is cleaned up
 * under it. "tmp/a/data" (some content, O_RDWR, offset 5) and the
 * directory "tmp/b/inner" (O_DIRECTORY) are held open, then the file,
 * "inner", "a", "b" and "tmp" are removed. After restore: both
 * /proc/self/fd links read as before ("... (deleted)"), the file has
 * nlink 0, its content and offset, the directory fd still works as a
 * removed directory (fstat nlink 0, openat in it fails with ENOENT), and
 * "tmp" does not exist again.
 */
#include "ferry_test.h"
#include <sys/mman.h>

#define CONTENT "kept after its directory was removed"

static void link_of(int fd, char *out, size_t n)
{
	char lp[64];
	snprintf(lp, sizeof(lp), "/proc/self/fd/%d", fd);
	ssize_t r = readlink(lp, out, n - 1);
	out[r < 0 ? 0 : r] = 0;
}

int main(void)
{
	ft_init();
	FT_SYS(mkdir("tmp", 0755));
	FT_SYS(mkdir("tmp/a", 0755));
	FT_SYS(mkdir("tmp/b", 0755));
	FT_SYS(mkdir("tmp/b/inner", 0755));
	FT_SYS(mkdir("tmp/c", 0755));
	int m = (int)FT_SYS(open("tmp/c/map", O_RDWR | O_CREAT | O_TRUNC, 0600));
	FT_SYS(ftruncate(m, 4096));
	char *map = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, m, 0);
	if (map == MAP_FAILED)
		ft_die("mmap: %s", strerror(errno));
	close(m);
	memcpy(map, CONTENT, sizeof(CONTENT));
	FT_SYS(unlink("tmp/c/map"));
	FT_SYS(rmdir("tmp/c"));
	int f = (int)FT_SYS(open("tmp/a/data", O_RDWR | O_CREAT | O_TRUNC, 0600));
	ft_write_all(f, CONTENT, sizeof(CONTENT) - 1);
	FT_SYS(lseek(f, 5, SEEK_SET));
	int d = (int)FT_SYS(open("tmp/b/inner", O_RDONLY | O_DIRECTORY));
	FT_SYS(unlink("tmp/a/data"));
	FT_SYS(rmdir("tmp/a"));
	FT_SYS(rmdir("tmp/b/inner"));
	FT_SYS(rmdir("tmp/b"));
	FT_SYS(rmdir("tmp"));
	char file_before[4096], dir_before[4096];
	link_of(f, file_before, sizeof(file_before));
	link_of(d, dir_before, sizeof(dir_before));
	ft_log("%s, %s", file_before, dir_before);
	struct ft_vma v_before;
	if (ft_find_vma(map, &v_before) != 0)
		ft_die("no mapping at %p", (void *)map);

	ft_ready();
	ft_wait_restored();

	char after[4096];
	link_of(f, after, sizeof(after));
	FT_CHECK(strcmp(after, file_before) == 0, "file link '%s', was '%s'", after, file_before);
	link_of(d, after, sizeof(after));
	FT_CHECK(strcmp(after, dir_before) == 0, "directory link '%s', was '%s'", after, dir_before);
	struct stat st;
	FT_SYS(fstat(f, &st));
	FT_EQ(st.st_nlink, 0, "file st_nlink");
	FT_EQ(lseek(f, 0, SEEK_CUR), 5, "file offset");
	char buf[64] = "";
	FT_CHECK(pread(f, buf, sizeof(buf), 0) == sizeof(CONTENT) - 1 && memcmp(buf, CONTENT, sizeof(CONTENT) - 1) == 0,
		 "file content");
	FT_SYS(fstat(d, &st));
	FT_CHECK(S_ISDIR(st.st_mode) && st.st_nlink == 0, "directory fd: mode %o nlink %lu", st.st_mode,
		 (unsigned long)st.st_nlink);
	FT_CHECK(openat(d, "x", O_RDWR | O_CREAT, 0600) < 0 && errno == ENOENT,
		 "creating a file in the removed directory did not fail with ENOENT");
	struct ft_vma v_after;
	FT_CHECK(ft_find_vma(map, &v_after) == 0 && strcmp(v_after.path, v_before.path) == 0,
		 "mapping path '%s', was '%s'", v_after.path, v_before.path);
	FT_CHECK(memcmp(map, CONTENT, sizeof(CONTENT)) == 0, "mapping content");
	FT_CHECK(access("tmp", F_OK) != 0 && errno == ENOENT, "tmp exists again");
	return ft_finish();
}
