/*
 * fd_pipe_full: a pipe (default 64 KiB) filled to capacity with a pattern
 * until write() gives EAGAIN. After restore the same bytes read back, in
 * order, the pipe's size is unchanged, and then it is empty. The same for
 * a pipe grown to 1 MiB and one shrunk to one page (F_SETPIPE_SZ), filled
 * with 1000-byte writes, and a default pipe whose non-blocking write end
 * has the lower fd number.
 */
#include "ferry_test.h"

static unsigned char buf[1 << 21], got[1 << 21];

struct fp {
	int p[2];
	int cap;
	long total;
};

static void fill(struct fp *f, int size, int chunk, int write_end_first)
{
	FT_SYS(pipe2(f->p, O_NONBLOCK));
	if (write_end_first) {
		/* the read end moves above the write end: restore meets the
		 * (non-blocking) write end first */
		int r = (int)FT_SYS(dup(f->p[0]));
		close(f->p[0]);
		f->p[0] = r;
	}
	if (size)
		FT_SYS(fcntl(f->p[1], F_SETPIPE_SZ, size));
	f->cap = (int)FT_SYS(fcntl(f->p[1], F_GETPIPE_SZ));
	f->total = 0;
	for (;;) {
		ssize_t n = write(f->p[1], buf + f->total, (size_t)chunk);
		if (n < 0 && errno == EAGAIN)
			break;
		if (n < 0)
			ft_die("write: %s", strerror(errno));
		f->total += n;
	}
	ft_log("filled %ld bytes (capacity %d)", f->total, f->cap);
}

static void check(struct fp *f, const char *what)
{
	char w[64];
	snprintf(w, sizeof(w), "%s: pipe size", what);
	FT_EQ(fcntl(f->p[1], F_GETPIPE_SZ), f->cap, w);
	long r = 0;
	for (;;) {
		ssize_t n = read(f->p[0], got + r, sizeof(got) - (size_t)r);
		if (n <= 0)
			break;
		r += n;
	}
	snprintf(w, sizeof(w), "%s: bytes read back", what);
	FT_EQ(r, f->total, w);
	FT_CHECK(memcmp(got, buf, (size_t)(r < f->total ? r : f->total)) == 0, "%s: pipe content differs", what);
}

int main(void)
{
	ft_init();
	for (int i = 0; i < (int)sizeof(buf); i++)
		buf[i] = (unsigned char)(i * 7 + i / 251);
	struct fp a, b, c, d;
	fill(&a, 0, 4096, 0);
	fill(&b, 1 << 20, 1000, 0);
	fill(&c, 4096, 1000, 0);
	fill(&d, 0, 4096, 1);

	ft_ready();
	ft_wait_restored();

	check(&a, "default pipe");
	check(&b, "1 MiB pipe");
	check(&c, "one-page pipe");
	check(&d, "pipe with its write end first");
	return ft_finish();
}
