/*
 * sock_unix_peer_closed: unix sockets whose peer was closed (sshd's
 * privilege-separation socket, a JVM's): the kernel shuts the survivor
 * down and keeps the closed peer as its peer.
 *   - STREAM socketpair ends: one whose peer sent "tail" before closing,
 *     one with nothing queued, one whose own "lost" was never read by the
 *     peer (a pending ECONNRESET), and one with both "data" queued and a
 *     pending ECONNRESET;
 *   - a SEQPACKET socketpair end with two records queued;
 *   - the accepted end of an abstract listener whose unbound client sent
 *     "hi" and closed; a client of that listener whose accepted end sent
 *     "srv" and closed (the listener is kept); a client of a path
 *     listener ("pc.sock") whose accepted end and listener were closed;
 *   - a DGRAM socketpair end whose peer sent "d1", "d2" and closed; a
 *     DGRAM socket connected to an abstract-bound socket since closed.
 * After restore, for each: getsockname/getpeername and poll revents as
 * before; the queued bytes or records come out, then EOF (after one
 * ECONNRESET where one was pending: SO_ERROR reads it once); a write
 * gives EPIPE (stream) or ECONNREFUSED (datagram, then ENOTCONN).
 */
#include "ferry_test.h"
#include <poll.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/un.h>

struct names {
	int serr, perr;
	socklen_t sl, pl;
	struct sockaddr_un s, p;
	short revents;
};

static void get_state(int fd, struct names *n)
{
	memset(n, 0, sizeof(*n));
	n->sl = n->pl = sizeof(struct sockaddr_un);
	n->serr = getsockname(fd, (struct sockaddr *)&n->s, &n->sl) ? errno : 0;
	n->perr = getpeername(fd, (struct sockaddr *)&n->p, &n->pl) ? errno : 0;
	struct pollfd p = { .fd = fd, .events = POLLIN | POLLOUT | POLLRDHUP | POLLPRI };
	if (poll(&p, 1, 0) >= 0)
		n->revents = p.revents;
}

static void check_state(int fd, const struct names *was, const char *what)
{
	struct names now;
	get_state(fd, &now);
	FT_CHECK(now.serr == was->serr && now.sl == was->sl && memcmp(&now.s, &was->s, was->sl) == 0,
		 "%s: getsockname len %u errno %d, was len %u errno %d", what, now.sl, now.serr, was->sl, was->serr);
	FT_CHECK(now.perr == was->perr && (now.perr || (now.pl == was->pl && memcmp(&now.p, &was->p, was->pl) == 0)),
		 "%s: getpeername len %u errno %d, was len %u errno %d", what, now.pl, now.perr, was->pl, was->perr);
	FT_CHECK(now.revents == was->revents, "%s: poll revents %#x, were %#x", what, now.revents, was->revents);
}

static socklen_t mkaddr(struct sockaddr_un *a, const char *name, int abstract)
{
	memset(a, 0, sizeof(*a));
	a->sun_family = AF_UNIX;
	if (abstract) {
		memcpy(a->sun_path + 1, name, strlen(name));
		return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(name));
	}
	strcpy(a->sun_path, name);
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(name) + 1);
}

static void expect(int fd, const char *s, const char *what)
{
	char b[64] = { 0 };
	ssize_t r = recv(fd, b, sizeof(b) - 1, MSG_DONTWAIT);
	FT_CHECK(r == (ssize_t)strlen(s) && memcmp(b, s, strlen(s)) == 0, "%s: recv %zd '%s' (%s), expected '%s'", what,
		 r, r > 0 ? b : "", r < 0 ? strerror(errno) : "-", s);
}

static void expect_err(int fd, int err, const char *what)
{
	char b[8];
	ssize_t r = recv(fd, b, sizeof(b), MSG_DONTWAIT);
	FT_CHECK(r < 0 && errno == err, "%s: recv %zd (%s), expected %s", what, r, r < 0 ? strerror(errno) : "-",
		 strerror(err));
}

static void expect_eof(int fd, const char *what)
{
	char b[8];
	ssize_t r = recv(fd, b, sizeof(b), MSG_DONTWAIT);
	FT_CHECK(r == 0, "%s: recv %zd (%s), expected EOF", what, r, r < 0 ? strerror(errno) : "-");
}

static int so_error(int fd)
{
	int v = -1;
	socklen_t l = sizeof(v);
	getsockopt(fd, SOL_SOCKET, SO_ERROR, &v, &l);
	return v;
}

