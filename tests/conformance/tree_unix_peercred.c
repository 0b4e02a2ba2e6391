/*
 * tree_unix_peercred: SO_PEERCRED of connected unix sockets names the
 * process (and its effective uid and gid) that made the connection, and
 * SO_PEERGROUPS its supplementary groups; a server that checks its
 * clients' credentials relies on them. Set up:
 *   - a STREAM socketpair made by the root (uid 0) before the fork; the
 *     child holds one end;
 *   - a SEQPACKET socketpair made by the root while its effective ids
 *     were uid 1000 / gid 2000 and its groups 4000, 4001 (setresgid/
 *     setresuid keeping the saved ids at 0, then back to 0 and its own
 *     groups); the child holds one end;
 *   - a STREAM connection the child made, after dropping to uid 1001 /
 *     gid 3001 / groups 5000 for good, to a listener of the root bound to an abstract
 *     name; the root accepted it. The accepted end names the child as
 *     uid 1001, the child's end names the root (the listener's creator).
 * The root's end of the first pair is also watched by an epoll instance
 * through an fd number closed since (epoll keys the entry by that
 * number), and the accepted connection by its own number: after restore
 * the entries report the child's messages.
 * The listener's own SO_PEERCRED (its listen() call: the root) is
 * checked too, and so is a connection made to it after restore.
 * Every end's SO_PEERCRED (pid, uid, gid) and SO_PEERGROUPS are recorded at setup and
 * checked against the expected values, and after restore must be
 * identical; a message queued at checkpoint time on each connection is
 * read after restore, and new messages go both ways.
 */
#include "ferry_test.h"
#include <stddef.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <grp.h>
#include <sys/epoll.h>

#define DROP_UID 1000
#define DROP_GID 2000
#define CHILD_UID 1001
#define CHILD_GID 3001

static const char abstract_name[] = "\0ferry-peercred-test";

static struct ucred peer_of(const char *who, int fd)
{
	struct ucred c = { -1, (uid_t)-1, (gid_t)-1 };
	socklen_t l = sizeof(c);
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c, &l) != 0)
		ft_fail("%s: SO_PEERCRED: %s", who, strerror(errno));
	return c;
}

static void expect_cred(const char *who, struct ucred got, pid_t pid, uid_t uid, gid_t gid)
{
	FT_CHECK(got.pid == pid && got.uid == uid && got.gid == gid, "%s: SO_PEERCRED pid %d uid %u gid %u, expected pid %d uid %u gid %u",
		 who, (int)got.pid, got.uid, got.gid, (int)pid, uid, gid);
}

struct groups {
	int n;
	gid_t g[64];
};

static struct groups groups_of(const char *who, int fd)
{
	struct groups r = { -1, { 0 } };
	socklen_t l = sizeof(r.g);
	if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, r.g, &l) != 0)
		ft_fail("%s: SO_PEERGROUPS: %s", who, strerror(errno));
	else
		r.n = (int)(l / sizeof(gid_t));
	return r;
}

static void expect_groups(const char *who, struct groups got, struct groups want)
{
	FT_CHECK(got.n == want.n && memcmp(got.g, want.g, (size_t)(want.n > 0 ? want.n : 0) * sizeof(gid_t)) == 0,
		 "%s: SO_PEERGROUPS has %d groups (first %u), expected %d (first %u)", who, got.n, got.n > 0 ? got.g[0] : 0, want.n,
		 want.n > 0 ? want.g[0] : 0);
}

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif

/* SO_PEERPIDFD (Linux 6.5+) names the same process: the pid its fdinfo shows. */
static void expect_pidfd(const char *who, int fd, pid_t want)
{
	int pfd = -1;
	socklen_t l = sizeof(pfd);
	if (getsockopt(fd, SOL_SOCKET, SO_PEERPIDFD, &pfd, &l) != 0) {
		if (errno == ENOPROTOOPT)
			return;
		ft_fail("%s: SO_PEERPIDFD: %s", who, strerror(errno));
		return;
	}
	char v[32] = "";
	FT_CHECK(ft_fdinfo_field(pfd, "Pid", v, sizeof(v)) == 0 && atoi(v) == (int)want, "%s: SO_PEERPIDFD names pid '%s', expected %d", who, v,
		 (int)want);
	close(pfd);
}

static void send_msg(const char *who, int fd, const char *s)
{
	ssize_t w = send(fd, s, strlen(s), MSG_NOSIGNAL);
	FT_CHECK(w == (ssize_t)strlen(s), "%s: send '%s': %zd (%s)", who, s, w, strerror(errno));
}

