/*
 * threads_8_writers: 8 threads each rewrite their own 32 KiB buffer in a
 * loop. Every word is verified (previous pass value) just before it is
 * overwritten, so any page restored with stale or foreign content is
 * detected. After restore: same TIDs, all 8 threads make progress, buffers
 * consistent.
 */
#include "ferry_test.h"

#define NT 8
#define WORDS 4096

struct writer {
	int id;
	pthread_t th;
	pid_t tid_before;
	volatile pid_t tid_after;
	volatile uint64_t seq;
	volatile long errors;
	volatile long first_bad_index;
	volatile uint64_t first_bad_value;
	uint64_t *buf;
};

static struct writer w[NT];
static volatile int phase; /* 0 run, 1 report tid, 2 stop */

static inline uint64_t mk(int id, uint64_t seq)
{
	return ((uint64_t)(0xA0 + id) << 56) | seq;
}

static void *writer(void *arg)
{
	struct writer *me = arg;
	me->tid_before = ft_gettid();
	for (int j = 0; j < WORDS; j++)
		me->buf[j] = mk(me->id, 0);
	uint64_t seq = 0;
	for (;;) {
		uint64_t next = seq + 1;
		for (int j = 0; j < WORDS; j++) {
			uint64_t v = ((volatile uint64_t *)me->buf)[j];
			if (v != mk(me->id, seq)) {
				if (me->errors == 0) {
					me->first_bad_index = j;
					me->first_bad_value = v;
				}
				me->errors++;
			}
			((volatile uint64_t *)me->buf)[j] = mk(me->id, next);
		}
		seq = next;
		__atomic_store_n(&me->seq, seq, __ATOMIC_RELEASE);
		int ph = __atomic_load_n(&phase, __ATOMIC_ACQUIRE);
		if (ph >= 1 && me->tid_after == 0)
			me->tid_after = ft_gettid();
		if (ph == 2)
			break;
	}
	return NULL;
}

int main(void)
{
	ft_init();
	for (int i = 0; i < NT; i++) {
		w[i].id = i;
		w[i].buf = aligned_alloc(4096, WORDS * 8);
		if (!w[i].buf)
			ft_die("alloc");
		FT_PT(pthread_create(&w[i].th, NULL, writer, &w[i]));
	}
	/* all writers running */
	double dl = ft_mono() + 10;
	for (int i = 0; i < NT; i++)
		while (__atomic_load_n(&w[i].seq, __ATOMIC_ACQUIRE) < 3 && ft_mono() < dl)
			ft_sleep_ms(1);
	for (int i = 0; i < NT; i++)
		if (w[i].seq < 3)
			ft_die("writer %d did not start", i);

	ft_ready();
	ft_wait_restored();

	__atomic_store_n(&phase, 1, __ATOMIC_RELEASE);
	dl = ft_mono() + 5;
	for (int i = 0; i < NT; i++)
		while (w[i].tid_after == 0 && ft_mono() < dl)
			ft_sleep_ms(1);
	uint64_t s0[NT], s1[NT];
	for (int i = 0; i < NT; i++)
		s0[i] = __atomic_load_n(&w[i].seq, __ATOMIC_ACQUIRE);
	ft_sleep_ms(300);
	for (int i = 0; i < NT; i++)
		s1[i] = __atomic_load_n(&w[i].seq, __ATOMIC_ACQUIRE);
	__atomic_store_n(&phase, 2, __ATOMIC_RELEASE);

	for (int i = 0; i < NT; i++) {
		FT_CHECK(w[i].tid_after != 0, "writer %d did not run after restore", i);
		FT_CHECK(w[i].tid_after == 0 || w[i].tid_after == w[i].tid_before,
			 "writer %d tid changed: %d -> %d", i, w[i].tid_before, w[i].tid_after);
		FT_CHECK(s1[i] > s0[i], "writer %d made no progress after restore (seq %llu -> %llu)", i,
			 (unsigned long long)s0[i], (unsigned long long)s1[i]);
	}
	for (int i = 0; i < NT; i++) {
		if (ft_join(w[i].th, NULL, 5, "writer") != 0)
			continue;
		FT_CHECK(w[i].errors == 0,
			 "writer %d saw %ld corrupted words (first at index %ld: 0x%llx)", i, w[i].errors,
			 w[i].first_bad_index, (unsigned long long)w[i].first_bad_value);
		uint64_t s = w[i].seq;
		for (int j = 0; j < WORDS; j++)
			if (w[i].buf[j] != mk(i, s)) {
				ft_fail("writer %d final buffer word %d = 0x%llx, expected 0x%llx", i, j,
					(unsigned long long)w[i].buf[j], (unsigned long long)mk(i, s));
				break;
			}
	}
	for (int i = 0; i < NT; i++)
		for (int k = i + 1; k < NT; k++)
			FT_CHECK(w[i].tid_before != w[k].tid_before, "duplicate tids");
	return ft_finish();
}
