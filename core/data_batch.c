/* data_batch.c: batches: each sample's tensors from the cache (or decoded now), checked against
 * what its header said, stacked into one batch (f16 served as f32, texts padded to the longest
 * with a mask, a dropped text replaced by the empty prompt's embedding), copied to a CUDA
 * device (ghc_op_copy), and the next batch's samples prefetched. */
#include <config.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gh200core/ops.h>     /* defines: ghc_op_copy */

#include "dataset_impl.h"
#include "elem.h"                /* defines: ghc_cpu_load */

/* ---- a sample's tensors ---------------------------------------------------------------------- */

/* One sample's tensor of `kind` at (epoch, cursor): from the cache (pinned), else decoded now;
 * an augmented clip's latent from data_aug.c. put_tensor() gives it back the same way. */
static int get_tensor(ghc_dataset_t *ds, int64_t idx, int64_t epoch, int64_t cursor, enum ghc_sample_kind kind,
                      ghc_tensor_t **out)
{
    const struct data_sample *s = &ds->samples[idx];
    if (kind == GHC_SAMPLE_LATENT && s->aug1)
        return ghc_data_aug_latent(ds, idx, epoch, cursor, out);
    if (ds->cache)
        return ghc_cache_sample(ds->cache, idx, kind, out);
    return ghc_cache_decode(ds->core, ds->backend, s->file[kind], s->key[kind], ghc_sample_kind_role(kind), out);
}

static void put_tensor(ghc_dataset_t *ds, int64_t idx, enum ghc_sample_kind kind, ghc_tensor_t *t)
{
    if (!t)
        return;
    if (ds->cache && !(kind == GHC_SAMPLE_LATENT && ds->samples[idx].aug1))
        ghc_cache_release(ds->cache, idx, kind, t);
    else
        ghc_tensor_free(t);
}

/* Copy (converting when the dtypes differ) n elements from src into dst at element offset
 * `at`. Both CPU. */
static int copy_rows(ghc_dataset_t *ds, ghc_tensor_t *dst, int64_t at, const ghc_tensor_t *src, int64_t n)
{
    enum ghc_dtype dt = ghc_tensor_dtype(dst), st = ghc_tensor_dtype(src);
    size_t esz = ghc_dtype_size(dt);
    char *d = (char *)ghc_tensor_data(dst) + (size_t)at * esz;
    if (dt == st) {
        memcpy(d, ghc_tensor_cdata(src), (size_t)n * esz);
        return 0;
    }
    int64_t flat[1] = { n };
    ghc_tensor_t *dv = ghc_tensor_wrap(ds->core, dt, 1, flat, GHC_DEVICE_CPU, d);
    ghc_tensor_t *sv = ghc_tensor_wrap(ds->core, st, 1, flat, GHC_DEVICE_CPU, (void *)ghc_tensor_cdata(src));
    int rc = dv && sv ? ghc_tensor_convert_cpu(dv, sv, 1.0f) : GHC_ENOMEM;
    ghc_tensor_free(dv);
    ghc_tensor_free(sv);
    return rc;
}

/* Check a decoded tensor against what the header said (the file may change after open), and
 * its values: a NaN or an infinity in a latent, noise or text embedding, or a stored timestep
 * outside (0, 1000], is the sample's file's fault, named here (the caller makes it a bad
 * sample) rather than a non-finite loss after the forward. */
