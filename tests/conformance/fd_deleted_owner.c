/*
 * fd_deleted_owner: an open file that was unlinked, after fchown 1234:5678
 * and fchmod 0604. After restore fstat shows the same owner, mode, size
 * and no link.
 */
#include "ferry_test.h"

int main(void)
{
	ft_init();
	int fd = (int)FT_SYS(open("owned.tmp", O_RDWR | O_CREAT | O_TRUNC, 0600));
	FT_SYS(write(fd, "data", 4));
	FT_SYS(fchown(fd, 1234, 5678));
	FT_SYS(fchmod(fd, 0604));
	FT_SYS(unlink("owned.tmp"));

	ft_ready();
	ft_wait_restored();

	struct stat st;
	FT_SYS(fstat(fd, &st));
	FT_EQ(st.st_uid, 1234, "deleted file uid");
	FT_EQ(st.st_gid, 5678, "deleted file gid");
	FT_EQ(st.st_mode & 07777, 0604, "deleted file mode");
	FT_EQ(st.st_nlink, 0, "deleted file links");
	FT_EQ(st.st_size, 4, "deleted file size");
	return ft_finish();
}
