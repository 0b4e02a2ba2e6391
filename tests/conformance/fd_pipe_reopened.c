/*
 * fd_pipe_reopened: one pipe behind six descriptors: the two ends from
 * pipe(), a dup of each, and each end opened again through
 * /proc/self/fd (a second open file description of the same pipe, with
 * its own status flags). The first write description is made
 * non-blocking and the pipe is filled to capacity through it. After
 * restore: O_NONBLOCK is still on the first write description (and so on
 * its dup) and still off the reopened one; the reopened read description
 * reads the same pipe; every byte comes back once, in order, then EOF
 * when every write description is closed.
 */
#include "ferry_test.h"

static unsigned char buf[1 << 17], got[1 << 18];

int main(void)
{
	ft_init();
	for (int i = 0; i < (int)sizeof(buf); i++)
		buf[i] = (unsigned char)(i * 13 + i / 509);
	int p[2], dupped[2], reopened[2];
	char path[64];
	FT_SYS(pipe(p));
	dupped[0] = (int)FT_SYS(dup(p[0]));
	dupped[1] = (int)FT_SYS(dup(p[1]));
	snprintf(path, sizeof(path), "/proc/self/fd/%d", p[0]);
	reopened[0] = (int)FT_SYS(open(path, O_RDONLY));
	snprintf(path, sizeof(path), "/proc/self/fd/%d", p[1]);
	reopened[1] = (int)FT_SYS(open(path, O_WRONLY));
	FT_SYS(fcntl(p[1], F_SETFL, FT_SYS(fcntl(p[1], F_GETFL)) | O_NONBLOCK));
	long total = 0;
	for (;;) {
		ssize_t n = write(p[1], buf + total, 4096);
		if (n < 0 && errno == EAGAIN)
			break;
		if (n < 0)
			ft_die("write: %s", strerror(errno));
		total += n;
	}
	ft_log("filled %ld bytes", total);

	ft_ready();
	ft_wait_restored();

	FT_CHECK(fcntl(p[1], F_GETFL) & O_NONBLOCK, "O_NONBLOCK lost on the first write description");
	FT_CHECK(fcntl(dupped[1], F_GETFL) & O_NONBLOCK, "O_NONBLOCK lost on the dup of the write end");
	FT_CHECK(!(fcntl(reopened[1], F_GETFL) & O_NONBLOCK), "O_NONBLOCK appeared on the reopened write end");
	FT_EQ(fcntl(reopened[0], F_GETFL) & O_ACCMODE, O_RDONLY, "reopened read end: access mode");
	FT_EQ(fcntl(reopened[1], F_GETFL) & O_ACCMODE, O_WRONLY, "reopened write end: access mode");
	/* the first 100 bytes through the reopened read description */
	FT_EQ(read(reopened[0], got, 100), 100, "read through the reopened read end");
	close(p[1]);
	close(dupped[1]);
	close(reopened[1]);
	long r = 100;
	for (;;) {
		ssize_t n = read(p[0], got + r, sizeof(got) - (size_t)r);
		if (n < 0)
			ft_die("read: %s", strerror(errno));
		if (n == 0)
			break;
		r += n;
	}
	FT_EQ(r, total, "bytes read back");
	FT_CHECK(memcmp(got, buf, (size_t)(r < total ? r : total)) == 0, "pipe content differs");
	return ft_finish();
}