static int check_decoded(ghc_dataset_t *ds, int64_t idx, enum ghc_sample_kind kind, const ghc_tensor_t *t)
{
    const struct data_sample *s = &ds->samples[idx];
    char disk[4400], buf[96];
    bool ok;
    if (kind == GHC_SAMPLE_LATENT || kind == GHC_SAMPLE_NOISE)
        ok = ghc_tensor_ndim(t) == 4 && ghc_tensor_dtype(t) == s->lat_dtype &&
             memcmp(ghc_tensor_shape(t), s->lat_shape, sizeof(s->lat_shape)) == 0;
    else if (kind == GHC_SAMPLE_TEXT_EMBED)
        ok = ghc_tensor_dim(t, -2) == s->txt_len && ghc_tensor_dim(t, -1) == ds->text_dim;
    else
        ok = ghc_tensor_numel(t) == 1;
    ghc_data_disk_name(ds, s->file[kind], disk, sizeof(disk));
    if (!ok)
        return ghc_error_set(ds->core, GHC_EFORMAT, "%s: \"%s\" is now %s, not what it was when the dataset was opened",
                             disk, s->key[kind], ghc_tensor_describe(t, buf, sizeof(buf)));
    int64_t bad = ghc_tensor_find_nonfinite(t);
    float v = ghc_cpu_load(ghc_tensor_cdata(t), ghc_tensor_dtype(t), bad < 0 ? 0 : bad);
    if (bad >= 0)
        return ghc_error_set(ds->core, GHC_EFORMAT, "%s: \"%s\": element %lld is %g (a non-finite value)", disk,
                             s->key[kind], (long long)bad, (double)v);
    if (kind == GHC_SAMPLE_TIMESTEP && !(v > 0.0f && v <= 1000.0f))
        return ghc_error_set(ds->core, GHC_EFORMAT, "%s: \"%s\" is %g: a stored timestep is in (0, 1000]", disk,
                             s->key[kind], (double)v);
    return 0;
}

/* ---- the empty prompt ------------------------------------------------------------------------ */

/* Each dataset's ai-toolkit blank embedding (found by ghc_aitk_pair), for its dropped texts where
 * data.empty_prompt is not given. One file serves every item: ai-toolkit writes one per item,
 * each the encoder output of the same dropout caption. A file that cannot serve is a
 * warning: its dataset's dropped texts stay zeros. */
int ghc_data_blanks_load(ghc_dataset_t *ds)
{
    for (int32_t d = 0; d < ds->n_sets; d++) {
        struct data_set *set = &ds->sets[d];
        if (!set->blank_file || ds->empty)
            continue;
        char disk[4400], buf[96];
        ghc_tensor_t *raw = NULL;
        int rc = ghc_cache_decode(ds->core, ds->backend, set->blank_file, "text_embed", GHC_ROLE_TEXT_EMBEDS, &raw);
        ghc_data_disk_name(ds, set->blank_file, disk, sizeof(disk));
        if (rc == 0) {
            int nd = ghc_tensor_ndim(raw);
            int64_t sh[2] = { ghc_tensor_dim(raw, -2), ghc_tensor_dim(raw, -1) };
            if (!(nd == 2 || (nd == 3 && ghc_tensor_dim(raw, 0) == 1)) || sh[0] < 1 || sh[1] != ds->text_dim ||
                !ghc_dtype_is_float(ghc_tensor_dtype(raw)))
                rc = ghc_error_set(ds->core, GHC_EFORMAT, "\"text_embed\" is %s, expected [1, L, %lld]",
                                   ghc_tensor_describe(raw, buf, sizeof(buf)), (long long)ds->text_dim);
            else if (!(set->empty = ghc_tensor_init(ds->core, GHC_DTYPE_F32, 2, sh, GHC_DEVICE_CPU,
                                                    GHC_ROLE_TEXT_EMBEDS)))
                rc = ghc_error_code(ds->core) ? ghc_error_code(ds->core) : GHC_ENOMEM;
            else
                rc = copy_rows(ds, set->empty, 0, raw, sh[0] * sh[1]);
        }
        ghc_tensor_free(raw);
        if (rc == GHC_ENOMEM)
            return rc;
        if (rc < 0) {
            ghc_log(ds->core, GHC_LOG_WARN, "data: dataset %d (%s): the blank-caption embedding %s cannot serve text "
                    "dropout (%s): dropped texts are zeros", (int)d, set->path, disk, ghc_error_message(ds->core));
            ghc_error_clear(ds->core);
            ghc_tensor_free(set->empty);
            set->empty = NULL;
            continue;
        }
        ghc_log(ds->core, GHC_LOG_INFO, "data: dataset %d (%s): dropped texts get ai-toolkit's embedding of the "
                "dropout caption \"%s\", %s (ai-toolkit writes one per item, all the same encoder output: one "
                "serves every item)", (int)d, set->path, set->blank_caption, disk);
    }
    return 0;
}

/* The embedding a dropped text of sample idx gets: data.empty_prompt, else its dataset's
 * ai-toolkit blank embedding, else NULL (zeros of its own length). */
