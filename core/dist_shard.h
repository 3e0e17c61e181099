/* dist_shard.h: the deterministic share of an optimizer step's samples that each of several
 * ranks trains (issue 25). Pure arithmetic, in the trainer's library (core/train.c) and the
 * test of core/dist.c. */
#ifndef GHC_DIST_SHARD_H
#define GHC_DIST_SHARD_H

#include <stdint.h>

/* A run of consecutive positions of an epoch's order (a micro-batch, or a part of one). */
struct ghc_dist_span {
    int64_t epoch, start, n;
};

/* Rank `rank`'s share of one optimizer step. `step` holds the micro-batches one process
 * serves for that step (n_step of them, in order: with gradient accumulation GA and batch B
 * the global batch is GA micro-batches of up to B samples). The step's S samples, laid end to
 * end, are cut into `world` runs: rank r takes samples [S r / W, S (r + 1) / W), split where
 * micro-batches end, so every span stacks. Together the ranks serve exactly the step's samples,
 * each once; with GA a multiple of W and full batches every rank gets GA / W whole
 * micro-batches. Writes at most n_step + 1 spans to out; returns their number, or -1 for
 * rank/world out of range. */
int ghc_dist_shard_step(const struct ghc_dist_span *step, int n_step, int rank, int world, struct ghc_dist_span *out);

#endif /* GHC_DIST_SHARD_H */
