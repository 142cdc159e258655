/* kl.log._core: the per-message loops of the message format in C.
 *
 * Each function has a pure-Python twin of the same name in kl/log/pycore.py, the
 * reference: for any input both give the same answer (tests/test_core.py).  The bytes
 * are untrusted (damaged files, the network): nothing is read before the bounds that
 * cover it are checked, and every length is checked before it is added to a position.
 * The format is specified in man/kl-format.5.
 */
#define _GNU_SOURCE /* memmem */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#include <zlib.h>

#define LENGTH_SIZE 4
#define HEADER_SIZE 22     /* magic 2: length magic attrs crc timestamp key_length */
#define FIELDS_AT 10       /* magic 2 body (checksummed from here): timestamp, key_length */
#define FIELDS 12          /* bytes of timestamp and key length */
#define CURRENT_MAGIC 2
#define HEADERS_MAGIC 3
#define HEADERS_HEADER_SIZE (HEADER_SIZE + 8) /* magic 3: magic 2's, value_length, header_count */
#define HEADER_FIELD_SIZE 8                    /* one header's key and value lengths */
#define NO_KEY (-1)
#define NULL_LENGTH (-1)
#define CODEC_MASK 0x07

enum { OK, INCOMPLETE, UNKNOWN_MAGIC, BAD_LENGTH, CHECKSUM, BAD_KEY_LENGTH, BAD_FIELD };

static const int32_t MIN_LENGTH[4] = {5, 6, HEADER_SIZE - LENGTH_SIZE, HEADERS_HEADER_SIZE - LENGTH_SIZE};
static uLong seeds[256];    /* CRC32 of (magic 2, attrs): where a magic 2 body's checksum starts */
static uLong seeds_v3[256]; /* the same for magic 3 */

static inline uint32_t be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static inline int64_t be64(const unsigned char *p) {
    return (int64_t)((uint64_t)be32(p) << 32 | be32(p + 4));
}

static inline void put32(unsigned char *p, uint32_t v) {
    p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define X86_SIMD 1
static int have_clmul; /* the CPU has PCLMULQDQ and SSE4.1 (set at import) */

/* The CRC-32 (zlib's polynomial, its register not inverted) of n bytes, n >= 64 and a
 * multiple of 16, by folding 16-byte blocks with carry-less multiplication, then a
 * Barrett reduction: "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ
 * Instruction" (Gopal, Ozturk et al., Intel, 2009).  The constants are x^k mod P for
 * the fold distances (512, 128, 64 bits), P itself and floor(x^64 / P), bit-reflected. */
__attribute__((target("pclmul,sse4.1"))) static uint32_t fold(uint32_t reg, const unsigned char *p, Py_ssize_t n) {
    const __m128i by4 = _mm_set_epi64x(0x1c6e41596, 0x154442bd4);
    const __m128i by1 = _mm_set_epi64x(0x0ccaa009e, 0x1751997d0);
    const __m128i by64 = _mm_set_epi64x(0, 0x163cd6124);
    const __m128i poly = _mm_set_epi64x(0x1f7011641, 0x1db710641);
    const __m128i low32 = _mm_set_epi32(0, 0, 0, -1);
    __m128i a = _mm_xor_si128(_mm_loadu_si128((const __m128i *)p), _mm_cvtsi32_si128((int)reg));
    __m128i b = _mm_loadu_si128((const __m128i *)(p + 16));
    __m128i c = _mm_loadu_si128((const __m128i *)(p + 32));
    __m128i d = _mm_loadu_si128((const __m128i *)(p + 48));
    p += 64;
    n -= 64;
#define FOLD(x, k, next) \
    x = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), next)
    for (; n >= 64; p += 64, n -= 64) {
        FOLD(a, by4, _mm_loadu_si128((const __m128i *)p));
        FOLD(b, by4, _mm_loadu_si128((const __m128i *)(p + 16)));
        FOLD(c, by4, _mm_loadu_si128((const __m128i *)(p + 32)));
        FOLD(d, by4, _mm_loadu_si128((const __m128i *)(p + 48)));
    }
    FOLD(a, by1, b);
    FOLD(a, by1, c);
    FOLD(a, by1, d);
    for (; n >= 16; p += 16, n -= 16)
        FOLD(a, by1, _mm_loadu_si128((const __m128i *)p));
#undef FOLD
    /* 128 bits to 64, then 64 to 32 */
    a = _mm_xor_si128(_mm_clmulepi64_si128(a, by1, 0x10), _mm_srli_si128(a, 8));
    a = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(a, low32), by64, 0x00), _mm_srli_si128(a, 4));
    __m128i t = _mm_clmulepi64_si128(_mm_and_si128(a, low32), poly, 0x10);
    t = _mm_clmulepi64_si128(_mm_and_si128(t, low32), poly, 0x00);
    return (uint32_t)_mm_extract_epi32(_mm_xor_si128(a, t), 1);
}
#endif

/* zlib's crc32(seed, p, n), by folding where the CPU can. */
static uLong crc(uLong seed, const unsigned char *p, Py_ssize_t n) {
#ifdef X86_SIMD
    if (have_clmul && n >= 64) {
        Py_ssize_t blocks = n & ~(Py_ssize_t)15;
        seed = ~fold(~(uint32_t)seed, p, blocks) & 0xffffffffUL;
        p += blocks;
        n -= blocks;
    }
#endif
    while (n > 0) { /* zlib takes a uInt length */
        uInt chunk = n > (Py_ssize_t)0x40000000 ? 0x40000000u : (uInt)n;
        seed = crc32(seed, p, chunk);
        p += chunk;
        n -= chunk;
    }
    return seed;
}

/* CRC-32C (Castagnoli), for Kafka's record batches: by the SSE4.2 instruction (x86-64)
 * or ARMv8's CRC32C instructions (aarch64, HWCAP_CRC32) where the CPU has them, three
 * streams at a time (_crc32c_fold.h), else a byte at a time from a table made at import. */
static uint32_t crc32c_table[256];
static int have_crc32c_instruction;

#include "_crc32c_arm.h" /* ARM_CRC: ARMv8's CRC32C instructions, on aarch64 */

#ifdef X86_SIMD
#define CRC32C_TARGET __attribute__((target("sse4.2")))
#define CRC32C_WORD(reg, word) _mm_crc32_u64(reg, word)
#define CRC32C_BYTE(reg, byte) _mm_crc32_u8(reg, byte)
#include "_crc32c_fold.h"
#endif

static uint32_t crc32c_of(uint32_t crc, const unsigned char *p, Py_ssize_t n) {
    uint32_t reg = ~crc;
#if defined(X86_SIMD) || defined(ARM_CRC)
    if (have_crc32c_instruction)
        return ~crc32c_by_instruction(reg, p, n);
#endif
    for (; n > 0; p++, n--)
        reg = crc32c_table[(reg ^ *p) & 0xff] ^ reg >> 8;
    return ~reg;
}

static PyObject *core_crc32c(PyObject *self, PyObject *args) {
    Py_buffer b;
    PyObject *given = NULL;
    if (!PyArg_ParseTuple(args, "y*|O!:crc32c", &b, &PyLong_Type, &given))
        return NULL;
    int overflow = 0;
    long long crc = given == NULL ? 0 : PyLong_AsLongLongAndOverflow(given, &overflow);
    if (overflow || crc < 0 || crc > 0xffffffffLL) {
        PyBuffer_Release(&b);
        return PyErr_Format(PyExc_ValueError, "crc must be a 32-bit value, not %S", given);
    }
    uint32_t sum;
    Py_BEGIN_ALLOW_THREADS
    sum = crc32c_of((uint32_t)crc, b.buf, b.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLong(sum);
}

/* Kafka's murmur2 (org.apache.kafka.common.utils.Utils.murmur2), as Java's signed int. */
static PyObject *core_murmur2(PyObject *self, PyObject *args) {
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "y*:murmur2", &b))
        return NULL;
    const unsigned char *data = b.buf;
    Py_ssize_t length = b.len;
    const uint32_t m = 0x5bd1e995;
    uint32_t h = 0x9747b28cu ^ (uint32_t)length;
    Py_ssize_t whole = length & ~(Py_ssize_t)3;
    for (Py_ssize_t i = 0; i < whole; i += 4) {
        uint32_t k = (uint32_t)data[i] | (uint32_t)data[i + 1] << 8 | (uint32_t)data[i + 2] << 16 | (uint32_t)data[i + 3] << 24;
        k *= m;
        k ^= k >> 24;
        k *= m;
        h = h * m ^ k;
    }
    switch (length & 3) {
    case 3:
        h ^= (uint32_t)data[whole + 2] << 16;
        /* fall through */
    case 2:
        h ^= (uint32_t)data[whole + 1] << 8;
        /* fall through */
    case 1:
        h ^= data[whole];
        h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    PyBuffer_Release(&b);
    return PyLong_FromLong((long)(int32_t)h);
}

/* v as a zigzag varint at p; its length. */
static inline int zigzag(unsigned char *p, long long v) {
    uint64_t n = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    int used = 0;
    while (n > 0x7f) {
        p[used++] = (unsigned char)(n & 0x7f) | 0x80;
        n >>= 7;
    }
    p[used++] = (unsigned char)n;
    return used;
}

/* See varint() in kl/log/pycore.py. */
static PyObject *core_varint(PyObject *self, PyObject *arg) {
    if (!PyLong_Check(arg))
        return PyErr_Format(PyExc_TypeError, "varint: %.100s is not an int", Py_TYPE(arg)->tp_name);
    int overflow = 0;
    long long value = PyLong_AsLongLongAndOverflow(arg, &overflow);
    if (overflow)
        return PyErr_Format(PyExc_OverflowError, "varint: %S does not fit 64 bits", arg);
    unsigned char out[10];
    return PyBytes_FromStringAndSize((const char *)out, zigzag(out, value));
}

