/* saved.h: the ring through which a memory policy moves saved activations (GHC_ROLE_SAVED;
 * mempolicy.h, saved_begin / saved_end). Each unit's home is where the policy put it (pinned
 * host memory); a few buffers where kernels read, the ring, hold the units in use. A write
 * begin hands out a free buffer; its end copies the buffer home on a copy stream ordered after
 * the caller's work, and the buffer keeps the unit, so a read right after (the backward's first
 * blocks) takes it without a copy. A read begin takes the buffer holding the unit or copies the
 * unit in, then starts the copies of the units the backward reads next (the lower unit
 * numbers) into free buffers, overlapped with the caller's compute. The host never waits on
 * the hot path: every order is an event between the compute stream and the copy stream.
 *
 * Pure C: the buffers, copies and events go through struct saved_io, CUDA in offload and
 * gh200_uvm (saved_cuda.c), memcpy in host (the CPU suites' test of this logic, which can fill
 * every buffer with NaN bytes when it is handed out for writing and once its unit left it, so
 * that a model reading bytes it did not write, or after saved_end, sees NaNs). Compiled into
 * each of those plugins; not installed. Not thread-safe: the policy holds its lock. */
#ifndef GHC_SAVED_H
#define GHC_SAVED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <gh200core/mempolicy.h>   /* defines: ghc_core_t, GHC_E* */

/* The memory and stream operations the ring needs. Events are opaque; with no event_make the
 * copies are synchronous and record/wait are not called. */
struct saved_io {
    void *ctx;
    /* a ring buffer of n bytes where kernels read. Returns 0 or GHC_E* (message set) */
    int  (*buf_alloc)(void *ctx, size_t n, void **buf);
    void (*buf_free)(void *ctx, void *buf);
    int  (*event_make)(void *ctx, void **ev);          /* optional; 0 or GHC_E* (message set) */
    void (*event_free)(void *ctx, void *ev);
    void (*record)(void *ctx, void *ev, void *stream);  /* ev after the work queued on stream */
    void (*wait)(void *ctx, void *stream, void *ev);    /* work queued on stream from now waits for ev */
    /* On the copy stream: wait for `after` (NULL: nothing), copy n bytes from src to dst (to_ring:
     * home -> buffer), then record `done` (NULL: none). Returns 0 or GHC_E* (message set). */
    int  (*copy)(void *ctx, void *dst, const void *src, size_t n, bool to_ring, void *after, void *done);
    void (*sync)(void *ctx);                            /* everything queued is done */
    void (*fill)(void *ctx, void *buf, size_t n);       /* optional: NaN bytes (host's poison) */
};

struct saved_home {                /* one unit's home (an allocation of role saved) */
    void   *ptr;
    size_t  bytes;
    int64_t unit;                  /* its number in the last write pass, or -1 */
    bool    written;               /* its home holds (or is being sent) a write pass's bytes */
};

struct saved_buf {
    void    *buf;
    int      home;                 /* index of the home whose bytes it holds (or is receiving), or -1 */
    bool     held, write, fetched; /* fetched: the bytes came in by a copy (not a write) */
    void    *used;                 /* event: the caller's work on it (compute stream) */
    void    *copied;               /* event: the last copy into or out of it (copy stream) */
    uint64_t clock;                /* last begin, for least-recently-used */
};

struct saved_ring {
    ghc_core_t        *core;
    const char        *who;        /* the policy's name, for messages */
    struct saved_io    io;
    int                n_bufs, ahead;
    bool               poison;
    size_t             buf_bytes;  /* 0: no buffers yet */
    struct saved_buf  *bufs;
    struct saved_home *homes;
    int                n_homes, cap_homes;
    int               *by_unit;    /* unit -> home of the last write pass, or -1 */
    int64_t            n_units;
    uint64_t           clock, out_bytes, in_bytes, hits;
};

/* A ring of n_bufs (>= 2) buffers, made at the first begin at the size of the largest home;
 * `ahead`: units a read begin starts copying in beyond its own (at most n_bufs - 1). `io` is
 * copied; its ctx stays the caller's. */
void saved_ring_init(struct saved_ring *r, ghc_core_t *core, const char *who, const struct saved_io *io, int n_bufs,
                     int ahead, bool poison);
/* A new home (alloc of role saved). Returns 0 or GHC_ENOMEM (message set). */
int  saved_ring_add(struct saved_ring *r, void *ptr, size_t bytes);
/* A home goes (release): true if ptr was one. When the last goes the buffers go too (after
 * io.sync), so the next begin sizes them afresh. */
bool saved_ring_drop(struct saved_ring *r, void *ptr);
/* saved_begin / saved_end of mempolicy.h; memory that is not a home gives *at = ptr. */
int  saved_ring_begin(struct saved_ring *r, void *ptr, size_t bytes, int64_t unit, bool write, void *stream, void **at);
int  saved_ring_end(struct saved_ring *r, void *ptr, void *stream);
/* Bytes of the ring's buffers (device memory). */
uint64_t saved_ring_bytes(const struct saved_ring *r);
/* Frees the buffers (after io.sync) and the bookkeeping; the homes are the policy's. */
void saved_ring_free(struct saved_ring *r);

/* ---- saved_cuda.c (CUDA builds): the io of offload and gh200_uvm ---- */

/* CUDA events and a non-blocking copy stream on `device`; buffers from buf_alloc/buf_free with
 * buf_ctx (the policy's pool). Returns 0 or GHC_ECUDA/GHC_ENOMEM (message set). */
int  saved_cuda_io(ghc_core_t *core, int device, int (*buf_alloc)(void *, size_t, void **),
                   void (*buf_free)(void *, void *), void *buf_ctx, struct saved_io *io);
void saved_cuda_io_free(struct saved_io *io);   /* io.ctx NULL: no-op */

#endif /* GHC_SAVED_H */
