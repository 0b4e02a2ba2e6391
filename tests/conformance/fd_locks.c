/*
 * fd_locks: file locks held across checkpoint/restore: flock(LOCK_EX) on
 * file a, a POSIX write lock on bytes 10..19 of file b, an OFD read lock
 * on bytes 0..4 of file c. After restore a forked child (separate opens)
 * must find every lock still held by this process.
 */
#include "ferry_test.h"
#include <sys/file.h>
#include <sys/wait.h>

static int open_rw(const char *name)
{
	int fd = (int)FT_SYS(open(name, O_RDWR | O_CREAT, 0600));
	FT_SYS(write(fd, "0123456789abcdefghijklmnopqrstuvwxyz", 36));
	return fd;
}

int main(void)
{
	ft_init();
	int a = open_rw("lock-a"), b = open_rw("lock-b"), c = open_rw("lock-c");
	FT_SYS(flock(a, LOCK_EX | LOCK_NB));
	struct flock pl = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 10, .l_len = 10 };
	FT_SYS(fcntl(b, F_SETLK, &pl));
	struct flock ol = { .l_type = F_RDLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 5 };
	FT_SYS(fcntl(c, F_OFD_SETLK, &ol));
	ft_ready();
	ft_wait_restored();

	pid_t parent = getpid();
	pid_t kid = fork();
	if (kid == 0) {
		int bad = 0;
		int a2 = open("lock-a", O_RDWR);
		if (flock(a2, LOCK_EX | LOCK_NB) == 0 || errno != EWOULDBLOCK)
			bad |= 1;
		int b2 = open("lock-b", O_RDWR);
		struct flock q = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 12, .l_len = 1 };
		if (fcntl(b2, F_GETLK, &q) != 0 || q.l_type != F_WRLCK || q.l_pid != parent || q.l_start != 10 || q.l_len != 10)
			bad |= 2;
		struct flock q2 = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 20, .l_len = 1 };
		if (fcntl(b2, F_GETLK, &q2) != 0 || q2.l_type != F_UNLCK)
			bad |= 4;
		int c2 = open("lock-c", O_RDWR);
		struct flock q3 = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1, .l_pid = 0 };
		if (fcntl(c2, F_OFD_GETLK, &q3) != 0 || q3.l_type != F_RDLCK)
			bad |= 8;
		_exit(bad);
	}
	int st = 0;
	FT_SYS(waitpid(kid, &st, 0));
	FT_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "locks lost after restore (mask %d: 1 flock, 2 posix, 4 posix range, 8 ofd)",
		 WEXITSTATUS(st));
	return ft_finish();
}