/* See read_varint() in kl/log/pycore.py. */
static PyObject *core_read_varint(PyObject *self, PyObject *args) {
    Py_buffer b;
    Py_ssize_t pos;
    if (!PyArg_ParseTuple(args, "y*n:read_varint", &b, &pos))
        return NULL;
    const unsigned char *buf = b.buf;
    Py_ssize_t len = b.len, at = pos;
    PyObject *result = NULL;
    if (pos < 0 || pos > len) {
        PyErr_Format(PyExc_ValueError, "read_varint: position %zd outside a buffer of %zd bytes", pos, len);
        goto done;
    }
    uint64_t n = 0;
    for (int shift = 0; at < len && at < pos + 10; at++, shift += 7) {
        unsigned char byte = buf[at];
        if (shift == 63 && byte > 1)
            break;
        n |= (uint64_t)(byte & 0x7f) << shift;
        if (byte < 0x80) {
            result = Py_BuildValue("(Ln)", (long long)(n >> 1) ^ -(long long)(n & 1), at + 1);
            goto done;
        }
    }
    if (at == len && at < pos + 10)
        PyErr_Format(PyExc_ValueError, "read_varint: the buffer ends inside the varint at %zd", pos);
    else
        PyErr_Format(PyExc_ValueError, "read_varint: the varint at %zd runs past 64 bits", pos);
done:
    PyBuffer_Release(&b);
    return result;
}

typedef struct {
    int problem;
    Py_ssize_t size;
    int magic, attrs;
    int64_t value;
} Checked;

static int utf8_valid(const unsigned char *p, Py_ssize_t n);

/* See _bad_field in kl/log/pycore.py: where the magic 3 message p[0:size] (its key ending
   at at, valid) goes wrong after its key, or 0. */
static Py_ssize_t bad_field(const unsigned char *p, Py_ssize_t size, Py_ssize_t at, int attrs) {
    if (attrs & CODEC_MASK)
        return 5;
    int32_t value_length = (int32_t)be32(p + at);
    if (value_length < NULL_LENGTH || value_length > size - at - 8)
        return at;
    at += 4 + (value_length < 0 ? 0 : value_length);
    int32_t count = (int32_t)be32(p + at);
    if (count < 0 || count > (size - at - 4) / HEADER_FIELD_SIZE)
        return at;
    at += 4;
    for (int32_t i = 0; i < count; i++) {
        int32_t name_length = size - at >= HEADER_FIELD_SIZE ? (int32_t)be32(p + at) : -1;
        if (name_length < 0 || name_length > size - at - HEADER_FIELD_SIZE || !utf8_valid(p + at + 4, name_length))
            return at;
        at += 4 + name_length;
        int32_t data_length = (int32_t)be32(p + at);
        if (data_length < NULL_LENGTH || data_length > size - at - 4)
            return at;
        at += 4 + (data_length < 0 ? 0 : data_length);
    }
    return at != size ? at : 0;
}

/* The message at pos of buf[0:end]: see check() in kl/log/pycore.py. */
static Checked check_at(const unsigned char *buf, Py_ssize_t pos, Py_ssize_t end, Py_ssize_t max_message_bytes) {
    Checked c = {OK, 0, -1, 0, 0};
    if (end - pos < LENGTH_SIZE + 1) {
        c.problem = INCOMPLETE;
        c.size = end - pos;
        return c;
    }
    const unsigned char *p = buf + pos;
    int32_t length = (int32_t)be32(p);
    c.magic = p[4];
    if (c.magic > HEADERS_MAGIC) {
        c.problem = UNKNOWN_MAGIC;
        c.value = c.magic;
        return c;
    }
    if (length < MIN_LENGTH[c.magic] || (Py_ssize_t)length > max_message_bytes - LENGTH_SIZE) {
        c.problem = BAD_LENGTH;
        c.value = length;
        return c;
    }
    Py_ssize_t size = LENGTH_SIZE + (Py_ssize_t)length;
    if (size > end - pos) {
        c.problem = INCOMPLETE;
        c.size = size;
        return c;
    }
    c.size = size;
    uint32_t stored;
    uLong sum;
    if (c.magic == 0) {
        stored = be32(p + 5);
        sum = crc(crc32(0L, Z_NULL, 0), p + 9, size - 9);
    } else {
        c.attrs = p[5];
        stored = be32(p + 6);
        uLong seed = c.magic == CURRENT_MAGIC ? seeds[c.attrs] : c.magic == HEADERS_MAGIC ? seeds_v3[c.attrs] : crc32(0L, Z_NULL, 0);
        sum = crc(seed, p + 10, size - 10);
    }
    if ((uint32_t)sum != stored) {
        c.problem = CHECKSUM;
        return c;
    }
    if (c.magic >= CURRENT_MAGIC) {
        int32_t key_length = (int32_t)be32(p + 18);
        if (key_length < NO_KEY || key_length > length - MIN_LENGTH[c.magic]) {
            c.problem = BAD_KEY_LENGTH;
            c.value = key_length;
        } else if (c.magic == HEADERS_MAGIC) {
            Py_ssize_t bad = bad_field(p, size, HEADER_SIZE + (key_length < 0 ? 0 : key_length), c.attrs);
            if (bad) {
                c.problem = BAD_FIELD;
                c.value = bad;
            }
        }
    }
    return c;
}

/* A plain message at pos: uncompressed magic 2 with a valid length (the caller checks
 * the key length it needs and the checksum).  Its size, or 0. */
static inline Py_ssize_t plain_size(const unsigned char *buf, Py_ssize_t pos, Py_ssize_t end, Py_ssize_t max_length) {
    if (end - pos < HEADER_SIZE)
        return 0;
    const unsigned char *p = buf + pos;
    int32_t length = (int32_t)be32(p);
    if (p[4] != CURRENT_MAGIC || p[5] != 0 || length < HEADER_SIZE - LENGTH_SIZE || (Py_ssize_t)length > max_length)
        return 0;
    Py_ssize_t size = LENGTH_SIZE + (Py_ssize_t)length;
    return size <= end - pos ? size : 0;
}

static int bounds(Py_ssize_t pos, Py_ssize_t end, Py_ssize_t len) {
    if (pos < 0 || end < pos || end > len) {
        PyErr_Format(PyExc_ValueError, "positions %zd to %zd are outside a buffer of %zd bytes", pos, end, len);
        return 0;
    }
    return 1;
}

static PyObject *core_check(PyObject *self, PyObject *args) {
    Py_buffer b;
    Py_ssize_t pos, end, max_message_bytes;
    if (!PyArg_ParseTuple(args, "y*nnn:check", &b, &pos, &end, &max_message_bytes))
        return NULL;
    if (!bounds(pos, end, b.len)) {
        PyBuffer_Release(&b);
        return NULL;
    }
    Checked c = check_at(b.buf, pos, end, max_message_bytes);
    PyBuffer_Release(&b);
    return Py_BuildValue("(iniiL)", c.problem, c.size, c.magic, c.attrs, (long long)c.value);
}

