/* cache.h: the cache plugin interface: per-sample tensors (latent, text embedding, stored
 * noise and timestep), decoded from the backend's bytes, held through the mempolicy,
 * prefetched to the GPU ahead of use.
 *
 * The dataset (dataset.h) finds the samples and tells the cache where each one's tensors are
 * (bind()); the cache decodes them on demand (disk, with an LRU) or keeps them all
 * (unified_memory). Tensors are handed out pinned: valid until release(). */
#ifndef GHC_CACHE_H
#define GHC_CACHE_H

#include <gh200core/backend.h>   /* defines: ghc_backend_t, ghc_core_t, ghc_cfg_t */
#include <gh200core/tensor.h>    /* defines: ghc_tensor_t, enum ghc_mem_role */

GHC_BEGIN_DECLS

/* The tensors one sample carries. */
enum ghc_sample_kind {
    GHC_SAMPLE_LATENT = 0,       /* VAE latent, [C, F, H, W] */
    GHC_SAMPLE_TEXT_EMBED,       /* text encoder output, [L, text_dim] (or [1, L, text_dim]) */
    GHC_SAMPLE_TEXT_MASK,        /* valid text tokens, [L] (the dataset builds masks itself) */
    GHC_SAMPLE_IMAGE_COND,       /* I2V: mask + conditioning latent */
    GHC_SAMPLE_NOISE,            /* stored noise, like the latent (optional key `noise`) */
    GHC_SAMPLE_TIMESTEP,         /* stored t, one f32 (optional key `timestep`) */
    GHC_SAMPLE_KIND_COUNT
};

/* "latent", "text_embed", ... Static; "?" when out of range. */
GHC_API const char *ghc_sample_kind_name(enum ghc_sample_kind kind);
/* The memory role of a kind: latents (latent, image_cond, noise), text_embeds, masks. */
GHC_API enum ghc_mem_role ghc_sample_kind_role(enum ghc_sample_kind kind);

/* Where one sample's tensors are: the backend entry and the tensor name in it, per kind
 * (NULL, NULL: the sample has none of that kind). */
struct ghc_sample_ref {
    const char *file[GHC_SAMPLE_KIND_COUNT];
    const char *key[GHC_SAMPLE_KIND_COUNT];
};

/* Statistics. The caller sets struct_size = sizeof(struct ghc_cache_stats) and zeroes the
 * rest; the cache fills what it knows (members are only ever appended). */
struct ghc_cache_stats {
    uint32_t struct_size;
    uint64_t hits;                /* get() served from held tensors */
    uint64_t misses;              /* get() that decoded */
    uint64_t evictions;
    uint64_t held_bytes;          /* decoded bytes held now */
    uint64_t decoded_bytes;       /* decoded in all */
    uint64_t prefetched_bytes;
    uint64_t persisted;           /* tensors written to / read from a persistent cache folder */
    uint64_t persist_hits;
};

struct ghc_cache_ops {
    uint32_t struct_size;                 /* required: sizeof(struct ghc_cache_ops) */
    const char *name;                     /* required */
    const struct ghc_cfg_key *keys;       /* optional: keys of the [cache] section */
    /* required; once per run, after the backend. *self belongs to the core. */
    int (*init)(ghc_core_t *core, ghc_cfg_t *cfg, void **self);
    /* required; once, before count/get: the samples, and the backend (mounted) to read them
     * from. `samples` and its strings are borrowed for the call: copy what is kept. */
    int (*bind)(void *self, ghc_backend_t *backend, const struct ghc_sample_ref *samples, int64_t n);
    /* required; number of samples bound. */
    int64_t (*count)(void *self);
    /* required; sample `index`'s tensor of `kind`: a CPU-addressable tensor (host or managed
     * memory) in the dtype and shape stored in the file, with the kind's role. *out is pinned
     * (never evicted) until release(). GHC_ENOTFOUND when the sample lacks that kind; errors
     * name the file. Thread-safe. */
    int (*get)(void *self, int64_t index, enum ghc_sample_kind kind, ghc_tensor_t **out);
    /* required; unpin what get() returned. */
    void (*release)(void *self, int64_t index, enum ghc_sample_kind kind, ghc_tensor_t *t);
    /* optional; start moving sample `index`'s tensors toward `device` on `stream` (a
     * cudaStream_t or NULL), decoding them first when needed. */
    int (*prefetch)(void *self, int64_t index, int device, void *stream);
    /* optional; any time. */
    int (*stats)(void *self, struct ghc_cache_stats *out);
    /* optional; once, last. */
    void (*free)(void *self);
};

/* ---- the run's instance (core wrappers; core/cache.c) -------------------------------------- */

typedef struct ghc_cache ghc_cache_t;

/* The run's cache, or NULL. Borrowed. */
GHC_API ghc_cache_t *ghc_cache_get(ghc_core_t *core);
/* The wrappers call the member of the same name (a NULL optional one is a successful no-op)
 * and give a failure the plugin did not explain a message naming the cache. */
GHC_API int     ghc_cache_bind(ghc_cache_t *c, ghc_backend_t *backend,
                               const struct ghc_sample_ref *samples, int64_t n);
GHC_API int64_t ghc_cache_count(ghc_cache_t *c);
GHC_API int     ghc_cache_sample(ghc_cache_t *c, int64_t index, enum ghc_sample_kind kind,
                                 ghc_tensor_t **out);
GHC_API void    ghc_cache_release(ghc_cache_t *c, int64_t index, enum ghc_sample_kind kind,
                                  ghc_tensor_t *t);
GHC_API int     ghc_cache_prefetch(ghc_cache_t *c, int64_t index, int device, void *stream);
/* Zeroes what the cache does not fill; sets struct_size. */
GHC_API int     ghc_cache_stats(ghc_cache_t *c, struct ghc_cache_stats *out);
GHC_API const char *ghc_cache_name(const ghc_cache_t *c);

/* ---- helpers for cache plugins --------------------------------------------------------------- */

/* Decode tensor `key` of backend entry `file` (a safetensors file) into a new CPU tensor of
 * the stored dtype and shape, memory of `role` from the run's mempolicy. Errors are one line
 * naming the entry (GHC_EFORMAT for a malformed file, GHC_ENOTFOUND for a missing key). The
 * caller frees *out with ghc_tensor_free(). Returns 0 or GHC_E*. */
GHC_API int ghc_cache_decode(ghc_core_t *core, ghc_backend_t *backend, const char *file,
                             const char *key, enum ghc_mem_role role, ghc_tensor_t **out);
/* (since API 15) The same from the entry's bytes already in memory (`len` of its `size`, as
 * ghc_backend_fetch gives them), for a plugin that also reads them for something else. */
GHC_API int ghc_cache_decode_bytes(ghc_core_t *core, const char *file, const void *data, size_t len,
                                   uint64_t size, const char *key, enum ghc_mem_role role, ghc_tensor_t **out);

GHC_END_DECLS

#endif /* GHC_CACHE_H */
