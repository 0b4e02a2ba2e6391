/*
 * tree_zombie_mixed: unreaped children that ended in every way a process
 * ends (zdtm zombie00): _exit(0), _exit(3), killed by SIGKILL, a NULL
 * write (SIGSEGV), abort() (SIGABRT), SIGTERM from the root, and a
 * two-thread child whose second thread calls _exit(5) while the first
 * sleeps. RLIMIT_CORE is 0 (inherited), so no core is dumped and the
 * statuses do not depend on core_pattern. The root waits for each with
 * waitid(WEXITED | WNOWAIT) and records si_code and si_status, so all are
 * zombies at READY. After restore: waitid(WNOWAIT) on each gives the same
 * code and status, and waitpid reaps each with the same wait status.
 */
#include "ferry_test.h"
#include <sys/resource.h>

enum how { EXIT0, EXIT3, KILLED, SEGV, ABORT, TERM_BY_ROOT, THREAD_EXIT, N_HOW };

static const char *names[N_HOW] = { "_exit(0)", "_exit(3)", "SIGKILL", "SIGSEGV", "abort", "SIGTERM by the root",
				    "thread _exit(5)" };

static void *thread_exit(void *arg)
{
	(void)arg;
	_exit(5);
}

static void end(enum how h)
{
	close(ft_tree_pipe[0]);
	close(ft_tree_pipe[1]);
	switch (h) {
	case EXIT0:
		_exit(0);
	case EXIT3:
		_exit(3);
	case KILLED:
		raise(SIGKILL);
		break;
	case SEGV:
		*(volatile int *)NULL = 1;
		break;
	case ABORT:
		abort();
	case TERM_BY_ROOT:
		pause();
		break;
	case THREAD_EXIT: {
		pthread_t t;
		if (pthread_create(&t, NULL, thread_exit, NULL) == 0)
			pause();
		break;
	}
	default:
		break;
	}
	_exit(100);
}

int main(void)
{
	ft_init();
	struct rlimit no_core = { 0, 0 };
	FT_SYS(setrlimit(RLIMIT_CORE, &no_core));
	ft_tree_begin();
	pid_t pid[N_HOW];
	int code[N_HOW], status[N_HOW];
	for (int h = 0; h < N_HOW; h++) {
		pid[h] = ft_fork();
		if (pid[h] == 0)
			end((enum how)h);
	}
	FT_SYS(kill(pid[TERM_BY_ROOT], SIGTERM));
	for (int h = 0; h < N_HOW; h++) {
		siginfo_t si;
		memset(&si, 0, sizeof(si));
		FT_SYS(waitid(P_PID, (id_t)pid[h], &si, WEXITED | WNOWAIT));
		code[h] = si.si_code;
		status[h] = si.si_status;
		ft_log("%s: pid %d code %d status %d", names[h], (int)pid[h], code[h], status[h]);
	}
	FT_CHECK(code[EXIT0] == CLD_EXITED && status[EXIT0] == 0, "setup: _exit(0) child");
	FT_CHECK(code[EXIT3] == CLD_EXITED && status[EXIT3] == 3, "setup: _exit(3) child");
	FT_CHECK(code[KILLED] == CLD_KILLED && status[KILLED] == SIGKILL, "setup: SIGKILL child");
	FT_CHECK(code[SEGV] == CLD_KILLED && status[SEGV] == SIGSEGV, "setup: SIGSEGV child (core dumped?)");
	FT_CHECK(code[ABORT] == CLD_KILLED && status[ABORT] == SIGABRT, "setup: abort child (core dumped?)");
	FT_CHECK(code[TERM_BY_ROOT] == CLD_KILLED && status[TERM_BY_ROOT] == SIGTERM, "setup: SIGTERM child");
	FT_CHECK(code[THREAD_EXIT] == CLD_EXITED && status[THREAD_EXIT] == 5, "setup: thread _exit(5) child");
	if (ft_failures)
		ft_die("setup failed");
	ft_tree_wait_ready(0);

	ft_ready();
	ft_tree_wait_restored();

	for (int h = 0; h < N_HOW; h++) {
		siginfo_t si;
		memset(&si, 0, sizeof(si));
		if (waitid(P_PID, (id_t)pid[h], &si, WEXITED | WNOWAIT | WNOHANG) != 0) {
			ft_fail("%s: waitid(%d, WNOWAIT): %s", names[h], (int)pid[h], strerror(errno));
			continue;
		}
		FT_CHECK(si.si_pid == pid[h] && si.si_code == code[h] && si.si_status == status[h],
			 "%s: waitid says pid %d code %d status %d, expected pid %d code %d status %d", names[h],
			 (int)si.si_pid, si.si_code, si.si_status, (int)pid[h], code[h], status[h]);
	}
	for (int h = 0; h < N_HOW; h++) {
		int st = 0;
		pid_t w = waitpid(pid[h], &st, WNOHANG);
		if (w != pid[h]) {
			ft_fail("%s: waitpid(%d, WNOHANG) returned %d (%s)", names[h], (int)pid[h], (int)w,
				w < 0 ? strerror(errno) : "not a zombie");
			continue;
		}
		int want = code[h] == CLD_EXITED ? status[h] << 8 : status[h];
		FT_CHECK(st == want, "%s: wait status 0x%x, expected 0x%x", names[h], st, want);
	}
	errno = 0;
	FT_CHECK(waitpid(-1, NULL, WNOHANG) < 0 && errno == ECHILD, "a child is left after reaping all zombies");
	return ft_finish();
}