static PyObject *core_walk(PyObject *self, PyObject *args) {
    Py_buffer b;
    Py_ssize_t pos, end, max_message_bytes, count = 0;
    if (!PyArg_ParseTuple(args, "y*nnn:walk", &b, &pos, &end, &max_message_bytes))
        return NULL;
    if (!bounds(pos, end, b.len)) {
        PyBuffer_Release(&b);
        return NULL;
    }
    const unsigned char *buf = b.buf;
    Py_BEGIN_ALLOW_THREADS
    while (pos < end) {
        Checked c = check_at(buf, pos, end, max_message_bytes);
        if (c.problem != OK)
            break;
        pos += c.size;
        count++;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    return Py_BuildValue("(nn)", pos, count);
}

/* A valid entry of a chain: where it starts, its size and attributes (0 for magic 0). */
typedef struct {
    Py_ssize_t pos, size;
    int attrs;
} Kept;

#define PADDING 0x08

/* See recent() in kl/log/pycore.py.  The entries kept are a ring of cap slots from head,
 * grown (doubled) while padding keeps more than count of them. */
static PyObject *core_recent(PyObject *self, PyObject *args) {
    Py_buffer b;
    Py_ssize_t pos, end, max_message_bytes, count;
    if (!PyArg_ParseTuple(args, "y*nnnn:recent", &b, &pos, &end, &max_message_bytes, &count))
        return NULL;
    if (!bounds(pos, end, b.len)) {
        PyBuffer_Release(&b);
        return NULL;
    }
    if (count < 1) {
        PyBuffer_Release(&b);
        return PyErr_Format(PyExc_ValueError, "count must be at least 1, not %zd", count);
    }
    Py_ssize_t cap = count < 1024 ? count + 1 : 1024, head = 0, n = 0, held = 0;
    Kept *ring = PyMem_RawMalloc(cap * sizeof(Kept));
    int failed = ring == NULL;
    const unsigned char *buf = b.buf;
    Py_BEGIN_ALLOW_THREADS
    while (!failed && pos < end) {
        Checked c = check_at(buf, pos, end, max_message_bytes);
        if (c.problem != OK)
            break;
        if (n == cap) { /* full: unroll into a ring twice the size */
            Kept *grown = PyMem_RawMalloc(2 * cap * sizeof(Kept));
            if (grown == NULL) {
                failed = 1;
                break;
            }
            for (Py_ssize_t i = 0; i < n; i++)
                grown[i] = ring[(head + i) % cap];
            PyMem_RawFree(ring);
            ring = grown;
            head = 0;
            cap *= 2;
        }
        ring[(head + n) % cap] = (Kept){pos, c.size, c.attrs};
        n++;
        if (!(c.attrs & PADDING))
            held++;
        while (held > count || (held == count && ring[head].attrs & PADDING)) {
            if (!(ring[head].attrs & PADDING))
                held--;
            head = (head + 1) % cap;
            n--;
        }
        pos += c.size;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    PyObject *list = failed ? PyErr_NoMemory() : PyList_New(n);
    for (Py_ssize_t i = 0; list != NULL && i < n; i++) {
        Kept k = ring[(head + i) % cap];
        PyObject *item = Py_BuildValue("(nni)", k.pos, k.size, k.attrs);
        if (item == NULL)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, i, item);
    }
    PyMem_RawFree(ring);
    if (list == NULL)
        return NULL;
    return Py_BuildValue("(nN)", pos, list);
}

/* The size of the valid plain message at pos: uncompressed magic 2 with a valid length,
 * key length (none unless keyed) and checksum; 0 where there is none. */
static inline Py_ssize_t plain_at(const unsigned char *buf, Py_ssize_t pos, Py_ssize_t end, Py_ssize_t max_length, int keyed) {
    Py_ssize_t size = plain_size(buf, pos, end, max_length);
    if (!size)
        return 0;
    const unsigned char *p = buf + pos;
    int32_t key_length = (int32_t)be32(p + 18);
    if (keyed ? key_length < NO_KEY || key_length > size - HEADER_SIZE : key_length != NO_KEY)
        return 0;
    return (uint32_t)crc(seeds[0], p + FIELDS_AT, size - FIELDS_AT) == be32(p + 6) ? size : 0;
}

/* One message of a plain run as the caller wants it (a new reference, NULL on error). */
typedef PyObject *(*make_fn)(const unsigned char *p, Py_ssize_t size, int32_t key_length, long long offset);

/* The valid uncompressed magic 2 messages of buf from pos on (without a key unless
 * keyed), each made by make at offset base + position: (list, where the run stops). */
static PyObject *plain_run(Py_buffer *b, Py_ssize_t pos, long long base, Py_ssize_t max_message_bytes, int keyed, make_fn make) {
    PyObject *out = NULL;
    if (!bounds(pos, b->len, b->len) || !(out = PyList_New(0)))
        goto done;
    const unsigned char *buf = b->buf;
    Py_ssize_t end = b->len, max_length = max_message_bytes - LENGTH_SIZE, size;
    while ((size = plain_at(buf, pos, end, max_length, keyed))) {
        const unsigned char *p = buf + pos;
        PyObject *item = make(p, size, (int32_t)be32(p + 18), base + pos);
        if (!item || PyList_Append(out, item) < 0) {
            Py_XDECREF(item);
            Py_CLEAR(out);
            goto done;
        }
        Py_DECREF(item);
        pos += size;
    }
done:
    PyBuffer_Release(b);
    if (!out)
        return NULL;
    return Py_BuildValue("(Nn)", out, pos);
}

static PyObject *make_value(const unsigned char *p, Py_ssize_t size, int32_t key_length, long long offset) {
    return PyBytes_FromStringAndSize((const char *)p + HEADER_SIZE, size - HEADER_SIZE);
}

static PyObject *core_plain_values(PyObject *self, PyObject *args) {
    Py_buffer b;
    Py_ssize_t pos, max_message_bytes;
    if (!PyArg_ParseTuple(args, "y*nn:plain_values", &b, &pos, &max_message_bytes))
        return NULL;
    return plain_run(&b, pos, 0, max_message_bytes, 0, make_value);
}

/* A growing output buffer.  Its functions take no GIL (they may run with it let go) and
   return 0 when memory runs out, setting no exception: the caller raises MemoryError. */
typedef struct {
    char *p;
    Py_ssize_t used, cap;
} Out;

static int reserve(Out *out, Py_ssize_t n) {
    if (out->cap - out->used >= n)
        return 1;
    if (n > PY_SSIZE_T_MAX / 4 - out->used)
        return 0;
    Py_ssize_t cap = out->cap ? out->cap : 1 << 16;
    while (cap - out->used < n)
        cap *= 2;
    char *grown = PyMem_RawRealloc(out->p, cap);
    if (grown == NULL)
        return 0;
    out->p = grown;
    out->cap = cap;
    return 1;
}

static int put(Out *out, const void *s, Py_ssize_t n) {
    if (n == 0)
        return 1; /* out->p may be NULL yet: memcpy must not see it */
    if (!reserve(out, n))
        return 0;
    memcpy(out->p + out->used, s, n);
    out->used += n;
    return 1;
}

/* What out holds, as a bytes; frees out. */
static PyObject *out_bytes(Out *out) {
    PyObject *bytes = PyBytes_FromStringAndSize(out->p ? out->p : "", out->used);
    PyMem_RawFree(out->p);
    *out = (Out){NULL, 0, 0};
    return bytes;
}

/* See plain_columns() in kl/log/pycore.py: positions, timestamps and key lengths as native int64s. */
static PyObject *core_plain_columns(PyObject *self, PyObject *args) {
    Py_buffer b;
    Py_ssize_t pos, max_message_bytes;
    if (!PyArg_ParseTuple(args, "y*nn:plain_columns", &b, &pos, &max_message_bytes))
        return NULL;
    if (!bounds(pos, b.len, b.len)) {
        PyBuffer_Release(&b);
        return NULL;
    }
    const unsigned char *buf = b.buf;
    Py_ssize_t end = b.len, max_length = max_message_bytes - LENGTH_SIZE, size;
    Out column[3] = {{NULL, 0, 0}, {NULL, 0, 0}, {NULL, 0, 0}};
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    while (!failed && (size = plain_at(buf, pos, end, max_length, 1))) {
        int64_t row[3] = {pos, be64(buf + pos + FIELDS_AT), (int32_t)be32(buf + pos + FIELDS_AT + 8)};
        for (int c = 0; c < 3 && !failed; c++)
            failed = !put(&column[c], &row[c], sizeof row[c]);
        if (!failed)
            pos += size;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    if (failed) {
        for (int c = 0; c < 3; c++)
            PyMem_RawFree(column[c].p);
        return PyErr_NoMemory();
    }
    return Py_BuildValue("(NNNn)", out_bytes(&column[0]), out_bytes(&column[1]), out_bytes(&column[2]), pos);
}

/* Decimal digits of v at p; returns the end. */
static char *decimal(char *p, long long v) {
    char digits[20];
    int n = 0;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    if (v < 0)
        *p++ = '-';
    do {
        digits[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    while (n)
        *p++ = digits[--n];
    return p;
}

static char *text(char *p, const Py_buffer *s) {
    memcpy(p, s->buf, (size_t)s->len);
    return p + s->len;
}

/* See dump_lines() in kl/log/pycore.py: each line is the template's five texts around four
   numbers (offset, position, size, timestamp) of up to 20 characters. */
static PyObject *core_dump_lines(PyObject *self, PyObject *args) {
    Py_buffer b, t[5];
    Py_ssize_t pos, end, max_message_bytes, size;
    PyObject *offset_obj, *position_obj;
    if (!PyArg_ParseTuple(args, "y*nnO!O!n(y*y*y*y*y*):dump_lines", &b, &pos, &end, &PyLong_Type, &offset_obj, &PyLong_Type,
                          &position_obj, &max_message_bytes, &t[0], &t[1], &t[2], &t[3], &t[4]))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t line_max = 4 * 20;
    for (int i = 0; i < 5; i++)
        line_max += t[i].len; /* each under PY_SSIZE_T_MAX / 8: they are objects in memory */
    if (!bounds(pos, end, b.len))
        goto done;
    int overflow_offset = 0, overflow_position = 0;
    long long base_offset = PyLong_AsLongLongAndOverflow(offset_obj, &overflow_offset);
    long long base_position = PyLong_AsLongLongAndOverflow(position_obj, &overflow_position);
    if (overflow_offset || overflow_position || base_offset < 0 || base_position < 0 || base_offset > LLONG_MAX - end ||
        base_position > LLONG_MAX - end) {
        PyErr_Format(PyExc_ValueError, "offsets %S and %S do not fit 63 bits", offset_obj, position_obj);
        goto done;
    }
    const unsigned char *buf = b.buf;
    Py_ssize_t max_length = max_message_bytes - LENGTH_SIZE;
    Out out = {NULL, 0, 0};
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    while ((size = plain_at(buf, pos, end, max_length, 0))) {
        if (!reserve(&out, line_max)) {
            failed = 1;
            break;
        }
        char *q = text(out.p + out.used, &t[0]);
        q = decimal(q, base_offset + pos);
        q = text(q, &t[1]);
        q = decimal(q, base_position + pos);
        q = text(q, &t[2]);
        q = decimal(q, size);
        q = text(q, &t[3]);
        q = decimal(q, be64(buf + pos + 10));
        q = text(q, &t[4]);
        out.used = q - out.p;
        pos += size;
    }
    Py_END_ALLOW_THREADS
    if (failed) {
        PyMem_RawFree(out.p);
        PyErr_NoMemory();
    } else {
        result = Py_BuildValue("(Nn)", out_bytes(&out), pos);
    }
done:
    PyBuffer_Release(&b);
    for (int i = 0; i < 5; i++)
        PyBuffer_Release(&t[i]);
    return result;
}

static int put_decimal(Out *out, long long v) {
    if (!reserve(out, 20))
        return 0;
    out->used = decimal(out->p + out->used, v) - out->p;
    return 1;
}

#define ISO_MIN_MS (-62135596800000LL) /* 0001-01-01T00:00:00.000Z */
#define ISO_MAX_MS 253402300799999LL   /* 9999-12-31T23:59:59.999Z */

/* See message.format_iso: ISO 8601 in UTC with milliseconds; outside years 1..9999 the digits. */
static int put_iso(Out *out, long long ms) {
    if (ms < ISO_MIN_MS || ms > ISO_MAX_MS)
        return put_decimal(out, ms);
    long long days = ms >= 0 ? ms / 86400000 : -((-ms + 86399999) / 86400000);
    long long rest = ms - days * 86400000;
    long long z = days + 719468; /* H. Hinnant's civil_from_days */
    long long era = (z >= 0 ? z : z - 146096) / 146097;
    long long doe = z - era * 146097;
    long long yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    long long doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    long long mp = (5 * doy + 2) / 153;
    int day = (int)(doy - (153 * mp + 2) / 5 + 1), month = (int)(mp < 10 ? mp + 3 : mp - 9);
    int year = (int)(yoe + era * 400 + (month <= 2));
    char iso[32];
    int n = snprintf(iso, sizeof iso, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", year, month, day, (int)(rest / 3600000),
                     (int)(rest / 60000 % 60), (int)(rest / 1000 % 60), (int)(rest % 1000));
    return put(out, iso, n);
}

/* Whether p[0:n] is UTF-8 as Python's strict decoder takes it (no surrogates, overlongs
   or code points past U+10FFFF). */
static int utf8_valid(const unsigned char *p, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        unsigned char c = p[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int more;
        unsigned char low = 0x80, high = 0xbf;
        if (c >= 0xc2 && c <= 0xdf)
            more = 1;
        else if (c >= 0xe0 && c <= 0xef) {
            more = 2;
            if (c == 0xe0)
                low = 0xa0;
            else if (c == 0xed)
                high = 0x9f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            more = 3;
            if (c == 0xf0)
                low = 0x90;
            else if (c == 0xf4)
                high = 0x8f;
        } else
            return 0;
        if (n - i <= more || p[i + 1] < low || p[i + 1] > high)
            return 0;
        for (int k = 2; k <= more; k++)
            if ((p[i + k] & 0xc0) != 0x80)
                return 0;
        i += more + 1;
    }
    return 1;
}

static const char base64_digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* See _json_member in kl/log/pycore.py: "name": "text" (JSON-escaped as json.dumps with
   ensure_ascii=False), "name_b64": "..." for bytes that are not UTF-8, or "name": null. */
static int put_json_text(Out *out, const char *name, const unsigned char *p, Py_ssize_t n);

static int put_json_member(Out *out, const char *name, PyObject *data) {
    if (data == Py_None) {
        Py_ssize_t name_len = (Py_ssize_t)strlen(name);
        return put(out, "\"", 1) && put(out, name, name_len) && put(out, "\": null", 7);
    }
    return put_json_text(out, name, (const unsigned char *)PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data));
}

/* put_json_member for the bytes p[0:n]. */
static int put_json_text(Out *out, const char *name, const unsigned char *p, Py_ssize_t n) {
    Py_ssize_t name_len = (Py_ssize_t)strlen(name);
    if (!reserve(out, name_len + 12) || !put(out, "\"", 1) || !put(out, name, name_len))
        return 0;
    if (!utf8_valid(p, n)) {
        if (!put(out, "_b64\": \"", 8) || !reserve(out, (n + 2) / 3 * 4 + 1))
            return 0;
        char *q = out->p + out->used;
        Py_ssize_t i = 0;
        for (; i + 2 < n; i += 3, q += 4) {
            uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
            q[0] = base64_digits[v >> 18], q[1] = base64_digits[v >> 12 & 63], q[2] = base64_digits[v >> 6 & 63],
            q[3] = base64_digits[v & 63];
        }
        if (i < n) {
            uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0);
            q[0] = base64_digits[v >> 18], q[1] = base64_digits[v >> 12 & 63];
            q[2] = i + 1 < n ? base64_digits[v >> 6 & 63] : '=', q[3] = '=';
            q += 4;
        }
        *q++ = '"';
        out->used = q - out->p;
        return 1;
    }
    if (!put(out, "\": \"", 4) || !reserve(out, 6 * n + 1)) /* at most \u00XX for each byte */
        return 0;
    char *q = out->p + out->used;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = p[i];
        if (c >= 0x20 && c != '"' && c != '\\') {
            *q++ = (char)c;
            continue;
        }
        *q++ = '\\';
        switch (c) {
        case '"': *q++ = '"'; break;
        case '\\': *q++ = '\\'; break;
        case '\n': *q++ = 'n'; break;
        case '\r': *q++ = 'r'; break;
        case '\t': *q++ = 't'; break;
        case '\b': *q++ = 'b'; break;
        case '\f': *q++ = 'f'; break;
        default:
            *q++ = 'u', *q++ = '0', *q++ = '0', *q++ = "0123456789abcdef"[c >> 4], *q++ = "0123456789abcdef"[c & 15];
        }
    }
    *q++ = '"';
    out->used = q - out->p;
    return 1;
}

/* The fields, in the order of kl/log/pycore.py's OFFSET ... HEADERS_JSON. */
enum { F_OFFSET, F_NEXT_OFFSET, F_TIMESTAMP, F_TIMESTAMP_ISO, F_TIMESTAMP_JSON, F_KEY, F_VALUE, F_KEYED, F_KEY_JSON, F_VALUE_JSON,
       F_HEADERS, F_HEADERS_JSON, F_COUNT, F_TEXT = -1 };

/* A message's headers, checked by render: a tuple of (str, bytes or None) pairs whose
   keys have their UTF-8 (a new reference, or NULL with an error set). */
static PyObject *checked_headers(PyObject *msg, PyObject *headers) {
    if (!PyTuple_Check(headers))
        goto bad;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(headers); i++) {
        PyObject *pair = PyTuple_GET_ITEM(headers, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyUnicode_Check(PyTuple_GET_ITEM(pair, 0)))
            goto bad;
        PyObject *data = PyTuple_GET_ITEM(pair, 1);
        if (data != Py_None && !PyBytes_CheckExact(data))
            goto bad;
        if (!PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(pair, 0), NULL))
            return NULL;
    }
    Py_INCREF(headers);
    return headers;
