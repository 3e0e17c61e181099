/* train_impl.h: the trainer's internal pieces (never installed): the sigma samplers, the
 * TensorBoard event writer, the embedded demo, and the trainer's state with the functions its
 * files share (train.c the loop, train_check.c the checks before a run, checkpoint.c,
 * outdir.c the output folder, progress.c). The samplers and the event writer are tested
 * directly by tests/test_train.c. */
#ifndef GHC_TRAIN_IMPL_H
#define GHC_TRAIN_IMPL_H

#include <stdint.h>
#include <stdio.h>

#include <gh200core/gh200core.h>
#include <gh200core/ops.h>      /* defines: struct ghc_rng */
#include <gh200core/train.h>    /* defines: struct ghc_train_opts */

/* ---- sigma samplers (doc/training.md) ------------------------------------------------------- */

enum ghc_sampler_family {
    GHC_SAMPLER_UNIFORM = 0,    /* sigma = u */
    GHC_SAMPLER_SIGMOID,        /* sigma = sigmoid(scale n) */
    GHC_SAMPLER_LOGIT_NORMAL,   /* sigma = sigmoid(mean + std n) */
    GHC_SAMPLER_SHIFT,          /* sigma = k s0 / (1 + (k - 1) s0), s0 from the base */
    GHC_SAMPLER_FLUX_SHIFT,     /* shift with k = exp(mu(S)), S tokens per latent frame */
    GHC_SAMPLER_COUNT
};

/* The base distribution of shift and flux_shift. */
enum ghc_sampler_base { GHC_SAMPLER_BASE_SIGMOID = 0, GHC_SAMPLER_BASE_UNIFORM };

struct ghc_sampler {
    enum ghc_sampler_family family;
    enum ghc_sampler_base   base;
    double   scale;          /* sigmoid scale s */
    double   mean, std;      /* logit-normal */
    double   shift;          /* k of shift */
    double   lo, hi;         /* the accepted range: lo <= sigma < hi, or <= hi when hi = 1 */
    uint64_t seed;
    uint64_t counter;        /* Philox blocks used so far: the whole state */
    int64_t  max_tries;      /* rejection rounds per draw before the hard error */
};

extern const char *const ghc_sampler_family_names[];  /* NULL-terminated, by enum value */
extern const char *const ghc_sampler_base_names[];

/* k of flux_shift for S tokens per latent frame ((H_lat / 2) (W_lat / 2)). */
double ghc_sampler_flux_k(int64_t tokens_per_frame);
/* P(sigma < x) of the unrestricted family (k: the shift factor for shift and flux_shift). */
double ghc_sampler_cdf(const struct ghc_sampler *s, double k, double x);
/* The probability that one unrestricted draw lands in [lo, hi). */
double ghc_sampler_acceptance(const struct ghc_sampler *s, double k);
/* One sigma in the range, by rejection (the family's shape, cut to the range). k as above
 * (ignored unless shift/flux_shift; pass ghc_sampler_flux_k(S) for flux_shift). GHC_EINVAL
 * with a message when max_tries draws all miss. */
int ghc_sampler_draw(ghc_core_t *core, struct ghc_sampler *s, double k, double *sigma);

/* ---- TensorBoard event files ---------------------------------------------------------------- */

/* CRC-32C (Castagnoli) and the masked form of TFRecord. */
uint32_t ghc_crc32c(const void *data, size_t len);
uint32_t ghc_crc32c_masked(const void *data, size_t len);

typedef struct ghc_tboard ghc_tboard_t;
/* Creates dir/events.out.tfevents.<seconds>.<host>.gh200core and writes the version event. */
int  ghc_tboard_open(ghc_core_t *core, const char *dir, ghc_tboard_t **out);
/* One scalar summary (tag, value) at `step`, wall time now. */
int  ghc_tboard_scalar(ghc_tboard_t *tb, const char *tag, int64_t step, float value);
int  ghc_tboard_flush(ghc_tboard_t *tb);
void ghc_tboard_free(ghc_tboard_t *tb);
const char *ghc_tboard_path(const ghc_tboard_t *tb);

