/*
 * fd_signalfd: signalfd A (SFD_NONBLOCK) for {SIGUSR1, SIGRTMIN+4} and
 * signalfd B (SFD_CLOEXEC|SFD_NONBLOCK) for {SIGURG}; all three blocked.
 * SIGUSR1 is sent to self before the checkpoint and stays pending. After
 * restore: fdinfo sigmask unchanged; A reads the pending SIGUSR1 (SI_USER,
 * ssi_pid = our pid) then EAGAIN; a SIGRTMIN+4 queued after restore with
 * value 77 is read from A (SI_QUEUE, ssi_int 77); B reads nothing until a
 * SIGURG is sent, then reads it.
 */
#include "ferry_test.h"
#include <sys/signalfd.h>

int main(void)
{
	ft_init();
	sigset_t ma, mb, all;
	sigemptyset(&ma);
	sigaddset(&ma, SIGUSR1);
	sigaddset(&ma, SIGRTMIN + 4);
	sigemptyset(&mb);
	sigaddset(&mb, SIGURG);
	all = ma;
	sigaddset(&all, SIGURG);
	FT_SYS(sigprocmask(SIG_BLOCK, &all, NULL));
	int a = (int)FT_SYS(signalfd(-1, &ma, SFD_NONBLOCK));
	int b = (int)FT_SYS(signalfd(-1, &mb, SFD_NONBLOCK | SFD_CLOEXEC));
	FT_SYS(kill(getpid(), SIGUSR1));
	char ka[64] = "", kb[64] = "";
	ft_fdinfo_field(a, "sigmask", ka, sizeof(ka));
	ft_fdinfo_field(b, "sigmask", kb, sizeof(kb));
	int fla = fcntl(a, F_GETFL), flb = fcntl(b, F_GETFL), fdb = fcntl(b, F_GETFD);

	ft_ready();
	ft_wait_restored();

	char x[64] = "";
	ft_fdinfo_field(a, "sigmask", x, sizeof(x));
	FT_CHECK(strcmp(x, ka) == 0, "A sigmask '%s' -> '%s'", ka, x);
	ft_fdinfo_field(b, "sigmask", x, sizeof(x));
	FT_CHECK(strcmp(x, kb) == 0, "B sigmask '%s' -> '%s'", kb, x);
	FT_EQ(fcntl(a, F_GETFL), fla, "A F_GETFL");
	FT_EQ(fcntl(b, F_GETFL), flb, "B F_GETFL");
	FT_EQ(fcntl(b, F_GETFD), fdb, "B F_GETFD");
	struct signalfd_siginfo si;
	memset(&si, 0, sizeof(si));
	FT_EQ(read(a, &si, sizeof(si)), sizeof(si), "A read pending SIGUSR1");
	FT_EQ(si.ssi_signo, SIGUSR1, "A ssi_signo");
	FT_EQ(si.ssi_code, SI_USER, "A ssi_code");
	FT_EQ(si.ssi_pid, getpid(), "A ssi_pid");
	FT_CHECK(read(a, &si, sizeof(si)) < 0 && errno == EAGAIN, "A has more signals");
	FT_CHECK(read(b, &si, sizeof(si)) < 0 && errno == EAGAIN, "B has a signal before any was sent");
	union sigval sv = { .sival_int = 77 };
	FT_SYS(sigqueue(getpid(), SIGRTMIN + 4, sv));
	memset(&si, 0, sizeof(si));
	FT_EQ(read(a, &si, sizeof(si)), sizeof(si), "A read SIGRTMIN+4");
	FT_EQ(si.ssi_signo, SIGRTMIN + 4, "A ssi_signo (rt)");
	FT_EQ(si.ssi_code, SI_QUEUE, "A ssi_code (rt)");
	FT_EQ(si.ssi_int, 77, "A ssi_int");
	FT_SYS(kill(getpid(), SIGURG));
	memset(&si, 0, sizeof(si));
	FT_EQ(read(b, &si, sizeof(si)), sizeof(si), "B read SIGURG");
	FT_EQ(si.ssi_signo, SIGURG, "B ssi_signo");
	return ft_finish();
}
