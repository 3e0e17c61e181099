/* unified_memory.c: the `unified_memory` cache: every decoded tensor held, allocated through
 * the run's mempolicy with the latent / text-embedding roles and advised once with that role
 * (gh200_uvm: latents prefer CPU memory, text embeddings the GPU); the dataset's prefetch of
 * the next batch moves its tensors toward the GPU on the given stream (ghc_mem_prefetch)
 * while the current step runs. persistent_cache writes the decoded tensors to a folder and
 * reads them from there in later runs. No CUDA here: placement is the mempolicy's. */
#include <stdlib.h>

#include "../disk/tcache.h"

static const struct ghc_cfg_key um_keys[] = {
    { "persistent_cache", GHC_CFG_STRING, NULL,  NULL,       NULL },
    { "max_mb",           GHC_CFG_FLOAT,  "0.0", "0 to 1e9", NULL },   /* 0: keep all */
    { NULL, 0, NULL, NULL, NULL }
};

static int um_init(ghc_core_t *core, ghc_cfg_t *cfg, void **self)
{
    const char *persist = NULL;
    double max_mb;
    int rc;
    if ((rc = ghc_cfg_get_string(cfg, "persistent_cache", NULL, &persist)) < 0 ||
        (rc = ghc_cfg_get_float(cfg, "max_mb", 0.0, 0.0, 1e9, &max_mb)) < 0)
        return rc;
    struct tcache *tc = tcache_init(core, "unified_memory", (uint64_t)(max_mb * 1048576.0),
                                    persist && *persist ? persist : NULL, true);
    if (!tc)
        return ghc_error_code(core);
    *self = tc;
    return 0;
}

static int um_bind(void *self, ghc_backend_t *b, const struct ghc_sample_ref *s, int64_t n)
{ return tcache_bind(self, b, s, n); }
static int64_t um_count(void *self) { return tcache_count(self); }
static int um_get(void *self, int64_t i, enum ghc_sample_kind k, ghc_tensor_t **out)
{ return tcache_get(self, i, k, out); }
static void um_release(void *self, int64_t i, enum ghc_sample_kind k, ghc_tensor_t *t)
{ tcache_release(self, i, k, t); }
static int um_prefetch(void *self, int64_t i, int device, void *stream)
{ return tcache_prefetch(self, i, device, stream); }
static int um_stats(void *self, struct ghc_cache_stats *out) { return tcache_stats(self, out); }
static void um_free(void *self) { tcache_free(self); }

static const struct ghc_cache_ops um_ops = {
    .struct_size = sizeof(struct ghc_cache_ops),
    .name = "unified_memory",
    .keys = um_keys,
    .init = um_init,
    .bind = um_bind,
    .count = um_count,
    .get = um_get,
    .release = um_release,
    .prefetch = um_prefetch,
    .stats = um_stats,
    .free = um_free,
};

static int um_plugin_init(ghc_core_t *core) { return ghc_register_cache(core, &um_ops); }

GHC_PLUGIN_EXPORT const struct ghc_plugin ghc_plugin_unified_memory = {
    .abi = GHC_PLUGIN_ABI,
    .api = GHC_API_VERSION,
    .struct_size = sizeof(struct ghc_plugin),
    .kinds = GHC_KIND_BIT(GHC_KIND_CACHE),
    .name = "unified_memory",
    .version = GHC_VERSION,
    .description = "all decoded sample tensors held through the mempolicy (roles, advice), next batch prefetched to the GPU",
    .init = um_plugin_init,
};
