/*
 * proc_personality: personality(ADDR_NO_RANDOMIZE | UNAME26). After
 * restore: personality(0xffffffff) returns the same value,
 * /proc/self/personality matches, and uname() reports a 2.6.x release
 * (UNAME26 in effect).
 */
#include "ferry_test.h"
#include <sys/personality.h>
#include <sys/utsname.h>

int main(void)
{
	ft_init();
	int want = ADDR_NO_RANDOMIZE | UNAME26;
	FT_SYS(personality((unsigned long)want));
	int before = personality(0xffffffff);
	char pb[32] = "";
	ft_read_file("/proc/self/personality", pb, sizeof(pb));

	ft_ready();
	ft_wait_restored();

	int after = personality(0xffffffff);
	FT_EQ(after, before, "personality");
	FT_CHECK((after & want) == want, "personality 0x%x lacks 0x%x", after, want);
	char pa[32] = "";
	ft_read_file("/proc/self/personality", pa, sizeof(pa));
	FT_CHECK(strcmp(pa, pb) == 0, "/proc/self/personality '%s' -> '%s'", pb, pa);
	struct utsname u;
	uname(&u);
	FT_CHECK(strncmp(u.release, "2.6.", 4) == 0, "uname release '%s' (UNAME26 lost)", u.release);
	return ft_finish();
}