bad:
    PyErr_Format(PyExc_TypeError, "render: %.100R has headers that are not (str, bytes or None) pairs", msg);
    return NULL;
}

/* The headers as HEADERS or HEADERS_JSON write them (see kl/log/pycore.py). */
static int put_headers(Out *out, PyObject *headers, int json) {
    Py_ssize_t count = PyTuple_GET_SIZE(headers);
    if (json && count && !put(out, ", \"headers\": [", 14))
        return 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *pair = PyTuple_GET_ITEM(headers, i), *data = PyTuple_GET_ITEM(pair, 1);
        Py_ssize_t n;
        const char *name = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(pair, 0), &n); /* checked: cannot fail */
        if (json) {
            if ((i && !put(out, ", ", 2)) || !put(out, "{", 1) || !put_json_text(out, "key", (const unsigned char *)name, n) ||
                !put(out, ", ", 2) || !put_json_member(out, "value", data) || !put(out, "}", 1))
                return 0;
        } else if ((i && !put(out, ",", 1)) || !put(out, name, n) ||
                   (data != Py_None && (!put(out, "=", 1) || !put(out, PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data)))))
            return 0;
    }
    return !(json && count) || put(out, "]", 1);
}

typedef struct {
    int field;
    const char *text;
    Py_ssize_t len;
} Step;

/* A message's field as rendered, into out (stamp only when has_stamp). */
static int put_field(Out *out, int field, long long offset, long long next, int has_stamp, long long stamp, PyObject *key,
                     PyObject *value, PyObject *headers) {
    switch (field) {
    case F_OFFSET: return put_decimal(out, offset);
    case F_NEXT_OFFSET: return put_decimal(out, next);
    case F_TIMESTAMP: return !has_stamp || put_decimal(out, stamp);
    case F_TIMESTAMP_ISO: return !has_stamp || put_iso(out, stamp);
    case F_TIMESTAMP_JSON: return has_stamp ? put_decimal(out, stamp) : put(out, "null", 4);
    case F_KEY:
    case F_KEYED: return key == Py_None || put(out, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key));
    case F_VALUE: return value == Py_None || put(out, PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value));
    case F_KEY_JSON: return put_json_member(out, "key", key);
    case F_VALUE_JSON: return put_json_member(out, "value", value);
    default: return put_headers(out, headers, field == F_HEADERS_JSON);
    }
}

/* A number of a message: an int of 64 bits (1), else an error set (0). */
static int int64_of(PyObject *o, long long *v) {
    if (!PyLong_CheckExact(o)) {
        PyErr_Format(PyExc_TypeError, "render: a message holds %.100s, not an int", Py_TYPE(o)->tp_name);
        return 0;
    }
    int overflow = 0;
    *v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow) {
        PyErr_SetString(PyExc_OverflowError, "render: a message has a number outside 64 bits");
        return 0;
    }
    return 1;
}