/* ---- the embedded demo ---------------------------------------------------------------------- */

/* With a `demo` section: write the demo dataset to <output_dir>/demo-data and point the `data`
 * section at it: generated media, then prepared (ghc_prepare, by data.prepare), or the latent
 * demo (a planted adapter's targets; demo.c says which when). Without one: nothing. */
int ghc_demo_generate(ghc_core_t *core);
/* The `data` section pointed at the demo dataset another process (rank 0) generated (and, for
 * media, data.empty_prompt at its prepared empty prompt). */
int ghc_demo_point(ghc_core_t *core);
/* The demo section's values, read and checked (ranges, sigma_min <= sigma_max) by the one
 * reader both the pre-run checks and ghc_demo_generate use. shape: channels, frames, height,
 * width, text_len, text_dim; given: whether the file sets it (else the default). videos,
 * images: the media demo's counts. */
enum { GHC_DEMO_SHAPES = 6 };
struct ghc_demo_opts {
    int64_t     shape[GHC_DEMO_SHAPES];
    bool        given[GHC_DEMO_SHAPES];
    const char *shape_key[GHC_DEMO_SHAPES];
    int64_t     samples, rank, videos, images;
    double      strength, sigma_min, sigma_max;
};
int ghc_demo_read(ghc_cfg_t *s, struct ghc_demo_opts *o);
extern const struct ghc_cfg_key ghc_demo_keys[];
/* Whether the demo section asks for media (videos or images) and this build can write them. */
bool ghc_demo_media(const struct ghc_demo_opts *o);
/* The media demo's dataset, data.datasets[0] (its resolution and target_frames size the media),
 * read and checked. Returns 0 or GHC_ECONFIG. */
int ghc_demo_media_check(ghc_core_t *core);

/* ---- the trainer's state -------------------------------------------------------------------- */

enum ghc_train_mode { GHC_TRAIN_MODE_SINGLE = 0, GHC_TRAIN_MODE_SEPARATE, GHC_TRAIN_MODE_SHARED };
enum ghc_train_weighting { GHC_TRAIN_WEIGHTING_NONE = 0, GHC_TRAIN_WEIGHTING_SIGMA_SQRT, GHC_TRAIN_WEIGHTING_COSMAP };

/* NULL-terminated, by enum value: the train section's spellings, also written to trainer.json. */
extern const char *const ghc_train_mode_names[];
extern const char *const ghc_train_expert_names[];   /* by model expert: 0 high noise, 1 low */

/* The train section, as read and checked. */
struct ghc_train_cfg {
    int64_t steps, switch_every, max_tries, save_every, keep_last, max_bad, log_every;
    int64_t validate_every, validation_batches;
    int64_t profile_steps, profile_skip;   /* profile.md: steps skip .. skip + steps - 1 */
    int     mode, expert, weighting;
    bool    t_offset, tensorboard, stored_noise, sync_timing;
    double  max_grad_norm;
    const char *name;
    double  vsig[16];
    int     n_vsig;
};

#define GHC_TRAIN_MAX_ADAPTERS 2

/* 64-bit FNV-1a of p[0..n) continued from h (GHC_FNV1A_BASIS to start): the adapters' checksum
 * across ranks (train.c) and the hashes of prepare (prepare.c). */
#define GHC_FNV1A_BASIS UINT64_C(1469598103934665603)
static inline uint64_t ghc_fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * UINT64_C(1099511628211);
    return h;
}

