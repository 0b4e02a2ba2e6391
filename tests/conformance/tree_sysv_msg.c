/*
 * tree_sysv_msg: a SysV message queue (IPC_PRIVATE, mode 0600) with 4
 * messages queued at checkpoint time, in this order: mtype 5 (100 bytes),
 * mtype 2 (7 bytes), mtype 9 (3000 bytes), mtype 2 (1 byte). After
 * restore the root finds the queue under the same id with IPC_STAT
 * msg_qnum 4, msg_cbytes 3108 and mode 0600; the child then receives by
 * type: msgrcv(9) the 3000-byte one, msgrcv(2) the first type-2 message,
 * msgrcv(0) the type-5 one (now first in the queue), msgrcv(-3) the second
 * type-2 message, each with its exact size and content; then the queue is
 * empty (ENOMSG). The child sends a reply (mtype 77), the root receives it.
 * IPC_RMID at the end, and by ft_die/the safety alarm.
 *
 * Synchronisation: report pipe before READY; after restore the root checks
 * the queue, sends the go, and reaps the child before receiving its reply.
 */
#include "ferry_test.h"
#include <sys/ipc.h>
#include <sys/msg.h>

struct msg {
	long mtype;
	char text[4096];
};

static int qid = -1;

static void cleanup(void)
{
	if (qid >= 0 && msgctl(qid, IPC_RMID, NULL) != 0)
		ft_log("msgctl(%d, IPC_RMID): %s", qid, strerror(errno));
	qid = -1;
}

static void fill(char *b, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		b[i] = (char)(seed * 37u + i * 11u + (i >> 5));
}

static void send_msg(long type, size_t n, unsigned seed)
{
	static struct msg m;
	m.mtype = type;
	fill(m.text, n, seed);
	if (msgsnd(qid, &m, n, IPC_NOWAIT) != 0)
		ft_die("msgsnd(type %ld, %zu bytes): %s", type, n, strerror(errno));
}

/* msgrcv(msgtyp) must return a message of type want_type, n bytes of fill(seed). */
static void expect_msg(const char *who, long msgtyp, long want_type, size_t n, unsigned seed)
{
	static struct msg m;
	static char want[4096];
	memset(&m, 0, sizeof(m));
	ssize_t r = msgrcv(qid, &m, sizeof(m.text), msgtyp, IPC_NOWAIT);
	if (r < 0) {
		ft_fail("%s: msgrcv(msgtyp %ld): %s", who, msgtyp, strerror(errno));
		return;
	}
	FT_CHECK(m.mtype == want_type, "%s: msgrcv(msgtyp %ld) returned mtype %ld, expected %ld", who, msgtyp, m.mtype,
		 want_type);
	FT_CHECK(r == (ssize_t)n, "%s: msgrcv(msgtyp %ld) returned %zd bytes, expected %zu", who, msgtyp, r, n);
	fill(want, n, seed);
	FT_CHECK(r != (ssize_t)n || memcmp(m.text, want, n) == 0, "%s: msgrcv(msgtyp %ld): content differs", who,
		 msgtyp);
}

int main(void)
{
	ft_init();
	ft_set_cleanup(cleanup);
	qid = msgget(IPC_PRIVATE, IPC_CREAT | 0600);
	if (qid < 0)
		ft_die("msgget: %s", strerror(errno));
	send_msg(5, 100, 1);
	send_msg(2, 7, 2);
	send_msg(9, 3000, 3);
	send_msg(2, 1, 4);

	ft_tree_begin();
	pid_t kid = ft_fork();
	if (kid == 0) {
		ft_child_ready();
		ft_child_wait_go();
		expect_msg("child", 9, 9, 3000, 3);
		expect_msg("child", 2, 2, 7, 2);
		expect_msg("child", 0, 5, 100, 1);
		expect_msg("child", -3, 2, 1, 4);
		static struct msg m;
		errno = 0;
		ssize_t r = msgrcv(qid, &m, sizeof(m.text), 0, IPC_NOWAIT);
		FT_CHECK(r < 0 && errno == ENOMSG, "child: queue not empty after 4 messages (msgrcv %zd type %ld)", r,
			 m.mtype);
		m.mtype = 77;
		memcpy(m.text, "reply", 5);
		FT_CHECK(msgsnd(qid, &m, 5, IPC_NOWAIT) == 0, "child: msgsnd reply: %s", strerror(errno));
		ft_child_exit("child");
	}
	ft_tree_wait_ready(1);

	ft_ready();
	ft_tree_wait_restored();

	struct msqid_ds ds;
	if (msgctl(qid, IPC_STAT, &ds) != 0) {
		ft_fail("msgctl(%d, IPC_STAT) after restore: %s", qid, strerror(errno));
	} else {
		FT_EQ(ds.msg_qnum, 4, "msg_qnum");
		FT_EQ(ds.msg_cbytes, 100 + 7 + 3000 + 1, "msg_cbytes");
		FT_EQ(ds.msg_perm.mode & 0777, 0600, "mode");
		FT_EQ(ds.msg_perm.__key, IPC_PRIVATE, "key");
	}
	ft_go(kid, "child");
	ft_reap(kid, "child");
	static struct msg m;
	memset(&m, 0, sizeof(m));
	ssize_t r = msgrcv(qid, &m, sizeof(m.text), 0, IPC_NOWAIT);
	FT_CHECK(r == 5 && m.mtype == 77 && memcmp(m.text, "reply", 5) == 0,
		 "root: child's reply: msgrcv %zd mtype %ld (%s)", r, m.mtype, r < 0 ? strerror(errno) : "");
	ft_run_cleanup();
	return ft_finish();
}
