/* data_order.c: the order samples are served in: buckets (one latent shape and served dtype,
 * so that a batch stacks), the slots of an epoch (repeats and weights), the shuffles, the text
 * dropout decisions and the position (tell and seek).
 *
 * Determinism: every random choice is a counter-based hash of (seed, epoch, purpose, index)
 * (splitmix64), never a generator that carries state from batch to batch; so the order of an
 * epoch, the weighted picks and the dropout decision of the sample at position p are pure
 * functions of (seed, epoch, p), and seek() needs nothing but (epoch, cursor). */
#include <config.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dataset_impl.h"

/* ---- counter-based random numbers ------------------------------------------------------------ */

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Purposes, so that two decisions never share a stream. */
enum { R_PICK = 1, R_BUCKET, R_BATCHES, R_DROPOUT };

static uint64_t rnd(uint64_t seed, int64_t epoch, uint64_t purpose, uint64_t a, uint64_t b)
{
    return mix64(mix64(mix64(mix64(seed ^ 0x6768633230306461ull) ^ (uint64_t)epoch) ^ purpose) ^ a) ^ mix64(b);
}

/* Uniform in [0, n) (multiply-shift; n < 2^63). */
static uint64_t below(uint64_t r, uint64_t n) { return (uint64_t)(((unsigned __int128)r * n) >> 64); }

/* Fisher-Yates over v[0..n) with the stream (seed, epoch, purpose, a). */
static void shuffle(int64_t *v, int64_t n, uint64_t seed, int64_t epoch, uint64_t purpose, uint64_t a)
{
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)below(rnd(seed, epoch, purpose, a, (uint64_t)i), (uint64_t)i + 1);
        int64_t t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
}

/* ---- buckets --------------------------------------------------------------------------------- */

int ghc_data_buckets_make(ghc_dataset_t *ds)
{
    for (int64_t i = 0; i < ds->n_samples; i++) {
        struct data_sample *s = &ds->samples[i];
        enum ghc_dtype dt = ghc_data_served_dtype(s->lat_dtype);
        int32_t b;
        for (b = 0; b < ds->n_buckets; b++)
            if (ds->buckets[b].dtype == dt && memcmp(ds->buckets[b].shape, s->lat_shape, sizeof(s->lat_shape)) == 0)
                break;
        if (b == ds->n_buckets) {
            struct data_bucket *nb = realloc(ds->buckets, (size_t)(b + 1) * sizeof(*nb));
            if (!nb)
                return ghc_error_set(ds->core, GHC_ENOMEM, "data: out of memory");
            ds->buckets = nb;
            ds->buckets[b] = (struct data_bucket){ .dtype = dt };
            memcpy(ds->buckets[b].shape, s->lat_shape, sizeof(s->lat_shape));
            ds->n_buckets++;
        }
        ds->buckets[b].count++;
        s->bucket = b;
    }
    ds->epoch_size = 0;
    for (int32_t d = 0; d < ds->n_sets; d++) {
        struct data_set *set = &ds->sets[d];
        set->slots = (int64_t)llround((double)set->n * (double)set->repeats * set->weight);
        ds->epoch_size += set->slots;
    }
    return 0;
}

/* ---- the order of an epoch ------------------------------------------------------------------- */

