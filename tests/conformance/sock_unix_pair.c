/*
 * sock_unix_pair: unix socketpairs with queued, unread data: STREAM pair
 * with "abc" queued a->b and "defgh" b->a; DGRAM pair with two datagrams
 * "one" and "two" a->b; SEQPACKET pair with one record; a STREAM pair where
 * "bye" was sent and then shutdown(SHUT_WR). After restore: the data comes
 * out exactly (message boundaries kept for DGRAM/SEQPACKET), the shut-down
 * pair yields "bye" then EOF, SO_TYPE is kept and further traffic works.
 */
#include "ferry_test.h"
#include <sys/ioctl.h>
#include <sys/socket.h>

static int geti(int fd, int opt)
{
	int v = -1;
	socklen_t l = sizeof(v);
	getsockopt(fd, SOL_SOCKET, opt, &v, &l);
	return v;
}

int main(void)
{
	ft_init();
	int st[2], dg[2], sq[2], sh[2];
	FT_SYS(socketpair(AF_UNIX, SOCK_STREAM, 0, st));
	FT_SYS(socketpair(AF_UNIX, SOCK_DGRAM, 0, dg));
	FT_SYS(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sq));
	FT_SYS(socketpair(AF_UNIX, SOCK_STREAM, 0, sh));
	FT_SYS(send(st[0], "abc", 3, 0));
	FT_SYS(send(st[1], "defgh", 5, 0));
	FT_SYS(send(dg[0], "one", 3, 0));
	FT_SYS(send(dg[0], "two", 3, 0));
	FT_SYS(send(sq[0], "record-1", 8, 0));
	FT_SYS(send(sh[0], "bye", 3, 0));
	FT_SYS(shutdown(sh[0], SHUT_WR));

	ft_ready();
	ft_wait_restored();

	char b[64];
	int n = -1;
	ioctl(st[1], FIONREAD, &n);
	FT_EQ(n, 3, "stream b FIONREAD");
	memset(b, 0, sizeof(b));
	FT_EQ(recv(st[1], b, sizeof(b), MSG_DONTWAIT), 3, "stream b recv");
	FT_CHECK(memcmp(b, "abc", 3) == 0, "stream b got '%s'", b);
	memset(b, 0, sizeof(b));
	FT_EQ(recv(st[0], b, sizeof(b), MSG_DONTWAIT), 5, "stream a recv");
	FT_CHECK(memcmp(b, "defgh", 5) == 0, "stream a got '%s'", b);
	FT_EQ(geti(st[0], SO_TYPE), SOCK_STREAM, "stream SO_TYPE");
	memset(b, 0, sizeof(b));
	FT_EQ(recv(dg[1], b, sizeof(b), MSG_DONTWAIT), 3, "dgram 1 size");
	FT_CHECK(memcmp(b, "one", 3) == 0, "dgram 1 '%s'", b);
	memset(b, 0, sizeof(b));
	FT_EQ(recv(dg[1], b, sizeof(b), MSG_DONTWAIT), 3, "dgram 2 size");
	FT_CHECK(memcmp(b, "two", 3) == 0, "dgram 2 '%s'", b);
	FT_CHECK(recv(dg[1], b, sizeof(b), MSG_DONTWAIT) < 0 && errno == EAGAIN, "extra datagram");
	FT_EQ(geti(dg[0], SO_TYPE), SOCK_DGRAM, "dgram SO_TYPE");
	memset(b, 0, sizeof(b));
	FT_EQ(recv(sq[1], b, 4, MSG_DONTWAIT), 4, "seqpacket truncated read");
	FT_CHECK(recv(sq[1], b, sizeof(b), MSG_DONTWAIT) < 0 && errno == EAGAIN,
		 "seqpacket record boundary lost (rest of the record still readable)");
	FT_EQ(geti(sq[0], SO_TYPE), SOCK_SEQPACKET, "seqpacket SO_TYPE");
	memset(b, 0, sizeof(b));
	FT_EQ(recv(sh[1], b, sizeof(b), MSG_DONTWAIT), 3, "shutdown pair data");
	FT_CHECK(memcmp(b, "bye", 3) == 0, "shutdown pair got '%s'", b);
	FT_EQ(recv(sh[1], b, sizeof(b), MSG_DONTWAIT), 0, "shutdown pair EOF");
	FT_CHECK(send(sh[0], "x", 1, MSG_NOSIGNAL) < 0 && errno == EPIPE, "send after SHUT_WR allowed");
	FT_EQ(send(sh[1], "back", 4, 0), 4, "reverse direction of half-closed pair");
	FT_EQ(recv(sh[0], b, sizeof(b), MSG_DONTWAIT), 4, "reverse direction recv");
	FT_EQ(send(st[0], "more", 4, 0), 4, "stream send after restore");
	FT_EQ(recv(st[1], b, sizeof(b), MSG_DONTWAIT), 4, "stream recv after restore");
	FT_EQ(send(dg[1], "three", 5, 0), 5, "dgram send after restore");
	FT_EQ(recv(dg[0], b, sizeof(b), MSG_DONTWAIT), 5, "dgram recv after restore");
	return ft_finish();
}
