/*
 * ferry_test.h - shared helpers for the ferry conformance programs.
 *
 * Protocol (see README.md):
 *   ft_init()           first thing in main: blocks SIGUSR2 (inherited by all threads)
 *   ... set up state, record expected values ...
 *   ft_ready()          writes "READY\n" on fd 1
 *   ft_wait_restored()  sigwaitinfo() for SIGUSR2 (checkpoint/restore happens while here)
 *   ... check state, ft_fail() for every mismatch ...
 *   return ft_finish(); prints "PASS" (exit 0) if nothing failed, exit 1 otherwise
 *
 * Every helper avoids malloc and stdio buffering, so that it can be used
 * while checking heap/brk state and from several threads.
 *
 * If FERRY_EXPECT_RESTORE=1 is in the environment (the cargo harness sets it),
 * ft_finish() also fails unless the process really was restored (the start
 * time of the thread-group leader in /proc/self/stat changed).
 *
 * Process trees (tree_*.c): see "process trees" at the end of this file.
 */
#ifndef FERRY_TEST_H
#define FERRY_TEST_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define FT_UNUSED __attribute__((unused))

static int ft_failures FT_UNUSED;
static unsigned long long ft_start_ticks FT_UNUSED;
static int ft_expect_restore FT_UNUSED;
static int ft_ready_done FT_UNUSED;
/* ft_set_cleanup(): run by ft_die() and the safety alarm, in that process only */
static void (*ft_cleanup_fn)(void) FT_UNUSED;
static pid_t ft_cleanup_pid FT_UNUSED;

/* ---- output ------------------------------------------------------------ */

static FT_UNUSED void ft_write_all(int fd, const char *buf, size_t len)
{
	while (len > 0) {
		ssize_t n = write(fd, buf, len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return;
		}
		buf += n;
		len -= (size_t)n;
	}
}

static FT_UNUSED void ft_vprint(const char *prefix, const char *fmt, va_list ap)
{
	char buf[1024];
	int saved = errno;
	int n = snprintf(buf, sizeof(buf), "%s", prefix);
	if (n < 0)
		n = 0;
	int m = vsnprintf(buf + n, sizeof(buf) - (size_t)n - 1, fmt, ap);
	if (m < 0)
		m = 0;
	size_t len = (size_t)n + (size_t)m;
	if (len > sizeof(buf) - 2)
		len = sizeof(buf) - 2;
	buf[len++] = '\n';
	ft_write_all(1, buf, len);
	errno = saved;
}

/* Report a mismatch: "FAIL: <what>". */
static FT_UNUSED __attribute__((format(printf, 1, 2))) void ft_fail(const char *fmt, ...)
{
	va_list ap;
	__atomic_add_fetch(&ft_failures, 1, __ATOMIC_SEQ_CST);
	va_start(ap, fmt);
	ft_vprint("FAIL: ", fmt, ap);
	va_end(ap);
}

/* Informational line (never contains PASS/FAIL markers). */
static FT_UNUSED __attribute__((format(printf, 1, 2))) void ft_log(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	ft_vprint("# ", fmt, ap);
	va_end(ap);
}

/* Runs (once) the function registered with ft_set_cleanup, if this process registered it. */
static FT_UNUSED void ft_run_cleanup(void)
{
	void (*fn)(void) = ft_cleanup_fn;
	if (fn && getpid() == ft_cleanup_pid) {
		ft_cleanup_fn = NULL;
		fn();
	}
}

/* Setup error: the test cannot run at all. */
static FT_UNUSED __attribute__((format(printf, 1, 2), noreturn)) void ft_die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	ft_vprint("FAIL: setup: ", fmt, ap);
	va_end(ap);
	ft_run_cleanup();
	_exit(1);
}

#define FT_CHECK(cond, ...)                  \
	do {                                 \
		if (!(cond))                 \
			ft_fail(__VA_ARGS__); \
	} while (0)

#define FT_EQ(a, b, what)                                                            \
	do {                                                                         \
		long long ft_a_ = (long long)(a), ft_b_ = (long long)(b);            \
		if (ft_a_ != ft_b_)                                                  \
			ft_fail("%s: got %lld (0x%llx), expected %lld (0x%llx)", what, \
				ft_a_, (unsigned long long)ft_a_, ft_b_,             \
				(unsigned long long)ft_b_);                          \
	} while (0)

