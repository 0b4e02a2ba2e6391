/*
 * fd_async_owner: signal-driven I/O. A pipe's read end has O_ASYNC,
 * F_SETOWN(getpid()) and F_SETSIG(SIGRTMIN+1); a socket pair end has
 * O_ASYNC and F_SETOWN_EX(F_OWNER_TID, main thread), default SIGIO. After
 * restore: F_GETOWN, F_GETOWN_EX, F_GETSIG and O_ASYNC are as before, and
 * writing to the other ends delivers SIGRTMIN+1 and SIGIO (both blocked,
 * taken with sigtimedwait).
 */
#include "ferry_test.h"
#include <sys/socket.h>

static int wait_sig(int sig)
{
	sigset_t s;
	sigemptyset(&s);
	sigaddset(&s, sig);
	struct timespec to = { 2, 0 };
	int r;
	do
		r = sigtimedwait(&s, NULL, &to);
	while (r < 0 && errno == EINTR);
	return r;
}

int main(void)
{
	ft_init();
	sigset_t s;
	sigemptyset(&s);
	sigaddset(&s, SIGIO);
	sigaddset(&s, SIGRTMIN + 1);
	sigprocmask(SIG_BLOCK, &s, NULL);
	int p[2], sv[2];
	FT_SYS(pipe(p));
	FT_SYS(socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
	FT_SYS(fcntl(p[0], F_SETOWN, getpid()));
	FT_SYS(fcntl(p[0], F_SETSIG, SIGRTMIN + 1));
	FT_SYS(fcntl(p[0], F_SETFL, fcntl(p[0], F_GETFL) | O_ASYNC));
	struct f_owner_ex ox = { F_OWNER_TID, ft_gettid() };
	FT_SYS(fcntl(sv[0], F_SETOWN_EX, &ox));
	FT_SYS(fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_ASYNC));

	ft_ready();
	ft_wait_restored();

	FT_EQ(fcntl(p[0], F_GETOWN), getpid(), "pipe F_GETOWN");
	FT_EQ(fcntl(p[0], F_GETSIG), SIGRTMIN + 1, "pipe F_GETSIG");
	FT_CHECK(fcntl(p[0], F_GETFL) & O_ASYNC, "pipe lost O_ASYNC");
	struct f_owner_ex g = { 0, 0 };
	fcntl(sv[0], F_GETOWN_EX, &g);
	FT_EQ(g.type, F_OWNER_TID, "socket F_GETOWN_EX type");
	FT_EQ(g.pid, ft_gettid(), "socket F_GETOWN_EX pid");
	FT_EQ(fcntl(sv[0], F_GETSIG), 0, "socket F_GETSIG");
	FT_CHECK(fcntl(sv[0], F_GETFL) & O_ASYNC, "socket lost O_ASYNC");
	FT_SYS(write(p[1], "x", 1));
	FT_EQ(wait_sig(SIGRTMIN + 1), SIGRTMIN + 1, "signal after pipe write");
	FT_SYS(write(sv[1], "y", 1));
	FT_EQ(wait_sig(SIGIO), SIGIO, "SIGIO after socket write");
	return ft_finish();
}
