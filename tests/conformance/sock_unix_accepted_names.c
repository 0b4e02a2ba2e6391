/*
 * sock_unix_accepted_names: unix connections made with connect() to a
 * named listener and accept(), whose ends must keep their names: the
 * accepted socket's getsockname and the client's getpeername are the
 * listener's name, a bound client keeps its own name on both sides.
 *   - a STREAM listener bound to the path "acc.sock" (in the test dir) and
 *     one bound to an abstract name, a SEQPACKET listener bound to another
 *     abstract name;
 *   - in the root: an unbound client of each; a client bound to an
 *     abstract name of its own and one bound to the path "cli.sock"; a
 *     client with SO_PASSCRED on before connect (autobound by the kernel);
 *     a connection accepted from a listener "gone.sock" that was then
 *     closed and its file unlinked;
 *   - a forked child with one client on the path listener and one on the
 *     abstract one, accepted by the root.
 * Every connection has bytes queued both ways. After restore: getsockname
 * and getpeername of every socket are byte for byte what they were
 * (length included), queued bytes intact, new messages go both ways,
 * the listeners have nothing waiting to be accepted, "acc.sock" and
 * "cli.sock" are still sockets and "gone.sock" still does not exist.
 */
#include "ferry_test.h"
#include <stddef.h>
#include <sys/socket.h>
#include <sys/un.h>

struct names {
	socklen_t sl, pl;
	struct sockaddr_un s, p;
};

static void get_names(int fd, struct names *n, const char *what)
{
	memset(n, 0, sizeof(*n));
	n->sl = n->pl = sizeof(struct sockaddr_un);
	if (getsockname(fd, (struct sockaddr *)&n->s, &n->sl) != 0)
		ft_die("%s: getsockname: %s", what, strerror(errno));
	if (getpeername(fd, (struct sockaddr *)&n->p, &n->pl) != 0)
		ft_die("%s: getpeername: %s", what, strerror(errno));
}

/* A printable form of a name: @ for the abstract NUL, "" when unnamed. */
static const char *show(const struct sockaddr_un *a, socklen_t l, char *buf, size_t n)
{
	size_t len = l > offsetof(struct sockaddr_un, sun_path) ? l - offsetof(struct sockaddr_un, sun_path) : 0;
	size_t i;
	for (i = 0; i < len && i + 1 < n; i++)
		buf[i] = a->sun_path[i] ? a->sun_path[i] : '@';
	buf[i] = 0;
	return buf;
}

