/*
 * tree_fdt_shared: one fd table shared by a subtree (zdtm fdt_shared).
 * The root clones A and B with CLONE_FILES (no CLONE_THREAD); A clones
 * A1 with CLONE_FILES and A2 without. Root, A, B and A1 share one table;
 * A2 has its own copy. After restore the root opens a file, writes to it
 * and dup2()s it to fd 128, then sends each child its go: A, B and A1
 * read the file through fd 128, A2 finds fd 128 closed (EBADF); B puts
 * /dev/null on fd 129 and A2 on fd 130; the root then has 129 and not
 * 130, and closes 128, which A then no longer has. A reaps A1 and A2.
 *
 * Synchronisation: one pipe made before the clones (so it is in every
 * table): each child writes its record when ready and one byte when its
 * checks are done (the ft_tree_* helpers would close their pipe in a
 * shared table); A gets a second go once the root closed fd 128.
 */
#include "ferry_test.h"
#include <sched.h>

#define TEST_FD 128
#define B_FD 129
#define A2_FD 130
#define TEXT "fdt-shared"

enum who { A, B, A1, A2, N_WHO };
static const char *names[N_WHO] = { "A", "B", "A1", "A2" };

struct record {
	int who;
	pid_t pid;
};

static int rep[2];
static char stacks[N_WHO][65536] __attribute__((aligned(16)));

static void child_begin(enum who w)
{
	ft_failures = 0;
	ft_start_ticks = ft_proc_start_ticks();
	ft_ready_done = 1;
	alarm(FT_TREE_GO_S);
	struct record r = { w, getpid() };
	ft_write_all(rep[1], (char *)&r, sizeof(r));
	ft_child_wait_go();
}

static void reads_test_fd(const char *who)
{
	char buf[sizeof(TEXT)] = "";
	ssize_t n = pread(TEST_FD, buf, sizeof(TEXT) - 1, 0);
	FT_CHECK(n == sizeof(TEXT) - 1 && memcmp(buf, TEXT, n) == 0, "%s: pread(fd %d) the root opened: %zd (%s)", who,
		 TEST_FD, n, n < 0 ? strerror(errno) : "short or wrong");
}

static void done(const char *who)
{
	ft_write_all(rep[1], "d", 1);
	ft_child_exit(who);
}

static int simple_child(void *arg)
{
	enum who w = (enum who)(long)arg;
	child_begin(w);
	if (w == A2) {
		FT_CHECK(fcntl(TEST_FD, F_GETFD) < 0 && errno == EBADF,
			 "A2 (own table): fd %d the root opened after the clone is here", TEST_FD);
		int n = (int)FT_SYS(open("/dev/null", O_RDONLY));
		FT_SYS(dup2(n, A2_FD));
		close(n);
	} else {
		reads_test_fd(names[w]);
		if (w == B) {
			int n = (int)FT_SYS(open("/dev/null", O_RDONLY));
			FT_SYS(dup2(n, B_FD));
			close(n);
		}
	}
	done(names[w]);
	return 0;
}

static pid_t clone_child(enum who w, int flags)
{
	pid_t p = clone(simple_child, stacks[w] + sizeof(stacks[w]), flags | SIGCHLD, (void *)(long)w);
	if (p < 0)
		ft_die("clone %s: %s", names[w], strerror(errno));
	return p;
}

static int child_a(void *arg)
{
	(void)arg;
	pid_t a1 = clone_child(A1, CLONE_FILES);
	pid_t a2 = clone_child(A2, 0);
	child_begin(A);
	reads_test_fd("A");
	/* The root closes TEST_FD once every child reported, then a second go. */
	ft_write_all(rep[1], "d", 1);
	ft_child_wait_go();
	FT_CHECK(fcntl(TEST_FD, F_GETFD) < 0 && errno == EBADF, "A: fd %d the root closed is still here", TEST_FD);
	ft_reap(a1, "A1");
	ft_reap(a2, "A2");
	ft_child_exit("A");
}

int main(void)
{
	ft_init();
	FT_SYS(pipe(rep));
	pid_t a = clone(child_a, stacks[A] + sizeof(stacks[A]), CLONE_FILES | SIGCHLD, NULL);
	if (a < 0)
		ft_die("clone A: %s", strerror(errno));
	pid_t b = clone_child(B, CLONE_FILES);
	alarm(FT_TREE_SETUP_S);
	pid_t pid[N_WHO] = { 0 };
	for (int i = 0; i < N_WHO; i++) {
		struct record r;
		if (read(rep[0], &r, sizeof(r)) != sizeof(r) || r.who < 0 || r.who >= N_WHO)
			ft_die("no record from a child");
		pid[r.who] = r.pid;
	}
	alarm(0);
	if (pid[A] != a || pid[B] != b)
		ft_die("records: A %d (%d) B %d (%d)", (int)pid[A], (int)a, (int)pid[B], (int)b);
	ft_log("A %d B %d A1 %d A2 %d", (int)pid[A], (int)pid[B], (int)pid[A1], (int)pid[A2]);

	ft_ready();
	ft_tree_wait_restored();

	int fd = (int)FT_SYS(open("fdt_shared.txt", O_RDWR | O_CREAT | O_TRUNC, 0600));
	ft_write_all(fd, TEXT, sizeof(TEXT) - 1);
	FT_SYS(dup2(fd, TEST_FD));
	close(fd);
	for (int i = 0; i < N_WHO; i++)
		ft_go(pid[i], names[i]);
	for (int i = 0; i < N_WHO; i++) {
		char c;
		if (read(rep[0], &c, 1) != 1 || c != 'd') {
			ft_fail("a child did not report");
			break;
		}
	}
	FT_CHECK(fcntl(B_FD, F_GETFD) >= 0, "fd %d B opened is not in the root's table", B_FD);
	FT_CHECK(fcntl(A2_FD, F_GETFD) < 0 && errno == EBADF, "fd %d A2 opened in its own table is in the root's",
		 A2_FD);
	FT_SYS(close(TEST_FD));
	ft_go(a, "A (fd closed)");
	ft_reap(b, "B");
	ft_reap(a, "A");
	return ft_finish();
}
