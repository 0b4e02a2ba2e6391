/*
 * shared_counter [MODE]: a parent and its child share something, and the
 * test checkpoints (or migrates) the child alone, which ferry must refuse:
 * restored without its parent, the child would have a private copy. After
 * SIGUSR2 the parent checks that both still share it.
 *
 * MODE (default anon):
 *   anon, sysv, posix, memfd  a counter in MAP_SHARED memory of that kind
 *                             (anonymous, a SysV segment, a /dev/shm object,
 *                             a memfd): the child adds 1000 (SIGUSR1), the
 *                             parent sees the sum;
 *   files      the fd table (clone with CLONE_FILES, no shared memory): the
 *              parent opens a descriptor, the child finds it in its table;
 *   pipe       one pipe, both ends held by both: the parent writes a byte,
 *              the child reads it;
 *   socketpair one unix socket pair, both ends held by both: likewise;
 *   offset     one open file description of a regular file (opened by the
 *              parent before the fork): the parent writes 4 bytes, the
 *              child sees the shared offset at 4;
 *   parent     nothing shared: the child runs in its parent's process group
 *              and waits for SIGUSR2, then exits 0. The parent reaps it
 *              whenever it exits and says so after SIGUSR2: "child still
 *              running" (the checkpoint was refused) or "child killed by
 *              signal N" (taken with --parent-sees-exit).
 *   uts        as parent, in a UTS namespace the parent made (unshare) before
 *              the fork: both are in it, so the child is not taken alone
 *              (a restore would give it a namespace of its own).
 *
 * In every mode but anon and files the child points its stdout and stderr
 * at /dev/null first, so that the log file both inherited is not what
 * they share.
 */
#define _GNU_SOURCE
#include "../conformance/ferry_test.h"
#include <sched.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <sys/wait.h>

static volatile long *counter;
static int probe_fd = -1;
static int probe_fd2 = -1;
static const char *mode = "anon";
static char shm_name[64];
static pid_t child = -1;
static volatile int child_status = -1;

static void add(int sig)
{
	(void)sig;
	__atomic_add_fetch(counter, 1000, __ATOMIC_SEQ_CST);
}

/* In the child: exits 0 if what the parent did through the shared
 * object shows here. */
static void probe(int sig)
{
	(void)sig;
	char c = 0;
	if (strcmp(mode, "files") == 0)
		_exit(fcntl(probe_fd, F_GETFD) == -1 ? 1 : 0);
	if (strcmp(mode, "offset") == 0)
		_exit(lseek(probe_fd, 0, SEEK_CUR) == 4 ? 0 : 1);
	/* pipe, socketpair: the byte the parent wrote on the other end. */
	_exit(read(probe_fd, &c, 1) == 1 && c == 'x' ? 0 : 1);
}

static void reap(int sig)
{
	(void)sig;
	int st;
	if (child > 0 && waitpid(child, &st, WNOHANG) == child)
		child_status = st;
}

static int child_fn(void *arg)
{
	(void)arg;
	alarm(60);
	for (;;)
		pause();
	return 0;
}

static void quiet_stdio(void)
{
	int null = open("/dev/null", O_WRONLY);
	if (null < 0 || dup2(null, 1) < 0 || dup2(null, 2) < 0)
		_exit(3);
	close(null);
}

/* In the parent: waits until the child's stdout is /dev/null. */
static void wait_quiet(void)
{
	char path[64], link[64];
	snprintf(path, sizeof(path), "/proc/%d/fd/1", (int)child);
	double end = ft_mono() + 10;
	for (;;) {
		ssize_t n = readlink(path, link, sizeof(link) - 1);
		if (n > 0) {
			link[n] = 0;
			if (strcmp(link, "/dev/null") == 0)
				return;
		}
		if (ft_mono() > end)
			ft_die("the child never pointed its stdout at /dev/null");
		ft_sleep_ms(5);
	}
}

static void cleanup(void)
{
	if (shm_name[0])
		shm_unlink(shm_name);
	shm_name[0] = 0;
}

/* The fd-table variant: the child shares its parent's table. */
static int shared_files(void)
{
	static char stack[65536] __attribute__((aligned(16)));
	probe_fd = 200;
	/* Set before the clone: a child not yet run when SIGUSR1 comes
	 * (a loaded machine) must not die of it. */
	signal(SIGUSR1, probe);
	child = clone(child_fn, stack + sizeof(stack), CLONE_FILES | SIGCHLD, NULL);
	if (child < 0)
		ft_die("clone: %s", strerror(errno));
	ft_log("CHILD %d", (int)child);
	ft_ready();
	ft_wait_restored();
	int fd = (int)FT_SYS(open("/dev/null", O_RDONLY));
	FT_SYS(dup2(fd, probe_fd));
	kill(child, SIGUSR1);
	int status = 0;
	waitpid(child, &status, 0);
	FT_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		 "the child no longer shares its parent's fd table (status %#x)", status);
	return ft_finish();
}

/* pipe, socketpair, offset: the object is made before the fork and the
 * parent keeps what the child keeps. */
