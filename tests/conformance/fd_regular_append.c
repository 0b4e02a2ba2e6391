/*
 * fd_regular_append: regular files with fds in various states: O_RDWR at
 * offset 1234, O_RDONLY at offset 500, O_WRONLY|O_APPEND (offset 0 after
 * lseek), O_RDWR positioned beyond EOF, all at fixed fd numbers. After
 * restore: same fd numbers, F_GETFL and F_GETFD equal, offsets kept, reads
 * return the expected bytes and a write on the O_APPEND fd goes to the end.
 */
#include "ferry_test.h"

#define SZ 10000

static int pick(int fd, int want)
{
	int r = (int)FT_SYS(dup2(fd, want));
	close(fd);
	return r;
}

int main(void)
{
	ft_init();
	unsigned char data[SZ];
	for (int i = 0; i < SZ; i++)
		data[i] = (unsigned char)(i * 13 + (i >> 7));
	int rw = pick((int)FT_SYS(open("a.txt", O_RDWR | O_CREAT | O_TRUNC, 0644)), 10);
	FT_SYS(write(rw, data, SZ));
	FT_SYS(lseek(rw, 1234, SEEK_SET));
	int ro = pick((int)FT_SYS(open("a.txt", O_RDONLY)), 11);
	FT_SYS(lseek(ro, 500, SEEK_SET));
	int ap = pick((int)FT_SYS(open("b.txt", O_WRONLY | O_APPEND | O_CREAT | O_TRUNC, 0600)), 12);
	FT_SYS(write(ap, "abc", 3));
	FT_SYS(lseek(ap, 0, SEEK_SET));
	int past = pick((int)FT_SYS(open("a.txt", O_RDWR)), 13);
	FT_SYS(lseek(past, SZ + 4096, SEEK_SET));
	int fds[] = { rw, ro, ap, past };
	int fl[4], fdf[4];
	off_t off[4];
	for (int i = 0; i < 4; i++) {
		fl[i] = fcntl(fds[i], F_GETFL);
		fdf[i] = fcntl(fds[i], F_GETFD);
		off[i] = lseek(fds[i], 0, SEEK_CUR);
	}

	ft_ready();
	ft_wait_restored();

	for (int i = 0; i < 4; i++) {
		char what[64];
		snprintf(what, sizeof(what), "fd %d F_GETFL", fds[i]);
		FT_EQ(fcntl(fds[i], F_GETFL), fl[i], what);
		snprintf(what, sizeof(what), "fd %d F_GETFD", fds[i]);
		FT_EQ(fcntl(fds[i], F_GETFD), fdf[i], what);
		snprintf(what, sizeof(what), "fd %d offset", fds[i]);
		FT_EQ(lseek(fds[i], 0, SEEK_CUR), off[i], what);
	}
	FT_CHECK((fcntl(ap, F_GETFL) & O_APPEND) && (fcntl(ap, F_GETFL) & O_ACCMODE) == O_WRONLY,
		 "append fd flags 0x%x", fcntl(ap, F_GETFL));
	FT_CHECK((fcntl(ro, F_GETFL) & O_ACCMODE) == O_RDONLY, "ro fd access mode");
	unsigned char buf[100];
	FT_EQ(read(rw, buf, 100), 100, "read on rw fd");
	FT_CHECK(memcmp(buf, data + 1234, 100) == 0, "rw fd read wrong bytes");
	FT_EQ(read(ro, buf, 100), 100, "read on ro fd");
	FT_CHECK(memcmp(buf, data + 500, 100) == 0, "ro fd read wrong bytes");
	FT_CHECK(write(ro, "x", 1) < 0 && errno == EBADF, "write on O_RDONLY fd did not fail with EBADF");
	FT_EQ(write(ap, "xyz", 3), 3, "write on append fd");
	char tail[7] = { 0 };
	int chk = open("b.txt", O_RDONLY);
	FT_EQ(pread(chk, tail, 6, 0), 6, "pread b.txt");
	FT_CHECK(memcmp(tail, "abcxyz", 6) == 0, "b.txt = '%s', expected 'abcxyz'", tail);
	FT_EQ(read(past, buf, 10), 0, "read beyond EOF");
	FT_EQ(lseek(rw, 0, SEEK_END), SZ, "file size");
	return ft_finish();
}
