/*
 * shared_counter [files]: a parent and its child share a counter in
 * anonymous shared memory (MAP_SHARED | MAP_ANONYMOUS), or, with
 * `files`, their fd table (clone with CLONE_FILES, no shared memory).
 * The test checkpoints the child alone, which ferry must refuse: restored
 * without its parent, the child would have a private copy. After SIGUSR2
 * the parent checks that both still share: the child adds 1000 to the
 * counter (SIGUSR1) and the parent sees the sum; or the parent opens a
 * descriptor and the child, asked with SIGUSR1, finds it in its table.
 */
#define _GNU_SOURCE
#include "../conformance/ferry_test.h"
#include <sys/mman.h>
#include <sys/wait.h>

static volatile long *counter;
static int probe_fd = -1;

static void add(int sig)
{
	(void)sig;
	__atomic_add_fetch(counter, 1000, __ATOMIC_SEQ_CST);
}

/* In the child: exits 0 if the descriptor the parent opened is here. */
static void probe(int sig)
{
	(void)sig;
	_exit(fcntl(probe_fd, F_GETFD) == -1 ? 1 : 0);
}

static int child_fn(void *arg)
{
	(void)arg;
	alarm(60);
	for (;;)
		pause();
	return 0;
}

/* The fd-table variant: the child shares its parent's table. */
static int shared_files(void)
{
	static char stack[65536] __attribute__((aligned(16)));
	probe_fd = 200;
	/* Set before the clone: a child not yet run when SIGUSR1 comes
	 * (a loaded machine) must not die of it. */
	signal(SIGUSR1, probe);
	pid_t child = clone(child_fn, stack + sizeof(stack), CLONE_FILES | SIGCHLD, NULL);
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

int main(int argc, char **argv)
{
	ft_init();
	if (argc > 1 && strcmp(argv[1], "files") == 0)
		return shared_files();
	counter = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (counter == MAP_FAILED)
		ft_die("mmap: %s", strerror(errno));
	*counter = 1;
	/* Inherited: the child may not have run yet when SIGUSR1 comes. */
	signal(SIGUSR1, add);
	pid_t child = fork();
	if (child < 0)
		ft_die("fork: %s", strerror(errno));
	if (child == 0) {
		alarm(60);
		for (;;)
			pause();
	}
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
	return ft_finish();
}
