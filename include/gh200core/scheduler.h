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

GHC_END_DECLS

#endif /* GHC_SCHEDULER_H */
