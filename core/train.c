/* train.c: the trainer's loop. One optimizer step s:
 *   the expert of the step (single: fixed; separate: alternating every switch_every steps,
 *   never inside a window; shared: per micro-batch from its first sigma), the window size
 *   GA(s) and lr factor from the scheduler, then GA micro-batches of
 *     sigma per sample (the family restricted to the expert's range), noise (Philox, or the
 *     sample's stored noise), x_sigma = (1 - sigma) x0 + sigma noise, v = noise - x0,
 *     forward at t = 1000 sigma, loss_i = mean((v_hat - v)^2) weighted, backward;
 *   the gradient is the sum over the window divided by its samples; a non-finite loss skips
 *   the step; clipping by the global norm; the optimizer step of the expert's group.
 * Every generator's state is a counter written to trainer.json with each checkpoint, so a
 * resumed run continues exactly. The checks before a run are in train_check.c, the
 * checkpoints in checkpoint.c, the output folder and its logs in outdir.c, and what the user
 * sees while it runs in progress.c. */
#include <config.h>

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gh200core/dataset.h>
#include <gh200core/gh200core.h>
#include <gh200core/ops.h>
#include <gh200core/tensor.h>
#include <gh200core/train.h>

#include "dataset_impl.h"   /* defines: ghc_data_plan, ghc_data_serve */
#include "dist_shard.h"
#include "train_impl.h"

static volatile sig_atomic_t stop_signal;

void ghc_train_request_stop(int sig) { stop_signal = sig ? sig : SIGTERM; }
int ghc_train_stop_signal(void) { return (int)stop_signal; }

/* ---- small tensor helpers ------------------------------------------------------------------- */

/* A view of sample i of a [B, ...] tensor (borrowed memory). */
static ghc_tensor_t *sample_view(ghc_core_t *core, ghc_tensor_t *t, int64_t i)
{
    int nd = ghc_tensor_ndim(t);
    const int64_t *sh = ghc_tensor_shape(t);
    int64_t per = ghc_tensor_numel(t) / sh[0];
    size_t es = ghc_dtype_size(ghc_tensor_dtype(t));
    return ghc_tensor_wrap(core, ghc_tensor_dtype(t), nd - 1, sh + 1, ghc_tensor_device(t),
                           (char *)ghc_tensor_data(t) + (size_t)(i * per) * es);
}

/* A view of element i of a 1-D f32 tensor, as a scalar. */
static ghc_tensor_t *elem_view(ghc_core_t *core, ghc_tensor_t *t, int64_t i)
{
    return ghc_tensor_wrap(core, GHC_DTYPE_F32, 0, NULL, ghc_tensor_device(t), (float *)ghc_tensor_data(t) + i);
}

/* Copies a device f32 vector to the host (waits for it). */
static int to_host(struct ghc_trainer *tr, ghc_tensor_t *src, float *dst, int64_t n)
{
    ghc_core_t *core = tr->core;
    if (ghc_tensor_device(src) == GHC_DEVICE_CPU) {
        ghc_op_sync(core, GHC_DEVICE_CPU, NULL);
        memcpy(dst, ghc_tensor_cdata(src), (size_t)n * sizeof(float));
        return 0;
    }
    ghc_tensor_t *h = ghc_tensor_wrap(core, GHC_DTYPE_F32, 1, &n, GHC_DEVICE_CPU, dst);
    ghc_tensor_t *v = ghc_tensor_wrap(core, GHC_DTYPE_F32, 1, &n, ghc_tensor_device(src), ghc_tensor_data(src));
    int rc = !h || !v ? GHC_ENOMEM : ghc_op_copy(h, v, NULL);
    if (rc == 0)
        rc = ghc_op_sync(core, ghc_tensor_device(src), NULL);
    ghc_tensor_free(h);
    ghc_tensor_free(v);
    return rc;
}

static ghc_tensor_t *tensor(struct ghc_trainer *tr, enum ghc_dtype dt, int nd, const int64_t *shape, int device,
                            enum ghc_mem_role role)
{
    return ghc_tensor_init(tr->core, dt, nd, shape, device, role);
}

/* ---- experts and adapters ------------------------------------------------------------------- */

void ghc_train_expert_range(const struct ghc_trainer *tr, int32_t e, double *lo, double *hi)
{
    if (tr->n_experts < 2 || e < 0) {
        *lo = 0.0, *hi = 1.0;
    } else if (e == 0) {
        *lo = tr->boundary, *hi = 1.0;
    } else {
        *lo = 0.0, *hi = tr->boundary;
    }
}

static int32_t route(const struct ghc_trainer *tr, double sigma)
{
    return tr->n_experts < 2 ? 0 : sigma >= tr->boundary ? 0 : 1;
}

/* The adapter slot serving model expert e. */
static int adapter_of(const struct ghc_trainer *tr, int32_t e)
{
    if (tr->c.mode == GHC_TRAIN_MODE_SHARED)
        return 0;
    for (int a = 0; a < tr->n_adapters; a++)
        if (tr->adapter_expert[a] == e)
            return a;
    return 0;
}

/* The expert whose turn step s is (single and separate modes). */
static int32_t expert_of_step(const struct ghc_trainer *tr, int64_t s)
{
    if (tr->c.mode == GHC_TRAIN_MODE_SEPARATE)
        return tr->adapter_expert[(s / tr->c.switch_every) % tr->n_adapters];
    return tr->adapter_expert[0] < 0 ? 0 : tr->adapter_expert[0];
}

