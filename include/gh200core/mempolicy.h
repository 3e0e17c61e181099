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

/* What a block of memory holds. Policies place by role (doc/memory.md): where a role's bytes
 * live is the policy's choice, which role a block has is the caller's. Roles are only ever
 * appended, up to GHC_ROLE_MAX. */
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
    GHC_ROLE_SAVED,              /* saved activations: what the backward needs from the forward
                                  * (checkpointed block inputs, kept attention outputs), written in
                                  * forward order, read in reverse; used between saved_begin and
                                  * saved_end (below). Since API 14 */
    GHC_ROLE_ENCODER_WEIGHTS,    /* an encoder's weights (VAE, text encoder: `gh200core prepare`),
                                  * kept apart from the model's. Since API 18 */
    GHC_ROLE_ENCODER_ACTIVATIONS,/* what an encoder computes with: activations, its caches and
                                  * scratch, its inputs and decoded clips. Since API 18 */
    GHC_ROLE_COUNT               /* the roles this gh200core knows; grows when one is appended */
};

/* Room for roles wherever they index an array that crosses the ABI (struct ghc_mem_stats) or
 * that a policy keeps per role: appending a role below it changes no layout. The core never
 * hands a policy a role at or above GHC_ROLE_COUNT (ghc_mem_alloc and ghc_mem_advise refuse
 * it), and GHC_ROLE_COUNT <= GHC_ROLE_MAX, so a policy built against an older header with
 * counters of GHC_ROLE_MAX entries takes a role it does not know without harm. */
#define GHC_ROLE_MAX 32

/* Points of the training step at which a policy may move memory. */
enum ghc_mem_phase {
    GHC_PHASE_STEP_BEGIN = 0,    /* index: optimizer step */
    GHC_PHASE_STEP_END,
    GHC_PHASE_BLOCK_BEGIN,       /* index: transformer block, forward and backward */
    GHC_PHASE_BLOCK_END,
    GHC_PHASE_EXPERT_SWITCH,     /* index: the expert becoming active */
    /* The direction of the block walk that follows, so that a streaming policy knows which
     * block comes next. index: the number of blocks. */
    GHC_PHASE_FORWARD_BEGIN,     /* BLOCK_BEGIN follows for 0, 1, ..., index - 1 */
    GHC_PHASE_BACKWARD_BEGIN,    /* BLOCK_BEGIN follows for index - 1, ..., 0 */
    GHC_PHASE_PASS_END,          /* the forward or backward walk is over */
};

/* Statistics. The caller sets struct_size = sizeof(struct ghc_mem_stats) and zeroes the rest;
 * a policy fills the members it knows (members are only ever appended). The per-role arrays
 * have GHC_ROLE_MAX entries whatever the number of roles, so that appending a role keeps the
 * layout; n_roles says how many of them this gh200core has names for. */
