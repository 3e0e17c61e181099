/* model.h: the model plugin interface: a diffusion transformer with a frozen base, one or
 * more experts (Wan2.2 A14B: high-noise and low-noise), named adapter targets, and
 * forward/backward of a batch at given timesteps with adapter hooks on the targets. */
#ifndef GHC_MODEL_H
#define GHC_MODEL_H

#include <gh200core/plugin.h>   /* defines: ghc_core_t, ghc_cfg_t, ghc_tensor_t */

GHC_BEGIN_DECLS

/* A linear layer adapters may attach to. Strings belong to the model instance. */
struct ghc_model_target {
    const char *name;        /* official naming: "blocks.3.self_attn.q" */
    const char *alias;       /* diffusers naming: "blocks.3.attn1.to_q" (may be NULL) */
    int64_t     in_features;
    int64_t     out_features;
    int32_t     block;       /* transformer block index, -1 outside blocks */
};

/* One batch. Tensors are borrowed for the call. */
struct ghc_model_batch {
    ghc_tensor_t *noisy;       /* x_sigma, [B, C, F, H, W] */
    ghc_tensor_t *timesteps;   /* t = 1000 sigma, [B], f32 */
    ghc_tensor_t *text_embed;  /* [B, L, text_dim] */
    ghc_tensor_t *text_mask;   /* [B, L] or NULL */
    ghc_tensor_t *cond;        /* I2V conditioning or NULL */
};

/* Adapter hooks the network installs. `target` indexes the model's targets. forward adds
 * the adapter's contribution to y = base(x); backward gets the linear's input x and output
 * gradient dy, computes the adapter's own gradients and adds its part to dx. */
struct ghc_adapter_hook {
    void *user;
    int (*forward)(void *user, int32_t target, const ghc_tensor_t *x, ghc_tensor_t *y, void *stream);
    int (*backward)(void *user, int32_t target, const ghc_tensor_t *x, const ghc_tensor_t *dy,
                    ghc_tensor_t *dx, void *stream);
};

struct ghc_model_ops {
    uint32_t struct_size;                 /* required: sizeof(struct ghc_model_ops) */
    const char *name;                     /* required */
    const struct ghc_cfg_key *keys;       /* optional: keys of the [model] section */
    /* required; once per run: reads the checkpoints named in the config. */
    int (*init)(ghc_core_t *core, ghc_cfg_t *cfg, void **self);
    /* required; number of experts (1 for a single model). */
    int32_t (*experts)(void *self);
    /* required; the expert that serves timestep t (0 .. experts-1). */
    int32_t (*expert_for)(void *self, float t);
    /* required; the adapter targets (the same list for every expert). Borrowed. */
    int (*targets)(void *self, const struct ghc_model_target **out, int32_t *n);
    /* required; install (or with NULL remove) the adapter hooks. Copied. */
    int (*set_hook)(void *self, const struct ghc_adapter_hook *hook);
    /* required; prediction of the flow-matching velocity for `batch` with `expert` into `out`. */
    int (*forward)(void *self, int32_t expert, const struct ghc_model_batch *batch,
                   ghc_tensor_t *out, void *stream);
    /* required; after forward: backpropagate d(loss)/d(out) through the frozen base, calling
     * the hook's backward on every target. */
    int (*backward)(void *self, int32_t expert, const ghc_tensor_t *dout, void *stream);
    /* optional; make `expert` the active one (placement of the inactive one is the policy's). */
    int (*activate)(void *self, int32_t expert);
    /* optional; once, last. */
    void (*free)(void *self);
};

typedef struct ghc_model ghc_model_t;

/* The run's model, or NULL. Borrowed. */
GHC_API ghc_model_t *ghc_model_get(ghc_core_t *core);

GHC_END_DECLS

#endif /* GHC_MODEL_H */
