/* pardit.h: what the two files of the pardit example share: the [model] section as pardit
 * reads it, the layout of its adapter targets, and the plugin-level members estimate.c
 * implements. Nothing here is exported: the plugin is built with -fvisibility=hidden, and
 * only its descriptor is visible. */
#ifndef PARDIT_H
#define PARDIT_H

#include <gh200core/model.h>   /* defines: struct ghc_model_memory, struct ghc_merge_names */

enum { QKV, OUT, FC1, FC2, SLOTS };   /* the linears of a block, in target order */

/* The model's dimensions and settings (the keys of pardit_keys, defaults and bounds applied). */
struct pardit_cfg {
    int64_t D;       /* dim: the width of the joint stream */
    int64_t H;       /* heads */
    int64_t M;       /* mlp: the MLP's hidden width */
    int64_t nb;      /* blocks */
    int64_t C;       /* channels of the latent */
    int64_t Dt;      /* text_dim */
    int64_t Lt;      /* text_len: text rows, zero-padded to this */
    int64_t Ft;      /* freq_dim: sinusoids of the time embedding */
    int64_t spare;   /* spare rows and columns per target */
    int64_t seed, device;
};

/* The section `cfg` read and checked. Returns 0 or GHC_E* (message set, naming the key). */
int pardit_cfg_read(ghc_core_t *core, ghc_cfg_t *cfg, struct pardit_cfg *c);

/* Target t's linear: out and in features, and the first of its spare columns (>= in): the
 * block linears in block order (SLOTS each), then text_in. */
int32_t pardit_n_targets(const struct pardit_cfg *c);
void pardit_target_shape(const struct pardit_cfg *c, int32_t t, int64_t *out, int64_t *in, int64_t *spare_col);

/* The plugin-level members (estimate.c; model.h says what they answer). */
int pardit_estimate(ghc_core_t *core, ghc_cfg_t *cfg, int64_t batch, int64_t tokens, struct ghc_model_memory *out);
int pardit_merge_names(ghc_core_t *core, const char *tensor, int32_t ndim, const int64_t *shape,
                       struct ghc_merge_names *out);

#endif /* PARDIT_H */
