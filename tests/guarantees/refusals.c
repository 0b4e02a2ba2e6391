/*
 * refusals MODE: one program per state ferry refuses at checkpoint (the
 * guarantees test runs it with each MODE). It sets the state up, prints
 * READY, and after SIGUSR2 checks that the refused checkpoint left that
 * state exactly as it was. Children (for modes that need a second
 * process) wait in pause() and are killed and reaped at the end.
 */
#define _GNU_SOURCE
#include "../conformance/ferry_test.h"
#include <sched.h>
#include <sys/epoll.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/syscall.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/utsname.h>
#include <stddef.h>

static pid_t child = -1;

static int write_file(const char *path, const char *text)
{
	int f = open(path, O_WRONLY);
	if (f < 0)
		return -1;
	ssize_t n = write(f, text, strlen(text));
	close(f);
	return n == (ssize_t)strlen(text) ? 0 : -1;
}

/* Goes on after the main thread exited; the process's result. */
static void *main_exited_fn(void *arg)
{
	(void)arg;
	char path[64], b[256] = "";
	snprintf(path, sizeof(path), "/proc/%d/status", (int)getpid());
	while (ft_read_file(path, b, sizeof(b)) > 0 && !strstr(b, "State:\tZ"))
		ft_sleep_ms(1);
	ft_ready();
	ft_wait_restored();
	_exit(ft_finish());
	return NULL;
}

static int child_fn(void *arg)
{
	(void)arg;
	alarm(60);
	for (;;)
		pause();
	return 0;
}

/* child_fn with its output to /dev/null: checkpointed alone, it shares
 * no open log with its parent. */
static int quiet_child_fn(void *arg)
{
	int null = open("/dev/null", O_RDWR);
	dup2(null, 1);
	dup2(null, 2);
	close(null);
	return child_fn(arg);
}

/* Shares the root's fd table (CLONE_FILES) through a parent that no
 * longer does; dies with its parent. */
static int grandchild_fn(void *arg)
{
	(void)arg;
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	alarm(60);
	for (;;)
		pause();
	return 0;
}

/* Clones a grandchild with CLONE_FILES, then unshares its own table. */
static int unsharing_child_fn(void *arg)
{
	static char stack[65536] __attribute__((aligned(16)));
	(void)arg;
	if (clone(grandchild_fn, stack + sizeof(stack), CLONE_FILES | SIGCHLD, NULL) < 0 || unshare(CLONE_FILES) != 0)
		_exit(1);
	return child_fn(NULL);
}

static void start_child(int clone_flags)
{
	static char stack[65536] __attribute__((aligned(16)));
	child = clone(child_fn, stack + sizeof(stack), clone_flags | SIGCHLD, NULL);
	if (child < 0)
		ft_die("clone: %s", strerror(errno));
}

static void end_child(void)
{
	if (child > 0) {
		kill(child, SIGKILL);
		waitpid(child, NULL, __WALL);
	}
}

static socklen_t path_addr(const char *name, struct sockaddr_un *a)
{
	memset(a, 0, sizeof(*a));
	a->sun_family = AF_UNIX;
	snprintf(a->sun_path, sizeof(a->sun_path), "%s", name);
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(name) + 1);
}

/* A unix listener bound to a path name in the working directory. */
static int path_listener(const char *name)
{
	struct sockaddr_un a;
	int s = (int)FT_SYS(socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0));
	FT_SYS(bind(s, (struct sockaddr *)&a, path_addr(name, &a)));
	FT_SYS(listen(s, 4));
	return s;
}

/* Whether the smaps entry at addr is hugetlb memory (2 MiB pages). */
static int huge_mapping(void *addr)
{
	static char buf[1 << 20];
	char key[32];
	if (ft_read_file("/proc/self/smaps", buf, sizeof(buf)) < 0)
		return 0;
	snprintf(key, sizeof(key), "%lx-", (unsigned long)addr);
	char *p = strstr(buf, key);
	char *k = p ? strstr(p, "KernelPageSize:") : NULL;
	return k && atol(k + strlen("KernelPageSize:")) == 2048;
}

/* Whether the page at addr is a guard page (pagemap bit 58). */
static int guard_page(void *addr)
{
	uint64_t e = 0;
	int f = open("/proc/self/pagemap", O_RDONLY);
	if (f < 0)
		return 0;
	ssize_t n = pread(f, &e, 8, (off_t)((uintptr_t)addr / 4096 * 8));
	close(f);
	return n == 8 && (e >> 58 & 1);
}

