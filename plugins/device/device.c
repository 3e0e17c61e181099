/* device.c: the `device` memory policy: every role in device memory, CPU requests in pinned
 * host memory. The plain-GPU baseline the other policies are measured against: nothing is
 * managed, nothing moves by itself. Device memory comes from the device's stream-ordered pool
 * with the release threshold at UINT64_MAX (a caching pool: 6 us instead of 236 us per
 * alloc/free, doc/memory.md), given back by trim(). Counts live bytes per role and the
 * peak; an optional limit turns runaway allocation into a clear error before the card's, and
 * an out-of-memory error names the role, the bytes asked for and what is in use by role.
 * Pinned host blocks are cached too (cudaMallocHost / cudaFreeHost cost milliseconds per MB
 * and cudaFreeHost synchronises): a released block is kept with an event recorded on the
 * legacy default stream, and a later request of the same size waits for that event (the work
 * that may still read the block, e.g. a queued host-to-device copy) and takes it again. */
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include <gh200core/mempolicy.h>

#include "devpool.h"

struct dev_block {               /* one live allocation, in a list for release and stats */
    void              *ptr;
    size_t             bytes;
    enum ghc_mem_role  role;
    int                device;
    struct dev_block  *next;
};

struct pinned_spare {            /* a released pinned block, reusable once `done` completes */
    void                *ptr;
    size_t               n;
    cudaEvent_t          done;
    struct pinned_spare *next;
};

#define PINNED_SPARES_MAX 64

struct dev {
    ghc_core_t        *core;
    struct pinned_spare *spares;  /* newest first */
    int                n_spares;
    struct devpool     pools;
    uint64_t           limit;     /* bytes, 0 = none */
    pthread_mutex_t    lock;
    struct dev_block  *blocks;
    uint64_t           live, live_host, live_dev, peak;
    uint64_t           role[GHC_ROLE_MAX], role_peak[GHC_ROLE_MAX];
};

static const struct ghc_cfg_key dev_keys[] = {
    { "limit_mib", GHC_CFG_INT, "0", "0 to 2^40", NULL },   /* 0: no limit */
    { NULL, 0, NULL, NULL, NULL }
};

static int dev_init(ghc_core_t *core, ghc_cfg_t *cfg, void **self)
{
    int64_t limit_mib;
    int rc = ghc_cfg_get_int(cfg, "limit_mib", 0, 0, INT64_C(1) << 40, &limit_mib);
    if (rc < 0)
        return rc;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n < 1) {
        cudaGetLastError();
        return ghc_error_set(core, GHC_EUNSUPPORTED, "%s: device: no CUDA device (%s); use mempolicy \"host\" on a CPU",
                             ghc_cfg_where(cfg, NULL), e != cudaSuccess ? cudaGetErrorString(e) : "count 0");
    }
    struct dev *d = calloc(1, sizeof(*d));
    if (!d)
        return ghc_error_set(core, GHC_ENOMEM, "device: out of memory");
    d->core = core;
    d->limit = (uint64_t)limit_mib << 20;
    pthread_mutex_init(&d->lock, NULL);
    *self = d;
    return 0;
}

/* A spare pinned block of exactly n bytes, once the work recorded at its release is done. */
static bool pinned_take(struct dev *d, size_t n, void **ptr)
{
    pthread_mutex_lock(&d->lock);
    struct pinned_spare *sp = NULL;
    for (struct pinned_spare **p = &d->spares; *p; p = &(*p)->next)
        if ((*p)->n == n) {
            sp = *p;
            *p = sp->next;
            d->n_spares--;
            break;
        }
    pthread_mutex_unlock(&d->lock);
    if (!sp)
        return false;
    cudaEventSynchronize(sp->done);
    cudaEventDestroy(sp->done);
    cudaGetLastError();
    *ptr = sp->ptr;
    free(sp);
    return true;
}

