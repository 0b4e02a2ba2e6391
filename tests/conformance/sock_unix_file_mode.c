/*
 * sock_unix_file_mode: the socket files of unix sockets bound to paths
 * keep their permission bits and owner (zdtm sockets00): a listener bound
 * to "mode.sock" (chmod 0640, chown 18943:58467), a datagram socket bound
 * to "mode.dg" (chmod 0604, chown 1000:1001), both in the test dir.
 * After restore: same mode and owner, still sockets, and the listener
 * still accepts a connection by path.
 */
#include "ferry_test.h"
#include <stddef.h>
#include <sys/socket.h>
#include <sys/un.h>

static socklen_t mkaddr(struct sockaddr_un *a, const char *path)
{
	memset(a, 0, sizeof(*a));
	a->sun_family = AF_UNIX;
	strcpy(a->sun_path, path);
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(path) + 1);
}

static void check_file(const char *path, const struct stat *was)
{
	struct stat st;
	if (stat(path, &st) != 0) {
		ft_fail("%s: stat: %s", path, strerror(errno));
		return;
	}
	FT_CHECK(S_ISSOCK(st.st_mode), "%s is not a socket any more", path);
	FT_CHECK((st.st_mode & 07777) == (was->st_mode & 07777), "%s: mode %o, was %o", path, st.st_mode & 07777,
		 was->st_mode & 07777);
	FT_CHECK(st.st_uid == was->st_uid && st.st_gid == was->st_gid, "%s: owner %u:%u, was %u:%u", path, st.st_uid,
		 st.st_gid, was->st_uid, was->st_gid);
}

int main(void)
{
	ft_init();
	unlink("mode.sock");
	unlink("mode.dg");
	struct sockaddr_un la, da;
	socklen_t ll = mkaddr(&la, "mode.sock"), dl = mkaddr(&da, "mode.dg");
	int l = (int)FT_SYS(socket(AF_UNIX, SOCK_STREAM, 0));
	FT_SYS(bind(l, (struct sockaddr *)&la, ll));
	FT_SYS(chmod("mode.sock", 0640));
	FT_SYS(chown("mode.sock", 18943, 58467));
	FT_SYS(listen(l, 4));
	int d = (int)FT_SYS(socket(AF_UNIX, SOCK_DGRAM, 0));
	FT_SYS(bind(d, (struct sockaddr *)&da, dl));
	FT_SYS(chmod("mode.dg", 0604));
	FT_SYS(chown("mode.dg", 1000, 1001));
	struct stat ls, ds;
	FT_SYS(stat("mode.sock", &ls));
	FT_SYS(stat("mode.dg", &ds));

	ft_ready();
	ft_wait_restored();

	check_file("mode.sock", &ls);
	check_file("mode.dg", &ds);
	int c = socket(AF_UNIX, SOCK_STREAM, 0);
	if (connect(c, (struct sockaddr *)&la, ll) != 0) {
		ft_fail("connect to mode.sock: %s", strerror(errno));
	} else {
		int a = accept(l, NULL, NULL);
		FT_CHECK(a >= 0, "accept on mode.sock: %s", strerror(errno));
		if (a >= 0)
			close(a);
	}
	close(c);
	unlink("mode.sock");
	unlink("mode.dg");
	return ft_finish();
}
