/*
 * proc_autogroup_nice: a session leader (setsid) sets the nice value of
 * its scheduling autogroup to 5 (/proc/self/autogroup) and forks a child
 * in its session. After restore both are again in one autogroup, of nice
 * 5 (a restored session leader's setsid makes a new one of nice 0).
 * Passes with nothing to check without CONFIG_SCHED_AUTOGROUP.
 */
#include "ferry_test.h"

/* "/autogroup-ID nice N": ID and N, or -1 when unreadable. */
static long group_of(const char *path, int *nice)
{
	char b[64] = "";
	long id = -1;
	*nice = -99;
	if (ft_read_file(path, b, sizeof(b)) <= 0 || sscanf(b, "/autogroup-%ld nice %d", &id, nice) != 2)
		return -1;
	return id;
}

int main(void)
{
	ft_init();
	int nice;
	if (group_of("/proc/self/autogroup", &nice) < 0) {
		ft_log("no /proc/self/autogroup (CONFIG_SCHED_AUTOGROUP off): nothing to test");
		ft_ready();
		ft_wait_restored();
		return ft_finish();
	}
	if (getsid(0) != getpid())
		FT_SYS(setsid());
	int fd = (int)FT_SYS(open("/proc/self/autogroup", O_WRONLY));
	FT_EQ(write(fd, "5", 1), 1, "writing the autogroup nice value");
	close(fd);
	pid_t child = fork();
	if (child == 0) {
		alarm(120);
		for (;;)
			pause();
	}
	FT_SYS(child);
	ft_ready();
	ft_wait_restored();
	long mine = group_of("/proc/self/autogroup", &nice);
	FT_EQ(nice, 5, "the autogroup's nice value");
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/autogroup", (int)child);
	int child_nice;
	long theirs = group_of(path, &child_nice);
	FT_CHECK(mine >= 0 && theirs == mine, "the child's autogroup %ld, the leader's %ld", theirs, mine);
	FT_EQ(child_nice, 5, "the child's autogroup nice value");
	kill(child, SIGKILL);
	waitpid(child, NULL, 0);
	return ft_finish();
}
