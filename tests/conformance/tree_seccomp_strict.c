/*
 * tree_seccomp_strict: a child in seccomp strict mode (PR_SET_SECCOMP,
 * SECCOMP_MODE_STRICT), blocked in read() on a pipe from the root. After
 * restore the root checks the child's Seccomp: 1 in /proc, writes a byte;
 * the child reads it and calls getpid, which strict mode answers with
 * SIGKILL. The root expects the child killed by SIGKILL (a child without
 * strict mode would exit with status 7).
 */
#include "ferry_test.h"
#include <linux/seccomp.h>
#include <sys/prctl.h>

/* "Seccomp:" of another process, from /proc/PID/status. */
static void seccomp_of(pid_t pid, char *out, size_t n)
{
	char path[64], buf[8192];
	out[0] = 0;
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	if (ft_read_file(path, buf, sizeof(buf)) < 0)
		return;
	char *p = strstr(buf, "\nSeccomp:");
	if (!p)
		return;
	p += 9;
	while (*p == ' ' || *p == '\t')
		p++;
	size_t i = 0;
	while (p[i] && p[i] != '\n' && i + 1 < n) {
		out[i] = p[i];
		i++;
	}
	out[i] = 0;
}

int main(void)
{
	ft_init();
	ft_tree_begin();
	int p[2];
	FT_SYS(pipe(p));
	pid_t c = ft_fork();
	if (c == 0) {
		close(p[1]);
		alarm(0);
		ft_child_ready();
		if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_STRICT, 0, 0, 0) != 0)
			syscall(SYS_exit, 3);
		char b;
		if (read(p[0], &b, 1) != 1)
			syscall(SYS_exit, 4);
		syscall(SYS_getpid); /* SIGKILL in strict mode */
		syscall(SYS_exit, 7);
	}
	close(p[0]);
	ft_tree_wait_ready(1);
	char s[32] = "";
	for (int i = 0; i < 200 && strcmp(s, "1") != 0; i++) {
		seccomp_of(c, s, sizeof(s));
		ft_sleep_ms(5);
	}
	if (strcmp(s, "1") != 0)
		ft_die("child never entered strict mode (Seccomp '%s')", s);

	ft_ready();
	ft_tree_wait_restored();

	s[0] = 0;
	seccomp_of(c, s, sizeof(s));
	FT_CHECK(strcmp(s, "1") == 0, "child Seccomp '%s' after restore, expected 1", s);
	FT_SYS(write(p[1], "x", 1));
	int st = 0;
	if (waitpid(c, &st, 0) != c)
		ft_fail("waitpid(child): %s", strerror(errno));
	else
		FT_CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "child: wait status 0x%x, expected killed by SIGKILL (strict mode)", st);
	return ft_finish();
}
