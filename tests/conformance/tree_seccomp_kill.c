/*
 * tree_seccomp_kill: seccomp filters whose action is to kill, on syscalls
 * a restore itself needs (setresuid, ptrace), in a process that then
 * dropped root. The child (as root, so without no_new_privs) installs
 * F1 (setresuid -> SECCOMP_RET_KILL_PROCESS) and F2 (ptrace ->
 * SECCOMP_RET_KILL_THREAD), forks a grandchild that inherits both, and
 * both become uid/gid 1000 with setuid/setgid (not setresuid). After
 * restore each of them: Seccomp 2, Seccomp_filters 2, NoNewPrivs 0, uid
 * and gid 1000; a process it forks then and that calls setresuid or
 * ptrace(PTRACE_TRACEME) is killed by SIGSYS (the filters are inherited
 * over a fork made after restore), and getppid still works.
 */
#include "ferry_test.h"
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>

static void install_kill(int nr, unsigned action)
{
	struct sock_filter f[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)nr, 0, 1),
		BPF_STMT(BPF_RET | BPF_K, action),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_fprog p = { .len = 4, .filter = f };
	if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &p) != 0)
		ft_die("seccomp(kill nr %d): %s", nr, strerror(errno));
}

/* Forks a process that makes syscall nr: it must die of SIGSYS. */
static void expect_killed(const char *who, long nr, long a0, long a1, long a2)
{
	pid_t p = fork();
	if (p < 0) {
		ft_fail("%s: fork: %s", who, strerror(errno));
		return;
	}
	if (p == 0) {
		syscall(nr, a0, a1, a2);
		_exit(9);
	}
	int st = 0;
	if (waitpid(p, &st, 0) != p) {
		ft_fail("%s: waitpid: %s", who, strerror(errno));
		return;
	}
	FT_CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGSYS, "%s: syscall %ld: wait status 0x%x, expected killed by SIGSYS", who, nr, st);
}

static void check(const char *who)
{
	char s[32] = "", n[32] = "", nnp[32] = "";
	ft_status_field(0, "Seccomp", s, sizeof(s));
	ft_status_field(0, "Seccomp_filters", n, sizeof(n));
	ft_status_field(0, "NoNewPrivs", nnp, sizeof(nnp));
	FT_CHECK(strcmp(s, "2") == 0, "%s: Seccomp '%s', expected 2", who, s);
	FT_CHECK(strcmp(n, "2") == 0, "%s: Seccomp_filters '%s', expected 2", who, n);
	FT_CHECK(strcmp(nnp, "0") == 0, "%s: NoNewPrivs '%s', expected 0", who, nnp);
	uid_t r, e, su;
	gid_t gr, ge, gs;
	FT_SYS(getresuid(&r, &e, &su));
	FT_SYS(getresgid(&gr, &ge, &gs));
	FT_CHECK(r == 1000 && e == 1000 && su == 1000, "%s: uids %u/%u/%u, expected 1000", who, r, e, su);
	FT_CHECK(gr == 1000 && ge == 1000 && gs == 1000, "%s: gids %u/%u/%u, expected 1000", who, gr, ge, gs);
	FT_CHECK(syscall(SYS_getppid) > 0, "%s: getppid: %s", who, strerror(errno));
	expect_killed(who, SYS_setresuid, -1, -1, -1);
	expect_killed(who, SYS_ptrace, PTRACE_TRACEME, 0, 0);
}

int main(void)
{
	ft_init();
	ft_tree_begin();
	pid_t c = ft_fork();
	if (c == 0) {
		install_kill(SYS_setresuid, SECCOMP_RET_KILL_PROCESS);
		install_kill(SYS_ptrace, SECCOMP_RET_KILL_THREAD);
		pid_t g = ft_fork();
		if (g == 0) {
			FT_SYS(setgid(1000));
			FT_SYS(setuid(1000));
			ft_child_ready();
			ft_child_wait_go();
			check("grandchild");
			ft_child_exit("grandchild");
		}
		FT_SYS(setgid(1000));
		FT_SYS(setuid(1000));
		ft_child_ready();
		ft_child_wait_go();
		check("child");
		ft_go(g, "grandchild");
		ft_reap(g, "grandchild");
		ft_child_exit("child");
	}
	ft_tree_wait_ready(2);

	ft_ready();
	ft_tree_wait_restored();

	ft_go(c, "child");
	ft_reap(c, "child");
	return ft_finish();
}
