/* disk.c: the `disk` cache: a sample's tensors decoded on demand from the backend's bytes,
 * with an LRU of decoded tensors under a byte budget (max_mb; 0 keeps everything). */
#include <stdlib.h>

#include "tcache.h"

static const struct ghc_cfg_key disk_keys[] = {
    { "max_mb", GHC_CFG_FLOAT, "1024.0", "0 to 1e9", NULL },   /* 0: keep all */
    { NULL, 0, NULL, NULL, NULL }
};

static int disk_init(ghc_core_t *core, ghc_cfg_t *cfg, void **self)
{
    double max_mb;
    int rc = ghc_cfg_get_float(cfg, "max_mb", 1024.0, 0.0, 1e9, &max_mb);
    if (rc < 0)
        return rc;
    struct tcache *tc = tcache_init(core, "disk", (uint64_t)(max_mb * 1048576.0), NULL, false);
    if (!tc)
        return ghc_error_code(core);
    *self = tc;
    return 0;
}

static int disk_bind(void *self, ghc_backend_t *b, const struct ghc_sample_ref *s, int64_t n)
{ return tcache_bind(self, b, s, n); }
static int64_t disk_count(void *self) { return tcache_count(self); }
static int disk_get(void *self, int64_t i, enum ghc_sample_kind k, ghc_tensor_t **out)
{ return tcache_get(self, i, k, out); }
static void disk_release(void *self, int64_t i, enum ghc_sample_kind k, ghc_tensor_t *t)
{ tcache_release(self, i, k, t); }
/* warm the LRU; the tensors stay in host memory */
static int disk_prefetch(void *self, int64_t i, int device, void *stream)
{ (void)device; (void)stream; return tcache_prefetch(self, i, -1, NULL); }
static int disk_stats(void *self, struct ghc_cache_stats *out) { return tcache_stats(self, out); }
static void disk_free(void *self) { tcache_free(self); }

static const struct ghc_cache_ops disk_ops = {
    .struct_size = sizeof(struct ghc_cache_ops),
    .name = "disk",
    .keys = disk_keys,
    .init = disk_init,
    .bind = disk_bind,
    .count = disk_count,
    .get = disk_get,
    .release = disk_release,
    .prefetch = disk_prefetch,
    .stats = disk_stats,
    .free = disk_free,
};

static int disk_plugin_init(ghc_core_t *core) { return ghc_register_cache(core, &disk_ops); }

GHC_PLUGIN_EXPORT const struct ghc_plugin ghc_plugin_disk = {
    .abi = GHC_PLUGIN_ABI,
    .api = GHC_API_VERSION,
    .struct_size = sizeof(struct ghc_plugin),
    .kinds = GHC_KIND_BIT(GHC_KIND_CACHE),
    .name = "disk",
    .version = GHC_VERSION,
    .description = "sample tensors decoded on demand through the backend, LRU of decoded tensors",
    .init = disk_plugin_init,
};