/* Keeps a released pinned block as a spare (the oldest spare goes when there are too many). */
static void pinned_give(struct dev *d, void *ptr, size_t n)
{
    struct pinned_spare *sp = calloc(1, sizeof(*sp)), *old = NULL;
    bool made = sp && cudaEventCreateWithFlags(&sp->done, cudaEventDisableTiming) == cudaSuccess;
    if (!made || cudaEventRecord(sp->done, 0) != cudaSuccess) {
        cudaGetLastError();
        if (made)
            cudaEventDestroy(sp->done);
        free(sp);
        cudaFreeHost(ptr);
        return;
    }
    sp->ptr = ptr;
    sp->n = n;
    pthread_mutex_lock(&d->lock);
    sp->next = d->spares;
    d->spares = sp;
    if (++d->n_spares > PINNED_SPARES_MAX) {
        struct pinned_spare **p = &d->spares;
        while ((*p)->next)
            p = &(*p)->next;
        old = *p;
        *p = NULL;
        d->n_spares--;
    }
    pthread_mutex_unlock(&d->lock);
    if (old) {
        cudaEventSynchronize(old->done);
        cudaEventDestroy(old->done);
        cudaFreeHost(old->ptr);
        free(old);
    }
}

static void pinned_drop_all(struct dev *d)
{
    pthread_mutex_lock(&d->lock);
    struct pinned_spare *sp = d->spares;
    d->spares = NULL;
    d->n_spares = 0;
    pthread_mutex_unlock(&d->lock);
    while (sp) {
        struct pinned_spare *nx = sp->next;
        cudaEventSynchronize(sp->done);
        cudaEventDestroy(sp->done);
        cudaFreeHost(sp->ptr);
        free(sp);
        sp = nx;
    }
    cudaGetLastError();
}

static int dev_alloc(void *self, size_t bytes, enum ghc_mem_role role, int device, void **ptr)
{
    struct dev *d = self;
    struct dev_block *b = malloc(sizeof(*b));
    if (!b)
        return ghc_error_set(d->core, GHC_ENOMEM, "device: out of memory");
    /* Check the limit and reserve the bytes in one step; undone below on failure. */
    pthread_mutex_lock(&d->lock);
    uint64_t live = d->live;
    bool over = d->limit && live + bytes > d->limit;
    if (!over)
        d->live += bytes;
    pthread_mutex_unlock(&d->lock);
    if (over) {
        char use[512];
        uint64_t by_role[GHC_ROLE_MAX];
        pthread_mutex_lock(&d->lock);
        memcpy(by_role, d->role, sizeof(by_role));
        pthread_mutex_unlock(&d->lock);
        free(b);
        return ghc_error_set(d->core, GHC_ENOMEM, "device: %zu bytes of %s would exceed limit_mib (%llu of %llu MiB in "
                             "use: %s)", bytes, ghc_mem_role_name(role), (unsigned long long)(live >> 20),
                             (unsigned long long)(d->limit >> 20), ghc_mem_usage_text(by_role, GHC_ROLE_MAX, use, sizeof(use)));
    }
    size_t n = bytes ? bytes : 1;
    cudaError_t e;
    if (device == GHC_DEVICE_CPU) {
        e = pinned_take(d, n, ptr) ? cudaSuccess : cudaMallocHost(ptr, n);
    } else {
        int cur = -1;
        cudaGetDevice(&cur);
        if (cur != device && (e = cudaSetDevice(device)) != cudaSuccess)
            goto fail;
        e = devpool_alloc(&d->pools, device, n, ptr);
    }
    if (e != cudaSuccess)
        goto fail;
    *b = (struct dev_block){ .ptr = *ptr, .bytes = bytes, .role = role, .device = device };
    pthread_mutex_lock(&d->lock);
    b->next = d->blocks;
    d->blocks = b;
    if ((d->role[role] += bytes) > d->role_peak[role])
        d->role_peak[role] = d->role[role];
    if (device == GHC_DEVICE_CPU)
        d->live_host += bytes;
    else
        d->live_dev += bytes;
    if (d->live > d->peak)
        d->peak = d->live;
    pthread_mutex_unlock(&d->lock);
    return 0;
fail:
    cudaGetLastError();
    free(b);
    uint64_t by_role[GHC_ROLE_MAX];
    pthread_mutex_lock(&d->lock);
    d->live -= bytes;
    memcpy(by_role, d->role, sizeof(by_role));
    pthread_mutex_unlock(&d->lock);
    *ptr = NULL;
    char use[512], where[64] = "pinned host memory";
    size_t fr = 0, tot = 0;
    if (device != GHC_DEVICE_CPU) {
        cudaMemGetInfo(&fr, &tot);
        cudaGetLastError();
        snprintf(where, sizeof(where), "cuda:%d (%.2f of %.2f GiB free)", device, fr / 1073741824.0, tot / 1073741824.0);
    }
    return ghc_error_set(d->core, GHC_ENOMEM, "device: out of memory: %zu bytes (%.2f GiB) of %s on %s: %s; in use by "
                         "role: %s", bytes, bytes / 1073741824.0, ghc_mem_role_name(role), where, cudaGetErrorString(e),
                         ghc_mem_usage_text(by_role, GHC_ROLE_MAX, use, sizeof(use)));
}

