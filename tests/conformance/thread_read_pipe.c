/*
 * thread_read_pipe: a thread is blocked in read() on an empty pipe (and a
 * second one in recv() on an empty unix socketpair) during the checkpoint.
 * After restore the main thread writes a message into each; the blocked
 * calls must return exactly that data (not EINTR, not 0).
 */
#include "ferry_test.h"
#include <sys/socket.h>

static int p[2], sp[2];
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

static void *receiver(void *arg)
{
	(void)arg;
	tid2 = ft_gettid();
	n2 = recv(sp[0], buf2, sizeof(buf2), 0);
	e2 = errno;
	return NULL;
}

int main(void)
{
	ft_init();
	FT_SYS(pipe(p));
	FT_SYS(socketpair(AF_UNIX, SOCK_STREAM, 0, sp));
	pthread_t t1, t2;
	FT_PT(pthread_create(&t1, NULL, reader, NULL));
	FT_PT(pthread_create(&t2, NULL, receiver, NULL));
	while (!tid1 || !tid2)
		ft_sleep_ms(1);
	ft_wait_in_syscall(tid1, SYS_read, 2);
	ft_wait_in_syscall2(tid2, SYS_recvfrom, SYS_read, 2);

	ft_ready();
	ft_wait_restored();

	FT_CHECK(n1 == -2, "read() returned early (%zd, %s)", n1, strerror(e1));
	FT_CHECK(n2 == -2, "recv() returned early (%zd, %s)", n2, strerror(e2));
	const char *m1 = "data written into the pipe after restore";
	const char *m2 = "data sent on the socketpair after restore";
	FT_SYS(write(p[1], m1, strlen(m1)));
	FT_SYS(send(sp[1], m2, strlen(m2), 0));
	if (ft_join(t1, NULL, 5, "pipe reader") == 0) {
		FT_CHECK(n1 == (ssize_t)strlen(m1), "read() returned %zd (%s)", n1, strerror(e1));
		FT_CHECK(n1 > 0 && memcmp(buf1, m1, strlen(m1)) == 0, "read() data mismatch");
	}
	if (ft_join(t2, NULL, 5, "socket receiver") == 0) {
		FT_CHECK(n2 == (ssize_t)strlen(m2), "recv() returned %zd (%s)", n2, strerror(e2));
		FT_CHECK(n2 > 0 && memcmp(buf2, m2, strlen(m2)) == 0, "recv() data mismatch");
	}
	return ft_finish();
}
