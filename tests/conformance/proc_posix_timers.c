/*
 * proc_posix_timers: POSIX timers with ids that have a gap (4 created, the
 * 2nd deleted): A CLOCK_MONOTONIC SIGEV_SIGNAL SIGRTMIN+2 value 42,
 * one-shot 4 s; B CLOCK_MONOTONIC SIGEV_NONE periodic 250 ms; C
 * CLOCK_REALTIME SIGEV_SIGNAL disarmed; D CLOCK_MONOTONIC SIGEV_THREAD_ID to
 * thread T, SIGRTMIN+3, periodic 300 ms. After restore: /proc/self/timers
 * has the same records (ids, signals, notify targets, clocks); A is still armed (or
 * already fired), B's interval is exactly 250 ms, C is disarmed; A's signal
 * arrives no earlier than 4 s after arming with si_code SI_TIMER, value 42
 * and si_timerid = A's id; T receives D's signal with D's timer id.
 */
#include "ferry_test.h"

#ifndef sigev_notify_thread_id
#define sigev_notify_thread_id _sigev_un._tid
#endif

static pthread_barrier_t bar;
static pid_t ttid;
static int d_id;
static int t_got, t_timerid, t_code;

/* /proc/self/timers with its per-timer records sorted (the kernel lists
 * them in an order that depends on creation/hash order). */
static void timers_sorted(char *out, size_t n)
{
	char buf[8192];
	char rec[16][256];
	int nr = 0;
	out[0] = 0;
	if (ft_read_file("/proc/self/timers", buf, sizeof(buf)) < 0)
		return;
	char *line = buf;
	while (line && *line) {
		char *nl = strchr(line, '\n');
		if (nl)
			*nl = 0;
		if (strncmp(line, "ID:", 3) == 0 && nr < 16)
			rec[nr++][0] = 0;
		if (nr > 0 && strlen(rec[nr - 1]) + strlen(line) + 3 < sizeof(rec[0])) {
			strcat(rec[nr - 1], line);
			strcat(rec[nr - 1], "\n");
		}
		line = nl ? nl + 1 : NULL;
	}
	for (int i = 0; i < nr; i++)
		for (int k = i + 1; k < nr; k++)
			if (strcmp(rec[k], rec[i]) < 0) {
				char t[256];
				memcpy(t, rec[i], sizeof(t));
				memcpy(rec[i], rec[k], sizeof(t));
				memcpy(rec[k], t, sizeof(t));
			}
	for (int i = 0; i < nr; i++)
		if (strlen(out) + strlen(rec[i]) + 1 < n)
			strcat(out, rec[i]);
}

static int kid(timer_t t)
{
	return (int)(intptr_t)t;
}

static void *thr(void *arg)
{
	(void)arg;
	ttid = ft_gettid();
	pthread_barrier_wait(&bar);
	pthread_barrier_wait(&bar); /* restored */
	sigset_t s;
	sigemptyset(&s);
	sigaddset(&s, SIGRTMIN + 3);
	siginfo_t si;
	struct timespec to = { 3, 0 };
	memset(&si, 0, sizeof(si));
	t_got = sigtimedwait(&s, &si, &to);
	t_timerid = si.si_timerid;
	t_code = si.si_code;
	return NULL;
}

