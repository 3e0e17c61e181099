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
    double  device_gib;  /* the card's memory in GiB for a verdict and a plan; 0: unknown, none */
    double  host_gib;    /* plan = "auto" only: the host memory a plan may take (host and pinned
                          * roles); 0: not checked */
};
struct ghc_estimate {
    uint64_t role[GHC_ROLE_COUNT];
    int      where[GHC_ROLE_COUNT];   /* 0 host, 1 device, 2 managed, 3 pinned host */
    uint64_t at[4];                   /* totals by location */
    uint64_t activations_full, activations_ckpt, ring;
    uint64_t saved_ring;              /* the saved-activation ring's device buffers (in at[1]) */
    /* with device_gib: */
    uint64_t device_total;            /* at[1] plus the allowance (GHC_ESTIMATE_ALLOWANCE_*) */
    int      fits;                    /* 1 fits, 0 does not, -1 no verdict (device_gib 0) */
    char     plan[512];               /* when it does not fit: the --set arguments of the first
                                       * plan that fits ("" when none does) */
    uint64_t plan_total;              /* that plan's device_total */
    uint64_t device_dynamic;          /* of at[1], what is not allocated once (weights, ring,
                                       * resident blocks, adapters, their grads and state) */
    uint64_t streamed;                /* weights a pass streams to the card (offload) */
    uint64_t saved_off;               /* saved activations kept off the card, per step */
    double   flops_step, flops_forward;   /* the model's (struct ghc_model_memory), 0 unknown */
};
/* What the card needs beyond the estimate: a fixed part (the CUDA context, cuBLASLt's and
 * cuDNN's workspaces, the ops' scratch) plus a share of device_dynamic (the caching pool's
 * slack over memory allocated and freed during a step). Fitted to nvidia-smi's figures of
 * twelve runs at A14B dims (4096 and 32760 tokens; device, offload with 0 to 80 resident
 * blocks; H100 and H200): each within 2.5% (doc/memory.md). */
#define GHC_ESTIMATE_ALLOWANCE_GIB   0.55
#define GHC_ESTIMATE_ALLOWANCE_SHARE 0.10
/* `gh200core estimate`: memory by role and location for the loaded configuration, from the
 * checkpoint headers only (or the model's known dims when the files are absent), through the
 * estimate members of the model and network plugins it names (loaded from the plugin search
 * path); printed to `print` when not NULL. With o->device_gib: out->fits, and when it does
 * not fit, the first plan that does (out->plan). Returns 0 whether or not it fits. */
int ghc_cli_estimate(ghc_core_t *core, const struct ghc_estimate_opts *o, struct ghc_estimate *out, FILE *print);

/* plan = "auto" (top-level key): choose the fastest plan whose estimate fits the card and set it
 * into the configuration before the run's plugins exist: the memory policy (device, or offload
 * with saved activations on the host and the fewest resident blocks that keep the streaming
 * under the compute; a configured gh200_uvm or other policy is kept), the model's
 * checkpointing and checkpoint_every. A plan's step time is predicted from the model's FLOPs
 * and the copies it needs at the card's measured speeds; of the plans within GHC_PLAN_AUTO_TIE
 * of the fastest, the smallest on the card. A plan also fits the host's memory: what it keeps
 * there (pinned weights, saved activations) within GHC_PLAN_AUTO_HOST of it. */
struct ghc_plan_opts {
    int64_t batch;       /* samples per micro-batch; 0: data.batch_size */
    int64_t tokens;      /* tokens per sample; 0: the dataset's largest (its headers) */
    double  device_gib;  /* the card's free memory; 0: the model's device asked (CUDA) */
    double  flops;       /* the card's bf16 FLOP/s and host-to-device bytes/s; 0: measured on */
    double  h2d;         /* the model's device (ghc_op_device_speed), else GHC_PLAN_AUTO_* */
    double  host_gib;    /* the host's memory; 0: this machine's (GHC_PLAN_AUTO_HOST of it) */
};
/* The speeds assumed where none can be measured (no GPU here): an H100's bf16 products, a
 * PCIe 4 x16 link from pinned memory. */
#define GHC_PLAN_AUTO_FLOPS 700e12
#define GHC_PLAN_AUTO_H2D   25e9
/* The share of the host's memory a plan may take in pinned weights and saved activations (the
 * rest is for the system, the data loader and the process's own). */
#define GHC_PLAN_AUTO_HOST  0.85
/* Plans whose predicted step times are within this share of the fastest count as equally
 * fast: the one with the smallest device total wins. */
#define GHC_PLAN_AUTO_TIE   0.02
/* Returns 0 with the choice for people in `chosen` ("" when plan is not "auto"), or GHC_E*. A
 * plan fits when its estimate (allowance included) leaves this share of the card free. */
#define GHC_PLAN_AUTO_HEADROOM 0.03
int ghc_cli_plan_auto(ghc_core_t *core, const struct ghc_plan_opts *o, char *chosen, size_t len);

/* The host's physical memory in GiB (sysconf), 0 when the system does not say: diag's
 * host_total and plan = "auto"'s host by default. */
double ghc_cli_host_gib(void);

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

/* ---- several ranks ---- */

/* `gh200core --nproc N ...`: start N ranks of this program (argv without --nproc) on this host
 * with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and a free MASTER_PORT, pass SIGINT and
 * SIGTERM on to them and wait (core/launch.c). Returns the exit status: the first non-zero one
 * of a rank (128 + the signal of a killed one), else 0. */
int ghc_cli_launch(int nproc, int argc, char *const *argv);

#endif /* GHC_CLI_H */
