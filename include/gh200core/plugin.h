/* plugin.h: the plugin descriptor, plugin kinds and registration (the implementer's side).
 *
 * A plugin file ghc_<name>.so exports exactly one symbol, ghc_plugin_<name>: a const
 * struct ghc_plugin. The core dlopen()s the file (RTLD_NOW | RTLD_LOCAL), checks abi, api,
 * struct_size and name, then calls init(), which registers one ops struct per kind it
 * declared in `kinds`. Everything else in the plugin is static. See doc/plugin-guide.md. */
#ifndef GHC_PLUGIN_H
#define GHC_PLUGIN_H

#include <gh200core/core.h>   /* defines: ghc_core_t, GHC_API, GHC_PLUGIN_ABI, GHC_API_VERSION */

GHC_BEGIN_DECLS

/* ---- kinds -------------------------------------------------------------------------------- */

enum ghc_kind {
    GHC_KIND_MEMPOLICY = 0,  /* where bytes live: allocate by role, advise, prefetch */
    GHC_KIND_BACKEND,        /* the dataset's bytes: list, read, write, stat */
    GHC_KIND_CACHE,          /* per-sample tensors: get, put, prefetch */
    GHC_KIND_MODEL,          /* the transformer: load, targets, forward, backward */
    GHC_KIND_NETWORK,        /* adapters: attach, params, hooks, save, load, merge */
    GHC_KIND_OPTIMIZER,      /* updates adapter params from their grads */
    GHC_KIND_SCHEDULER,      /* per step: micro-batches to accumulate, lr factor */
    GHC_KIND_VAE,            /* (since API 16) clips <-> latents (encoder.h) */
    GHC_KIND_TEXT_ENCODER,   /* (since API 16) captions -> text embeddings (encoder.h) */
    GHC_KIND_COUNT
};

/* Bit for `kinds` in the descriptor: GHC_KIND_BIT(GHC_KIND_SCHEDULER). */
#define GHC_KIND_BIT(k) (1u << (k))

/* "mempolicy", "backend", ... (the configuration section names). Static; "?" when out of range. */
GHC_API const char *ghc_kind_name(enum ghc_kind kind);

/* ---- the descriptor ----------------------------------------------------------------------- */

struct ghc_plugin {
    uint32_t    abi;          /* required: GHC_PLUGIN_ABI the plugin was built with */
    uint32_t    api;          /* required: GHC_API_VERSION the plugin was built with */
    uint32_t    struct_size;  /* required: sizeof(struct ghc_plugin) */
    uint32_t    kinds;        /* required: GHC_KIND_BIT()s of the kinds init() registers */
    const char *name;         /* required: equals <name> in ghc_<name>.so and the symbol */
    const char *version;      /* required: the plugin's own version, for people */
    const char *description;  /* optional: one line for `gh200core plugins` */
    /* required: register the plugin's ops structs; called once, after the checks above.
     * Returns 0 or GHC_E* with ghc_error_set(). */
    int (*init)(ghc_core_t *core);
};

#if defined(__GNUC__)
#define GHC_PLUGIN_EXPORT __attribute__((visibility("default")))
#else
#define GHC_PLUGIN_EXPORT
#endif

/* The symbol a plugin named `name` exports: GHC_PLUGIN_SYMBOL(cosine) is ghc_plugin_cosine. */
#define GHC_PLUGIN_SYMBOL(name) ghc_plugin_##name

/* ---- registration ------------------------------------------------------------------------- */

struct ghc_mempolicy_ops;
struct ghc_backend_ops;
struct ghc_cache_ops;
struct ghc_model_ops;
struct ghc_network_ops;
struct ghc_optimizer_ops;
struct ghc_scheduler_ops;
struct ghc_vae_ops;
struct ghc_text_encoder_ops;

/* Register an ops struct under ops->name for its kind. Only from a plugin's init(), for a
 * kind its descriptor declares. The core copies min(ops->struct_size, sizeof) bytes (members
 * the plugin lacks read as NULL) and rejects a larger struct, a missing required member, a
 * NULL or empty name, and a name already registered for that kind. `ops` must stay valid
 * while the plugin is loaded (a static const table). Returns 0, GHC_ELOAD, GHC_EABI or
 * GHC_ENOMEM. */
GHC_API int ghc_register_mempolicy(ghc_core_t *core, const struct ghc_mempolicy_ops *ops);
GHC_API int ghc_register_backend(ghc_core_t *core, const struct ghc_backend_ops *ops);
GHC_API int ghc_register_cache(ghc_core_t *core, const struct ghc_cache_ops *ops);
GHC_API int ghc_register_model(ghc_core_t *core, const struct ghc_model_ops *ops);
GHC_API int ghc_register_network(ghc_core_t *core, const struct ghc_network_ops *ops);
GHC_API int ghc_register_optimizer(ghc_core_t *core, const struct ghc_optimizer_ops *ops);
GHC_API int ghc_register_scheduler(ghc_core_t *core, const struct ghc_scheduler_ops *ops);
/* (since API 16) */
GHC_API int ghc_register_vae(ghc_core_t *core, const struct ghc_vae_ops *ops);
GHC_API int ghc_register_text_encoder(ghc_core_t *core, const struct ghc_text_encoder_ops *ops);

GHC_END_DECLS

#endif /* GHC_PLUGIN_H */