int main(void)
{
	ft_init();
	sigset_t blk;
	sigemptyset(&blk);
	sigaddset(&blk, SIGRTMIN + 2);
	sigaddset(&blk, SIGRTMIN + 3);
	sigaddset(&blk, SIGALRM);
	FT_SYS(sigprocmask(SIG_BLOCK, &blk, NULL));
	FT_PT(pthread_barrier_init(&bar, NULL, 2));
	pthread_t t;
	FT_PT(pthread_create(&t, NULL, thr, NULL));
	pthread_barrier_wait(&bar);

	timer_t a, gap, b, c, d;
	struct sigevent ea = { .sigev_notify = SIGEV_SIGNAL, .sigev_signo = SIGRTMIN + 2 };
	ea.sigev_value.sival_int = 42;
	FT_SYS(timer_create(CLOCK_MONOTONIC, &ea, &a));
	struct sigevent eg = { .sigev_notify = SIGEV_NONE };
	FT_SYS(timer_create(CLOCK_MONOTONIC, &eg, &gap));
	struct sigevent eb = { .sigev_notify = SIGEV_NONE };
	FT_SYS(timer_create(CLOCK_MONOTONIC, &eb, &b));
	struct sigevent ec = { .sigev_notify = SIGEV_SIGNAL, .sigev_signo = SIGALRM };
	FT_SYS(timer_create(CLOCK_REALTIME, &ec, &c));
	FT_SYS(timer_delete(gap));
	struct sigevent ed = { .sigev_notify = SIGEV_THREAD_ID, .sigev_signo = SIGRTMIN + 3 };
	ed.sigev_notify_thread_id = ttid;
	ed.sigev_value.sival_int = 43;
	FT_SYS(timer_create(CLOCK_MONOTONIC, &ed, &d));
	d_id = kid(d);
	struct itimerspec sa = { { 0, 0 }, { 4, 0 } }, sb = { { 0, 250000000 }, { 0, 250000000 } },
			  sd = { { 0, 300000000 }, { 0, 300000000 } };
	double armed = ft_mono();
	FT_SYS(timer_settime(a, 0, &sa, NULL));
	FT_SYS(timer_settime(b, 0, &sb, NULL));
	FT_SYS(timer_settime(d, 0, &sd, NULL));
	static char timers_before[8192], timers_after[8192];
	timers_sorted(timers_before, sizeof(timers_before));

	ft_ready();
	ft_wait_restored();

	timers_sorted(timers_after, sizeof(timers_after));
	FT_CHECK(strcmp(timers_before, timers_after) == 0, "/proc/self/timers differs:\n--before--\n%s--after--\n%s",
		 timers_before, timers_after);
	struct itimerspec g;
	int r = timer_gettime(a, &g);
	FT_CHECK(r == 0, "timer_gettime(A, id %d): %s", kid(a), strerror(errno));
	sigset_t pend;
	sigpending(&pend);
	int a_pending = sigismember(&pend, SIGRTMIN + 2);
	FT_CHECK(r != 0 || ft_ts2d(&g.it_value) > 0 || a_pending, "timer A neither armed nor fired");
	FT_CHECK(r != 0 || ft_ts2d(&g.it_value) <= 4.0 + 0.01, "timer A remaining %.3f s", ft_ts2d(&g.it_value));
	FT_CHECK(timer_gettime(b, &g) == 0 && g.it_interval.tv_sec == 0 && g.it_interval.tv_nsec == 250000000,
		 "timer B interval %ld.%09ld", (long)g.it_interval.tv_sec, g.it_interval.tv_nsec);
	FT_CHECK(timer_gettime(c, &g) == 0 && g.it_value.tv_sec == 0 && g.it_value.tv_nsec == 0,
		 "timer C armed or missing");
	FT_CHECK(timer_gettime(gap, &g) != 0 && errno == EINVAL, "deleted timer id %d exists again", kid(gap));
	pthread_barrier_wait(&bar);
	sigset_t s;
	sigemptyset(&s);
	sigaddset(&s, SIGRTMIN + 2);
	siginfo_t si;
	memset(&si, 0, sizeof(si));
	struct timespec to = { 10, 0 };
	int sig = sigtimedwait(&s, &si, &to);
	double fired = ft_mono() - armed;
	FT_EQ(sig, SIGRTMIN + 2, "timer A signal");
	FT_EQ(si.si_code, SI_TIMER, "timer A si_code");
	FT_EQ(si.si_value.sival_int, 42, "timer A si_value");
	FT_EQ(si.si_timerid, kid(a), "timer A si_timerid");
	FT_CHECK(fired >= 4.0 - 0.01, "timer A fired after %.3f s (< 4 s)", fired);
	FT_CHECK(fired < 15.0, "timer A fired after %.3f s", fired);
	ft_join(t, NULL, 5, "thread");
	FT_EQ(t_got, SIGRTMIN + 3, "timer D signal in thread T");
	FT_EQ(t_timerid, d_id, "timer D si_timerid");
	FT_EQ(t_code, SI_TIMER, "timer D si_code");
	return ft_finish();
}
