/* host.c: the `host` memory policy: plain CPU memory for every role (CPU runs, tests, and
 * the reference against which the GPU policies must give the same losses). Counts live bytes
 * per role and the peak; an optional limit turns runaway allocation into a clear error. With
 * saved_ring > 0 saved activations go through the ring of the GPU policies (saved.h) with
 * memcpy for the copies, every buffer poisoned with NaN bytes when handed out for writing and
 * when its unit leaves it: the CPU test of that logic and of a model's use of saved_begin /
 * saved_end (a model that reads what it did not write, or after the end, computes NaNs). */
#include <malloc.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <gh200core/mempolicy.h>

#include "../offload/saved.h"

#define HOST_ALIGN 256   /* the header before each block keeps the block 256-byte aligned */

struct host_hdr {
    size_t            bytes;
    enum ghc_mem_role role;
};

struct host {
    ghc_core_t      *core;
    uint64_t         limit;     /* bytes, 0 = none */
    pthread_mutex_t  lock;
    uint64_t         live;
    uint64_t         peak;
    uint64_t         role[GHC_ROLE_MAX], role_peak[GHC_ROLE_MAX];
    bool             ring;      /* saved activations through a ring (saved_ring > 0) */
    struct saved_ring saved;
};

static const struct ghc_cfg_key host_keys[] = {
    { "limit_mib", GHC_CFG_INT, "0", "0 to 2^40", NULL },   /* 0: no limit */
    { "saved_ring", GHC_CFG_INT, "0", "0, 2 to 64", NULL },  /* 0: saved activations in place */
    { "saved_ahead", GHC_CFG_INT, "1", "0 to 63", NULL },
    { "saved_poison", GHC_CFG_BOOL, "true", NULL, NULL },
    { NULL, 0, NULL, NULL, NULL }
};

/* ---- the saved ring's io: host memory and memcpy ---------------------------------------------- */

static int hio_alloc(void *ctx, size_t n, void **buf)
{
    struct host *h = ctx;
    if (!(*buf = aligned_alloc(HOST_ALIGN, (n + HOST_ALIGN - 1) / HOST_ALIGN * HOST_ALIGN)))
        return ghc_error_set(h->core, GHC_ENOMEM, "host: out of memory for a saved-activation buffer of %zu bytes", n);
    return 0;
}

static void hio_free(void *ctx, void *buf)
{
    (void)ctx;
    free(buf);
}

static int hio_copy(void *ctx, void *dst, const void *src, size_t n, bool to_ring, void *after, void *done)
{
    (void)ctx, (void)to_ring, (void)after, (void)done;
    memcpy(dst, src, n);
    return 0;
}

static void hio_sync(void *ctx) { (void)ctx; }

static void hio_fill(void *ctx, void *buf, size_t n)
{
    (void)ctx;
    memset(buf, 0xff, n);   /* f32 and bf16 NaN */
}

static int host_init(ghc_core_t *core, ghc_cfg_t *cfg, void **self)
{
    int64_t limit_mib, ring, ahead;
    bool poison;
    int rc;
    if ((rc = ghc_cfg_get_int(cfg, "limit_mib", 0, 0, INT64_C(1) << 40, &limit_mib)) < 0 ||
        (rc = ghc_cfg_get_int(cfg, "saved_ring", 0, 0, 64, &ring)) < 0 ||
        (rc = ghc_cfg_get_int(cfg, "saved_ahead", 1, 0, 63, &ahead)) < 0 ||
        (rc = ghc_cfg_get_bool(cfg, "saved_poison", true, &poison)) < 0)
        return rc;
    if (ring == 1)
        return ghc_error_set(core, GHC_ECONFIG, "%s: host: saved_ring is 0 (saved activations in place) or 2 to 64 "
                             "buffers, got 1", ghc_cfg_where(cfg, "saved_ring"));
    struct host *h = calloc(1, sizeof(*h));
    if (!h)
        return ghc_error_set(core, GHC_ENOMEM, "host: out of memory");
    h->core = core;
    h->limit = (uint64_t)limit_mib << 20;
    if ((h->ring = ring > 0)) {
        struct saved_io io = { .ctx = h, .buf_alloc = hio_alloc, .buf_free = hio_free, .copy = hio_copy,
                               .sync = hio_sync, .fill = hio_fill };
        saved_ring_init(&h->saved, core, "host", &io, (int)ring, (int)ahead, poison);
    }
    /* A training step frees and takes back the same activation sizes every micro-batch: keep
     * blocks up to 256 MiB in the heap instead of mmap/munmap (and page faults) each time. */
    mallopt(M_MMAP_THRESHOLD, 256 << 20);
    mallopt(M_TRIM_THRESHOLD, 512 << 20);
    pthread_mutex_init(&h->lock, NULL);
    *self = h;
    return 0;
}

