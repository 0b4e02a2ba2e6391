/*
 * sock_unix_opts: SOL_SOCKET options on every kind of unix socket ferry
 * restores: STREAM, DGRAM and SEQPACKET socketpairs (one end of each
 * with data queued), a listener, an accepted end and its client, an
 * unbound DGRAM socket, a STREAM end whose peer was closed with "tail"
 * queued, and a STREAM pair whose end with a 4 MiB send buffer queued
 * 1 MiB to the other (more than a default buffer holds: restore must
 * grow the buffer it refills from). Each socket gets its own values:
 * SO_SNDBUF, SO_RCVBUF (one forced above net.core.wmem_max, one above
 * rmem_max), SO_RCVTIMEO, SO_SNDTIMEO, SO_KEEPALIVE, SO_RCVLOWAT,
 * SO_PEEK_OFF (2 on the stream end with "abcdef" queued), SO_MARK,
 * SO_PRIORITY (7 on one: needs CAP_NET_ADMIN), SO_LINGER (one with
 * lingering off but a time kept),
 * SO_PASSSEC and SO_PASSPIDFD (on sockets with nothing queued), and the
 * flags SO_DEBUG, SO_REUSEADDR, SO_DONTROUTE, SO_BROADCAST, SO_OOBINLINE,
 * SO_NO_CHECK, SO_TIMESTAMP(NS), SO_RXQ_OVFL, SO_SELECT_ERR_QUEUE,
 * SO_RCVMARK, SO_PREFER_BUSY_POLL, SO_RCVPRIORITY, with SO_BUSY_POLL
 * and SO_PASSRIGHTS off on some. After restore every option (and SO_BUF_LOCK) reads the
 * same bytes, a peek at the stream end starts at its offset, and the
 * queued data (all 1 MiB of it) comes out.
 */
#include "ferry_test.h"
#include <stddef.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>

#ifndef SO_PASSSEC
#define SO_PASSSEC 34
#endif
#ifndef SO_PEEK_OFF
#define SO_PEEK_OFF 42
#endif
#ifndef SO_RXQ_OVFL
#define SO_RXQ_OVFL 40
#endif
#ifndef SO_SELECT_ERR_QUEUE
#define SO_SELECT_ERR_QUEUE 45
#endif
#ifndef SO_BUF_LOCK
#define SO_BUF_LOCK 72
#endif
#ifndef SO_RCVMARK
#define SO_RCVMARK 75
#endif
#ifndef SO_PASSPIDFD
#define SO_PASSPIDFD 76
#endif
#ifndef SO_PREFER_BUSY_POLL
#define SO_PREFER_BUSY_POLL 69
#endif
#ifndef SO_RCVPRIORITY
#define SO_RCVPRIORITY 82
#endif
#ifndef SO_PASSRIGHTS
#define SO_PASSRIGHTS 83
#endif

enum { ST_A, ST_B, DG_A, DG_B, SEQ_A, SEQ_B, LISTENER, ACCEPTED, CLIENT, UNBOUND, DEAD, BIG_A, BIG_B, N };
static const char *kind[N] = { "stream end (data queued)", "stream end", "datagram end (datagram queued)",
			       "datagram end", "seqpacket end (record queued)", "seqpacket end", "listener",
			       "accepted end", "client", "unbound datagram socket", "stream end, peer closed",
			       "stream end (1 MiB queued)", "stream end (4 MiB send buffer)" };
static const int queued[N] = { [ST_A] = 1, [DG_A] = 1, [SEQ_A] = 1, [DEAD] = 1, [BIG_A] = 1 };
/* More than a default send buffer holds: the sender's own buffer let it queue. */
#define BIG (1 << 20)
static unsigned char big[BIG];

/* Every option compared after restore. */
static const struct {
	int name;
	const char *what;
} opts[] = {
	{ SO_SNDBUF, "SO_SNDBUF" },
	{ SO_RCVBUF, "SO_RCVBUF" },
	{ SO_BUF_LOCK, "SO_BUF_LOCK" },
	{ SO_DEBUG, "SO_DEBUG" },
	{ SO_REUSEADDR, "SO_REUSEADDR" },
	{ SO_DONTROUTE, "SO_DONTROUTE" },
	{ SO_BROADCAST, "SO_BROADCAST" },
	{ SO_KEEPALIVE, "SO_KEEPALIVE" },
	{ SO_OOBINLINE, "SO_OOBINLINE" },
	{ SO_NO_CHECK, "SO_NO_CHECK" },
	{ SO_PRIORITY, "SO_PRIORITY" },
	{ SO_LINGER, "SO_LINGER" },
	{ SO_RCVLOWAT, "SO_RCVLOWAT" },
	{ SO_RCVTIMEO, "SO_RCVTIMEO" },
	{ SO_SNDTIMEO, "SO_SNDTIMEO" },
	{ SO_TIMESTAMP, "SO_TIMESTAMP" },
	{ SO_TIMESTAMPNS, "SO_TIMESTAMPNS" },
	{ SO_PASSSEC, "SO_PASSSEC" },
	{ SO_PASSPIDFD, "SO_PASSPIDFD" },
	{ SO_MARK, "SO_MARK" },
	{ SO_RXQ_OVFL, "SO_RXQ_OVFL" },
	{ SO_SELECT_ERR_QUEUE, "SO_SELECT_ERR_QUEUE" },
	{ SO_RCVMARK, "SO_RCVMARK" },
	{ SO_BUSY_POLL, "SO_BUSY_POLL" },
	{ SO_PREFER_BUSY_POLL, "SO_PREFER_BUSY_POLL" },
	{ SO_RCVPRIORITY, "SO_RCVPRIORITY" },
	{ SO_PASSRIGHTS, "SO_PASSRIGHTS" },
	{ SO_PEEK_OFF, "SO_PEEK_OFF" },
};
#define NOPTS (sizeof(opts) / sizeof(opts[0]))

