/*
 * fd_memfd_mode: a memfd whose mode and owner were changed: fchmod 0640,
 * fchown 1234:5678. After restore fstat shows the same mode and owner.
 */
#include "ferry_test.h"
#include <sys/mman.h>

int main(void)
{
	ft_init();
	int fd = (int)FT_SYS(memfd_create("modetest", MFD_CLOEXEC));
	FT_SYS(write(fd, "hello", 5));
	FT_SYS(fchmod(fd, 0640));
	FT_SYS(fchown(fd, 1234, 5678));

	ft_ready();
	ft_wait_restored();

	struct stat st;
	FT_SYS(fstat(fd, &st));
	FT_EQ(st.st_mode & 07777, 0640, "memfd mode");
	FT_EQ(st.st_uid, 1234, "memfd uid");
	FT_EQ(st.st_gid, 5678, "memfd gid");
	FT_EQ(st.st_size, 5, "memfd size");
	return ft_finish();
}
