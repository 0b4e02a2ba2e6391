/*
 * fd_pipe_full: a pipe (default 64 KiB) filled to capacity with a pattern
 * until write() gives EAGAIN. After restore the same bytes read back, in
 * order, the pipe's size is unchanged, and then it is empty.
 */
#include "ferry_test.h"

int main(void)
{
	ft_init();
	int p[2];
	FT_SYS(pipe2(p, O_NONBLOCK));
	int cap = (int)FT_SYS(fcntl(p[1], F_GETPIPE_SZ));
	static unsigned char buf[1 << 20];
	for (int i = 0; i < (int)sizeof(buf); i++)
		buf[i] = (unsigned char)(i * 7 + i / 251);
	long total = 0;
	for (;;) {
		ssize_t n = write(p[1], buf + total, 4096);
		if (n < 0 && errno == EAGAIN)
			break;
		if (n < 0)
			ft_die("write: %s", strerror(errno));
		total += n;
	}
	ft_log("filled %ld bytes (capacity %d)", total, cap);

	ft_ready();
	ft_wait_restored();

	FT_EQ(fcntl(p[1], F_GETPIPE_SZ), cap, "pipe size");
	static unsigned char got[1 << 20];
	long r = 0;
	for (;;) {
		ssize_t n = read(p[0], got + r, sizeof(got) - (size_t)r);
		if (n <= 0)
			break;
		r += n;
	}
	FT_EQ(r, total, "bytes read back");
	FT_CHECK(memcmp(got, buf, (size_t)(r < total ? r : total)) == 0, "pipe content differs");
	return ft_finish();
}
