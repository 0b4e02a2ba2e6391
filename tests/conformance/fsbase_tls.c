/*
 * fsbase_tls: main + 4 threads each store a distinct value in a __thread
 * variable and a __thread buffer, and record the fs base (ARCH_GET_FS),
 * pthread_self() and the address of the TLS variable. One thread also sets
 * a custom gs base (ARCH_SET_GS). Threads wait in a barrier (futex) while
 * checkpointed. After restore each thread's TLS values, fs base, gs base
 * and TLS addresses must be unchanged.
 */
#include "ferry_test.h"
#include <asm/prctl.h>

#define NT 4

static __thread long tls_val = -1;
static __thread char tls_buf[64];

struct info {
	int id;
	unsigned long fs, gs;
	void *addr;
	pthread_t self;
};

static pthread_barrier_t bar;
static struct info before[NT + 1], after[NT + 1];
static const unsigned long custom_gs = 0x5A5A0000UL;

static void capture(struct info *in, int id)
{
	in->id = id;
	syscall(SYS_arch_prctl, ARCH_GET_FS, &in->fs);
	syscall(SYS_arch_prctl, ARCH_GET_GS, &in->gs);
	in->addr = &tls_val;
	in->self = pthread_self();
}

static void check_tls(int id)
{
	char exp[64];
	snprintf(exp, sizeof(exp), "thread-%d-tls", id);
	FT_CHECK(tls_val == 1000 + id, "thread %d: tls_val = %ld, expected %d", id, tls_val, 1000 + id);
	FT_CHECK(strcmp(tls_buf, exp) == 0, "thread %d: tls_buf = '%.63s'", id, tls_buf);
}

static void *thr(void *arg)
{
	int id = (int)(long)arg;
	tls_val = 1000 + id;
	snprintf(tls_buf, sizeof(tls_buf), "thread-%d-tls", id);
	if (id == 2 && syscall(SYS_arch_prctl, ARCH_SET_GS, custom_gs) != 0)
		ft_die("ARCH_SET_GS: %s", strerror(errno));
	capture(&before[id], id);
	pthread_barrier_wait(&bar); /* setup done */
	pthread_barrier_wait(&bar); /* restored */
	capture(&after[id], id);
	check_tls(id);
	return NULL;
}

int main(void)
{
	ft_init();
	FT_PT(pthread_barrier_init(&bar, NULL, NT + 1));
	tls_val = 1000;
	snprintf(tls_buf, sizeof(tls_buf), "thread-%d-tls", 0);
	capture(&before[0], 0);
	pthread_t th[NT + 1];
	for (int i = 1; i <= NT; i++)
		FT_PT(pthread_create(&th[i], NULL, thr, (void *)(long)i));
	pthread_barrier_wait(&bar);

	ft_ready();
	ft_wait_restored();

	capture(&after[0], 0);
	check_tls(0);
	pthread_barrier_wait(&bar);
	for (int i = 1; i <= NT; i++)
		ft_join(th[i], NULL, 5, "tls thread");
	for (int i = 0; i <= NT; i++) {
		FT_CHECK(after[i].fs == before[i].fs, "thread %d: fs base 0x%lx -> 0x%lx", i, before[i].fs,
			 after[i].fs);
		FT_CHECK(after[i].gs == before[i].gs, "thread %d: gs base 0x%lx -> 0x%lx", i, before[i].gs,
			 after[i].gs);
		FT_CHECK(after[i].addr == before[i].addr, "thread %d: &tls_val %p -> %p", i, before[i].addr,
			 after[i].addr);
		FT_CHECK(after[i].self == before[i].self, "thread %d: pthread_self changed", i);
		FT_CHECK(after[i].fs == (unsigned long)after[i].self,
			 "thread %d: fs base 0x%lx != pthread_self 0x%lx", i, after[i].fs,
			 (unsigned long)after[i].self);
	}
	FT_CHECK(before[2].gs == custom_gs, "custom gs base not set before checkpoint (0x%lx)", before[2].gs);
	for (int i = 1; i <= NT; i++)
		for (int k = i + 1; k <= NT; k++)
			FT_CHECK(before[i].fs != before[k].fs, "threads %d and %d share an fs base", i, k);
	return ft_finish();
}
