/*
 * fd_deleted_file: a file with 20000 bytes of pattern is opened O_RDWR,
 * positioned at offset 777 and unlinked while open. After restore: fstat
 * size 20000 and st_nlink 0, offset 777, full content via pread, reads
 * continue from 777, the fd is still writable, /proc/self/fd/N ends with
 * " (deleted)", and no file of that name exists in the directory.
 */
#include "ferry_test.h"

#define SZ 20000

int main(void)
{
	ft_init();
	unsigned char data[SZ];
	for (int i = 0; i < SZ; i++)
		data[i] = (unsigned char)(i * 17 + 1);
	int fd = (int)FT_SYS(open("gone.txt", O_RDWR | O_CREAT | O_TRUNC, 0640));
	FT_SYS(write(fd, data, SZ));
	FT_SYS(lseek(fd, 777, SEEK_SET));
	char link_before[4096] = "", lp[64];
	snprintf(lp, sizeof(lp), "/proc/self/fd/%d", fd);
	FT_SYS(unlink("gone.txt"));
	FT_SYS(readlink(lp, link_before, sizeof(link_before) - 1));
	struct stat sb;
	FT_SYS(fstat(fd, &sb));

	ft_ready();
	ft_wait_restored();

	struct stat st;
	FT_SYS(fstat(fd, &st));
	FT_EQ(st.st_size, SZ, "size");
	FT_EQ(st.st_nlink, 0, "st_nlink");
	FT_EQ(st.st_mode & 07777, sb.st_mode & 07777, "mode");
	FT_EQ(lseek(fd, 0, SEEK_CUR), 777, "offset");
	unsigned char buf[SZ];
	FT_EQ(pread(fd, buf, SZ, 0), SZ, "pread size");
	FT_CHECK(memcmp(buf, data, SZ) == 0, "content differs");
	FT_EQ(read(fd, buf, 10), 10, "read");
	FT_CHECK(memcmp(buf, data + 777, 10) == 0, "read from offset 777 wrong");
	FT_EQ(pwrite(fd, "NEW", 3, 0), 3, "pwrite");
	FT_CHECK(pread(fd, buf, 3, 0) == 3 && memcmp(buf, "NEW", 3) == 0, "written data not read back");
	char link_after[4096] = "";
	readlink(lp, link_after, sizeof(link_after) - 1);
	FT_CHECK(strcmp(link_before, link_after) == 0, "link '%s' -> '%s'", link_before, link_after);
	size_t l = strlen(link_after);
	FT_CHECK(l > 10 && strcmp(link_after + l - 10, " (deleted)") == 0, "link '%s' lacks (deleted)",
		 link_after);
	FT_CHECK(access("gone.txt", F_OK) != 0 && errno == ENOENT, "gone.txt exists again in the directory");
	return ft_finish();
}
