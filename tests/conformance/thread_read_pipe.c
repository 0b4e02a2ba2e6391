/*
 * thread_read_pipe: two threads are blocked in read() on two empty pipes
 * (one blocking pipe, one read through readv) during the checkpoint. After
 * restore the main thread writes a message into each; the blocked calls
 * must return exactly that data (not EINTR, not 0).
 */
#include "ferry_test.h"
#include <sys/uio.h>

static int p[2], q[2];
static pid_t tid1, tid2;
static char buf1[128], buf2[128];
static ssize_t n1 = -2, n2 = -2;
static int e1, e2;

static void *reader(void *arg)
{
	(void)arg;
	tid1 = ft_gettid();
	n1 = read(p[0], buf1, sizeof(buf1));
	e1 = errno;
	return NULL;
}

static void *vreader(void *arg)
{
	(void)arg;
	tid2 = ft_gettid();
	struct iovec iov[2] = { { buf2, 10 }, { buf2 + 10, sizeof(buf2) - 10 } };
	n2 = readv(q[0], iov, 2);
	e2 = errno;
	return NULL;
}

int main(void)
{
	ft_init();
	FT_SYS(pipe(p));
	FT_SYS(pipe(q));
	pthread_t t1, t2;
	FT_PT(pthread_create(&t1, NULL, reader, NULL));
	FT_PT(pthread_create(&t2, NULL, vreader, NULL));
	while (!tid1 || !tid2)
		ft_sleep_ms(1);
	ft_wait_in_syscall(tid1, SYS_read, 2);
	ft_wait_in_syscall(tid2, SYS_readv, 2);

	ft_ready();
	ft_wait_restored();

	FT_CHECK(n1 == -2, "read() returned early (%zd, %s)", n1, strerror(e1));
	FT_CHECK(n2 == -2, "readv() returned early (%zd, %s)", n2, strerror(e2));
	const char *m1 = "data written into the pipe after restore";
	const char *m2 = "data for the thread blocked in readv";
	FT_SYS(write(p[1], m1, strlen(m1)));
	FT_SYS(write(q[1], m2, strlen(m2)));
	if (ft_join(t1, NULL, 5, "read thread") == 0) {
		FT_CHECK(n1 == (ssize_t)strlen(m1), "read() returned %zd (%s)", n1, strerror(e1));
		FT_CHECK(n1 > 0 && memcmp(buf1, m1, strlen(m1)) == 0, "read() data mismatch");
	}
	if (ft_join(t2, NULL, 5, "readv thread") == 0) {
		FT_CHECK(n2 == (ssize_t)strlen(m2), "readv() returned %zd (%s)", n2, strerror(e2));
		FT_CHECK(n2 > 0 && memcmp(buf2, m2, strlen(m2)) == 0, "readv() data mismatch");
	}
	return ft_finish();
}
