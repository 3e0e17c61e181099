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
};

typedef struct ghc_network ghc_network_t;

/* The run's network, or NULL. Borrowed. */
GHC_API ghc_network_t *ghc_network_get(ghc_core_t *core);

GHC_END_DECLS

#endif /* GHC_NETWORK_H */
