/* train.h: the trainer: the flow-matching loop over the run's plugins (model, network,
 * optimizer, scheduler, memory policy) and the dataset, with expert routing, checkpoints,
 * exact resume, metrics and TensorBoard files. `gh200core -c train.cfg` calls it. */
#ifndef GHC_TRAIN_H
#define GHC_TRAIN_H

#include <gh200core/core.h>

GHC_BEGIN_DECLS

struct ghc_train_opts {
    const char *resume;     /* NULL, or a checkpoint folder (output_dir/checkpoint-N) to continue */
    int         progress;   /* 1: a one-line progress bar (a terminal), 0: plain lines */
};

/* Train as the run's configuration says (the plugins must be initialised: ghc_run_init).
 * Writes into output_dir: adapters, checkpoint-N/ folders, metrics.jsonl, TensorBoard events.
 * Returns 0 when done, GHC_EINTERRUPTED after a stop request (a checkpoint was written), or
 * GHC_E* with the reason in ghc_error_message(core). */
GHC_API int ghc_train(ghc_core_t *core, const struct ghc_train_opts *opts);

/* The keys the core declares for its own sections "train" and "demo" (doc/config.md), or
 * NULL for another name. */
GHC_API const struct ghc_cfg_key *ghc_train_section_keys(const char *section);

/* Ask a running ghc_train() to finish its step, write a checkpoint and return. Safe in a
 * signal handler; `sig` is remembered (ghc_train_stop_signal). */
GHC_API void ghc_train_request_stop(int sig);
/* The signal of the last stop request, 0 when none. */
GHC_API int  ghc_train_stop_signal(void);

GHC_END_DECLS

#endif /* GHC_TRAIN_H */
