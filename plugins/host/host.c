/* host.c: the `host` memory policy: plain CPU memory for every role (CPU runs, tests, and
 * the reference against which the GPU policies must give the same losses). Counts live bytes
 * per role and the peak; an optional limit turns runaway allocation into a clear error. */
#include <malloc.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <gh200core/mempolicy.h>

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
    uint64_t         role[GHC_ROLE_MAX];
};

static const struct ghc_cfg_key host_keys[] = {
    { "limit_mib", GHC_CFG_INT, "0", "0 to 2^40", NULL },   /* 0: no limit */
    { NULL, 0, NULL, NULL, NULL }
};

static int host_init(ghc_core_t *core, ghc_cfg_t *cfg, void **self)
{
    int64_t limit_mib;
    int rc = ghc_cfg_get_int(cfg, "limit_mib", 0, 0, INT64_C(1) << 40, &limit_mib);
    if (rc < 0)
        return rc;
    struct host *h = calloc(1, sizeof(*h));
    if (!h)
        return ghc_error_set(core, GHC_ENOMEM, "host: out of memory");
    h->core = core;
    h->limit = (uint64_t)limit_mib << 20;
    /* A training step frees and takes back the same activation sizes every micro-batch: keep
     * blocks up to 256 MiB in the heap instead of mmap/munmap (and page faults) each time. */
    mallopt(M_MMAP_THRESHOLD, 256 << 20);
    mallopt(M_TRIM_THRESHOLD, 512 << 20);
    pthread_mutex_init(&h->lock, NULL);
    *self = h;
    return 0;
}

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
        h->role[role] += bytes;
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
    h->role[role] += hdr->bytes;
    hdr->role = role;
    pthread_mutex_unlock(&h->lock);
    return 0;
}

static int host_stats(void *self, struct ghc_mem_stats *out)
{
    struct host *h = self;
    if (out->struct_size < sizeof(*out))
        return ghc_error_set(h->core, GHC_EINVAL, "host: stats struct_size %u too small", out->struct_size);
    pthread_mutex_lock(&h->lock);
    memcpy(out->bytes_role, h->role, sizeof(h->role));
    out->bytes_host = h->live;
    out->bytes_peak = h->peak;
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
