/*
 * socket_refs MODE: a socket state that no fd and no socket option shows.
 *
 *   in-flight  the child (the tree checkpointed) made a TCP listener and
 *              sent it (SCM_RIGHTS) to its parent's end of a socket pair,
 *              then closed its own end: the listener is referenced by a
 *              message the parent, outside the tree, has not received.
 *              Restored without that reference, the copy could not bind
 *              (the address is still taken) and the parent's would no
 *              longer be the child's. After SIGUSR2 the parent checks the
 *              child still runs, receives the listener and connects to it.
 *   urgent     a TCP connection (both ends here) whose client sent an
 *              urgent byte (MSG_OOB) after 64 KiB the server has not read:
 *              the byte waits in the client's send queue, unacknowledged.
 *              After SIGUSR2 the server reads the 64 KiB and then the
 *              urgent byte out of band.
 */
#include "../conformance/ferry_test.h"
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#define BULK 65536

static pid_t child = -1;

static void kill_child(void)
{
	if (child > 0) {
		kill(child, SIGKILL);
		waitpid(child, NULL, 0);
		child = -1;
	}
}

static int listener(struct sockaddr_in *a)
{
	int l = (int)FT_SYS(socket(AF_INET, SOCK_STREAM, 0));
	memset(a, 0, sizeof(*a));
	a->sin_family = AF_INET;
	a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	socklen_t len = sizeof(*a);
	FT_SYS(bind(l, (struct sockaddr *)a, sizeof(*a)));
	FT_SYS(listen(l, 8));
	FT_SYS(getsockname(l, (struct sockaddr *)a, &len));
	return l;
}

/* In the child: makes a listener, passes it to the parent, keeps it. */
static void child_passes_listener(int end)
{
	int null = open("/dev/null", O_WRONLY);
	if (null < 0 || dup2(null, 1) < 0 || dup2(null, 2) < 0)
		_exit(3);
	close(null);
	alarm(60);
	struct sockaddr_in a;
	int l = listener(&a);
	char byte = 'L';
	struct iovec iov = { .iov_base = &byte, .iov_len = 1 };
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} ctrl;
	memset(&ctrl, 0, sizeof(ctrl));
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctrl.buf,
			    .msg_controllen = sizeof(ctrl.buf) };
	struct cmsghdr *c = CMSG_FIRSTHDR(&m);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &l, sizeof(int));
	if (sendmsg(end, &m, 0) != 1)
		_exit(4);
	close(end);
	for (;;)
		pause();
}

static int receive_fd(int end)
{
	char byte = 0;
	struct iovec iov = { .iov_base = &byte, .iov_len = 1 };
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} ctrl;
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctrl.buf,
			    .msg_controllen = sizeof(ctrl.buf) };
	if (recvmsg(end, &m, MSG_DONTWAIT) != 1 || byte != 'L')
		return -1;
	struct cmsghdr *c = CMSG_FIRSTHDR(&m);
	if (!c || c->cmsg_type != SCM_RIGHTS)
		return -1;
	int fd;
	memcpy(&fd, CMSG_DATA(c), sizeof(int));
	return fd;
}

static int in_flight(void)
{
	int sv[2];
	FT_SYS(socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
	child = fork();
	if (child < 0)
		ft_die("fork: %s", strerror(errno));
	if (child == 0) {
		close(sv[1]);
		child_passes_listener(sv[0]);
	}
	ft_set_cleanup(kill_child);
	close(sv[0]);
	/* The child closes its end once it sent the listener (its stdout
	 * left the log before). */
	struct pollfd p = { .fd = sv[1], .events = POLLRDHUP };
	for (int i = 0; i < 1000 && !(p.revents & (POLLHUP | POLLRDHUP)); i++) {
		if (poll(&p, 1, 10) < 0)
			ft_die("poll: %s", strerror(errno));
	}
	FT_CHECK(p.revents & (POLLHUP | POLLRDHUP), "the child never passed its listener");
	ft_log("CHILD %d", (int)child);
	ft_ready();
	ft_wait_restored();
	FT_CHECK(waitpid(child, NULL, WNOHANG) == 0, "the child is gone after the refusal");
	int l = receive_fd(sv[1]);
	FT_CHECK(l >= 0, "the listener was no longer in flight");
	struct sockaddr_in a;
	socklen_t len = sizeof(a);
	FT_SYS(getsockname(l, (struct sockaddr *)&a, &len));
	int c = (int)FT_SYS(socket(AF_INET, SOCK_STREAM, 0));
	FT_CHECK(connect(c, (struct sockaddr *)&a, sizeof(a)) == 0, "connect to the passed listener: %s",
		 strerror(errno));
	int s = accept(l, NULL, NULL);
	FT_CHECK(s >= 0, "accept on the passed listener: %s", strerror(errno));
	kill_child();
	return ft_finish();
}

static int urgent(void)
{
	struct sockaddr_in a;
	int l = listener(&a);
	close(l);
	l = (int)FT_SYS(socket(AF_INET, SOCK_STREAM, 0));
	int small = 4096, big = 1 << 20;
	FT_SYS(setsockopt(l, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small)));
	FT_SYS(bind(l, (struct sockaddr *)&a, sizeof(a)));
	FT_SYS(listen(l, 8));
	int c = (int)FT_SYS(socket(AF_INET, SOCK_STREAM, 0));
	FT_SYS(setsockopt(c, SOL_SOCKET, SO_SNDBUF, &big, sizeof(big)));
	FT_SYS(connect(c, (struct sockaddr *)&a, sizeof(a)));
	int s = (int)FT_SYS(accept(l, NULL, NULL));
	static char bulk[BULK];
	memset(bulk, 'b', sizeof(bulk));
	FT_CHECK(send(c, bulk, sizeof(bulk), MSG_DONTWAIT) == BULK, "the bulk did not fit the send buffer");
	FT_CHECK(send(c, "!", 1, MSG_OOB | MSG_DONTWAIT) == 1, "send MSG_OOB: %s", strerror(errno));
	ft_sleep_ms(50);
	ft_ready();
	ft_wait_restored();
	size_t got = 0;
	while (got < BULK) {
		struct pollfd p = { .fd = s, .events = POLLIN };
		FT_CHECK(poll(&p, 1, 5000) == 1, "the bulk stopped after %zu bytes", got);
		ssize_t n = recv(s, bulk, BULK - got, 0);
		FT_CHECK(n > 0, "recv: %s", strerror(errno));
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	struct pollfd p = { .fd = s, .events = POLLPRI };
	FT_CHECK(poll(&p, 1, 5000) == 1, "the urgent byte never came");
	char u = 0;
	FT_CHECK(recv(s, &u, 1, MSG_OOB) == 1 && u == '!', "the urgent byte is not out of band (%c)", u);
	return ft_finish();
}

int main(int argc, char **argv)
{
	ft_init();
	if (argc > 1 && strcmp(argv[1], "in-flight") == 0)
		return in_flight();
	if (argc > 1 && strcmp(argv[1], "urgent") == 0)
		return urgent();
	ft_die("usage: socket_refs in-flight|urgent");
}
