/* cache.c: the core wrappers of the run's cache instance (cache.h) and the decoding helper
 * that cache plugins and the dataset share: a backend entry's safetensors bytes to a tensor. */
#include <config.h>

#include <stdlib.h>
#include <string.h>

#include <gh200core/safetensors.h>

#include "core_impl.h"

#define C_INST(c) ((struct ghc_instance *)(c))
#define C_OPS(c)  ((const struct ghc_cache_ops *)C_INST(c)->ops)
#define C_SELF(c) (C_INST(c)->self)

const char *ghc_sample_kind_name(enum ghc_sample_kind kind)
{
    static const char *const names[GHC_SAMPLE_KIND_COUNT] = {
        "latent", "text_embed", "text_mask", "image_cond", "noise", "timestep",
    };
    return (unsigned)kind < GHC_SAMPLE_KIND_COUNT ? names[kind] : "?";
}

enum ghc_mem_role ghc_sample_kind_role(enum ghc_sample_kind kind)
{
    switch (kind) {
    case GHC_SAMPLE_TEXT_EMBED: return GHC_ROLE_TEXT_EMBEDS;
    case GHC_SAMPLE_TEXT_MASK:
    case GHC_SAMPLE_TIMESTEP:   return GHC_ROLE_MASKS;
    default:                    return GHC_ROLE_LATENTS;
    }
}

/* A wrapper's call starts here: the error buffer cleared (a successful call leaves it empty);
 * returns the point from which the member's own message counts (ghc_error_member). */
static uint64_t begin(ghc_cache_t *c)
{
    ghc_error_clear(C_INST(c)->core);
    return ghc_error_seq(C_INST(c)->core);
}

static int failed(ghc_cache_t *c, uint64_t seq, int rc, const char *what)
{
    return ghc_error_member(C_INST(c)->core, seq, rc, "cache", C_OPS(c)->name, what, NULL);
}

const char *ghc_cache_name(const ghc_cache_t *c) { return C_OPS(c)->name; }

int ghc_cache_bind(ghc_cache_t *c, ghc_backend_t *backend, const struct ghc_sample_ref *samples, int64_t n)
{
    uint64_t seq = begin(c);
    return failed(c, seq, C_OPS(c)->bind(C_SELF(c), backend, samples, n), "bind");
}

int64_t ghc_cache_count(ghc_cache_t *c) { return C_OPS(c)->count(C_SELF(c)); }

int ghc_cache_sample(ghc_cache_t *c, int64_t index, enum ghc_sample_kind kind, ghc_tensor_t **out)
{
    *out = NULL;
    int64_t n = C_OPS(c)->count(C_SELF(c));
    if (index < 0 || index >= n || (unsigned)kind >= GHC_SAMPLE_KIND_COUNT)
        return ghc_error_set(C_INST(c)->core, GHC_EINVAL, "cache \"%s\": sample %lld (%s) out of range (%lld samples)",
                             C_OPS(c)->name, (long long)index, ghc_sample_kind_name(kind), (long long)n);
    uint64_t seq = begin(c);
    return failed(c, seq, C_OPS(c)->get(C_SELF(c), index, kind, out), "get");
}

void ghc_cache_release(ghc_cache_t *c, int64_t index, enum ghc_sample_kind kind, ghc_tensor_t *t)
{
    if (t)
        C_OPS(c)->release(C_SELF(c), index, kind, t);
}

int ghc_cache_prefetch(ghc_cache_t *c, int64_t index, int device, void *stream)
{
    if (!C_OPS(c)->prefetch)
        return 0;
    uint64_t seq = begin(c);
    return failed(c, seq, C_OPS(c)->prefetch(C_SELF(c), index, device, stream), "prefetch");
}

int ghc_cache_stats(ghc_cache_t *c, struct ghc_cache_stats *out)
{
    memset(out, 0, sizeof(*out));
    out->struct_size = sizeof(*out);
    if (!C_OPS(c)->stats)
        return 0;
    uint64_t seq = ghc_error_seq(C_INST(c)->core);
    return failed(c, seq, C_OPS(c)->stats(C_SELF(c), out), "stats");
}

int ghc_cache_decode(ghc_core_t *core, ghc_backend_t *backend, const char *file, const char *key,
                     enum ghc_mem_role role, ghc_tensor_t **out)
{
    const void *data;
    void *owned;
    size_t len;
    uint64_t size;
    *out = NULL;
    int rc = ghc_backend_fetch(backend, file, 0, &data, &owned, &len, &size);
    if (rc < 0)
        return rc;
    rc = ghc_cache_decode_bytes(core, file, data, len, size, key, role, out);
    free(owned);
    return rc;
}

int ghc_cache_decode_bytes(ghc_core_t *core, const char *file, const void *data, size_t len, uint64_t size,
                           const char *key, enum ghc_mem_role role, ghc_tensor_t **out)
{
    int rc = 0;
    *out = NULL;
    ghc_st_t *st = ghc_st_open_memory(core, file, data, len, size);
    if (!st)
        return ghc_error_code(core) ? ghc_error_code(core) : GHC_EFORMAT;
    struct ghc_st_info info;
    if (!ghc_st_find(st, key, &info))
        rc = ghc_error_set(core, GHC_ENOTFOUND, "%s: no tensor \"%s\"", file, key);
    else if (!(*out = ghc_st_load(st, key, info.dtype, role)))
        rc = ghc_error_code(core) ? ghc_error_code(core) : GHC_ENOMEM;
    ghc_st_free(st);
    return rc;
}