static const ghc_tensor_t *empty_for(const ghc_dataset_t *ds, int64_t idx)
{
    return ds->empty ? ds->empty : ds->sets[ds->samples[idx].ds].empty;
}

/* ---- batches --------------------------------------------------------------------------------- */

/* Assemble samples [off, off + count) of batch `bi` of the current order on the CPU. */
static int assemble(ghc_dataset_t *ds, int64_t epoch, int64_t bi, int32_t off, int32_t count,
                    struct ghc_data_batch *out)
{
    const struct data_order_batch *ob = &ds->batches[bi];
    int64_t first = ob->start + off;
    int32_t n = count;
    int rc = ghc_data_aug_epoch(ds, epoch);   /* refresh_each_epoch: the epoch's augmented clips */
    if (rc < 0) {
        memset(out, 0, sizeof(*out));
        return rc;
    }
    ghc_tensor_t **lat = calloc((size_t)n, sizeof(*lat));
    ghc_tensor_t **txt = calloc((size_t)n, sizeof(*txt));
    ghc_tensor_t **noi = calloc((size_t)n, sizeof(*noi));
    ghc_tensor_t **tim = calloc((size_t)n, sizeof(*tim));
    int64_t *index = calloc((size_t)n, sizeof(*index));
    bool *drop = calloc((size_t)n, sizeof(*drop));
    memset(out, 0, sizeof(*out));
    if (!lat || !txt || !noi || !tim || !index || !drop) {
        rc = ghc_error_set(ds->core, GHC_ENOMEM, "data: out of memory");
        goto out;
    }
    /* fetch; a bad sample fails the batch or, with skip_bad_samples, leaves it */
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        int64_t idx = ds->order[first + i];
        const struct data_sample *s = &ds->samples[idx];
        int r = get_tensor(ds, idx, epoch, first + i, GHC_SAMPLE_LATENT, &lat[m]);
        if (r == 0)
            r = check_decoded(ds, idx, GHC_SAMPLE_LATENT, lat[m]);
        bool drop_it = ghc_data_text_dropped(ds, epoch, first + i);
        if (r == 0 && !(drop_it)) {
            r = get_tensor(ds, idx, epoch, first + i, GHC_SAMPLE_TEXT_EMBED, &txt[m]);
            if (r == 0)
                r = check_decoded(ds, idx, GHC_SAMPLE_TEXT_EMBED, txt[m]);
        }
        if (r == 0 && s->file[GHC_SAMPLE_NOISE] &&
            (r = get_tensor(ds, idx, epoch, first + i, GHC_SAMPLE_NOISE, &noi[m])) == 0)
            r = check_decoded(ds, idx, GHC_SAMPLE_NOISE, noi[m]);
        if (r == 0 && s->file[GHC_SAMPLE_TIMESTEP] &&
            (r = get_tensor(ds, idx, epoch, first + i, GHC_SAMPLE_TIMESTEP, &tim[m])) == 0)
            r = check_decoded(ds, idx, GHC_SAMPLE_TIMESTEP, tim[m]);
        if (r < 0) {
            char msg[GHC_ERROR_MAX];
            snprintf(msg, sizeof(msg), "%s", ghc_error_message(ds->core));
            put_tensor(ds, idx, GHC_SAMPLE_LATENT, lat[m]);
            put_tensor(ds, idx, GHC_SAMPLE_TEXT_EMBED, txt[m]);
            put_tensor(ds, idx, GHC_SAMPLE_NOISE, noi[m]);
            put_tensor(ds, idx, GHC_SAMPLE_TIMESTEP, tim[m]);
            lat[m] = txt[m] = noi[m] = tim[m] = NULL;
            if ((rc = ghc_data_bad_sample(ds, r, "%s", msg)) < 0)
                goto out_put;
            out->skipped++;
            continue;
        }
        index[m] = idx;
        drop[m] = drop_it;
        m++;
    }
    rc = 0;
    out->n = m;
    out->epoch = epoch;
    out->cursor = first;
    out->index = index;
    out->text_dropped = drop;
    if (m == 0)
        goto out_put;
    /* the bucket's dtype as served: the samples' own (f16 and f32 ones widened) convert */
    const struct data_sample *s0 = &ds->samples[index[0]];
    enum ghc_dtype ldt = ds->buckets[s0->bucket].dtype;
    int64_t C = s0->lat_shape[0], F = s0->lat_shape[1], H = s0->lat_shape[2], W = s0->lat_shape[3];
    int64_t per = C * F * H * W;
    int64_t lshape[5] = { m, C, F, H, W };
    /* text: the longest L; bf16 when every embedding served is bf16, else f32, so that no
     * text is rounded (all dropped: the first sample's file's dtype, as served) */
    int64_t L = 1, D = ds->text_dim;
    enum ghc_dtype tdt = GHC_DTYPE_BF16;
    bool have_t = false;
    for (int32_t i = 0; i < m; i++) {
        const ghc_tensor_t *e = empty_for(ds, index[i]);
        int64_t l = drop[i] ? (e ? ghc_tensor_dim(e, 0) : ds->samples[index[i]].txt_len) : ghc_tensor_dim(txt[i], -2);
        if (l > L)
            L = l;
        if (!drop[i]) {
            have_t = true;
            if (ghc_tensor_dtype(txt[i]) != GHC_DTYPE_BF16)
                tdt = GHC_DTYPE_F32;
        }
    }
    if (!have_t)
        tdt = ghc_data_served_dtype(ds->samples[index[0]].txt_dtype);
    int64_t tshape[3] = { m, L, D }, mshape[2] = { m, L }, bshape[1] = { m };
    bool all_noise = true, all_t = true;
    for (int32_t i = 0; i < m; i++) {
        all_noise &= noi[i] != NULL;
        all_t &= tim[i] != NULL;
    }
    if (!(out->latents = ghc_tensor_init(ds->core, ldt, 5, lshape, GHC_DEVICE_CPU, GHC_ROLE_LATENTS)) ||
        !(out->text_embed = ghc_tensor_init(ds->core, tdt, 3, tshape, GHC_DEVICE_CPU, GHC_ROLE_TEXT_EMBEDS)) ||
        !(out->text_mask = ghc_tensor_init(ds->core, GHC_DTYPE_F32, 2, mshape, GHC_DEVICE_CPU, GHC_ROLE_MASKS)) ||
        (all_noise && !(out->noise = ghc_tensor_init(ds->core, ldt, 5, lshape, GHC_DEVICE_CPU, GHC_ROLE_LATENTS))) ||
        (all_t && !(out->timesteps = ghc_tensor_init(ds->core, GHC_DTYPE_F32, 1, bshape, GHC_DEVICE_CPU, GHC_ROLE_MASKS)))) {
        rc = ghc_error_code(ds->core) ? ghc_error_code(ds->core) : GHC_ENOMEM;
        goto out_put;
    }
    memset(ghc_tensor_data(out->text_embed), 0, ghc_tensor_nbytes(out->text_embed));
    float *mask = ghc_tensor_data(out->text_mask);
    memset(mask, 0, ghc_tensor_nbytes(out->text_mask));
    for (int32_t i = 0; i < m && rc == 0; i++) {
        rc = copy_rows(ds, out->latents, (int64_t)i * per, lat[i], per);
        if (all_noise && rc == 0)
            rc = copy_rows(ds, out->noise, (int64_t)i * per, noi[i], per);
        if (all_t && rc == 0) {
            ghc_tensor_t *one = NULL;
            int64_t sh1[1] = { 1 };
            one = ghc_tensor_wrap(ds->core, GHC_DTYPE_F32, 1, sh1, GHC_DEVICE_CPU,
                                  (float *)ghc_tensor_data(out->timesteps) + i);
            rc = one ? copy_rows(ds, one, 0, tim[i], 1) : GHC_ENOMEM;
            ghc_tensor_free(one);
        }
        int64_t l;
        const ghc_tensor_t *e = empty_for(ds, index[i]);
        if (!drop[i]) {
            l = ghc_tensor_dim(txt[i], -2);
            rc = rc ? rc : copy_rows(ds, out->text_embed, (int64_t)i * L * D, txt[i], l * D);
        } else if (e) {
            l = ghc_tensor_dim(e, 0);
            rc = rc ? rc : copy_rows(ds, out->text_embed, (int64_t)i * L * D, e, l * D);
        } else {
            l = ds->samples[index[i]].txt_len;   /* zeros, already there */
        }
        for (int64_t r = 0; r < l; r++)
            mask[(int64_t)i * L + r] = 1.0f;
        if (drop[i])
            ds->st.text_dropped++;
    }
