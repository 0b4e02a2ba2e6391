/*
 * A process without securebits, restored by a ferry that runs with
 * SECBIT_NO_SETUID_FIXUP (as a service manager may start it): the restore's
 * fork inherits ferry's bits, and the restored process must have the
 * image's (none), not ferry's. The harness runs ferry under
 * `setpriv --securebits +no_setuid_fixup` for this program.
 */
#include "ferry_test.h"
#include <sys/prctl.h>

int main(void)
{
	ft_init();
	long bits = prctl(PR_GET_SECUREBITS, 0, 0, 0, 0);
	if (bits != 0)
		ft_die("started with securebits already set");
	ft_ready();
	ft_wait_restored();

	FT_EQ(prctl(PR_GET_SECUREBITS, 0, 0, 0, 0), 0, "PR_GET_SECUREBITS");
	return ft_finish();
}
