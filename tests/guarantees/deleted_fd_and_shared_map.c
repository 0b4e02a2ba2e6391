/*
 * deleted_fd_and_shared_map: a file mapped MAP_SHARED and still open by fd
 * is unlinked (zdtm unlink_mmap, with the fd kept). Restore would recreate
 * the fd's file and the mapping's file separately, so checkpoint must refuse
 * it by fd and leave the process unharmed: a write through the mapping is
 * read through the fd, and a pwrite through the fd shows in the mapping.
 */
#include "../conformance/ferry_test.h"
#include <sys/mman.h>

int main(void)
{
	ft_init();
	int fd = FT_SYS(open("mapped", O_RDWR | O_CREAT | O_TRUNC, 0600));
	FT_SYS(ftruncate(fd, 4096));
	char *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED)
		ft_die("mmap: %s", strerror(errno));
	memcpy(m, "before", 6);
	FT_SYS(unlink("mapped"));

	ft_ready();
	ft_wait_restored();

	char b[8] = "";
	FT_CHECK(pread(fd, b, 6, 0) == 6 && memcmp(b, "before", 6) == 0, "content via fd '%s'", b);
	memcpy(m + 100, "mapw", 4);
	memset(b, 0, sizeof(b));
	FT_CHECK(pread(fd, b, 4, 100) == 4 && memcmp(b, "mapw", 4) == 0, "mapping write not seen through the fd ('%s')", b);
	FT_CHECK(pwrite(fd, "fdw", 3, 200) == 3, "pwrite: %s", strerror(errno));
	FT_CHECK(memcmp(m + 200, "fdw", 3) == 0, "fd write not seen in the mapping");
	struct stat st;
	FT_CHECK(fstat(fd, &st) == 0 && st.st_nlink == 0, "nlink not 0");
	return ft_finish();
}
