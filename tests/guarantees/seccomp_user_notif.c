/*
 * seccomp_user_notif: a seccomp filter that hands getppid to a user-space
 * listener (SECCOMP_RET_USER_NOTIF; the listener fd was closed, so the
 * kernel answers ENOSYS). A listener cannot be restored: checkpoint must
 * refuse the filter by name and leave the process confined as before.
 */
#include "../conformance/ferry_test.h"
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>

int main(void)
{
	ft_init();
	FT_SYS(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0));
	struct sock_filter f[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_getppid, 0, 1),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_USER_NOTIF),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_fprog p = { .len = 4, .filter = f };
	int l = (int)FT_SYS(syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, &p));
	close(l);
	ft_ready();
	ft_wait_restored();
	errno = 0;
	long r = syscall(SYS_getppid);
	FT_CHECK(r == -1 && errno == ENOSYS, "getppid: %ld (%s), expected ENOSYS from the filter", r, strerror(errno));
	char s[16] = "";
	ft_status_field(0, "Seccomp", s, sizeof(s));
	FT_CHECK(strcmp(s, "2") == 0, "Seccomp '%s'", s);
	return ft_finish();
}
