/*
 * fd_fifo_unread: a FIFO made with mkfifo in the test dir, opened read
 * (O_RDONLY|O_NONBLOCK) and write ends, holding 13 unread bytes. After
 * restore: both fds are still FIFOs on that path (same inode), flags kept,
 * the 13 bytes are readable, then EAGAIN; new data written flows through.
 */
#include "ferry_test.h"

int main(void)
{
	ft_init();
	FT_SYS(mkfifo("fifo", 0600));
	int r = (int)FT_SYS(open("fifo", O_RDONLY | O_NONBLOCK));
	int w = (int)FT_SYS(open("fifo", O_WRONLY));
	FT_SYS(write(w, "fifo data 123", 13));
	struct stat st0;
	FT_SYS(stat("fifo", &st0));
	int rfl = fcntl(r, F_GETFL), wfl = fcntl(w, F_GETFL);

	ft_ready();
	ft_wait_restored();

	struct stat sr, sw;
	FT_SYS(fstat(r, &sr));
	FT_SYS(fstat(w, &sw));
	FT_CHECK(S_ISFIFO(sr.st_mode) && sr.st_ino == st0.st_ino, "read end is not the fifo (ino %lu vs %lu)",
		 (unsigned long)sr.st_ino, (unsigned long)st0.st_ino);
	FT_CHECK(S_ISFIFO(sw.st_mode) && sw.st_ino == st0.st_ino, "write end is not the fifo");
	FT_EQ(fcntl(r, F_GETFL), rfl, "read end F_GETFL");
	FT_EQ(fcntl(w, F_GETFL), wfl, "write end F_GETFL");
	char b[32] = { 0 };
	FT_EQ(read(r, b, 32), 13, "read unread data");
	FT_CHECK(memcmp(b, "fifo data 123", 13) == 0, "data '%s'", b);
	FT_CHECK(read(r, b, 32) < 0 && errno == EAGAIN, "extra data in fifo");
	FT_EQ(write(w, "again", 5), 5, "write after restore");
	FT_EQ(read(r, b, 32), 5, "read after restore");
	return ft_finish();
}
