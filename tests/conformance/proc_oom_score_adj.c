/*
 * proc_oom_score_adj: /proc/self/oom_score_adj set to 345 before the
 * checkpoint reads 345 after restore.
 */
#include "ferry_test.h"

static int read_adj(void)
{
	char buf[32] = { 0 };
	int fd = (int)FT_SYS(open("/proc/self/oom_score_adj", O_RDONLY));
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	return n > 0 ? atoi(buf) : -9999;
}

int main(void)
{
	ft_init();
	int fd = (int)FT_SYS(open("/proc/self/oom_score_adj", O_WRONLY));
	FT_SYS(write(fd, "345", 3));
	close(fd);
	FT_CHECK(read_adj() == 345, "oom_score_adj not set before the checkpoint");
	ft_ready();
	ft_wait_restored();
	int adj = read_adj();
	FT_CHECK(adj == 345, "oom_score_adj %d, expected 345", adj);
	return ft_finish();
}
