/*
 * fd_inotify_deleted: an inotify watch on a file that was unlinked while
 * the process still holds it open (zdtm inotify00). A directory and a
 * file in it are watched for IN_DELETE | IN_CLOSE_WRITE | IN_DELETE_SELF
 * | IN_CREATE; the file, open O_RDWR with some content, is unlinked and
 * the IN_DELETE this queues is read. After restore: nothing is queued
 * (the restore itself made no events), fdinfo shows both watches with
 * their descriptors and masks, the file watch is on the inode of the
 * restored fd (still nlink 0, same content); closing the fd gives exactly
 * the events it gave without a checkpoint (IN_CLOSE_WRITE on both
 * watches, then IN_DELETE_SELF and IN_IGNORED on the file's), and a file
 * created in the directory afterwards gives IN_CREATE and IN_CLOSE_WRITE.
 */
#include "ferry_test.h"
#include <sys/inotify.h>
#include <sys/ioctl.h>

#define DIR_NAME "watched"
#define FILE_NAME "removed"
#define PATH DIR_NAME "/" FILE_NAME
#define CONTENT "inotify on a deleted file"
#define MASK (IN_DELETE | IN_CLOSE_WRITE | IN_DELETE_SELF | IN_CREATE)

struct ev {
	int wd;
	unsigned mask;
	char name[32];
};

/* Reads every queued event (non-blocking instance) into out; count. */
static int read_events(int fd, struct ev *out, int max)
{
	char buf[4096] __attribute__((aligned(8)));
	int n = 0;
	for (;;) {
		ssize_t r = read(fd, buf, sizeof(buf));
		if (r <= 0)
			return n;
		for (char *p = buf; p < buf + r;) {
			struct inotify_event *e = (struct inotify_event *)p;
			if (n < max) {
				out[n].wd = e->wd;
				out[n].mask = e->mask;
				snprintf(out[n].name, sizeof(out[n].name), "%s", e->len ? e->name : "");
			}
			n++;
			p += sizeof(*e) + e->len;
		}
	}
}

static void expect_events(const char *when, int fd, const struct ev *want, int n)
{
	struct ev got[16];
	int k = read_events(fd, got, 16);
	FT_CHECK(k == n, "%s: %d events, expected %d", when, k, n);
	for (int i = 0; i < k && i < n; i++)
		FT_CHECK(got[i].wd == want[i].wd && got[i].mask == want[i].mask && strcmp(got[i].name, want[i].name) == 0,
			 "%s: event %d is wd %d mask %#x name '%s', expected wd %d mask %#x name '%s'", when, i, got[i].wd,
			 got[i].mask, got[i].name, want[i].wd, want[i].mask, want[i].name);
}

/* The watch with descriptor wd in fdinfo: its inode and mask; 0 if found. */
static int watch_of(int fd, int wd, unsigned long *ino, unsigned *mask)
{
	char path[64], buf[4096];
	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", fd);
	if (ft_read_file(path, buf, sizeof(buf)) < 0)
		return -1;
	for (char *l = strstr(buf, "inotify wd:"); l; l = strstr(l + 1, "inotify wd:")) {
		int w;
		unsigned long i;
		unsigned sdev, m;
		if (sscanf(l, "inotify wd:%d ino:%lx sdev:%x mask:%x", &w, &i, &sdev, &m) == 4 && w == wd) {
			*ino = i;
			*mask = m;
			return 0;
		}
	}
	return -1;
}

int main(void)
{
	ft_init();
	FT_SYS(mkdir(DIR_NAME, 0755));
	int in = (int)FT_SYS(inotify_init1(IN_NONBLOCK));
	int real = (int)FT_SYS(open(PATH, O_CREAT | O_TRUNC | O_RDWR, 0644));
	ft_write_all(real, CONTENT, sizeof(CONTENT) - 1);
	int wd_dir = (int)FT_SYS(inotify_add_watch(in, DIR_NAME, MASK));
	int wd_file = (int)FT_SYS(inotify_add_watch(in, PATH, MASK));
	FT_SYS(unlink(PATH));
	struct ev unlinked[] = { { wd_dir, IN_DELETE, FILE_NAME } };
	expect_events("unlink", in, unlinked, 1);
	if (ft_failures)
		ft_die("setup failed");

	ft_ready();
	ft_wait_restored();

	int queued = -1;
	FT_CHECK(ioctl(in, FIONREAD, &queued) == 0 && queued == 0, "%d bytes of events queued after restore", queued);
	struct stat st;
	FT_SYS(fstat(real, &st));
	FT_CHECK(st.st_nlink == 0, "the open file has %lu links, expected 0 (deleted)", (unsigned long)st.st_nlink);
	char buf[64] = "";
	FT_CHECK(pread(real, buf, sizeof(buf), 0) == sizeof(CONTENT) - 1 && memcmp(buf, CONTENT, sizeof(CONTENT) - 1) == 0,
		 "content of the deleted file");
	FT_CHECK(access(PATH, F_OK) != 0 && errno == ENOENT, PATH " exists again");
	unsigned long ino = 0;
	unsigned mask = 0;
	FT_CHECK(watch_of(in, wd_file, &ino, &mask) == 0, "no watch %d in fdinfo", wd_file);
	FT_CHECK(ino == st.st_ino, "watch %d is on inode %lu, the open deleted file is %lu", wd_file, ino,
		 (unsigned long)st.st_ino);
	FT_CHECK(mask == MASK, "watch %d mask %#x, expected %#x", wd_file, mask, MASK);
	FT_CHECK(watch_of(in, wd_dir, &ino, &mask) == 0 && mask == MASK, "directory watch %d: mask %#x", wd_dir, mask);

	FT_SYS(close(real));
	struct ev closed[] = {
		{ wd_dir, IN_CLOSE_WRITE, FILE_NAME },
		{ wd_file, IN_CLOSE_WRITE, "" },
		{ wd_file, IN_DELETE_SELF, "" },
		{ wd_file, IN_IGNORED, "" },
	};
	expect_events("close", in, closed, 4);

	real = (int)FT_SYS(open(PATH, O_CREAT | O_TRUNC | O_RDWR, 0644));
	FT_SYS(close(real));
	struct ev created[] = { { wd_dir, IN_CREATE, FILE_NAME }, { wd_dir, IN_CLOSE_WRITE, FILE_NAME } };
	expect_events("create", in, created, 2);
	unlink(PATH);
	rmdir(DIR_NAME);
	return ft_finish();
}
