/*
 * sock_unix_unconnected: unix stream sockets that are neither connected
 * nor listening (zdtm sk-unix-unconn): one bound to an abstract name, one
 * bound to a path in the test dir, one never bound. After restore the
 * bound ones keep their names and are still not listening (connect to
 * them is refused), then each can listen() and accept a connection from
 * the unbound one (which can still connect at all).
 */
#include "ferry_test.h"
#include <stddef.h>
#include <sys/socket.h>
#include <sys/un.h>

static socklen_t addr_of(const char *name, int abstract, struct sockaddr_un *a)
{
	memset(a, 0, sizeof(*a));
	a->sun_family = AF_UNIX;
	snprintf(a->sun_path + (abstract ? 1 : 0), sizeof(a->sun_path) - 1, "%s", name);
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(name) + 1);
}

static void check(int s, const char *name, int abstract)
{
	struct sockaddr_un want, got;
	socklen_t wl = addr_of(name, abstract, &want), gl = sizeof(got);
	memset(&got, 0, sizeof(got));
	FT_SYS(getsockname(s, (struct sockaddr *)&got, &gl));
	FT_CHECK(gl == wl && memcmp(&got, &want, wl) == 0, "%s: bound name changed", name);
	int acc = -1;
	socklen_t al = sizeof(acc);
	FT_SYS(getsockopt(s, SOL_SOCKET, SO_ACCEPTCONN, &acc, &al));
	FT_EQ(acc, 0, "SO_ACCEPTCONN of a bound, not listening socket");
	int c = (int)FT_SYS(socket(AF_UNIX, SOCK_STREAM, 0));
	FT_CHECK(connect(c, (struct sockaddr *)&want, wl) != 0 && errno == ECONNREFUSED,
		 "%s: connect before listen did not fail with ECONNREFUSED (%s)", name, strerror(errno));
	close(c);
	FT_SYS(listen(s, 1));
	c = (int)FT_SYS(socket(AF_UNIX, SOCK_STREAM, 0));
	FT_CHECK(connect(c, (struct sockaddr *)&want, wl) == 0, "%s: connect after listen: %s", name, strerror(errno));
	int a = accept(s, NULL, NULL);
	FT_CHECK(a >= 0, "%s: accept: %s", name, strerror(errno));
	FT_CHECK(write(c, "x", 1) == 1 && a >= 0 && read(a, &acc, 1) == 1, "%s: data over the new connection", name);
	close(c);
	if (a >= 0)
		close(a);
}

int main(void)
{
	ft_init();
	char abs_name[64];
	snprintf(abs_name, sizeof(abs_name), "ferry-unconn-%d", (int)getpid());
	struct sockaddr_un a;
	int sa = (int)FT_SYS(socket(AF_UNIX, SOCK_STREAM, 0));
	FT_SYS(bind(sa, (struct sockaddr *)&a, addr_of(abs_name, 1, &a)));
	int sp = (int)FT_SYS(socket(AF_UNIX, SOCK_STREAM, 0));
	FT_SYS(bind(sp, (struct sockaddr *)&a, addr_of("unconn.sock", 0, &a)));
	int su = (int)FT_SYS(socket(AF_UNIX, SOCK_STREAM, 0));

	ft_ready();
	ft_wait_restored();

	check(sa, abs_name, 1);
	check(sp, "unconn.sock", 0);
	/* the never-bound one: no name, and it can still connect */
	struct sockaddr_un got;
	socklen_t gl = sizeof(got);
	FT_SYS(getsockname(su, (struct sockaddr *)&got, &gl));
	FT_EQ(gl, offsetof(struct sockaddr_un, sun_path), "name length of the unbound socket");
	int l = (int)FT_SYS(socket(AF_UNIX, SOCK_STREAM, 0));
	FT_SYS(bind(l, (struct sockaddr *)&a, addr_of("late.sock", 0, &a)));
	FT_SYS(listen(l, 1));
	FT_CHECK(connect(su, (struct sockaddr *)&a, addr_of("late.sock", 0, &a)) == 0, "unbound socket cannot connect: %s",
		 strerror(errno));
	unlink("unconn.sock");
	unlink("late.sock");
	return ft_finish();
}
