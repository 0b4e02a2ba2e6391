/*
 * proc_umask: umask(027). After restore: umask is 027 (read with umask()
 * and from the Umask: line of /proc/self/status) and a file created with
 * mode 0666 gets 0640.
 */
#include "ferry_test.h"

int main(void)
{
	ft_init();
	umask(027);

	ft_ready();
	ft_wait_restored();

	char st[16] = "";
	ft_status_field(0, "Umask", st, sizeof(st));
	FT_CHECK(strtol(st, NULL, 8) == 027, "/proc/self/status Umask: %s", st);
	mode_t m = umask(027);
	FT_EQ(m, 027, "umask");
	int fd = (int)FT_SYS(open("masked.txt", O_CREAT | O_WRONLY, 0666));
	struct stat s;
	FT_SYS(fstat(fd, &s));
	FT_EQ(s.st_mode & 0777, 0640, "mode of new file");
	return ft_finish();
}
