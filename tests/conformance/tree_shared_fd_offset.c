/*
 * tree_shared_fd_offset: open file descriptions shared by the root and a
 * child through fork. "data" (O_RDWR, 100 bytes written by the root) and
 * "log" (O_WRONLY|O_APPEND) are opened before the fork. Before READY the
 * child lseeks data to 37 and each process appends one line to the log.
 * After restore: the root sees offset 37 (kcmp says both fds are one file
 * description), writes 5 bytes (offset 42); the child sees 42 and the 5
 * bytes at 37, lseeks to 10; the root sees 10. Both append lines to the log
 * after restore; the file holds all lines in order and the log offset is
 * its size in both processes.
 *
 * Synchronisation: report pipe before READY; after restore the root does its
 * part, sends the go, and reaps the child before checking what the child did.
 */
#include "ferry_test.h"
#include <linux/kcmp.h>

static long kcmp_file(pid_t a, pid_t b, int fa, int fb)
{
	return syscall(SYS_kcmp, a, b, KCMP_FILE, fa, fb);
}

static void log_line(const char *who, int fd, const char *s)
{
	ssize_t n = write(fd, s, strlen(s));
	FT_CHECK(n == (ssize_t)strlen(s), "%s: write to log: %zd (%s)", who, n, strerror(errno));
}

int main(void)
{
	ft_init();
	ft_tree_begin();
	unsigned char b[100];
	for (int i = 0; i < 100; i++)
		b[i] = (unsigned char)('a' + i % 26);
	int fd = (int)FT_SYS(open("data", O_RDWR | O_CREAT | O_TRUNC, 0600));
	FT_SYS(write(fd, b, 100));
	int lg = (int)FT_SYS(open("log", O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0600));
	log_line("root", lg, "root before\n");

	pid_t kid = ft_fork();
	if (kid == 0) {
		FT_SYS(lseek(fd, 37, SEEK_SET));
		log_line("child", lg, "child before\n");
		ft_child_ready();

		ft_child_wait_go();
		FT_EQ(lseek(fd, 0, SEEK_CUR), 42, "child: data offset after the root's write");
		char got[6] = { 0 };
		FT_EQ(pread(fd, got, 5, 37), 5, "child: pread data at 37");
		FT_CHECK(memcmp(got, "ABCDE", 5) == 0, "child: data at 37 is '%.5s', expected ABCDE", got);
		FT_EQ(fcntl(fd, F_GETFL) & (O_ACCMODE | O_APPEND), O_RDWR, "child: data F_GETFL");
		FT_EQ(fcntl(lg, F_GETFL) & (O_ACCMODE | O_APPEND), O_WRONLY | O_APPEND, "child: log F_GETFL");
		log_line("child", lg, "child after\n");
		FT_EQ(lseek(lg, 0, SEEK_CUR), (long)strlen("root before\nchild before\nroot after\nchild after\n"),
		      "child: log offset (file size)");
		FT_SYS(lseek(fd, 10, SEEK_SET));
		ft_child_exit("child");
	}
	ft_tree_wait_ready(1);
	if (lseek(fd, 0, SEEK_CUR) != 37)
		ft_die("data offset %ld before READY, expected 37 (not shared?)", (long)lseek(fd, 0, SEEK_CUR));
	long k = kcmp_file(getpid(), kid, fd, fd);
	int have_kcmp = k >= 0;
	if (!have_kcmp)
		ft_log("kcmp not available (%s): not checked", strerror(errno));
	else if (k != 0)
		ft_die("kcmp says data fds differ before READY");

	ft_ready();
	ft_tree_wait_restored();

	FT_EQ(lseek(fd, 0, SEEK_CUR), 37, "root: data offset (set by the child before READY)");
	if (have_kcmp) {
		FT_EQ(kcmp_file(getpid(), kid, fd, fd), 0, "kcmp(root data fd, child data fd)");
		FT_EQ(kcmp_file(getpid(), kid, lg, lg), 0, "kcmp(root log fd, child log fd)");
		FT_CHECK(kcmp_file(getpid(), kid, fd, lg) != 0, "kcmp says data and log are one file");
	}
	FT_EQ(fcntl(fd, F_GETFL) & (O_ACCMODE | O_APPEND), O_RDWR, "root: data F_GETFL");
	FT_EQ(fcntl(lg, F_GETFL) & (O_ACCMODE | O_APPEND), O_WRONLY | O_APPEND, "root: log F_GETFL");
	FT_EQ(write(fd, "ABCDE", 5), 5, "root: write 5 bytes to data");
	FT_EQ(lseek(fd, 0, SEEK_CUR), 42, "root: data offset after writing 5 bytes");
	log_line("root", lg, "root after\n");
	ft_go(kid, "child");
	ft_reap(kid, "child");

	FT_EQ(lseek(fd, 0, SEEK_CUR), 10, "root: data offset after the child's lseek");
	log_line("root", lg, "root end\n");
	static const char want_log[] = "root before\nchild before\nroot after\nchild after\nroot end\n";
	char got[256];
	ssize_t n = ft_read_file("log", got, sizeof(got));
	FT_CHECK(n == (ssize_t)strlen(want_log) && strcmp(got, want_log) == 0, "log content is\n%s\nexpected\n%s",
		 n < 0 ? "(unreadable)" : got, want_log);
	FT_EQ(lseek(lg, 0, SEEK_CUR), (long)strlen(want_log), "root: log offset (file size)");
	char d[101] = { 0 };
	FT_EQ(pread(fd, d, 100, 0), 100, "root: data size");
	b[37] = 'A', b[38] = 'B', b[39] = 'C', b[40] = 'D', b[41] = 'E';
	FT_CHECK(memcmp(d, b, 100) == 0, "data content differs: '%.100s'", d);
	return ft_finish();
}
