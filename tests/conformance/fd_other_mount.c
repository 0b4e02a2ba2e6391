/*
 * fd_other_mount: a file opened, then the process enters a mount
 * namespace of its own (unshare(CLONE_NEWNS)): every mount is copied
 * with a new id, so the fd's mount is no longer in its mountinfo, but
 * the path still reaches the same file. After restore: the fd reads the
 * file at its offset and is the same inode.
 */
#include "ferry_test.h"
#include <sched.h>

int main(void)
{
	ft_init();
	int fd = (int)FT_SYS(open("a.txt", O_RDWR | O_CREAT | O_TRUNC, 0600));
	FT_SYS(write(fd, "abcdef", 6));
	FT_SYS(lseek(fd, 2, SEEK_SET));
	struct stat before;
	FT_SYS(fstat(fd, &before));
	FT_SYS(unshare(CLONE_NEWNS));

	ft_ready();
	ft_wait_restored();

	char b[4] = "";
	FT_EQ(read(fd, b, 4), 4, "read at the offset");
	FT_CHECK(memcmp(b, "cdef", 4) == 0, "content '%.4s'", b);
	struct stat after;
	FT_CHECK(fstat(fd, &after) == 0 && after.st_ino == before.st_ino, "another inode");
	return ft_finish();
}
