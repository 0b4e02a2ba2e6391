/*
 * inotify_fd: an inotify descriptor with an event queued (queued events
 * are not restored): checkpoint must refuse it by fd number and leave the
 * process unharmed (the queued event and a new one are still there).
 */
#include "../conformance/ferry_test.h"
#include <sys/inotify.h>

int main(void)
{
	ft_init();
	int in = (int)FT_SYS(inotify_init1(IN_NONBLOCK));
	FT_SYS(inotify_add_watch(in, ".", IN_CREATE));
	int q = (int)FT_SYS(open("created-before", O_CREAT | O_WRONLY, 0600));
	close(q);
	ft_ready();
	ft_wait_restored();
	int f = (int)FT_SYS(open("created-after", O_CREAT | O_WRONLY, 0600));
	close(f);
	char buf[4096];
	ssize_t n = read(in, buf, sizeof(buf));
	FT_CHECK(n > 0, "no inotify event after the refused checkpoint (read %zd)", n);
	return ft_finish();
}
