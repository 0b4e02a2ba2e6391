/*
 * mem_deleted_file: mappings of files deleted after they were mapped.
 * A: a private read-only mapping of a 3-page file (like a replaced shared
 * library). B: a private writable mapping whose second page was written
 * (copy-on-write) after the file was deleted. C: a file mapped shared
 * twice at two addresses, then deleted. After restore: /proc/self/maps
 * still names each path with " (deleted)"; A and B read the file's
 * content, B's written page what was written; a write through one
 * mapping of C shows in the other (one file behind both), and C's content
 * written before the checkpoint is there.
 */
#include "ferry_test.h"
#include <sys/mman.h>

static char *map_file(const char *name, size_t len, int prot, int flags, char fill)
{
	int fd = (int)FT_SYS(open(name, O_RDWR | O_CREAT | O_TRUNC, 0640));
	char buf[4096];
	for (size_t off = 0; off < len; off += sizeof(buf)) {
		memset(buf, fill + (char)(off / 4096), sizeof(buf));
		FT_SYS(pwrite(fd, buf, sizeof(buf), (off_t)off));
	}
	char *p = mmap(NULL, len, prot, flags, fd, 0);
	if (p == MAP_FAILED)
		ft_die("mmap %s", name);
	close(fd);
	return p;
}

static int maps_says_deleted(void *addr, const char *name)
{
	static char buf[1 << 18];
	if (ft_read_file("/proc/self/maps", buf, sizeof(buf)) < 0)
		return 0;
	char key[32];
	snprintf(key, sizeof(key), "%lx-", (unsigned long)addr);
	char *p = strstr(buf, key);
	if (!p)
		return 0;
	char *end = strchr(p, '\n');
	char *n = strstr(p, name);
	char *d = strstr(p, " (deleted)");
	return n && d && (!end || (n < end && d < end));
}

int main(void)
{
	ft_init();
	char *a = map_file("lib-a.so", 3 * 4096, PROT_READ, MAP_PRIVATE, 'a');
	char *b = map_file("data-b", 2 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE, 'k');
	char *c1 = map_file("shared-c", 4096, PROT_READ | PROT_WRITE, MAP_SHARED, 's');
	int cfd = (int)FT_SYS(open("shared-c", O_RDWR));
	char *c2 = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, cfd, 0);
	if (c2 == MAP_FAILED)
		ft_die("mmap c2");
	close(cfd);
	FT_SYS(unlink("lib-a.so"));
	FT_SYS(unlink("data-b"));
	FT_SYS(unlink("shared-c"));
	memset(b + 4096, 'W', 4096);
	strcpy(c1, "before checkpoint");

	ft_ready();
	ft_wait_restored();

	FT_CHECK(maps_says_deleted(a, "lib-a.so"), "A: maps does not show lib-a.so (deleted)");
	FT_CHECK(maps_says_deleted(b, "data-b"), "B: maps does not show data-b (deleted)");
	FT_CHECK(maps_says_deleted(c1, "shared-c") && maps_says_deleted(c2, "shared-c"), "C: maps does not show shared-c (deleted)");
	FT_CHECK(a[0] == 'a' && a[4096] == 'b' && a[3 * 4096 - 1] == 'c', "A content %c %c %c", a[0], a[4096], a[3 * 4096 - 1]);
	FT_CHECK(b[0] == 'k' && b[4095] == 'k', "B unwritten page %c", b[0]);
	FT_CHECK(b[4096] == 'W' && b[2 * 4096 - 1] == 'W', "B written page %c", b[4096]);
	FT_CHECK(strcmp(c2, "before checkpoint") == 0, "C second view: '%.20s'", c2);
	strcpy(c1, "after restore");
	FT_CHECK(strcmp(c2, "after restore") == 0, "C: a write through one view is not in the other ('%.20s')", c2);
	return ft_finish();
}