struct value {
	socklen_t len;
	int err;
	unsigned char b[32];
};
static struct value before[N][NOPTS];

static void read_opt(int fd, int name, struct value *v)
{
	memset(v, 0, sizeof(*v));
	v->len = sizeof(v->b);
	v->err = getsockopt(fd, SOL_SOCKET, name, v->b, &v->len) ? errno : 0;
}

static void set_int(int fd, int name, int v, const char *what, int i)
{
	if (setsockopt(fd, SOL_SOCKET, name, &v, sizeof(v)) != 0)
		ft_die("%s: setsockopt %s %d: %s", kind[i], what, v, strerror(errno));
}

static int sysctl_int(const char *path)
{
	char b[32] = { 0 };
	int fd = (int)FT_SYS(open(path, O_RDONLY));
	FT_SYS(read(fd, b, sizeof(b) - 1));
	close(fd);
	return atoi(b);
}

/* Values that differ from socket to socket, so that no two are swapped unseen. */
static void set_all(int fd, int i)
{
	if (i == BIG_B)
		set_int(fd, SO_SNDBUF, 2 << 20, "SO_SNDBUF", i);
	else if (i == ST_A)
		set_int(fd, SO_SNDBUFFORCE, sysctl_int("/proc/sys/net/core/wmem_max") + 8192, "SO_SNDBUFFORCE", i);
	else
		set_int(fd, SO_SNDBUF, 32768 + 4096 * i, "SO_SNDBUF", i);
	if (i == ST_B)
		set_int(fd, SO_RCVBUFFORCE, sysctl_int("/proc/sys/net/core/rmem_max") + 4096, "SO_RCVBUFFORCE", i);
	else if (i % 3 != 2)
		set_int(fd, SO_RCVBUF, 40960 + 4096 * i, "SO_RCVBUF", i);
	static const int flags[] = { SO_DEBUG, SO_REUSEADDR, SO_DONTROUTE, SO_BROADCAST,
				     SO_KEEPALIVE, SO_OOBINLINE, SO_NO_CHECK, SO_RXQ_OVFL,
				     SO_SELECT_ERR_QUEUE, SO_RCVMARK, SO_PREFER_BUSY_POLL, SO_RCVPRIORITY };
	for (int k = 0; k < (int)(sizeof(flags) / sizeof(flags[0])); k++)
		if ((i + k) % 2)
			set_int(fd, flags[k], 1, "a flag", i);
	set_int(fd, SO_PRIORITY, i == CLIENT ? 7 : i % 7, "SO_PRIORITY", i);
	set_int(fd, SO_MARK, 0x100 + i, "SO_MARK", i);
	if (i % 3 == 0)
		set_int(fd, SO_BUSY_POLL, 10 + i, "SO_BUSY_POLL", i);
	if (i % 2)
		set_int(fd, SO_PASSRIGHTS, 0, "SO_PASSRIGHTS", i);
	set_int(fd, SO_RCVLOWAT, 3 + i, "SO_RCVLOWAT", i);
	struct timeval rt = { 1 + i, 250000 }, wt = { 2 + i, 500000 };
	FT_SYS(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &rt, sizeof(rt)));
	FT_SYS(setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &wt, sizeof(wt)));
	struct linger lg = { 1, 5 + i };
	FT_SYS(setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)));
	if (i % 2) {
		/* Lingering off keeps the time. */
		lg.l_onoff = 0;
		FT_SYS(setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)));
	}
	if (i % 3 == 1)
		set_int(fd, SO_TIMESTAMP, 1, "SO_TIMESTAMP", i);
	if (i % 3 == 2)
		set_int(fd, SO_TIMESTAMPNS, 1, "SO_TIMESTAMPNS", i);
	if (!queued[i]) {
		set_int(fd, SO_PASSSEC, i % 2, "SO_PASSSEC", i);
		set_int(fd, SO_PASSPIDFD, (i + 1) % 2, "SO_PASSPIDFD", i);
	}
	set_int(fd, SO_PEEK_OFF, i == ST_A ? 2 : (i % 4 == 1 ? 0 : -1), "SO_PEEK_OFF", i);
}