struct ghc_trainer {
    ghc_core_t        *core;
    struct ghc_train_cfg c;
    ghc_model_t       *model;
    ghc_network_t     *net;
    ghc_optimizer_t   *opt;
    ghc_scheduler_t   *sched;
    ghc_mempolicy_t   *mp;
    ghc_dataset_t     *ds;
    ghc_dataset_t     *vds;             /* held-out validation data, or NULL */
    int                device;
    int32_t            n_experts;       /* of the model */
    double             boundary;        /* sigma of the expert boundary (two experts) */
    /* adapters: one per trained expert (single, separate) or one shared */
    int32_t            n_adapters;
    int32_t            adapter_expert[GHC_TRAIN_MAX_ADAPTERS];  /* the model expert it serves (-1 shared) */
    struct ghc_param  *params[GHC_TRAIN_MAX_ADAPTERS];
    int32_t            n_params[GHC_TRAIN_MAX_ADAPTERS];
    struct ghc_sampler sampler;
    struct ghc_rng     noise_rng;
    /* position (checkpointed) */
    int64_t            step;                     /* optimizer steps done */
    int64_t            adapter_steps[GHC_TRAIN_MAX_ADAPTERS];
    int64_t            bad_total, bad_in_row, samples_seen;
    int32_t            active;                   /* the model expert active now, -1 none */
    /* scratch */
    ghc_tensor_t      *sq, *norms;               /* grad-norm workspace */
    ghc_tboard_t      *tb;
    FILE              *metrics;
    char               out[4096];
    double             t_start;
    int64_t            first_step;               /* the step this process started at (resume) */
    double             loss_ema;
    /* progress for a terminal (ghc_train_opts.progress), and its line drawn last ("" once ended) */
    bool               progress;
    char               line[512];
    /* the data position a resumed run seeks to once its dataset is open */
    bool               resumed;
    int64_t            resume_epoch, resume_cursor;
    /* what the model takes, when it says (ghc_model_input_spec) */
    struct ghc_model_input in;
    bool               have_in;
    bool               demo;                     /* a `demo` section: the data is generated */
    /* What this run wrote into output_dir: a run that fails before its first checkpoint
     * removes it again, so that the folder is as it was and the next run is not refused. */
    char               made_out[4096];           /* the shallowest folder mkdir created, or "" */
    bool               made_resolved, made_demo, made_metrics, made_marker, wrote_checkpoint;
    char               tb_path[8400];            /* the event file this run opened, or "" */
    /* Whose output_dir is: the run's id (in run.json and each checkpoint's trainer.json; a
     * resumed run keeps its checkpoint's), the --resume folder, --overwrite. */
    char               run_id[40];
    const char        *resume;                   /* borrowed from ghc_train_opts, or NULL */
    bool               overwrite;
    bool               log_failed;               /* a write to metrics.jsonl or the events failed */
    bool               profiling;                /* train.profile_steps: CUPTI is recording */
    /* Several ranks (ghc_train_opts.dist; NULL or world 1: one process). Rank 0 is the writer:
     * output_dir, logs, checkpoints, adapters, progress, validation. */
    const struct ghc_train_dist *dist;
    int32_t            rank, world;
    bool               writer;
    bool               dist_stop;                /* a rank was asked to stop: all stop after this step */
    int32_t            resumed_world;            /* the checkpoint's ranks (1 when it says none) */
    ghc_tensor_t      *flat;                     /* the gradients laid end to end for the all-reduce */
};

/* What one optimizer step did, for metrics.jsonl, TensorBoard and the progress line. */
struct ghc_step_report {
    double loss, grad_norm, lr, lr_factor, t_step, t_data, t_fwd_bwd, t_opt;
    int32_t micro_batches, samples, expert;
    bool skipped;
    struct ghc_mem_stats mem;                    /* after the step (zero without a policy) */
};

/* ---- train.c and train_check.c -------------------------------------------------------------- */

/* The sigma range [lo, hi) of model expert e (the whole range with one expert or e < 0). */
void ghc_train_expert_range(const struct ghc_trainer *tr, int32_t e, double *lo, double *hi);
/* Everything that can be checked before output_dir is touched: the sections, the data against
 * the model (the demo's shapes instead of its data), the adapters attached, the resumed
 * checkpoint read. The trainer's resources are released by the caller. */
int ghc_train_prepare(struct ghc_trainer *tr, const struct ghc_train_opts *opts);
/* The training data (and the held-out validation data): opened, checked against the model,
 * and put at the resumed position. */
