/* CRC-32C by ARMv8's CRC32C instructions (aarch64 only: defines ARM_CRC there), on its own
 * so that tests/crc32c_arm.c checks it under qemu-aarch64 without Python's headers.
 * Call it only where getauxval(AT_HWCAP) has HWCAP_CRC32; reg is the register (~crc). */
#if defined(__aarch64__) && defined(__GNUC__)
#define ARM_CRC 1
#include <arm_acle.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/auxv.h>
#ifndef HWCAP_CRC32
#define HWCAP_CRC32 (1 << 7)
#endif
__attribute__((target("+crc"))) static uint32_t crc32c_by_instruction(uint32_t reg, const unsigned char *p, ptrdiff_t n) {
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        reg = __crc32cd(reg, word);
    }
    for (; n > 0; p++, n--)
        reg = __crc32cb(reg, *p);
    return reg;
}
#endif
