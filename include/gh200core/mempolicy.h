/* mempolicy.h: the memory-policy plugin interface. Every tensor's memory is taken through the
 * run's one mempolicy instance, tagged with a role; the policy decides where bytes live
 * (host, device, managed, pinned) and moves them (advise, prefetch, phase hooks). A policy
 * changes where bytes live, never what is computed. */
#ifndef GHC_MEMPOLICY_H
#define GHC_MEMPOLICY_H

#include <gh200core/plugin.h>   /* defines: ghc_core_t, ghc_cfg_t, struct ghc_cfg_key */

GHC_BEGIN_DECLS

/* The device of an allocation: GHC_DEVICE_CPU or a CUDA ordinal (0, 1, ...). */
#define GHC_DEVICE_CPU (-1)

/* What a block of memory holds; policies place by role (DESIGN.md, "memory roles"). */
enum ghc_mem_role {
    GHC_ROLE_WEIGHTS = 0,        /* base weights of the active expert */
    GHC_ROLE_WEIGHTS_INACTIVE,   /* base weights of the expert not in use */
    GHC_ROLE_ADAPTER,            /* trainable adapter params */
    GHC_ROLE_GRADS,              /* their gradients */
    GHC_ROLE_OPTIMIZER_STATE,    /* optimizer moments, lr masks */
    GHC_ROLE_ACTIVATIONS,        /* forward/backward activations */
    GHC_ROLE_LATENTS,            /* cached video latents */
    GHC_ROLE_TEXT_EMBEDS,        /* cached text embeddings */
    GHC_ROLE_MASKS,              /* attention / text masks */
    GHC_ROLE_WORKSPACE,          /* scratch for kernels (GEMM, attention) */
    GHC_ROLE_COUNT
};

/* Points of the training step at which a policy may move memory. */
enum ghc_mem_phase {
    GHC_PHASE_STEP_BEGIN = 0,    /* index: optimizer step */
    GHC_PHASE_STEP_END,
    GHC_PHASE_BLOCK_BEGIN,       /* index: transformer block, forward and backward */
    GHC_PHASE_BLOCK_END,
    GHC_PHASE_EXPERT_SWITCH,     /* index: the expert becoming active */
};

/* Statistics. The caller sets struct_size = sizeof(struct ghc_mem_stats) and zeroes the rest;
 * a policy fills the members it knows (members are only ever appended). */
struct ghc_mem_stats {
    uint32_t struct_size;
    int32_t  stage;                       /* policy-specific state (gh200_uvm: 0, 1, 2) */
    uint64_t bytes_role[GHC_ROLE_COUNT];  /* live bytes per role */
    uint64_t bytes_host;                  /* live bytes by location */
    uint64_t bytes_device;
    uint64_t bytes_managed;
    uint64_t bytes_peak;                  /* peak of all live bytes */
    uint64_t prefetched_bytes;
    uint64_t page_faults;                 /* CUPTI, where available */
    uint64_t transitions;                 /* stage changes */
    uint64_t reclamations;
};

struct ghc_mempolicy_ops {
    uint32_t struct_size;                 /* required: sizeof(struct ghc_mempolicy_ops) */
    const char *name;                     /* required: the name `plugin = "..."` selects */
    const struct ghc_cfg_key *keys;       /* optional: keys of the [mempolicy] section */
    /* required; once per run, first of all instances. On success *self belongs to the core,
     * which releases it with free(). */
    int (*init)(ghc_core_t *core, ghc_cfg_t *cfg, void **self);
    /* required; any time. 256-byte aligned memory of `bytes` for `role` near `device`
     * (GHC_DEVICE_CPU or a CUDA ordinal). Returns 0 or GHC_ENOMEM/GHC_EUNSUPPORTED. */
    int (*alloc)(void *self, size_t bytes, enum ghc_mem_role role, int device, void **ptr);
    /* required; releases what alloc() returned. NULL is a no-op. */
    void (*release)(void *self, void *ptr);
    /* optional; after alloc, when a block's role changes (expert switch). */
    int (*advise)(void *self, void *ptr, size_t bytes, enum ghc_mem_role role);
    /* optional; before use on `device`, asynchronously on `stream` (a cudaStream_t or NULL). */
    int (*prefetch)(void *self, void *ptr, size_t bytes, int device, void *stream);
    /* optional; at each ghc_mem_phase of the step. */
    int (*phase)(void *self, enum ghc_mem_phase phase, int64_t index);
    /* optional; any time. */
    int (*stats)(void *self, struct ghc_mem_stats *out);
    /* optional; once, last. */
    void (*free)(void *self);
};

/* ---- the run's instance (core wrappers; a NULL optional member is a successful no-op) ---- */

typedef struct ghc_mempolicy ghc_mempolicy_t;

/* The run's memory policy, or NULL before ghc_run_init() created it. Borrowed. */
GHC_API ghc_mempolicy_t *ghc_mempolicy_get(ghc_core_t *core);
/* Returns 0 or GHC_E* (message set); *ptr is NULL on failure. */
GHC_API int  ghc_mem_alloc(ghc_mempolicy_t *mp, size_t bytes, enum ghc_mem_role role, int device,
                           void **ptr);
GHC_API void ghc_mem_release(ghc_mempolicy_t *mp, void *ptr);
GHC_API int  ghc_mem_advise(ghc_mempolicy_t *mp, void *ptr, size_t bytes, enum ghc_mem_role role);
GHC_API int  ghc_mem_prefetch(ghc_mempolicy_t *mp, void *ptr, size_t bytes, int device, void *stream);
GHC_API int  ghc_mem_phase(ghc_mempolicy_t *mp, enum ghc_mem_phase phase, int64_t index);
GHC_API int  ghc_mem_stats(ghc_mempolicy_t *mp, struct ghc_mem_stats *out);
/* "weights", "weights_inactive", ... Static; "?" when out of range. */
GHC_API const char *ghc_mem_role_name(enum ghc_mem_role role);

GHC_END_DECLS

#endif /* GHC_MEMPOLICY_H */
