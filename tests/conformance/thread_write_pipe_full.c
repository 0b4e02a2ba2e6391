/*
 * thread_write_pipe_full: the pipe (64 KiB) is filled completely with a
 * pattern, then a thread is blocked in write() of 4096 more bytes during
 * the checkpoint. After restore the main thread drains the pipe: it must
 * read the 64 KiB pattern followed by the 4096 bytes of the blocked write,
 * which must have returned 4096.
 */
#include "ferry_test.h"

#define EXTRA 4096

static int p[2];
static pid_t wtid;
static ssize_t wret = -2;
static int werr;
static unsigned char extra[EXTRA];

static void *writer(void *arg)
{
	(void)arg;
	wtid = ft_gettid();
	wret = write(p[1], extra, EXTRA);
	werr = errno;
	return NULL;
}

int main(void)
{
	ft_init();
	FT_SYS(pipe(p));
	int cap = (int)FT_SYS(fcntl(p[0], F_GETPIPE_SZ));
	unsigned char *fill = malloc((size_t)cap);
	for (int i = 0; i < cap; i++)
		fill[i] = (unsigned char)(i * 7 + i / 251);
	for (int i = 0; i < EXTRA; i++)
		extra[i] = (unsigned char)(0xA5 ^ i);
	/* fill the pipe completely */
	FT_SYS(fcntl(p[1], F_SETFL, O_NONBLOCK));
	ssize_t filled = 0;
	while (filled < cap) {
		ssize_t n = write(p[1], fill + filled, (size_t)(cap - filled));
		if (n < 0)
			break;
		filled += n;
	}
	if (filled != cap)
		ft_die("filled only %zd of %d", filled, cap);
	FT_SYS(fcntl(p[1], F_SETFL, 0));
	pthread_t t;
	FT_PT(pthread_create(&t, NULL, writer, NULL));
	while (!wtid)
		ft_sleep_ms(1);
	ft_wait_in_syscall(wtid, SYS_write, 2);

	ft_ready();
	ft_wait_restored();

	FT_CHECK(wret == -2, "write() returned early (%zd, %s)", wret, strerror(werr));
	size_t total = (size_t)cap + EXTRA;
	unsigned char *got = malloc(total);
	size_t have = 0;
	while (have < total) {
		ssize_t n = read(p[0], got + have, total - have);
		if (n <= 0) {
			ft_fail("read returned %zd (%s) after %zu bytes", n, strerror(errno), have);
			break;
		}
		have += (size_t)n;
	}
	if (ft_join(t, NULL, 5, "writer") == 0)
		FT_CHECK(wret == EXTRA, "blocked write() returned %zd (%s)", wret, strerror(werr));
	if (have == total) {
		FT_CHECK(memcmp(got, fill, (size_t)cap) == 0, "pipe content before the blocked write differs");
		FT_CHECK(memcmp(got + cap, extra, EXTRA) == 0, "data of the blocked write differs");
	}
	FT_SYS(fcntl(p[0], F_SETFL, O_NONBLOCK));
	char c;
	FT_CHECK(read(p[0], &c, 1) < 0 && errno == EAGAIN, "pipe has extra data");
	return ft_finish();
}
