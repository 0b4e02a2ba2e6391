/*
 * tcp_half_closed (a refusal case for the guarantee tests): a TCP
 * connection over 127.0.0.1 with both ends in the process, whose client
 * end has shut down writing, so the server end is in CLOSE_WAIT and the
 * client end in FIN_WAIT2. ferry restores established connections and
 * those whose peer closed (CLOSE_WAIT), not one that closed its own side
 * (FIN_WAIT2), and must refuse this by state, leaving the process
 * unharmed: afterwards
 * the server end still sends, the client end receives, and the server end
 * reads the client's EOF.
 */
#include "../conformance/ferry_test.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

int main(void)
{
	ft_init();
	int l = (int)FT_SYS(socket(AF_INET, SOCK_STREAM, 0));
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	FT_SYS(bind(l, (struct sockaddr *)&a, sizeof(a)));
	FT_SYS(listen(l, 1));
	socklen_t al = sizeof(a);
	FT_SYS(getsockname(l, (struct sockaddr *)&a, &al));
	int c = (int)FT_SYS(socket(AF_INET, SOCK_STREAM, 0));
	FT_SYS(connect(c, (struct sockaddr *)&a, sizeof(a)));
	int s = (int)FT_SYS(accept(l, NULL, NULL));
	close(l);
	FT_SYS(shutdown(c, SHUT_WR));
	ft_sleep_ms(20);

	ft_ready();
	ft_wait_restored();

	FT_EQ(send(s, "late", 4, 0), 4, "server end sends after the refusal");
	char buf[8] = { 0 };
	FT_EQ(recv(c, buf, 4, MSG_WAITALL), 4, "client end receives");
	FT_CHECK(memcmp(buf, "late", 4) == 0, "client got '%s'", buf);
	FT_EQ(recv(s, buf, 1, 0), 0, "server end reads the client's EOF");
	return ft_finish();
}