/* See render() in kl/log/pycore.py. */
static PyObject *core_render(PyObject *self, PyObject *args) {
    PyObject *messages_arg, *program_arg;
    if (!PyArg_ParseTuple(args, "OO:render", &messages_arg, &program_arg))
        return NULL;
    PyObject *program = PySequence_Fast(program_arg, "render: the program is not a sequence");
    if (program == NULL)
        return NULL;
    PyObject *messages = NULL, *result = NULL;
    Out out = {NULL, 0, 0};
    Py_ssize_t steps_count = PySequence_Fast_GET_SIZE(program);
    Step *steps = PyMem_Calloc(steps_count ? steps_count : 1, sizeof(Step));
    if (steps == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < steps_count; i++) { /* the program holds its items: their bytes live until done */
        PyObject *item = PySequence_Fast_GET_ITEM(program, i), *text = item;
        steps[i].field = F_TEXT;
        int is_field = PyTuple_Check(item) && PyTuple_GET_SIZE(item) == 2 && PyLong_CheckExact(PyTuple_GET_ITEM(item, 0));
        if (is_field)
            text = PyTuple_GET_ITEM(item, 1);
        if (!PyBytes_Check(text)) {
            PyErr_Format(PyExc_TypeError, "render: an item is bytes or (field, bytes), not %.100R", item);
            goto done;
        }
        if (is_field) {
            int overflow = 0;
            long field = PyLong_AsLongAndOverflow(PyTuple_GET_ITEM(item, 0), &overflow);
            if (overflow || field < 0 || field >= F_COUNT) {
                PyErr_Format(PyExc_ValueError, "render: no field %S", PyTuple_GET_ITEM(item, 0));
                goto done;
            }
            steps[i].field = (int)field;
        }
        steps[i].text = PyBytes_AS_STRING(text);
        steps[i].len = PyBytes_GET_SIZE(text);
    }
    messages = PySequence_Fast(messages_arg, "render: the messages are not a sequence");
    if (messages == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(messages); i++) {
        PyObject *msg = PySequence_Fast_GET_ITEM(messages, i);
        long long offset, next, stamp = 0;
        if (!PyTuple_Check(msg) || PyTuple_GET_SIZE(msg) != 6) {
            PyErr_Format(PyExc_TypeError, "render: %.100R is not a message", msg);
            goto done;
        }
        PyObject *ts = PyTuple_GET_ITEM(msg, 2), *key = PyTuple_GET_ITEM(msg, 3), *value = PyTuple_GET_ITEM(msg, 4);
        if (!int64_of(PyTuple_GET_ITEM(msg, 0), &offset) || !int64_of(PyTuple_GET_ITEM(msg, 1), &next) ||
            (ts != Py_None && !int64_of(ts, &stamp)))
            goto done;
        if ((key != Py_None && !PyBytes_CheckExact(key)) || (value != Py_None && !PyBytes_CheckExact(value))) {
            PyErr_Format(PyExc_TypeError, "render: %.100R is not a message of bytes", msg);
            goto done;
        }
        PyObject *headers = checked_headers(msg, PyTuple_GET_ITEM(msg, 5));
        if (!headers)
            goto done;
        for (Py_ssize_t s = 0; s < steps_count; s++) {
            int field = steps[s].field;
            if (field == F_KEYED && key == Py_None)
                continue;
            if ((field != F_TEXT && !put_field(&out, field, offset, next, ts != Py_None, stamp, key, value, headers)) ||
                !put(&out, steps[s].text, steps[s].len)) {
                Py_DECREF(headers);
                goto done;
            }
        }
        Py_DECREF(headers);
    }
    result = out_bytes(&out);
done:
    if (result == NULL && !PyErr_Occurred())
        PyErr_NoMemory(); /* a put ran out */
    PyMem_RawFree(out.p);
    PyMem_Free(steps);
    Py_XDECREF(messages);
    Py_DECREF(program);
    return result;
}

static PyObject *message_type; /* kl.log.message.Message */

static PyObject *make_message(const unsigned char *p, Py_ssize_t size, int32_t key_length, long long offset) {
    PyTypeObject *type = (PyTypeObject *)message_type;
    Py_ssize_t key = key_length < 0 ? 0 : key_length;
    PyObject *message = type->tp_alloc(type, 6);
    if (!message)
        return NULL;
    PyTuple_SET_ITEM(message, 5, PyTuple_New(0)); /* no headers */
    PyTuple_SET_ITEM(message, 0, PyLong_FromLongLong(offset));
    PyTuple_SET_ITEM(message, 1, PyLong_FromLongLong(offset + size));
    PyTuple_SET_ITEM(message, 2, PyLong_FromLongLong(be64(p + FIELDS_AT)));
    if (key_length < 0) {
        Py_INCREF(Py_None);
        PyTuple_SET_ITEM(message, 3, Py_None);
    } else {
        PyTuple_SET_ITEM(message, 3, PyBytes_FromStringAndSize((const char *)p + HEADER_SIZE, key));
    }
    PyTuple_SET_ITEM(message, 4, PyBytes_FromStringAndSize((const char *)p + HEADER_SIZE + key, size - HEADER_SIZE - key));
    for (int i = 0; i < 6; i++) {
        if (PyTuple_GET_ITEM(message, i) == NULL) {
            Py_DECREF(message);
            return NULL;
        }
    }
    return message;
}

static PyObject *core_plain_messages(PyObject *self, PyObject *args) {
    Py_buffer b;
    Py_ssize_t pos, max_message_bytes;
    long long base;
    if (!PyArg_ParseTuple(args, "y*nLn:plain_messages", &b, &pos, &base, &max_message_bytes))
        return NULL;
    return plain_run(&b, pos, base, max_message_bytes, 1, make_message);
}

/* Bytes-like value i of a sequence being framed (a new view into it; released by the caller). */
static int value_at(PyObject *seq, Py_ssize_t i, Py_buffer *view) {
    if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, i), view, PyBUF_SIMPLE) == 0)
        return 1;
    PyErr_Format(PyExc_TypeError, "frame: value %zd is %.100s, not bytes", i, Py_TYPE(PySequence_Fast_GET_ITEM(seq, i))->tp_name);
    return 0;
}

/* Write one magic 2 message without a key at p (the timestamp and key length in fields,
   seed their checksum so far); where the next one goes. */
static inline unsigned char *frame_one(unsigned char *p, const void *value, Py_ssize_t size, uLong seed,
                                       const unsigned char *fields) {
    put32(p, (uint32_t)(size + HEADER_SIZE - LENGTH_SIZE));
    p[4] = CURRENT_MAGIC;
    p[5] = 0;
    put32(p + 6, (uint32_t)crc(seed, value, size));
    memcpy(p + FIELDS_AT, fields, FIELDS);
    memcpy(p + HEADER_SIZE, value, size);
    return p + HEADER_SIZE + size;
}

/* The fields after the checksum of a message without a key stamped timestamp, and the
   checksum of magic 2, no attributes and them: where each value's checksum starts. */
static uLong plain_fields(unsigned char *fields, long long timestamp) {
    put32(fields, (uint32_t)((uint64_t)timestamp >> 32));
    put32(fields + 4, (uint32_t)timestamp);
    put32(fields + 8, (uint32_t)NO_KEY);
    return crc32(seeds[0], fields, FIELDS);
}

static PyObject *core_frame(PyObject *self, PyObject *args) {
    PyObject *values, *seq, *out = NULL;
    long long timestamp;
    if (!PyArg_ParseTuple(args, "OL:frame", &values, &timestamp))
        return NULL;
    if (!(seq = PySequence_Fast(values, "frame: values must be a sequence")))
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), total = 0;
    Py_buffer view;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!value_at(seq, i, &view))
            goto done;
        Py_ssize_t size = view.len;
        PyBuffer_Release(&view);
        if (size > INT32_MAX - (HEADER_SIZE - LENGTH_SIZE) || total > PY_SSIZE_T_MAX - HEADER_SIZE - size) {
            PyErr_Format(PyExc_OverflowError, "frame: value %zd of %zd bytes is too large for a message", i, size);
            goto done;
        }
        total += HEADER_SIZE + size;
    }
    if (!(out = PyBytes_FromStringAndSize(NULL, total)))
        goto done;
    unsigned char fields[FIELDS];
    uLong seed = plain_fields(fields, timestamp);
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out), *stop = p + total;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!value_at(seq, i, &view)) {
            Py_CLEAR(out);
            goto done;
        }
        Py_ssize_t size = view.len;
        if (size > stop - p - HEADER_SIZE) { /* it grew since it was measured */
            PyBuffer_Release(&view);
            PyErr_Format(PyExc_ValueError, "frame: value %zd changed size while it was framed", i);
            Py_CLEAR(out);
            goto done;
        }
        p = frame_one(p, view.buf, size, seed, fields);
        PyBuffer_Release(&view);
    }
    if (p != stop) { /* a value shrank */
        PyErr_SetString(PyExc_ValueError, "frame: a value changed size while it was framed");
        Py_CLEAR(out);
    }
done:
    Py_DECREF(seq);
    return out;
}

#define MAX_VALUE (INT32_MAX - (HEADER_SIZE - LENGTH_SIZE)) /* a length field is an int32 */

/* frame_values(values, pos, timestamp, max_message_bytes, piece_bytes): see
   kl.log.pycore.frame_values.  The values are bytes (immutable) held while the GIL is let go
   for the checksums and copies. */
