/*
 * fd_inotify: an inotify instance (IN_NONBLOCK) with watches on the test
 * directory (IN_CREATE | IN_DELETE), on a file (IN_MODIFY) and, after a
 * watch that was removed again (a gap in the descriptors; its IN_IGNORED
 * event is read before READY), on a subdirectory (IN_ALL_EVENTS). After
 * restore: the same "inotify wd:... mask:..." in fdinfo, O_NONBLOCK kept,
 * no event queued, and creating a file, writing the file and touching the
 * subdirectory each produce an event with the old watch descriptor.
 */
#include "ferry_test.h"
#include <sys/inotify.h>
#include <sys/ioctl.h>

/* wd and mask of every watch in fdinfo, as text. */
static void watches(int fd, char *out, size_t n)
{
	char path[64], buf[8192];
	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", fd);
	out[0] = 0;
	if (ft_read_file(path, buf, sizeof(buf)) < 0)
		return;
	size_t len = 0;
	for (char *p = strstr(buf, "inotify wd:"); p; p = strstr(p + 1, "inotify wd:")) {
		char *ino = strstr(p, " ino:");
		char *mask = strstr(p, " mask:");
		char *end = mask ? strchr(mask + 1, ' ') : NULL;
		if (!ino || !end)
			break;
		len += (size_t)snprintf(out + len, n - len, "[%.*s%.*s]", (int)(ino - p), p, (int)(end - mask), mask);
		if (len >= n)
			break;
	}
}

static int wait_event(int fd, int wd, uint32_t mask)
{
	char buf[4096] __attribute__((aligned(8)));
	for (int i = 0; i < 200; i++) {
		ssize_t n = read(fd, buf, sizeof(buf));
		for (ssize_t off = 0; n > 0 && off < n;) {
			struct inotify_event *e = (struct inotify_event *)(buf + off);
			if (e->wd == wd && (e->mask & mask))
				return 1;
			off += (ssize_t)sizeof(*e) + e->len;
		}
		ft_sleep_ms(10);
	}
	return 0;
}

int main(void)
{
	ft_init();
	FT_SYS(mkdir("sub", 0755));
	int f = (int)FT_SYS(open("watched.txt", O_RDWR | O_CREAT | O_TRUNC, 0600));
	int in = (int)FT_SYS(inotify_init1(IN_NONBLOCK));
	int w1 = (int)FT_SYS(inotify_add_watch(in, ".", IN_CREATE | IN_DELETE));
	int w2 = (int)FT_SYS(inotify_add_watch(in, "watched.txt", IN_MODIFY));
	int gone = (int)FT_SYS(inotify_add_watch(in, "/", IN_ATTRIB));
	FT_SYS(inotify_rm_watch(in, gone));
	int w3 = (int)FT_SYS(inotify_add_watch(in, "sub", IN_ALL_EVENTS));
	char junk[4096];
	while (read(in, junk, sizeof(junk)) > 0)
		;
	char before[1024];
	watches(in, before, sizeof(before));
	ft_log("watches %s", before);

	ft_ready();
	ft_wait_restored();

	char after[1024];
	watches(in, after, sizeof(after));
	FT_CHECK(strcmp(before, after) == 0, "watches %s -> %s", before, after);
	FT_CHECK(fcntl(in, F_GETFL) & O_NONBLOCK, "O_NONBLOCK lost");
	int q = -1;
	ioctl(in, FIONREAD, &q);
	FT_EQ(q, 0, "bytes queued right after restore");
	int c = (int)FT_SYS(open("created-after", O_CREAT | O_WRONLY, 0600));
	close(c);
	FT_CHECK(wait_event(in, w1, IN_CREATE), "no IN_CREATE for wd %d", w1);
	FT_SYS(write(f, "x", 1));
	FT_CHECK(wait_event(in, w2, IN_MODIFY), "no IN_MODIFY for wd %d", w2);
	c = (int)FT_SYS(open("sub/inner", O_CREAT | O_WRONLY, 0600));
	close(c);
	FT_CHECK(wait_event(in, w3, IN_CREATE), "no IN_CREATE for wd %d (sub)", w3);
	return ft_finish();
}
