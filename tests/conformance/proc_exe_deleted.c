/*
 * proc_exe_deleted: the executable was deleted while it runs, as when a
 * package upgrade replaces a service's binary. The program copies itself
 * into its directory, runs the copy, which unlinks itself: /proc/self/exe
 * reads "PATH (deleted)". After restore: the same link (not ferry's
 * binary), the file behind it has nlink 0 and the copy's content, the
 * text mapping still runs code, and nothing reappears in the directory.
 */
#include "ferry_test.h"
#include <sys/sendfile.h>

#define COPY "exe-copy"

static void copy_self(void)
{
	int in = (int)FT_SYS(open("/proc/self/exe", O_RDONLY));
	struct stat st;
	FT_SYS(fstat(in, &st));
	int out = (int)FT_SYS(open(COPY, O_WRONLY | O_CREAT | O_TRUNC, 0755));
	off_t off = 0;
	while (off < st.st_size)
		if (sendfile(out, in, &off, (size_t)(st.st_size - off)) <= 0)
			ft_die("sendfile: %s", strerror(errno));
	close(in);
	close(out);
}

int main(int argc, char **argv)
{
	ft_init();
	if (argc < 2 || strcmp(argv[1], "copy") != 0) {
		copy_self();
		char *args[] = { COPY, "copy", NULL };
		execv(COPY, args);
		ft_die("exec %s: %s", COPY, strerror(errno));
	}
	struct stat before;
	FT_SYS(stat("/proc/self/exe", &before));
	FT_SYS(unlink(COPY));
	char link_before[4096] = "";
	FT_SYS(readlink("/proc/self/exe", link_before, sizeof(link_before) - 1));
	ft_log("exe %s", link_before);

	ft_ready();
	ft_wait_restored();

	char link_after[4096] = "";
	FT_SYS(readlink("/proc/self/exe", link_after, sizeof(link_after) - 1));
	FT_CHECK(strcmp(link_after, link_before) == 0, "exe link '%s', was '%s'", link_after, link_before);
	struct stat after;
	FT_SYS(stat("/proc/self/exe", &after));
	FT_EQ(after.st_nlink, 0, "exe nlink");
	FT_EQ(after.st_size, before.st_size, "exe size");
	FT_CHECK((after.st_mode & 07777) == (before.st_mode & 07777), "exe mode %o, was %o", after.st_mode & 07777,
		 before.st_mode & 07777);
	FT_CHECK(access(COPY, F_OK) != 0 && errno == ENOENT, COPY " exists again");
	return ft_finish();
}