static int activate(struct ghc_trainer *tr, int32_t e)
{
    if (tr->active == e)
        return 0;
    int rc;
    struct ghc_adapter_hook hook;
    int a = adapter_of(tr, e);
    if ((rc = ghc_model_activate(tr->model, e)) < 0 ||
        (rc = ghc_network_hook(tr->net, tr->c.mode == GHC_TRAIN_MODE_SHARED ? 0 : tr->adapter_expert[a], &hook)) < 0 ||
        (rc = ghc_model_set_hook(tr->model, &hook)) < 0)
        return rc;
    if (tr->mp && (rc = ghc_mem_phase(tr->mp, GHC_PHASE_EXPERT_SWITCH, e)) < 0)
        return rc;
    if (tr->active >= 0)
        ghc_log(tr->core, GHC_LOG_DEBUG, "train: step %lld: expert %s", (long long)tr->step, ghc_train_expert_names[e]);
    tr->active = e;
    return 0;
}

/* ---- the loss of one micro-batch ------------------------------------------------------------ */

static float weight_of(int w, double sigma)
{
    switch (w) {
    case GHC_TRAIN_WEIGHTING_SIGMA_SQRT: return (float)(1.0 / (sigma * sigma));
    case GHC_TRAIN_WEIGHTING_COSMAP:     return (float)(2.0 / (M_PI * (1.0 - 2.0 * sigma + 2.0 * sigma * sigma)));
    default:                return 1.0f;
    }
}

/* The sigmas of a batch of n samples of latent height H and width W: stored timesteps (f32 [n],
 * or NULL), else drawn. *expert: the expert they route to (the step's in single/separate modes;
 * shared: the first sample's). */
static int draw_sigmas(struct ghc_trainer *tr, int64_t n, int64_t H, int64_t W, const ghc_tensor_t *timesteps,
                       int32_t *expert, double *sig)
{
    ghc_core_t *core = tr->core;
    int rc;
    if (timesteps && tr->c.stored_noise) {
        float t[4096];
        if (n > 4096)
            return ghc_error_set(core, GHC_EINVAL, "train: batch of %lld samples is too large", (long long)n);
        if ((rc = to_host(tr, (ghc_tensor_t *)timesteps, t, n)) < 0)
            return rc;
        for (int64_t i = 0; i < n; i++) {
            sig[i] = t[i] / 1000.0;
            if (!(sig[i] > 0.0 && sig[i] <= 1.0))
                return ghc_error_set(core, GHC_EFORMAT, "train: a stored timestep %g is outside (0, 1000]", t[i]);
            if (i && route(tr, sig[i]) != route(tr, sig[0]))
                return ghc_error_set(core, GHC_EFORMAT, "train: the stored timesteps of one batch route to different experts");
        }
        *expert = route(tr, sig[0]);
        if (tr->c.mode != GHC_TRAIN_MODE_SHARED && tr->n_experts > 1 && *expert != expert_of_step(tr, tr->step))
            return ghc_error_set(core, GHC_EFORMAT, "train: a stored timestep routes to the %s-noise expert, not the one trained at step %lld",
                                 ghc_train_expert_names[*expert], (long long)tr->step);
        return 0;
    }
    double k = tr->sampler.family == GHC_SAMPLER_FLUX_SHIFT ? ghc_sampler_flux_k((H / 2) * (W / 2)) : tr->sampler.shift;
    int32_t e;
    int64_t first = 0;
    if (tr->c.mode == GHC_TRAIN_MODE_SHARED) {
        tr->sampler.lo = 0.0, tr->sampler.hi = 1.0;
        if ((rc = ghc_sampler_draw(core, &tr->sampler, k, &sig[0])) < 0)
            return rc;
        e = route(tr, sig[0]);
        first = 1;
    } else {
        e = expert_of_step(tr, tr->step);
    }
    ghc_train_expert_range(tr, e, &tr->sampler.lo, &tr->sampler.hi);
    for (int64_t i = first; i < n; i++)
        if ((rc = ghc_sampler_draw(core, &tr->sampler, k, &sig[i])) < 0)
            return rc;
    *expert = e;
    return 0;
}

/* Forward, loss and (train) backward of one batch. noise_in: the batch's noise when the caller
 * drew it (several ranks), else NULL: the stored noise or drawn here. losses: n f32 slots on
 * the device for the per-sample weighted losses. */
