/*
 * tty_pty_pair: the program holds both ends of a pty pair (posix_openpt,
 * the slave opened by path) with non-default termios (raw-ish: no echo,
 * no ICRNL, VMIN 3, speed 9600), a window size, exclusive mode, the slave
 * node's mode 0620, and bytes queued both ways: two complete lines and a
 * half-typed one (canonical mode) for the slave to read, and slave output
 * the master has not read (written with OPOST off so no translation).
 * After restore: same /dev/pts index (ptsname, TIOCGPTN), same termios,
 * winsize, exclusive mode and node mode, the queued output read from the
 * master, the two lines read one per read() from the slave, and the
 * half-typed line still waiting for its end: it comes after "\n" is
 * written to the master. Echo stays off: the master reads nothing more.
 */
#define _GNU_SOURCE
#include "ferry_test.h"
#include <asm/termbits.h>
#include <sys/ioctl.h>

/* glibc's <termios.h> clashes with asm/termbits.h; only ptsname etc. */
extern int posix_openpt(int);
extern int grantpt(int);
extern int unlockpt(int);
extern char *ptsname(int);

static int nread(int fd)
{
	int n = -1;
	if (ioctl(fd, FIONREAD, &n) < 0)
		return -1;
	return n;
}

int main(void)
{
	ft_init();
	int m = (int)FT_SYS(posix_openpt(O_RDWR | O_NOCTTY));
	FT_SYS(grantpt(m));
	FT_SYS(unlockpt(m));
	char name[64];
	snprintf(name, sizeof(name), "%s", ptsname(m));
	int s = (int)FT_SYS(open(name, O_RDWR | O_NOCTTY));
	unsigned int ptn = 0;
	FT_SYS(ioctl(m, TIOCGPTN, &ptn));
	FT_SYS(fchmod(s, 0620));

	struct termios2 t;
	FT_SYS(ioctl(s, TCGETS2, &t));
	t.c_lflag &= ~(ECHO | ECHOE | ECHOK);
	t.c_iflag &= ~ICRNL;
	t.c_oflag &= ~OPOST;
	t.c_cc[VMIN] = 3;
	t.c_cflag = (t.c_cflag & ~CBAUD) | BOTHER;
	t.c_ispeed = t.c_ospeed = 9600;
	FT_SYS(ioctl(s, TCSETS2, &t));
	FT_SYS(ioctl(s, TCGETS2, &t));
	struct winsize ws = { .ws_row = 37, .ws_col = 121, .ws_xpixel = 800, .ws_ypixel = 600 };
	FT_SYS(ioctl(m, TIOCSWINSZ, &ws));
	FT_SYS(ioctl(s, TIOCEXCL));

	FT_SYS(write(m, "first line\nsecond\nhalf", 22));
	FT_SYS(write(s, "output\r\nnot read yet", 20));
	/* the pty's flip buffers reach the line discipline from a work queue */
	for (int i = 0; i < 200 && (nread(m) < 20 || nread(s) < 18); i++)
		ft_sleep_ms(5);
	FT_EQ(nread(m), 20, "queued output before checkpoint");
	FT_EQ(nread(s), 18, "complete input lines before checkpoint");

	ft_ready();
	ft_wait_restored();

	char b[128];
	snprintf(b, sizeof(b), "%s", ptsname(m) ? ptsname(m) : "(none)");
	FT_CHECK(strcmp(b, name) == 0, "ptsname %s, was %s", b, name);
	unsigned int ptn2 = 0;
	FT_SYS(ioctl(m, TIOCGPTN, &ptn2));
	FT_EQ(ptn2, ptn, "TIOCGPTN");
	struct stat st;
	FT_SYS(fstat(s, &st));
	FT_EQ(st.st_mode & 07777, 0620, "slave node mode");
	FT_EQ(st.st_uid, getuid(), "slave node owner");
	struct termios2 t2;
	FT_SYS(ioctl(s, TCGETS2, &t2));
	FT_EQ(t2.c_iflag, t.c_iflag, "c_iflag");
	FT_EQ(t2.c_oflag, t.c_oflag, "c_oflag");
	FT_EQ(t2.c_cflag, t.c_cflag, "c_cflag");
	FT_EQ(t2.c_lflag, t.c_lflag, "c_lflag");
	FT_EQ(t2.c_ispeed, 9600, "c_ispeed");
	FT_EQ(t2.c_ospeed, 9600, "c_ospeed");
	FT_CHECK(memcmp(t2.c_cc, t.c_cc, sizeof(t.c_cc)) == 0, "c_cc differ");
	struct winsize ws2;
	FT_SYS(ioctl(s, TIOCGWINSZ, &ws2));
	FT_CHECK(ws2.ws_row == 37 && ws2.ws_col == 121 && ws2.ws_xpixel == 800 && ws2.ws_ypixel == 600,
		 "winsize %u %u %u %u", ws2.ws_row, ws2.ws_col, ws2.ws_xpixel, ws2.ws_ypixel);
	int excl = 0;
	FT_SYS(ioctl(s, TIOCGEXCL, &excl));
	FT_EQ(excl, 1, "TIOCGEXCL");

	FT_EQ(nread(m), 20, "queued output after restore");
	memset(b, 0, sizeof(b));
	FT_EQ(read(m, b, sizeof(b)), 20, "read of the queued output");
	FT_CHECK(memcmp(b, "output\r\nnot read yet", 20) == 0, "output '%s'", b);

	FT_EQ(nread(s), 18, "complete input lines after restore");
	memset(b, 0, sizeof(b));
	FT_EQ(read(s, b, sizeof(b)), 11, "first line");
	FT_CHECK(memcmp(b, "first line\n", 11) == 0, "first line '%s'", b);
	memset(b, 0, sizeof(b));
	FT_EQ(read(s, b, sizeof(b)), 7, "second line");
	FT_CHECK(memcmp(b, "second\n", 7) == 0, "second line '%s'", b);
	FT_EQ(nread(s), 0, "the half line is not a line yet");
	FT_SYS(write(m, "\n", 1));
	for (int i = 0; i < 200 && nread(s) < 5; i++)
		ft_sleep_ms(5);
	memset(b, 0, sizeof(b));
	FT_EQ(read(s, b, sizeof(b)), 5, "the half line, ended");
	FT_CHECK(memcmp(b, "half\n", 5) == 0, "half line '%s'", b);
	ft_sleep_ms(20);
	FT_EQ(nread(m), 0, "nothing echoed");
	return ft_finish();
}
