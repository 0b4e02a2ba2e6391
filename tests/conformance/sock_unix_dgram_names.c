/*
 * sock_unix_dgram_names: unix datagram sockets connected by name (zdtm
 * sockets_dgram, scm06):
 *   - a server bound to the path "dg.srv" (in the test dir), not connected;
 *     two clients connected to it one way (the server is not connected to
 *     them): one unbound, one bound to an abstract name;
 *   - a socket bound to an abstract name and connected to itself;
 *   - a socketpair whose two ends were then bound to abstract names.
 * After restore: getsockname and getpeername of every socket byte for
 * byte as before (ENOTCONN for the server); each client's datagram reaches
 * the server, whose recvfrom names the sender as before (nothing for the
 * unbound one); the server can answer the bound client by name; the
 * self-connected socket gets its own datagram; the pair works both ways;
 * "dg.srv" is still a socket.
 */
#include "ferry_test.h"
#include <stddef.h>
#include <sys/socket.h>
#include <sys/un.h>

struct names {
	int serr, perr;
	socklen_t sl, pl;
	struct sockaddr_un s, p;
};

static void get_names(int fd, struct names *n)
{
	memset(n, 0, sizeof(*n));
	n->sl = n->pl = sizeof(struct sockaddr_un);
	n->serr = getsockname(fd, (struct sockaddr *)&n->s, &n->sl) ? errno : 0;
	n->perr = getpeername(fd, (struct sockaddr *)&n->p, &n->pl) ? errno : 0;
}

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
	get_names(fd, &now);
	FT_CHECK(now.serr == was->serr && now.sl == was->sl && memcmp(&now.s, &was->s, was->sl) == 0,
		 "%s: getsockname '%s' (len %u, errno %d), was '%s' (len %u, errno %d)", what, show(&now.s, now.sl, b1, sizeof(b1)),
		 now.sl, now.serr, show(&was->s, was->sl, b2, sizeof(b2)), was->sl, was->serr);
	FT_CHECK(now.perr == was->perr && (now.perr || (now.pl == was->pl && memcmp(&now.p, &was->p, was->pl) == 0)),
		 "%s: getpeername '%s' (len %u, errno %d), was '%s' (len %u, errno %d)", what, show(&now.p, now.pl, b1, sizeof(b1)),
		 now.pl, now.perr, show(&was->p, was->pl, b2, sizeof(b2)), was->pl, was->perr);
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

/* One datagram s on fd, from the sender named (from, fl) (fl 0: unnamed). */
static void expect_dgram(int fd, const char *s, const struct sockaddr_un *from, socklen_t fl, const char *what)
{
	char b[64] = { 0 }, n1[128], n2[128];
	struct sockaddr_un src;
	socklen_t sl = sizeof(src);
	memset(&src, 0, sizeof(src));
	ssize_t r = recvfrom(fd, b, sizeof(b) - 1, MSG_DONTWAIT, (struct sockaddr *)&src, &sl);
	if (r < 0) {
		ft_fail("%s: recvfrom: %s", what, strerror(errno));
		return;
	}
	FT_CHECK(r == (ssize_t)strlen(s) && memcmp(b, s, strlen(s)) == 0, "%s: got '%s', expected '%s'", what, b, s);
	if (fl == 0)
		FT_CHECK(sl <= offsetof(struct sockaddr_un, sun_path), "%s: sender named '%s', expected none", what,
			 show(&src, sl, n1, sizeof(n1)));
	else
		FT_CHECK(sl == fl && memcmp(&src, from, fl) == 0, "%s: sender '%s' (len %u), expected '%s' (len %u)", what,
			 show(&src, sl, n1, sizeof(n1)), sl, show(from, fl, n2, sizeof(n2)), fl);
}

static void send_ok(int fd, const char *s, const char *what)
{
	ssize_t w = send(fd, s, strlen(s), MSG_DONTWAIT);
	FT_CHECK(w == (ssize_t)strlen(s), "%s: send: %zd (%s)", what, w, strerror(errno));
}

