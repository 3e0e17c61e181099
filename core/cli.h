/* cli.h: subcommands of the gh200core CLI that live outside main.c. Each returns 0 or a
 * GHC_E* status with the reason in ghc_error_message(core); main() maps it to an exit code. */
#ifndef GHC_CLI_H
#define GHC_CLI_H

#include <stdio.h>

#include <gh200core/gh200core.h>

/* `gh200core inspect FILE`: the header of a safetensors file (or sharded index): metadata,
 * a table of tensors (name, dtype, shape, bytes), and totals per dtype, printed to `out`. */
int ghc_cli_inspect(ghc_core_t *core, const char *path, FILE *out);

/* ---- estimate and diag ---- */

#include <gh200core/mempolicy.h>   /* defines: GHC_ROLE_COUNT, struct ghc_probe_opts */

struct ghc_estimate_opts {
    int64_t batch;       /* samples per micro-batch (default 1) */
    int64_t tokens;      /* tokens per sample (default 32760: 480x832x81) */
    bool    adapters;    /* count adapters, grads and optimizer state */
};
struct ghc_estimate {
    uint64_t role[GHC_ROLE_COUNT];
    int      where[GHC_ROLE_COUNT];   /* 0 host, 1 device, 2 managed, 3 pinned host */
    uint64_t at[4];                   /* totals by location */
    uint64_t activations_full, activations_ckpt, ring;
    uint64_t saved_ring;              /* the saved-activation ring's device buffers (in at[1]) */
};
/* `gh200core estimate`: memory by role and location for the loaded configuration, from the
 * checkpoint headers only, through the estimate members of the model and network plugins it
 * names (loaded from the plugin search path); printed to `print` when not NULL. */
int ghc_cli_estimate(ghc_core_t *core, const struct ghc_estimate_opts *o, struct ghc_estimate *out, FILE *print);

/* `gh200core diag`: the machine probe of the gh200_uvm plugin, printed with pass/fail marks to
 * `out`, and as JSON to json_path when not NULL. *failed gets the number of failed checks. */
int ghc_cli_diag(ghc_core_t *core, const struct ghc_probe_opts *o, const char *json_path, FILE *out, int *failed);

/* ---- merge ---- */

struct ghc_merge_opts {
    const char *base, *adapter, *out;
    double      multiplier;   /* m (default 1) */
    int         dtype;        /* enum ghc_dtype of the merged weights, or -1: the base tensor's */
    const char *network;      /* the network plugin that reads the adapter (NULL: lycoris) */
    const char *model;        /* the model plugin that names the base's modules (NULL: wan22) */
};
/* `gh200core merge`: write o->out, the base checkpoint with the adapter merged in (see
 * core/merge.c); a summary to `print` when not NULL. GHC_EEXIST when o->out exists (nothing
 * written), GHC_EIO / GHC_EFORMAT for unreadable or mismatched files, GHC_EUNSUPPORTED for fp8
 * base weights or a plugin without the merge members, GHC_ELOAD for a plugin not found. */
int ghc_cli_merge(ghc_core_t *core, const struct ghc_merge_opts *o, FILE *print);

#endif /* GHC_CLI_H */