static void expect_msg(const char *who, int fd, const char *s)
{
	char b[64] = { 0 };
	size_t n = strlen(s);
	ssize_t r = recv(fd, b, n, MSG_WAITALL);
	FT_CHECK(r == (ssize_t)n && memcmp(b, s, n) == 0, "%s: got %zd bytes '%s', expected '%s' (%s)", who, r, b, s,
		 r < 0 ? strerror(errno) : "");
}

static socklen_t abstract_addr(struct sockaddr_un *a)
{
	memset(a, 0, sizeof(*a));
	a->sun_family = AF_UNIX;
	memcpy(a->sun_path, abstract_name, sizeof(abstract_name) - 1);
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + sizeof(abstract_name) - 1);
}

int main(void)
{
	ft_init();
	ft_tree_begin();
	pid_t root = getpid();
	int sp1[2], sp2[2];
	struct groups own;
	own.n = getgroups(64, own.g);
	FT_SYS(own.n);
	FT_SYS(socketpair(AF_UNIX, SOCK_STREAM, 0, sp1));
	/* Made as uid 1000 / gid 2000 / groups 4000, 4001, the saved ids
	 * staying 0 to switch back. */
	struct groups dropped = { 2, { 4000, 4001 } };
	FT_SYS(setgroups((size_t)dropped.n, dropped.g));
	FT_SYS(setresgid(-1, DROP_GID, 0));
	FT_SYS(setresuid(-1, DROP_UID, 0));
	FT_SYS(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sp2));
	FT_SYS(setresuid(0, 0, 0));
	FT_SYS(setresgid(0, 0, 0));
	FT_SYS(setgroups((size_t)own.n, own.g));
	struct groups childs = { 1, { 5000 } };
	struct sockaddr_un la;
	socklen_t ll = abstract_addr(&la);
	int lst = socket(AF_UNIX, SOCK_STREAM, 0);
	FT_SYS(lst);
	FT_SYS(bind(lst, (struct sockaddr *)&la, ll));
	FT_SYS(listen(lst, 4));

	pid_t child = ft_fork();
	if (child == 0) {
		close(sp1[0]);
		close(sp2[0]);
		close(lst);
		/* Another user for good: the connection it makes names it. */
		FT_SYS(setgroups((size_t)childs.n, childs.g));
		FT_SYS(setresgid(CHILD_GID, CHILD_GID, CHILD_GID));
		FT_SYS(setresuid(CHILD_UID, CHILD_UID, CHILD_UID));
		int c = socket(AF_UNIX, SOCK_STREAM, 0);
		FT_SYS(c);
		FT_SYS(connect(c, (struct sockaddr *)&la, ll));
		struct ucred before[3] = { peer_of("child: pair end", sp1[1]), peer_of("child: pair made as uid 1000", sp2[1]),
					   peer_of("child: connected client", c) };
		expect_cred("child before checkpoint: pair end", before[0], root, 0, 0);
		expect_cred("child before checkpoint: pair made as uid 1000", before[1], root, DROP_UID, DROP_GID);
		expect_cred("child before checkpoint: connected client (listener's creator)", before[2], root, 0, 0);
		struct groups gbefore[3] = { groups_of("child: pair end", sp1[1]), groups_of("child: pair made as uid 1000", sp2[1]),
					     groups_of("child: connected client", c) };
		expect_groups("child before checkpoint: pair end", gbefore[0], own);
		expect_groups("child before checkpoint: pair made as uid 1000", gbefore[1], dropped);
		expect_groups("child before checkpoint: connected client", gbefore[2], own);
		send_msg("child: queue on the connection", c, "queued-up");
		ft_child_ready();
		ft_child_wait_go();
		struct ucred after[3] = { peer_of("child: pair end", sp1[1]), peer_of("child: pair made as uid 1000", sp2[1]),
					  peer_of("child: connected client", c) };
		const char *what[3] = { "child: pair end", "child: pair made as uid 1000", "child: connected client" };
		for (int i = 0; i < 3; i++) {
			expect_cred(what[i], after[i], before[i].pid, before[i].uid, before[i].gid);
			expect_groups(what[i], groups_of(what[i], i == 0 ? sp1[1] : i == 1 ? sp2[1] : c), gbefore[i]);
		}
		expect_msg("child: queued on the pair", sp1[1], "queued-1");
		expect_msg("child: queued on the uid 1000 pair", sp2[1], "queued-2");
		expect_msg("child: queued on the connection", c, "queued-3");
		send_msg("child: pair", sp1[1], "pong-1");
		send_msg("child: uid 1000 pair", sp2[1], "pong-2");
		send_msg("child: connection", c, "pong-3");
		ft_child_exit("child");
	}
	close(sp1[1]);
	close(sp2[1]);
	int acc = accept(lst, NULL, NULL);
	FT_SYS(acc);
	struct ucred lbefore = peer_of("root: listener", lst);
	expect_cred("root before checkpoint: listener", lbefore, root, 0, 0);
	struct ucred before[3] = { peer_of("root: pair end", sp1[0]), peer_of("root: pair made as uid 1000", sp2[0]),
				   peer_of("root: accepted connection", acc) };
	expect_cred("root before checkpoint: pair end", before[0], root, 0, 0);
	expect_cred("root before checkpoint: pair made as uid 1000", before[1], root, DROP_UID, DROP_GID);
	expect_cred("root before checkpoint: accepted connection (the connecting child)", before[2], child, CHILD_UID, CHILD_GID);
	struct groups gbefore[3] = { groups_of("root: pair end", sp1[0]), groups_of("root: pair made as uid 1000", sp2[0]),
				     groups_of("root: accepted connection", acc) };
	expect_groups("root before checkpoint: pair end", gbefore[0], own);
	expect_groups("root before checkpoint: pair made as uid 1000", gbefore[1], dropped);
	expect_groups("root before checkpoint: accepted connection", gbefore[2], childs);
	int ep = epoll_create1(0);
	FT_SYS(ep);
	int gone = dup(sp1[0]);
	FT_SYS(gone);
	struct epoll_event ev = { .events = EPOLLIN, .data.u64 = 0x5eedULL };
	FT_SYS(epoll_ctl(ep, EPOLL_CTL_ADD, gone, &ev));
	close(gone);
	struct epoll_event ev2 = { .events = EPOLLIN, .data.u64 = 0xacceULL };
	FT_SYS(epoll_ctl(ep, EPOLL_CTL_ADD, acc, &ev2));
	send_msg("root: queue on the pair", sp1[0], "queued-1");
	send_msg("root: queue on the uid 1000 pair", sp2[0], "queued-2");
	send_msg("root: queue on the connection", acc, "queued-3");
	ft_tree_wait_ready(1);
	ft_ready();
	ft_tree_wait_restored();

	struct ucred after[3] = { peer_of("root: pair end", sp1[0]), peer_of("root: pair made as uid 1000", sp2[0]),
				  peer_of("root: accepted connection", acc) };
	const char *what[3] = { "root: pair end", "root: pair made as uid 1000", "root: accepted connection" };
	for (int i = 0; i < 3; i++) {
		expect_cred(what[i], after[i], before[i].pid, before[i].uid, before[i].gid);
		expect_groups(what[i], groups_of(what[i], i == 0 ? sp1[0] : i == 1 ? sp2[0] : acc), gbefore[i]);
	}
	expect_pidfd("root: pair end", sp1[0], root);
	expect_pidfd("root: accepted connection", acc, child);
	struct ucred lafter = peer_of("root: listener", lst);
	expect_cred("root: listener", lafter, lbefore.pid, lbefore.uid, lbefore.gid);
	int late = socket(AF_UNIX, SOCK_STREAM, 0);
	FT_SYS(late);
	FT_CHECK(connect(late, (struct sockaddr *)&la, ll) == 0, "connect to the listener after restore: %s", strerror(errno));
	expect_cred("root: client connected after restore (the listener's creator)", peer_of("root: late client", late), root, 0, 0);
	struct epoll_event first = { 0, { 0 } };
	FT_CHECK(epoll_wait(ep, &first, 1, 0) == 1 && first.data.u64 == 0xacceULL && (first.events & EPOLLIN),
		 "epoll entry of the accepted connection (queued bytes): events %#x data %#llx", first.events,
		 (unsigned long long)first.data.u64);
	expect_msg("root: queued on the connection", acc, "queued-up");
	ft_go(child, "child");
	/* The child's replies come in any order (the connection may even be
	 * closed first): wait for the pair's entry among whatever is ready. */
	struct epoll_event got = { 0, { 0 } };
	double until = ft_mono() + 5;
	while (ft_mono() < until && !(got.data.u64 == 0x5eedULL && (got.events & EPOLLIN))) {
		struct epoll_event evs[4];
		int n = epoll_wait(ep, evs, 4, 100);
		for (int i = 0; i < n; i++)
			if (evs[i].data.u64 == 0x5eedULL)
				got = evs[i];
	}
	FT_CHECK(got.data.u64 == 0x5eedULL && (got.events & EPOLLIN),
		 "epoll entry of the pair end (by a closed fd number): events %#x data %#llx", got.events, (unsigned long long)got.data.u64);
	expect_msg("root: pair", sp1[0], "pong-1");
	expect_msg("root: uid 1000 pair", sp2[0], "pong-2");
	expect_msg("root: connection", acc, "pong-3");
	ft_reap(child, "child");
	return ft_finish();
}
