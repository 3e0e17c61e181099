/* codec.h: block compression for the in_memory backend (lz4, zlib, snappy) and the .ghz file
 * frame: a file stored compressed on disk, staged as it is. Not installed. */
#ifndef GHC_IN_MEMORY_CODEC_H
#define GHC_IN_MEMORY_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include <gh200core/backend.h>   /* defines: enum ghc_compression */

/* The most bytes compressing n bytes can give. */
size_t codec_bound(enum ghc_compression c, size_t n);
/* Compress src[0..n) into dst (cap >= codec_bound). Returns 0 or -1. */
int codec_compress(enum ghc_compression c, const void *src, size_t n, void *dst, size_t cap, size_t *out);
/* Decompress exactly `raw` bytes. Returns 0, or -1 when the block is corrupt. */
int codec_decompress(enum ghc_compression c, const void *src, size_t n, void *dst, size_t raw);
/* The most raw bytes that n compressed bytes of codec c can decode to (a generous bound on
 * each codec's best ratio: lz4 ~255:1, zlib ~1032:1, snappy ~22:1, none 1:1). Checked before a
 * block is decoded, so that a header cannot claim more than its blocks can hold. */
uint64_t codec_max_raw(enum ghc_compression c, uint64_t n);
/* CRC-32 (zlib's) of a buffer. */
uint32_t codec_crc(const void *p, size_t n);

/* The .ghz frame, little-endian:
 *   "GHZ1", u8 codec (enum ghc_compression), 3 zero bytes, u32 block size, u64 raw size,
 *   u32 block count n, u32 0, then n x { u32 compressed size, u32 CRC-32 of the raw block },
 *   then the n compressed blocks back to back. */
#define GHZ_MAGIC "GHZ1"
#define GHZ_HEAD  32u
/* The largest block a .ghz file may use (block_kib's upper bound, 1 GiB). */
#define GHZ_MAX_BLOCK (1u << 30)
/* Write src as a .ghz image into a malloc'ed buffer (*out, *len). Returns 0 or -1. */
int ghz_encode(enum ghc_compression c, uint32_t block, const void *src, size_t n, void **out, size_t *len);

#endif /* GHC_IN_MEMORY_CODEC_H */
