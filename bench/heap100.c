/* bench/heap100.c: 100 MiB of written (resident, non-zero) heap, then idle.
 * Prints READY once every page has been written, then sleeps in a loop. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define SIZE (100u * 1024 * 1024)

int main(void) {
    volatile uint8_t *heap = malloc(SIZE);
    if (!heap) {
        perror("malloc");
        return 1;
    }
    /* A non-constant pattern, so no page is all zeroes or identical. */
    uint32_t x = 2463534242u;
    for (size_t i = 0; i < SIZE; i += sizeof(uint32_t)) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        *(volatile uint32_t *)(heap + i) = x;
    }
    printf("READY %d\n", (int)getpid());
    fflush(stdout);
    for (;;)
        sleep(1);
}