struct ghc_mem_stats {
    uint32_t struct_size;
    int32_t  stage;                       /* policy-specific state (gh200_uvm: 0, 1, 2) */
    uint32_t n_roles;                     /* set by ghc_mem_stats(): the core's GHC_ROLE_COUNT;
                                           * entries from there on are 0 (since API 12) */
    uint64_t bytes_role[GHC_ROLE_MAX];    /* live bytes per role */
    uint64_t bytes_host;                  /* live bytes by location */
    uint64_t bytes_device;
    uint64_t bytes_managed;
    uint64_t bytes_peak;                  /* peak of all live bytes */
    uint64_t prefetched_bytes;
    uint64_t page_faults;                 /* CUPTI, where available */
    uint64_t transitions;                 /* stage changes */
    uint64_t reclamations;                /* light + hard */
    uint64_t light_reclamations;          /* gh200_uvm: pool trims without synchronisation */
    uint64_t hard_reclamations;           /* gh200_uvm: synchronise, trim to zero, evict cold */
    uint64_t bytes_pinned;                /* live pinned host bytes (offload: streamed weights) */
    uint64_t bytes_gpu_preferred;         /* managed bytes advised to prefer the GPU */
    uint64_t device_budget;               /* bytes the policy may keep on the device */
    uint64_t managed_cap;                 /* most managed bytes the policy will hold */
    uint64_t bytes_role_managed[GHC_ROLE_MAX];     /* the managed part of bytes_role */
    uint64_t cpu_page_faults;             /* CUPTI (telemetry = true), since the last step */
    uint64_t bytes_htod;                  /* CUPTI: migrated host -> device */
    uint64_t bytes_dtoh;                  /* CUPTI: migrated device -> host */
    uint64_t thrashing;                   /* CUPTI: thrashing + throttling events */
    uint64_t streamed_bytes;              /* offload: weight bytes copied to the device */
    int32_t  platform;                    /* enum ghc_mem_platform, where the policy knows it */
    uint64_t stream_ns;                   /* offload: time the copy stream spent on those copies
                                           * (CUDA events around each block's copy; completed
                                           * copies only: synchronise first) */
    /* saved activations moved through a ring of buffers (since API 14; 0 where the policy reads
     * them in place) */
    uint64_t saved_out_bytes;             /* copied from the ring to the units' home (forward) */
    uint64_t saved_in_bytes;              /* copied from the home back into the ring (backward) */
    uint64_t saved_hits;                  /* read begins served by a ring buffer still holding
                                           * the unit (no copy: the turn-around blocks) */
    uint64_t saved_ring_bytes;            /* the ring's buffers (in bytes_device) */
    uint64_t bytes_role_peak[GHC_ROLE_MAX];  /* the most bytes each role held at once (since API 18;
                                              * 0 where the policy does not count them) */
};

/* The kind of machine a managed-memory policy runs on, from the device's attributes, the first
 * that matches in this order (doc/memory.md, "Platform"). */
enum ghc_mem_platform {
    GHC_PLATFORM_NONE = 0,       /* no CUDA device, or no concurrent managed access */
    GHC_PLATFORM_DISCRETE,       /* x86 + H100/H200 over PCIe: never oversubscribe */
    GHC_PLATFORM_COHERENT,       /* GH200 / GB200: NVLink-C2C with ATS */
    GHC_PLATFORM_INTEGRATED,     /* GB10: one LPDDR5X pool for CPU and GPU */
};

/* One line of a diagnostic probe (`gh200core diag`): a section ("env", "gpu", "memory",
 * "alloc", "bandwidth"), a key, a number and/or a text, and a mark. */
