/*
 * fd_pipe_half_closed: pipes of which the process holds only one end
 * because it closed the other: (1) read end holding "tail" whose write end
 * was closed - after restore the reader gets "tail" then EOF (no writer);
 * (2) write end whose read end was closed - after restore a write fails
 * with EPIPE (SIGPIPE ignored). The engine must tell "other end closed"
 * from "other end held by another process".
 */
#include "ferry_test.h"

int main(void)
{
	ft_init();
	signal(SIGPIPE, SIG_IGN);
	int p3[2], p4[2];
	FT_SYS(pipe(p3));
	FT_SYS(pipe(p4));
	FT_SYS(write(p3[1], "tail", 4));
	close(p3[1]);
	close(p4[0]);

	ft_ready();
	ft_wait_restored();

	char b[32] = { 0 };
	FT_EQ(read(p3[0], b, 32), 4, "read end: data");
	FT_CHECK(memcmp(b, "tail", 4) == 0, "read end data '%s'", b);
	FT_EQ(read(p3[0], b, 32), 0, "read end: EOF (write end closed)");
	errno = 0;
	FT_CHECK(write(p4[1], "x", 1) < 0 && errno == EPIPE, "write end: write with no reader: %s", strerror(errno));
	return ft_finish();
}
