/*
 * tree_proc_file: the root holds its child's /proc/CHILD/stat open (like a
 * supervisor watching a worker) at offset 3, and /proc/CHILD/status
 * without O_CLOEXEC. After restore both fds are open, pread of stat
 * starts with the child's PID and shows it alive, the offset is kept,
 * status names the child, and the flags are as before.
 */
#include "ferry_test.h"

int main(void)
{
	ft_init();
	ft_tree_begin();
	pid_t c = ft_fork();
	if (c == 0) {
		ft_child_ready();
		ft_child_wait_go();
		ft_child_exit("child");
	}
	ft_tree_wait_ready(1);
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)c);
	int st = (int)FT_SYS(open(path, O_RDONLY | O_CLOEXEC));
	snprintf(path, sizeof(path), "/proc/%d/status", (int)c);
	int stt = (int)FT_SYS(open(path, O_RDONLY));
	FT_SYS(lseek(st, 3, SEEK_SET));

	ft_ready();
	ft_tree_wait_restored();

	char buf[1024] = "", want[32];
	FT_CHECK(pread(st, buf, sizeof(buf) - 1, 0) > 0, "pread /proc/CHILD/stat: %s", strerror(errno));
	snprintf(want, sizeof(want), "%d (", (int)c);
	FT_CHECK(strncmp(buf, want, strlen(want)) == 0, "stat starts with '%.20s', expected '%s'", buf, want);
	char *p = strrchr(buf, ')');
	FT_CHECK(p && (p[2] == 'S' || p[2] == 'R'), "child state '%c'", p ? p[2] : '?');
	FT_EQ(lseek(st, 0, SEEK_CUR), 3, "offset of the stat fd");
	FT_CHECK(fcntl(st, F_GETFD) == FD_CLOEXEC, "stat fd lost FD_CLOEXEC");
	FT_EQ(fcntl(stt, F_GETFD), 0, "status fd flags");
	memset(buf, 0, sizeof(buf));
	FT_CHECK(pread(stt, buf, sizeof(buf) - 1, 0) > 0 && strstr(buf, "tree_proc_file"), "status does not name the child: '%.40s'", buf);
	ft_go(c, "child");
	ft_reap(c, "child");
	return ft_finish();
}