out_put:
    for (int32_t i = 0; i < m; i++) {
        put_tensor(ds, index[i], GHC_SAMPLE_LATENT, lat[i]);
        put_tensor(ds, index[i], GHC_SAMPLE_TEXT_EMBED, txt[i]);
        put_tensor(ds, index[i], GHC_SAMPLE_NOISE, noi[i]);
        put_tensor(ds, index[i], GHC_SAMPLE_TIMESTEP, tim[i]);
    }
out:
    free(lat);
    free(txt);
    free(noi);
    free(tim);
    if (rc < 0 || !out->index) {
        ghc_tensor_free(out->latents);
        ghc_tensor_free(out->text_embed);
        ghc_tensor_free(out->text_mask);
        ghc_tensor_free(out->noise);
        ghc_tensor_free(out->timesteps);
        free(index);
        free(drop);
        memset(out, 0, sizeof(*out));
    }
    return rc;
}

/* The host side of a device batch, kept until release: the asynchronous copies read it. */
struct host_side {
    ghc_tensor_t *t[5];
};

/* Move a batch's tensors to `device` (ghc_op_copy, queued on `stream`). */
static int to_device(ghc_dataset_t *ds, struct ghc_data_batch *b, int device, void *stream)
{
    struct host_side *hs = calloc(1, sizeof(*hs));
    if (!hs)
        return ghc_error_set(ds->core, GHC_ENOMEM, "data: out of memory");
    b->priv = hs;
    ghc_tensor_t **slots[5] = { &b->latents, &b->text_embed, &b->text_mask, &b->noise, &b->timesteps };
    for (int i = 0; i < 5; i++) {
        ghc_tensor_t *h = *slots[i];
        if (!h)
            continue;
        ghc_tensor_t *d = ghc_tensor_init(ds->core, ghc_tensor_dtype(h), ghc_tensor_ndim(h), ghc_tensor_shape(h),
                                          device, ghc_tensor_role(h));
        if (!d)
            return ghc_error_code(ds->core) ? ghc_error_code(ds->core) : GHC_ENOMEM;
        int rc = ghc_op_copy(d, h, stream);
        if (rc < 0) {
            ghc_tensor_free(d);
            return rc;
        }
        *slots[i] = d;
        hs->t[i] = h;
    }
    return 0;
}

