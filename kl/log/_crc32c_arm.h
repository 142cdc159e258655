/* CRC-32C by ARMv8's CRC32C instructions (aarch64 only: defines ARM_CRC there), on its own
 * so that tests/crc32c_arm.c checks it under qemu-aarch64 without Python's headers.
 * Call it only where getauxval(AT_HWCAP) has HWCAP_CRC32, after crc32c_fold_init(); reg is
 * the register (~crc). */
#if defined(__aarch64__) && defined(__GNUC__)
#define ARM_CRC 1
#include <arm_acle.h>
#include <sys/auxv.h>
#ifndef HWCAP_CRC32
#define HWCAP_CRC32 (1 << 7)
#endif
#define CRC32C_TARGET __attribute__((target("+crc")))
#define CRC32C_WORD(reg, word) __crc32cd((uint32_t)(reg), word)
#define CRC32C_BYTE(reg, byte) __crc32cb(reg, byte)
#include "_crc32c_fold.h"
#endif
