/*
 * fd_open_flags: files opened with the flags only open() sets or that
 * F_SETFL rarely sees: O_DSYNC, O_SYNC, O_NOATIME, O_NOFOLLOW, O_DIRECT
 * (where the filesystem takes it), and an empty packet-mode pipe
 * (pipe2(O_DIRECT)). After restore: F_GETFL equal for each, and the pipe
 * still keeps each write as one message.
 */
#include "ferry_test.h"

int main(void)
{
	ft_init();
	int fds[6], n = 0;
	FT_SYS(close((int)FT_SYS(open("f.txt", O_RDWR | O_CREAT | O_TRUNC, 0600))));
	fds[n++] = (int)FT_SYS(open("f.txt", O_RDWR | O_DSYNC));
	fds[n++] = (int)FT_SYS(open("f.txt", O_WRONLY | O_SYNC));
	fds[n++] = (int)FT_SYS(open("f.txt", O_RDONLY | O_NOATIME | O_NOFOLLOW));
	int direct = open("f.txt", O_RDONLY | O_DIRECT);
	if (direct >= 0)
		fds[n++] = direct;
	else
		ft_log("O_DIRECT not taken here (%s): not checked", strerror(errno));
	int p[2];
	FT_SYS(pipe2(p, O_DIRECT));
	fds[n++] = p[0];
	fds[n++] = p[1];
	int fl[6];
	for (int i = 0; i < n; i++)
		fl[i] = fcntl(fds[i], F_GETFL);
	FT_CHECK(fl[n - 1] & O_DIRECT, "pipe2(O_DIRECT) write end without O_DIRECT");

	ft_ready();
	ft_wait_restored();

	for (int i = 0; i < n; i++)
		FT_EQ(fcntl(fds[i], F_GETFL), fl[i], "F_GETFL");
	FT_SYS(write(p[1], "one", 3));
	FT_SYS(write(p[1], "two", 3));
	char b[16];
	FT_EQ(read(p[0], b, sizeof(b)), 3, "the first message alone (packet mode)");
	FT_EQ(read(p[0], b, sizeof(b)), 3, "the second message alone");
	return ft_finish();
}
