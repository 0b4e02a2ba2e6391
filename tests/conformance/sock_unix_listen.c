/*
 * sock_unix_listen: a listening AF_UNIX stream socket bound to the path
 * "srv.sock" in the test dir, one bound in the abstract namespace
 * ("\0ferry-conf-<pid>"), and an AF_UNIX datagram socket bound to
 * "dgram.sock". After restore: getsockname returns the same addresses, the
 * socket files still exist, connecting by path / abstract name works and
 * accept returns the connection, and a datagram sent to "dgram.sock" is
 * received.
 */
#include "ferry_test.h"
#include <stddef.h>
#include <sys/socket.h>
#include <sys/un.h>

static socklen_t mkaddr(struct sockaddr_un *a, const char *path, int abstract)
{
	memset(a, 0, sizeof(*a));
	a->sun_family = AF_UNIX;
	if (abstract) {
		a->sun_path[0] = 0;
		memcpy(a->sun_path + 1, path, strlen(path));
		return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(path));
	}
	strcpy(a->sun_path, path);
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(path) + 1);
}

static void check_listener(int l, const struct sockaddr_un *a, socklen_t al, const char *what)
{
	struct sockaddr_un g;
	socklen_t gl = sizeof(g);
	FT_SYS(getsockname(l, (struct sockaddr *)&g, &gl));
	FT_CHECK(gl == al && memcmp(&g, a, al) == 0, "%s: getsockname differs (len %u vs %u)", what, gl, al);
	int c = socket(AF_UNIX, SOCK_STREAM, 0);
	if (connect(c, (const struct sockaddr *)a, al) != 0) {
		ft_fail("%s: connect: %s", what, strerror(errno));
		close(c);
		return;
	}
	int s = accept(l, NULL, NULL);
	FT_CHECK(s >= 0, "%s: accept: %s", what, strerror(errno));
	if (s >= 0) {
		char b[8] = { 0 };
		send(c, "hi", 2, 0);
		FT_CHECK(recv(s, b, 2, MSG_WAITALL) == 2 && memcmp(b, "hi", 2) == 0, "%s: data", what);
		close(s);
	}
	close(c);
}

int main(void)
{
	ft_init();
	struct sockaddr_un pa, aa, da;
	char abs_name[64];
	snprintf(abs_name, sizeof(abs_name), "ferry-conf-%d", (int)getpid());
	socklen_t pl = mkaddr(&pa, "srv.sock", 0), al = mkaddr(&aa, abs_name, 1), dl = mkaddr(&da, "dgram.sock", 0);
	int lp = (int)FT_SYS(socket(AF_UNIX, SOCK_STREAM, 0));
	FT_SYS(bind(lp, (struct sockaddr *)&pa, pl));
	FT_SYS(listen(lp, 4));
	int la = (int)FT_SYS(socket(AF_UNIX, SOCK_STREAM, 0));
	FT_SYS(bind(la, (struct sockaddr *)&aa, al));
	FT_SYS(listen(la, 4));
	int d = (int)FT_SYS(socket(AF_UNIX, SOCK_DGRAM, 0));
	FT_SYS(bind(d, (struct sockaddr *)&da, dl));
	struct stat st0;
	FT_SYS(stat("srv.sock", &st0));

	ft_ready();
	ft_wait_restored();

	struct stat st;
	FT_CHECK(stat("srv.sock", &st) == 0 && S_ISSOCK(st.st_mode), "srv.sock missing or not a socket");
	/* getsockname of a path socket reports the path given to bind() */
	check_listener(lp, &pa, pl, "path listener");
	check_listener(la, &aa, al, "abstract listener");
	int c = socket(AF_UNIX, SOCK_DGRAM, 0);
	FT_EQ(sendto(c, "datagram", 8, 0, (struct sockaddr *)&da, dl), 8, "sendto dgram.sock");
	char b[16] = { 0 };
	FT_EQ(recv(d, b, sizeof(b), MSG_DONTWAIT), 8, "recv on dgram.sock");
	return ft_finish();
}
