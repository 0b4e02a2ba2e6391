/*
 * proc_cmdline_auxv: the mm-level process metadata. argv[0]'s first byte is
 * changed in memory (like setproctitle). After restore: /proc/self/cmdline,
 * /proc/self/environ and /proc/self/auxv are byte-identical;
 * /proc/self/stat fields startcode, endcode, startstack (26-28) and
 * start_data .. env_end (45-51) are unchanged; /proc/self/exe points to the
 * same binary; the AT_RANDOM bytes are unchanged; getenv still works.
 */
#include "ferry_test.h"
#include <sys/auxv.h>

static char cmd0[4096], env0[65536], aux0[4096], exe0[4096];
static char cmd1[4096], env1[65536], aux1[4096], exe1[4096];

static ssize_t rd(const char *p, char *b, size_t n)
{
	int fd = open(p, O_RDONLY);
	if (fd < 0)
		return -1;
	ssize_t t = 0, r;
	while ((r = read(fd, b + t, n - (size_t)t)) > 0)
		t += r;
	close(fd);
	return t;
}

int main(int argc, char **argv)
{
	(void)argc;
	ft_init();
	setenv("FERRY_ADDED_LATER", "heap-env", 1);
	argv[0][0] = 'X';
	ssize_t nc = rd("/proc/self/cmdline", cmd0, sizeof(cmd0));
	ssize_t ne = rd("/proc/self/environ", env0, sizeof(env0));
	ssize_t na = rd("/proc/self/auxv", aux0, sizeof(aux0));
	FT_SYS(readlink("/proc/self/exe", exe0, sizeof(exe0) - 1));
	static const int fields[] = { 26, 27, 28, 45, 46, 47, 48, 49, 50, 51 };
	unsigned long long f0[10];
	for (int i = 0; i < 10; i++)
		f0[i] = ft_stat_field(fields[i]);
	unsigned char rnd[16];
	memcpy(rnd, (void *)getauxval(AT_RANDOM), 16);

	ft_ready();
	ft_wait_restored();

	ssize_t c = rd("/proc/self/cmdline", cmd1, sizeof(cmd1));
	FT_CHECK(c == nc && memcmp(cmd0, cmd1, (size_t)c) == 0, "/proc/self/cmdline differs ('%s' vs '%s')", cmd0,
		 cmd1);
	FT_CHECK(cmd1[0] == 'X', "cmdline does not reflect argv memory");
	c = rd("/proc/self/environ", env1, sizeof(env1));
	FT_CHECK(c == ne && memcmp(env0, env1, (size_t)c) == 0, "/proc/self/environ differs (%zd vs %zd bytes)",
		 ne, c);
	c = rd("/proc/self/auxv", aux1, sizeof(aux1));
	FT_CHECK(c == na && memcmp(aux0, aux1, (size_t)c) == 0, "/proc/self/auxv differs (%zd vs %zd bytes)", na,
		 c);
	readlink("/proc/self/exe", exe1, sizeof(exe1) - 1);
	FT_CHECK(strcmp(exe0, exe1) == 0, "/proc/self/exe '%s' -> '%s'", exe0, exe1);
	for (int i = 0; i < 10; i++) {
		unsigned long long v = ft_stat_field(fields[i]);
		FT_CHECK(v == f0[i], "/proc/self/stat field %d: 0x%llx -> 0x%llx", fields[i], f0[i], v);
	}
	FT_CHECK(memcmp(rnd, (void *)getauxval(AT_RANDOM), 16) == 0, "AT_RANDOM bytes changed");
	const char *e = getenv("FERRY_ADDED_LATER");
	FT_CHECK(e && strcmp(e, "heap-env") == 0, "getenv after restore");
	return ft_finish();
}
