/* codec.c: block compression (lz4, zlib, snappy) and the .ghz frame (codec.h). */
#include <stdlib.h>
#include <string.h>

#include <lz4.h>
#include <snappy-c.h>
#include <zlib.h>

#include "codec.h"

size_t codec_bound(enum ghc_compression c, size_t n)
{
    switch (c) {
    case GHC_COMPRESSION_LZ4:    return (size_t)LZ4_compressBound((int)n);
    case GHC_COMPRESSION_ZLIB:   return (size_t)compressBound((uLong)n);
    case GHC_COMPRESSION_SNAPPY: return snappy_max_compressed_length(n);
    default:                     return n;
    }
}

int codec_compress(enum ghc_compression c, const void *src, size_t n, void *dst, size_t cap, size_t *out)
{
    switch (c) {
    case GHC_COMPRESSION_LZ4: {
        if (n > (size_t)LZ4_MAX_INPUT_SIZE)
            return -1;
        int k = LZ4_compress_default(src, dst, (int)n, (int)(cap > INT32_MAX ? INT32_MAX : cap));
        if (k <= 0 && n)
            return -1;
        *out = (size_t)k;
        return 0;
    }
    case GHC_COMPRESSION_ZLIB: {
        uLongf dl = (uLongf)cap;
        if (compress2(dst, &dl, src, (uLong)n, 1) != Z_OK)   /* level 1: staging speed first */
            return -1;
        *out = (size_t)dl;
        return 0;
    }
    case GHC_COMPRESSION_SNAPPY: {
        size_t dl = cap;
        if (snappy_compress(src, n, dst, &dl) != SNAPPY_OK)
            return -1;
        *out = dl;
        return 0;
    }
    default:
        if (cap < n)
            return -1;
        memcpy(dst, src, n);
        *out = n;
        return 0;
    }
}

int codec_decompress(enum ghc_compression c, const void *src, size_t n, void *dst, size_t raw)
{
    switch (c) {
    case GHC_COMPRESSION_LZ4:
        return n <= INT32_MAX && raw <= INT32_MAX &&
               LZ4_decompress_safe(src, dst, (int)n, (int)raw) == (int)raw ? 0 : -1;
    case GHC_COMPRESSION_ZLIB: {
        uLongf dl = (uLongf)raw;
        return uncompress(dst, &dl, src, (uLong)n) == Z_OK && dl == raw ? 0 : -1;
    }
    case GHC_COMPRESSION_SNAPPY: {
        size_t dl = 0;
        if (snappy_uncompressed_length(src, n, &dl) != SNAPPY_OK || dl != raw)
            return -1;
        return snappy_uncompress(src, n, dst, &dl) == SNAPPY_OK && dl == raw ? 0 : -1;
    }
    default:
        if (n != raw)
            return -1;
        memcpy(dst, src, n);
        return 0;
    }
}

uint64_t codec_max_raw(enum ghc_compression c, uint64_t n)
{
    /* n < 2^32 in a .ghz block table: no product below overflows */
    switch (c) {
    case GHC_COMPRESSION_LZ4:    return n * 256 + 64;
    case GHC_COMPRESSION_ZLIB:   return n * 1040 + 64;
    case GHC_COMPRESSION_SNAPPY: return n * 32 + 64;
    default:                     return n;
    }
}

uint32_t codec_crc(const void *p, size_t n)
{
    uLong crc = crc32(0L, Z_NULL, 0);
    const Bytef *b = p;
    while (n) {
        uInt k = n > (1u << 30) ? (1u << 30) : (uInt)n;
        crc = crc32(crc, b, k);
        b += k;
        n -= k;
    }
    return (uint32_t)crc;
}

static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }

int ghz_encode(enum ghc_compression c, uint32_t block, const void *src, size_t n, void **out, size_t *len)
{
    if (!block || block > GHZ_MAX_BLOCK)
        return -1;
    size_t nb = n / block + (n % block != 0), per = codec_bound(c, block);
    if (nb > UINT32_MAX || per > (SIZE_MAX - GHZ_HEAD) / 8 - 1 || (nb && nb > (SIZE_MAX - GHZ_HEAD) / (8 + per)))
        return -1;
    size_t cap = GHZ_HEAD + nb * 8 + nb * per;
    uint8_t *buf = malloc(cap ? cap : 1);
    if (!buf)
        return -1;
    memset(buf, 0, GHZ_HEAD);
    memcpy(buf, GHZ_MAGIC, 4);
    buf[4] = (uint8_t)c;
    put32(buf + 8, block);
    put64(buf + 12, n);
    put32(buf + 20, (uint32_t)nb);
    size_t at = GHZ_HEAD + nb * 8;
    for (size_t b = 0; b < nb; b++) {
        size_t off = b * block, k = n - off < block ? n - off : block, got;
        if (codec_compress(c, (const uint8_t *)src + off, k, buf + at, cap - at, &got) < 0) {
            free(buf);
            return -1;
        }
        put32(buf + GHZ_HEAD + b * 8, (uint32_t)got);
        put32(buf + GHZ_HEAD + b * 8 + 4, codec_crc((const uint8_t *)src + off, k));
        at += got;
    }
    *out = buf;
    *len = at;
    return 0;
}
