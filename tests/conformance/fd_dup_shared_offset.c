/*
 * fd_dup_shared_offset: fd a on a file, b = dup(a), c = dup3(a, 50,
 * O_CLOEXEC), and d = a separate open() of the same file. a has read 100
 * bytes (shared offset 100), d is at 7, O_NONBLOCK was set through a. After
 * restore: a, b, c at offset 100 and d at 7; reading through b advances a
 * and c (one open file description), d is independent; O_NONBLOCK shows on
 * b and c but not d; FD_CLOEXEC only on c; kcmp(KCMP_FILE) reports a, b, c
 * as the same file and d as a different one.
 */
#include "ferry_test.h"
#include <linux/kcmp.h>

static long kcmp_file(int a, int b)
{
	pid_t p = getpid();
	return syscall(SYS_kcmp, p, p, KCMP_FILE, a, b);
}

int main(void)
{
	ft_init();
	unsigned char data[1000];
	for (int i = 0; i < 1000; i++)
		data[i] = (unsigned char)(i ^ 0x5a);
	int w = (int)FT_SYS(open("dup.bin", O_WRONLY | O_CREAT | O_TRUNC, 0644));
	FT_SYS(write(w, data, sizeof(data)));
	close(w);
	int a = (int)FT_SYS(open("dup.bin", O_RDONLY));
	int b = (int)FT_SYS(dup(a));
	int c = (int)FT_SYS(dup3(a, 50, O_CLOEXEC));
	int d = (int)FT_SYS(open("dup.bin", O_RDONLY));
	unsigned char buf[100];
	FT_SYS(read(a, buf, 100));
	FT_SYS(lseek(d, 7, SEEK_SET));
	FT_SYS(fcntl(a, F_SETFL, O_NONBLOCK));

	ft_ready();
	ft_wait_restored();

	FT_EQ(lseek(a, 0, SEEK_CUR), 100, "offset of a");
	FT_EQ(lseek(b, 0, SEEK_CUR), 100, "offset of b (dup)");
	FT_EQ(lseek(c, 0, SEEK_CUR), 100, "offset of c (dup3)");
	FT_EQ(lseek(d, 0, SEEK_CUR), 7, "offset of d (separate open)");
	FT_EQ(read(b, buf, 10), 10, "read via b");
	FT_CHECK(memcmp(buf, data + 100, 10) == 0, "read via b wrong data");
	FT_EQ(lseek(a, 0, SEEK_CUR), 110, "offset of a after read via b (shared)");
	FT_EQ(lseek(c, 0, SEEK_CUR), 110, "offset of c after read via b (shared)");
	FT_EQ(lseek(d, 0, SEEK_CUR), 7, "offset of d after read via b (independent)");
	FT_CHECK(fcntl(b, F_GETFL) & O_NONBLOCK, "O_NONBLOCK set via a not visible on b");
	FT_CHECK(fcntl(c, F_GETFL) & O_NONBLOCK, "O_NONBLOCK set via a not visible on c");
	FT_CHECK(!(fcntl(d, F_GETFL) & O_NONBLOCK), "O_NONBLOCK leaked to separate open d");
	FT_EQ(fcntl(a, F_GETFD), 0, "F_GETFD a");
	FT_EQ(fcntl(b, F_GETFD), 0, "F_GETFD b");
	FT_EQ(fcntl(c, F_GETFD), FD_CLOEXEC, "F_GETFD c");
	FT_EQ(c, 50, "dup3 fd number");
	long k = kcmp_file(a, b);
	if (k < 0 && errno == ENOSYS) {
		ft_log("kcmp not available");
	} else {
		FT_EQ(kcmp_file(a, b), 0, "kcmp(a, b)");
		FT_EQ(kcmp_file(a, c), 0, "kcmp(a, c)");
		FT_CHECK(kcmp_file(a, d) != 0, "kcmp(a, d) says same file");
	}
	return ft_finish();
}