enum ghc_probe_mark { GHC_PROBE_INFO = 0, GHC_PROBE_PASS, GHC_PROBE_FAIL, GHC_PROBE_SKIP };
struct ghc_probe_item {
    char                section[16];
    char                key[48];
    char                text[160];
    double              value;       /* NAN when the item has only a text */
    char                unit[12];
    enum ghc_probe_mark mark;
};
struct ghc_probe_opts {
    uint32_t struct_size;
    bool     skip_allocation;        /* no managed allocation test */
    double   oversubscription_scale; /* managed test size as a multiple of HBM (coherent and
                                      * integrated only; elsewhere capped at the safe budget) */
};
/* The probe's answer: items[] owned by the caller, n_items filled up to cap. */
struct ghc_probe {
    struct ghc_probe_item *items;
    int                    n_items;
    int                    cap;
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
    /* optional; give cached free memory back (pool trims) and re-evaluate any state that
     * depends on free memory; `hard` also synchronises. Any time outside a step. */
    int (*trim)(void *self, bool hard);
    /* optional; the address at which `ptr` (from alloc) can be read on the device now, between
     * GHC_PHASE_BLOCK_BEGIN and _END of the block that uses it; ptr itself when the bytes live
     * where kernels read them. A streaming policy (offload) returns its ring buffer's copy. */
    void *(*map)(void *self, void *ptr);
    /* optional; group allocations (a block's weights) so a streaming policy can move them as
     * one: `group` is the block index, ptrs/bytes the allocations. Once, after loading. */
    int (*group)(void *self, int64_t group, void *const *ptrs, const size_t *bytes, int n);
    /* optional; environment, GPU and platform probes and bandwidth tests for `gh200core diag`.
     * No instance: may be called without init. Returns 0 or GHC_E*. */
    int (*probe)(ghc_core_t *core, const struct ghc_probe_opts *opts, struct ghc_probe *out);
    /* ---- saved activations (since API 14; optional, both or neither) ----
     * A model allocates what its backward needs from its forward with role GHC_ROLE_SAVED, one
     * allocation per unit (what one block keeps: `unit` 0, 1, ... in the order the forward
     * writes them; the backward reads them in reverse, which a policy may prefetch on), and
     * touches a unit's bytes only between saved_begin and saved_end, at the address saved_begin
     * gives, from work queued on `stream` (a cudaStream_t, NULL: the legacy stream). A policy
     * that keeps the home away from where kernels read (offload: pinned host memory) hands out a
     * buffer of a small device ring: for `write` its contents are undefined and the caller writes
     * every byte it will read, for a read they are the bytes of the unit's last write pass (the
     * caller may overwrite them as scratch; that is not kept). saved_end: the caller's work on
     * the unit is queued on `stream`; after a write the policy copies the buffer home (a copy
     * stream ordered after that work; the host does not wait), after a read the buffer is free.
     * At most a few units are open at once (a forward block: its input and its output's; the
     * ring must hold those plus what is being copied). Without these members (and for memory
     * the policy did not allocate with GHC_ROLE_SAVED) the address is ptr itself: the bytes
     * stay where alloc put them. Returns 0 or GHC_E* (message set). */
    int (*saved_begin)(void *self, void *ptr, size_t bytes, int64_t unit, bool write, void *stream, void **at);
    int (*saved_end)(void *self, void *ptr, void *stream);
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
/* A NULL optional member is a no-op: trim 0, map returns ptr, group 0. */
GHC_API int   ghc_mem_trim(ghc_mempolicy_t *mp, bool hard);
GHC_API void *ghc_mem_map(ghc_mempolicy_t *mp, void *ptr);
GHC_API int   ghc_mem_group(ghc_mempolicy_t *mp, int64_t group, void *const *ptrs, const size_t *bytes, int n);
/* (since API 14) Saved activations (the members above): *at = where the unit at ptr (role
 * GHC_ROLE_SAVED) is written (`write`) or read now, on `stream`, until ghc_mem_saved_end. A NULL
 * mp or member gives *at = ptr, and saved_end 0. Returns 0 or GHC_E* (message set; *at = NULL). */
GHC_API int ghc_mem_saved_begin(ghc_mempolicy_t *mp, void *ptr, size_t bytes, int64_t unit, bool write, void *stream,
                                void **at);
GHC_API int ghc_mem_saved_end(ghc_mempolicy_t *mp, void *ptr, void *stream);
/* Run the `probe` of mempolicy plugin `plugin` (loaded if needed) into *out. Returns 0,
 * GHC_ELOAD / GHC_ENOTFOUND (message set) when it is absent or has no probe. */
GHC_API int ghc_mem_probe(ghc_core_t *core, const char *plugin, const struct ghc_probe_opts *opts,
                          struct ghc_probe *out);
/* "weights 1.2 GiB, activations 300.0 MiB" (roles in use, largest first) into buf, from the
 * first n_roles entries of bytes_role (a policy's counters or a ghc_mem_stats' bytes_role with
 * GHC_ROLE_MAX; entries past GHC_ROLE_MAX are not read). Returns buf. Since API 12 (the count
 * is new: the array had GHC_ROLE_COUNT entries). */
GHC_API const char *ghc_mem_usage_text(const uint64_t *bytes_role, int32_t n_roles, char *buf, size_t len);
/* "discrete", "coherent", ... Static. */
GHC_API const char *ghc_mem_platform_name(enum ghc_mem_platform p);
/* Append an item to a probe (truncating strings); ignored when the probe is full. */
GHC_API void ghc_probe_add(struct ghc_probe *p, const char *section, const char *key, enum ghc_probe_mark mark,
                           double value, const char *unit, const char *fmt, ...) GHC_PRINTF(7, 8);
/* "weights", "weights_inactive", ... Static; "?" when out of range. */
GHC_API const char *ghc_mem_role_name(enum ghc_mem_role role);
/* (since API 3) Where a plugin computes by default: CUDA device 0 when this build has CUDA and the
 * run's memory policy gives device memory there, else GHC_DEVICE_CPU. */
GHC_API int ghc_mem_default_device(ghc_core_t *core);

GHC_END_DECLS

#endif /* GHC_MEMPOLICY_H */
