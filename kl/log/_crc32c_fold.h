/* CRC-32C by a CPU's CRC32C instruction, three streams at a time (Mark Adler's method,
 * as in zlib's crc32.c and Intel's white paper "Fast CRC Computation for iSCSI"): the
 * instruction takes 3 cycles and issues every cycle, so three independent registers run
 * a buffer's three thirds together, and each register is then moved past the thirds after
 * it, a multiplication by x^(8 * length) modulo the polynomial, looked up in a table of
 * 4 x 256 entries per length.  The includer defines CRC32C_TARGET (the function attribute
 * that enables the instruction), CRC32C_WORD(reg, word) (8 bytes) and CRC32C_BYTE(reg,
 * byte), and calls crc32c_fold_init() once before crc32c_by_instruction.  reg is the
 * register (~crc), as the instruction takes it. */
#ifndef KL_CRC32C_FOLD_H
#define KL_CRC32C_FOLD_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define CRC32C_POLY 0x82F63B78u /* reflected */
#define CRC32C_LONG 8192        /* bytes of each stream, for large buffers */
#define CRC32C_SHORT 256        /* bytes of each stream, for the rest */

static uint32_t crc32c_long_shift[4][256], crc32c_short_shift[4][256];

/* a * b modulo the polynomial (reflected: bit 31 is x^0). */
static uint32_t crc32c_multiply(uint32_t a, uint32_t b) {
    uint32_t product = 0;
    for (uint32_t m = 1u << 31; m != 0; m >>= 1) {
        if (a & m)
            product ^= b;
        b = b & 1 ? b >> 1 ^ CRC32C_POLY : b >> 1;
    }
    return product;
}

/* x^(8 * bytes) modulo the polynomial: what moving a register past that many bytes multiplies it by. */
static uint32_t crc32c_x8n(size_t bytes) {
    uint32_t power = 1u << 31, square = 1u << 23; /* x^0; x^8 */
    for (; bytes != 0; bytes >>= 1, square = crc32c_multiply(square, square))
        if (bytes & 1)
            power = crc32c_multiply(power, square);
    return power;
}

static void crc32c_shift_table(uint32_t table[4][256], size_t bytes) {
    uint32_t factor = crc32c_x8n(bytes);
    for (int k = 0; k < 4; k++)
        for (uint32_t n = 0; n < 256; n++)
            table[k][n] = crc32c_multiply(factor, n << (8 * k));
}

static void crc32c_fold_init(void) {
    crc32c_shift_table(crc32c_long_shift, CRC32C_LONG);
    crc32c_shift_table(crc32c_short_shift, CRC32C_SHORT);
}

static inline uint32_t crc32c_shift(uint32_t table[4][256], uint32_t reg) {
    return table[0][reg & 0xff] ^ table[1][reg >> 8 & 0xff] ^ table[2][reg >> 16 & 0xff] ^ table[3][reg >> 24];
}

static inline uint64_t crc32c_load(const unsigned char *p) {
    uint64_t word;
    memcpy(&word, p, 8);
    return word;
}

/* Three streams of `stream` bytes each from p, the first continuing reg. */
#define CRC32C_THREE(stream, table)                                                                          \
    while (n >= 3 * (stream)) {                                                                              \
        uint64_t a = reg, b = 0, c = 0;                                                                      \
        for (const unsigned char *end = p + (stream); p < end; p += 8) {                                     \
            a = CRC32C_WORD(a, crc32c_load(p));                                                              \
            b = CRC32C_WORD(b, crc32c_load(p + (stream)));                                                   \
            c = CRC32C_WORD(c, crc32c_load(p + 2 * (stream)));                                               \
        }                                                                                                    \
        reg = crc32c_shift(table, crc32c_shift(table, (uint32_t)a) ^ (uint32_t)b) ^ (uint32_t)c;              \
        p += 2 * (stream);                                                                                   \
        n -= 3 * (stream);                                                                                   \
    }

CRC32C_TARGET static uint32_t crc32c_by_instruction(uint32_t reg, const unsigned char *p, ptrdiff_t n) {
    CRC32C_THREE(CRC32C_LONG, crc32c_long_shift)
    CRC32C_THREE(CRC32C_SHORT, crc32c_short_shift)
    uint64_t wide = reg;
    for (; n >= 8; p += 8, n -= 8)
        wide = CRC32C_WORD(wide, crc32c_load(p));
    reg = (uint32_t)wide;
    for (; n > 0; p++, n--)
        reg = CRC32C_BYTE(reg, *p);
    return reg;
}
#endif