/* An assembled batch to `device`, counted in the statistics (t0: when the wait began). */
static int serve(ghc_dataset_t *ds, struct ghc_data_batch *out, int device, void *stream, double t0)
{
    int rc;
    if (device != GHC_DEVICE_CPU && (rc = to_device(ds, out, device, stream)) < 0) {
        ghc_data_batch_release(ds, out);
        return rc;
    }
    double w = ghc_data_seconds() - t0;
    ds->st.wait_seconds += w;
    if (w > ds->st.max_wait_seconds)
        ds->st.max_wait_seconds = w;
    ds->st.batches++;
    ds->st.bytes += ghc_tensor_nbytes(out->latents) + ghc_tensor_nbytes(out->text_embed);
    return 0;
}

int ghc_dataset_next(ghc_dataset_t *ds, int device, void *stream, struct ghc_data_batch *out)
{
    memset(out, 0, sizeof(*out));
    double t0 = ghc_data_seconds();
    int rc;
    for (;;) {
        if ((rc = ghc_data_order_build(ds, ds->pos_epoch)) < 0)
            return rc;
        if (ds->pos_batch >= ds->n_batches) {
            ds->pos_epoch++;
            ds->pos_batch = 0;
            continue;
        }
        int64_t bi = ds->pos_batch++, epoch = ds->pos_epoch;
        if (ds->pos_batch == ds->n_batches) {   /* the position is always a batch that exists */
            ds->pos_epoch++;
            ds->pos_batch = 0;
        }
        if ((rc = assemble(ds, epoch, bi, 0, ds->batches[bi].n, out)) < 0)
            return rc;
        if (out->n > 0)
            break;
        ghc_data_batch_release(ds, out);   /* every sample bad and skipped: the next batch */
    }
    if ((rc = serve(ds, out, device, stream, t0)) < 0)
        return rc;
    /* prefetch the following batch's samples through the cache */
    if (ds->cache && ghc_data_order_build(ds, ds->pos_epoch) == 0) {
        const struct data_order_batch *ob = &ds->batches[ds->pos_batch];
        for (int32_t i = 0; i < ob->n; i++)
            if (ghc_cache_prefetch(ds->cache, ds->order[ob->start + i], device, stream) < 0) {
                ghc_log(ds->core, GHC_LOG_DEBUG, "data: prefetch: %s", ghc_error_message(ds->core));
                ghc_error_clear(ds->core);
            }
    }
    return 0;
}