int ghc_data_order_build(ghc_dataset_t *ds, int64_t epoch)
{
    if (ds->order_epoch == epoch)
        return 0;
    int rc = 0;
    int64_t *slots = malloc((size_t)(ds->epoch_size ? ds->epoch_size : 1) * sizeof(*slots));
    int64_t *pick = NULL;
    int64_t *fill = calloc((size_t)ds->n_buckets + 1, sizeof(*fill));
    int64_t *bstart = calloc((size_t)ds->n_buckets + 1, sizeof(*bstart));
    int64_t nb_max = ds->epoch_size;   /* batches <= slots */
    struct data_order_batch *batches = malloc((size_t)(nb_max ? nb_max : 1) * sizeof(*batches));
    int64_t *border = malloc((size_t)(nb_max ? nb_max : 1) * sizeof(*border));
    int64_t max_n = 1;
    for (int32_t d = 0; d < ds->n_sets; d++)
        if (ds->sets[d].n > max_n)
            max_n = ds->sets[d].n;
    pick = malloc((size_t)max_n * sizeof(*pick));
    if (!slots || !fill || !bstart || !batches || !border || !pick) {
        rc = ghc_error_set(ds->core, GHC_ENOMEM, "data: out of memory for the order of %lld samples",
                           (long long)ds->epoch_size);
        goto out;
    }
    /* 1. slots per bucket: repeats, and the weighted remainder as a seeded pick */
    int64_t *count = fill;  /* first pass: samples per bucket */
    for (int32_t d = 0; d < ds->n_sets; d++) {
        struct data_set *set = &ds->sets[d];
        if (!set->n)
            continue;
        int64_t full = set->slots / set->n, rem = set->slots % set->n;
        for (int64_t i = 0; i < set->n; i++)
            count[ds->samples[set->first + i].bucket] += full;
        for (int64_t i = 0; i < set->n; i++)
            pick[i] = set->first + i;
        shuffle(pick, set->n, ds->seed, epoch, R_PICK, (uint64_t)d);
        for (int64_t i = 0; i < rem; i++)
            count[ds->samples[pick[i]].bucket]++;
    }
    for (int32_t b = 0; b < ds->n_buckets; b++) {
        bstart[b + 1] = bstart[b] + count[b];
        count[b] = 0;
    }
    int64_t *pos = fill;    /* second pass: fill positions */
    for (int32_t d = 0; d < ds->n_sets; d++) {
        struct data_set *set = &ds->sets[d];
        if (!set->n)
            continue;
        int64_t full = set->slots / set->n, rem = set->slots % set->n;
        for (int64_t r = 0; r < full; r++)
            for (int64_t i = 0; i < set->n; i++) {
                int32_t b = ds->samples[set->first + i].bucket;
                slots[bstart[b] + pos[b]++] = set->first + i;
            }
        for (int64_t i = 0; i < set->n; i++)
            pick[i] = set->first + i;
        shuffle(pick, set->n, ds->seed, epoch, R_PICK, (uint64_t)d);
        for (int64_t i = 0; i < rem; i++) {
            int32_t b = ds->samples[pick[i]].bucket;
            slots[bstart[b] + pos[b]++] = pick[i];
        }
    }
    /* 2. shuffle inside each bucket, cut into batches */
    int64_t nb = 0;
    for (int32_t b = 0; b < ds->n_buckets; b++) {
        int64_t n = bstart[b + 1] - bstart[b];
        if (ds->shuffle)
            shuffle(slots + bstart[b], n, ds->seed, epoch, R_BUCKET, (uint64_t)b);
        for (int64_t o = 0; o < n; o += ds->batch_size) {
            batches[nb].start = bstart[b] + o;
            batches[nb].n = (int32_t)(n - o < ds->batch_size ? n - o : ds->batch_size);
            nb++;
        }
    }
    /* 3. shuffle the batches; lay the samples out in that order */
    for (int64_t i = 0; i < nb; i++)
        border[i] = i;
    if (ds->shuffle)
        shuffle(border, nb, ds->seed, epoch, R_BATCHES, 0);
    free(ds->order);
    free(ds->batches);
    ds->order = malloc((size_t)(ds->epoch_size ? ds->epoch_size : 1) * sizeof(*ds->order));
    ds->batches = malloc((size_t)(nb ? nb : 1) * sizeof(*ds->batches));
    if (!ds->order || !ds->batches) {
        ds->order_epoch = -1;
        rc = ghc_error_set(ds->core, GHC_ENOMEM, "data: out of memory for the order");
        goto out;
    }
    int64_t at = 0;
    for (int64_t i = 0; i < nb; i++) {
        const struct data_order_batch *src = &batches[border[i]];
        memcpy(ds->order + at, slots + src->start, (size_t)src->n * sizeof(*ds->order));
        ds->batches[i] = (struct data_order_batch){ .start = at, .n = src->n };
        at += src->n;
    }
    ds->n_batches = nb;
    ds->order_epoch = epoch;
out:
    free(slots);
    free(pick);
    free(fill);
    free(bstart);
    free(batches);
    free(border);
    return rc;
}

bool ghc_data_text_dropped(const ghc_dataset_t *ds, int64_t epoch, int64_t cursor)
{
    if (ds->text_dropout <= 0.0)
        return false;
    double u = (double)(rnd(ds->seed, epoch, R_DROPOUT, (uint64_t)cursor, 0) >> 11) * 0x1.0p-53;
    return u < ds->text_dropout;
}

/* ---- the position ---------------------------------------------------------------------------- */

int ghc_dataset_tell(ghc_dataset_t *ds, int64_t *epoch, int64_t *cursor)
{
    *epoch = ds->pos_epoch;
    *cursor = 0;
    if (ds->pos_batch > 0) {          /* then the order of pos_epoch is built */
        int rc = ghc_data_order_build(ds, ds->pos_epoch);
        if (rc < 0)
            return rc;
        *cursor = ds->batches[ds->pos_batch].start;
    }
    return 0;
}

int ghc_dataset_seek(ghc_dataset_t *ds, int64_t epoch, int64_t cursor)
{
    if (epoch < 0 || cursor < 0 || cursor > ds->epoch_size)
        return ghc_error_set(ds->core, GHC_EINVAL, "data: seek to epoch %lld cursor %lld: out of range "
                             "(epochs from 0, cursors 0..%lld)", (long long)epoch, (long long)cursor,
                             (long long)ds->epoch_size);
    if (cursor == ds->epoch_size) {
        epoch++;
        cursor = 0;
    }
    int rc = ghc_data_order_build(ds, epoch);
    if (rc < 0)
        return rc;
    /* batches are laid out in order: binary search for the one starting at cursor */
    int64_t lo = 0, hi = ds->n_batches;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (ds->batches[mid].start < cursor)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo >= ds->n_batches || ds->batches[lo].start != cursor) {
        int64_t before = lo > 0 ? ds->batches[lo - 1].start : 0;
        int64_t after = lo < ds->n_batches ? ds->batches[lo].start : ds->epoch_size;
        return ghc_error_set(ds->core, GHC_EINVAL, "data: seek: cursor %lld is not the start of a batch of epoch %lld "
                             "(nearest: %lld and %lld); use a position from ghc_dataset_tell",
                             (long long)cursor, (long long)epoch, (long long)before, (long long)after);
    }
    ds->pos_epoch = epoch;
    ds->pos_batch = lo;
    return 0;
}
