/*
 * sock_unix_pending: unix listeners with a connection waiting in their
 * accept queue. An abstract listener has a pending client c1, a path
 * listener ("pend.sock") c3; nothing was sent yet. After restore accept()
 * returns each connection, bytes go both ways between it and its client,
 * and nothing more waits (accept on the non-blocking listener gives
 * EAGAIN). (Two or more waiting on one listener are refused: the kernel
 * does not show their order.)
 */
#include "ferry_test.h"
#include <stddef.h>
#include <sys/socket.h>
#include <sys/un.h>

static socklen_t addr(struct sockaddr_un *a, const char *name, int abstract)
{
	memset(a, 0, sizeof(*a));
	a->sun_family = AF_UNIX;
	if (abstract) {
		strcpy(a->sun_path + 1, name);
		return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(name));
	}
	strcpy(a->sun_path, name);
	return (socklen_t)sizeof(*a);
}

static int client(struct sockaddr_un *a, socklen_t len)
{
	int c = (int)FT_SYS(socket(AF_UNIX, SOCK_STREAM, 0));
	FT_SYS(connect(c, (struct sockaddr *)a, len));
	return c;
}

static void expect(int from, int to, char byte, const char *what)
{
	FT_CHECK(write(from, &byte, 1) == 1, "%s: write", what);
	char got = 0;
	FT_CHECK(read(to, &got, 1) == 1 && got == byte, "%s: got '%c', expected '%c'", what, got, byte);
}

int main(void)
{
	ft_init();
	char name[64];
	snprintf(name, sizeof(name), "ferry-conf-pend-%d", (int)getpid());
	struct sockaddr_un aa, pa;
	socklen_t alen = addr(&aa, name, 1), plen = addr(&pa, "pend.sock", 0);
	int la = (int)FT_SYS(socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0));
	FT_SYS(bind(la, (struct sockaddr *)&aa, alen));
	FT_SYS(listen(la, 8));
	unlink("pend.sock");
	int lp = (int)FT_SYS(socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0));
	FT_SYS(bind(lp, (struct sockaddr *)&pa, plen));
	FT_SYS(listen(lp, 8));
	int c1 = client(&aa, alen);
	int c3 = client(&pa, plen);

	ft_ready();
	ft_wait_restored();

	int a1 = accept(la, NULL, NULL);
	FT_CHECK(a1 >= 0, "accept on the abstract listener: %s", strerror(errno));
	int a3 = accept(lp, NULL, NULL);
	FT_CHECK(a3 >= 0, "accept on the path listener: %s", strerror(errno));
	errno = 0;
	FT_CHECK(accept(la, NULL, NULL) < 0 && errno == EAGAIN, "a second connection waits on the abstract listener");
	if (a1 >= 0) {
		expect(c1, a1, '1', "c1 -> accepted");
		expect(a1, c1, 'x', "accepted -> c1");
	}
	if (a3 >= 0) {
		expect(c3, a3, '3', "c3 -> path listener's connection");
		expect(a3, c3, 'y', "path listener's connection -> c3");
	}
	unlink("pend.sock");
	return ft_finish();
}
