/*
 * proc_itimers_virt_prof: ITIMER_VIRTUAL armed at 100 s (interval 50 s) and
 * ITIMER_PROF at 80 s (interval 40 s) after burning ~50 ms of CPU;
 * ITIMER_REAL left disarmed. After restore: intervals are exactly 50 s and
 * 40 s, values are <= what they were at READY and not lower than that
 * minus the CPU time used since (+0.5 s slack); ITIMER_REAL still off.
 */
#include "ferry_test.h"
#include <sys/time.h>

static double cpu(void)
{
	return ft_clock(CLOCK_PROCESS_CPUTIME_ID);
}

int main(void)
{
	ft_init();
	struct itimerval v = { { 50, 0 }, { 100, 0 } }, p = { { 40, 0 }, { 80, 0 } };
	FT_SYS(setitimer(ITIMER_VIRTUAL, &v, NULL));
	FT_SYS(setitimer(ITIMER_PROF, &p, NULL));
	double c0 = cpu();
	volatile unsigned long x = 0;
	while (cpu() - c0 < 0.05)
		for (int i = 0; i < 10000; i++)
			x += (unsigned long)i;
	struct itimerval gv0, gp0;
	getitimer(ITIMER_VIRTUAL, &gv0);
	getitimer(ITIMER_PROF, &gp0);
	double cpu_ready = cpu();

	ft_ready();
	ft_wait_restored();

	double cpu_after = cpu();
	/* CPU time since READY: the clock restarts from 0 in a restored process */
	double used = cpu_after >= cpu_ready ? cpu_after - cpu_ready : cpu_after;
	struct itimerval gv, gp, gr;
	FT_SYS(getitimer(ITIMER_VIRTUAL, &gv));
	FT_SYS(getitimer(ITIMER_PROF, &gp));
	FT_SYS(getitimer(ITIMER_REAL, &gr));
	FT_CHECK(gv.it_interval.tv_sec == 50 && gv.it_interval.tv_usec == 0, "VIRTUAL interval %ld.%06ld",
		 (long)gv.it_interval.tv_sec, (long)gv.it_interval.tv_usec);
	FT_CHECK(gp.it_interval.tv_sec == 40 && gp.it_interval.tv_usec == 0, "PROF interval %ld.%06ld",
		 (long)gp.it_interval.tv_sec, (long)gp.it_interval.tv_usec);
	double v0 = ft_tv2d(&gv0.it_value), v1 = ft_tv2d(&gv.it_value);
	double p0 = ft_tv2d(&gp0.it_value), p1 = ft_tv2d(&gp.it_value);
	FT_CHECK(v1 > 0 && v1 <= v0 + 0.01 && v1 >= v0 - used - 0.5, "VIRTUAL value %.3f (was %.3f, cpu used %.3f)",
		 v1, v0, used);
	FT_CHECK(p1 > 0 && p1 <= p0 + 0.01 && p1 >= p0 - used - 0.5, "PROF value %.3f (was %.3f, cpu used %.3f)",
		 p1, p0, used);
	FT_CHECK(gr.it_value.tv_sec == 0 && gr.it_value.tv_usec == 0, "ITIMER_REAL became armed");
	FT_CHECK(v0 < 100 && v0 > 99, "setup: VIRTUAL value %.3f", v0);
	return ft_finish();
}
