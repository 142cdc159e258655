/* kl/log/_crc32c_arm.h against a bitwise CRC-32C: the check value of "123456789"
 * (0xE3069283), then every length and alignment up to 64 bytes.  Built with
 * aarch64-linux-gnu-gcc and run under qemu-aarch64 by tests/test_crc.py. */
#include <stdio.h>
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
    uint32_t check = ~crc32c_by_instruction(0xFFFFFFFFu, (const unsigned char *)"123456789", 9);
    if (check != 0xE3069283u) {
        printf("crc32c(\"123456789\") = %08X, not E3069283\n", check);
        return 1;
    }
    unsigned char data[80];
    for (int i = 0; i < 80; i++)
        data[i] = (unsigned char)(i * 37 + 11);
    for (int at = 0; at < 8; at++)
        for (int n = 0; n <= 64; n++)
            if (~crc32c_by_instruction(0xFFFFFFFFu, data + at, n) != bitwise(data + at, n)) {
                printf("length %d at %d differs\n", n, at);
                return 1;
            }
    puts("ok");
    return 0;
}
