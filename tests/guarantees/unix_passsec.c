/*
 * unix_passsec: a unix socket with SO_PASSSEC on. The image keeps no
 * option of a unix socket besides SO_PASSCRED, so checkpoint must refuse
 * the fd by name and leave the socket as it was.
 */
#include "../conformance/ferry_test.h"
#include <sys/socket.h>

#ifndef SO_PASSSEC
#define SO_PASSSEC 34
#endif

int main(void)
{
	ft_init();
	int s = FT_SYS(socket(AF_UNIX, SOCK_STREAM, 0));
	if (s != 3)
		ft_die("socket is fd %d, expected 3", s);
	int one = 1;
	FT_SYS(setsockopt(s, SOL_SOCKET, SO_PASSSEC, &one, sizeof(one)));
	ft_ready();
	ft_wait_restored();
	int v = 0;
	socklen_t l = sizeof(v);
	FT_SYS(getsockopt(s, SOL_SOCKET, SO_PASSSEC, &v, &l));
	FT_EQ(v, 1, "SO_PASSSEC");
	return ft_finish();
}
