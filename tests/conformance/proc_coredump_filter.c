/*
 * proc_coredump_filter: /proc/self/coredump_filter set to 0x3f (what
 * every JVM sets) before the checkpoint reads 0x3f after restore; a
 * restored process would otherwise inherit its restorer's (0x33 by
 * default).
 */
#include "ferry_test.h"

static unsigned read_filter(void)
{
	char buf[32] = { 0 };
	int fd = (int)FT_SYS(open("/proc/self/coredump_filter", O_RDONLY));
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	return n > 0 ? (unsigned)strtoul(buf, NULL, 16) : 0xffffffffu;
}

int main(void)
{
	ft_init();
	int fd = (int)FT_SYS(open("/proc/self/coredump_filter", O_WRONLY));
	FT_SYS(write(fd, "0x3f", 4));
	close(fd);
	FT_CHECK(read_filter() == 0x3f, "coredump_filter not set before the checkpoint");
	ft_ready();
	ft_wait_restored();
	unsigned filter = read_filter();
	FT_CHECK(filter == 0x3f, "coredump_filter %#x, expected 0x3f", filter);
	return ft_finish();
}
