/* bench/tiny.c: the smallest useful checkpoint subject: an idle C program
 * that prints READY once and then sleeps in a loop forever. */
#include <stdio.h>
#include <unistd.h>

int main(void) {
    printf("READY %d\n", (int)getpid());
    fflush(stdout);
    for (;;)
        sleep(1);
}