static void check_names(int fd, const struct names *was, const char *what)
{
	struct names now;
	char b1[128], b2[128];
	memset(&now, 0, sizeof(now));
	now.sl = now.pl = sizeof(struct sockaddr_un);
	if (getsockname(fd, (struct sockaddr *)&now.s, &now.sl) != 0) {
		ft_fail("%s: getsockname: %s", what, strerror(errno));
		return;
	}
	if (getpeername(fd, (struct sockaddr *)&now.p, &now.pl) != 0) {
		ft_fail("%s: getpeername: %s", what, strerror(errno));
		return;
	}
	FT_CHECK(now.sl == was->sl && memcmp(&now.s, &was->s, was->sl) == 0, "%s: getsockname '%s' (len %u), was '%s' (len %u)",
		 what, show(&now.s, now.sl, b1, sizeof(b1)), now.sl, show(&was->s, was->sl, b2, sizeof(b2)), was->sl);
	FT_CHECK(now.pl == was->pl && memcmp(&now.p, &was->p, was->pl) == 0, "%s: getpeername '%s' (len %u), was '%s' (len %u)",
		 what, show(&now.p, now.pl, b1, sizeof(b1)), now.pl, show(&was->p, was->pl, b2, sizeof(b2)), was->pl);
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

static int listener(int type, const struct sockaddr_un *a, socklen_t l)
{
	int s = (int)FT_SYS(socket(AF_UNIX, type, 0));
	FT_SYS(bind(s, (const struct sockaddr *)a, l));
	FT_SYS(listen(s, 8));
	return s;
}

static int client(int type, const struct sockaddr_un *a, socklen_t l)
{
	int c = (int)FT_SYS(socket(AF_UNIX, type, 0));
	FT_SYS(connect(c, (const struct sockaddr *)a, l));
	return c;
}

static void send_str(int fd, const char *s, const char *what)
{
	ssize_t w = send(fd, s, strlen(s), MSG_NOSIGNAL);
	FT_CHECK(w == (ssize_t)strlen(s), "%s: send '%s': %zd (%s)", what, s, w, strerror(errno));
}

/* Exactly the bytes of s, nothing more queued. */
static void expect_str(int fd, const char *s, const char *what)
{
	char b[128] = { 0 };
	size_t n = strlen(s);
	ssize_t r = recv(fd, b, n, MSG_WAITALL);
	FT_CHECK(r == (ssize_t)n && memcmp(b, s, n) == 0, "%s: got %zd bytes '%s', expected '%s' (%s)", what, r, b, s,
		 r < 0 ? strerror(errno) : "");
	r = recv(fd, b, sizeof(b), MSG_DONTWAIT);
	FT_CHECK(r < 0 && errno == EAGAIN, "%s: more queued after '%s' (recv %zd)", what, s, r);
}

#define NCONN 9
static const char *const conn_name[NCONN] = {
	"unbound client of acc.sock",  "unbound client of the abstract listener", "seqpacket client",
	"abstract-bound client",       "path-bound client (cli.sock)",            "SO_PASSCRED (autobound) client",
	"client of gone.sock",         "child's client of acc.sock",              "child's client of the abstract listener",
};

/* One end of connection i (client or accepted side) in a process of
 * its own: phase 0 queues a message before the checkpoint; after restore
 * the queued message is read (server: phase 1, before the child's go),
 * then one new message each way. */
static void client_side(int i, int c, int phase)
{
	char m[64], what[128];
	snprintf(what, sizeof(what), "%s: client", conn_name[i]);
	if (phase == 0) {
		snprintf(m, sizeof(m), "queued to server %d", i);
		send_str(c, m, what);
		return;
	}
	snprintf(m, sizeof(m), "queued to client %d", i);
	expect_str(c, m, what);
	snprintf(m, sizeof(m), "new to server %d", i);
	send_str(c, m, what);
	snprintf(m, sizeof(m), "new to client %d", i);
	expect_str(c, m, what);
}

static void server_side(int i, int s, int phase)
{
	char m[64], what[128];
	snprintf(what, sizeof(what), "%s: accepted side", conn_name[i]);
	if (phase == 0) {
		snprintf(m, sizeof(m), "queued to client %d", i);
		send_str(s, m, what);
		return;
	}
	if (phase == 1) {
		/* before the child's go: nothing new can be queued yet */
		snprintf(m, sizeof(m), "queued to server %d", i);
		expect_str(s, m, what);
		return;
	}
	snprintf(m, sizeof(m), "new to server %d", i);
	expect_str(s, m, what);
	snprintf(m, sizeof(m), "new to client %d", i);
	send_str(s, m, what);
}

int main(void)
{
	ft_init();
	ft_tree_begin();
	char abs1[64], abs2[64], abs3[64];
	snprintf(abs1, sizeof(abs1), "ferry-acc-%d", (int)getpid());
	snprintf(abs2, sizeof(abs2), "ferry-accsq-%d", (int)getpid());
	snprintf(abs3, sizeof(abs3), "ferry-acccli-%d", (int)getpid());
	unlink("acc.sock");
	unlink("cli.sock");
	unlink("gone.sock");
	struct sockaddr_un pa, aa, qa, ca, cpa, ga;
	socklen_t pl = mkaddr(&pa, "acc.sock", 0), al = mkaddr(&aa, abs1, 1), ql = mkaddr(&qa, abs2, 1);
	socklen_t cl = mkaddr(&ca, abs3, 1), cpl = mkaddr(&cpa, "cli.sock", 0), gl = mkaddr(&ga, "gone.sock", 0);
	int lp = listener(SOCK_STREAM, &pa, pl);
	int la = listener(SOCK_STREAM, &aa, al);
	int lq = listener(SOCK_SEQPACKET, &qa, ql);

	int c[NCONN], s[NCONN];
	c[0] = client(SOCK_STREAM, &pa, pl);
	s[0] = (int)FT_SYS(accept(lp, NULL, NULL));
	c[1] = client(SOCK_STREAM, &aa, al);
	s[1] = (int)FT_SYS(accept(la, NULL, NULL));
	c[2] = client(SOCK_SEQPACKET, &qa, ql);
	s[2] = (int)FT_SYS(accept(lq, NULL, NULL));
	c[3] = (int)FT_SYS(socket(AF_UNIX, SOCK_STREAM, 0));
	FT_SYS(bind(c[3], (struct sockaddr *)&ca, cl));
	FT_SYS(connect(c[3], (struct sockaddr *)&pa, pl));
	s[3] = (int)FT_SYS(accept(lp, NULL, NULL));
	c[4] = (int)FT_SYS(socket(AF_UNIX, SOCK_STREAM, 0));
	FT_SYS(bind(c[4], (struct sockaddr *)&cpa, cpl));
	FT_SYS(connect(c[4], (struct sockaddr *)&aa, al));
	s[4] = (int)FT_SYS(accept(la, NULL, NULL));
	c[5] = (int)FT_SYS(socket(AF_UNIX, SOCK_STREAM, 0));
	int one = 1;
	FT_SYS(setsockopt(c[5], SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)));
	FT_SYS(connect(c[5], (struct sockaddr *)&aa, al));
	s[5] = (int)FT_SYS(accept(la, NULL, NULL));
	int lg = listener(SOCK_STREAM, &ga, gl);
	c[6] = client(SOCK_STREAM, &ga, gl);
	s[6] = (int)FT_SYS(accept(lg, NULL, NULL));
	close(lg);
	FT_SYS(unlink("gone.sock"));

	pid_t kid = ft_fork();
	if (kid == 0) {
		for (int i = 0; i < 7; i++) {
			close(c[i]);
			close(s[i]);
		}
		close(lp);
		close(la);
		close(lq);
		int k7 = client(SOCK_STREAM, &pa, pl), k8 = client(SOCK_STREAM, &aa, al);
		struct names n7, n8;
		get_names(k7, &n7, conn_name[7]);
		get_names(k8, &n8, conn_name[8]);
		client_side(7, k7, 0);
		client_side(8, k8, 0);
		ft_child_ready();

		ft_child_wait_go();
		check_names(k7, &n7, "child's client of acc.sock");
		check_names(k8, &n8, "child's client of the abstract listener");
		client_side(7, k7, 1);
		client_side(8, k8, 1);
		ft_child_exit("child");
	}
	s[7] = (int)FT_SYS(accept(lp, NULL, NULL));
	s[8] = (int)FT_SYS(accept(la, NULL, NULL));
	c[7] = c[8] = -1;

	struct names cn[NCONN], sn[NCONN];
	for (int i = 0; i < NCONN; i++) {
		if (c[i] >= 0) {
			get_names(c[i], &cn[i], conn_name[i]);
			client_side(i, c[i], 0);
		}
		get_names(s[i], &sn[i], conn_name[i]);
		server_side(i, s[i], 0);
	}
	/* What the kernel gives, so that the test checks something real. */
	FT_CHECK(sn[0].sl == pl && memcmp(&sn[0].s, &pa, pl) == 0, "before checkpoint: accepted socket not named acc.sock");
	FT_CHECK(cn[0].pl == pl && memcmp(&cn[0].p, &pa, pl) == 0, "before checkpoint: client's peer not acc.sock");
	FT_CHECK(cn[5].sl > offsetof(struct sockaddr_un, sun_path) + 1 && cn[5].s.sun_path[0] == 0,
		 "before checkpoint: the SO_PASSCRED client was not autobound");
	ft_tree_wait_ready(1);

	ft_ready();
	ft_tree_wait_restored();

	char what[128];
	for (int i = 0; i < NCONN; i++) {
		if (c[i] >= 0) {
			snprintf(what, sizeof(what), "%s: client", conn_name[i]);
			check_names(c[i], &cn[i], what);
		}
		snprintf(what, sizeof(what), "%s: accepted side", conn_name[i]);
		check_names(s[i], &sn[i], what);
	}
	server_side(7, s[7], 1);
	server_side(8, s[8], 1);
	ft_go(kid, "child");
	for (int i = 0; i < NCONN; i++) {
		if (c[i] >= 0) {
			/* one process: queued bytes first, then the new ones one way at a time */
			char m[64], w2[128];
			snprintf(w2, sizeof(w2), "%s: accepted side", conn_name[i]);
			snprintf(m, sizeof(m), "queued to server %d", i);
			expect_str(s[i], m, w2);
			snprintf(w2, sizeof(w2), "%s: client", conn_name[i]);
			snprintf(m, sizeof(m), "queued to client %d", i);
			expect_str(c[i], m, w2);
			snprintf(m, sizeof(m), "new to server %d", i);
			send_str(c[i], m, w2);
			snprintf(w2, sizeof(w2), "%s: accepted side", conn_name[i]);
			expect_str(s[i], m, w2);
			snprintf(m, sizeof(m), "new to client %d", i);
			send_str(s[i], m, w2);
			snprintf(w2, sizeof(w2), "%s: client", conn_name[i]);
			expect_str(c[i], m, w2);
		} else {
			server_side(i, s[i], 2);
		}
	}
	int lis[3] = { lp, la, lq };
	for (int i = 0; i < 3; i++) {
		int fl = fcntl(lis[i], F_GETFL);
		fcntl(lis[i], F_SETFL, fl | O_NONBLOCK);
		int x = accept(lis[i], NULL, NULL);
		FT_CHECK(x < 0 && errno == EAGAIN, "listener %d: a connection waits to be accepted after restore (accept %d, %s)", i, x,
			 x < 0 ? strerror(errno) : "ok");
		if (x >= 0)
			close(x);
		fcntl(lis[i], F_SETFL, fl);
	}
	struct stat st;
	FT_CHECK(stat("acc.sock", &st) == 0 && S_ISSOCK(st.st_mode), "acc.sock missing or not a socket");
	FT_CHECK(stat("cli.sock", &st) == 0 && S_ISSOCK(st.st_mode), "cli.sock missing or not a socket");
	FT_CHECK(stat("gone.sock", &st) != 0 && errno == ENOENT, "gone.sock exists after restore");
	/* the path listener still takes new connections */
	int n = socket(AF_UNIX, SOCK_STREAM, 0);
	if (connect(n, (struct sockaddr *)&pa, pl) != 0) {
		ft_fail("connect to acc.sock after restore: %s", strerror(errno));
	} else {
		int a = accept(lp, NULL, NULL);
		FT_CHECK(a >= 0, "accept on acc.sock after restore: %s", strerror(errno));
		if (a >= 0) {
			send_str(n, "hello", "new connection");
			expect_str(a, "hello", "new connection");
			close(a);
		}
	}
	close(n);
	ft_reap(kid, "child");
	unlink("acc.sock");
	unlink("cli.sock");
	return ft_finish();
}