static int run_batch(struct ghc_trainer *tr, const struct ghc_data_batch *b, int32_t e, const double *sig,
                     ghc_tensor_t *noise_in, ghc_tensor_t *losses, int64_t slot, bool train)
{
    ghc_core_t *core = tr->core;
    int dev = tr->device, rc = 0;
    int64_t n = b->n;
    const int64_t *sh = ghc_tensor_shape(b->latents);
    ghc_tensor_t *noise = NULL, *xs = NULL, *v = NULL, *out = NULL, *dout = NULL, *tt = NULL;
    ghc_tensor_t *vi[3] = { NULL };
    if (!(xs = tensor(tr, GHC_DTYPE_F32, 5, sh, dev, GHC_ROLE_ACTIVATIONS)) ||
        !(v = tensor(tr, GHC_DTYPE_F32, 5, sh, dev, GHC_ROLE_ACTIVATIONS)) ||
        !(out = tensor(tr, GHC_DTYPE_F32, 5, sh, dev, GHC_ROLE_ACTIVATIONS)) ||
        (train && !(dout = tensor(tr, GHC_DTYPE_F32, 5, sh, dev, GHC_ROLE_ACTIVATIONS))) ||
        !(tt = tensor(tr, GHC_DTYPE_F32, 1, &n, GHC_DEVICE_CPU, GHC_ROLE_WORKSPACE))) {
        rc = ghc_error_code(core) ? ghc_error_code(core) : GHC_ENOMEM;
        goto out;
    }
    if (b->noise && tr->c.stored_noise) {
        noise = b->noise;
    } else if (noise_in) {
        noise = noise_in;
    } else {
        if (!(noise = tensor(tr, GHC_DTYPE_F32, 5, sh, dev, GHC_ROLE_ACTIVATIONS))) {
            rc = ghc_error_code(core) ? ghc_error_code(core) : GHC_ENOMEM;
            goto out;
        }
        if ((rc = ghc_op_rand_normal(noise, &tr->noise_rng, NULL)) < 0)
            goto out;
        tr->noise_rng.offset += (uint64_t)(ghc_tensor_numel(noise) + 3) / 4;
    }
    float *t = ghc_tensor_data(tt);
    for (int64_t i = 0; i < n && rc == 0; i++) {
        t[i] = (float)(1000.0 * sig[i] + (tr->c.t_offset ? 1.0 : 0.0));
        vi[0] = sample_view(core, xs, i);
        ghc_tensor_t *x0 = sample_view(core, b->latents, i), *ei = sample_view(core, noise, i);
        vi[1] = sample_view(core, v, i);
        if (!vi[0] || !vi[1] || !x0 || !ei)
            rc = GHC_ENOMEM;
        else if ((rc = ghc_op_add(vi[0], x0, ei, (float)(1.0 - sig[i]), (float)sig[i], NULL)) == 0)
            rc = ghc_op_add(vi[1], ei, x0, 1.0f, -1.0f, NULL);
        ghc_tensor_free(x0);
        ghc_tensor_free(ei);
        ghc_tensor_free(vi[0]);
        ghc_tensor_free(vi[1]);
        vi[0] = vi[1] = NULL;
    }
    if (rc < 0)
        goto out;
    struct ghc_model_batch mb = { .noisy = xs, .timesteps = tt, .text_embed = b->text_embed,
                                  .text_mask = b->text_mask, .cond = NULL };
    if ((rc = ghc_model_forward(tr->model, e, &mb, out, train, NULL)) < 0)
        goto out;
    for (int64_t i = 0; i < n && rc == 0; i++) {
        ghc_tensor_t *oi = sample_view(core, out, i), *ti = sample_view(core, v, i);
        ghc_tensor_t *gi = train ? sample_view(core, dout, i) : NULL;
        ghc_tensor_t *li = elem_view(core, losses, slot + i);
        float w = weight_of(tr->c.weighting, sig[i]);
        if (!oi || !ti || !li || (train && !gi))
            rc = GHC_ENOMEM;
        else if ((rc = ghc_op_mse_loss(li, gi, oi, ti, NULL)) == 0 && w != 1.0f) {
            rc = ghc_op_scale(li, li, w, NULL);
            if (rc == 0 && gi)
                rc = ghc_op_scale(gi, gi, w, NULL);
        }
        ghc_tensor_free(oi);
        ghc_tensor_free(ti);
        ghc_tensor_free(gi);
        ghc_tensor_free(li);
    }
    if (rc == 0 && train)
        rc = ghc_model_backward(tr->model, e, dout, NULL, NULL);
out:
    if (noise != b->noise && noise != noise_in)
        ghc_tensor_free(noise);
    ghc_tensor_free(xs);
    ghc_tensor_free(v);
    ghc_tensor_free(out);
    ghc_tensor_free(dout);
    ghc_tensor_free(tt);
    return rc;
}

/* ---- gradients ------------------------------------------------------------------------------ */

static int grads_zero(struct ghc_trainer *tr, int a)
{
    int rc;
    for (int32_t i = 0; i < tr->n_params[a]; i++)
        if ((rc = ghc_op_fill(tr->params[a][i].grad, 0.0, NULL)) < 0)
            return rc;
    return 0;
}

static int grads_scale(struct ghc_trainer *tr, int a, float f)
{
    int rc;
    for (int32_t i = 0; i < tr->n_params[a]; i++)
        if ((rc = ghc_op_scale(tr->params[a][i].grad, tr->params[a][i].grad, f, NULL)) < 0)
            return rc;
    return 0;
}

/* The global L2 norm of adapter a's grads. */
static int grads_norm(struct ghc_trainer *tr, int a, double *norm)
{
    ghc_core_t *core = tr->core;
    int rc = 0;
    int32_t n = tr->n_params[a];
    for (int32_t i = 0; i < n && rc == 0; i++) {
        ghc_tensor_t *g = tr->params[a][i].grad;
        ghc_tensor_t *sq = ghc_tensor_wrap(core, GHC_DTYPE_F32, ghc_tensor_ndim(g), ghc_tensor_shape(g),
                                           tr->device, ghc_tensor_data(tr->sq));
        ghc_tensor_t *o = elem_view(core, tr->norms, i);
        if (!sq || !o)
            rc = GHC_ENOMEM;
        else if ((rc = ghc_op_mul(sq, g, g, NULL)) == 0)
            rc = ghc_op_sum(o, sq, NULL);
        ghc_tensor_free(sq);
        ghc_tensor_free(o);
    }
    if (rc < 0)
        return rc;
    float *h = malloc((size_t)(n ? n : 1) * sizeof(float));
    if (!h)
        return ghc_error_set(core, GHC_ENOMEM, "train: out of memory");
    rc = to_host(tr, tr->norms, h, n);
    double s = 0.0;
    for (int32_t i = 0; i < n; i++)
        s += (double)h[i];
    free(h);
    *norm = sqrt(s);
    return rc;
}

/* ---- validation ----------------------------------------------------------------------------- */

/* Mean loss over validation_batches batches at each validation sigma (fixed noise from a
 * generator of its own, so the numbers are comparable across steps). */
