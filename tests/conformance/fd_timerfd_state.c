/*
 * fd_timerfd_state: timerfd state that a plain fdinfo read gets wrong.
 * T1: CLOCK_MONOTONIC periodic 50 ms that fired several times unread
 * before the checkpoint (its fdinfo it_value reads 0 until someone looks).
 * T2: CLOCK_REALTIME, TFD_TIMER_ABSTIME | TFD_TIMER_CANCEL_ON_SET, armed
 * far ahead. T3: disarmed after a settime with TFD_TIMER_ABSTIME (flags
 * kept by the kernel). T4: CLOCK_BOOTTIME one-shot that expired unread.
 * After restore: T1 is still armed with interval 50 ms and a read returns
 * at least the expirations counted before; settime flags and clockid of
 * all are as before; T4 reads 1.
 */
#include "ferry_test.h"
#include <sys/timerfd.h>
#ifndef TFD_TIMER_CANCEL_ON_SET
#define TFD_TIMER_CANCEL_ON_SET (1 << 1)
#endif

int main(void)
{
	ft_init();
	int t1 = (int)FT_SYS(timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK));
	int t2 = (int)FT_SYS(timerfd_create(CLOCK_REALTIME, TFD_NONBLOCK));
	int t3 = (int)FT_SYS(timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK));
	int t4 = (int)FT_SYS(timerfd_create(CLOCK_BOOTTIME, TFD_NONBLOCK));
	struct itimerspec p50 = { { 0, 50000000 }, { 0, 50000000 } };
	FT_SYS(timerfd_settime(t1, 0, &p50, NULL));
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	struct itimerspec far = { { 0, 0 }, { now.tv_sec + 3600, 0 } };
	FT_SYS(timerfd_settime(t2, TFD_TIMER_ABSTIME | TFD_TIMER_CANCEL_ON_SET, &far, NULL));
	struct itimerspec zero = { { 0, 0 }, { 0, 0 } };
	FT_SYS(timerfd_settime(t3, TFD_TIMER_ABSTIME, &zero, NULL));
	struct itimerspec one = { { 0, 0 }, { 0, 1000000 } };
	FT_SYS(timerfd_settime(t4, 0, &one, NULL));
	ft_sleep_ms(320); /* T1 fires about 6 times, T4 once; nobody reads */
	int fds[] = { t1, t2, t3, t4 };
	char clk[4][32], flg[4][32];
	for (int i = 0; i < 4; i++) {
		ft_fdinfo_field(fds[i], "clockid", clk[i], 32);
		ft_fdinfo_field(fds[i], "settime flags", flg[i], 32);
	}

	ft_ready();
	ft_wait_restored();

	for (int i = 0; i < 4; i++) {
		char c[32] = "", f[32] = "";
		ft_fdinfo_field(fds[i], "clockid", c, 32);
		ft_fdinfo_field(fds[i], "settime flags", f, 32);
		FT_CHECK(strcmp(c, clk[i]) == 0, "T%d clockid '%s' -> '%s'", i + 1, clk[i], c);
		FT_CHECK(strcmp(f, flg[i]) == 0, "T%d settime flags '%s' -> '%s'", i + 1, flg[i], f);
	}
	struct itimerspec g;
	FT_SYS(timerfd_gettime(t1, &g));
	FT_CHECK(g.it_interval.tv_sec == 0 && g.it_interval.tv_nsec == 50000000, "T1 interval %ld.%09ld, expected 0.05", (long)g.it_interval.tv_sec, g.it_interval.tv_nsec);
	FT_CHECK(g.it_value.tv_sec != 0 || g.it_value.tv_nsec != 0, "T1 disarmed after restore");
	uint64_t n = 0;
	ssize_t r = read(t1, &n, 8);
	FT_CHECK(r == 8 && n >= 5, "T1 read %zd, %llu expirations (expected >= 5)", r, (unsigned long long)n);
	FT_SYS(timerfd_gettime(t2, &g));
	FT_CHECK(g.it_value.tv_sec > 3000, "T2 remaining %ld s, expected about 3600", (long)g.it_value.tv_sec);
	n = 0;
	r = read(t4, &n, 8);
	FT_CHECK(r == 8 && n == 1, "T4 read %zd, %llu expirations (expected 1)", r, (unsigned long long)n);
	return ft_finish();
}
