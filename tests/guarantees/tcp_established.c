/*
 * tcp_established (used by the guarantee tests as a refusal case until TCP repair lands): an established TCP connection over 127.0.0.1 with
 * both ends in the process (client with TCP_NODELAY), and unread data in
 * both directions ("hello" client->server, "world!" server->client). After
 * restore (needs TCP repair in the engine): same local/peer addresses on
 * both ends, the queued data is read exactly, and new data flows both ways.
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
	int one = 1;
	FT_SYS(setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)));
	FT_SYS(connect(c, (struct sockaddr *)&a, sizeof(a)));
	int s = (int)FT_SYS(accept(l, NULL, NULL));
	close(l);
	FT_SYS(send(c, "hello", 5, 0));
	FT_SYS(send(s, "world!", 6, 0));
	ft_sleep_ms(20);
	struct sockaddr_in cl, cp, sl, spp;
	socklen_t x = sizeof(cl);
	getsockname(c, (struct sockaddr *)&cl, &x);
	x = sizeof(cp);
	getpeername(c, (struct sockaddr *)&cp, &x);
	x = sizeof(sl);
	getsockname(s, (struct sockaddr *)&sl, &x);
	x = sizeof(spp);
	getpeername(s, (struct sockaddr *)&spp, &x);

	ft_ready();
	ft_wait_restored();

	struct sockaddr_in t;
	x = sizeof(t);
	FT_CHECK(getsockname(c, (struct sockaddr *)&t, &x) == 0 && t.sin_port == cl.sin_port, "client local port");
	x = sizeof(t);
	FT_CHECK(getpeername(c, (struct sockaddr *)&t, &x) == 0 && t.sin_port == cp.sin_port, "client peer port");
	x = sizeof(t);
	FT_CHECK(getsockname(s, (struct sockaddr *)&t, &x) == 0 && t.sin_port == sl.sin_port, "server local port");
	x = sizeof(t);
	FT_CHECK(getpeername(s, (struct sockaddr *)&t, &x) == 0 && t.sin_port == spp.sin_port, "server peer port");
	int v = 0;
	x = sizeof(v);
	getsockopt(c, IPPROTO_TCP, TCP_NODELAY, &v, &x);
	FT_EQ(v, 1, "client TCP_NODELAY");
	struct timeval tv = { 3, 0 };
	setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	char b[16] = { 0 };
	FT_EQ(recv(s, b, 5, MSG_WAITALL), 5, "server reads queued data");
	FT_CHECK(memcmp(b, "hello", 5) == 0, "server got '%s'", b);
	memset(b, 0, sizeof(b));
	FT_EQ(recv(c, b, 6, MSG_WAITALL), 6, "client reads queued data");
	FT_CHECK(memcmp(b, "world!", 6) == 0, "client got '%s'", b);
	FT_EQ(send(c, "ping", 4, MSG_NOSIGNAL), 4, "client send after restore");
	FT_EQ(recv(s, b, 4, MSG_WAITALL), 4, "server recv after restore");
	FT_EQ(send(s, "pong", 4, MSG_NOSIGNAL), 4, "server send after restore");
	FT_EQ(recv(c, b, 4, MSG_WAITALL), 4, "client recv after restore");
	return ft_finish();
}
