/*
 * main_nanosleep: the main thread prints READY and then calls nanosleep(3 s);
 * the checkpoint lands while it sleeps. After restore nanosleep must return
 * 0 with a total elapsed time >= 3 s and < 8 s; then the program waits for
 * SIGUSR2 as usual (already pending by then).
 */
#include "ferry_test.h"

int main(void)
{
	ft_init();
	struct timespec req = { 3, 0 }, rem = { 0, 0 };
	double start = ft_mono();
	ft_ready();
	int r = nanosleep(&req, &rem);
	int err = errno;
	double el = ft_mono() - start;
	ft_wait_restored();

	FT_CHECK(r == 0, "nanosleep returned %d (%s), remaining %ld.%09ld", r, strerror(err),
		 (long)rem.tv_sec, rem.tv_nsec);
	FT_CHECK(el >= 3.0 - 0.002, "nanosleep(3s) returned after only %.3f s", el);
	FT_CHECK(el < 8.0, "nanosleep(3s) took %.3f s", el);
	return ft_finish();
}
