/* dist_shard.c: the share of a step each rank trains (dist_shard.h). */
#include <config.h>

#include "dist_shard.h"

int ghc_dist_shard_step(const struct ghc_dist_span *step, int n_step, int rank, int world, struct ghc_dist_span *out)
{
    if (world < 1 || rank < 0 || rank >= world || n_step < 0)
        return -1;
    int64_t total = 0;
    for (int i = 0; i < n_step; i++)
        total += step[i].n;
    /* rank r: samples [lo, hi) of the step; a span that straddles a boundary is cut there */
    int64_t lo = total * rank / world, hi = total * (rank + 1) / world, at = 0;
    int k = 0;
    for (int i = 0; i < n_step; i++) {
        int64_t a = at > lo ? at : lo, b = at + step[i].n < hi ? at + step[i].n : hi;
        if (a < b)
            out[k++] = (struct ghc_dist_span){ .epoch = step[i].epoch, .start = step[i].start + (a - at), .n = b - a };
        at += step[i].n;
    }
    return k;
}
