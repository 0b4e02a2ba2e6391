/*
 * fd_timerfd: five timerfds: T1 CLOCK_MONOTONIC one-shot 20 s; T2
 * CLOCK_REALTIME periodic 100 ms; T3 CLOCK_MONOTONIC 1 ms one-shot that
 * already expired (1 unread tick); T4 CLOCK_BOOTTIME disarmed; T5
 * CLOCK_MONOTONIC TFD_TIMER_ABSTIME at start+30 s. After restore: fdinfo
 * clockid and settime flags kept; T1 remaining in [20 - elapsed - 0.5 s,
 * 20 s]; T2 interval exactly 100 ms and a read returns >= 1 expiration;
 * T3 reads exactly 1; T4 still disarmed; T5 remaining == deadline - now
 * within 0.5 s (absolute deadline kept).
 */
#include "ferry_test.h"
#include <sys/timerfd.h>

int main(void)
{
	ft_init();
	int t1 = (int)FT_SYS(timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK));
	int t2 = (int)FT_SYS(timerfd_create(CLOCK_REALTIME, 0));
	int t3 = (int)FT_SYS(timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
	int t4 = (int)FT_SYS(timerfd_create(CLOCK_BOOTTIME, TFD_NONBLOCK));
	int t5 = (int)FT_SYS(timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK));
	double start = ft_mono();
	struct itimerspec s1 = { { 0, 0 }, { 20, 0 } };
	struct itimerspec s2 = { { 0, 100000000 }, { 0, 100000000 } };
	struct itimerspec s3 = { { 0, 0 }, { 0, 1000000 } };
	FT_SYS(timerfd_settime(t1, 0, &s1, NULL));
	FT_SYS(timerfd_settime(t2, 0, &s2, NULL));
	FT_SYS(timerfd_settime(t3, 0, &s3, NULL));
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	struct itimerspec s5 = { { 0, 0 }, { now.tv_sec + 30, now.tv_nsec } };
	double deadline5 = ft_ts2d(&now) + 30;
	FT_SYS(timerfd_settime(t5, TFD_TIMER_ABSTIME, &s5, NULL));
	ft_sleep_ms(20); /* t3 fires */
	int fds[] = { t1, t2, t3, t4, t5 };
	char clk[5][32], flg[5][32];
	int fl[5];
	for (int i = 0; i < 5; i++) {
		ft_fdinfo_field(fds[i], "clockid", clk[i], 32);
		ft_fdinfo_field(fds[i], "settime flags", flg[i], 32);
		fl[i] = fcntl(fds[i], F_GETFL);
	}

	ft_ready();
	ft_wait_restored();

	for (int i = 0; i < 5; i++) {
		char c[32] = "", f[32] = "";
		ft_fdinfo_field(fds[i], "clockid", c, 32);
		ft_fdinfo_field(fds[i], "settime flags", f, 32);
		FT_CHECK(strcmp(c, clk[i]) == 0, "T%d clockid '%s' -> '%s'", i + 1, clk[i], c);
		FT_CHECK(strcmp(f, flg[i]) == 0, "T%d settime flags '%s' -> '%s'", i + 1, flg[i], f);
		char what[32];
		snprintf(what, sizeof(what), "T%d F_GETFL", i + 1);
		FT_EQ(fcntl(fds[i], F_GETFL), fl[i], what);
	}
	struct itimerspec g;
	double elapsed = ft_mono() - start;
	FT_SYS(timerfd_gettime(t1, &g));
	double rem1 = ft_ts2d(&g.it_value);
	FT_CHECK(rem1 > 0 && rem1 <= 20.0 + 0.01 && rem1 >= 20.0 - elapsed - 0.5,
		 "T1 remaining %.3f s (elapsed %.3f s)", rem1, elapsed);
	FT_CHECK(g.it_interval.tv_sec == 0 && g.it_interval.tv_nsec == 0, "T1 interval not zero");
	FT_SYS(timerfd_gettime(t2, &g));
	FT_CHECK(g.it_interval.tv_sec == 0 && g.it_interval.tv_nsec == 100000000, "T2 interval %ld.%09ld",
		 (long)g.it_interval.tv_sec, g.it_interval.tv_nsec);
	FT_CHECK(ft_ts2d(&g.it_value) > 0 && ft_ts2d(&g.it_value) <= 0.1 + 0.001, "T2 value %.3f",
		 ft_ts2d(&g.it_value));
	uint64_t ticks = 0;
	FT_EQ(read(t2, &ticks, 8), 8, "T2 read");
	FT_CHECK(ticks >= 1, "T2 ticks %llu", (unsigned long long)ticks);
	ticks = 0;
	FT_EQ(read(t3, &ticks, 8), 8, "T3 read (expired before checkpoint)");
	FT_EQ(ticks, 1, "T3 ticks");
	FT_CHECK(read(t3, &ticks, 8) < 0 && errno == EAGAIN, "T3 has more ticks");
	FT_SYS(timerfd_gettime(t4, &g));
	FT_CHECK(g.it_value.tv_sec == 0 && g.it_value.tv_nsec == 0, "T4 became armed");
	FT_SYS(timerfd_gettime(t5, &g));
	double rem5 = ft_ts2d(&g.it_value), exp5 = deadline5 - ft_mono();
	FT_CHECK(rem5 > exp5 - 0.5 && rem5 < exp5 + 0.5, "T5 (abstime) remaining %.3f s, expected %.3f s",
		 rem5, exp5);
	FT_CHECK(read(t1, &ticks, 8) < 0 && errno == EAGAIN, "T1 fired early");
	return ft_finish();
}
