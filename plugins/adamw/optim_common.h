/* optim_common.h: what the adamw and automagic plugins share (compiled into each, never
 * exported): the table of params with their state tensors, per-group settings with the
 * high_noise_* / low_noise_* fallbacks, and the state file (safetensors keyed by param name). */
#ifndef GHC_OPTIM_COMMON_H
#define GHC_OPTIM_COMMON_H

#include <gh200core/gh200core.h>
#include <gh200core/ops.h>
#include <gh200core/optimizer.h>
#include <gh200core/safetensors.h>

#define OPTIM_STATES 6

/* One param handed over by add_params, and its state. */
struct optim_param {
    struct ghc_param *p;                      /* borrowed from the network */
    int32_t           index;                  /* order of add_params: seeds the rounding */
    int64_t           k;                      /* update steps taken (bias correction) */
    ghc_tensor_t     *state[OPTIM_STATES];    /* owned; NULL where unused */
};

/* A state tensor kind of an optimizer: its key suffix in the file ("exp_avg"), or NULL for
 * scratch that is not saved. */
struct optim_state_kind {
    const char *suffix;
    const char *suffix_1d;   /* the name instead, for a param of ndim < 2 (or NULL) */
};

struct optim {
    ghc_core_t                    *core;
    const char                    *name;       /* "adamw" */
    const struct optim_state_kind *kinds;      /* OPTIM_STATES entries */
    struct optim_param            *ps;
    int32_t                        n, cap;
    uint64_t                       seed;
};

/* The group index into per-group arrays: 0 high noise, 1 low noise, 2 any other group. */
static inline int optim_group_slot(int32_t group) { return group == 0 ? 0 : group == 1 ? 1 : 2; }
extern const char *const optim_group_prefix[3];   /* "high_noise_", "low_noise_", "" */

/* Read float `key` for the three groups: the plain key (default def) and the stage keys
 * high_noise_<key> / low_noise_<key>, each falling back to the plain value. */
int optim_cfg_group_float(ghc_cfg_t *cfg, const char *key, double def, double min, double max, double out[3]);
/* The three key-table entries optim_cfg_group_float reads: `k` with its default and range, and
 * the stage keys, whose default is the plain key's value. */
#define OPTIM_STAGE_KEYS(k, def, range)                                                                    \
    { k, GHC_CFG_FLOAT, def, range, NULL }, { "high_noise_" k, GHC_CFG_FLOAT, "(" k ")", range, NULL },    \
    { "low_noise_" k, GHC_CFG_FLOAT, "(" k ")", range, NULL }

/* Append params (state created by `init_state`, called with each new entry). Params with an
 * already known name are GHC_EINVAL. */
int optim_add(struct optim *o, struct ghc_param *params, int32_t n,
              int (*init_state)(void *self, struct optim_param *op), void *self);
/* A state tensor on the param's device, of `role` optimizer state, filled with the bytes of
 * `fill` (elem-size pattern, NULL: zeros). NULL on error (message set). */
ghc_tensor_t *optim_state_new(struct optim *o, const ghc_tensor_t *like, enum ghc_dtype dt, int ndim,
                              const int64_t *shape, const void *fill);
/* The rounding generator of a param at an optimizer step (bf16 params). */
struct ghc_rng optim_rng(const struct optim *o, const struct optim_param *op, int64_t step);
/* Write every param's saved states and step count to `path` (atomically), with metadata
 * "optimizer" = o->name, "format" and the pairs of `meta` (key, value, ..., NULL). */
int optim_save(struct optim *o, const char *path, const char *const *meta);
/* Read a file written by optim_save into the states: all or nothing. Fails naming the file
 * and tensor on another optimizer's file, a missing or extra entry, or a wrong shape/dtype. */
int optim_load(struct optim *o, const char *path);
void optim_free(struct optim *o);

#endif /* GHC_OPTIM_COMMON_H */