static PyObject *core_frame_values(PyObject *self, PyObject *args) {
    PyObject *values, *result = NULL, *pieces = NULL;
    Py_ssize_t pos, max_message_bytes, piece_bytes;
    long long timestamp;
    if (!PyArg_ParseTuple(args, "O!nLnn:frame_values", &PyList_Type, &values, &pos, &timestamp, &max_message_bytes,
                          &piece_bytes))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(values), largest = max_message_bytes - HEADER_SIZE;
    if (pos < 0 || pos > n) {
        PyErr_Format(PyExc_ValueError, "frame_values: position %zd outside the %zd values", pos, n);
        return NULL;
    }
    if (largest > MAX_VALUE)
        largest = MAX_VALUE;
    Py_ssize_t count = 0;
    while (pos + count < n) {
        PyObject *item = PyList_GET_ITEM(values, pos + count);
        if (!PyBytes_CheckExact(item) || PyBytes_GET_SIZE(item) > largest)
            break;
        count++;
    }
    PyObject **items = PyMem_Malloc((count ? count : 1) * sizeof(PyObject *));
    Py_ssize_t *ends = PyMem_Malloc((count + 1) * sizeof(Py_ssize_t)); /* each piece's first message, then the end */
    Py_ssize_t *sizes = PyMem_Malloc((count ? count : 1) * sizeof(Py_ssize_t)); /* each piece's framed bytes */
    if (!items || !ends || !sizes) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t npieces = 0, piece = 0;
    ends[0] = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        items[i] = PyList_GET_ITEM(values, pos + i);
        Py_INCREF(items[i]);
        Py_ssize_t framed = HEADER_SIZE + PyBytes_GET_SIZE(items[i]);
        if (i > ends[npieces] && piece > piece_bytes - framed) { /* full: a new piece from here */
            sizes[npieces] = piece;
            ends[++npieces] = i;
            piece = 0;
        }
        piece += framed;
    }
    if (count) {
        sizes[npieces] = piece;
        ends[++npieces] = count;
    }
    if (!(pieces = PyList_New(npieces)))
        goto release;
    for (Py_ssize_t k = 0; k < npieces; k++) {
        PyObject *framed = PyBytes_FromStringAndSize(NULL, sizes[k]);
        PyObject *pair = framed ? Py_BuildValue("(Nn)", framed, ends[k + 1] - ends[k]) : NULL;
        if (!pair) {
            Py_CLEAR(pieces);
            goto release;
        }
        PyList_SET_ITEM(pieces, k, pair);
    }
    unsigned char fields[FIELDS];
    uLong seed = plain_fields(fields, timestamp);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < npieces; k++) {
        unsigned char *p = (unsigned char *)PyBytes_AS_STRING(PyTuple_GET_ITEM(PyList_GET_ITEM(pieces, k), 0));
        for (Py_ssize_t i = ends[k]; i < ends[k + 1]; i++)
            p = frame_one(p, PyBytes_AS_STRING(items[i]), PyBytes_GET_SIZE(items[i]), seed, fields);
    }
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("(Nn)", pieces, pos + count);
release:
    for (Py_ssize_t i = 0; i < count; i++)
        Py_DECREF(items[i]);
done:
    PyMem_Free(items);
    PyMem_Free(ends);
    PyMem_Free(sizes);
    return result;
}

typedef struct {
    Py_ssize_t at, size; /* a record's value in the data */
} Record;

/* Frame records[0:count] (values in buf) as one piece: (framed, count, end). */
static PyObject *piece(const unsigned char *buf, const Record *records, Py_ssize_t count, Py_ssize_t framed,
                       const unsigned char *fields, uLong seed, Py_ssize_t end) {
    PyObject *out = PyBytes_FromStringAndSize(NULL, framed);
    if (!out)
        return NULL;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < count; i++)
        p = frame_one(p, buf + records[i].at, records[i].size, seed, fields);
    return Py_BuildValue("(Nnn)", out, count, end);
}

static PyObject *core_frame_records(PyObject *self, PyObject *args) {
    Py_buffer b, d;
    Py_ssize_t pos, max_message_bytes, piece_bytes, piece_count;
    int keep;
    long long timestamp;
    if (!PyArg_ParseTuple(args, "y*ny*pLnnn:frame_records", &b, &pos, &d, &keep, &timestamp, &max_message_bytes,
                          &piece_bytes, &piece_count))
        return NULL;
    PyObject *pieces = NULL, *result = NULL;
    Record *records = NULL;
    Py_ssize_t capacity = 0, count = 0, framed = 0, piece_end = pos;
    int blocked = 0;
    if (d.len == 0) {
        PyErr_SetString(PyExc_ValueError, "frame_records: an empty delimiter");
        goto done;
    }
    if (!bounds(pos, b.len, b.len) || !(pieces = PyList_New(0)))
        goto done;
    const unsigned char *buf = b.buf, *delim = d.buf;
    Py_ssize_t end = b.len, limit = max_message_bytes - HEADER_SIZE;
    if (limit > MAX_VALUE)
        limit = MAX_VALUE;
    unsigned char fields[FIELDS];
    uLong seed = plain_fields(fields, timestamp);
    for (;;) {
        const unsigned char *hit = d.len == 1 ? memchr(buf + pos, delim[0], end - pos)
                                              : memmem(buf + pos, end - pos, delim, d.len);
        if (!hit)
            break;
        Py_ssize_t next = hit - buf + d.len, size = (keep ? next : hit - buf) - pos;
        if (size > limit) {
            blocked = 1;
            break;
        }
        if (count && (framed + HEADER_SIZE + size > piece_bytes || count == piece_count)) {
            PyObject *one = piece(buf, records, count, framed, fields, seed, piece_end);
            if (!one || PyList_Append(pieces, one) < 0) {
                Py_XDECREF(one);
                goto done;
            }
            Py_DECREF(one);
            count = framed = 0;
        }
        if (count == capacity) {
            capacity = capacity ? 2 * capacity : 1024;
            Record *grown = PyMem_Realloc(records, capacity * sizeof(Record));
            if (!grown) {
                PyErr_NoMemory();
                goto done;
            }
            records = grown;
        }
        records[count].at = pos;
        records[count].size = size;
        count++;
        framed += HEADER_SIZE + size;
        pos = piece_end = next;
    }
    if (count) {
        PyObject *one = piece(buf, records, count, framed, fields, seed, piece_end);
        if (!one || PyList_Append(pieces, one) < 0) {
            Py_XDECREF(one);
            goto done;
        }
        Py_DECREF(one);
    }
    result = Py_BuildValue("(OnO)", pieces, piece_end, blocked ? Py_True : Py_False);
done:
    Py_XDECREF(pieces);
    PyMem_Free(records);
    PyBuffer_Release(&b);
    PyBuffer_Release(&d);
    return result;
}

/* ---------------------------------------------------------------- the async producer's fast lane */

typedef struct {
    PyObject_HEAD
    PyObject *queue, *slow, *general;
    PyObject *topic, *partition; /* topic NULL until the first aim */
    Py_ssize_t room, wake_at;
    unsigned long owner;
    int owned;
} Lane;

static const char *const SEND_NAMES[] = {"topic", "value", "key", "partition", "timestamp", "callback", "headers"};
#define SEND_ARGS 7
static PyObject *send_names[SEND_ARGS]; /* interned: a call's keyword names are these objects, as a rule */

/* Which of send's arguments the keyword name is (SEND_ARGS: none). */
static int send_argument(PyObject *name) {
    for (int at = 0; at < SEND_ARGS; at++)
        if (name == send_names[at])
            return at;
    for (int at = 0; at < SEND_ARGS; at++)
        if (PyUnicode_Check(name) && PyUnicode_CompareWithASCIIString(name, SEND_NAMES[at]) == 0)
            return at;
    return SEND_ARGS;
}

static int lane_traverse(Lane *self, visitproc visit, void *arg) {
    Py_VISIT(self->queue);
    Py_VISIT(self->slow);
    Py_VISIT(self->general);
    Py_VISIT(self->topic);
    Py_VISIT(self->partition);
    return 0;
}

static int lane_clear(Lane *self) {
    Py_CLEAR(self->queue);
    Py_CLEAR(self->slow);
    Py_CLEAR(self->general);
    Py_CLEAR(self->topic);
    Py_CLEAR(self->partition);
    return 0;
}