static int shared_fd(void)
{
	if (strcmp(mode, "pipe") == 0) {
		int p[2];
		FT_SYS(pipe(p));
		probe_fd = p[0];
		probe_fd2 = p[1];
	} else if (strcmp(mode, "socketpair") == 0) {
		int sv[2];
		FT_SYS(socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
		probe_fd = sv[1];
		probe_fd2 = sv[0];
	} else {
		probe_fd = (int)FT_SYS(open("shared-offset", O_RDWR | O_CREAT | O_TRUNC, 0600));
		probe_fd2 = probe_fd;
	}
	signal(SIGUSR1, probe);
	child = fork();
	if (child < 0)
		ft_die("fork: %s", strerror(errno));
	if (child == 0) {
		quiet_stdio();
		child_fn(NULL);
	}
	wait_quiet();
	ft_log("CHILD %d", (int)child);
	ft_ready();
	ft_wait_restored();
	FT_SYS(write(probe_fd2, strcmp(mode, "offset") == 0 ? "xxxx" : "x",
		     strcmp(mode, "offset") == 0 ? 4 : 1));
	kill(child, SIGUSR1);
	int status = 0;
	waitpid(child, &status, 0);
	FT_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		 "the child no longer shares the %s with its parent (status %#x)", mode, status);
	return ft_finish();
}

static int parent_waits(void)
{
	signal(SIGCHLD, reap);
	child = fork();
	if (child < 0)
		ft_die("fork: %s", strerror(errno));
	if (child == 0) {
		quiet_stdio();
		alarm(60);
		ft_wait_restored();
		_exit(0);
	}
	wait_quiet();
	ft_log("CHILD %d", (int)child);
	ft_ready();
	ft_wait_restored();
	/* A restored child is not this process's any more: give its SIGCHLD
	 * (here, the killed original's) a moment. */
	ft_sleep_ms(50);
	reap(0);
	int st = child_status;
	if (st == -1) {
		ft_log("child still running");
		kill(child, SIGKILL);
		waitpid(child, NULL, 0);
	} else if (WIFSIGNALED(st)) {
		ft_log("child killed by signal %d", WTERMSIG(st));
	} else {
		ft_log("child exited with status %#x", st);
	}
	return ft_finish();
}

static volatile long *shared_counter(void)
{
	void *p = MAP_FAILED;
	if (strcmp(mode, "anon") == 0) {
		p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	} else if (strcmp(mode, "sysv") == 0) {
		int id = (int)FT_SYS(shmget(IPC_PRIVATE, 4096, IPC_CREAT | 0600));
		p = shmat(id, NULL, 0);
		/* Removed once both detach (or die): nothing left behind. */
		shmctl(id, IPC_RMID, NULL);
		if (p == (void *)-1)
			p = MAP_FAILED;
	} else {
		int fd;
		if (strcmp(mode, "posix") == 0) {
			snprintf(shm_name, sizeof(shm_name), "/ferry-guarantee-%d", (int)getpid());
			ft_set_cleanup(cleanup);
			fd = (int)FT_SYS(shm_open(shm_name, O_RDWR | O_CREAT | O_EXCL, 0600));
		} else {
			fd = (int)FT_SYS(memfd_create("ferry-counter", 0));
		}
		FT_SYS(ftruncate(fd, 4096));
		p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		close(fd);
	}
	if (p == MAP_FAILED)
		ft_die("mapping the %s counter: %s", mode, strerror(errno));
	return p;
}

int main(int argc, char **argv)
{
	ft_init();
	if (argc > 1)
		mode = argv[1];
	if (strcmp(mode, "files") == 0)
		return shared_files();
	if (strcmp(mode, "pipe") == 0 || strcmp(mode, "socketpair") == 0 ||
	    strcmp(mode, "offset") == 0)
		return shared_fd();
	if (strcmp(mode, "parent") == 0)
		return parent_waits();
	if (strcmp(mode, "uts") == 0) {
		FT_SYS(unshare(CLONE_NEWUTS));
		FT_SYS(sethostname("ferry-uts-shared", 16));
		return parent_waits();
	}
	counter = shared_counter();
	*counter = 1;
	/* Inherited: the child may not have run yet when SIGUSR1 comes. */
	signal(SIGUSR1, add);
	child = fork();
	if (child < 0)
		ft_die("fork: %s", strerror(errno));
	if (child == 0) {
		if (strcmp(mode, "anon") != 0)
			quiet_stdio();
		alarm(60);
		for (;;)
			pause();
	}
	if (strcmp(mode, "anon") != 0)
		wait_quiet();
	ft_log("CHILD %d", (int)child);
	ft_ready();
	ft_wait_restored();
	kill(child, SIGUSR1);
	double end = ft_mono() + 10;
	while (__atomic_load_n(counter, __ATOMIC_SEQ_CST) != 1001 && ft_mono() < end)
		ft_sleep_ms(10);
	FT_EQ(*counter, 1001, "the counter both processes share");
	kill(child, SIGKILL);
	waitpid(child, NULL, 0);
	cleanup();
	return ft_finish();
}
