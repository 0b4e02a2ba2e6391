/*
 * thread_accept: a thread is blocked in accept() on a listening TCP socket
 * (127.0.0.1, port chosen by the kernel) during the checkpoint. After
 * restore a new thread connects and sends "ping"; accept must return a
 * socket whose peer is that client, the acceptor reads "ping" and answers
 * "pong".
 */
#include "ferry_test.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

static int lfd;
static pid_t atid;
static int afd = -2, aerr;
static struct sockaddr_in peer;
static char abuf[16];
static ssize_t an;
static struct sockaddr_in laddr;
static struct sockaddr_in client_local;
static char cbuf[16];
static ssize_t cn = -2;

static void *acceptor(void *arg)
{
	(void)arg;
	atid = ft_gettid();
	socklen_t len = sizeof(peer);
	afd = accept(lfd, (struct sockaddr *)&peer, &len);
	aerr = errno;
	if (afd >= 0) {
		an = recv(afd, abuf, 4, MSG_WAITALL);
		send(afd, "pong", 4, 0);
	}
	return NULL;
}

static void *connector(void *arg)
{
	(void)arg;
	int c = socket(AF_INET, SOCK_STREAM, 0);
	if (connect(c, (struct sockaddr *)&laddr, sizeof(laddr)) != 0) {
		ft_fail("connect after restore: %s", strerror(errno));
		close(c);
		return NULL;
	}
	socklen_t len = sizeof(client_local);
	getsockname(c, (struct sockaddr *)&client_local, &len);
	send(c, "ping", 4, 0);
	cn = recv(c, cbuf, 4, MSG_WAITALL);
	close(c);
	return NULL;
}

int main(void)
{
	ft_init();
	lfd = (int)FT_SYS(socket(AF_INET, SOCK_STREAM, 0));
	laddr.sin_family = AF_INET;
	laddr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	FT_SYS(bind(lfd, (struct sockaddr *)&laddr, sizeof(laddr)));
	socklen_t len = sizeof(laddr);
	FT_SYS(getsockname(lfd, (struct sockaddr *)&laddr, &len));
	FT_SYS(listen(lfd, 8));
	pthread_t ta, tc;
	FT_PT(pthread_create(&ta, NULL, acceptor, NULL));
	while (!atid)
		ft_sleep_ms(1);
	ft_wait_in_syscall2(atid, SYS_accept, SYS_accept4, 2);

	ft_ready();
	ft_wait_restored();

	FT_CHECK(afd == -2, "accept returned early: %d (%s)", afd, strerror(aerr));
	FT_PT(pthread_create(&tc, NULL, connector, NULL));
	ft_join(tc, NULL, 5, "connector");
	if (ft_join(ta, NULL, 5, "acceptor") == 0) {
		FT_CHECK(afd >= 0, "accept returned %d (%s)", afd, strerror(aerr));
		FT_CHECK(an == 4 && memcmp(abuf, "ping", 4) == 0, "acceptor got %zd bytes", an);
		FT_CHECK(peer.sin_port == client_local.sin_port && peer.sin_port != 0,
			 "accepted peer port %d != client port %d", ntohs(peer.sin_port),
			 ntohs(client_local.sin_port));
	}
	FT_CHECK(cn == 4 && memcmp(cbuf, "pong", 4) == 0, "client got %zd bytes", cn);
	return ft_finish();
}
