/*
 * sig_itimer_alarm: setitimer(ITIMER_REAL) with a 200 ms interval and a
 * SIGALRM handler counting ticks (>= 2 ticks seen before READY). After
 * restore: getitimer shows the same 200 ms interval and a value in
 * (0, 200 ms], and the counter keeps increasing (>= 3 more ticks within
 * 2 s).
 */
#include "ferry_test.h"
#include <sys/time.h>

static volatile int ticks;

static void on_alrm(int sig)
{
	(void)sig;
	ticks++;
}

int main(void)
{
	ft_init();
	struct sigaction sa = { .sa_handler = on_alrm, .sa_flags = SA_RESTART };
	FT_SYS(sigaction(SIGALRM, &sa, NULL));
	struct itimerval it = { { 0, 200000 }, { 0, 200000 } };
	FT_SYS(setitimer(ITIMER_REAL, &it, NULL));
	double dl = ft_mono() + 5;
	while (ticks < 2 && ft_mono() < dl)
		ft_sleep_ms(10);
	if (ticks < 2)
		ft_die("SIGALRM not ticking");

	ft_ready();
	ft_wait_restored();

	struct itimerval g;
	FT_SYS(getitimer(ITIMER_REAL, &g));
	FT_CHECK(g.it_interval.tv_sec == 0 && g.it_interval.tv_usec == 200000, "interval %ld.%06ld",
		 (long)g.it_interval.tv_sec, (long)g.it_interval.tv_usec);
	double v = ft_tv2d(&g.it_value);
	FT_CHECK(v > 0 && v <= 0.2 + 0.001, "value %.6f", v);
	int t0 = ticks;
	dl = ft_mono() + 2;
	while (ticks < t0 + 3 && ft_mono() < dl)
		ft_sleep_ms(10);
	FT_CHECK(ticks >= t0 + 3, "SIGALRM ticks after restore: %d -> %d in 2 s", t0, ticks);
	return ft_finish();
}
