/* kl/log/_crc32c_arm.h against a bitwise CRC-32C: the check value of "123456789"
 * (0xE3069283), then every length up to 64 bytes and lengths around the three-stream
 * blocks (kl/log/_crc32c_fold.h), at every alignment.  Built with
 * aarch64-linux-gnu-gcc and run under qemu-aarch64 by tests/test_crc.py. */
#include <stdio.h>
#include <stdlib.h>
#include "../kl/log/_crc32c_arm.h"

static uint32_t bitwise(const unsigned char *p, size_t n) {
    uint32_t reg = 0xFFFFFFFFu;
    for (; n > 0; p++, n--) {
        reg ^= *p;
        for (int bit = 0; bit < 8; bit++)
            reg = reg >> 1 ^ (reg & 1 ? 0x82F63B78u : 0);
    }
    return ~reg;
}

int main(void) {
    if (!(getauxval(AT_HWCAP) & HWCAP_CRC32)) {
        puts("no HWCAP_CRC32");
        return 2;
    }
    crc32c_fold_init();
    uint32_t check = ~crc32c_by_instruction(0xFFFFFFFFu, (const unsigned char *)"123456789", 9);
    if (check != 0xE3069283u) {
        printf("crc32c(\"123456789\") = %08X, not E3069283\n", check);
        return 1;
    }
    enum { MOST = 100003 };
    static const int lengths[] = {767, 768, 769, 3 * 8192 - 1, 3 * 8192, 3 * 8192 + 1, 2 * 3 * 8192 + 3 * 256 + 13, MOST};
    unsigned char *data = malloc(MOST + 8);
    if (data == NULL)
        return 1;
    for (int i = 0; i < MOST + 8; i++)
        data[i] = (unsigned char)(i * 37 + 11 + (i >> 8));
    for (int at = 0; at < 8; at++) {
        for (int n = 0; n <= 64; n++)
            if (~crc32c_by_instruction(0xFFFFFFFFu, data + at, n) != bitwise(data + at, n)) {
                printf("length %d at %d differs\n", n, at);
                return 1;
            }
        for (size_t k = 0; k < sizeof lengths / sizeof *lengths; k++)
            if (~crc32c_by_instruction(0xFFFFFFFFu, data + at, lengths[k]) != bitwise(data + at, lengths[k])) {
                printf("length %d at %d differs\n", lengths[k], at);
                return 1;
            }
    }
    free(data);
    puts("ok");
    return 0;
}