static int validate(struct ghc_trainer *tr)
{
    ghc_core_t *core = tr->core;
    ghc_dataset_t *vd = tr->vds ? tr->vds : tr->ds;
    int64_t epoch, cursor;
    int rc = ghc_dataset_tell(tr->ds, &epoch, &cursor);
    if (rc < 0)
        return rc;
    struct ghc_rng saved = tr->noise_rng;
    for (int k = 0; k < tr->c.n_vsig && rc == 0; k++) {
        double sigma = tr->c.vsig[k], sum = 0.0;
        int64_t count = 0;
        int32_t e = route(tr, sigma);
        if (tr->c.mode != GHC_TRAIN_MODE_SHARED && tr->n_experts > 1 && e != expert_of_step(tr, tr->step))
            continue;   /* that sigma belongs to the other expert's adapter this turn */
        tr->noise_rng = (struct ghc_rng){ .seed = saved.seed ^ 0x5a5a5a5a5a5a5a5aull, .offset = 0 };
        if ((rc = ghc_dataset_seek(vd, 0, 0)) < 0 || (rc = activate(tr, e)) < 0)
            break;
        for (int64_t bi = 0; bi < tr->c.validation_batches && rc == 0; bi++) {
            struct ghc_data_batch b;
            if ((rc = ghc_dataset_next(vd, tr->device, NULL, &b)) < 0)
                break;
            double sig[4096];
            float lh[4096];
            ghc_tensor_t *losses = NULL;
            int64_t n = b.n;
            if (n > 4096) {
                /* refused at config check (train_check.c); never overrun the arrays */
                ghc_data_batch_release(vd, &b);
                rc = ghc_error_set(core, GHC_EINVAL, "train: validation batches above 4096 samples are not supported");
                break;
            }
            for (int64_t i = 0; i < n; i++)
                sig[i] = sigma;
            if (!(losses = tensor(tr, GHC_DTYPE_F32, 1, &n, tr->device, GHC_ROLE_WORKSPACE)))
                rc = ghc_error_code(core);
            else if ((rc = run_batch(tr, &b, e, sig, NULL, losses, 0, false)) == 0 && (rc = to_host(tr, losses, lh, n)) == 0)
                for (int64_t i = 0; i < n; i++, count++)
                    sum += lh[i] / weight_of(tr->c.weighting, sigma);
            ghc_tensor_free(losses);
            ghc_data_batch_release(vd, &b);
        }
        if (rc == 0 && count && (rc = ghc_outdir_record_validation(tr, sigma, sum / (double)count)) == 0) {
            ghc_log(core, GHC_LOG_INFO, "train: step %lld: validation loss at sigma %.3g: %.6g",
                    (long long)tr->step, sigma, sum / (double)count);
        }
    }
    tr->noise_rng = saved;
    /* the training position back; after a failed log write too, for the checkpoint that
     * follows (when that fails, its message is the run's and no checkpoint is written) */
    if (rc == 0 || tr->log_failed) {
        int seek = ghc_dataset_seek(tr->ds, epoch, cursor);
        if (seek < 0)
            tr->log_failed = false;
        rc = rc ? (seek < 0 ? seek : rc) : seek;
    }
    return rc;
}

/* ---- several ranks --------------------------------------------------------------------------- */

/* Several ranks: the step's ga batches planned from the position (which moves past them on every
 * rank), this rank's share of their samples (dist_shard.h) served and trained. Every rank draws
 * the sigmas and the noise of every batch of the step, as one process would, and trains with
 * those of its own samples: the step is the one-process step, summed in another order. A
 * sample skipped as bad leaves its batch short (the rest keep the first draws). losses: the
 * per-sample losses of this rank (*used of them). */
static int micro_dist(struct ghc_trainer *tr, int32_t ga, int32_t e_step, ghc_tensor_t **losses, int64_t *used,
                      double *t_data, double *t_fb)
{
    ghc_core_t *core = tr->core;
    int rc = 0, k;
    struct ghc_data_plan *plan = calloc((size_t)ga, sizeof(*plan));
    struct ghc_dist_span *step = calloc((size_t)ga, sizeof(*step)), *mine = calloc((size_t)ga + 1, sizeof(*mine));
    if (!plan || !step || !mine) {
        rc = ghc_error_set(core, GHC_ENOMEM, "train: out of memory");
        goto out;
    }
    if ((rc = ghc_data_plan(tr->ds, ga, true, plan)) < 0)
        goto out;
    for (int32_t m = 0; m < ga; m++)
        step[m] = (struct ghc_dist_span){ .epoch = plan[m].epoch, .start = plan[m].start, .n = plan[m].n };
    k = ghc_dist_shard_step(step, ga, tr->rank, tr->world, mine);
    int64_t cap = 1;
    for (int i = 0; i < k; i++)
        cap += mine[i].n;
    if (!(*losses = tensor(tr, GHC_DTYPE_F32, 1, &cap, tr->device, GHC_ROLE_WORKSPACE))) {
        rc = ghc_error_code(core) ? ghc_error_code(core) : GHC_ENOMEM;
        goto out;
    }
    double sig[4096];
    for (int32_t m = 0, j = 0; m < ga && rc == 0; m++) {
        const struct ghc_data_plan *p = &plan[m];
        bool own = j < k && mine[j].epoch == p->epoch && mine[j].start >= p->start && mine[j].start < p->start + p->n;
        int64_t off = own ? mine[j].start - p->start : 0;
        struct ghc_data_batch b = { 0 };
        if (p->n > 4096) {
            rc = ghc_error_set(core, GHC_EINVAL, "train: batches above 4096 samples are not supported");
            break;
        }
        if (own) {
            double td = ghc_progress_now();
            rc = ghc_data_serve(tr->ds, p->epoch, mine[j].start, (int32_t)mine[j].n, tr->device, NULL, &b);
            *t_data += ghc_progress_now() - td;
            j++;
            if (rc < 0)
                break;
        }
        double tf = ghc_progress_now();
        int32_t e = e_step;
        const int64_t *ls = p->latent_shape;
        int64_t per = ls[0] * ls[1] * ls[2] * ls[3];
        /* sigmas: stored ones are the samples' own; drawn ones for the whole batch */
        bool stored_t = tr->c.stored_noise && p->has_timestep;
        const double *sg = sig + off;
        if (stored_t && b.n > 0)   /* the samples' own (drawn, as one process, where not all have one) */
            rc = draw_sigmas(tr, b.n, ls[2], ls[3], b.timesteps, &e, sig), sg = sig;
        else if (!stored_t)
            rc = draw_sigmas(tr, p->n, ls[2], ls[3], NULL, &e, sig);
        /* noise: the whole batch's drawn, this rank's rows a view of it */
        ghc_tensor_t *full = NULL, *view = NULL;
        if (rc == 0 && !(tr->c.stored_noise && p->has_noise)) {
            if (b.n > 0) {
                int64_t fs[5] = { p->n, ls[0], ls[1], ls[2], ls[3] }, vs[5] = { b.n, ls[0], ls[1], ls[2], ls[3] };
                if (!(full = tensor(tr, GHC_DTYPE_F32, 5, fs, tr->device, GHC_ROLE_ACTIVATIONS)) ||
                    !(view = ghc_tensor_wrap(core, GHC_DTYPE_F32, 5, vs, tr->device,
                                             (float *)ghc_tensor_data(full) + off * per)))
                    rc = ghc_error_code(core) ? ghc_error_code(core) : GHC_ENOMEM;
                else
                    rc = ghc_op_rand_normal(full, &tr->noise_rng, NULL);
            }
            tr->noise_rng.offset += (uint64_t)(p->n * per + 3) / 4;
        }
        if (rc == 0 && b.n > 0 && (rc = activate(tr, e)) == 0)
            rc = run_batch(tr, &b, e, sg, view, *losses, *used, true);
        if (tr->c.sync_timing)
            ghc_op_sync(core, tr->device, NULL);
        *t_fb += ghc_progress_now() - tf;
        *used += b.n;
        ghc_tensor_free(view);
        ghc_tensor_free(full);
        ghc_data_batch_release(tr->ds, &b);
    }
out:
    free(plan);
    free(step);
    free(mine);
    return rc;
}

