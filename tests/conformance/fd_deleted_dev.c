/*
 * fd_deleted_dev: a character device node made in the test dir with
 * mknod (the /dev/null numbers, mode 0700) is opened O_RDWR and unlinked
 * (zdtm deleted_dev). After restore: fstat gives the same S_IFCHR mode,
 * rdev and nlink 0, the fd behaves as /dev/null (read EOF, write accepted),
 * flags are kept, and no node reappears in the directory.
 */
#include "ferry_test.h"
#include <sys/sysmacros.h>

int main(void)
{
	ft_init();
	mode_t mode = S_IFCHR | 0700;
	dev_t dev = makedev(1, 3);
	FT_SYS(mknod("devnode", mode, dev));
	int fd = FT_SYS(open("devnode", O_RDWR | O_NONBLOCK));
	FT_SYS(unlink("devnode"));
	int fl0 = fcntl(fd, F_GETFL);

	ft_ready();
	ft_wait_restored();

	struct stat st;
	FT_CHECK(fstat(fd, &st) == 0, "fstat: %s", strerror(errno));
	FT_CHECK(st.st_mode == mode, "mode 0%o, want 0%o", st.st_mode, mode);
	FT_CHECK(st.st_rdev == dev, "rdev %u:%u, want 1:3", major(st.st_rdev), minor(st.st_rdev));
	FT_CHECK(st.st_nlink == 0, "nlink %lu, want 0", (unsigned long)st.st_nlink);
	FT_CHECK(fcntl(fd, F_GETFL) == fl0, "flags 0%o -> 0%o", fl0, fcntl(fd, F_GETFL));
	char b[8];
	FT_CHECK(read(fd, b, sizeof(b)) == 0, "read is not EOF: %s", strerror(errno));
	FT_CHECK(write(fd, "abc", 3) == 3, "write: %s", strerror(errno));
	char link[4096] = "";
	char want[64];
	snprintf(want, sizeof(want), "/proc/self/fd/%d", fd);
	memset(link, 0, sizeof(link));
	readlink(want, link, sizeof(link) - 1);
	FT_CHECK(strstr(link, "devnode (deleted)") != NULL, "fd link '%s'", link);
	FT_CHECK(access("devnode", F_OK) != 0 && errno == ENOENT, "devnode reappeared in the test dir");
	return ft_finish();
}