static void send_fails(int fd, int err, const char *what)
{
	ssize_t w = send(fd, "x", 1, MSG_DONTWAIT | MSG_NOSIGNAL);
	FT_CHECK(w < 0 && errno == err, "%s: send %zd (%s), expected %s", what, w, w < 0 ? strerror(errno) : "-",
		 strerror(err));
}

/* A connected STREAM pair whose end 1 sent `data` (if any) and closed;
 * with `lost`, end 0 sent bytes end 1 never read. Returns end 0. */
static int closed_pair(int type, const char *data, const char *data2, int lost)
{
	int sv[2];
	FT_SYS(socketpair(AF_UNIX, type, 0, sv));
	if (data)
		FT_SYS(send(sv[1], data, strlen(data), 0));
	if (data2)
		FT_SYS(send(sv[1], data2, strlen(data2), 0));
	if (lost)
		FT_SYS(send(sv[0], "lost", 4, 0));
	close(sv[1]);
	return sv[0];
}

enum { TAIL, EMPTY, RESET, DATA_RESET, SEQ, ACCEPTED, CLIENT, PATH_CLIENT, DGRAM, DGRAM_NAMED, N };

int main(void)
{
	ft_init();
	int fd[N];
	const char *what[N] = { "stream, data queued", "stream, nothing queued", "stream, reset pending",
				"stream, data and reset", "seqpacket", "accepted end", "client (listener kept)",
				"client of a closed path listener", "datagram pair", "datagram connected by name" };
	fd[TAIL] = closed_pair(SOCK_STREAM, "tail", NULL, 0);
	fd[EMPTY] = closed_pair(SOCK_STREAM, NULL, NULL, 0);
	fd[RESET] = closed_pair(SOCK_STREAM, NULL, NULL, 1);
	fd[DATA_RESET] = closed_pair(SOCK_STREAM, "data", NULL, 1);
	fd[SEQ] = closed_pair(SOCK_SEQPACKET, "rec-1", "rec-2", 0);
	fd[DGRAM] = closed_pair(SOCK_DGRAM, "d1", "d2", 0);

	char ln[64], dn[64];
	snprintf(ln, sizeof(ln), "ferry-peerclosed-l-%d", (int)getpid());
	snprintf(dn, sizeof(dn), "ferry-peerclosed-d-%d", (int)getpid());
	struct sockaddr_un la, pa, da;
	socklen_t ll = mkaddr(&la, ln, 1), pl = mkaddr(&pa, "pc.sock", 0), dl = mkaddr(&da, dn, 1);
	int lis = (int)FT_SYS(socket(AF_UNIX, SOCK_STREAM, 0));
	FT_SYS(bind(lis, (struct sockaddr *)&la, ll));
	FT_SYS(listen(lis, 4));
	int c = (int)FT_SYS(socket(AF_UNIX, SOCK_STREAM, 0));
	FT_SYS(connect(c, (struct sockaddr *)&la, ll));
	fd[ACCEPTED] = (int)FT_SYS(accept(lis, NULL, NULL));
	FT_SYS(send(c, "hi", 2, 0));
	close(c);
	fd[CLIENT] = (int)FT_SYS(socket(AF_UNIX, SOCK_STREAM, 0));
	FT_SYS(connect(fd[CLIENT], (struct sockaddr *)&la, ll));
	int a = (int)FT_SYS(accept(lis, NULL, NULL));
	FT_SYS(send(a, "srv", 3, 0));
	close(a);

	unlink("pc.sock");
	int pls = (int)FT_SYS(socket(AF_UNIX, SOCK_STREAM, 0));
	FT_SYS(bind(pls, (struct sockaddr *)&pa, pl));
	FT_SYS(listen(pls, 1));
	fd[PATH_CLIENT] = (int)FT_SYS(socket(AF_UNIX, SOCK_STREAM, 0));
	FT_SYS(connect(fd[PATH_CLIENT], (struct sockaddr *)&pa, pl));
	a = (int)FT_SYS(accept(pls, NULL, NULL));
	FT_SYS(send(a, "path", 4, 0));
	close(a);
	close(pls);

	int d = (int)FT_SYS(socket(AF_UNIX, SOCK_DGRAM, 0));
	FT_SYS(bind(d, (struct sockaddr *)&da, dl));
	fd[DGRAM_NAMED] = (int)FT_SYS(socket(AF_UNIX, SOCK_DGRAM, 0));
	FT_SYS(connect(fd[DGRAM_NAMED], (struct sockaddr *)&da, dl));
	close(d);

	struct names was[N];
	for (int i = 0; i < N; i++)
		get_state(fd[i], &was[i]);
	/* sanity: the kernel says what this test expects */
	FT_CHECK((was[TAIL].revents & (POLLHUP | POLLRDHUP)) == (POLLHUP | POLLRDHUP), "before: no POLLHUP|POLLRDHUP");
	FT_CHECK(was[RESET].revents & POLLERR, "before: no POLLERR with a reset pending");
	FT_CHECK(!(was[EMPTY].revents & POLLERR), "before: POLLERR with no reset pending");
	FT_CHECK(was[CLIENT].perr == 0 && was[CLIENT].pl == ll, "before: the client's peer is not the listener's name");
	FT_CHECK(was[DGRAM_NAMED].perr == 0 && was[DGRAM_NAMED].pl == dl, "before: the datagram socket's peer name");

	ft_ready();
	ft_wait_restored();

	for (int i = 0; i < N; i++)
		check_state(fd[i], &was[i], what[i]);
	expect(fd[TAIL], "tail", what[TAIL]);
	expect_eof(fd[TAIL], what[TAIL]);
	send_fails(fd[TAIL], EPIPE, what[TAIL]);
	FT_EQ(so_error(fd[TAIL]), 0, "stream, data queued: SO_ERROR");
	expect_eof(fd[EMPTY], what[EMPTY]);
	send_fails(fd[EMPTY], EPIPE, what[EMPTY]);
	FT_EQ(so_error(fd[RESET]), ECONNRESET, "stream, reset pending: SO_ERROR");
	FT_EQ(so_error(fd[RESET]), 0, "stream, reset pending: SO_ERROR read twice");
	expect_eof(fd[RESET], what[RESET]);
	expect(fd[DATA_RESET], "data", what[DATA_RESET]);
	expect_err(fd[DATA_RESET], ECONNRESET, what[DATA_RESET]);
	expect_eof(fd[DATA_RESET], what[DATA_RESET]);
	expect(fd[SEQ], "rec-1", what[SEQ]);
	expect(fd[SEQ], "rec-2", what[SEQ]);
	expect_eof(fd[SEQ], what[SEQ]);
	send_fails(fd[SEQ], EPIPE, what[SEQ]);
	expect(fd[ACCEPTED], "hi", what[ACCEPTED]);
	expect_eof(fd[ACCEPTED], what[ACCEPTED]);
	send_fails(fd[ACCEPTED], EPIPE, what[ACCEPTED]);
	expect(fd[CLIENT], "srv", what[CLIENT]);
	expect_eof(fd[CLIENT], what[CLIENT]);
	send_fails(fd[CLIENT], EPIPE, what[CLIENT]);
	expect(fd[PATH_CLIENT], "path", what[PATH_CLIENT]);
	expect_eof(fd[PATH_CLIENT], what[PATH_CLIENT]);
	struct stat st;
	FT_CHECK(lstat("pc.sock", &st) == 0 && S_ISSOCK(st.st_mode), "pc.sock missing or not a socket");
	/* the listener still takes connections, and nothing else waits there */
	int c2 = (int)FT_SYS(socket(AF_UNIX, SOCK_STREAM, 0));
	FT_SYS(connect(c2, (struct sockaddr *)&la, ll));
	int a2 = accept(lis, NULL, NULL);
	FT_CHECK(a2 >= 0, "accept on the listener: %s", strerror(errno));
	FT_EQ(send(c2, "new", 3, 0), 3, "new connection send");
	expect(a2, "new", "new connection");
	struct pollfd lp = { .fd = lis, .events = POLLIN };
	FT_EQ(poll(&lp, 1, 0), 0, "connections left on the listener");
	expect(fd[DGRAM], "d1", what[DGRAM]);
	expect(fd[DGRAM], "d2", what[DGRAM]);
	expect_err(fd[DGRAM], EAGAIN, what[DGRAM]);
	send_fails(fd[DGRAM], ECONNREFUSED, what[DGRAM]);
	send_fails(fd[DGRAM], ENOTCONN, what[DGRAM]);
	send_fails(fd[DGRAM_NAMED], ECONNREFUSED, what[DGRAM_NAMED]);
	send_fails(fd[DGRAM_NAMED], ENOTCONN, what[DGRAM_NAMED]);
	unlink("pc.sock");
	return ft_finish();
}
