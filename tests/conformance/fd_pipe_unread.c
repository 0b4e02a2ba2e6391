/*
 * fd_pipe_unread: pipes whose both ends are in the process, with unread
 * data: (1) resized to 256 KiB with F_SETPIPE_SZ and holding 100000 bytes;
 * (2) default size holding 10 bytes; (3) holding "tail" with its write end
 * closed (reader must get the data then EOF); (4) read end closed (a write
 * must fail with EPIPE, SIGPIPE ignored). After restore: F_GETPIPE_SZ,
 * FIONREAD, exact data and end-of-data behaviour.
 */
#include "ferry_test.h"
#include <sys/ioctl.h>

#define BIG 100000

int main(void)
{
	ft_init();
	signal(SIGPIPE, SIG_IGN);
	int p1[2], p2[2], p3[2], p4[2];
	FT_SYS(pipe(p1));
	FT_SYS(pipe(p2));
	FT_SYS(pipe(p3));
	FT_SYS(pipe(p4));
	int sz = (int)FT_SYS(fcntl(p1[1], F_SETPIPE_SZ, 256 << 10));
	static unsigned char big[BIG], got[BIG + 16];
	for (int i = 0; i < BIG; i++)
		big[i] = (unsigned char)(i * 101 + (i >> 10));
	FT_EQ(write(p1[1], big, BIG), BIG, "setup write big");
	FT_SYS(write(p2[1], "0123456789", 10));
	FT_SYS(write(p3[1], "tail", 4));
	close(p3[1]);
	close(p4[0]);
	int sz2 = (int)fcntl(p2[0], F_GETPIPE_SZ);

	ft_ready();
	ft_wait_restored();

	FT_EQ(fcntl(p1[0], F_GETPIPE_SZ), sz, "pipe 1 F_GETPIPE_SZ");
	FT_EQ(fcntl(p2[0], F_GETPIPE_SZ), sz2, "pipe 2 F_GETPIPE_SZ");
	int n = -1;
	ioctl(p1[0], FIONREAD, &n);
	FT_EQ(n, BIG, "pipe 1 FIONREAD");
	size_t have = 0;
	fcntl(p1[0], F_SETFL, O_NONBLOCK);
	for (;;) {
		ssize_t r = read(p1[0], got + have, sizeof(got) - have);
		if (r <= 0)
			break;
		have += (size_t)r;
	}
	FT_EQ(have, BIG, "pipe 1 bytes read");
	FT_CHECK(have >= BIG && memcmp(got, big, BIG) == 0, "pipe 1 data differs");
	char b[32] = { 0 };
	ioctl(p2[0], FIONREAD, &n);
	FT_EQ(n, 10, "pipe 2 FIONREAD");
	FT_EQ(read(p2[0], b, 32), 10, "pipe 2 read");
	FT_CHECK(memcmp(b, "0123456789", 10) == 0, "pipe 2 data '%s'", b);
	FT_EQ(write(p2[1], "more", 4), 4, "pipe 2 write after restore");
	FT_EQ(read(p2[0], b, 32), 4, "pipe 2 read after restore");
	memset(b, 0, sizeof(b));
	FT_EQ(read(p3[0], b, 32), 4, "pipe 3 read");
	FT_CHECK(memcmp(b, "tail", 4) == 0, "pipe 3 data '%s'", b);
	FT_EQ(read(p3[0], b, 32), 0, "pipe 3 EOF (write end closed)");
	errno = 0;
	FT_CHECK(write(p4[1], "x", 1) < 0 && errno == EPIPE, "pipe 4 write with no reader: %s", strerror(errno));
	return ft_finish();
}