static socklen_t abstract_name(struct sockaddr_un *a)
{
	memset(a, 0, sizeof(*a));
	a->sun_family = AF_UNIX;
	int n = snprintf(a->sun_path + 1, sizeof(a->sun_path) - 1, "ferry-unixopts-%d", (int)getpid());
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

static void expect(int fd, int flags, const char *s, const char *what)
{
	char b[64] = { 0 };
	ssize_t r = recv(fd, b, sizeof(b) - 1, flags | MSG_DONTWAIT);
	FT_CHECK(r == (ssize_t)strlen(s) && memcmp(b, s, strlen(s)) == 0, "%s: recv %zd '%s' (%s), expected '%s'", what,
		 r, r > 0 ? b : "", r < 0 ? strerror(errno) : "-", s);
}

int main(void)
{
	ft_init();
	int fd[N], sv[2];
	FT_SYS(socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
	fd[ST_A] = sv[0], fd[ST_B] = sv[1];
	FT_SYS(send(fd[ST_B], "abcdef", 6, 0));
	FT_SYS(socketpair(AF_UNIX, SOCK_DGRAM, 0, sv));
	fd[DG_A] = sv[0], fd[DG_B] = sv[1];
	FT_SYS(send(fd[DG_B], "dgram", 5, 0));
	FT_SYS(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv));
	fd[SEQ_A] = sv[0], fd[SEQ_B] = sv[1];
	FT_SYS(send(fd[SEQ_B], "record", 6, 0));
	struct sockaddr_un la;
	socklen_t ll = abstract_name(&la);
	fd[LISTENER] = (int)FT_SYS(socket(AF_UNIX, SOCK_STREAM, 0));
	FT_SYS(bind(fd[LISTENER], (struct sockaddr *)&la, ll));
	FT_SYS(listen(fd[LISTENER], 4));
	fd[CLIENT] = (int)FT_SYS(socket(AF_UNIX, SOCK_STREAM, 0));
	FT_SYS(connect(fd[CLIENT], (struct sockaddr *)&la, ll));
	fd[ACCEPTED] = (int)FT_SYS(accept(fd[LISTENER], NULL, NULL));
	fd[UNBOUND] = (int)FT_SYS(socket(AF_UNIX, SOCK_DGRAM, 0));
	FT_SYS(socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
	FT_SYS(send(sv[1], "tail", 4, 0));
	close(sv[1]);
	fd[DEAD] = sv[0];
	FT_SYS(socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
	fd[BIG_A] = sv[0], fd[BIG_B] = sv[1];
	for (int i = 0; i < N; i++) {
		set_all(fd[i], i);
		for (size_t k = 0; k < NOPTS; k++)
			read_opt(fd[i], opts[k].name, &before[i][k]);
	}
	for (int i = 0; i < BIG; i++)
		big[i] = (unsigned char)(i * 7 + i / 4096);
	for (size_t off = 0; off < BIG;)
		off += (size_t)FT_SYS(send(fd[BIG_B], big + off, BIG - off, MSG_DONTWAIT));
	ft_ready();
	ft_wait_restored();
	for (int i = 0; i < N; i++)
		for (size_t k = 0; k < NOPTS; k++) {
			struct value now, *was = &before[i][k];
			read_opt(fd[i], opts[k].name, &now);
			int same = now.err == was->err && now.len == was->len && memcmp(now.b, was->b, now.len) == 0;
			int v = 0, w = 0;
			memcpy(&v, now.b, sizeof(v));
			memcpy(&w, was->b, sizeof(w));
			FT_CHECK(same, "%s (fd %d): %s reads %d (%u bytes, errno %d), was %d (%u bytes, errno %d)", kind[i],
				 fd[i], opts[k].what, v, now.len, now.err, w, was->len, was->err);
		}
	/* The peek offset counts in the queue: a peek starts at "c". */
	expect(fd[ST_A], MSG_PEEK, "cdef", "stream end, peek at offset 2");
	expect(fd[ST_A], 0, "abcdef", "stream end");
	expect(fd[DG_A], 0, "dgram", "datagram end");
	expect(fd[SEQ_A], 0, "record", "seqpacket end");
	expect(fd[DEAD], 0, "tail", "stream end, peer closed");
	static unsigned char got[BIG];
	size_t n = 0;
	for (ssize_t r; n < BIG && (r = recv(fd[BIG_A], got + n, BIG - n, MSG_DONTWAIT)) > 0;)
		n += (size_t)r;
	FT_CHECK(n == BIG && memcmp(got, big, BIG) == 0, "1 MiB queued: %zu bytes back, %s", n,
		 memcmp(got, big, n) ? "different" : "same so far");
	FT_SYS(send(fd[CLIENT], "new", 3, 0));
	expect(fd[ACCEPTED], 0, "new", "accepted end");
	return ft_finish();
}
