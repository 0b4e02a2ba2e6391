/*
 * fd_eventfd: eventfd A (EFD_NONBLOCK) with counter 42 (5 + 37 written) and
 * eventfd B (EFD_SEMAPHORE|EFD_NONBLOCK|EFD_CLOEXEC) with counter 3. After
 * restore: fdinfo eventfd-count unchanged, reading A returns 42 then EAGAIN,
 * reading B returns 1, 1, 1 then EAGAIN, flags kept.
 */
#include "ferry_test.h"
#include <sys/eventfd.h>

int main(void)
{
	ft_init();
	int a = (int)FT_SYS(eventfd(0, EFD_NONBLOCK));
	int b = (int)FT_SYS(eventfd(3, EFD_SEMAPHORE | EFD_NONBLOCK | EFD_CLOEXEC));
	uint64_t v = 5;
	FT_SYS(write(a, &v, 8));
	v = 37;
	FT_SYS(write(a, &v, 8));
	char ca[64] = "", cb[64] = "";
	ft_fdinfo_field(a, "eventfd-count", ca, sizeof(ca));
	ft_fdinfo_field(b, "eventfd-count", cb, sizeof(cb));
	int fla = fcntl(a, F_GETFL), flb = fcntl(b, F_GETFL), fdb = fcntl(b, F_GETFD);

	ft_ready();
	ft_wait_restored();

	char x[64] = "";
	ft_fdinfo_field(a, "eventfd-count", x, sizeof(x));
	FT_CHECK(strcmp(x, ca) == 0, "A eventfd-count '%s' -> '%s'", ca, x);
	ft_fdinfo_field(b, "eventfd-count", x, sizeof(x));
	FT_CHECK(strcmp(x, cb) == 0, "B eventfd-count '%s' -> '%s'", cb, x);
	FT_EQ(fcntl(a, F_GETFL), fla, "A F_GETFL");
	FT_EQ(fcntl(b, F_GETFL), flb, "B F_GETFL");
	FT_EQ(fcntl(b, F_GETFD), fdb, "B F_GETFD");
	uint64_t r = 0;
	FT_EQ(read(a, &r, 8), 8, "read A");
	FT_EQ(r, 42, "A counter");
	FT_CHECK(read(a, &r, 8) < 0 && errno == EAGAIN, "A not empty after read");
	for (int i = 0; i < 3; i++) {
		r = 0;
		FT_EQ(read(b, &r, 8), 8, "read B");
		FT_EQ(r, 1, "B semaphore read value");
	}
	FT_CHECK(read(b, &r, 8) < 0 && errno == EAGAIN, "B not empty after 3 reads (semaphore mode lost?)");
	v = 2;
	FT_EQ(write(b, &v, 8), 8, "write B");
	FT_CHECK(read(b, &r, 8) == 8 && r == 1, "B semaphore mode after restore");
	return ft_finish();
}
