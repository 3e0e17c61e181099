/* train.h: the trainer: the flow-matching loop over the run's plugins (model, network,
 * optimizer, scheduler, memory policy) and the dataset, with expert routing, checkpoints,
 * exact resume, metrics and TensorBoard files. `gh200core -c train.cfg` calls it. */
#ifndef GHC_TRAIN_H
#define GHC_TRAIN_H

#include <stdbool.h>

#include <gh200core/core.h>

GHC_BEGIN_DECLS

/* (since API 16) Several ranks training one run, data parallel (doc/distributed.md): what the
 * trainer needs of the other ranks. The CLI gives it from the launcher's environment, the
 * rendezvous and NCCL. Each rank trains its share of every optimizer step's samples (the same
 * global batch as one process), the gradients are summed over the ranks, and rank 0 alone
 * writes output_dir. Every rank calls each function at the same point, in the same order. They
 * return 0 or GHC_E* with ghc_error_set() (another rank gone: GHC_EIO naming it). */
struct ghc_train_dist {
    uint32_t struct_size;   /* sizeof(struct ghc_train_dist) */
    int32_t  rank, world;   /* this rank, the number of ranks (world 1: as without) */
    void    *user;
    /* buf[0..n) (f32, on `device`: GHC_DEVICE_CPU or the CUDA ordinal the model computes on)
     * becomes the sum over the ranks, the same bits on every rank; on a device queued on
     * `stream` without waiting for it. */
    int (*allreduce)(void *user, float *buf, int64_t n, int device, void *stream);
    /* mine[0..len) (host memory) of every rank to rank 0's all[r * len ...] (all is ignored on
     * the other ranks). */
    int (*gather)(void *user, const void *mine, size_t len, void *all);
    /* every rank waits until all have come. */
    int (*barrier)(void *user);
};

struct ghc_train_opts {
    const char *resume;     /* NULL, or a checkpoint folder (output_dir/checkpoint-N) to continue */
    int         progress;   /* 1: a one-line progress bar (a terminal): each step's line is logged
                             * (INFO) starting with '\r' for the sink to redraw in place, and the
                             * line that ends the bar also ends with '\n'; 0: plain lines every
                             * log_every steps */
    int         overwrite;  /* 1: write into an output_dir that holds files (not the --resume
                             * checkpoint's own folder): the run's files of the same names are
                             * replaced, nothing else is removed (appended) */
    const struct ghc_train_dist *dist;  /* (since API 16) NULL: this process is the only rank */
};

/* Train as the run's configuration says (the plugins must be initialised: ghc_run_init).
 * First checks everything ghc_train_check() checks, and only then writes into output_dir
 * (created with its parents): resolved.cfg (the configuration in effect), the demo's data,
 * metrics.jsonl, TensorBoard events, checkpoint-N/ folders and the adapters. A run that
 * fails before its first checkpoint removes what it wrote, so output_dir is as it was.
 * Resumed from checkpoint N into a folder that logged past step N, metrics.jsonl and the
 * event files keep their steps up to N, and the run's checkpoints past N are removed.
 * run.json holds the run's id, which each checkpoint's trainer.json repeats: keep_last prunes
 * only the run's own checkpoints. A failed write to metrics.jsonl or the event file stops
 * the run (GHC_EIO) after a checkpoint where one can be written. Returns 0 when done,
 * GHC_EINTERRUPTED after a stop request (a checkpoint was written), or GHC_E* with the
 * reason in ghc_error_message(core). */
GHC_API int ghc_train(ghc_core_t *core, const struct ghc_train_opts *opts);

/* (since API 11) What ghc_train checks before it writes anything, writing nothing (the CLI's
 * --dry-run): output_dir (ghc_train_check_output), the train section, the data and validation
 * sections opened and every sample checked against what the model takes
 * (ghc_model_input_spec; with a demo section, the demo's shapes instead of its data, which
 * only a run generates), the adapters attached, and opts->resume's checkpoint read. The
 * run's instances are used afterwards: call ghc_run_init() again before ghc_train().
 * Returns 0 or GHC_E*, the message ghc_train would stop with. */
GHC_API int ghc_train_check(ghc_core_t *core, const struct ghc_train_opts *opts);

/* (since API 11) Whether the run may write into output_dir (made absolute first,
 * ghc_config_resolve_output_dir). One run owns its folder: it may when the folder is absent or
 * empty, when opts->resume is a checkpoint folder directly inside it, or with opts->overwrite;
 * else GHC_EEXIST, the message naming the folder and what it holds (for an earlier run, its
 * resolved.cfg, the newest checkpoint to --resume, or that it has none). GHC_ENOTFOUND when
 * opts->resume names no folder. Cheap: the CLI asks before it loads the plugins. */
GHC_API int ghc_train_check_output(ghc_core_t *core, const struct ghc_train_opts *opts);

/* The keys the core declares for its own sections "train" and "demo" (doc/config.md), or
 * NULL for another name. */
GHC_API const struct ghc_cfg_key *ghc_train_section_keys(const char *section);

/* ---- prepare (since API 16): media to caches ---------------------------------------------- */

/* `data.prepare`: whether `gh200core -c` runs ghc_prepare before training. */
enum ghc_prepare_mode {
    GHC_PREPARE_AUTO = 0,   /* encode what is missing or stale (the default) */
    GHC_PREPARE_NEVER,      /* train on the caches as they are */
    GHC_PREPARE_ALWAYS,     /* encode everything again */
};
struct ghc_prepare_stats {
    int64_t files;          /* media files seen */
    int64_t encoded;        /* of them encoded now */
    int64_t clips;          /* clips (samples) written */
    int64_t up_to_date;     /* files whose caches matched their hash */
    int64_t skipped;        /* bad files skipped (skip_bad_samples) */
    double  seconds;
};
/* The configuration's data.prepare (GHC_PREPARE_AUTO when absent). Returns 0 or GHC_ECONFIG. */
GHC_API int ghc_prepare_mode(ghc_core_t *core, int *mode);
/* Encode every media dataset of the `data` section (media.h: a folder of videos and images
 * with captions; folders without media, absent folders and a configuration without datasets
 * are left alone: nothing to do) with the configuration's `vae` and
 * `text_encoder` (encoder.h, loaded when first needed) into gh200core caches beside the media
 * (doc/prepare.md): per clip <stem>.latent.safetensors and <stem>.text.safetensors, bf16, a
 * hidden manifest per media file holding the hash of its bytes, caption and settings; a file
 * whose manifest matches is not read again (unless force). The empty prompt's embedding goes
 * to the first media folder's .gh200core-empty-prompt.safetensors, and data.empty_prompt
 * names it when unset. A bad file is an error naming it, or with data.skip_bad_samples a
 * counted skip. out (may be NULL) gets the counts. Returns 0 or GHC_E*. */
GHC_API int ghc_prepare(ghc_core_t *core, bool force, struct ghc_prepare_stats *out);

/* Ask a running ghc_train() to finish its step, write a checkpoint and return. Safe in a
 * signal handler; `sig` is remembered (ghc_train_stop_signal). */
GHC_API void ghc_train_request_stop(int sig);
/* The signal of the last stop request, 0 when none. */
GHC_API int  ghc_train_stop_signal(void);

GHC_END_DECLS

#endif /* GHC_TRAIN_H */