/* Several ranks: adapter a's gradients, this rank's loss sum and sample count, and whether it was
 * asked to stop, summed over the ranks (one all-reduce of them laid end to end in tr->flat, on
 * the device's stream); a stop request of any rank becomes every rank's (tr->dist_stop). */
static int grads_allreduce(struct ghc_trainer *tr, int a, double *loss_sum, int64_t *samples)
{
    ghc_core_t *core = tr->core;
    int rc = 0;
    int64_t total = 3;
    for (int32_t i = 0; i < tr->n_params[a]; i++) {
        ghc_tensor_t *g = tr->params[a][i].grad;
        if (ghc_tensor_dtype(g) != GHC_DTYPE_F32)
            return ghc_error_set(core, GHC_EUNSUPPORTED, "train: several ranks need f32 gradients; %s's is %s",
                                 tr->params[a][i].name, ghc_dtype_name(ghc_tensor_dtype(g)));
        total += ghc_tensor_numel(g);
    }
    if (tr->flat && ghc_tensor_numel(tr->flat) < total) {
        ghc_tensor_free(tr->flat);
        tr->flat = NULL;
    }
    if (!tr->flat && !(tr->flat = tensor(tr, GHC_DTYPE_F32, 1, &total, tr->device, GHC_ROLE_GRADS)))
        return ghc_error_code(core) ? ghc_error_code(core) : GHC_ENOMEM;
    float *base = ghc_tensor_data(tr->flat);
    /* pack (pass 0) and unpack (pass 1) */
    for (int pass = 0; pass < 2 && rc == 0; pass++) {
        int64_t off = 0;
        for (int32_t i = 0; i < tr->n_params[a] && rc == 0; i++) {
            ghc_tensor_t *g = tr->params[a][i].grad;
            ghc_tensor_t *v = ghc_tensor_wrap(core, GHC_DTYPE_F32, ghc_tensor_ndim(g), ghc_tensor_shape(g), tr->device,
                                              base + off);
            rc = !v ? GHC_ENOMEM : pass == 0 ? ghc_op_copy(v, g, NULL) : ghc_op_copy(g, v, NULL);
            ghc_tensor_free(v);
            off += ghc_tensor_numel(g);
        }
        if (rc < 0)
            break;
        float tail[3] = { (float)*loss_sum, (float)*samples, (float)stop_signal };
        int64_t three = 3;
        ghc_tensor_t *tv = ghc_tensor_wrap(core, GHC_DTYPE_F32, 1, &three, tr->device, base + off);
        ghc_tensor_t *th = ghc_tensor_wrap(core, GHC_DTYPE_F32, 1, &three, GHC_DEVICE_CPU, tail);
        if (!tv || !th) {
            rc = GHC_ENOMEM;
        } else if (pass == 0 && (rc = ghc_op_copy(tv, th, NULL)) == 0) {
            rc = tr->dist->allreduce(tr->dist->user, base, total, tr->device, NULL);
        } else if (pass == 1 && (rc = to_host(tr, tv, tail, 3)) == 0) {
            *loss_sum = tail[0], *samples = (int64_t)tail[1];
            if (tail[2] > 0.0f && !stop_signal)
                stop_signal = SIGTERM;   /* another rank's; the step ends on every rank */
            tr->dist_stop = tail[2] > 0.0f;
        }
        ghc_tensor_free(tv);
        ghc_tensor_free(th);
    }
    return rc;
}

/* Several ranks: that every rank holds the same adapters (a checksum of their bytes, gathered on
 * rank 0, which stops the run when one differs). */