static void host_release(void *self, void *ptr);

static int host_alloc(void *self, size_t bytes, enum ghc_mem_role role, int device, void **ptr)
{
    struct host *h = self;
    if (device != GHC_DEVICE_CPU)
        return ghc_error_set(h->core, GHC_EUNSUPPORTED,
                             "host: %s memory asked for on CUDA device %d; the host policy gives CPU memory only",
                             ghc_mem_role_name(role), device);
    if (bytes > SIZE_MAX - 2 * HOST_ALIGN)
        return ghc_error_set(h->core, GHC_ENOMEM, "host: %zu bytes is too large", bytes);
    size_t total = (bytes + 2 * HOST_ALIGN - 1) / HOST_ALIGN * HOST_ALIGN;
    /* Check the limit and count the bytes in one step, so concurrent callers cannot pass it. */
    pthread_mutex_lock(&h->lock);
    uint64_t live = h->live;
    bool over = h->limit && live + bytes > h->limit;
    if (!over) {
        h->live += bytes;
        if ((h->role[role] += bytes) > h->role_peak[role])
            h->role_peak[role] = h->role[role];
        if (h->live > h->peak)
            h->peak = h->live;
    }
    uint64_t by_role[GHC_ROLE_MAX];
    memcpy(by_role, h->role, sizeof(by_role));
    pthread_mutex_unlock(&h->lock);
    char use[512];
    if (over)
        return ghc_error_set(h->core, GHC_ENOMEM,
                             "host: %zu bytes of %s would exceed limit_mib (%llu of %llu MiB in use: %s)",
                             bytes, ghc_mem_role_name(role), (unsigned long long)(live >> 20),
                             (unsigned long long)(h->limit >> 20), ghc_mem_usage_text(by_role, GHC_ROLE_MAX, use, sizeof(use)));
    char *base = aligned_alloc(HOST_ALIGN, total);
    if (!base) {
        pthread_mutex_lock(&h->lock);
        h->live -= bytes;
        h->role[role] -= bytes;
        memcpy(by_role, h->role, sizeof(by_role));
        pthread_mutex_unlock(&h->lock);
        return ghc_error_set(h->core, GHC_ENOMEM, "host: out of memory: %zu bytes of %s; in use by role: %s",
                             bytes, ghc_mem_role_name(role), ghc_mem_usage_text(by_role, GHC_ROLE_MAX, use, sizeof(use)));
    }
    struct host_hdr *hdr = (struct host_hdr *)base;
    hdr->bytes = bytes;
    hdr->role = role;
    if (h->ring && role == GHC_ROLE_SAVED) {
        pthread_mutex_lock(&h->lock);
        int rc = saved_ring_add(&h->saved, base + HOST_ALIGN, bytes);
        pthread_mutex_unlock(&h->lock);
        if (rc < 0) {
            host_release(h, base + HOST_ALIGN);
            return rc;
        }
    }
    *ptr = base + HOST_ALIGN;
    return 0;
}

static void host_release(void *self, void *ptr)
{
    struct host *h = self;
    if (!ptr)
        return;
    struct host_hdr *hdr = (struct host_hdr *)((char *)ptr - HOST_ALIGN);
    pthread_mutex_lock(&h->lock);
    h->live -= hdr->bytes;
    h->role[hdr->role] -= hdr->bytes;
    if (h->ring)
        saved_ring_drop(&h->saved, ptr);
    pthread_mutex_unlock(&h->lock);
    free(hdr);
}

