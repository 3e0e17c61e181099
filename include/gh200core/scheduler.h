/* scheduler.h: the scheduler plugin interface: per optimizer step, how many micro-batches to
 * accumulate and the factor applied to the optimizer's learning rate. */
#ifndef GHC_SCHEDULER_H
#define GHC_SCHEDULER_H

#include <gh200core/plugin.h>   /* defines: ghc_core_t, ghc_cfg_t, struct ghc_cfg_key */

GHC_BEGIN_DECLS

struct ghc_scheduler_ops {
    uint32_t struct_size;                 /* required: sizeof(struct ghc_scheduler_ops) */
    const char *name;                     /* required */
    const struct ghc_cfg_key *keys;       /* optional: keys of the [scheduler] section */
    /* required; once per run. On success *self belongs to the core (released with free()). */
    int (*init)(ghc_core_t *core, ghc_cfg_t *cfg, void **self);
    /* required; every optimizer step (0-based): micro-batches to accumulate, >= 1. */
    int32_t (*micro_batches)(void *self, int64_t step);
    /* required; every optimizer step: factor on the optimizer's lr, >= 0. */
    float (*lr_factor)(void *self, int64_t step);
    /* optional; once, last. */
    void (*free)(void *self);
};

typedef struct ghc_scheduler ghc_scheduler_t;

/* The run's scheduler, or NULL. Borrowed. */
GHC_API ghc_scheduler_t *ghc_scheduler_get(ghc_core_t *core);
GHC_API int32_t ghc_scheduler_micro_batches(ghc_scheduler_t *s, int64_t step);
GHC_API float   ghc_scheduler_lr_factor(ghc_scheduler_t *s, int64_t step);

/* ---- a learning-rate factor schedule schedulers share ------------------------------------- */

/* Linear warmup over warmup_steps (step k gets (k + 1) / W), then 1, or with decay = cosine
 * 0.5 (1 + cos(pi p)) scaled into [min_factor, 1], p = (step - W) / (decay_steps - W) capped
 * at 1. Steps count optimizer steps from 0. */
enum ghc_lr_decay { GHC_LR_DECAY_NONE = 0, GHC_LR_DECAY_COSINE };
struct ghc_lr_schedule {
    int64_t           warmup_steps;
    enum ghc_lr_decay decay;
    int64_t           decay_steps;   /* the step at which the cosine reaches min_factor */
    double            min_factor;
};
/* The keys ghc_lr_schedule_read() reads, for a plugin's key table:
 * warmup_steps (int), lr_decay ("none" | "cosine"), decay_steps (int), min_lr_factor (float). */
#define GHC_LR_SCHEDULE_KEYS                                                                  \
    { "warmup_steps", GHC_CFG_INT, "0", "0 to 2^40", NULL },                                    \
    { "lr_decay", GHC_CFG_STRING, "none", "none, cosine", NULL },                               \
    { "decay_steps", GHC_CFG_INT, "0", "0 to 2^40", NULL },                                     \
    { "min_lr_factor", GHC_CFG_FLOAT, "0.0", "0 to 1", NULL }
/* Reads those keys of `cfg` (defaults: 0, "none", 0, 0.0); cosine needs decay_steps >
 * warmup_steps. Returns 0 or GHC_ECONFIG with the key's file:line. */
GHC_API int   ghc_lr_schedule_read(ghc_cfg_t *cfg, struct ghc_lr_schedule *out);
GHC_API float ghc_lr_schedule_factor(const struct ghc_lr_schedule *s, int64_t step);

GHC_END_DECLS

#endif /* GHC_SCHEDULER_H */
