/*
 * fd_dev_nodes: fds on /dev/null (O_RDWR), /dev/zero (O_RDONLY),
 * /dev/urandom (O_RDONLY|O_NONBLOCK) and /dev/full (O_WRONLY) at fixed
 * numbers. After restore: same device numbers (st_rdev), same F_GETFL, and
 * they behave: null reads EOF and accepts writes, zero reads zeros, urandom
 * returns random bytes, full fails writes with ENOSPC.
 */
#include "ferry_test.h"
#include <sys/sysmacros.h>

int main(void)
{
	ft_init();
	const char *paths[] = { "/dev/null", "/dev/zero", "/dev/urandom", "/dev/full" };
	int flags[] = { O_RDWR, O_RDONLY, O_RDONLY | O_NONBLOCK, O_WRONLY };
	int fds[4], fl[4];
	dev_t rdev[4];
	for (int i = 0; i < 4; i++) {
		int fd = (int)FT_SYS(open(paths[i], flags[i]));
		fds[i] = (int)FT_SYS(dup2(fd, 20 + i));
		close(fd);
		struct stat st;
		FT_SYS(fstat(fds[i], &st));
		rdev[i] = st.st_rdev;
		fl[i] = fcntl(fds[i], F_GETFL);
	}

	ft_ready();
	ft_wait_restored();

	for (int i = 0; i < 4; i++) {
		struct stat st;
		if (fstat(fds[i], &st) != 0) {
			ft_fail("%s fd %d: fstat: %s", paths[i], fds[i], strerror(errno));
			continue;
		}
		FT_CHECK(S_ISCHR(st.st_mode) && st.st_rdev == rdev[i], "%s: rdev %u:%u -> %u:%u", paths[i],
			 major(rdev[i]), minor(rdev[i]), major(st.st_rdev), minor(st.st_rdev));
		char what[64];
		snprintf(what, sizeof(what), "%s F_GETFL", paths[i]);
		FT_EQ(fcntl(fds[i], F_GETFL), fl[i], what);
	}
	char buf[64];
	FT_EQ(read(fds[0], buf, 64), 0, "read /dev/null");
	FT_EQ(write(fds[0], "abc", 3), 3, "write /dev/null");
	memset(buf, 0x55, sizeof(buf));
	FT_EQ(read(fds[1], buf, 64), 64, "read /dev/zero");
	FT_CHECK(ft_is_zero(buf, 64), "/dev/zero returned non-zero bytes");
	FT_EQ(write(fds[1], "x", 1) < 0 && errno == EBADF, 1, "/dev/zero is O_RDONLY");
	memset(buf, 0, sizeof(buf));
	FT_EQ(read(fds[2], buf, 64), 64, "read /dev/urandom");
	FT_CHECK(!ft_is_zero(buf, 64), "/dev/urandom returned zeros");
	FT_CHECK(write(fds[3], "x", 1) < 0 && errno == ENOSPC, "write /dev/full did not fail with ENOSPC");
	return ft_finish();
}
