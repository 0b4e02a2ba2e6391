/*
 * shared_counter: a parent and its child share a counter in anonymous
 * shared memory (MAP_SHARED | MAP_ANONYMOUS). The test checkpoints the
 * child alone, which ferry must refuse: restored without its parent, the
 * child would count in a private copy. After SIGUSR2 the parent asks the
 * child (SIGUSR1) to add 1000 and checks it sees the sum: both still
 * share the memory, untouched by the refused checkpoint.
 */
#define _GNU_SOURCE
#include "../conformance/ferry_test.h"
#include <sys/mman.h>
#include <sys/wait.h>

static volatile long *counter;

static void add(int sig)
{
	(void)sig;
	__atomic_add_fetch(counter, 1000, __ATOMIC_SEQ_CST);
}

int main(void)
{
	ft_init();
	counter = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (counter == MAP_FAILED)
		ft_die("mmap: %s", strerror(errno));
	*counter = 1;
	pid_t child = fork();
	if (child < 0)
		ft_die("fork: %s", strerror(errno));
	if (child == 0) {
		signal(SIGUSR1, add);
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
