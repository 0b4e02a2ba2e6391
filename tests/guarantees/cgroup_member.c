/*
 * cgroup_member MEMORY_CGROUP THREAD_CGROUP CGROUP...
 *
 * Moves itself into every CGROUP directory given (cgroup.procs), then
 * fills 32 MiB with a pattern and prints READY. With THREAD_CGROUP (not
 * "-"), a second thread is moved alone into that v1 cgroup (its tasks
 * file) first. After SIGUSR2: the memory is intact, /proc/self/cgroup
 * reads as it did before READY and, with MEMORY_CGROUP (not "-"), that
 * memory cgroup is charged at least the 32 MiB (the memory was written
 * after the process joined it).
 */
#define _GNU_SOURCE
#include "../conformance/ferry_test.h"
#include <pthread.h>
#include <sys/mman.h>

#define MEM (32L << 20)

static volatile pid_t thread_tid;

static void *idle(void *arg)
{
	(void)arg;
	thread_tid = (pid_t)syscall(SYS_gettid);
	for (;;)
		pause();
	return NULL;
}

static void write_file(const char *dir, const char *name, long value)
{
	char path[4096], buf[32];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	int fd = open(path, O_WRONLY);
	if (fd < 0)
		ft_die("open %s: %s", path, strerror(errno));
	int n = snprintf(buf, sizeof(buf), "%ld", value);
	if (write(fd, buf, (size_t)n) != n)
		ft_die("write %s: %s", path, strerror(errno));
	close(fd);
}

static long read_number(const char *dir, const char *name)
{
	char path[4096], buf[64] = { 0 };
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	int fd = open(path, O_RDONLY);
	if (fd < 0)
		return -1;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	return n > 0 ? atol(buf) : -1;
}

static ssize_t read_self_cgroup(char *buf, size_t size)
{
	int fd = (int)FT_SYS(open("/proc/self/cgroup", O_RDONLY));
	ssize_t n = read(fd, buf, size - 1);
	close(fd);
	if (n < 0)
		ft_die("read /proc/self/cgroup: %s", strerror(errno));
	buf[n] = 0;
	return n;
}

int main(int argc, char **argv)
{
	ft_init();
	if (argc < 3)
		ft_die("usage: cgroup_member MEMORY_CGROUP THREAD_CGROUP CGROUP...");
	for (int i = 3; i < argc; i++)
		write_file(argv[i], "cgroup.procs", getpid());
	if (strcmp(argv[2], "-") != 0) {
		pthread_t t;
		if (pthread_create(&t, NULL, idle, NULL))
			ft_die("pthread_create");
		while (!thread_tid)
			usleep(1000);
		write_file(argv[2], "tasks", thread_tid);
	}
	static char before[8192], after[8192];
	read_self_cgroup(before, sizeof(before));
	unsigned char *m = mmap(NULL, MEM, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		ft_die("mmap: %s", strerror(errno));
	for (long i = 0; i < MEM; i++)
		m[i] = (unsigned char)(i * 31 + i / 4096);

	ft_ready();
	ft_wait_restored();

	long bad = 0;
	for (long i = 0; i < MEM; i++)
		bad += m[i] != (unsigned char)(i * 31 + i / 4096);
	FT_EQ(bad, 0, "bytes changed");
	read_self_cgroup(after, sizeof(after));
	FT_CHECK(strcmp(before, after) == 0, "cgroups differ: before\n%s\nafter\n%s", before, after);
	if (strcmp(argv[1], "-") != 0) {
		long used = read_number(argv[1], "memory.usage_in_bytes");
		if (used < 0)
			used = read_number(argv[1], "memory.current");
		FT_CHECK(used >= MEM, "memory cgroup %s is charged %ld bytes, less than the %ld the process wrote", argv[1], used, MEM);
	}
	return ft_finish();
}