static int dist_check_adapters(struct ghc_trainer *tr)
{
    ghc_core_t *core = tr->core;
    if (!tr->dist || tr->world < 2)
        return 0;
    uint64_t h = GHC_FNV1A_BASIS;
    int rc = 0;
    for (int a = 0; a < tr->n_adapters && rc == 0; a++)
        for (int32_t i = 0; i < tr->n_params[a] && rc == 0; i++) {
            ghc_tensor_t *v = tr->params[a][i].value;
            ghc_tensor_t *c = ghc_tensor_init(core, ghc_tensor_dtype(v), ghc_tensor_ndim(v), ghc_tensor_shape(v),
                                              GHC_DEVICE_CPU, GHC_ROLE_WORKSPACE);
            if (!c)
                rc = ghc_error_code(core) ? ghc_error_code(core) : GHC_ENOMEM;
            else if ((rc = ghc_op_copy(c, v, NULL)) == 0 && (rc = ghc_op_sync(core, ghc_tensor_device(v), NULL)) == 0) {
                h = ghc_fnv1a(h, ghc_tensor_cdata(c), ghc_tensor_nbytes(c));
            }
            ghc_tensor_free(c);
        }
    if (rc < 0)
        return rc;
    uint64_t *all = tr->rank == 0 ? calloc((size_t)tr->world, sizeof(*all)) : NULL;
    if (tr->rank == 0 && !all)
        return ghc_error_set(core, GHC_ENOMEM, "train: out of memory");
    if ((rc = tr->dist->gather(tr->dist->user, &h, sizeof(h), all)) == 0 && tr->rank == 0) {
        for (int32_t r = 1; r < tr->world && rc == 0; r++)
            if (all[r] != h)
                rc = ghc_error_set(core, GHC_EINTERNAL, "dist: the adapters differ between ranks after step %lld: rank "
                                   "%d's checksum is %016llx, rank 0's %016llx", (long long)tr->step, r,
                                   (unsigned long long)all[r], (unsigned long long)h);
        if (rc == 0)
            ghc_log(core, GHC_LOG_INFO, "dist: the adapters are the same on all %d ranks after step %lld "
                    "(checksum %016llx)", tr->world, (long long)tr->step, (unsigned long long)h);
    }
    free(all);
    return rc;
}

/* ---- one optimizer step --------------------------------------------------------------------- */

static int train_step(struct ghc_trainer *tr)
{
    ghc_core_t *core = tr->core;
    double t0 = ghc_progress_now(), t_data = 0.0, t_fb = 0.0;
    int32_t ga = tr->sched ? ghc_scheduler_micro_batches(tr->sched, tr->step) : 1;
    float lrf = tr->sched ? ghc_scheduler_lr_factor(tr->sched, tr->step) : 1.0f;
    if (ga < 1)
        return ghc_error_set(core, GHC_EINTERNAL, "train: the scheduler asked for %d micro-batches", ga);
    int rc;
    /* Which adapters this window trains: the step's expert's, or the shared one. */
    int32_t e_step = expert_of_step(tr, tr->step);
    int a_step = adapter_of(tr, e_step);
    if ((rc = grads_zero(tr, a_step)) < 0)
        return rc;
    if (tr->mp && (rc = ghc_mem_phase(tr->mp, GHC_PHASE_STEP_BEGIN, tr->step)) < 0)
        return rc;
    if ((rc = ghc_network_begin_step(tr->net, tr->step)) < 0)
        return rc;
    int64_t cap = 0, used = 0, samples = 0;
    ghc_tensor_t *losses = NULL;
    double sig[4096];
    if (tr->world > 1) {
        rc = micro_dist(tr, ga, e_step, &losses, &used, &t_data, &t_fb);
        samples = used;
    }
    for (int32_t m = 0; m < (tr->world > 1 ? 0 : ga) && rc == 0; m++) {
        if (tr->c.sync_timing)
            ghc_op_sync(core, tr->device, NULL);
        double td = ghc_progress_now();
        struct ghc_data_batch b;
        if ((rc = ghc_dataset_next(tr->ds, tr->device, NULL, &b)) < 0)
            break;
        t_data += ghc_progress_now() - td;
        if (b.n > 4096) {
            ghc_data_batch_release(tr->ds, &b);
            rc = ghc_error_set(core, GHC_EINVAL, "train: batches above 4096 samples are not supported");
            break;
        }
        if (used + b.n > cap) {
            /* one slot per sample of the window; grown when batch sizes vary */
            int64_t ncap = (used + b.n) * (ga - m);
            ghc_tensor_t *nl = tensor(tr, GHC_DTYPE_F32, 1, &ncap, tr->device, GHC_ROLE_WORKSPACE);
            if (!nl) {
                rc = ghc_error_code(core);
            } else if (losses && used) {
                ghc_tensor_t *dst = ghc_tensor_wrap(core, GHC_DTYPE_F32, 1, &used, tr->device, ghc_tensor_data(nl));
                ghc_tensor_t *src = ghc_tensor_wrap(core, GHC_DTYPE_F32, 1, &used, tr->device, ghc_tensor_data(losses));
                rc = dst && src ? ghc_op_copy(dst, src, NULL) : GHC_ENOMEM;
                ghc_tensor_free(dst);
                ghc_tensor_free(src);
            }
            ghc_tensor_free(losses);
            losses = nl;
            cap = ncap;
        }
        int32_t e = e_step;
        double tf = ghc_progress_now();
        if (tr->c.sync_timing)
            ghc_op_sync(core, tr->device, NULL);
        if (rc == 0 && (rc = draw_sigmas(tr, b.n, ghc_tensor_dim(b.latents, 3), ghc_tensor_dim(b.latents, 4),
                                         b.timesteps, &e, sig)) == 0 && (rc = activate(tr, e)) == 0)
            rc = run_batch(tr, &b, e, sig, NULL, losses, used, true);
        if (tr->c.sync_timing)
            ghc_op_sync(core, tr->device, NULL);
        t_fb += ghc_progress_now() - tf;
        used += b.n;
        samples += b.n;
        ghc_data_batch_release(tr->ds, &b);
    }
    if (rc < 0) {
        ghc_tensor_free(losses);
        return rc;
    }
    float *lh = malloc((size_t)(used ? used : 1) * sizeof(float));
    if (!lh) {
        ghc_tensor_free(losses);
        return ghc_error_set(core, GHC_ENOMEM, "train: out of memory");
    }
    rc = to_host(tr, losses, lh, used);
    ghc_tensor_free(losses);
    double loss = 0.0;
    for (int64_t i = 0; i < used; i++)
        loss += (double)lh[i];
    free(lh);
    if (rc == 0 && tr->world > 1)
        rc = grads_allreduce(tr, a_step, &loss, &samples);
    if (rc < 0)
        return rc;
    loss /= (double)samples;
    struct ghc_step_report r = { .loss = loss, .lr_factor = lrf, .micro_batches = ga, .samples = (int32_t)samples,
                             .expert = tr->active, .t_data = t_data, .t_fwd_bwd = t_fb };
    double t_opt = ghc_progress_now();
    if (!isfinite(loss)) {
        tr->bad_total++;
        r.skipped = true;
        ghc_log(core, GHC_LOG_WARN, "train: step %lld: loss is %g: step skipped (%lld in a row, %lld in all)",
                (long long)tr->step, loss, (long long)tr->bad_in_row + 1, (long long)tr->bad_total);
        if (++tr->bad_in_row >= tr->c.max_bad)
            return ghc_error_set(core, GHC_EINVAL, "train: %lld non-finite losses in a row (max_bad_steps): stopping; "
                                 "%s", (long long)tr->bad_in_row, tr->wrote_checkpoint || tr->resumed
                                 ? "the last good checkpoint is intact" : "there is no checkpoint yet");
    } else {
        tr->bad_in_row = 0;
        double norm = 0.0;
        if ((rc = grads_scale(tr, a_step, (float)(1.0 / (double)samples))) < 0 ||
            (rc = grads_norm(tr, a_step, &norm)) < 0)
            return rc;
        r.grad_norm = norm;
        if (tr->c.max_grad_norm > 0.0 && norm > tr->c.max_grad_norm &&
            (rc = grads_scale(tr, a_step, (float)(tr->c.max_grad_norm / (norm + 1e-6)))) < 0)
            return rc;
        int32_t group = tr->n_experts < 2 || tr->adapter_expert[a_step] < 0 ? -1 : tr->adapter_expert[a_step];
        if ((rc = ghc_optimizer_step(tr->opt, group, tr->adapter_steps[a_step], lrf, NULL)) < 0)
            return rc;
        tr->adapter_steps[a_step]++;
        r.lr = ghc_optimizer_lr(tr->opt, group);
        tr->loss_ema = tr->step == 0 || tr->loss_ema == 0.0 ? loss : 0.9 * tr->loss_ema + 0.1 * loss;
    }
    if (tr->mp && (rc = ghc_mem_phase(tr->mp, GHC_PHASE_STEP_END, tr->step)) < 0)
        return rc;
    ghc_op_sync(core, tr->device, NULL);
    r.t_opt = ghc_progress_now() - t_opt;
    tr->samples_seen += samples;
    tr->step++;
    r.t_step = ghc_progress_now() - t0;
    r.mem = (struct ghc_mem_stats){ .struct_size = sizeof(r.mem) };
    if (tr->mp)
        ghc_mem_stats(tr->mp, &r.mem);
    if (!tr->writer)
        return 0;
    if ((rc = ghc_outdir_record_step(tr, &r)) < 0)
        return rc;
    ghc_progress_step(tr, &r);
    return 0;
}

