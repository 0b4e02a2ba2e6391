/*
 * tree_pipe_between: two pipes between the root and one child, root->child
 * (rc) and child->root (cr), each with 3000 bytes queued unread at
 * checkpoint time; each process holds only its own end. After restore:
 * FIONREAD is 3000 on both read ends and each side reads exactly the queued
 * bytes; then 5000 bytes child->root and 7000 bytes root->child over the
 * same pipes; then the root closes its write end (the child reads EOF), the
 * child writes 100 last bytes and closes (the root reads them, then EOF).
 *
 * Synchronisation: report pipe before READY; after restore the root checks
 * its queued bytes before the go (the child writes nothing before its go),
 * then the data exchange itself orders both sides (blocking reads of exact
 * lengths); the root reaps the child at the end.
 */
#include "ferry_test.h"
#include <sys/ioctl.h>

#define QUEUED 3000

static void fill(unsigned char *b, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		b[i] = (unsigned char)(seed * 131u + i * 7u + (i >> 8));
}

/* Reads exactly n bytes (blocking); returns the count read before EOF/error. */
static size_t read_exact(int fd, unsigned char *b, size_t n)
{
	size_t got = 0;
	while (got < n) {
		ssize_t r = read(fd, b + got, n - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		got += (size_t)r;
	}
	return got;
}

/* Reads n bytes from fd and compares them with fill(seed). */
static void expect(const char *who, int fd, size_t n, unsigned seed)
{
	static unsigned char got[8192], want[8192];
	size_t r = read_exact(fd, got, n);
	if (r != n) {
		ft_fail("%s: read %zu of %zu bytes (seed %u): %s", who, r, n, seed, r < n ? "EOF or error" : "");
		return;
	}
	fill(want, n, seed);
	for (size_t i = 0; i < n; i++)
		if (got[i] != want[i]) {
			ft_fail("%s: byte %zu of %zu (seed %u) is 0x%02x, expected 0x%02x", who, i, n, seed, got[i],
				want[i]);
			return;
		}
}

static void send_data(const char *who, int fd, size_t n, unsigned seed)
{
	static unsigned char b[8192];
	fill(b, n, seed);
	size_t off = 0;
	while (off < n) {
		ssize_t w = write(fd, b + off, n - off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			ft_fail("%s: write (seed %u): %s", who, seed, strerror(errno));
			return;
		}
		off += (size_t)w;
	}
}

static void expect_queued(const char *who, int fd, int n)
{
	int q = -1;
	if (ioctl(fd, FIONREAD, &q) != 0)
		ft_fail("%s: FIONREAD: %s", who, strerror(errno));
	else
		FT_CHECK(q == n, "%s: FIONREAD %d, expected %d", who, q, n);
}

static void expect_eof(const char *who, int fd)
{
	char c;
	ssize_t r;
	do
		r = read(fd, &c, 1);
	while (r < 0 && errno == EINTR);
	FT_CHECK(r == 0, "%s: read returned %zd (%s), expected EOF", who, r, r < 0 ? strerror(errno) : "data");
}

int main(void)
{
	ft_init();
	ft_tree_begin();
	int rc[2], cr[2];
	FT_SYS(pipe(rc));
	FT_SYS(pipe(cr));

	pid_t kid = ft_fork();
	if (kid == 0) {
		close(rc[1]);
		close(cr[0]);
		send_data("child (before READY)", cr[1], QUEUED, 1);
		ft_child_ready();

		ft_child_wait_go();
		expect_queued("child: root->child pipe", rc[0], QUEUED);
		expect("child: queued root->child bytes", rc[0], QUEUED, 2);
		send_data("child", cr[1], 5000, 3);
		expect("child: root->child bytes after restore", rc[0], 7000, 4);
		expect_eof("child: root->child pipe after the root closed it", rc[0]);
		send_data("child", cr[1], 100, 5);
		close(cr[1]);
		close(rc[0]);
		ft_child_exit("child");
	}
	close(rc[0]);
	close(cr[1]);
	send_data("root (before READY)", rc[1], QUEUED, 2);
	ft_tree_wait_ready(1);

	ft_ready();
	ft_tree_wait_restored();

	expect_queued("root: child->root pipe", cr[0], QUEUED);
	expect("root: queued child->root bytes", cr[0], QUEUED, 1);
	ft_go(kid, "child");
	expect("root: child->root bytes after restore", cr[0], 5000, 3);
	send_data("root", rc[1], 7000, 4);
	close(rc[1]);
	expect("root: last child->root bytes", cr[0], 100, 5);
	expect_eof("root: child->root pipe after the child closed it", cr[0]);
	ft_reap(kid, "child");
	return ft_finish();
}
