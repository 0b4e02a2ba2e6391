/*
 * fd_deleted_sparse: a sparse unlinked file held only by an O_WRONLY
 * descriptor. 1 MiB of pattern is written at offset 64 MiB + 8 KiB (the
 * rest is a hole) and the file unlinked. (A deleted file over 1 GiB, like
 * zdtm's unlink_largefile past 2 GiB, is refused at checkpoint by fd: its
 * content is copied whole into the image.) After restore: size, offset (end of
 * the data), access mode, nlink 0; the data read back through
 * /proc/self/fd (a second description opened for reading), the hole
 * reads zero and is still a hole (the file does not take 65 MiB of disk),
 * and writing through the old fd still extends the same file.
 */
#include "ferry_test.h"
#include <sys/mman.h>

#define OFF ((64LL << 20) + 8192)
#define LEN (1 << 20)

static char buf[LEN], back[LEN];

int main(void)
{
	ft_init();
	int fd = FT_SYS(open("sparse.bin", O_WRONLY | O_CREAT | O_TRUNC, 0640));
	ft_fill(buf, LEN, 0x5ba75e);
	if (pwrite(fd, buf, LEN, OFF) != LEN)
		ft_die("pwrite: %s", strerror(errno));
	FT_SYS(lseek(fd, OFF + LEN, SEEK_SET));
	FT_SYS(unlink("sparse.bin"));
	struct stat st0;
	FT_SYS(fstat(fd, &st0));

	ft_ready();
	ft_wait_restored();

	struct stat st;
	FT_SYS(fstat(fd, &st));
	FT_EQ(st.st_size, OFF + LEN, "size");
	FT_EQ(st.st_nlink, 0, "nlink");
	FT_EQ(st.st_mode & 07777, 0640, "mode");
	FT_CHECK(st.st_blocks * 512LL < 16LL << 20, "hole not kept: %lld blocks of 512 bytes (was %lld)", (long long)st.st_blocks, (long long)st0.st_blocks);
	FT_EQ(lseek(fd, 0, SEEK_CUR), OFF + LEN, "offset");
	FT_EQ(fcntl(fd, F_GETFL) & O_ACCMODE, O_WRONLY, "access mode");
	char path[64];
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	int r = open(path, O_RDONLY);
	if (r < 0) {
		ft_fail("reopen %s for reading: %s", path, strerror(errno));
		return ft_finish();
	}
	FT_EQ(pread(r, back, LEN, OFF), LEN, "pread of the data");
	FT_EQ(ft_check_fill(back, LEN, 0x5ba75e), -1, "data: first bad word");
	FT_EQ(pread(r, back, 4096, OFF - 4096), 4096, "pread in the hole");
	FT_CHECK(ft_is_zero(back, 4096), "hole just before the data is not zero");
	FT_EQ(pread(r, back, 4096, 12345), 4096, "pread at the start");
	FT_CHECK(ft_is_zero(back, 4096), "start of the file is not zero");
	FT_EQ(write(fd, "tail", 4), 4, "write through the old fd");
	FT_EQ(pread(r, back, 4, OFF + LEN), 4, "pread of the new tail");
	FT_CHECK(memcmp(back, "tail", 4) == 0, "new tail not seen through the second description");
	close(r);
	return ft_finish();
}
