/*
 * sock_unix_pending_order: three clients connect, in turn, to a unix
 * listener bound to a path and wait in its accept queue (nothing sent).
 * After restore the listener accepts three connections and writes 'A',
 * 'B', 'C' on them in accept order: the first client to connect must
 * read 'A', the second 'B', the third 'C' (accept order kept); then the
 * queue is empty (EAGAIN).
 */
#include "ferry_test.h"
#include <sys/socket.h>
#include <sys/un.h>

int main(void)
{
	ft_init();
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	snprintf(a.sun_path, sizeof(a.sun_path), "pending_order.sock");
	unlink(a.sun_path);
	int l = (int)FT_SYS(socket(AF_UNIX, SOCK_STREAM, 0));
	FT_SYS(bind(l, (struct sockaddr *)&a, sizeof(a)));
	FT_SYS(listen(l, 8));
	int c[3];
	/* numbers out of order, so fd order differs from connect order */
	int want_fd[3] = { 40, 20, 30 };
	for (int i = 0; i < 3; i++) {
		int s = (int)FT_SYS(socket(AF_UNIX, SOCK_STREAM, 0));
		FT_SYS(connect(s, (struct sockaddr *)&a, sizeof(a)));
		c[i] = (int)FT_SYS(dup2(s, want_fd[i]));
		close(s);
	}
	ft_ready();
	ft_wait_restored();
	FT_SYS(fcntl(l, F_SETFL, O_NONBLOCK));
	for (int i = 0; i < 3; i++) {
		int s = accept(l, NULL, NULL);
		FT_CHECK(s >= 0, "accept %d: %s", i, strerror(errno));
		if (s >= 0) {
			char b = (char)('A' + i);
			FT_EQ(write(s, &b, 1), 1, "write on an accepted connection");
		}
	}
	FT_CHECK(accept(l, NULL, NULL) < 0 && errno == EAGAIN, "accept queue empty afterwards");
	for (int i = 0; i < 3; i++) {
		char b = 0;
		FT_EQ(recv(c[i], &b, 1, MSG_DONTWAIT), 1, "client reads its byte");
		FT_CHECK(b == 'A' + i, "client %d (connected %d-th) got '%c', expected '%c'", c[i], i + 1, b, 'A' + i);
	}
	unlink(a.sun_path);
	return ft_finish();
}