int main(int argc, char **argv)
{
	ft_init();
	ft_set_cleanup(end_child);
	const char *mode = argc > 1 ? argv[1] : "";
	int fd = -1, fd2 = -1, shm;
	void *mapped = NULL;
	unsigned long aio = 0;
	if (strcmp(mode, "plain") == 0) {
		/* nothing: the test changes the process from outside (cgroups) */
	} else if (strcmp(mode, "mlockall") == 0) {
		FT_SYS(mlockall(MCL_FUTURE));
	} else if (strcmp(mode, "sched_deadline") == 0) {
		/* struct sched_attr: size, policy, flags, nice, priority,
		 * runtime, deadline, period */
		uint64_t attr[7] = { 0 };
		((uint32_t *)attr)[0] = 48;
		((uint32_t *)attr)[1] = 6; /* SCHED_DEADLINE */
		attr[3] = 1000000;   /* runtime 1 ms */
		attr[4] = 50000000;  /* deadline 50 ms */
		attr[5] = 100000000; /* period 100 ms */
		FT_SYS(syscall(SYS_sched_setattr, 0, attr, 0));
	} else if (strcmp(mode, "uts") == 0) {
		/* A namespace of its own, and a child in another one: one tree
		 * split across two UTS namespaces. */
		FT_SYS(unshare(CLONE_NEWUTS));
		FT_SYS(sethostname("ferry-uts-test", 14));
		start_child(CLONE_NEWUTS);
	} else if (strcmp(mode, "tsc") == 0) {
		FT_SYS(prctl(PR_SET_TSC, PR_TSC_SIGSEGV, 0, 0, 0));
	} else if (strcmp(mode, "pty_slave_alone") == 0) {
		/* A pty slave whose master was closed: nothing can reattach it. */
		int m = (int)FT_SYS(posix_openpt(O_RDWR | O_NOCTTY));
		FT_SYS(grantpt(m));
		FT_SYS(unlockpt(m));
		fd = (int)FT_SYS(open(ptsname(m), O_RDWR | O_NOCTTY));
		close(m);
	} else if (strcmp(mode, "pty_master_alone") == 0) {
		fd = (int)FT_SYS(posix_openpt(O_RDWR | O_NOCTTY));
	} else if (strcmp(mode, "proc_outside") == 0) {
		char path[64];
		snprintf(path, sizeof(path), "/proc/%d/stat", (int)getppid());
		fd = (int)FT_SYS(open(path, O_RDONLY));
	} else if (strcmp(mode, "clone_fs") == 0) {
		start_child(CLONE_FS);
	} else if (strcmp(mode, "unix_pending") == 0) {
		fd = (int)FT_SYS(socket(AF_UNIX, SOCK_STREAM, 0));
		struct sockaddr_un a = { .sun_family = AF_UNIX };
		strcpy(a.sun_path + 1, "ferry-guarantee-pending");
		socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(a.sun_path + 1));
		FT_SYS(bind(fd, (struct sockaddr *)&a, len));
		FT_SYS(listen(fd, 4));
		fd2 = (int)FT_SYS(socket(AF_UNIX, SOCK_STREAM, 0));
		FT_SYS(connect(fd2, (struct sockaddr *)&a, len));
		FT_SYS(write(fd2, "early", 5)); /* sent before accept */
	} else if (strcmp(mode, "unix_dead_peer_name_taken") == 0) {
		/* A datagram socket connected to an abstract name whose socket
		 * was closed, the name bound again since (a restarted log daemon). */
		struct sockaddr_un a;
		memset(&a, 0, sizeof(a));
		a.sun_family = AF_UNIX;
		int n = snprintf(a.sun_path + 1, sizeof(a.sun_path) - 1, "ferry-deadname-%d", (int)getpid());
		socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
		int old = (int)FT_SYS(socket(AF_UNIX, SOCK_DGRAM, 0));
		FT_SYS(bind(old, (struct sockaddr *)&a, len));
		fd = (int)FT_SYS(socket(AF_UNIX, SOCK_DGRAM, 0));
		FT_SYS(connect(fd, (struct sockaddr *)&a, len));
		close(old);
		fd2 = (int)FT_SYS(socket(AF_UNIX, SOCK_DGRAM, 0));
		FT_SYS(bind(fd2, (struct sockaddr *)&a, len));
	} else if (strcmp(mode, "unix_dead_peer_in_flight") == 0) {
		/* The closed peer of a stream socket sent it a descriptor (still
		 * held by the process) that waits in its queue. */
		int sv[2];
		FT_SYS(socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
		fd2 = (int)FT_SYS(open("/dev/null", O_RDONLY));
		char cbuf[CMSG_SPACE(sizeof(int))];
		memset(cbuf, 0, sizeof(cbuf));
		struct iovec iov = { .iov_base = "m", .iov_len = 1 };
		struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
		struct cmsghdr *c = CMSG_FIRSTHDR(&m);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd2, sizeof(int));
		FT_SYS(sendmsg(sv[1], &m, 0));
		close(sv[1]);
		fd = sv[0];
	} else if (strcmp(mode, "unix_unlinked") == 0) {
		/* zdtm deleted_unix_sock: the listener's file is unlinked */
		fd = path_listener("gone.sock");
		FT_SYS(unlink("gone.sock"));
	} else if (strcmp(mode, "unix_replaced") == 0) {
		/* zdtm del_standalone_un: fd 3's file is renamed back over fd 4's */
		fd = path_listener("b.sock");
		FT_SYS(rename("b.sock", "tmp.sock"));
		fd2 = path_listener("b.sock");
		FT_SYS(rename("tmp.sock", "b.sock"));
	} else if (strcmp(mode, "scm_rights") == 0) {
		int sv[2];
		FT_SYS(socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
		/* A pipe's read end, which no process holds once sent (the
		 * process keeps the write end): a pipe in flight is refused. */
		int p[2];
		FT_SYS(pipe(p));
		int passed = p[0];
		char cbuf[CMSG_SPACE(sizeof(int))];
		memset(cbuf, 0, sizeof(cbuf));
		struct iovec iov = { .iov_base = "m", .iov_len = 1 };
		struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
		struct cmsghdr *c = CMSG_FIRSTHDR(&m);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &passed, sizeof(int));
		FT_SYS(sendmsg(sv[0], &m, 0));
		close(passed);
		fd = sv[1];
		fd2 = p[1];
	} else if (strcmp(mode, "unix_peer_exited") == 0) {
		/* A socketpair made by a child that has exited since: its
		 * SO_PEERCRED names that pid, which no process of the tree has. */
		int t[2], got[2];
		FT_SYS(socketpair(AF_UNIX, SOCK_STREAM, 0, t));
		pid_t maker = fork();
		if (maker == 0) {
			int sv[2];
			char cbuf[CMSG_SPACE(2 * sizeof(int))];
			memset(cbuf, 0, sizeof(cbuf));
			struct iovec iov = { .iov_base = "m", .iov_len = 1 };
			struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
			struct cmsghdr *c = CMSG_FIRSTHDR(&m);
			if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
				_exit(1);
			c->cmsg_level = SOL_SOCKET;
			c->cmsg_type = SCM_RIGHTS;
			c->cmsg_len = CMSG_LEN(2 * sizeof(int));
			memcpy(CMSG_DATA(c), sv, 2 * sizeof(int));
			_exit(sendmsg(t[1], &m, 0) == 1 ? 0 : 1);
		}
		FT_SYS(maker);
		char cbuf[CMSG_SPACE(2 * sizeof(int))], b;
		struct iovec iov = { .iov_base = &b, .iov_len = 1 };
		struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
		FT_EQ(recvmsg(t[0], &m, 0), 1, "the pair from the child");
		struct cmsghdr *c = CMSG_FIRSTHDR(&m);
		if (!c || c->cmsg_type != SCM_RIGHTS || c->cmsg_len != CMSG_LEN(2 * sizeof(int)))
			ft_die("no pair received");
		memcpy(got, CMSG_DATA(c), sizeof(got));
		FT_SYS(waitpid(maker, NULL, 0));
		close(t[0]);
		close(t[1]);
		/* At fds 3 and 4, for the refusal's message. */
		fd = (int)FT_SYS(dup2(got[0], 3));
		fd2 = (int)FT_SYS(dup2(got[1], 4));
		close(got[0]);
		close(got[1]);
	} else if (strcmp(mode, "clone_files_gap") == 0) {
		static char stack[65536] __attribute__((aligned(16)));
		child = clone(unsharing_child_fn, stack + sizeof(stack), CLONE_FILES | SIGCHLD, NULL);
		FT_SYS(child);
		/* Until the grandchild exists and the child has its own table. */
		char path[64], buf[256];
		snprintf(path, sizeof(path), "/proc/%d/task/%d/children", (int)child, (int)child);
		for (int i = 0; i < 500; i++) {
			if (ft_read_file(path, buf, sizeof(buf)) > 0 && syscall(SYS_kcmp, getpid(), child, 2 /* KCMP_FILES */, 0, 0) != 0)
				break;
			ft_sleep_ms(10);
		}
	} else if (strcmp(mode, "inotify_deleted_mapped") == 0) {
		/* A watch on a deleted file that only a mapping keeps. */
		int f = (int)FT_SYS(open("mapped", O_CREAT | O_RDWR, 0600));
		FT_SYS(ftruncate(f, 4096));
		if (mmap(NULL, 4096, PROT_READ, MAP_PRIVATE, f, 0) == MAP_FAILED)
			ft_die("mmap: %s", strerror(errno));
		close(f);
		fd = (int)FT_SYS(inotify_init1(IN_NONBLOCK));
		FT_SYS(inotify_add_watch(fd, "mapped", IN_CLOSE_WRITE));
		FT_SYS(unlink("mapped"));
	} else if (strcmp(mode, "memfd_hugetlb") == 0) {
		/* Mapped, never touched: MAP_NORESERVE needs no huge page. */
		fd = (int)FT_SYS(memfd_create("ferry-huge", MFD_HUGETLB));
		FT_SYS(ftruncate(fd, 2 << 20));
		mapped = mmap(NULL, 2 << 20, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
		if (mapped == MAP_FAILED)
			ft_die("mmap of the hugetlb memfd: %s", strerror(errno));
	} else if (strcmp(mode, "shm_hugetlb") == 0) {
		shm = (int)FT_SYS(shmget(IPC_PRIVATE, 2 << 20, IPC_CREAT | 0600 | SHM_HUGETLB | SHM_NORESERVE));
		mapped = shmat(shm, NULL, 0);
		if (mapped == (void *)-1)
			ft_die("shmat: %s", strerror(errno));
		/* Removed now; it lives while attached. */
		FT_SYS(shmctl(shm, IPC_RMID, NULL));
	} else if (strcmp(mode, "memfd_secret") == 0) {
		fd = (int)syscall(447 /* memfd_secret */, 0);
		if (fd < 0)
			ft_die("memfd_secret: %s (boot with secretmem.enable=1)", strerror(errno));
		FT_SYS(ftruncate(fd, 4096));
		mapped = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (mapped == MAP_FAILED)
			ft_die("mmap of the secret memfd: %s", strerror(errno));
		memcpy(mapped, "secret", 7);
		close(fd);
		fd = -1;
	} else if (strcmp(mode, "guard") == 0) {
		mapped = mmap(NULL, 8 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (mapped == MAP_FAILED)
			ft_die("mmap: %s", strerror(errno));
		memset(mapped, 'g', 8 * 4096);
		FT_SYS(madvise((char *)mapped + 4 * 4096, 4096, 102 /* MADV_GUARD_INSTALL */));
	} else if (strcmp(mode, "aio") == 0) {
		FT_SYS(syscall(SYS_io_setup, 16, &aio));
	} else if (strcmp(mode, "main_exited") == 0) {
		/* The main thread ends with pthread_exit; a thread goes on,
		 * prints READY and waits for SIGUSR2 (blocked by ft_init). */
		pthread_t t;
		if (pthread_create(&t, NULL, main_exited_fn, NULL) != 0)
			ft_die("pthread_create");
		pthread_exit(NULL);
	} else if (strcmp(mode, "pdeathsig") == 0) {
		/* Restored, but not by a ferry that exits (restore --detach). */
		FT_SYS(prctl(PR_SET_PDEATHSIG, SIGUSR1));
	} else if (strcmp(mode, "autogroup_child") == 0) {
		/* Its own session, so its own autogroup, which a child shares;
		 * the test checkpoints the child without its session's leader. */
		if (getsid(0) != getpid())
			FT_SYS(setsid());
		FT_CHECK(write_file("/proc/self/autogroup", "5") == 0, "writing autogroup: %s", strerror(errno));
		static char stack[65536] __attribute__((aligned(16)));
		child = clone(quiet_child_fn, stack + sizeof(stack), SIGCHLD, NULL);
		FT_SYS(child);
		ft_log("CHILD %d", (int)child);
	} else if (strcmp(mode, "loginuid") == 0) {
		FT_CHECK(write_file("/proc/self/loginuid", "4242") == 0, "writing loginuid: %s", strerror(errno));
	} else if (strcmp(mode, "zombie_core") == 0) {
		/* An unreaped child that died of SIGQUIT and dumped core. */
		child = fork();
		if (child == 0) {
			struct rlimit all = { RLIM_INFINITY, RLIM_INFINITY };
			setrlimit(RLIMIT_CORE, &all);
			/* A shell that started us in the background may have
			 * left SIGQUIT ignored; ft_init blocks signals. */
			signal(SIGQUIT, SIG_DFL);
			sigset_t quit;
			sigemptyset(&quit);
			sigaddset(&quit, SIGQUIT);
			sigprocmask(SIG_UNBLOCK, &quit, NULL);
			raise(SIGQUIT);
			_exit(1);
		}
		FT_SYS(child);
		siginfo_t si;
		memset(&si, 0, sizeof(si));
		FT_SYS(waitid(P_PID, (id_t)child, &si, WEXITED | WNOWAIT));
		if (si.si_code != CLD_DUMPED)
			ft_die("the child did not dump core (si_code %d): check core_pattern", si.si_code);
	} else {
		ft_die("unknown mode '%s'", mode);
	}

	ft_ready();
	ft_wait_restored();

	if (strcmp(mode, "sched_deadline") == 0) {
		FT_EQ(sched_getscheduler(0), 6, "scheduling policy (SCHED_DEADLINE)");
	} else if (strcmp(mode, "uts") == 0) {
		struct utsname u;
		uname(&u);
		FT_CHECK(strcmp(u.nodename, "ferry-uts-test") == 0, "hostname '%s'", u.nodename);
	} else if (strcmp(mode, "tsc") == 0) {
		int v = 0;
		prctl(PR_GET_TSC, &v, 0, 0, 0);
		FT_EQ(v, PR_TSC_SIGSEGV, "PR_GET_TSC");
	} else if (strcmp(mode, "pty_slave_alone") == 0) {
		struct stat st;
		FT_CHECK(fstat(fd, &st) == 0 && S_ISCHR(st.st_mode), "fd %d is no longer the slave", fd);
	} else if (strcmp(mode, "pty_master_alone") == 0) {
		FT_CHECK(isatty(fd), "fd %d is no longer a terminal", fd);
	} else if (strcmp(mode, "proc_outside") == 0) {
		char buf[256];
		FT_CHECK(pread(fd, buf, sizeof(buf), 0) > 0, "reading /proc/PARENT/stat: %s", strerror(errno));
	} else if (strcmp(mode, "clone_fs") == 0) {
		FT_SYS(umask(0027));
		char path[64], buf[4096];
		snprintf(path, sizeof(path), "/proc/%d/status", (int)child);
		FT_CHECK(ft_read_file(path, buf, sizeof(buf)) > 0 && strstr(buf, "Umask:\t0027"), "child no longer shares the umask (fs information)");
	} else if (strcmp(mode, "unix_pending") == 0) {
		int a = accept(fd, NULL, NULL);
		FT_CHECK(a >= 0, "pending connection gone: %s", strerror(errno));
		char b[8] = "";
		FT_CHECK(a >= 0 && read(a, b, 5) == 5 && memcmp(b, "early", 5) == 0, "data sent before accept lost");
	} else if (strcmp(mode, "unix_dead_peer_name_taken") == 0) {
		FT_CHECK(send(fd, "x", 1, MSG_DONTWAIT) < 0 && errno == ECONNREFUSED,
			 "send to the closed peer: %s", strerror(errno));
	} else if (strcmp(mode, "unix_dead_peer_in_flight") == 0) {
		char b[4], cbuf[CMSG_SPACE(sizeof(int))];
		struct iovec iov = { .iov_base = b, .iov_len = sizeof(b) };
		struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
		FT_EQ(recvmsg(fd, &m, MSG_DONTWAIT), 1, "the message from the closed peer");
		struct cmsghdr *c = CMSG_FIRSTHDR(&m);
		FT_CHECK(c && c->cmsg_type == SCM_RIGHTS, "the descriptor in flight is gone");
		FT_EQ(read(fd, b, 1), 0, "EOF after the message");
	} else if (strcmp(mode, "unix_unlinked") == 0) {
		struct stat st;
		FT_CHECK(lstat("gone.sock", &st) != 0 && errno == ENOENT, "gone.sock exists again");
	} else if (strcmp(mode, "unix_replaced") == 0) {
		struct sockaddr_un a;
		int cl = (int)FT_SYS(socket(AF_UNIX, SOCK_STREAM, 0));
		FT_CHECK(connect(cl, (struct sockaddr *)&a, path_addr("b.sock", &a)) == 0, "connect to b.sock: %s", strerror(errno));
		FT_CHECK(accept(fd, NULL, NULL) >= 0, "the listener named by b.sock did not get the connection");
		FT_CHECK(accept(fd2, NULL, NULL) < 0, "the listener whose file was replaced got the connection");
	} else if (strcmp(mode, "unix_peer_exited") == 0) {
		char b = 0;
		FT_EQ(write(fd, "x", 1), 1, "write on the pair made by the exited child");
		FT_EQ(read(fd2, &b, 1), 1, "read on its other end");
		FT_CHECK(b == 'x', "the pair does not carry data any more");
	} else if (strcmp(mode, "inotify_deleted_mapped") == 0) {
		char path[64], buf[1024];
		snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", fd);
		FT_CHECK(ft_read_file(path, buf, sizeof(buf)) > 0 && strstr(buf, "inotify wd:1 "), "the watch is gone");
	} else if (strcmp(mode, "memfd_hugetlb") == 0 || strcmp(mode, "shm_hugetlb") == 0) {
		FT_CHECK(huge_mapping(mapped), "the mapping at %p is no longer hugetlb memory", mapped);
	} else if (strcmp(mode, "memfd_secret") == 0) {
		FT_CHECK(memcmp(mapped, "secret", 7) == 0, "the secret memory lost its content");
	} else if (strcmp(mode, "guard") == 0) {
		/* A guard page faults; its neighbours keep their data. */
		FT_CHECK(((char *)mapped)[3 * 4096] == 'g' && ((char *)mapped)[5 * 4096] == 'g', "data around the guard page");
		FT_CHECK(guard_page((char *)mapped + 4 * 4096), "the guard page is gone");
	} else if (strcmp(mode, "aio") == 0) {
		FT_CHECK(syscall(SYS_io_destroy, aio) == 0, "io_destroy of the AIO context: %s", strerror(errno));
	} else if (strcmp(mode, "pdeathsig") == 0) {
		int d = 0;
		prctl(PR_GET_PDEATHSIG, &d);
		FT_EQ(d, SIGUSR1, "PR_GET_PDEATHSIG");
	} else if (strcmp(mode, "autogroup_child") == 0) {
		char b[64] = "", c[64] = "", path[64];
		ft_read_file("/proc/self/autogroup", b, sizeof(b));
		FT_CHECK(strstr(b, "nice 5") != NULL, "autogroup %s", b);
		snprintf(path, sizeof(path), "/proc/%d/autogroup", (int)child);
		ft_read_file(path, c, sizeof(c));
		FT_CHECK(strcmp(b, c) == 0, "the child's autogroup %s, its parent's %s", c, b);
	} else if (strcmp(mode, "loginuid") == 0) {
		char b[32] = "";
		ft_read_file("/proc/self/loginuid", b, sizeof(b));
		FT_CHECK(atoi(b) == 4242, "loginuid %s", b);
	} else if (strcmp(mode, "zombie_core") == 0) {
		siginfo_t si;
		memset(&si, 0, sizeof(si));
		FT_SYS(waitid(P_PID, (id_t)child, &si, WEXITED | WNOWAIT | WNOHANG));
		FT_CHECK(si.si_code == CLD_DUMPED && si.si_status == SIGQUIT, "zombie: code %d status %d", si.si_code, si.si_status);
	} else if (strcmp(mode, "scm_rights") == 0) {
		char cbuf[CMSG_SPACE(sizeof(int))], b;
		struct iovec iov = { .iov_base = &b, .iov_len = 1 };
		struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
		FT_EQ(recvmsg(fd, &m, MSG_DONTWAIT), 1, "message in flight");
		FT_CHECK(CMSG_FIRSTHDR(&m) && CMSG_FIRSTHDR(&m)->cmsg_type == SCM_RIGHTS, "no SCM_RIGHTS");
	}
	end_child();
	return ft_finish();
}
