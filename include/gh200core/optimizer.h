/* optimizer.h: the optimizer plugin interface: updates parameters from their gradients, with
 * per-group settings (stage-specific learning rates), and saves/loads its state. */
#ifndef GHC_OPTIMIZER_H
#define GHC_OPTIMIZER_H

#include <gh200core/network.h>  /* defines: struct ghc_param */

GHC_BEGIN_DECLS

struct ghc_optimizer_ops {
    uint32_t struct_size;                 /* required: sizeof(struct ghc_optimizer_ops) */
    const char *name;                     /* required */
    const struct ghc_cfg_key *keys;       /* optional: keys of the [optimizer] section */
    /* required; once per run, after the network. */
    int (*init)(ghc_core_t *core, ghc_cfg_t *cfg, void **self);
    /* required; hand over params (borrowed until free()) with their group. */
    int (*add_params)(void *self, struct ghc_param *params, int32_t n);
    /* required; one update of every param of `group` whose grad is set; lr scaled by
     * lr_factor (from the scheduler). `step` counts optimizer steps from 0. */
    int (*step)(void *self, int32_t group, int64_t step, float lr_factor, void *stream);
    /* optional; the current (mean) learning rate of a group, for logs. */
    float (*lr)(void *self, int32_t group);
    /* optional; state to and from a safetensors file (checkpoints). */
    int (*save)(void *self, const char *path);
    int (*load)(void *self, const char *path);
    /* optional; once, last. */
    void (*free)(void *self);
};

typedef struct ghc_optimizer ghc_optimizer_t;

/* The run's optimizer, or NULL. Borrowed. */
GHC_API ghc_optimizer_t *ghc_optimizer_get(ghc_core_t *core);

/* ---- the run's instance (core wrappers; a NULL optional member is a successful no-op) ---- */

/* Hand over params (borrowed until the run ends) with their group: the trainer passes each
 * expert's params with the expert's index (ghc_model_expert_name names it), shared adapters
 * with -1. An optimizer may keep settings per group; the shipped ones read their stage keys as
 * <name>_<key> with Wan2.2's expert names (high_noise_lr for group 0, low_noise_lr for 1) and
 * the plain settings otherwise. The optimizer allocates their state (role
 * GHC_ROLE_OPTIMIZER_STATE). */
GHC_API int   ghc_optimizer_add_params(ghc_optimizer_t *opt, struct ghc_param *params, int32_t n);
/* One update of the params of `group` whose grad is set (grads are not zeroed). `step` counts
 * optimizer steps from 0 and seeds the stochastic rounding of bf16 params. */
GHC_API int   ghc_optimizer_step(ghc_optimizer_t *opt, int32_t group, int64_t step, float lr_factor,
                                 void *stream);
/* The group's current (mean) learning rate, for logs (may synchronise); 0 without lr(). */
GHC_API float ghc_optimizer_lr(ghc_optimizer_t *opt, int32_t group);
/* State to / from a safetensors file keyed by param name, with the queued work done. A load
 * checks the file against this run's params and optimizer and changes nothing on failure. */
GHC_API int   ghc_optimizer_save(ghc_optimizer_t *opt, const char *path);
GHC_API int   ghc_optimizer_load(ghc_optimizer_t *opt, const char *path);

GHC_END_DECLS

#endif /* GHC_OPTIMIZER_H */