/* ---- several ranks: a step's batches planned, served in parts ------------------------------- */

/* The batch of epoch `epoch`'s order (built) that starts at or before `pos`. */
static int64_t batch_at(const ghc_dataset_t *ds, int64_t pos)
{
    int64_t lo = 0, hi = ds->n_batches;
    while (hi - lo > 1) {
        int64_t mid = lo + (hi - lo) / 2;
        if (ds->batches[mid].start <= pos)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

int ghc_data_plan(ghc_dataset_t *ds, int32_t k, bool advance, struct ghc_data_plan *out)
{
    int64_t e = ds->pos_epoch, b = ds->pos_batch;
    int rc;
    for (int32_t i = 0; i < k; i++) {
        if ((rc = ghc_data_order_build(ds, e)) < 0)
            return rc;
        if (b >= ds->n_batches) {
            e++, b = 0, i--;
            continue;
        }
        const struct data_order_batch *ob = &ds->batches[b];
        const struct data_sample *s = &ds->samples[ds->order[ob->start]];
        out[i] = (struct ghc_data_plan){ .epoch = e, .start = ob->start, .n = ob->n,
                                         .has_noise = s->file[GHC_SAMPLE_NOISE] != NULL,
                                         .has_timestep = s->file[GHC_SAMPLE_TIMESTEP] != NULL };
        memcpy(out[i].latent_shape, s->lat_shape, sizeof(out[i].latent_shape));
        if (++b == ds->n_batches)
            e++, b = 0;
    }
    if (advance)
        ds->pos_epoch = e, ds->pos_batch = b;
    return 0;
}

int ghc_data_serve(ghc_dataset_t *ds, int64_t epoch, int64_t start, int32_t n, int device, void *stream,
                   struct ghc_data_batch *out)
{
    memset(out, 0, sizeof(*out));
    double t0 = ghc_data_seconds();
    int rc;
    if ((rc = ghc_data_order_build(ds, epoch)) < 0)
        return rc;
    int64_t bi = batch_at(ds, start);
    const struct data_order_batch *ob = &ds->batches[bi];
    if (n < 1 || start + n > ob->start + ob->n)
        return ghc_error_set(ds->core, GHC_EINTERNAL, "data: positions %lld to %lld of epoch %lld are not in one batch",
                             (long long)start, (long long)(start + n), (long long)epoch);
    if ((rc = assemble(ds, epoch, bi, (int32_t)(start - ob->start), n, out)) < 0)
        return rc;
    return serve(ds, out, device, stream, t0);
}

void ghc_data_batch_release(ghc_dataset_t *ds, struct ghc_data_batch *b)
{
    (void)ds;
    ghc_tensor_free(b->latents);
    ghc_tensor_free(b->text_embed);
    ghc_tensor_free(b->text_mask);
    ghc_tensor_free(b->noise);
    ghc_tensor_free(b->timesteps);
    free((void *)b->index);
    free((void *)b->text_dropped);
    struct host_side *hs = b->priv;
    if (hs) {
        /* the copies on the batch's stream have run by now: the caller released the batch
         * after the step that used it */
        for (int i = 0; i < 5; i++)
            ghc_tensor_free(hs->t[i]);
        free(hs);
    }
    memset(b, 0, sizeof(*b));
}
