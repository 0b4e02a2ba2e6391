/*
 * fd_refusals MODE: one descriptor state per mode that ferry refuses at
 * checkpoint (the guarantees test runs each). It makes the state, prints
 * READY, and after SIGUSR2 checks that the refused checkpoint left it as
 * it was.
 *
 *   mqueue         a POSIX message queue (its name unlinked), one message queued
 *   tmpfile        an O_TMPFILE file in the working directory
 *   proc_chroot    /proc/self/status opened, then chroot into the working directory
 *   nsfs           /proc/self/ns/net opened
 *   memfd_secret   a memfd_secret fd
 *   pidfd          a pidfd of itself
 *   symlink        an O_PATH|O_NOFOLLOW fd on a symbolic link
 *   packet_pipe    pipe2(O_DIRECT) with two messages queued
 *   oneshot        an EPOLLONESHOT entry on a pipe's read end that fired; after
 *                  the check closes the write end, an entry armed again would
 *                  report EPOLLHUP
 *   dnotify        fcntl(F_NOTIFY) on the working directory
 */
#define _GNU_SOURCE
#include "../conformance/ferry_test.h"
#include <mqueue.h>
#include <sys/epoll.h>
#include <sys/syscall.h>

static volatile sig_atomic_t notified;

static void on_notify(int sig)
{
	(void)sig;
	notified = 1;
}

int main(int argc, char **argv)
{
	ft_init();
	const char *mode = argc > 1 ? argv[1] : "";
	int fd = -1, fd2 = -1;
	char name[64];
	if (strcmp(mode, "mqueue") == 0) {
		struct mq_attr a = { .mq_maxmsg = 4, .mq_msgsize = 16 };
		snprintf(name, sizeof(name), "/ferry-guarantee-%d", (int)getpid());
		fd = (int)FT_SYS(mq_open(name, O_RDWR | O_CREAT | O_EXCL, 0600, &a));
		FT_SYS(mq_unlink(name));
		FT_SYS(mq_send(fd, "queued", 6, 3));
	} else if (strcmp(mode, "tmpfile") == 0) {
		fd = (int)FT_SYS(open(".", O_TMPFILE | O_RDWR, 0600));
		FT_SYS(write(fd, "tmp", 3));
	} else if (strcmp(mode, "proc_chroot") == 0) {
		fd = (int)FT_SYS(open("/proc/self/status", O_RDONLY));
		FT_SYS(chroot("."));
		FT_SYS(chdir("/"));
	} else if (strcmp(mode, "nsfs") == 0) {
		fd = (int)FT_SYS(open("/proc/self/ns/net", O_RDONLY));
	} else if (strcmp(mode, "memfd_secret") == 0) {
		fd = (int)FT_SYS(syscall(447 /* memfd_secret */, 0));
		FT_SYS(ftruncate(fd, 4096));
	} else if (strcmp(mode, "pidfd") == 0) {
		fd = (int)FT_SYS(syscall(SYS_pidfd_open, getpid(), 0));
	} else if (strcmp(mode, "symlink") == 0) {
		FT_SYS(symlink("nowhere", "link"));
		fd = (int)FT_SYS(open("link", O_PATH | O_NOFOLLOW));
	} else if (strcmp(mode, "packet_pipe") == 0) {
		int p[2];
		FT_SYS(pipe2(p, O_DIRECT));
		fd = p[0];
		fd2 = p[1];
		FT_SYS(write(fd2, "one", 3));
		FT_SYS(write(fd2, "two", 3));
	} else if (strcmp(mode, "oneshot") == 0) {
		struct epoll_event ev = { .events = EPOLLIN | EPOLLONESHOT };
		int p[2];
		fd = (int)FT_SYS(epoll_create1(0));
		FT_SYS(pipe(p));
		fd2 = p[1];
		FT_SYS(write(fd2, "x", 1));
		FT_SYS(epoll_ctl(fd, EPOLL_CTL_ADD, p[0], &ev));
		FT_EQ(epoll_wait(fd, &ev, 1, 0), 1, "the one-shot entry fires");
	} else if (strcmp(mode, "dnotify") == 0) {
		signal(SIGRTMIN, on_notify);
		fd = (int)FT_SYS(open(".", O_RDONLY | O_DIRECTORY));
		FT_SYS(fcntl(fd, F_SETSIG, SIGRTMIN));
		FT_SYS(fcntl(fd, F_NOTIFY, DN_CREATE | DN_MULTISHOT));
	} else {
		ft_die("unknown mode '%s'", mode);
	}

	ft_ready();
	ft_wait_restored();

	if (strcmp(mode, "mqueue") == 0) {
		char b[16];
		unsigned prio = 0;
		FT_EQ(mq_receive(fd, b, sizeof(b), &prio), 6, "the queued message");
		FT_EQ(prio, 3, "its priority");
	} else if (strcmp(mode, "tmpfile") == 0) {
		char b[4] = "";
		FT_EQ(pread(fd, b, 3, 0), 3, "the O_TMPFILE file's content");
	} else if (strcmp(mode, "proc_chroot") == 0) {
		char b[256];
		FT_CHECK(pread(fd, b, sizeof(b), 0) > 0, "reading /proc/self/status: %s", strerror(errno));
	} else if (strcmp(mode, "nsfs") == 0) {
		FT_SYS(setns(fd, CLONE_NEWNET));
	} else if (strcmp(mode, "memfd_secret") == 0) {
		struct stat st;
		FT_CHECK(fstat(fd, &st) == 0 && st.st_size == 4096, "memfd_secret size");
	} else if (strcmp(mode, "pidfd") == 0) {
		FT_SYS(syscall(SYS_pidfd_send_signal, fd, 0, NULL, 0));
	} else if (strcmp(mode, "symlink") == 0) {
		struct stat st;
		FT_CHECK(fstatat(fd, "", &st, AT_EMPTY_PATH) == 0 && S_ISLNK(st.st_mode), "the O_PATH fd on the link");
	} else if (strcmp(mode, "packet_pipe") == 0) {
		char b[16];
		FT_EQ(read(fd, b, sizeof(b)), 3, "the first message alone");
		FT_EQ(read(fd, b, sizeof(b)), 3, "the second message alone");
	} else if (strcmp(mode, "oneshot") == 0) {
		struct epoll_event ev;
		close(fd2);
		FT_EQ(epoll_wait(fd, &ev, 1, 0), 0, "the fired one-shot entry stays quiet (no EPOLLHUP)");
	} else if (strcmp(mode, "dnotify") == 0) {
		/* Files made in the directory meanwhile (the image) notified
		 * already. */
		ft_sleep_ms(50);
		notified = 0;
		int f = (int)FT_SYS(open("created", O_CREAT | O_WRONLY, 0600));
		close(f);
		for (int i = 0; i < 100 && !notified; i++)
			ft_sleep_ms(10);
		FT_CHECK(notified, "no dnotify signal for a file created in the directory");
	}
	return ft_finish();
}
