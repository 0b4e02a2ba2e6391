/*
 * fd_fifo_deleted: FIFOs unlinked from the test dir while still open.
 *   "ghost1" (mode 0640): 300 bytes written through an O_RDWR open that was
 *     closed afterwards; only a read end (O_RDONLY|O_NONBLOCK) is left.
 *   "ghost2" (mode 0600): a read end and a write end (both still open) with
 *     7 bytes queued, so both fds must stay on one FIFO.
 * After restore: each fd is a FIFO with nlink 0, its mode kept and its
 * /proc/self/fd link ending in "(deleted)"; the exact bytes come back once,
 * then EOF for ghost1 (no writer left) and EAGAIN for ghost2; a write on ghost2's write end reaches its read end; nothing
 * appeared under either name in the directory.
 */
#include "ferry_test.h"

#define N1 300

static void check_ghost(int fd, const char *what, mode_t mode)
{
	struct stat st;
	if (fstat(fd, &st) != 0) {
		ft_fail("%s: fstat: %s", what, strerror(errno));
		return;
	}
	FT_CHECK(S_ISFIFO(st.st_mode), "%s: not a FIFO (mode 0%o)", what, (unsigned)st.st_mode);
	FT_EQ(st.st_nlink, 0, "nlink of a deleted FIFO");
	FT_EQ(st.st_mode & 07777, mode, "mode of a deleted FIFO");
	char path[64], link[512];
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	ssize_t n = readlink(path, link, sizeof(link) - 1);
	link[n < 0 ? 0 : n] = 0;
	size_t l = strlen(link);
	FT_CHECK(l > 10 && strcmp(link + l - 10, " (deleted)") == 0, "%s: link '%s' does not say (deleted)", what, link);
}

int main(void)
{
	ft_init();
	unsigned char data1[N1];
	for (int i = 0; i < N1; i++)
		data1[i] = (unsigned char)(i * 7 + 3);

	FT_SYS(mkfifo("ghost1", 0600));
	FT_SYS(chmod("ghost1", 0640));
	int rw1 = (int)FT_SYS(open("ghost1", O_RDWR));
	int r1 = (int)FT_SYS(open("ghost1", O_RDONLY | O_NONBLOCK));
	FT_EQ(write(rw1, data1, N1), N1, "setup write ghost1");
	FT_SYS(unlink("ghost1"));
	FT_SYS(close(rw1));

	FT_SYS(mkfifo("ghost2", 0600));
	int r2 = (int)FT_SYS(open("ghost2", O_RDONLY | O_NONBLOCK));
	int w2 = (int)FT_SYS(open("ghost2", O_WRONLY));
	FT_EQ(write(w2, "seven!!", 7), 7, "setup write ghost2");
	FT_SYS(unlink("ghost2"));
	int r1fl = fcntl(r1, F_GETFL), r2fl = fcntl(r2, F_GETFL), w2fl = fcntl(w2, F_GETFL);

	ft_ready();
	ft_wait_restored();

	check_ghost(r1, "ghost1 read end", 0640);
	check_ghost(r2, "ghost2 read end", 0600);
	check_ghost(w2, "ghost2 write end", 0600);
	FT_EQ(fcntl(r1, F_GETFL), r1fl, "ghost1 read end F_GETFL");
	FT_EQ(fcntl(r2, F_GETFL), r2fl, "ghost2 read end F_GETFL");
	FT_EQ(fcntl(w2, F_GETFL), w2fl, "ghost2 write end F_GETFL");

	unsigned char b[1024];
	ssize_t n = read(r1, b, sizeof(b));
	FT_EQ(n, N1, "bytes read from ghost1");
	FT_CHECK(n != N1 || memcmp(b, data1, N1) == 0, "ghost1 data differs");
	/* no writer is left: EOF, not EAGAIN */
	FT_EQ(read(r1, b, sizeof(b)), 0, "ghost1 read after its data (EOF: no writer)");

	n = read(r2, b, sizeof(b));
	FT_EQ(n, 7, "bytes read from ghost2");
	FT_CHECK(n != 7 || memcmp(b, "seven!!", 7) == 0, "ghost2 data differs");
	FT_CHECK(read(r2, b, sizeof(b)) < 0 && errno == EAGAIN, "ghost2: more data than written");
	FT_EQ(write(w2, "after", 5), 5, "write on ghost2 after restore");
	n = read(r2, b, sizeof(b));
	FT_EQ(n, 5, "ghost2 read end gets what its write end wrote (same FIFO)");

	struct stat st;
	FT_CHECK(stat("ghost1", &st) != 0 && errno == ENOENT, "ghost1 reappeared in the directory");
	FT_CHECK(stat("ghost2", &st) != 0 && errno == ENOENT, "ghost2 reappeared in the directory");
	return ft_finish();
}