int main(void)
{
	ft_init();
	char n1[64], n2[64], n3[64], n4[64];
	snprintf(n1, sizeof(n1), "ferry-dgcli-%d", (int)getpid());
	snprintf(n2, sizeof(n2), "ferry-dgself-%d", (int)getpid());
	snprintf(n3, sizeof(n3), "ferry-dgpa-%d", (int)getpid());
	snprintf(n4, sizeof(n4), "ferry-dgpb-%d", (int)getpid());
	unlink("dg.srv");
	struct sockaddr_un sa, ca, xa, pa, pb;
	socklen_t sl = mkaddr(&sa, "dg.srv", 0), cl = mkaddr(&ca, n1, 1), xl = mkaddr(&xa, n2, 1);
	socklen_t pal = mkaddr(&pa, n3, 1), pbl = mkaddr(&pb, n4, 1);

	int srv = (int)FT_SYS(socket(AF_UNIX, SOCK_DGRAM, 0));
	FT_SYS(bind(srv, (struct sockaddr *)&sa, sl));
	int c1 = (int)FT_SYS(socket(AF_UNIX, SOCK_DGRAM, 0));
	FT_SYS(connect(c1, (struct sockaddr *)&sa, sl));
	int c2 = (int)FT_SYS(socket(AF_UNIX, SOCK_DGRAM, 0));
	FT_SYS(bind(c2, (struct sockaddr *)&ca, cl));
	FT_SYS(connect(c2, (struct sockaddr *)&sa, sl));
	int self = (int)FT_SYS(socket(AF_UNIX, SOCK_DGRAM, 0));
	FT_SYS(bind(self, (struct sockaddr *)&xa, xl));
	FT_SYS(connect(self, (struct sockaddr *)&xa, xl));
	int pr[2];
	FT_SYS(socketpair(AF_UNIX, SOCK_DGRAM, 0, pr));
	FT_SYS(bind(pr[0], (struct sockaddr *)&pa, pal));
	FT_SYS(bind(pr[1], (struct sockaddr *)&pb, pbl));

	int all[6] = { srv, c1, c2, self, pr[0], pr[1] };
	const char *what[6] = { "server", "unbound client", "bound client", "self-connected", "pair end 0", "pair end 1" };
	struct names was[6];
	for (int i = 0; i < 6; i++)
		get_names(all[i], &was[i]);
	/* sanity: the kernel says what this test expects */
	FT_CHECK(was[0].perr == ENOTCONN, "before checkpoint: the server is connected");
	FT_CHECK(was[1].perr == 0 && was[1].pl == sl, "before checkpoint: the unbound client's peer is not dg.srv");
	FT_CHECK(was[4].sl == pal && was[5].pl == pal, "before checkpoint: pair end 0 not named");

	ft_ready();
	ft_wait_restored();

	for (int i = 0; i < 6; i++)
		check_names(all[i], &was[i], what[i]);
	send_ok(c1, "from c1", "unbound client");
	expect_dgram(srv, "from c1", NULL, 0, "server (from the unbound client)");
	send_ok(c2, "from c2", "bound client");
	expect_dgram(srv, "from c2", &ca, cl, "server (from the bound client)");
	ssize_t w = sendto(srv, "to c2", 5, MSG_DONTWAIT, (struct sockaddr *)&ca, cl);
	FT_CHECK(w == 5, "server: sendto the bound client: %zd (%s)", w, strerror(errno));
	expect_dgram(c2, "to c2", &sa, sl, "bound client (from the server)");
	send_ok(self, "to myself", "self-connected");
	expect_dgram(self, "to myself", &xa, xl, "self-connected");
	send_ok(pr[0], "0 to 1", "pair end 0");
	expect_dgram(pr[1], "0 to 1", &pa, pal, "pair end 1");
	send_ok(pr[1], "1 to 0", "pair end 1");
	expect_dgram(pr[0], "1 to 0", &pb, pbl, "pair end 0");
	struct stat st;
	FT_CHECK(stat("dg.srv", &st) == 0 && S_ISSOCK(st.st_mode), "dg.srv missing or not a socket");
	unlink("dg.srv");
	return ft_finish();
}
