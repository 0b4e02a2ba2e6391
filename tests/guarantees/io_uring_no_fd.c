/*
 * io_uring_no_fd MODE: a read pending on an empty pipe through an
 * io_uring, with raw syscalls (no liburing).
 *   main:   the ring is set up with IORING_SETUP_NO_MMAP and
 *           IORING_SETUP_REGISTERED_FD_ONLY by the main thread: it has no
 *           fd and no mapping of its own, only a slot in the thread's
 *           registered-ring table;
 *   thread: the same, set up by a second thread (the table is per
 *           thread), in slot 0 of that thread only;
 *   fd:     an ordinary ring with an fd and its own mappings.
 * After SIGUSR2 it writes to the pipe and waits for the read to complete
 * on the ring: a process restored without its ring would wait forever
 * (the alarm ends it).
 */
#define _GNU_SOURCE
#include "../conformance/ferry_test.h"
#include <linux/io_uring.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/syscall.h>

/* Newer than the installed 6.1 headers. */
#define SETUP_NO_MMAP (1U << 14)
#define SETUP_REGISTERED_FD_ONLY (1U << 15)
#define SETUP_NO_SQARRAY (1U << 16)
#define ENTER_GETEVENTS 1U
#define ENTER_REGISTERED_RING 16U
#define OP_READ 22
#define USER_DATA 0xfe44

struct ring {
	int id; /* the registered slot, or the fd */
	unsigned flags;
	struct io_uring_params p;
	char *rings;
	struct io_uring_sqe *sqes;
};

static int pipe_fds[2];
static char buf[16];
static struct ring ring;
static volatile int thread_ready;

static void *page(size_t len)
{
	void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		ft_die("mmap: %s", strerror(errno));
	return m;
}

/* A ring of 4 entries: without an fd (rings in our own pages, given to
 * the kernel in the offsets' user_addr fields, which the 6.1 headers
 * still call resv2), or an ordinary one mapped from its fd. */
static void setup(struct ring *r, int with_fd)
{
	memset(&r->p, 0, sizeof(r->p));
	if (with_fd) {
		r->id = (int)FT_SYS(syscall(SYS_io_uring_setup, 4, &r->p));
		r->flags = 0;
		size_t rings_len = r->p.cq_off.cqes + 8 * sizeof(struct io_uring_cqe);
		r->rings = mmap(NULL, rings_len, PROT_READ | PROT_WRITE, MAP_SHARED, r->id, IORING_OFF_SQ_RING);
		r->sqes = mmap(NULL, 4 * sizeof(struct io_uring_sqe), PROT_READ | PROT_WRITE, MAP_SHARED, r->id, IORING_OFF_SQES);
		if (r->rings == MAP_FAILED || r->sqes == MAP_FAILED)
			ft_die("mmap of the ring: %s", strerror(errno));
		if (!(r->p.features & IORING_FEAT_SINGLE_MMAP))
			ft_die("the kernel lacks IORING_FEAT_SINGLE_MMAP");
		return;
	}
	r->rings = page(4096);
	r->sqes = page(4096);
	r->p.flags = SETUP_NO_MMAP | SETUP_REGISTERED_FD_ONLY | SETUP_NO_SQARRAY;
	r->p.cq_off.resv2 = (uintptr_t)r->rings;
	r->p.sq_off.resv2 = (uintptr_t)r->sqes;
	r->id = (int)syscall(SYS_io_uring_setup, 4, &r->p);
	if (r->id < 0)
		ft_die("io_uring_setup(NO_MMAP | REGISTERED_FD_ONLY): %s", strerror(errno));
	r->flags = ENTER_REGISTERED_RING;
}

/* Submits a read of the pipe; it stays pending while the pipe is empty. */
static void submit_read(struct ring *r)
{
	unsigned *tail = (unsigned *)(r->rings + r->p.sq_off.tail);
	unsigned *mask = (unsigned *)(r->rings + r->p.sq_off.ring_mask);
	unsigned t = *tail;
	if (r->p.flags & SETUP_NO_SQARRAY) {
		/* no index array: the tail indexes the SQEs directly */
	} else {
		unsigned *array = (unsigned *)(r->rings + r->p.sq_off.array);
		array[t & *mask] = t & *mask;
	}
	struct io_uring_sqe *sqe = &r->sqes[t & *mask];
	memset(sqe, 0, sizeof(*sqe));
	sqe->opcode = OP_READ;
	sqe->fd = pipe_fds[0];
	sqe->off = (uint64_t)-1;
	sqe->addr = (uintptr_t)buf;
	sqe->len = sizeof(buf);
	sqe->user_data = USER_DATA;
	__atomic_store_n(tail, t + 1, __ATOMIC_RELEASE);
	long n = syscall(SYS_io_uring_enter, r->id, 1, 0, r->flags, NULL, 0);
	if (n != 1)
		ft_die("io_uring_enter (submit): %ld %s", n, strerror(errno));
}

/* Waits for the read's completion and checks it. */
static void complete_read(struct ring *r)
{
	long n;
	/* A thread that was stopped by a tracer can see EINTR once. */
	do
		n = syscall(SYS_io_uring_enter, r->id, 0, 1, r->flags | ENTER_GETEVENTS, NULL, 0);
	while (n < 0 && errno == EINTR);
	FT_CHECK(n >= 0, "io_uring_enter (wait): %s", strerror(errno));
	unsigned *head = (unsigned *)(r->rings + r->p.cq_off.head);
	unsigned *tail = (unsigned *)(r->rings + r->p.cq_off.tail);
	unsigned *mask = (unsigned *)(r->rings + r->p.cq_off.ring_mask);
	unsigned h = *head;
	FT_CHECK(__atomic_load_n(tail, __ATOMIC_ACQUIRE) != h, "no completion on the ring");
	struct io_uring_cqe *cqe = (struct io_uring_cqe *)(r->rings + r->p.cq_off.cqes) + (h & *mask);
	FT_CHECK(cqe->user_data == USER_DATA && cqe->res == 5, "completion: user_data %llx res %d", (unsigned long long)cqe->user_data, cqe->res);
	FT_CHECK(memcmp(buf, "hello", 5) == 0, "read data '%.5s'", buf);
	__atomic_store_n(head, h + 1, __ATOMIC_RELEASE);
}

/* The thread that owns the ring in mode "thread": sets it up, submits,
 * and completes the read once main has written. */
static void *ring_thread(void *arg)
{
	(void)arg;
	setup(&ring, 0);
	submit_read(&ring);
	thread_ready = 1;
	complete_read(&ring);
	return NULL;
}

int main(int argc, char **argv)
{
	ft_init();
	const char *mode = argc > 1 ? argv[1] : "main";
	pthread_t t;
	FT_SYS(pipe(pipe_fds));
	if (strcmp(mode, "main") == 0 || strcmp(mode, "fd") == 0) {
		setup(&ring, strcmp(mode, "fd") == 0);
		submit_read(&ring);
	} else if (strcmp(mode, "thread") == 0) {
		if (pthread_create(&t, NULL, ring_thread, NULL) != 0)
			ft_die("pthread_create");
		while (!thread_ready)
			ft_sleep_ms(1);
	} else {
		ft_die("unknown mode '%s'", mode);
	}
	ft_ready();
	ft_wait_restored();
	alarm(10);
	FT_EQ(write(pipe_fds[1], "hello", 5), 5, "write to the pipe");
	if (strcmp(mode, "thread") == 0)
		pthread_join(t, NULL);
	else
		complete_read(&ring);
	return ft_finish();
}