static void lane_dealloc(Lane *self) {
    PyObject_GC_UnTrack(self);
    lane_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int lane_init(Lane *self, PyObject *args, PyObject *kwds) {
    PyObject *queue, *slow, *general;
    static char *names[] = {"queue", "slow", "general", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OO:Lane", names, &PyList_Type, &queue, &slow, &general))
        return -1;
    Py_INCREF(queue);
    Py_INCREF(slow);
    Py_INCREF(general);
    Py_XSETREF(self->queue, queue);
    Py_XSETREF(self->slow, slow);
    Py_XSETREF(self->general, general);
    Py_CLEAR(self->topic);
    Py_INCREF(Py_None);
    Py_XSETREF(self->partition, Py_None);
    self->room = self->wake_at = -1;
    self->owned = 0;
    return 0;
}

static PyObject *lane_aim(Lane *self, PyObject *args) {
    PyObject *topic, *partition;
    Py_ssize_t room;
    if (!PyArg_ParseTuple(args, "OOn:aim", &topic, &partition, &room))
        return NULL;
    Py_INCREF(topic);
    Py_INCREF(partition);
    Py_XSETREF(self->topic, topic);
    Py_XSETREF(self->partition, partition);
    self->room = room;
    Py_RETURN_NONE;
}

/* send(topic, value, key=None, partition=None, timestamp=None, callback=None, headers=()): see
   kl.log.pycore.Lane.send.  Arguments it cannot place go to general as they came, which
   raises what Python would. */
static PyObject *lane_send(Lane *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *given[SEND_ARGS] = {NULL};
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs > SEND_ARGS || !self->topic || !self->owned)
        goto general;
    for (Py_ssize_t i = 0; i < nargs; i++)
        given[i] = args[i];
    for (Py_ssize_t k = 0; k < nkw; k++) {
        int at = send_argument(PyTuple_GET_ITEM(kwnames, k));
        if (at == SEND_ARGS || given[at])
            goto general;
        given[at] = args[nargs + k];
    }
    PyObject *value = given[1], *partition = given[3] ? given[3] : Py_None;
    if (given[0] != self->topic || !value || (given[2] && given[2] != Py_None) || (given[4] && given[4] != Py_None) ||
        (given[5] && given[5] != Py_None) ||
        (given[6] && given[6] != Py_None && !(PyTuple_CheckExact(given[6]) && PyTuple_GET_SIZE(given[6]) == 0)) ||
        !PyBytes_CheckExact(value) || PyBytes_GET_SIZE(value) > self->room)
        goto general;
    if (partition != self->partition) {
        if (!PyLong_CheckExact(partition) || !PyLong_CheckExact(self->partition))
            goto general;
        int same = PyObject_RichCompareBool(partition, self->partition, Py_EQ);
        if (same < 0)
            return NULL;
        if (!same)
            goto general;
    }
    if (PyThread_get_thread_ident() != self->owner)
        goto general;
    if (PyList_Append(self->queue, value) < 0)
        return NULL;
    if (PyList_GET_SIZE(self->queue) > self->wake_at) {
        PyObject *done = PyObject_CallOneArg(self->slow, value);
        if (!done)
            return NULL;
        Py_DECREF(done);
    }
    Py_RETURN_NONE;
general:
    return PyObject_Vectorcall(self->general, args, nargs, kwnames);
}

static PyObject *lane_get_owner(Lane *self, void *closure) {
    if (!self->owned)
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLong(self->owner);
}

static int lane_set_owner(Lane *self, PyObject *value, void *closure) {
    if (!value || value == Py_None) {
        self->owned = 0;
        return 0;
    }
    unsigned long owner = PyLong_AsUnsignedLong(value);
    if (owner == (unsigned long)-1 && PyErr_Occurred())
        return -1;
    self->owner = owner;
    self->owned = 1;
    return 0;
}

static PyMethodDef lane_methods[] = {
    {"aim", (PyCFunction)lane_aim, METH_VARARGS, "aim(topic, partition, room): see kl.log.pycore.Lane.aim"},
    {"send", (PyCFunction)(void (*)(void))lane_send, METH_FASTCALL | METH_KEYWORDS,
     "send(topic, value, key=None, partition=None, timestamp=None, callback=None): see kl.log.pycore.Lane.send"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef lane_members[] = {
    {"partition", T_OBJECT, offsetof(Lane, partition), READONLY, NULL},
    {"room", T_PYSSIZET, offsetof(Lane, room), READONLY, NULL},
    {"wake_at", T_PYSSIZET, offsetof(Lane, wake_at), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef lane_getset[] = {
    {"owner", (getter)lane_get_owner, (setter)lane_set_owner, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject LaneType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kl.log._core.Lane",
    .tp_basicsize = sizeof(Lane),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Lane(queue, slow, general): the async producer's fast lane; see kl.log.pycore.Lane",
    .tp_traverse = (traverseproc)lane_traverse,
    .tp_clear = (inquiry)lane_clear,
    .tp_dealloc = (destructor)lane_dealloc,
    .tp_init = (initproc)lane_init,
    .tp_new = PyType_GenericNew,
    .tp_methods = lane_methods,
    .tp_members = lane_members,
    .tp_getset = lane_getset,
};

/* ------------------------------------------------------------ Kafka record batches */

#define KAFKA_HEADER 61  /* a record batch's header: see KAFKA_BATCH in kl/log/pycore.py */
#define KAFKA_CRC_AT 21  /* where the bytes its CRC-32C covers begin */
#define MIN_TIMESTAMP (-62135596800000LL)
#define MAX_TIMESTAMP 253402300799999LL

static inline void put64(unsigned char *p, uint64_t v) {
    put32(p, (uint32_t)(v >> 32));
    put32(p + 4, (uint32_t)v);
}

/* See kafka_batch() in kl/log/pycore.py. */
static PyObject *core_kafka_batch(PyObject *self, PyObject *args) {
    Py_buffer b;
    Py_ssize_t pos, max_message_bytes;
    long long base;
    if (!PyArg_ParseTuple(args, "y*nLn:kafka_batch", &b, &pos, &base, &max_message_bytes))
        return NULL;
    if (!bounds(pos, b.len, b.len)) {
        PyBuffer_Release(&b);
        return NULL;
    }
    const unsigned char *buf = b.buf;
    Py_ssize_t end = b.len, max_length = max_message_bytes - LENGTH_SIZE, size;
    long long base_ts = 0, max_ts = 0, count = 0;
    Out out = {NULL, 0, 0};
    int failed = !reserve(&out, KAFKA_HEADER);
    out.used = KAFKA_HEADER;
    Py_BEGIN_ALLOW_THREADS
    while (!failed && (size = plain_at(buf, pos, end, max_length, 1))) {
        const unsigned char *p = buf + pos;
        long long ts = be64(p + FIELDS_AT), delta;
        int32_t key_length = (int32_t)be32(p + 18);
        if (count == 0)
            base_ts = max_ts = ts;
        if (__builtin_sub_overflow(ts, base_ts, &delta))
            break; /* not one batch's: the next answer's */
        Py_ssize_t key_size = key_length < 0 ? 0 : key_length, value_size = size - HEADER_SIZE - key_size;
        unsigned char head[31], tail[11];
        int h = 0, t = 0;
        head[h++] = 0;
        h += zigzag(head + h, delta);
        h += zigzag(head + h, count);
        h += zigzag(head + h, key_length < 0 ? -1 : key_length);
        t += zigzag(tail, value_size);
        unsigned char length[10];
        int l = zigzag(length, h + key_size + t + value_size + 1);
        failed = !reserve(&out, l + h + key_size + t + value_size + 1);
        if (failed)
            break;
        put(&out, length, l);
        put(&out, head, h);
        put(&out, p + HEADER_SIZE, key_size);
        put(&out, tail, t);
        put(&out, p + HEADER_SIZE + key_size, value_size);
        out.p[out.used++] = 0; /* no headers */
        if (ts > max_ts)
            max_ts = ts;
        count++;
        pos += size;
    }
    if (!failed && count) {
        unsigned char *h = (unsigned char *)out.p;
        put64(h, (uint64_t)base);
        put32(h + 8, (uint32_t)(out.used - 12));
        put32(h + 12, 0);
        h[16] = 2;
        h[21] = h[22] = 0;
        put32(h + 23, (uint32_t)(count - 1));
        put64(h + 27, (uint64_t)base_ts);
        put64(h + 35, (uint64_t)max_ts);
        put64(h + 43, (uint64_t)-1);
        h[51] = h[52] = 0xff;
        put32(h + 53, (uint32_t)-1);
        put32(h + 57, (uint32_t)count);
        put32(h + 17, crc32c_of(0, h + KAFKA_CRC_AT, out.used - KAFKA_CRC_AT));
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    if (failed) {
        PyMem_RawFree(out.p);
        return PyErr_NoMemory();
    }
    if (!count)
        out.used = 0;
    return Py_BuildValue("(NLn)", out_bytes(&out), count, pos);
}

/* What is wrong with a batch's records, found without the GIL, raised with it. */
typedef struct {
    enum { FINE, CUT_VARINT, LONG_VARINT, FIELD, CLAIM_BYTES, CLAIM_HEADERS, PAST_FIELDS, TRAILING, NO_MEMORY } kind;
    Py_ssize_t at, record, left;
    long long value;
} Fault;

static PyObject *raise_fault(const Fault *f, Py_ssize_t count) {
    switch (f->kind) {
    case CUT_VARINT:
        return PyErr_Format(PyExc_ValueError, "read_varint: the buffer ends inside the varint at %zd", f->at);
    case LONG_VARINT:
        return PyErr_Format(PyExc_ValueError, "read_varint: the varint at %zd runs past 64 bits", f->at);
    case FIELD:
        return PyErr_Format(PyExc_ValueError, "record %zd has a field of length %lld with %zd bytes left", f->record, f->value,
                            f->left);
    case CLAIM_BYTES:
        return PyErr_Format(PyExc_ValueError, "record %zd claims %lld bytes, %zd are left", f->record, f->value, f->left);
    case CLAIM_HEADERS:
        return PyErr_Format(PyExc_ValueError, "record %zd claims %lld headers", f->record, f->value);
    case PAST_FIELDS:
        return PyErr_Format(PyExc_ValueError, "record %zd holds %zd bytes past its fields", f->record, f->left);
    case TRAILING:
        return PyErr_Format(PyExc_ValueError, "%zd bytes follow the batch's %zd records", f->left, count);
    default:
        return PyErr_NoMemory();
    }
}

/* The zigzag varint at *pos of buf[0:len], as read_varint() reads it: 0 and *pos past it,
   else -1 with the fault set. */
static int get_varint(const unsigned char *buf, Py_ssize_t len, Py_ssize_t *pos, long long *value, Fault *fault) {
    Py_ssize_t start = *pos, at = start;
    uint64_t n = 0;
    for (int shift = 0; at < len && at < start + 10; at++, shift += 7) {
        unsigned char byte = buf[at];
        if (shift == 63 && byte > 1)
            break;
        n |= (uint64_t)(byte & 0x7f) << shift;
        if (byte < 0x80) {
            *value = (long long)(n >> 1) ^ -(long long)(n & 1);
            *pos = at + 1;
            return 0;
        }
    }
    fault->kind = at == len && at < start + 10 ? CUT_VARINT : LONG_VARINT;
    fault->at = start;
    return -1;
}

/* A record's key, value or header field at *pos: its length (-1: null), where its bytes
   start (*data) and *pos past them; -2 with the fault set when it does not fit the record
   (see _record_field in pycore). */
static long long get_field(const unsigned char *buf, Py_ssize_t len, Py_ssize_t *pos, Py_ssize_t end, Py_ssize_t i,
                           Py_ssize_t *data, Fault *fault) {
    long long length;
    if (get_varint(buf, len, pos, &length, fault) < 0)
        return -2;
    *data = *pos;
    if (length == -1)
        return -1;
    if (length < 0 || length > end - *pos) {
        *fault = (Fault){FIELD, 0, i, end - *pos, length};
        return -2;
    }
    *pos += length;
    return length;
}

/* The records of a batch's body as kl messages into out, every record checked: 1 when all
   were simple (see kafka_records in pycore), 0 when one was not, -1 with the fault set. */
static int records_to_messages(const unsigned char *buf, Py_ssize_t len, Py_ssize_t count, long long base_ts,
                               long long append_ts, long long now, Py_ssize_t max_message_bytes, Out *out, Fault *fault) {
    Py_ssize_t pos = 0;
    int simple = 1;
    for (Py_ssize_t i = 0; i < count; i++) {
        long long length, delta, offset_delta, headers;
        if (get_varint(buf, len, &pos, &length, fault) < 0)
            return -1;
        if (length < 6 || length > len - pos) {
            *fault = (Fault){CLAIM_BYTES, 0, i, len - pos, length};
            return -1;
        }
        Py_ssize_t end = pos + (Py_ssize_t)length, at = pos + 1, key_at, value_at, header_at;
        if (get_varint(buf, len, &at, &delta, fault) < 0 || get_varint(buf, len, &at, &offset_delta, fault) < 0)
            return -1;
        long long key_length = get_field(buf, len, &at, end, i, &key_at, fault);
        if (key_length == -2)
            return -1;
        long long value_length = get_field(buf, len, &at, end, i, &value_at, fault);
        if (value_length == -2 || get_varint(buf, len, &at, &headers, fault) < 0)
            return -1;
        if (headers < 0 || headers > end - at) {
            *fault = (Fault){CLAIM_HEADERS, 0, i, 0, headers};
            return -1;
        }
        for (long long h = 0; h < 2 * headers; h++)
            if (get_field(buf, len, &at, end, i, &header_at, fault) == -2)
                return -1;
        if (at != end) {
            *fault = (Fault){PAST_FIELDS, 0, i, end - at, 0};
            return -1;
        }
        pos = end;
        if (!simple)
            continue;
        long long ts = append_ts;
        if (ts == -1 && __builtin_add_overflow(base_ts, delta, &ts)) {
            simple = 0;
            continue;
        }
        if (ts == -1)
            ts = now;
        Py_ssize_t key_size = key_length < 0 ? 0 : (Py_ssize_t)key_length;
        Py_ssize_t size = HEADER_SIZE + key_size + (Py_ssize_t)value_length;
        if (value_length < 0 || headers || ts < MIN_TIMESTAMP || ts > MAX_TIMESTAMP || size > max_message_bytes) {
            simple = 0;
            continue;
        }
        if (!reserve(out, size)) {
            fault->kind = NO_MEMORY;
            return -1;
        }
        unsigned char *p = (unsigned char *)out->p + out->used;
        put32(p, (uint32_t)(size - LENGTH_SIZE));
        p[4] = CURRENT_MAGIC;
        p[5] = 0;
        put64(p + FIELDS_AT, (uint64_t)ts);
        put32(p + 18, (uint32_t)(key_length < 0 ? NO_KEY : (int32_t)key_length));
        memcpy(p + HEADER_SIZE, buf + key_at, key_size);
        memcpy(p + HEADER_SIZE + key_size, buf + value_at, (size_t)value_length);
        put32(p + 6, (uint32_t)crc(seeds[0], p + FIELDS_AT, size - FIELDS_AT));
        out->used += size;
    }
    if (pos != len) {
        *fault = (Fault){TRAILING, 0, 0, len - pos, 0};
        return -1;
    }
    return simple;
}

/* See kafka_records() in kl/log/pycore.py; the records are read without the GIL. */
static PyObject *core_kafka_records(PyObject *self, PyObject *args) {
    Py_buffer b;
    Py_ssize_t count, max_message_bytes;
    long long base_ts, append_ts, now;
    if (!PyArg_ParseTuple(args, "y*nLLLn:kafka_records", &b, &count, &base_ts, &append_ts, &now, &max_message_bytes))
        return NULL;
    Out out = {NULL, 0, 0};
    Fault fault = {FINE, 0, 0, 0, 0};
    int simple;
    Py_BEGIN_ALLOW_THREADS
    simple = records_to_messages(b.buf, b.len, count, base_ts, append_ts, now, max_message_bytes, &out, &fault);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    PyObject *result;
    if (simple < 0)
        result = raise_fault(&fault, count);
    else if (simple)
        result = Py_BuildValue("(Nn)", out_bytes(&out), count < 0 ? 0 : count);
    else
        result = Py_NewRef(Py_None);
    PyMem_RawFree(out.p);
    return result;
}

static PyMethodDef methods[] = {
    {"check", core_check, METH_VARARGS, "check(buf, pos, end, max_message_bytes): see kl.log.pycore.check"},
    {"crc32c", core_crc32c, METH_VARARGS, "crc32c(data, crc=0): see kl.log.pycore.crc32c"},
    {"murmur2", core_murmur2, METH_VARARGS, "murmur2(data): see kl.log.pycore.murmur2"},
    {"varint", core_varint, METH_O, "varint(value): see kl.log.pycore.varint"},
    {"render", core_render, METH_VARARGS, "render(messages, program): see kl.log.pycore.render"},
    {"read_varint", core_read_varint, METH_VARARGS, "read_varint(buf, pos): see kl.log.pycore.read_varint"},
    {"kafka_batch", core_kafka_batch, METH_VARARGS, "kafka_batch(buf, pos, base, max_message_bytes): see kl.log.pycore"},
    {"kafka_records", core_kafka_records, METH_VARARGS,
     "kafka_records(body, count, base_ts, append_ts, now, max_message_bytes): see kl.log.pycore"},
    {"walk", core_walk, METH_VARARGS, "walk(buf, pos, end, max_message_bytes): see kl.log.pycore.walk"},
    {"recent", core_recent, METH_VARARGS, "recent(buf, pos, end, max_message_bytes, count): see kl.log.pycore.recent"},
    {"plain_values", core_plain_values, METH_VARARGS, "plain_values(buf, pos, max_message_bytes): see kl.log.pycore"},
    {"plain_columns", core_plain_columns, METH_VARARGS, "plain_columns(buf, pos, max_message_bytes): see kl.log.pycore"},
    {"dump_lines", core_dump_lines, METH_VARARGS,
     "dump_lines(buf, pos, end, base_offset, base_position, max_message_bytes, template): see kl.log.pycore"},
    {"plain_messages", core_plain_messages, METH_VARARGS, "plain_messages(buf, pos, base, max_message_bytes): see kl.log.pycore"},
    {"frame", core_frame, METH_VARARGS, "frame(values, timestamp): see kl.log.pycore.frame"},
    {"frame_values", core_frame_values, METH_VARARGS,
     "frame_values(values, pos, timestamp, max_message_bytes, piece_bytes): see kl.log.pycore.frame_values"},
    {"frame_records", core_frame_records, METH_VARARGS,
     "frame_records(data, pos, delimiter, keep, timestamp, max_message_bytes, piece_bytes, piece_count): see kl.log.pycore"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kl.log._core", "kl's per-message loops in C (twins: kl.log.pycore).", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__core(void) {
#ifdef X86_SIMD
    __builtin_cpu_init();
    have_clmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
    have_crc32c_instruction = __builtin_cpu_supports("sse4.2");
#elif defined(ARM_CRC)
    have_crc32c_instruction = (getauxval(AT_HWCAP) & HWCAP_CRC32) != 0;
#endif
#if defined(X86_SIMD) || defined(ARM_CRC)
    crc32c_fold_init();
#endif
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t reg = n;
        for (int bit = 0; bit < 8; bit++)
            reg = reg >> 1 ^ (reg & 1 ? 0x82F63B78u : 0);
        crc32c_table[n] = reg;
    }
    for (int attrs = 0; attrs < 256; attrs++) {
        unsigned char pair[2] = {CURRENT_MAGIC, (unsigned char)attrs};
        seeds[attrs] = crc32(crc32(0L, Z_NULL, 0), pair, 2);
        pair[0] = HEADERS_MAGIC;
        seeds_v3[attrs] = crc32(crc32(0L, Z_NULL, 0), pair, 2);
    }
    PyObject *messages = PyImport_ImportModule("kl.log.message");
    if (!messages)
        return NULL;
    message_type = PyObject_GetAttrString(messages, "Message");
    Py_DECREF(messages);
    if (!message_type)
        return NULL;
    if (!PyType_Check(message_type) || !PyType_IsSubtype((PyTypeObject *)message_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "kl.log.message.Message is not a tuple type");
        return NULL;
    }
    if (PyType_Ready(&LaneType) < 0)
        return NULL;
    for (int at = 0; at < SEND_ARGS; at++)
        if (!(send_names[at] = PyUnicode_InternFromString(SEND_NAMES[at])))
            return NULL;
    PyObject *made = PyModule_Create(&module);
    if (!made)
        return NULL;
#if defined(X86_SIMD)
    const char *crc32c_by = have_crc32c_instruction ? "SSE4.2" : "table";
#elif defined(ARM_CRC)
    const char *crc32c_by = have_crc32c_instruction ? "ARMv8 CRC" : "table";
#else
    const char *crc32c_by = "table";
#endif
    if (PyModule_AddStringConstant(made, "CRC32C", crc32c_by) < 0) {
        Py_DECREF(made);
        return NULL;
    }
    Py_INCREF(&LaneType);
    if (PyModule_AddObject(made, "Lane", (PyObject *)&LaneType) < 0) {
        Py_DECREF(&LaneType);
        Py_DECREF(made);
        return NULL;
    }
    return made;
}