/* Setup call that must succeed (returns -1/errno on failure). */
#define FT_SYS(call)                                                                 \
	({                                                                           \
		long ft_r_ = (long)(call);                                           \
		if (ft_r_ == -1)                                                     \
			ft_die("%s (line %d): %s", #call, __LINE__, strerror(errno)); \
		ft_r_;                                                               \
	})

/* pthread_* style call (returns an error number). */
#define FT_PT(call)                                                                  \
	do {                                                                         \
		int ft_e_ = (call);                                                  \
		if (ft_e_ != 0)                                                      \
			ft_die("%s (line %d): %s", #call, __LINE__, strerror(ft_e_)); \
	} while (0)

/* ---- small utilities ---------------------------------------------------- */

static FT_UNUSED pid_t ft_gettid(void)
{
	return (pid_t)syscall(SYS_gettid);
}

static FT_UNUSED double ft_clock(clockid_t clk)
{
	struct timespec ts;
	clock_gettime(clk, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static FT_UNUSED double ft_mono(void)
{
	return ft_clock(CLOCK_MONOTONIC);
}

static FT_UNUSED double ft_ts2d(const struct timespec *ts)
{
	return (double)ts->tv_sec + (double)ts->tv_nsec / 1e9;
}

static FT_UNUSED double ft_tv2d(const struct timeval *tv)
{
	return (double)tv->tv_sec + (double)tv->tv_usec / 1e6;
}

/* Sleep, restarting after signal handlers. */
static FT_UNUSED void ft_sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
	while (clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, &ts) == EINTR)
		;
}

/* Read a whole (small) file into buf, NUL terminated; returns length or -1. */
static FT_UNUSED ssize_t ft_read_file(const char *path, char *buf, size_t size)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	size_t len = 0;
	while (len + 1 < size) {
		ssize_t n = read(fd, buf + len, size - 1 - len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			close(fd);
			return -1;
		}
		if (n == 0)
			break;
		len += (size_t)n;
	}
	buf[len] = 0;
	close(fd);
	return (ssize_t)len;
}

/* Value of "Key:\t..." in /proc/self/task/<tid>/status (tid 0 = process), trimmed. */
static FT_UNUSED int ft_status_field(pid_t tid, const char *key, char *out, size_t outsz)
{
	char path[64], buf[8192];
	if (tid)
		snprintf(path, sizeof(path), "/proc/self/task/%d/status", (int)tid);
	else
		snprintf(path, sizeof(path), "/proc/self/status");
	if (ft_read_file(path, buf, sizeof(buf)) < 0)
		return -1;
	size_t klen = strlen(key);
	char *p = buf;
	while (p && *p) {
		if (strncmp(p, key, klen) == 0 && p[klen] == ':') {
			p += klen + 1;
			while (*p == ' ' || *p == '\t')
				p++;
			size_t i = 0;
			while (p[i] && p[i] != '\n' && i + 1 < outsz) {
				out[i] = p[i];
				i++;
			}
			out[i] = 0;
			return 0;
		}
		p = strchr(p, '\n');
		if (p)
			p++;
	}
	return -1;
}

/* Value after "key:" in /proc/self/fdinfo/<fd> (first match), trimmed. */
/* The entries of epoll `ep` as its fdinfo lists them, each as "[tfd: ... data: ...]". */
static FT_UNUSED void ft_epoll_entries(int ep, char *out, size_t n)
{
	char path[64], buf[4096];
	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", ep);
	out[0] = 0;
	if (ft_read_file(path, buf, sizeof(buf)) < 0)
		return;
	size_t len = 0;
	for (char *p = strstr(buf, "tfd:"); p; p = strstr(p + 1, "tfd:")) {
		char *end = strstr(p, " pos:");
		if (!end)
			break;
		len += (size_t)snprintf(out + len, n - len, "[%.*s]", (int)(end - p), p);
		if (len >= n)
			break;
	}
}

static FT_UNUSED int ft_fdinfo_field(int fd, const char *key, char *out, size_t n)
{
	char path[64], buf[16384];
	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", fd);
	if (ft_read_file(path, buf, sizeof(buf)) < 0)
		return -1;
	size_t klen = strlen(key);
	char *p = buf;
	while (p && *p) {
		if (strncmp(p, key, klen) == 0 && p[klen] == ':')
			break;
		p = strchr(p, '\n');
		if (p)
			p++;
	}
	if (!p || !*p)
		return -1;
	p += klen + 1;
	while (*p == ' ' || *p == '\t')
		p++;
	size_t i = 0;
	while (p[i] && p[i] != '\n' && i + 1 < n) {
		out[i] = p[i];
		i++;
	}
	out[i] = 0;
	return 0;
}

/* Field n (1-based, as in proc(5)) of /proc/self/stat, as unsigned. */
static FT_UNUSED unsigned long long ft_stat_field(int n)
{
	char buf[2048];
	if (ft_read_file("/proc/self/stat", buf, sizeof(buf)) < 0)
		return 0;
	char *p = strrchr(buf, ')');
	if (!p)
		return 0;
	p += 2; /* field 3 starts here */
	for (int f = 3; f < n && p; f++) {
		p = strchr(p, ' ');
		if (p)
			p++;
	}
	return p ? strtoull(p, NULL, 10) : 0;
}

static FT_UNUSED unsigned long long ft_proc_start_ticks(void)
{
	return ft_stat_field(22);
}

/*
 * Find the /proc/self/maps line containing addr. Fills start/end, perms
 * ("rw-p") and the path column (may be empty). Returns 0 on success.
 */
struct ft_vma {
	unsigned long start, end, offset;
	char perms[8];
	char path[512];
};

static FT_UNUSED int ft_find_vma(const void *addr, struct ft_vma *v)
{
	static char buf[1 << 18];
	static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
	unsigned long a = (unsigned long)addr;
	int found = -1;
	pthread_mutex_lock(&lock);
	if (ft_read_file("/proc/self/maps", buf, sizeof(buf)) >= 0) {
		char *line = buf;
		while (line && *line) {
			char *nl = strchr(line, '\n');
			if (nl)
				*nl = 0;
			unsigned long s, e, off;
			char perms[8];
			int pos = 0;
			if (sscanf(line, "%lx-%lx %7s %lx %*s %*s%n", &s, &e, perms, &off, &pos) >= 4 &&
			    a >= s && a < e) {
				v->start = s;
				v->end = e;
				v->offset = off;
				snprintf(v->perms, sizeof(v->perms), "%s", perms);
				const char *p = line + pos;
				while (*p == ' ')
					p++;
				snprintf(v->path, sizeof(v->path), "%s", p);
				found = 0;
				break;
			}
			line = nl ? nl + 1 : NULL;
		}
	}
	pthread_mutex_unlock(&lock);
	return found;
}

/* Start address of the first mapping whose path column equals name ("[vdso]"), or 0. */
static FT_UNUSED unsigned long ft_find_named_vma(const char *name, unsigned long *end)
{
	static char buf[1 << 18];
	unsigned long res = 0;
	if (ft_read_file("/proc/self/maps", buf, sizeof(buf)) < 0)
		return 0;
	char *line = buf;
	while (line && *line) {
		char *nl = strchr(line, '\n');
		if (nl)
			*nl = 0;
		unsigned long s, e;
		int pos = 0;
		if (sscanf(line, "%lx-%lx %*s %*s %*s %*s%n", &s, &e, &pos) >= 2 && pos > 0) {
			const char *p = line + pos;
			while (*p == ' ')
				p++;
			if (strcmp(p, name) == 0) {
				res = s;
				if (end)
					*end = e;
				break;
			}
		}
		line = nl ? nl + 1 : NULL;
	}
	return res;
}

/*
 * Wait until thread tid is blocked inside syscall nr (or any syscall if
 * nr < 0, or either of nr/nr2), using /proc/self/task/<tid>/syscall.
 * Returns the syscall number, or dies after timeout_s seconds.
 */
static FT_UNUSED long ft_wait_in_syscall2(pid_t tid, long nr, long nr2, double timeout_s)
{
	char path[64], buf[512];
	snprintf(path, sizeof(path), "/proc/self/task/%d/syscall", (int)tid);
	double deadline = ft_mono() + timeout_s;
	long last = -2;
	while (ft_mono() < deadline) {
		if (ft_read_file(path, buf, sizeof(buf)) > 0 && buf[0] >= '0' && buf[0] <= '9') {
			last = strtol(buf, NULL, 10);
			if (nr < 0 || last == nr || last == nr2) {
				/* make sure it stays there (not just passing through) */
				ft_sleep_ms(20);
				if (ft_read_file(path, buf, sizeof(buf)) > 0 &&
				    strtol(buf, NULL, 10) == last && buf[0] >= '0' && buf[0] <= '9')
					return last;
			}
		}
		ft_sleep_ms(5);
	}
	ft_die("thread %d never blocked in syscall %ld/%ld (last seen %ld)", (int)tid, nr, nr2, last);
}

static FT_UNUSED long ft_wait_in_syscall(pid_t tid, long nr, double timeout_s)
{
	return ft_wait_in_syscall2(tid, nr, nr, timeout_s);
}

/* Join a thread, failing (instead of hanging) after timeout_s seconds. */
static FT_UNUSED int ft_join(pthread_t th, void **ret, double timeout_s, const char *what)
{
	struct timespec dl;
	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += (time_t)timeout_s;
	int e = pthread_timedjoin_np(th, ret, &dl);
	if (e != 0) {
		ft_fail("join %s: %s (thread did not finish; clear_child_tid or wakeup lost?)", what,
			strerror(e));
		return -1;
	}
	return 0;
}

/* Fill / check a deterministic pattern derived from a seed and the word index. */
static FT_UNUSED uint64_t ft_pat(uint64_t seed, uint64_t i)
{
	uint64_t x = seed * 0x9E3779B97F4A7C15ULL + i * 0xBF58476D1CE4E5B9ULL + 0x1234567ULL;
	x ^= x >> 31;
	x *= 0x94D049BB133111EBULL;
	x ^= x >> 29;
	return x;
}

static FT_UNUSED void ft_fill(void *p, size_t bytes, uint64_t seed)
{
	uint64_t *w = (uint64_t *)p;
	for (size_t i = 0; i < bytes / 8; i++)
		w[i] = ft_pat(seed, i);
}

/* Returns index of the first bad word, or -1 if the pattern is intact. */
static FT_UNUSED long ft_check_fill(const void *p, size_t bytes, uint64_t seed)
{
	const uint64_t *w = (const uint64_t *)p;
	for (size_t i = 0; i < bytes / 8; i++)
		if (w[i] != ft_pat(seed, i))
			return (long)i;
	return -1;
}

static FT_UNUSED int ft_is_zero(const void *p, size_t bytes)
{
	const unsigned char *c = (const unsigned char *)p;
	for (size_t i = 0; i < bytes; i++)
		if (c[i])
			return 0;
	return 1;
}

/* ---- protocol ------------------------------------------------------------ */

static FT_UNUSED void ft_init(void)
{
	sigset_t s;
	sigemptyset(&s);
	sigaddset(&s, SIGUSR2);
	if (sigprocmask(SIG_BLOCK, &s, NULL) != 0)
		ft_die("sigprocmask: %s", strerror(errno));
	setvbuf(stdout, NULL, _IONBF, 0);
	const char *e = getenv("FERRY_EXPECT_RESTORE");
	ft_expect_restore = e && strcmp(e, "1") == 0;
	const char *dir = getenv("FERRY_TEST_DIR");
	if (dir && *dir && chdir(dir) != 0)
		ft_die("chdir(%s): %s", dir, strerror(errno));
}

static FT_UNUSED void ft_ready(void)
{
	ft_start_ticks = ft_proc_start_ticks();
	ft_ready_done = 1;
	ft_write_all(1, "READY\n", 6);
}

/* Blocks until SIGUSR2 arrives. Returns the siginfo's si_pid. */
static FT_UNUSED pid_t ft_wait_restored(void)
{
	sigset_t s;
	siginfo_t si;
	sigemptyset(&s);
	sigaddset(&s, SIGUSR2);
	for (;;) {
		int r = sigwaitinfo(&s, &si);
		if (r == SIGUSR2)
			return si.si_pid;
		if (r < 0 && errno == EINTR)
			continue;
		ft_die("sigwaitinfo: %d %s", r, strerror(errno));
	}
}

/* True once the process has been checkpointed and restored (new task). */
static FT_UNUSED int ft_restored(void)
{
	return ft_ready_done && ft_proc_start_ticks() != ft_start_ticks;
}

static FT_UNUSED int ft_finish(void)
{
	if (ft_expect_restore && !ft_restored())
		ft_fail("FERRY_EXPECT_RESTORE=1 but the process was not restored (start time unchanged)");
	if (__atomic_load_n(&ft_failures, __ATOMIC_SEQ_CST) == 0) {
		ft_write_all(1, "PASS\n", 5);
		return 0;
	}
	return 1;
}

/* ---- process trees ------------------------------------------------------- */
/*
 * Programs that test a process tree (tree_*.c) follow the same protocol for
 * the root (the PID the harness starts, checkpoints and signals), plus:
 *
 *   root: ft_tree_begin()          after ft_init, before the first fork
 *         ft_fork()                for every child (children fork grandchildren
 *                                  with ft_fork too)
 *   each descendant, setup done:   ft_child_ready()  (reports to the root)
 *         ft_child_wait_go()       sigwaitinfo(SIGUSR2): its parent's "go"
 *         ... checks, ft_fail("child ...") per mismatch ...
 *         ft_child_exit()          exit status 0 only if nothing failed
 *   root: ft_tree_wait_ready(n)    until n descendants called ft_child_ready
 *                                  and every copy of the report pipe is closed
 *         ft_ready(); ft_tree_wait_restored();
 *         ft_go(pid) per child, ft_reap(pid) per child (FAIL unless exit 0)
 *         return ft_finish();
 *
 * The report pipe is closed everywhere before READY, so it is never part of
 * the checkpointed state. Safety alarms (default SIGALRM action: the process
 * dies): FT_TREE_SETUP_S during setup (root and children), FT_TREE_GO_S
 * while a descendant waits for its go (spans checkpoint and restore, so that
 * an orphaned tree goes away by itself), FT_TREE_CHECK_S (descendants) and
 * FT_TREE_ROOT_CHECK_S (root, a bit longer so that a hung child is reported
 * by the root) once the checks run. The root has no alarm pending at READY.
 *
 * A descendant's ft_child_exit() also fails, when FERRY_EXPECT_RESTORE=1, if
 * its own start time (field 22 of /proc/self/stat) did not change since
 * ft_child_ready(), i.e. it was not restored.
 */
#define FT_TREE_SETUP_S 10
#define FT_TREE_GO_S 30
#define FT_TREE_CHECK_S 10
#define FT_TREE_ROOT_CHECK_S 15

static int ft_tree_pipe[2] FT_UNUSED = { -1, -1 };

/* Root, before the first fork: the report pipe and the setup alarm. */
static FT_UNUSED void ft_tree_begin(void)
{
	if (pipe2(ft_tree_pipe, O_CLOEXEC) != 0)
		ft_die("pipe2 (tree report pipe): %s", strerror(errno));
	alarm(FT_TREE_SETUP_S);
}

/*
 * fork() that dies on failure. In the child: no failures counted yet (its
 * exit status is its own), not "ready", and its own setup alarm (alarms are
 * not inherited).
 */
static FT_UNUSED pid_t ft_fork(void)
{
	pid_t p = fork();
	if (p < 0)
		ft_die("fork: %s", strerror(errno));
	if (p == 0) {
		ft_failures = 0;
		ft_ready_done = 0;
		ft_start_ticks = 0;
		alarm(FT_TREE_SETUP_S);
	}
	return p;
}

/*
 * Descendant, once its state is set up: records its start time, arms the
 * go alarm, writes one byte on the report pipe and closes both its ends.
 */
static FT_UNUSED void ft_child_ready(void)
{
	ft_start_ticks = ft_proc_start_ticks();
	ft_ready_done = 1;
	alarm(FT_TREE_GO_S);
	if (ft_tree_pipe[0] >= 0)
		close(ft_tree_pipe[0]);
	ft_tree_pipe[0] = -1;
	if (ft_tree_pipe[1] < 0)
		ft_die("ft_child_ready: report pipe already closed (ft_child_ready called twice?)");
	ft_write_all(ft_tree_pipe[1], "r", 1);
	close(ft_tree_pipe[1]);
	ft_tree_pipe[1] = -1;
}

/*
 * Root: waits until n descendants have reported with ft_child_ready() and
 * every copy of the report pipe's write end is closed (EOF), then closes
 * the read end and cancels the setup alarm. Dies if fewer reported (a
 * descendant died during setup).
 */
static FT_UNUSED void ft_tree_wait_ready(int n)
{
	close(ft_tree_pipe[1]);
	ft_tree_pipe[1] = -1;
	int got = 0;
	for (;;) {
		char c[16];
		ssize_t r = read(ft_tree_pipe[0], c, sizeof(c));
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			ft_die("read (tree report pipe): %s", strerror(errno));
		if (r == 0)
			break;
		got += (int)r;
	}
	close(ft_tree_pipe[0]);
	ft_tree_pipe[0] = -1;
	if (got != n)
		ft_die("%d of %d descendants reported ready (one died during setup?)", got, n);
	alarm(0);
}

/* Root: ft_wait_restored(), then the alarm for the checks. */
static FT_UNUSED pid_t ft_tree_wait_restored(void)
{
	pid_t from = ft_wait_restored();
	alarm(FT_TREE_ROOT_CHECK_S);
	return from;
}

/* Descendant: waits for its parent's go (SIGUSR2), then the check alarm. */
static FT_UNUSED pid_t ft_child_wait_go(void)
{
	pid_t from = ft_wait_restored();
	alarm(FT_TREE_CHECK_S);
	return from;
}

/* Parent: the go for one child (SIGUSR2). */
static FT_UNUSED void ft_go(pid_t pid, const char *who)
{
	if (kill(pid, SIGUSR2) != 0)
		ft_fail("kill(%s pid %d, SIGUSR2): %s", who, (int)pid, strerror(errno));
}

/*
 * Parent: reaps child pid and fails unless it exited with status 0.
 * Returns the wait status, or -1 if waitpid failed.
 */
static FT_UNUSED int ft_reap(pid_t pid, const char *who)
{
	int st = 0;
	pid_t r;
	do
		r = waitpid(pid, &st, 0);
	while (r < 0 && errno == EINTR);
	if (r != pid) {
		ft_fail("waitpid(%s pid %d): %s", who, (int)pid, r < 0 ? strerror(errno) : "wrong pid");
		return -1;
	}
	if (WIFEXITED(st) && WEXITSTATUS(st) != 0)
		ft_fail("%s (pid %d) exited with status %d", who, (int)pid, WEXITSTATUS(st));
	else if (WIFSIGNALED(st))
		ft_fail("%s (pid %d) killed by signal %d%s", who, (int)pid, WTERMSIG(st),
			WTERMSIG(st) == SIGALRM ? " (its safety alarm: it hung)" : "");
	else if (!WIFEXITED(st))
		ft_fail("%s (pid %d): unexpected wait status 0x%x", who, (int)pid, st);
	return st;
}

/*
 * Descendant: the end. Adds the restore check (FERRY_EXPECT_RESTORE=1) and
 * exits with 0 if nothing failed in this process, 1 otherwise.
 */
static FT_UNUSED __attribute__((noreturn)) void ft_child_exit(const char *who)
{
	if (ft_expect_restore && !ft_restored())
		ft_fail("%s (pid %d): FERRY_EXPECT_RESTORE=1 but it was not restored (start time unchanged)",
			who, (int)getpid());
	_exit(__atomic_load_n(&ft_failures, __ATOMIC_SEQ_CST) ? 1 : 0);
}

static FT_UNUSED void ft_cleanup_on_alarm(int sig)
{
	if (getpid() == ft_cleanup_pid) {
		static const char msg[] = "FAIL: safety alarm: the process hung (cleanup done)\n";
		ft_run_cleanup();
		ft_write_all(1, msg, sizeof(msg) - 1);
		_exit(1);
	}
	/* a forked child inherited the handler: die of SIGALRM as usual */
	signal(sig, SIG_DFL);
	raise(sig);
}

/*
 * Registers fn (removing SysV objects, shm_unlink...) to be run by ft_die()
 * and by a safety alarm (SIGALRM) in this process only (not in children
 * forked later, which inherit the handler but die of SIGALRM as usual). The
 * program also calls ft_run_cleanup() itself at the end.
 */
static FT_UNUSED void ft_set_cleanup(void (*fn)(void))
{
	ft_cleanup_pid = getpid();
	ft_cleanup_fn = fn;
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = ft_cleanup_on_alarm;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGALRM, &sa, NULL) != 0)
		ft_die("sigaction(SIGALRM): %s", strerror(errno));
}

/* Sorted list of the children of this process (/proc/self/task/<pid>/children); count or -1. */
static FT_UNUSED int ft_children(pid_t *out, int max)
{
	char path[64], buf[4096];
	snprintf(path, sizeof(path), "/proc/self/task/%d/children", (int)getpid());
	if (ft_read_file(path, buf, sizeof(buf)) < 0)
		return -1;
	int n = 0;
	char *p = buf;
	while (*p && n < max) {
		char *e;
		long v = strtol(p, &e, 10);
		if (e == p)
			break;
		out[n++] = (pid_t)v;
		p = e;
		while (*p == ' ' || *p == '\n')
			p++;
	}
	for (int i = 1; i < n; i++)
		for (int j = i; j > 0 && out[j - 1] > out[j]; j--) {
			pid_t t = out[j];
			out[j] = out[j - 1];
			out[j - 1] = t;
		}
	return n;
}

#endif /* FERRY_TEST_H */
