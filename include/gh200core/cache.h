/* cache.h: the cache plugin interface: per-sample tensors (latent, text embedding, mask,
 * conditioning), decoded from the backend's bytes, placed through the mempolicy, prefetched
 * to the GPU ahead of use. */
#ifndef GHC_CACHE_H
#define GHC_CACHE_H

#include <gh200core/plugin.h>   /* defines: ghc_core_t, ghc_cfg_t, ghc_tensor_t */

GHC_BEGIN_DECLS

/* The tensors one sample carries. */
enum ghc_sample_kind {
    GHC_SAMPLE_LATENT = 0,       /* VAE latent, [C, F, H, W] */
    GHC_SAMPLE_TEXT_EMBED,       /* text encoder output, [L, text_dim] */
    GHC_SAMPLE_TEXT_MASK,        /* valid text tokens, [L] */
    GHC_SAMPLE_IMAGE_COND,       /* I2V: mask + conditioning latent */
    GHC_SAMPLE_KIND_COUNT
};

struct ghc_cache_ops {
    uint32_t struct_size;                 /* required: sizeof(struct ghc_cache_ops) */
    const char *name;                     /* required */
    const struct ghc_cfg_key *keys;       /* optional: keys of the [cache] section */
    /* required; once per run, after the backend (ghc_backend_get(core) is valid). */
    int (*init)(ghc_core_t *core, ghc_cfg_t *cfg, void **self);
    /* required; number of samples the cache holds. */
    int64_t (*count)(void *self);
    /* required; sample `index`'s tensor of `kind`. *out is borrowed until the next get() of
     * that index or free(); GHC_ENOTFOUND when the sample lacks that kind. */
    int (*get)(void *self, int64_t index, enum ghc_sample_kind kind, ghc_tensor_t **out);
    /* optional; store a tensor for a sample (cache building). */
    int (*put)(void *self, int64_t index, enum ghc_sample_kind kind, const ghc_tensor_t *t);
    /* optional; start moving sample `index` to `device` on `stream` (a cudaStream_t). */
    int (*prefetch)(void *self, int64_t index, int device, void *stream);
    /* optional; once, last. */
    void (*free)(void *self);
};

typedef struct ghc_cache ghc_cache_t;

/* The run's cache, or NULL. Borrowed. */
GHC_API ghc_cache_t *ghc_cache_get(ghc_core_t *core);

GHC_END_DECLS

#endif /* GHC_CACHE_H */