static struct dev_block *dev_unlink(struct dev *d, void *ptr)
{
    for (struct dev_block **p = &d->blocks; *p; p = &(*p)->next)
        if ((*p)->ptr == ptr) {
            struct dev_block *b = *p;
            *p = b->next;
            return b;
        }
    return NULL;
}

static void dev_release(void *self, void *ptr)
{
    struct dev *d = self;
    pthread_mutex_lock(&d->lock);
    struct dev_block *b = dev_unlink(d, ptr);
    if (b) {
        d->live -= b->bytes;
        d->role[b->role] -= b->bytes;
        if (b->device == GHC_DEVICE_CPU)
            d->live_host -= b->bytes;
        else
            d->live_dev -= b->bytes;
    }
    pthread_mutex_unlock(&d->lock);
    if (!b) {
        ghc_log(d->core, GHC_LOG_ERROR, "device: release of %p, which it did not allocate", ptr);
        return;
    }
    if (b->device == GHC_DEVICE_CPU)
        pinned_give(d, ptr, b->bytes ? b->bytes : 1);
    else
        devpool_release(ptr);
    free(b);
}

static int dev_trim(void *self, bool hard)
{
    pinned_drop_all(self);
    devpool_trim(&((struct dev *)self)->pools, hard);
    return 0;
}

static int dev_stats(void *self, struct ghc_mem_stats *out)
{
    struct dev *d = self;
    if (out->struct_size < offsetof(struct ghc_mem_stats, saved_out_bytes))
        return ghc_error_set(d->core, GHC_EINVAL, "device: stats struct_size %u too small", out->struct_size);
    pthread_mutex_lock(&d->lock);
    memcpy(out->bytes_role, d->role, sizeof(d->role));
    out->bytes_host = d->live_host;
    out->bytes_device = d->live_dev;
    out->bytes_peak = d->peak;
    out->bytes_pinned = d->live_host;
    if (out->struct_size >= offsetof(struct ghc_mem_stats, bytes_role_peak) + sizeof(out->bytes_role_peak))
        memcpy(out->bytes_role_peak, d->role_peak, sizeof(d->role_peak));
    pthread_mutex_unlock(&d->lock);
    return 0;
}

static void dev_free(void *self)
{
    struct dev *d = self;
    if (!d)
        return;
    if (d->live)
        ghc_log(d->core, GHC_LOG_WARN, "device: %llu bytes still allocated at exit", (unsigned long long)d->live);
    pinned_drop_all(d);
    while (d->blocks) {
        struct dev_block *b = d->blocks;
        d->blocks = b->next;
        free(b);   /* the memory itself goes with the CUDA context */
    }
    pthread_mutex_destroy(&d->lock);
    free(d);
}

static const struct ghc_mempolicy_ops dev_ops = {
    .struct_size = sizeof(struct ghc_mempolicy_ops),
    .name = "device",
    .keys = dev_keys,
    .init = dev_init,
    .alloc = dev_alloc,
    .release = dev_release,
    .stats = dev_stats,
    .free = dev_free,
    .trim = dev_trim,
};

static int dev_plugin_init(ghc_core_t *core) { return ghc_register_mempolicy(core, &dev_ops); }

GHC_PLUGIN_EXPORT const struct ghc_plugin ghc_plugin_device = {
    .abi = GHC_PLUGIN_ABI,
    .api = GHC_API_VERSION,
    .struct_size = sizeof(struct ghc_plugin),
    .kinds = GHC_KIND_BIT(GHC_KIND_MEMPOLICY),
    .name = "device",
    .version = GHC_VERSION,
    .description = "device memory (cudaMalloc) for every role; pinned host memory for CPU requests",
    .init = dev_plugin_init,
};