/* ---- the run -------------------------------------------------------------------------------- */

/* train.profile_steps: before step profile_skip (begin) the GPU's activity is recorded; after
 * step profile_skip + profile_steps - 1 its account goes to <output_dir>/profile.md. A profile
 * that cannot be taken (no GPU, no CUPTI) is a warning, and the run goes on. */
static void profile_at(struct ghc_trainer *tr, bool begin)
{
    ghc_core_t *core = tr->core;
    const int64_t first = tr->c.profile_skip, n = tr->c.profile_steps;
    if (!n || !tr->writer || (begin ? tr->step != first : tr->step != first + n || !tr->profiling))
        return;
    if (begin) {
        if (tr->device < 0)
            ghc_log(core, GHC_LOG_WARN, "train: profile_steps: the model computes on the CPU: no profile");
        else if (ghc_op_profile_start(core, tr->device) < 0)
            ghc_log(core, GHC_LOG_WARN, "train: profile_steps: %s: no profile", ghc_error_message(core));
        else
            tr->profiling = true;
        ghc_error_clear(core);
        return;
    }
    tr->profiling = false;
    char path[4200], title[160];
    snprintf(path, sizeof(path), "%s/profile.md", tr->out);
    snprintf(title, sizeof(title), "steps %lld to %lld", (long long)first, (long long)(first + n - 1));
    FILE *f = fopen(path, "w");
    int rc = f ? ghc_op_profile_stop(core, tr->device, f, (int32_t)n, title) : -1;
    if (f && fclose(f) != 0 && rc == 0)
        rc = ghc_error_set(core, GHC_EIO, "%s: cannot write it", path);
    if (rc < 0 || !f)
        ghc_log(core, GHC_LOG_WARN, "train: profile_steps: %s: %s", path, f ? ghc_error_message(core) : strerror(errno));
    else
        ghc_log(core, GHC_LOG_INFO, "train: the GPU's time over steps %lld to %lld: %s", (long long)first,
                (long long)(first + n - 1), path);
    if (!f)
        ghc_op_profile_stop(core, tr->device, NULL, 0, NULL);   /* ends the recording */
    ghc_error_clear(core);
}

/* This process's rank (opts->dist; one process without). */
static int dist_setup(struct ghc_trainer *tr, const struct ghc_train_opts *opts)
{
    const struct ghc_train_dist *d = opts ? opts->dist : NULL;
    tr->rank = 0, tr->world = 1, tr->writer = true, tr->resumed_world = 1;
    if (!d || d->world <= 1)
        return 0;
    if (d->struct_size < sizeof(*d) || !d->allreduce || !d->gather || !d->barrier || d->rank < 0 || d->rank >= d->world)
        return ghc_error_set(tr->core, GHC_EINVAL, "train: the ranks given are incomplete (rank %d of %d)", d->rank,
                             d->world);
    tr->dist = d;
    tr->rank = d->rank, tr->world = d->world, tr->writer = d->rank == 0;
    return 0;
}

