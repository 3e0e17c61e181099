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

/* One module of an adapter file opened for merging (merge_module, since API 13). The caller
 * sets struct_size = sizeof(struct ghc_merge_module) and zeroes the rest; the network fills at
 * most struct_size bytes. Strings belong to the opened file (valid until merge_free). */
struct ghc_merge_module {
    uint32_t    struct_size;
    const char *key;          /* the module's name as in the file: "diffusion_model.blocks.0.ffn.0" */
    const char *name;         /* the key without its naming's prefix, as the model names the
                               * module: "blocks.0.ffn.0", "blocks.0.attn1.to_q" */
    bool        underscored;  /* name writes the model's '.' as '_' (musubi-tuner's lora_unet_
                               * names: "blocks_0_ffn_0"); compared with the underscored names of
                               * struct ghc_merge_names */
    const char *algo;         /* for people: "lora", "loha", "lokr", "dora" */
    int64_t     out, in;      /* delta-W's shape: the base weight's [out, in] */
};

/* What a network's adapters will take in a training run (estimate, since API 13), for
 * `gh200core estimate`. The caller sets struct_size = sizeof(struct ghc_network_memory) and
 * zeroes the rest; the network fills at most struct_size bytes. */
struct ghc_network_memory {
    uint32_t struct_size;
    uint64_t params;          /* bytes of the trainable parameters, all experts */
    uint64_t grads;           /* bytes of their gradients */
    char     summary[64];     /* for people: "rank 16" */
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
    /* optional (since API 13): merging an adapter file into base weights (`gh200core merge`);
     * merge_open, merge_count, merge_module and merge_apply go together, merge_skipped and
     * merge_free may be left out. Plugin-level: no instance and no configuration.
     * merge_open: read the adapter file `path` (onto the CPU). On success *adapter belongs to
     *   the caller, who releases it with merge_free (once, last). Returns 0 or GHC_E*.
     * merge_count: its modules, in file order.
     * merge_module: module i (0 <= i < merge_count) into *out (struct ghc_merge_module).
     * merge_apply: w (CPU f32 [out, in], the base weight of module i) <- the weight with module i
     *   merged in at `multiplier`, in place: W + multiplier delta-W, or whatever the module's
     *   algorithm makes of it (DoRA: W + multiplier (W' - W)). Returns 0 or GHC_E*.
     * merge_skipped: the name of the file's i-th tensor that belongs to no module (not merged),
     *   or NULL past the last; borrowed until merge_free.
     * merge_free: release the adapter; NULL is a no-op. */
    int (*merge_open)(ghc_core_t *core, const char *path, void **adapter);
    int32_t (*merge_count)(void *adapter);
    int (*merge_module)(void *adapter, int32_t i, struct ghc_merge_module *out);
    int (*merge_apply)(void *adapter, int32_t i, ghc_tensor_t *w, float multiplier);
    const char *(*merge_skipped)(void *adapter, int32_t i);
    void (*merge_free)(void *adapter);
    /* optional (since API 13); plugin-level, no instance (`gh200core estimate` runs before
     * anything is loaded): the memory the adapters configured by `cfg` (the network's section,
     * or NULL when the configuration has none: the defaults) will take on the model `model`
     * describes (its experts and the shapes of its targets), into *out (struct
     * ghc_network_memory). Reads the configuration only. Returns 0 or GHC_E*. */
    int (*estimate)(ghc_core_t *core, ghc_cfg_t *cfg, const struct ghc_model_memory *model,
                    struct ghc_network_memory *out);
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

/* ---- plugin-level members (core wrappers, no instance; since API 13) ---- */

/* An adapter file opened for merging by a network plugin. */
typedef struct ghc_merge ghc_merge_t;

/* Load network plugin `network` (if needed) and open the adapter file `path` with its
 * merge_open. NULL on failure, reason in ghc_error_message(core): GHC_ELOAD when the plugin
 * cannot be loaded or registers no network of that name, GHC_EUNSUPPORTED when it cannot
 * merge, else the plugin's. Free with ghc_merge_free(). */
GHC_API ghc_merge_t *ghc_merge_open(ghc_core_t *core, const char *network, const char *path);
/* The number of modules in the file. */
GHC_API int32_t ghc_merge_count(const ghc_merge_t *m);
/* Module i: out->struct_size must be set; the rest is zeroed and filled by the network. Its
 * strings are borrowed until ghc_merge_free(). Returns 0 or GHC_E* (GHC_EINVAL: i out of range). */
GHC_API int ghc_merge_module(ghc_merge_t *m, int32_t i, struct ghc_merge_module *out);
/* w (CPU f32 [out, in], in place) <- the base weight with module i merged in at `multiplier`.
 * Returns 0 or GHC_E*. */
GHC_API int ghc_merge_apply(ghc_merge_t *m, int32_t i, ghc_tensor_t *w, float multiplier);
/* The i-th tensor of the file that is no part of a module (not merged), or NULL past the last
 * (always NULL when the network lacks merge_skipped). Borrowed until ghc_merge_free(). */
GHC_API const char *ghc_merge_skipped(ghc_merge_t *m, int32_t i);
/* Close the file. NULL is a no-op. */
GHC_API void ghc_merge_free(ghc_merge_t *m);
/* The estimate of network plugin `network` (loaded if needed) for its configuration section
 * `cfg` (NULL: none, the defaults) on the model `model` describes (ghc_model_estimate()):
 * out->struct_size must be set; the rest is zeroed and filled by the network. Returns 0 or
 * GHC_E*: GHC_ELOAD as ghc_merge_open(), GHC_EUNSUPPORTED when the network lacks the member. */
GHC_API int ghc_network_estimate(ghc_core_t *core, const char *network, ghc_cfg_t *cfg,
                                 const struct ghc_model_memory *model, struct ghc_network_memory *out);

GHC_END_DECLS

#endif /* GHC_NETWORK_H */
