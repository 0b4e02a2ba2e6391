/*
 * thread_futex_raw: one thread blocked in raw FUTEX_WAIT_PRIVATE (no
 * timeout) and one in FUTEX_WAIT_PRIVATE with a 20 s relative timeout (the
 * kernel restarts that one through restart_syscall with the remaining time)
 * during the checkpoint. After restore the main thread changes each futex
 * word and FUTEX_WAKEs it: both syscalls must return 0 (woken), not EINTR
 * and not ETIMEDOUT, and FUTEX_WAKE must report 1 woken waiter.
 */
#include "ferry_test.h"
#include <linux/futex.h>

static uint32_t f1, f2;
static pid_t tid1, tid2;
static long r1 = -2, r2 = -2;
static int e1, e2;
static double t2_start, t2_end;

static long futex(uint32_t *uaddr, int op, uint32_t val, const struct timespec *ts)
{
	return syscall(SYS_futex, uaddr, op, val, ts, NULL, 0);
}

static void *w1(void *arg)
{
	(void)arg;
	tid1 = ft_gettid();
	r1 = futex(&f1, FUTEX_WAIT_PRIVATE, 0, NULL);
	e1 = errno;
	return NULL;
}

static void *w2(void *arg)
{
	(void)arg;
	tid2 = ft_gettid();
	struct timespec ts = { 20, 0 };
	t2_start = ft_mono();
	r2 = futex(&f2, FUTEX_WAIT_PRIVATE, 0, &ts);
	e2 = errno;
	t2_end = ft_mono();
	return NULL;
}

int main(void)
{
	ft_init();
	pthread_t a, b;
	FT_PT(pthread_create(&a, NULL, w1, NULL));
	FT_PT(pthread_create(&b, NULL, w2, NULL));
	while (!tid1 || !tid2)
		ft_sleep_ms(1);
	ft_wait_in_syscall(tid1, SYS_futex, 2);
	ft_wait_in_syscall(tid2, SYS_futex, 2);

	ft_ready();
	ft_wait_restored();

	FT_CHECK(r1 == -2, "untimed FUTEX_WAIT returned early: %ld (%s)", r1, strerror(e1));
	FT_CHECK(r2 == -2, "timed FUTEX_WAIT returned early: %ld (%s)", r2, strerror(e2));
	/* make sure the waiters are (back) in the kernel before waking */
	ft_wait_in_syscall2(tid1, SYS_futex, SYS_restart_syscall, 3);
	ft_wait_in_syscall2(tid2, SYS_futex, SYS_restart_syscall, 3);
	__atomic_store_n(&f1, 1, __ATOMIC_SEQ_CST);
	long n1 = futex(&f1, FUTEX_WAKE_PRIVATE, 1, NULL);
	__atomic_store_n(&f2, 1, __ATOMIC_SEQ_CST);
	long n2 = futex(&f2, FUTEX_WAKE_PRIVATE, 1, NULL);
	FT_EQ(n1, 1, "FUTEX_WAKE (untimed) woken count");
	FT_EQ(n2, 1, "FUTEX_WAKE (timed) woken count");
	if (ft_join(a, NULL, 5, "untimed waiter") == 0)
		FT_CHECK(r1 == 0, "untimed FUTEX_WAIT returned %ld (%s)", r1, strerror(e1));
	if (ft_join(b, NULL, 5, "timed waiter") == 0) {
		FT_CHECK(r2 == 0, "timed FUTEX_WAIT returned %ld (%s)", r2, strerror(e2));
		FT_CHECK(t2_end - t2_start < 20.0, "timed FUTEX_WAIT took %.3f s", t2_end - t2_start);
	}
	return ft_finish();
}
