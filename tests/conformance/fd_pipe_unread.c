/*
 * fd_pipe_unread: pipes whose both ends are in the process, with unread
 * data: (1) resized to 256 KiB with F_SETPIPE_SZ and holding 100000 bytes;
 * (2) default size holding 10 bytes. After restore: F_GETPIPE_SZ, FIONREAD,
 * the exact data, then EAGAIN; both pipes keep working.
 */
#include "ferry_test.h"
#include <sys/ioctl.h>

#define BIG 100000

int main(void)
{
	ft_init();
	int p1[2], p2[2];
	FT_SYS(pipe(p1));
	FT_SYS(pipe(p2));
	int sz = (int)FT_SYS(fcntl(p1[1], F_SETPIPE_SZ, 256 << 10));
	static unsigned char big[BIG], got[BIG + 16];
	for (int i = 0; i < BIG; i++)
		big[i] = (unsigned char)(i * 101 + (i >> 10));
	FT_EQ(write(p1[1], big, BIG), BIG, "setup write big");
	FT_SYS(write(p2[1], "0123456789", 10));
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
	FT_CHECK(read(p1[0], got, 1) < 0 && errno == EAGAIN, "pipe 1 has extra data");
	FT_EQ(write(p1[1], "again", 5), 5, "pipe 1 write after restore");
	FT_EQ(read(p1[0], got, 16), 5, "pipe 1 read after restore");
	char b[32] = { 0 };
	ioctl(p2[0], FIONREAD, &n);
	FT_EQ(n, 10, "pipe 2 FIONREAD");
	FT_EQ(read(p2[0], b, 32), 10, "pipe 2 read");
	FT_CHECK(memcmp(b, "0123456789", 10) == 0, "pipe 2 data '%s'", b);
	FT_EQ(write(p2[1], "more", 4), 4, "pipe 2 write after restore");
	FT_EQ(read(p2[0], b, 32), 4, "pipe 2 read after restore");
	return ft_finish();
}
