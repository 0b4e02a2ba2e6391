/*
 * unix_passsec [pidfd]: a unix socket with SO_PASSSEC (or SO_PASSPIDFD)
 * on and a message queued. Restore sends a unix queue again from ferry,
 * so the message would carry ferry's security label (or pid): checkpoint
 * must refuse the fd by name and leave the socket as it was.
 */
#include "../conformance/ferry_test.h"
#include <sys/socket.h>

#ifndef SO_PASSSEC
#define SO_PASSSEC 34
#endif
#ifndef SO_PASSPIDFD
#define SO_PASSPIDFD 76
#endif

int main(int argc, char **argv)
{
	ft_init();
	int option = argc > 1 && strcmp(argv[1], "pidfd") == 0 ? SO_PASSPIDFD : SO_PASSSEC;
	int sv[2];
	FT_SYS(socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
	if (sv[0] != 3)
		ft_die("socket is fd %d, expected 3", sv[0]);
	int one = 1;
	FT_SYS(setsockopt(sv[0], SOL_SOCKET, option, &one, sizeof(one)));
	FT_SYS(send(sv[1], "queued", 6, 0));
	ft_ready();
	ft_wait_restored();
	int v = 0;
	socklen_t l = sizeof(v);
	FT_SYS(getsockopt(sv[0], SOL_SOCKET, option, &v, &l));
	FT_EQ(v, 1, "the option");
	char b[8];
	FT_EQ(recv(sv[0], b, sizeof(b), MSG_DONTWAIT), 6, "the queued message");
	return ft_finish();
}