static void trainer_free(struct ghc_trainer *tr)
{
    if (tr->ds)
        ghc_dataset_free(tr->ds);
    ghc_dataset_free(tr->vds);
    ghc_tensor_free(tr->sq);
    ghc_tensor_free(tr->norms);
    ghc_tensor_free(tr->flat);
    ghc_outdir_close_logs(tr);
    tr->ds = tr->vds = NULL;
    tr->sq = tr->norms = tr->flat = NULL;
}

/* A write to metrics.jsonl or the event file failed (a full disk): stop at once rather than
 * train on without logs until the final save fails too, with a checkpoint where one can
 * still be written. Returns the run's status, the message saying which. */
static int stop_on_log_error(struct ghc_trainer *tr)
{
    ghc_core_t *core = tr->core;
    char msg[GHC_ERROR_MAX];
    snprintf(msg, sizeof(msg), "%s", ghc_error_message(core));
    ghc_outdir_close_logs(tr);
    if (ghc_checkpoint_write(tr) == 0)
        return ghc_error_set(core, GHC_EIO, "%s: stopped at step %lld with checkpoint %s/checkpoint-%lld; continue "
                             "with --resume %s/checkpoint-%lld once the disk has room", msg, (long long)tr->step,
                             tr->out, (long long)tr->step, tr->out, (long long)tr->step);
    return ghc_error_set(core, GHC_EIO, "%s: stopped at step %lld; no checkpoint could be written either (%s)", msg,
                         (long long)tr->step, ghc_error_message(core));
}

int ghc_train_check(ghc_core_t *core, const struct ghc_train_opts *opts)
{
    struct ghc_trainer tr = { .core = core, .active = -1 };
    stop_signal = 0;
    int rc = dist_setup(&tr, opts);
    if (rc == 0)
        rc = ghc_train_prepare(&tr, opts);
    trainer_free(&tr);
    return rc;
}

int ghc_train(ghc_core_t *core, const struct ghc_train_opts *opts)
{
    struct ghc_trainer tr = { .core = core, .active = -1, .progress = opts && opts->progress };
    int rc;
    stop_signal = 0;
    if ((rc = dist_setup(&tr, opts)) < 0 || (rc = ghc_train_prepare(&tr, opts)) < 0)
        goto out;
    if (tr.resumed && tr.resumed_world != tr.world && tr.writer)
        ghc_log(core, GHC_LOG_INFO, "train: %s was trained by %d rank%s, this run has %d: the data position carries "
                "over (every rank count trains the same global batch, batch_size x micro-batches)", opts->resume,
                tr.resumed_world, tr.resumed_world == 1 ? "" : "s", tr.world);
    /* from here on output_dir is written, by rank 0 alone; the demo's data before the others
     * open it */
    if (tr.writer && (rc = ghc_outdir_create(&tr)) < 0)
        goto out;
    if (tr.demo && ((tr.writer && (rc = ghc_demo_generate(core)) < 0) ||
                    (tr.world > 1 && (rc = tr.dist->barrier(tr.dist->user)) < 0) ||
                    (!tr.writer && (rc = ghc_demo_point(core)) < 0) || (rc = ghc_train_open_data(&tr)) < 0))
        goto out;
    if (tr.writer && (rc = ghc_outdir_open_logs(&tr)) < 0)
        goto out;
    if (tr.writer)
        ghc_progress_begin(&tr);
    while (tr.step < tr.c.steps) {
        if (tr.world > 1 ? tr.dist_stop : stop_signal != 0)
            break;
        profile_at(&tr, true);
        if ((rc = train_step(&tr)) < 0 ||
            (tr.writer && tr.c.validate_every && tr.step % tr.c.validate_every == 0 && (rc = validate(&tr)) < 0)) {
            if (tr.log_failed)
                rc = stop_on_log_error(&tr);
            goto out;
        }
        profile_at(&tr, false);
        if (tr.c.save_every && tr.step % tr.c.save_every == 0 && tr.step < tr.c.steps &&
            ((rc = dist_check_adapters(&tr)) < 0 || (tr.writer && (rc = ghc_checkpoint_write(&tr)) < 0)))
            goto out;
    }
    /* several ranks stop together, after the step where one was asked to */
    bool stopped = tr.world > 1 ? tr.dist_stop : stop_signal != 0;
    if (stopped && tr.writer)
        ghc_progress_stop(&tr);
    if ((rc = dist_check_adapters(&tr)) < 0 || (tr.writer && (rc = ghc_checkpoint_write(&tr)) < 0))
        goto out;
    if (!tr.writer) {
        /* rank 0 saves */
        if (stopped)
            rc = ghc_error_set(core, GHC_EINTERRUPTED, "train: stopped at step %lld; rank 0 wrote the checkpoint",
                               (long long)tr.step);
        goto out;
    }
    if (stopped) {
        rc = ghc_error_set(core, GHC_EINTERRUPTED, "train: stopped by signal %d at step %lld; continue with --resume "
                           "%s/checkpoint-%lld", (int)(stop_signal ? stop_signal : SIGTERM), (long long)tr.step, tr.out, (long long)tr.step);
        goto out;
    }
    char first_file[8400] = "";
    if ((rc = ghc_checkpoint_save_adapters(&tr, tr.out, first_file, sizeof(first_file))) < 0)
        goto out;
    ghc_progress_done(&tr, first_file);
out:
    trainer_free(&tr);
    if (rc < 0 && !tr.wrote_checkpoint && tr.writer)
        ghc_outdir_undo(&tr);
    return rc;
}