static int host_advise(void *self, void *ptr, size_t bytes, enum ghc_mem_role role)
{
    struct host *h = self;
    (void)bytes;
    struct host_hdr *hdr = (struct host_hdr *)((char *)ptr - HOST_ALIGN);
    pthread_mutex_lock(&h->lock);
    h->role[hdr->role] -= hdr->bytes;
    if ((h->role[role] += hdr->bytes) > h->role_peak[role])
        h->role_peak[role] = h->role[role];
    hdr->role = role;
    pthread_mutex_unlock(&h->lock);
    return 0;
}

/* ---- saved activations ------------------------------------------------------------------------ */

static int host_saved_begin(void *self, void *ptr, size_t bytes, int64_t unit, bool write, void *stream, void **at)
{
    struct host *h = self;
    *at = ptr;
    if (!h->ring)
        return 0;
    pthread_mutex_lock(&h->lock);
    int rc = saved_ring_begin(&h->saved, ptr, bytes, unit, write, stream, at);
    pthread_mutex_unlock(&h->lock);
    return rc;
}

static int host_saved_end(void *self, void *ptr, void *stream)
{
    struct host *h = self;
    if (!h->ring)
        return 0;
    pthread_mutex_lock(&h->lock);
    int rc = saved_ring_end(&h->saved, ptr, stream);
    pthread_mutex_unlock(&h->lock);
    return rc;
}

static int host_stats(void *self, struct ghc_mem_stats *out)
{
    struct host *h = self;
    if (out->struct_size < offsetof(struct ghc_mem_stats, saved_out_bytes))
        return ghc_error_set(h->core, GHC_EINVAL, "host: stats struct_size %u too small", out->struct_size);
    pthread_mutex_lock(&h->lock);
    memcpy(out->bytes_role, h->role, sizeof(h->role));
    out->bytes_host = h->live;
    out->bytes_peak = h->peak;
    if (out->struct_size >= offsetof(struct ghc_mem_stats, bytes_role_peak) + sizeof(out->bytes_role_peak))
        memcpy(out->bytes_role_peak, h->role_peak, sizeof(h->role_peak));
    if (out->struct_size >= offsetof(struct ghc_mem_stats, saved_ring_bytes) + sizeof(uint64_t) && h->ring) {
        out->saved_out_bytes = h->saved.out_bytes;
        out->saved_in_bytes = h->saved.in_bytes;
        out->saved_hits = h->saved.hits;
        out->saved_ring_bytes = saved_ring_bytes(&h->saved);
    }
    pthread_mutex_unlock(&h->lock);
    return 0;
}

static void host_free(void *self)
{
    struct host *h = self;
    if (!h)
        return;
    if (h->live)
        ghc_log(h->core, GHC_LOG_WARN, "host: %llu bytes still allocated at exit",
                (unsigned long long)h->live);
    if (h->ring)
        saved_ring_free(&h->saved);
    pthread_mutex_destroy(&h->lock);
    free(h);
}

static const struct ghc_mempolicy_ops host_ops = {
    .struct_size = sizeof(struct ghc_mempolicy_ops),
    .name = "host",
    .keys = host_keys,
    .init = host_init,
    .alloc = host_alloc,
    .release = host_release,
    .advise = host_advise,
    .stats = host_stats,
    .free = host_free,
    .saved_begin = host_saved_begin,
    .saved_end = host_saved_end,
};

static int host_plugin_init(ghc_core_t *core) { return ghc_register_mempolicy(core, &host_ops); }

GHC_PLUGIN_EXPORT const struct ghc_plugin ghc_plugin_host = {
    .abi = GHC_PLUGIN_ABI,
    .api = GHC_API_VERSION,
    .struct_size = sizeof(struct ghc_plugin),
    .kinds = GHC_KIND_BIT(GHC_KIND_MEMPOLICY),
    .name = "host",
    .version = GHC_VERSION,
    .description = "CPU memory for every role, with per-role counts and an optional limit",
    .init = host_plugin_init,
};