int ghc_train_open_data(struct ghc_trainer *tr);

/* ---- checkpoint.c --------------------------------------------------------------------------- */

/* output_dir/checkpoint-<step>/, whole or absent; then the oldest of this run's own beyond
 * keep_last go (moved to checkpoint-N.trash, then removed; a failure there is a warning). */
int ghc_checkpoint_write(struct ghc_trainer *tr);
/* Moves the checkpoint folder dir aside (dir.trash) and removes it; `why` ends the log line.
 * A failure is a warning: the run goes on. */
void ghc_checkpoint_trash(struct ghc_trainer *tr, const char *dir, const char *why);
/* Whether dir is a checkpoint this tool wrote (its trainer.json is a gh200core trainer
 * state); run (may be NULL) gets the id of the run that wrote it ("" for none). */
bool ghc_checkpoint_ours(const char *dir, char *run, size_t len);
/* Whether name is "checkpoint-N<suffix>" (N digits only): *step gets N. */
bool ghc_checkpoint_name(const char *name, const char *suffix, int64_t *step);
/* Loads the adapters, params, optimizer state and trainer state of the checkpoint folder dir,
 * refusing one made in another mode or with another number of adapters. */
int ghc_checkpoint_read(struct ghc_trainer *tr, const char *dir);
/* Every adapter's file into dir as <name><suffix>.safetensors; `first` (when not NULL) gets
 * the first one's path. A checkpoint holds them, and so does output_dir at the end. */
int ghc_checkpoint_save_adapters(struct ghc_trainer *tr, const char *dir, char *first, size_t len);
/* The newest checkpoint-N folder in dir: *step gets N, -1 when there is none. */
void ghc_checkpoint_newest(const char *dir, int64_t *step);

/* ---- outdir.c ------------------------------------------------------------------------------- */

/* Creates output_dir with its parents, cleans what a stopped run of its own left there
 * (checkpoint-N.tmp/, checkpoint-N.trash/, *.tmp.XXXXXX), moves aside the checkpoints a
 * resumed run's abandoned continuation wrote past its step, and writes run.json and
 * resolved.cfg, noting what did not exist yet. */
int  ghc_outdir_create(struct ghc_trainer *tr);
/* metrics.jsonl and the TensorBoard event file, for appending; a resumed run first drops what
 * an earlier continuation logged past its step. */
int  ghc_outdir_open_logs(struct ghc_trainer *tr);
void ghc_outdir_close_logs(struct ghc_trainer *tr);
/* One step's line in metrics.jsonl and its TensorBoard scalars (not for a skipped step).
 * GHC_EIO (and tr->log_failed) when a write fails, e.g. the disk is full. */
int  ghc_outdir_record_step(struct ghc_trainer *tr, const struct ghc_step_report *r);
/* The mean validation loss at one sigma, in both files; fails as ghc_outdir_record_step. */
int  ghc_outdir_record_validation(struct ghc_trainer *tr, double sigma, double loss);
/* After a failure before the run's first checkpoint: removes what the run wrote into
 * output_dir (its files closed). The error message stays. */
void ghc_outdir_undo(struct ghc_trainer *tr);
/* Removes path and everything below it; a missing path is no error. */
int  ghc_outdir_remove(ghc_core_t *core, const char *path);

/* ---- progress.c ----------------------------------------------------------------------------- */

/* Seconds on the monotonic clock: the step's phase times and the ETA. */
double ghc_progress_now(void);
/* The run's first line; the clock of the ETA starts. */
void ghc_progress_begin(struct ghc_trainer *tr);
/* The progress line of the step just done, through ghc_log (GHC_LOG_INFO). */
void ghc_progress_step(struct ghc_trainer *tr, const struct ghc_step_report *r);
/* After a stop request: ends a terminal's progress line. */
void ghc_progress_stop(struct ghc_trainer *tr);
/* The run's last line: steps, time, the final loss and the adapter file. */
void ghc_progress_done(struct ghc_trainer *tr, const char *first_file);

#endif /* GHC_TRAIN_IMPL_H */
