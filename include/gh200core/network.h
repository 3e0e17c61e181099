/* network.h: the network (adapter) plugin interface: attaches to a model's targets, owns the
 * trainable parameters, runs through the model's adapter hooks, and saves, loads and merges
 * adapter files (one per expert). */
#ifndef GHC_NETWORK_H
#define GHC_NETWORK_H

#include <gh200core/model.h>    /* defines: struct ghc_model_target, ghc_tensor_t */

GHC_BEGIN_DECLS

/* A trainable parameter and its gradient. Owned by the network instance. `group` selects
 * per-group optimizer settings (e.g. the expert, for stage-specific learning rates). */
struct ghc_param {
    const char   *name;
    ghc_tensor_t *value;
    ghc_tensor_t *grad;
    int32_t       group;
};

struct ghc_network_ops {
    uint32_t struct_size;                 /* required: sizeof(struct ghc_network_ops) */
    const char *name;                     /* required */
    const struct ghc_cfg_key *keys;       /* optional: keys of the [network] section */
    /* required; once per run, after the model (ghc_model_get(core) is valid). */
    int (*init)(ghc_core_t *core, ghc_cfg_t *cfg, void **self);
    /* required; create adapters on the selected targets for `expert`. */
    int (*attach)(void *self, int32_t expert, const struct ghc_model_target *targets, int32_t n);
    /* required; the hooks the model calls (ghc_adapter_hook), for the active expert. */
    int (*hook)(void *self, int32_t expert, struct ghc_adapter_hook *out);
    /* required; trainable params of `expert`. Borrowed until free(). */
    int (*params)(void *self, int32_t expert, struct ghc_param **out, int32_t *n);
    /* required; write the adapter file of `expert` to `path` (atomically). */
    int (*save)(void *self, int32_t expert, const char *path);
    /* optional; read an adapter file into `expert`'s params (resume, continue). */
    int (*load)(void *self, int32_t expert, const char *path);
    /* optional; once, last. */
    void (*free)(void *self);
    /* optional (since API 3); before the forwards of optimizer step `step`: fixes the random
     * choices of that step (rank and module dropout), so that a checkpointed block's forward
     * that runs again before its backward gives the same y. */
    int (*begin_step)(void *self, int64_t step);
};

typedef struct ghc_network ghc_network_t;

/* The run's network, or NULL. Borrowed. */
GHC_API ghc_network_t *ghc_network_get(ghc_core_t *core);

/* ---- the run's instance (core wrappers, core/network.c; a NULL optional member is a
 * successful no-op). Each calls the member of the same name; those taking an expert check
 * 0 <= expert (and expert < ghc_model_experts() when the run has a model) first (GHC_EINVAL).
 * Return 0 or GHC_E*, reason in ghc_error_message(core). ---- */

/* Create the adapters of `expert` on the selected ones of `targets` (the model's list). */
GHC_API int ghc_network_attach(ghc_network_t *net, int32_t expert, const struct ghc_model_target *targets,
                               int32_t n);
/* The hooks to install with ghc_model_set_hook() while `expert` is active. */
GHC_API int ghc_network_hook(ghc_network_t *net, int32_t expert, struct ghc_adapter_hook *out);
/* The trainable params of `expert`: *out borrowed until the run is freed. */
GHC_API int ghc_network_params(ghc_network_t *net, int32_t expert, struct ghc_param **out, int32_t *n);
/* Write `expert`'s adapter file to `path` (atomically). */
GHC_API int ghc_network_save(ghc_network_t *net, int32_t expert, const char *path);
/* Read an adapter file into `expert`'s params. GHC_EUNSUPPORTED when the plugin cannot load. */
GHC_API int ghc_network_load(ghc_network_t *net, int32_t expert, const char *path);
/* Start optimizer step `step` (seeds the step's dropout). */
GHC_API int ghc_network_begin_step(ghc_network_t *net, int64_t step);

GHC_END_DECLS

#endif /* GHC_NETWORK_H */
