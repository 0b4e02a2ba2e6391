/*
 * thread_nanosleep: one thread is blocked in nanosleep(3 s) (relative,
 * CLOCK_REALTIME via glibc) and another in clock_nanosleep(CLOCK_MONOTONIC,
 * TIMER_ABSTIME, start+3 s) when the checkpoint happens. After restore both
 * calls must return 0 (not EINTR), after a total elapsed time >= 3 s and
 * < 3 s + 5 s.
 */
#include "ferry_test.h"

struct res {
	pid_t tid;
	double start, end;
	int ret, err;
};
static struct res rel, absr;

static void *rel_sleeper(void *arg)
{
	(void)arg;
	rel.tid = ft_gettid();
	struct timespec req = { 3, 0 }, rem = { 0, 0 };
	rel.start = ft_mono();
	rel.ret = nanosleep(&req, &rem);
	rel.err = errno;
	rel.end = ft_mono();
	return NULL;
}

static void *abs_sleeper(void *arg)
{
	(void)arg;
	absr.tid = ft_gettid();
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	absr.start = ft_ts2d(&now);
	now.tv_sec += 3;
	absr.ret = clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &now, NULL);
	absr.end = ft_mono();
	return NULL;
}

int main(void)
{
	ft_init();
	pthread_t t1, t2;
	FT_PT(pthread_create(&t1, NULL, rel_sleeper, NULL));
	FT_PT(pthread_create(&t2, NULL, abs_sleeper, NULL));
	while (!rel.tid || !absr.tid)
		ft_sleep_ms(1);
	ft_wait_in_syscall2(rel.tid, SYS_clock_nanosleep, SYS_nanosleep, 2);
	ft_wait_in_syscall(absr.tid, SYS_clock_nanosleep, 2);

	ft_ready();
	ft_wait_restored();

	if (ft_join(t1, NULL, 10, "relative sleeper") == 0) {
		double el = rel.end - rel.start;
		FT_CHECK(rel.ret == 0, "nanosleep returned %d (%s)", rel.ret, strerror(rel.err));
		FT_CHECK(el >= 3.0 - 0.002, "nanosleep(3s) returned after only %.3f s", el);
		FT_CHECK(el < 8.0, "nanosleep(3s) took %.3f s", el);
	}
	if (ft_join(t2, NULL, 10, "absolute sleeper") == 0) {
		double el = absr.end - absr.start;
		FT_CHECK(absr.ret == 0, "clock_nanosleep(ABSTIME) returned %d (%s)", absr.ret,
			 strerror(absr.ret));
		FT_CHECK(el >= 3.0 - 0.002, "clock_nanosleep(ABSTIME +3s) returned after %.3f s", el);
		FT_CHECK(el < 8.0, "clock_nanosleep(ABSTIME +3s) took %.3f s", el);
	}
	return ft_finish();
}
