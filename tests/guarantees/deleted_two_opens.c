/*
 * deleted_two_opens: one file opened twice (two open file descriptions:
 * O_WRONLY under its name, O_RDONLY under a hard link), then both names
 * unlinked and 1000 bytes written through the first fd (zdtm
 * unlink_fstat02). Restore would recreate each description's file on its
 * own (two inodes where there was one), so checkpoint must refuse it by fd
 * and leave the process unharmed: both fds still one inode (nlink 0), size
 * 1000 through both, own offsets and access modes, and a write through one
 * is read through the other.
 */
#include "../conformance/ferry_test.h"

int main(void)
{
	ft_init();
	int w = FT_SYS(open("twice", O_WRONLY | O_CREAT | O_TRUNC, 0640));
	FT_SYS(link("twice", "twice.link"));
	int r = FT_SYS(open("twice.link", O_RDONLY));
	FT_SYS(unlink("twice"));
	FT_SYS(unlink("twice.link"));
	char buf[1000];
	memset(buf, '0', sizeof(buf));
	ft_write_all(w, buf, sizeof(buf));
	FT_SYS(lseek(r, 10, SEEK_SET));

	ft_ready();
	ft_wait_restored();

	struct stat sw, sr;
	FT_CHECK(fstat(w, &sw) == 0 && fstat(r, &sr) == 0, "fstat: %s", strerror(errno));
	FT_CHECK(sw.st_dev == sr.st_dev && sw.st_ino == sr.st_ino, "the two fds are different files now (ino %lu vs %lu)",
		 (unsigned long)sw.st_ino, (unsigned long)sr.st_ino);
	FT_CHECK(sw.st_nlink == 0 && sr.st_nlink == 0, "nlink %lu/%lu, want 0", (unsigned long)sw.st_nlink,
		 (unsigned long)sr.st_nlink);
	FT_EQ(sw.st_size, 1000, "size via the write fd");
	FT_EQ(sr.st_size, 1000, "size via the read fd");
	FT_EQ(lseek(w, 0, SEEK_CUR), 1000, "offset of the write fd");
	FT_EQ(lseek(r, 0, SEEK_CUR), 10, "offset of the read fd");
	FT_EQ(fcntl(w, F_GETFL) & O_ACCMODE, O_WRONLY, "access mode of the write fd");
	FT_EQ(fcntl(r, F_GETFL) & O_ACCMODE, O_RDONLY, "access mode of the read fd");
	FT_CHECK(write(w, "tail", 4) == 4, "write: %s", strerror(errno));
	char got[5] = "";
	FT_CHECK(pread(r, got, 4, 1000) == 4 && memcmp(got, "tail", 4) == 0,
		 "write through one fd not seen through the other (got '%s')", got);
	FT_CHECK(access("twice", F_OK) != 0 && access("twice.link", F_OK) != 0, "a name reappeared in the test dir");
	return ft_finish();
}
