/* train.c: the trainer (spec/training.md). One optimizer step s:
 *   the expert of the step (single: fixed; separate: alternating every switch_every steps,
 *   never inside a window; shared: per micro-batch from its first sigma), the window size
 *   GA(s) and lr factor from the scheduler, then GA micro-batches of
 *     sigma per sample (the family restricted to the expert's range), noise (Philox, or the
 *     sample's stored noise), x_sigma = (1 - sigma) x0 + sigma noise, v = noise - x0,
 *     forward at t = 1000 sigma, loss_i = mean((v_hat - v)^2) weighted, backward;
 *   the gradient is the sum over the window divided by its samples; a non-finite loss skips
 *   the step; clipping by the global norm; the optimizer step of the expert's group.
 * Every generator's state is a counter written to trainer.json with each checkpoint, so a
 * resumed run continues exactly. */
#include <config.h>

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include <gh200core/dataset.h>
#include <gh200core/gh200core.h>
#include <gh200core/ops.h>
#include <gh200core/safetensors.h>
#include <gh200core/tensor.h>
#include <gh200core/train.h>

#include "core_impl.h"
#include "train_impl.h"

static volatile sig_atomic_t stop_signal;

void ghc_train_request_stop(int sig) { stop_signal = sig ? sig : SIGTERM; }
int ghc_train_stop_signal(void) { return (int)stop_signal; }

/* ---- configuration -------------------------------------------------------------------------- */

enum mode { MODE_SINGLE = 0, MODE_SEPARATE, MODE_SHARED };
enum weighting { WEIGHT_NONE = 0, WEIGHT_SIGMA_SQRT, WEIGHT_COSMAP };

static const char *const mode_names[] = { "single", "separate", "shared", NULL };
static const char *const expert_names[] = { "high", "low", NULL };
static const char *const weighting_names[] = { "none", "sigma_sqrt", "cosmap", NULL };

static const struct ghc_cfg_key train_keys[] = {
    { "steps",         GHC_CFG_INT,    "100",     "1 to 2^40",               NULL },  /* optimizer steps */
    /* two-expert models */
    { "mode",          GHC_CFG_STRING, "single",  "single, separate, shared", NULL },
    /* single mode */
    { "expert",        GHC_CFG_STRING, "high",    "high, low",                NULL },
    /* separate mode: optimizer steps per expert turn */
    { "switch_every",  GHC_CFG_INT,    "10",      "1 to 2^40",                NULL },
    { "sampler",       GHC_CFG_STRING, "uniform", "uniform, sigmoid, logit_normal, shift, flux_shift", NULL },
    { "shift_base",    GHC_CFG_STRING, "sigmoid", "sigmoid, uniform",         NULL },
    { "sigmoid_scale", GHC_CFG_FLOAT,  "1.0",     "1e-6 to 1e6",              NULL },
    { "logit_mean",    GHC_CFG_FLOAT,  "0.0",     "-1e3 to 1e3",              NULL },
    { "logit_std",     GHC_CFG_FLOAT,  "1.0",     "1e-6 to 1e3",              NULL },
    { "shift",         GHC_CFG_FLOAT,  "1.0",     "1e-6 to 1e6",              NULL },
    /* rejection rounds per sigma */
    { "max_tries",     GHC_CFG_INT,    "10000",   "1 to 2^30",                NULL },
    /* musubi compatibility: t = 1000 sigma + 1 */
    { "t_offset",      GHC_CFG_BOOL,   "false",   NULL,                       NULL },
    /* use samples' stored noise and timestep */
    { "stored_noise",  GHC_CFG_BOOL,   "true",    NULL,                       NULL },
    { "weighting",     GHC_CFG_STRING, "none",    "none, sigma_sqrt, cosmap", NULL },
    /* 0: no clipping */
    { "max_grad_norm", GHC_CFG_FLOAT,  "1.0",     "0 to 1e30",                NULL },
    /* checkpoint every N steps (0: at the end only) */
    { "save_every",    GHC_CFG_INT,    "0",       "0 to 2^40",                NULL },
    /* checkpoints kept (0: all) */
    { "keep_last",     GHC_CFG_INT,    "3",       "0 to 2^20",                NULL },
    /* adapter file base name */
    { "name",          GHC_CFG_STRING, "adapter", NULL,                       NULL },
    /* non-finite losses in a row before aborting */
    { "max_bad_steps", GHC_CFG_INT,    "5",       "1 to 2^20",                NULL },
    { "tensorboard",   GHC_CFG_BOOL,   "true",    NULL,                       NULL },
    /* plain progress lines every N steps */
    { "log_every",     GHC_CFG_INT,    "10",      "1 to 2^40",                NULL },
    /* wait for the GPU after each phase: exact phase times */
    { "sync_timing",   GHC_CFG_BOOL,   "false",   NULL,                       NULL },
    /* 0: no validation */
    { "validate_every", GHC_CFG_INT,   "0",       "0 to 2^40",                NULL },
    { "validation_sigmas", GHC_CFG_LIST, "(0.25, 0.5, 0.75)", "(0, 1], at most 16", NULL },
    { "validation_batches", GHC_CFG_INT, "1",     "1 to 2^20",                NULL },
    { NULL, 0, NULL, NULL, NULL }
};

const struct ghc_cfg_key *ghc_train_section_keys(const char *section)
{
    if (!strcmp(section, "train"))
        return train_keys;
    if (!strcmp(section, "demo"))
        return ghc_demo_keys;
    return NULL;
}

struct cfg {
    int64_t steps, switch_every, max_tries, save_every, keep_last, max_bad, log_every;
    int64_t validate_every, validation_batches;
    int     mode, expert, weighting;
    bool    t_offset, tensorboard, stored_noise, sync_timing;
    double  max_grad_norm;
    const char *name;
    double  vsig[16];
    int     n_vsig;
};

/* ---- the trainer's state -------------------------------------------------------------------- */

#define MAX_ADAPTERS 2

struct trainer {
    ghc_core_t        *core;
    struct cfg         c;
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
    int32_t            adapter_expert[MAX_ADAPTERS];  /* the model expert it serves (-1 shared) */
    struct ghc_param  *params[MAX_ADAPTERS];
    int32_t            n_params[MAX_ADAPTERS];
    struct ghc_sampler sampler;
    struct ghc_rng     noise_rng;
    /* position (checkpointed) */
    int64_t            step;                     /* optimizer steps done */
    int64_t            adapter_steps[MAX_ADAPTERS];
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
    bool               made_resolved, made_demo, made_metrics, wrote_checkpoint;
    char               tb_path[8400];            /* the event file this run opened, or "" */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int read_cfg(ghc_core_t *core, ghc_cfg_t *s, struct cfg *c, struct ghc_sampler *smp)
{
    int rc, fam = GHC_SAMPLER_UNIFORM, base = 0;
    if ((rc = ghc_cfg_get_int(s, "steps", 100, 1, INT64_C(1) << 40, &c->steps)) < 0 ||
        (rc = ghc_cfg_get_choice(s, "mode", MODE_SINGLE, mode_names, &c->mode)) < 0 ||
        (rc = ghc_cfg_get_choice(s, "expert", 0, expert_names, &c->expert)) < 0 ||
        (rc = ghc_cfg_get_int(s, "switch_every", 10, 1, INT64_C(1) << 40, &c->switch_every)) < 0 ||
        (rc = ghc_cfg_get_choice(s, "sampler", GHC_SAMPLER_UNIFORM, ghc_sampler_family_names, &fam)) < 0 ||
        (rc = ghc_cfg_get_choice(s, "shift_base", 0, ghc_sampler_base_names, &base)) < 0 ||
        (rc = ghc_cfg_get_float(s, "sigmoid_scale", 1.0, 1e-6, 1e6, &smp->scale)) < 0 ||
        (rc = ghc_cfg_get_float(s, "logit_mean", 0.0, -1e3, 1e3, &smp->mean)) < 0 ||
        (rc = ghc_cfg_get_float(s, "logit_std", 1.0, 1e-6, 1e3, &smp->std)) < 0 ||
        (rc = ghc_cfg_get_float(s, "shift", 1.0, 1e-6, 1e6, &smp->shift)) < 0 ||
        (rc = ghc_cfg_get_int(s, "max_tries", 10000, 1, INT64_C(1) << 30, &c->max_tries)) < 0 ||
        (rc = ghc_cfg_get_bool(s, "t_offset", false, &c->t_offset)) < 0 ||
        (rc = ghc_cfg_get_bool(s, "stored_noise", true, &c->stored_noise)) < 0 ||
        (rc = ghc_cfg_get_choice(s, "weighting", WEIGHT_NONE, weighting_names, &c->weighting)) < 0 ||
        (rc = ghc_cfg_get_float(s, "max_grad_norm", 1.0, 0.0, 1e30, &c->max_grad_norm)) < 0 ||
        (rc = ghc_cfg_get_int(s, "save_every", 0, 0, INT64_C(1) << 40, &c->save_every)) < 0 ||
        (rc = ghc_cfg_get_int(s, "keep_last", 3, 0, 1 << 20, &c->keep_last)) < 0 ||
        (rc = ghc_cfg_get_string(s, "name", "adapter", &c->name)) < 0 ||
        (rc = ghc_cfg_get_int(s, "max_bad_steps", 5, 1, 1 << 20, &c->max_bad)) < 0 ||
        (rc = ghc_cfg_get_bool(s, "tensorboard", true, &c->tensorboard)) < 0 ||
        (rc = ghc_cfg_get_bool(s, "sync_timing", false, &c->sync_timing)) < 0 ||
        (rc = ghc_cfg_get_int(s, "log_every", 10, 1, INT64_C(1) << 40, &c->log_every)) < 0 ||
        (rc = ghc_cfg_get_int(s, "validate_every", 0, 0, INT64_C(1) << 40, &c->validate_every)) < 0 ||
        (rc = ghc_cfg_get_int(s, "validation_batches", 1, 1, 1 << 20, &c->validation_batches)) < 0 ||
        (rc = ghc_cfg_list_len(s, "validation_sigmas", &c->n_vsig)) < 0)
        return rc;
    if (!*c->name || strchr(c->name, '/'))
        return ghc_error_set(core, GHC_ECONFIG, "%s: name must be a plain file name", ghc_cfg_where(s, "name"));
    if (c->n_vsig > 16)
        return ghc_error_set(core, GHC_ECONFIG, "%s: at most 16 validation sigmas", ghc_cfg_where(s, "validation_sigmas"));
    for (int i = 0; i < c->n_vsig; i++) {
        if ((rc = ghc_cfg_list_float(s, "validation_sigmas", i, &c->vsig[i])) < 0)
            return rc;
        if (!(c->vsig[i] > 0.0 && c->vsig[i] <= 1.0))
            return ghc_error_set(core, GHC_ECONFIG, "%s: validation sigmas must lie in (0, 1], not %g",
                                 ghc_cfg_where(s, "validation_sigmas"), c->vsig[i]);
    }
    if (c->validate_every && !c->n_vsig) {
        c->n_vsig = 3;
        c->vsig[0] = 0.25, c->vsig[1] = 0.5, c->vsig[2] = 0.75;
    }
    smp->family = (enum ghc_sampler_family)fam;
    smp->base = (enum ghc_sampler_base)base;
    smp->max_tries = c->max_tries;
    return 0;
}

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
static int to_host(struct trainer *tr, ghc_tensor_t *src, float *dst, int64_t n)
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

static ghc_tensor_t *tensor(struct trainer *tr, enum ghc_dtype dt, int nd, const int64_t *shape, int device,
                            enum ghc_mem_role role)
{
    return ghc_tensor_init(tr->core, dt, nd, shape, device, role);
}

/* ---- experts and adapters ------------------------------------------------------------------- */

/* The sigma where the model's routing changes (expert 0 = high noise at and above it), by
 * bisection on expert_for(t = 1000 sigma): plugin-agnostic. */
static double find_boundary(ghc_model_t *m)
{
    double lo = 0.0, hi = 1.0;   /* expert_for(1000 hi) == 0 (high), expert_for(1000 lo) == 1 */
    for (int i = 0; i < 60; i++) {
        double mid = 0.5 * (lo + hi);
        if (ghc_model_expert_for(m, (float)(1000.0 * mid)) == 0)
            hi = mid;
        else
            lo = mid;
    }
    /* the smallest float t that routes high, as a sigma */
    float t = (float)(1000.0 * hi);
    while (ghc_model_expert_for(m, nextafterf(t, 0.0f)) == 0)
        t = nextafterf(t, 0.0f);
    return (double)t / 1000.0;
}

/* The sigma range of a model expert. */
static void expert_range(const struct trainer *tr, int32_t e, double *lo, double *hi)
{
    if (tr->n_experts < 2 || e < 0) {
        *lo = 0.0, *hi = 1.0;
    } else if (e == 0) {
        *lo = tr->boundary, *hi = 1.0;
    } else {
        *lo = 0.0, *hi = tr->boundary;
    }
}

static int32_t route(const struct trainer *tr, double sigma)
{
    return tr->n_experts < 2 ? 0 : sigma >= tr->boundary ? 0 : 1;
}

/* The adapter slot serving model expert e. */
static int adapter_of(const struct trainer *tr, int32_t e)
{
    if (tr->c.mode == MODE_SHARED)
        return 0;
    for (int a = 0; a < tr->n_adapters; a++)
        if (tr->adapter_expert[a] == e)
            return a;
    return 0;
}

/* The expert whose turn step s is (single and separate modes). */
static int32_t expert_of_step(const struct trainer *tr, int64_t s)
{
    if (tr->c.mode == MODE_SEPARATE)
        return tr->adapter_expert[(s / tr->c.switch_every) % tr->n_adapters];
    return tr->adapter_expert[0] < 0 ? 0 : tr->adapter_expert[0];
}

static const char *expert_suffix(const struct trainer *tr, int a)
{
    if (tr->n_experts < 2 || tr->adapter_expert[a] < 0)
        return "";
    return tr->adapter_expert[a] == 0 ? "_high_noise" : "_low_noise";
}

static int activate(struct trainer *tr, int32_t e)
{
    if (tr->active == e)
        return 0;
    int rc;
    struct ghc_adapter_hook hook;
    int a = adapter_of(tr, e);
    if ((rc = ghc_model_activate(tr->model, e)) < 0 ||
        (rc = ghc_network_hook(tr->net, tr->c.mode == MODE_SHARED ? 0 : tr->adapter_expert[a], &hook)) < 0 ||
        (rc = ghc_model_set_hook(tr->model, &hook)) < 0)
        return rc;
    if (tr->mp && (rc = ghc_mem_phase(tr->mp, GHC_PHASE_EXPERT_SWITCH, e)) < 0)
        return rc;
    if (tr->active >= 0)
        ghc_log(tr->core, GHC_LOG_DEBUG, "train: step %lld: expert %s", (long long)tr->step, expert_names[e]);
    tr->active = e;
    return 0;
}

static int setup_adapters(struct trainer *tr)
{
    ghc_core_t *core = tr->core;
    const struct ghc_model_target *targets;
    int32_t n_targets;
    int rc;
    if ((rc = ghc_model_targets(tr->model, &targets, &n_targets)) < 0)
        return rc;
    if (tr->n_experts < 2) {
        if (tr->c.mode != MODE_SINGLE)
            ghc_log(core, GHC_LOG_WARN, "train: mode = \"%s\" needs a two-expert model; this one has one expert: training it alone",
                    mode_names[tr->c.mode]);
        tr->c.mode = MODE_SINGLE;
        tr->n_adapters = 1;
        tr->adapter_expert[0] = 0;
    } else if (tr->c.mode == MODE_SINGLE) {
        tr->n_adapters = 1;
        tr->adapter_expert[0] = tr->c.expert;
    } else if (tr->c.mode == MODE_SEPARATE) {
        tr->n_adapters = 2;
        tr->adapter_expert[0] = 0;
        tr->adapter_expert[1] = 1;
    } else {
        tr->n_adapters = 1;
        tr->adapter_expert[0] = -1;
    }
    for (int a = 0; a < tr->n_adapters; a++) {
        int32_t e = tr->adapter_expert[a] < 0 ? 0 : tr->adapter_expert[a];
        if ((rc = ghc_network_attach(tr->net, e, targets, n_targets)) < 0 ||
            (rc = ghc_network_params(tr->net, e, &tr->params[a], &tr->n_params[a])) < 0)
            return rc;
        /* Optimizer groups: 0 high noise, 1 low noise (stage-specific settings), -1 plain. */
        for (int32_t i = 0; i < tr->n_params[a]; i++)
            tr->params[a][i].group = tr->n_experts < 2 ? -1 : tr->adapter_expert[a];
        if ((rc = ghc_optimizer_add_params(tr->opt, tr->params[a], tr->n_params[a])) < 0)
            return rc;
    }
    /* grad-norm workspace: the largest grad, and one norm per param */
    int64_t maxn = 1, np = 0;
    for (int a = 0; a < tr->n_adapters; a++)
        for (int32_t i = 0; i < tr->n_params[a]; i++, np++)
            if (ghc_tensor_numel(tr->params[a][i].grad) > maxn)
                maxn = ghc_tensor_numel(tr->params[a][i].grad);
    np = np ? np : 1;
    if (!(tr->sq = tensor(tr, GHC_DTYPE_F32, 1, &maxn, tr->device, GHC_ROLE_WORKSPACE)) ||
        !(tr->norms = tensor(tr, GHC_DTYPE_F32, 1, &np, tr->device, GHC_ROLE_WORKSPACE)))
        return ghc_error_code(core) ? ghc_error_code(core) : GHC_ENOMEM;
    return 0;
}

/* ---- the loss of one micro-batch ------------------------------------------------------------ */

static float weight_of(int w, double sigma)
{
    switch (w) {
    case WEIGHT_SIGMA_SQRT: return (float)(1.0 / (sigma * sigma));
    case WEIGHT_COSMAP:     return (float)(2.0 / (M_PI * (1.0 - 2.0 * sigma + 2.0 * sigma * sigma)));
    default:                return 1.0f;
    }
}

/* The sigmas of a batch: stored timesteps, else drawn. *expert: the expert they route to (the
 * step's in single/separate modes; shared: the first sample's). */
static int draw_sigmas(struct trainer *tr, const struct ghc_data_batch *b, int32_t *expert, double *sig)
{
    ghc_core_t *core = tr->core;
    int rc;
    int64_t n = b->n;
    if (b->timesteps && tr->c.stored_noise) {
        float t[4096];
        if (n > 4096)
            return ghc_error_set(core, GHC_EINVAL, "train: batch of %lld samples is too large", (long long)n);
        if ((rc = to_host(tr, b->timesteps, t, n)) < 0)
            return rc;
        for (int64_t i = 0; i < n; i++) {
            sig[i] = t[i] / 1000.0;
            if (!(sig[i] > 0.0 && sig[i] <= 1.0))
                return ghc_error_set(core, GHC_EFORMAT, "train: a stored timestep %g is outside (0, 1000]", t[i]);
            if (i && route(tr, sig[i]) != route(tr, sig[0]))
                return ghc_error_set(core, GHC_EFORMAT, "train: the stored timesteps of one batch route to different experts");
        }
        *expert = route(tr, sig[0]);
        if (tr->c.mode != MODE_SHARED && tr->n_experts > 1 && *expert != expert_of_step(tr, tr->step))
            return ghc_error_set(core, GHC_EFORMAT, "train: a stored timestep routes to the %s-noise expert, not the one trained at step %lld",
                                 expert_names[*expert], (long long)tr->step);
        return 0;
    }
    const int64_t *sh = ghc_tensor_shape(b->latents);
    double k = tr->sampler.family == GHC_SAMPLER_FLUX_SHIFT
             ? ghc_sampler_flux_k((sh[3] / 2) * (sh[4] / 2)) : tr->sampler.shift;
    int32_t e;
    int64_t first = 0;
    if (tr->c.mode == MODE_SHARED) {
        tr->sampler.lo = 0.0, tr->sampler.hi = 1.0;
        if ((rc = ghc_sampler_draw(core, &tr->sampler, k, &sig[0])) < 0)
            return rc;
        e = route(tr, sig[0]);
        first = 1;
    } else {
        e = expert_of_step(tr, tr->step);
    }
    expert_range(tr, e, &tr->sampler.lo, &tr->sampler.hi);
    for (int64_t i = first; i < n; i++)
        if ((rc = ghc_sampler_draw(core, &tr->sampler, k, &sig[i])) < 0)
            return rc;
    *expert = e;
    return 0;
}

/* Forward, loss and (train) backward of one batch. losses: n f32 slots on the device for the
 * per-sample weighted losses. */
static int run_batch(struct trainer *tr, const struct ghc_data_batch *b, int32_t e, const double *sig,
                     ghc_tensor_t *losses, int64_t slot, bool train)
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
    if (noise != b->noise)
        ghc_tensor_free(noise);
    ghc_tensor_free(xs);
    ghc_tensor_free(v);
    ghc_tensor_free(out);
    ghc_tensor_free(dout);
    ghc_tensor_free(tt);
    return rc;
}

/* ---- gradients ------------------------------------------------------------------------------ */

static int grads_zero(struct trainer *tr, int a)
{
    int rc;
    for (int32_t i = 0; i < tr->n_params[a]; i++)
        if ((rc = ghc_op_fill(tr->params[a][i].grad, 0.0, NULL)) < 0)
            return rc;
    return 0;
}

static int grads_scale(struct trainer *tr, int a, float f)
{
    int rc;
    for (int32_t i = 0; i < tr->n_params[a]; i++)
        if ((rc = ghc_op_scale(tr->params[a][i].grad, tr->params[a][i].grad, f, NULL)) < 0)
            return rc;
    return 0;
}

/* The global L2 norm of adapter a's grads. */
static int grads_norm(struct trainer *tr, int a, double *norm)
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

/* ---- files ---------------------------------------------------------------------------------- */

static int mkdir_one(ghc_core_t *core, const char *path)
{
    if (mkdir(path, 0777) != 0 && errno != EEXIST)
        return ghc_error_set(core, GHC_EIO, "%s: cannot create: %s", path, strerror(errno));
    return 0;
}

static int rm_rf(ghc_core_t *core, const char *path)
{
    DIR *d = opendir(path);
    if (!d)
        return errno == ENOENT ? 0 : ghc_error_set(core, GHC_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct dirent *e;
    char p[8192];
    int rc = 0;
    while ((e = readdir(d)) && rc == 0) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        snprintf(p, sizeof(p), "%s/%s", path, e->d_name);
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode))
            rc = rm_rf(core, p);
        else if (unlink(p) != 0)
            rc = ghc_error_set(core, GHC_EIO, "%s: cannot remove: %s", p, strerror(errno));
    }
    closedir(d);
    if (rc == 0 && rmdir(path) != 0)
        rc = ghc_error_set(core, GHC_EIO, "%s: cannot remove: %s", path, strerror(errno));
    return rc;
}

/* Adapter files of every adapter into dir, as <name>[_<step>]<suffix>.safetensors. */
static int save_adapters(struct trainer *tr, const char *dir, int64_t step, char *first, size_t len)
{
    int rc;
    for (int a = 0; a < tr->n_adapters; a++) {
        char p[8192];
        if (step >= 0)
            snprintf(p, sizeof(p), "%s/%s_%06lld%s.safetensors", dir, tr->c.name, (long long)step, expert_suffix(tr, a));
        else
            snprintf(p, sizeof(p), "%s/%s%s.safetensors", dir, tr->c.name, expert_suffix(tr, a));
        int32_t e = tr->adapter_expert[a] < 0 ? 0 : tr->adapter_expert[a];
        if ((rc = ghc_network_save(tr->net, e, p)) < 0)
            return rc;
        if (first && a == 0)
            snprintf(first, len, "%s", p);
    }
    return 0;
}

static int write_state(struct trainer *tr, const char *path)
{
    int64_t epoch = 0, cursor = 0;
    int rc = ghc_dataset_tell(tr->ds, &epoch, &cursor);
    if (rc < 0)
        return rc;
    json_t *j = json_object(), *as = json_array();
    for (int a = 0; a < tr->n_adapters; a++)
        json_array_append_new(as, json_integer(tr->adapter_steps[a]));
    json_object_set_new(j, "format", json_string("gh200core-trainer-state"));
    json_object_set_new(j, "version", json_integer(1));
    json_object_set_new(j, "step", json_integer(tr->step));
    json_object_set_new(j, "mode", json_string(mode_names[tr->c.mode]));
    json_object_set_new(j, "adapters", json_integer(tr->n_adapters));
    json_object_set_new(j, "adapter_steps", as);
    json_object_set_new(j, "active_expert", json_integer(tr->active));
    json_object_set_new(j, "data_epoch", json_integer(epoch));
    json_object_set_new(j, "data_cursor", json_integer(cursor));
    /* 64-bit counters as strings: JSON numbers lose bits past 2^53 in other readers */
    char buf[32];
    snprintf(buf, sizeof(buf), "%llu", (unsigned long long)tr->sampler.counter);
    json_object_set_new(j, "sampler_counter", json_string(buf));
    snprintf(buf, sizeof(buf), "%llu", (unsigned long long)tr->noise_rng.offset);
    json_object_set_new(j, "noise_offset", json_string(buf));
    json_object_set_new(j, "bad_total", json_integer(tr->bad_total));
    json_object_set_new(j, "bad_in_row", json_integer(tr->bad_in_row));
    json_object_set_new(j, "samples_seen", json_integer(tr->samples_seen));
    json_object_set_new(j, "loss_ema", json_real(tr->loss_ema));
    rc = json_dump_file(j, path, JSON_INDENT(2) | JSON_SORT_KEYS) == 0 ? 0
       : ghc_error_set(tr->core, GHC_EIO, "%s: cannot write the trainer state", path);
    json_decref(j);
    return rc;
}

static int u64_of(json_t *j, const char *key, uint64_t *out)
{
    json_t *v = json_object_get(j, key);
    if (!json_is_string(v))
        return -1;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(json_string_value(v), &end, 10);
    if (errno || *end)
        return -1;
    *out = x;
    return 0;
}

static int read_state(struct trainer *tr, const char *path)
{
    ghc_core_t *core = tr->core;
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    if (!j)
        return ghc_error_set(core, GHC_EFORMAT, "%s:%d: %s", path, err.line, err.text);
    int rc = 0;
    json_t *as = json_object_get(j, "adapter_steps");
    const char *mode = json_string_value(json_object_get(j, "mode"));
    if (!json_is_integer(json_object_get(j, "step")) || !json_is_array(as) || !mode ||
        u64_of(j, "sampler_counter", &tr->sampler.counter) < 0 ||
        u64_of(j, "noise_offset", &tr->noise_rng.offset) < 0 ||
        !json_is_integer(json_object_get(j, "data_epoch")) || !json_is_integer(json_object_get(j, "data_cursor"))) {
        rc = ghc_error_set(core, GHC_EFORMAT, "%s: not a gh200core trainer state (a key is missing or of the wrong type)", path);
        goto out;
    }
    if (strcmp(mode, mode_names[tr->c.mode]) != 0 || (int)json_array_size(as) != tr->n_adapters) {
        rc = ghc_error_set(core, GHC_ECONFIG, "%s: the checkpoint was made in mode '%s' with %d adapter(s); this configuration trains in mode '%s' with %d",
                           path, mode, (int)json_array_size(as), mode_names[tr->c.mode], tr->n_adapters);
        goto out;
    }
    tr->step = json_integer_value(json_object_get(j, "step"));
    for (int a = 0; a < tr->n_adapters; a++)
        tr->adapter_steps[a] = json_integer_value(json_array_get(as, (size_t)a));
    tr->bad_total = json_integer_value(json_object_get(j, "bad_total"));
    tr->bad_in_row = json_integer_value(json_object_get(j, "bad_in_row"));
    tr->samples_seen = json_integer_value(json_object_get(j, "samples_seen"));
    tr->loss_ema = json_real_value(json_object_get(j, "loss_ema"));
    /* the dataset seeks there once it is open (the demo's only after it is generated) */
    tr->resumed = true;
    tr->resume_epoch = json_integer_value(json_object_get(j, "data_epoch"));
    tr->resume_cursor = json_integer_value(json_object_get(j, "data_cursor"));
out:
    json_decref(j);
    return rc;
}

/* The adapters' fp32 params exactly as trained (the adapter files may be saved in bf16 or
 * f16): params.safetensors of a checkpoint, restored over what the adapter files loaded. */
static int save_params(struct trainer *tr, const char *path)
{
    ghc_core_t *core = tr->core;
    ghc_st_writer_t *w = ghc_st_writer_init(core);
    int rc = w ? 0 : GHC_ENOMEM;
    for (int a = 0; a < tr->n_adapters && rc == 0; a++)
        for (int32_t i = 0; i < tr->n_params[a] && rc == 0; i++) {
            ghc_tensor_t *v = tr->params[a][i].value, *h = v;
            if (ghc_tensor_device(v) != GHC_DEVICE_CPU) {
                if (!(h = ghc_tensor_init(core, ghc_tensor_dtype(v), ghc_tensor_ndim(v), ghc_tensor_shape(v),
                                          GHC_DEVICE_CPU, GHC_ROLE_WORKSPACE)))
                    rc = ghc_error_code(core);
                else if ((rc = ghc_op_copy(h, v, NULL)) == 0)
                    rc = ghc_op_sync(core, ghc_tensor_device(v), NULL);
            }
            if (rc == 0)
                rc = ghc_st_writer_add(w, tr->params[a][i].name, h);
            if (h != v)
                ghc_tensor_free(h);
        }
    if (rc == 0 && (rc = ghc_st_writer_metadata(w, "format", "gh200core-params")) == 0)
        rc = ghc_st_writer_finish(w, path);
    ghc_st_writer_free(w);
    return rc;
}

static int load_params(struct trainer *tr, const char *path)
{
    ghc_core_t *core = tr->core;
    ghc_st_t *st = ghc_st_open(core, path);
    if (!st)
        return ghc_error_code(core) ? ghc_error_code(core) : GHC_EIO;
    int rc = 0;
    int32_t total = 0;
    for (int a = 0; a < tr->n_adapters; a++)
        total += tr->n_params[a];
    if (ghc_st_count(st) != total)
        rc = ghc_error_set(core, GHC_EFORMAT, "%s: %d tensors, but the adapters have %d params", path,
                           ghc_st_count(st), (int)total);
    for (int a = 0; a < tr->n_adapters && rc == 0; a++)
        for (int32_t i = 0; i < tr->n_params[a] && rc == 0; i++) {
            ghc_tensor_t *v = tr->params[a][i].value;
            struct ghc_st_info info;
            if (!ghc_st_find(st, tr->params[a][i].name, &info)) {
                rc = ghc_error_set(core, GHC_EFORMAT, "%s: no tensor '%s'", path, tr->params[a][i].name);
                break;
            }
            ghc_tensor_t *h = ghc_st_load(st, tr->params[a][i].name, ghc_tensor_dtype(v), GHC_ROLE_WORKSPACE);
            if (!h) {
                rc = ghc_error_code(core);
            } else if (!ghc_tensor_same_shape(h, v)) {
                rc = ghc_error_set(core, GHC_EFORMAT, "%s: '%s' has another shape than the adapter's param", path,
                                   tr->params[a][i].name);
            } else if ((rc = ghc_op_copy(v, h, NULL)) == 0) {
                rc = ghc_op_sync(core, ghc_tensor_device(v), NULL);
            }
            ghc_tensor_free(h);
        }
    ghc_st_free(st);
    return rc;
}

/* Removes all but the newest keep_last checkpoint-N folders. */
static int prune_checkpoints(struct trainer *tr)
{
    if (!tr->c.keep_last)
        return 0;
    DIR *d = opendir(tr->out);
    if (!d)
        return 0;
    int64_t steps[4096];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 4096) {
        char *end;
        if (strncmp(e->d_name, "checkpoint-", 11) != 0)
            continue;
        long long s = strtoll(e->d_name + 11, &end, 10);
        if (*end == '\0' && end != e->d_name + 11)
            steps[n++] = s;
    }
    closedir(d);
    int rc = 0;
    while (n > tr->c.keep_last && rc == 0) {
        int lo = 0;
        for (int i = 1; i < n; i++)
            if (steps[i] < steps[lo])
                lo = i;
        char p[8192];
        snprintf(p, sizeof(p), "%s/checkpoint-%lld", tr->out, (long long)steps[lo]);
        rc = rm_rf(tr->core, p);
        steps[lo] = steps[--n];
    }
    return rc;
}

/* output_dir/checkpoint-<step>/: adapters, optimizer state, trainer state, the resolved config;
 * written into a .tmp folder first and renamed, so a checkpoint is whole or absent. */
static int checkpoint(struct trainer *tr)
{
    ghc_core_t *core = tr->core;
    char dir[8192], tmp[8300], p[8400];
    snprintf(dir, sizeof(dir), "%s/checkpoint-%lld", tr->out, (long long)tr->step);
    snprintf(tmp, sizeof(tmp), "%s.tmp", dir);
    int rc;
    if ((rc = rm_rf(core, tmp)) < 0 || (rc = mkdir_one(core, tmp)) < 0 ||
        (rc = save_adapters(tr, tmp, -1, NULL, 0)) < 0)
        return rc;
    snprintf(p, sizeof(p), "%s/params.safetensors", tmp);
    if ((rc = save_params(tr, p)) < 0)
        return rc;
    snprintf(p, sizeof(p), "%s/optimizer.safetensors", tmp);
    if ((rc = ghc_optimizer_save(tr->opt, p)) < 0)
        return rc;
    snprintf(p, sizeof(p), "%s/trainer.json", tmp);
    if ((rc = write_state(tr, p)) < 0)
        return rc;
    snprintf(p, sizeof(p), "%s/resolved.cfg", tmp);
    if ((rc = ghc_config_write(core, p)) < 0)
        return rc;
    if ((rc = rm_rf(core, dir)) < 0)
        return rc;
    if (rename(tmp, dir) != 0)
        return ghc_error_set(core, GHC_EIO, "%s: cannot rename to %s: %s", tmp, dir, strerror(errno));
    tr->wrote_checkpoint = true;
    ghc_log(core, GHC_LOG_INFO, "train: step %lld: checkpoint %s", (long long)tr->step, dir);
    return prune_checkpoints(tr);
}

static int resume(struct trainer *tr, const char *dir)
{
    ghc_core_t *core = tr->core;
    char p[8400];
    int rc;
    for (int a = 0; a < tr->n_adapters; a++) {
        snprintf(p, sizeof(p), "%s/%s%s.safetensors", dir, tr->c.name, expert_suffix(tr, a));
        int32_t e = tr->adapter_expert[a] < 0 ? 0 : tr->adapter_expert[a];
        if ((rc = ghc_network_load(tr->net, e, p)) < 0)
            return rc;
    }
    snprintf(p, sizeof(p), "%s/params.safetensors", dir);
    if ((rc = load_params(tr, p)) < 0)
        return rc;
    snprintf(p, sizeof(p), "%s/optimizer.safetensors", dir);
    if ((rc = ghc_optimizer_load(tr->opt, p)) < 0)
        return rc;
    snprintf(p, sizeof(p), "%s/trainer.json", dir);
    if ((rc = read_state(tr, p)) < 0)
        return rc;
    ghc_log(core, GHC_LOG_INFO, "train: resumed from %s at step %lld", dir, (long long)tr->step);
    return 0;
}

/* ---- reporting ------------------------------------------------------------------------------ */

static void fmt_bytes(char *buf, size_t len, uint64_t b)
{
    if (b >= (1ull << 30))
        snprintf(buf, len, "%.1fG", (double)b / (double)(1ull << 30));
    else
        snprintf(buf, len, "%.0fM", (double)b / (double)(1ull << 20));
}

struct step_report {
    double loss, grad_norm, lr, lr_factor, t_step, t_data, t_fwd_bwd, t_opt;
    int32_t micro_batches, samples, expert;
    bool skipped;
};

static void report(struct trainer *tr, const struct step_report *r, int progress)
{
    struct ghc_mem_stats ms = { .struct_size = sizeof(ms) };
    if (tr->mp)
        ghc_mem_stats(tr->mp, &ms);
    if (tr->metrics) {
        fprintf(tr->metrics, "{\"step\":%lld,\"loss\":%.9g,\"loss_avg\":%.9g,\"lr\":%.9g,\"lr_factor\":%.9g,"
                "\"grad_norm\":%.9g,\"micro_batches\":%d,\"samples\":%d,\"expert\":%d,\"skipped\":%s,"
                "\"time_step\":%.6f,\"time_data\":%.6f,\"time_fwd_bwd\":%.6f,\"time_optimizer\":%.6f,"
                "\"mem_host\":%llu,\"mem_device\":%llu,\"mem_managed\":%llu,\"mem_peak\":%llu,\"uvm_stage\":%d}\n",
                (long long)tr->step, r->loss, tr->loss_ema, r->lr, r->lr_factor, r->grad_norm, r->micro_batches,
                r->samples, r->expert, r->skipped ? "true" : "false", r->t_step, r->t_data, r->t_fwd_bwd, r->t_opt,
                (unsigned long long)ms.bytes_host, (unsigned long long)ms.bytes_device,
                (unsigned long long)ms.bytes_managed, (unsigned long long)ms.bytes_peak, ms.stage);
        fflush(tr->metrics);
    }
    if (tr->tb && !r->skipped) {
        ghc_tboard_scalar(tr->tb, "train/loss", tr->step, (float)r->loss);
        ghc_tboard_scalar(tr->tb, "train/lr", tr->step, (float)r->lr);
        ghc_tboard_scalar(tr->tb, "train/grad_norm", tr->step, (float)r->grad_norm);
        ghc_tboard_scalar(tr->tb, "train/micro_batches", tr->step, (float)r->micro_batches);
        ghc_tboard_scalar(tr->tb, "time/step", tr->step, (float)r->t_step);
        ghc_tboard_flush(tr->tb);
    }
    double elapsed = now_s() - tr->t_start;
    int64_t done = tr->step, total = tr->c.steps;
    int64_t ran = done - tr->first_step;
    double per = elapsed / (double)(ran > 0 ? ran : 1);
    double eta = per * (double)(total - done);
    char host[16], dev[16];
    fmt_bytes(host, sizeof(host), ms.bytes_host + ms.bytes_managed);
    fmt_bytes(dev, sizeof(dev), ms.bytes_device);
    char line[512];
    snprintf(line, sizeof(line), "step %lld/%lld  loss %.4g (avg %.4g)  %.3g s/step  ETA %dm%02ds  mem host %s dev %s%s%s",
             (long long)done, (long long)total, r->loss, tr->loss_ema, r->t_step, (int)(eta / 60), (int)eta % 60,
             host, dev, ms.stage ? "  uvm stage " : "", ms.stage ? (ms.stage == 1 ? "1" : "2") : "");
    if (progress) {
        fprintf(stderr, "\r%-110s", line);
        if (done == total)
            fputc('\n', stderr);
        fflush(stderr);
    } else if (done % tr->c.log_every == 0 || done == total || done == 1) {
        ghc_log(tr->core, GHC_LOG_INFO, "%s", line);
    }
}

/* Mean loss over validation_batches batches at each validation sigma (fixed noise from a
 * generator of its own, so the numbers are comparable across steps). */
static int validate(struct trainer *tr)
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
        if (tr->c.mode != MODE_SHARED && tr->n_experts > 1 && e != expert_of_step(tr, tr->step))
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
            for (int64_t i = 0; i < n && i < 4096; i++)
                sig[i] = sigma;
            if (!(losses = tensor(tr, GHC_DTYPE_F32, 1, &n, tr->device, GHC_ROLE_WORKSPACE)))
                rc = ghc_error_code(core);
            else if ((rc = run_batch(tr, &b, e, sig, losses, 0, false)) == 0 && (rc = to_host(tr, losses, lh, n)) == 0)
                for (int64_t i = 0; i < n; i++, count++)
                    sum += lh[i] / weight_of(tr->c.weighting, sigma);
            ghc_tensor_free(losses);
            ghc_data_batch_release(vd, &b);
        }
        if (rc == 0 && count) {
            char tag[64];
            snprintf(tag, sizeof(tag), "validation/loss_sigma_%.3f", sigma);
            if (tr->tb)
                ghc_tboard_scalar(tr->tb, tag, tr->step, (float)(sum / (double)count));
            if (tr->metrics)
                fprintf(tr->metrics, "{\"step\":%lld,\"validation_sigma\":%.6g,\"validation_loss\":%.9g}\n",
                        (long long)tr->step, sigma, sum / (double)count);
            ghc_log(core, GHC_LOG_INFO, "train: step %lld: validation loss at sigma %.3g: %.6g",
                    (long long)tr->step, sigma, sum / (double)count);
        }
    }
    tr->noise_rng = saved;
    if (rc == 0)
        rc = ghc_dataset_seek(tr->ds, epoch, cursor);
    return rc;
}

/* ---- one optimizer step --------------------------------------------------------------------- */

static int train_step(struct trainer *tr, int progress)
{
    ghc_core_t *core = tr->core;
    double t0 = now_s(), t_data = 0.0, t_fb = 0.0;
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
    for (int32_t m = 0; m < ga && rc == 0; m++) {
        if (tr->c.sync_timing)
            ghc_op_sync(core, tr->device, NULL);
        double td = now_s();
        struct ghc_data_batch b;
        if ((rc = ghc_dataset_next(tr->ds, tr->device, NULL, &b)) < 0)
            break;
        t_data += now_s() - td;
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
        double tf = now_s();
        if (tr->c.sync_timing)
            ghc_op_sync(core, tr->device, NULL);
        if (rc == 0 && (rc = draw_sigmas(tr, &b, &e, sig)) == 0 && (rc = activate(tr, e)) == 0)
            rc = run_batch(tr, &b, e, sig, losses, used, true);
        if (tr->c.sync_timing)
            ghc_op_sync(core, tr->device, NULL);
        t_fb += now_s() - tf;
        used += b.n;
        samples += b.n;
        ghc_data_batch_release(tr->ds, &b);
    }
    if (rc < 0) {
        ghc_tensor_free(losses);
        return rc;
    }
    float *lh = malloc((size_t)used * sizeof(float));
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
    if (rc < 0)
        return rc;
    loss /= (double)samples;
    struct step_report r = { .loss = loss, .lr_factor = lrf, .micro_batches = ga, .samples = (int32_t)samples,
                             .expert = tr->active, .t_data = t_data, .t_fwd_bwd = t_fb };
    double t_opt = now_s();
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
    r.t_opt = now_s() - t_opt;
    tr->samples_seen += samples;
    tr->step++;
    r.t_step = now_s() - t0;
    report(tr, &r, progress);
    return 0;
}

/* ---- checks before anything is written ------------------------------------------------------ */

/* What the model takes (model.h, ghc_model_input); a model that does not say leaves the
 * data's shapes to its first forward. */
static int model_input(struct trainer *tr)
{
    ghc_core_t *core = tr->core;
    tr->in = (struct ghc_model_input){ .struct_size = sizeof(tr->in) };
    int rc = ghc_model_input_spec(tr->model, &tr->in);
    if (rc == GHC_EUNSUPPORTED) {
        ghc_log(core, GHC_LOG_DEBUG, "train: %s", ghc_error_message(core));
        ghc_error_clear(core);
        return 0;
    }
    if (rc < 0)
        return rc;
    tr->have_in = true;
    if (tr->in.cond_channels > 0)
        return ghc_error_set(core, GHC_EUNSUPPORTED, "train: the model takes %lld conditioning channels after the "
                             "latent's %lld (an image-to-video model; %s), which the trainer does not supply",
                             (long long)tr->in.cond_channels, (long long)tr->in.channels,
                             tr->in.channels_from ? tr->in.channels_from : "?");
    return 0;
}

/* A sample's file as the user finds it: the backend entry "<d>/<name>" under the folder of
 * `section`.datasets[d] (relative folders are relative to the configuration file). */
static const char *sample_file(ghc_core_t *core, const char *section, const char *entry, char *buf, size_t len)
{
    char *end;
    long d = strtol(entry, &end, 10);
    config_setting_t *sec = config_setting_get_member(config_root_setting(&core->config->lc), section);
    config_setting_t *sets = sec ? config_setting_get_member(sec, "datasets") : NULL;
    config_setting_t *set = sets && end != entry && *end == '/' && d >= 0 ? config_setting_get_elem(sets, (unsigned)d)
                                                                           : NULL;
    const char *root = NULL;
    if (!set || !config_setting_lookup_string(set, "path", &root))
        snprintf(buf, len, "%s", entry);
    else if (root[0] == '/' || !strcmp(core->config->dir, "."))
        snprintf(buf, len, "%s/%s", root, end + 1);
    else
        snprintf(buf, len, "%s/%s/%s", core->config->dir, root, end + 1);
    return buf;
}

static const char *const patch_dims[3] = { "frames", "height", "width" };

/* Every sample of `ds` (the data of `section`) against what the model takes: the latent's
 * channels, its frames, height and width against the patch, the text embedding's width and
 * rows. The first mismatch is the error (naming the sample's file and where the model's
 * number came from), with the count of the others. */
static int check_samples(struct trainer *tr, ghc_dataset_t *ds, const char *section)
{
    ghc_core_t *core = tr->core;
    const struct ghc_model_input *in = &tr->in;
    if (!tr->have_in)
        return 0;
    int64_t n = ghc_dataset_samples(ds), bad = 0;
    char first[GHC_ERRMSG_MAX] = "", f[4096];
    for (int64_t i = 0; i < n; i++) {
        struct ghc_data_sample_info si;
        char msg[GHC_ERRMSG_MAX];
        if (!ghc_dataset_sample_at(ds, i, &si))
            continue;
        const int64_t *ls = si.latent_shape;
        int k = 0;
        while (k < 3 && (in->patch[k] < 2 || ls[1 + k] % in->patch[k] == 0))
            k++;
        if (in->channels && ls[0] != in->channels)
            snprintf(msg, sizeof(msg), "%s: the latent [%lld, %lld, %lld, %lld] has %lld channels; the model takes %lld "
                     "(%s)", sample_file(core, section, si.latent_file, f, sizeof(f)), (long long)ls[0],
                     (long long)ls[1], (long long)ls[2], (long long)ls[3], (long long)ls[0], (long long)in->channels,
                     in->channels_from ? in->channels_from : "the model");
        else if (k < 3)
            snprintf(msg, sizeof(msg), "%s: the latent [%lld, %lld, %lld, %lld]: its %s, %lld, is not a multiple of %lld "
                     "(%s)", sample_file(core, section, si.latent_file, f, sizeof(f)), (long long)ls[0],
                     (long long)ls[1], (long long)ls[2], (long long)ls[3], patch_dims[k], (long long)ls[1 + k],
                     (long long)in->patch[k], in->patch_from ? in->patch_from : "the model's patch");
        else if (in->text_dim && si.text_dim != in->text_dim)
            snprintf(msg, sizeof(msg), "%s: the text embedding is [%lld, %lld], %lld wide; the model's text width is "
                     "%lld (%s)", sample_file(core, section, si.text_file, f, sizeof(f)), (long long)si.text_len,
                     (long long)si.text_dim, (long long)si.text_dim, (long long)in->text_dim,
                     in->text_dim_from ? in->text_dim_from : "the model");
        else if (in->text_len && si.text_len > in->text_len)
            snprintf(msg, sizeof(msg), "%s: the text embedding has %lld rows; the model takes at most %lld (%s)",
                     sample_file(core, section, si.text_file, f, sizeof(f)), (long long)si.text_len,
                     (long long)in->text_len, in->text_len_from ? in->text_len_from : "the model");
        else
            continue;
        if (!bad++)
            snprintf(first, sizeof(first), "%s", msg);
    }
    if (bad > 1)
        return ghc_error_set(core, GHC_ECONFIG, "%s: %s; and %lld more sample%s", section, first,
                             (long long)(bad - 1), bad == 2 ? " that does not fit" : "s that do not fit");
    return bad ? ghc_error_set(core, GHC_ECONFIG, "%s: %s", section, first) : 0;
}

/* The demo's keys, and its shapes against what the model takes (its data does not exist
 * before the run); read by ghc_demo_read, as ghc_demo_generate reads them once the run has
 * begun. */
static int check_demo(struct trainer *tr, ghc_cfg_t *s)
{
    ghc_core_t *core = tr->core;
    const struct ghc_model_input *in = &tr->in;
    struct ghc_demo_opts o;
    int rc = ghc_demo_read(s, &o);
    if (rc < 0)
        return rc;
    const int64_t *v = o.shape;
    const bool *given = o.given;
    const char *const *keys = o.shape_key;
    if (!tr->have_in)
        return 0;
    int i = -1;
    int64_t want = 0;
    const char *from = NULL, *what = "";
    if (in->channels && v[0] != in->channels)
        i = 0, want = in->channels, from = in->channels_from, what = "the model takes %lld latent channels";
    for (int k = 0; i < 0 && k < 3; k++)
        if (in->patch[k] > 1 && v[1 + k] % in->patch[k])
            i = 1 + k, want = in->patch[k], from = in->patch_from, what = "the model takes multiples of %lld";
    if (i < 0 && in->text_dim && v[5] != in->text_dim)
        i = 5, want = in->text_dim, from = in->text_dim_from, what = "the model's text width is %lld";
    if (i < 0 && in->text_len && v[4] > in->text_len)
        i = 4, want = in->text_len, from = in->text_len_from, what = "the model takes at most %lld text rows";
    if (i < 0)
        return 0;
    char need[128];
    snprintf(need, sizeof(need), what, (long long)want);
    return ghc_error_set(core, GHC_ECONFIG, "%s: demo.%s = %lld%s: %s (%s)", ghc_cfg_where(s, keys[i]), keys[i],
                         (long long)v[i], given[i] ? "" : " (the default)", need, from ? from : "the model");
}

/* ---- output_dir ----------------------------------------------------------------------------- */

/* The newest checkpoint-N folder in dir: *step gets N, -1 when there is none. */
static void newest_checkpoint(const char *dir, int64_t *step)
{
    *step = -1;
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end, p[8400];
        struct stat st;
        if (strncmp(e->d_name, "checkpoint-", 11) != 0)
            continue;
        long long s = strtoll(e->d_name + 11, &end, 10);
        snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
        if (*end == '\0' && end != e->d_name + 11 && s > *step && stat(p, &st) == 0 && S_ISDIR(st.st_mode))
            *step = s;
    }
    closedir(d);
}

int ghc_train_check_output(ghc_core_t *core, const struct ghc_train_opts *opts)
{
    int rc;
    struct stat st;
    const char *resume = opts ? opts->resume : NULL;
    if ((rc = ghc_config_resolve_output_dir(core)) < 0)
        return rc;
    if (resume && stat(resume, &st) != 0)
        return ghc_error_set(core, GHC_ENOTFOUND, "%s: no such checkpoint folder (--resume)", resume);
    const char *out = ghc_config_output_dir(core);
    char path[4200];
    snprintf(path, sizeof(path), "%s/resolved.cfg", out);
    if (resume || stat(path, &st) != 0)
        return 0;
    int64_t n;
    newest_checkpoint(out, &n);
    if (n >= 0)
        return ghc_error_set(core, GHC_EEXIST, "%s exists: output_dir '%s' holds an earlier run; continue it with "
                             "--resume %s/checkpoint-%lld (its newest checkpoint), choose another folder "
                             "(--set output_dir=DIR), or remove it", path, out, out, (long long)n);
    return ghc_error_set(core, GHC_EEXIST, "%s exists: output_dir '%s' holds an earlier run that left no checkpoint "
                         "(one still going, or one that was killed before its first): nothing to resume; to start "
                         "over remove the folder (rm -r '%s') or choose another (--set output_dir=DIR)", path, out, out);
}

/* Creates `path` with its parents; `made` gets the shallowest folder created ("" when none). */
static int mkdir_p(ghc_core_t *core, const char *path, char *made, size_t len)
{
    char buf[4096];
    made[0] = '\0';
    if (snprintf(buf, sizeof(buf), "%s", path) >= (int)sizeof(buf))
        return ghc_error_set(core, GHC_EIO, "%s: path too long", path);
    for (char *p = buf + 1; ; p++) {
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p = '\0';
            if (mkdir(buf, 0777) == 0) {
                if (!made[0])
                    snprintf(made, len, "%s", buf);
            } else if (errno != EEXIST) {
                return ghc_error_set(core, GHC_EIO, "%s: cannot create the output folder: %s", buf, strerror(errno));
            }
            *p = c;
            if (!c)
                break;
        }
    }
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return ghc_error_set(core, GHC_EIO, "%s: output_dir is not a folder", path);
    return 0;
}

/* Reads a base-128 varint at p[*i] (< len); false past the end. */
static bool varint(const uint8_t *p, size_t len, size_t *i, uint64_t *v)
{
    *v = 0;
    for (int shift = 0; *i < len && shift < 64; shift += 7) {
        uint8_t b = p[(*i)++];
        *v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return true;
    }
    return false;
}

/* The step of a serialised tensorflow.Event (field 2, a varint; 0 when absent). */
static int64_t event_step(const uint8_t *p, size_t len)
{
    size_t i = 0;
    uint64_t tag, v;
    while (i < len && varint(p, len, &i, &tag)) {
        switch (tag & 7) {
        case 0:
            if (!varint(p, len, &i, &v))
                return 0;
            if (tag >> 3 == 2)
                return (int64_t)v;
            break;
        case 1: i += 8; break;
        case 2:
            if (!varint(p, len, &i, &v) || v > len - i)
                return 0;
            i += (size_t)v;
            break;
        case 5: i += 4; break;
        default: return 0;
        }
    }
    return 0;
}

/* Rewrites `path` (temporary file, renamed) with `keep` bytes of `buf`; nothing when
 * keep == size. */
static int rewrite_file(ghc_core_t *core, const char *path, const void *buf, size_t keep, size_t size)
{
    if (keep == size)
        return 0;
    char tmp[8500];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return ghc_error_set(core, GHC_EIO, "%s: cannot create: %s", tmp, strerror(errno));
    bool ok = fwrite(buf, 1, keep, f) == keep && fflush(f) == 0 && fsync(fileno(f)) == 0;
    if (fclose(f) != 0 || !ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return ghc_error_set(core, GHC_EIO, "%s: cannot rewrite: %s", path, strerror(errno));
    }
    return 0;
}

static int read_all(ghc_core_t *core, const char *path, uint8_t **buf, size_t *size)
{
    FILE *f = fopen(path, "rb");
    *buf = NULL;
    *size = 0;
    if (!f)
        return errno == ENOENT ? 0 : ghc_error_set(core, GHC_EIO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 0, n;
    uint8_t chunk[65536];
    int rc = 0;
    while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0) {
        if (*size + n > cap) {
            uint8_t *nb = realloc(*buf, cap = 2 * (*size + n));
            if (!nb) {
                rc = ghc_error_set(core, GHC_ENOMEM, "%s: out of memory reading it", path);
                break;
            }
            *buf = nb;
        }
        memcpy(*buf + *size, chunk, n);
        *size += n;
    }
    if (rc == 0 && ferror(f))
        rc = ghc_error_set(core, GHC_EIO, "%s: cannot read: %s", path, strerror(errno));
    fclose(f);
    return rc;
}

/* A run resumed at step n into a folder that logged beyond n (an earlier continuation of the
 * same checkpoint) keeps each step once: metrics.jsonl keeps its lines up to step n (and drops
 * an unfinished last line), each TensorBoard event file its records up to step n (and drops a
 * torn last record). The files are rewritten through a temporary name and renamed. */
static int drop_after(struct trainer *tr, int64_t n)
{
    ghc_core_t *core = tr->core;
    char p[8400];
    uint8_t *buf;
    size_t size, keep = 0;
    int64_t lines = 0;
    snprintf(p, sizeof(p), "%s/metrics.jsonl", tr->out);
    int rc = read_all(core, p, &buf, &size);
    for (size_t i = 0; rc == 0 && i < size; ) {
        uint8_t *nl = memchr(buf + i, '\n', size - i);
        if (!nl)
            break;
        size_t len = (size_t)(nl - (buf + i)) + 1;
        char head[64];
        snprintf(head, sizeof(head), "%.*s", (int)(len < 63 ? len : 63), (const char *)buf + i);
        const char *s = strstr(head, "\"step\":");
        if (s && strtoll(s + 7, NULL, 10) > n) {
            lines++;
        } else {
            memmove(buf + keep, buf + i, len);
            keep += len;
        }
        i += len;
    }
    if (rc == 0 && (rc = rewrite_file(core, p, buf, keep, size)) == 0 && lines)
        ghc_log(core, GHC_LOG_INFO, "train: %s: dropped %lld line%s after step %lld (this run continues from there)",
                p, (long long)lines, lines == 1 ? "" : "s", (long long)n);
    free(buf);
    DIR *d = rc == 0 ? opendir(tr->out) : NULL;
    struct dirent *e;
    while (d && rc == 0 && (e = readdir(d))) {
        if (strncmp(e->d_name, "events.out.tfevents.", 20) != 0)
            continue;
        snprintf(p, sizeof(p), "%s/%s", tr->out, e->d_name);
        if ((rc = read_all(core, p, &buf, &size)) < 0)
            break;
        int64_t records = 0;
        keep = 0;
        for (size_t i = 0; i + 16 <= size; ) {
            uint64_t len;
            uint32_t crc;
            memcpy(&len, buf + i, 8);
            memcpy(&crc, buf + i + 8, 4);
            if (crc != ghc_crc32c_masked(buf + i, 8) || len > size - i - 16)
                break;
            memcpy(&crc, buf + i + 12 + len, 4);
            if (crc != ghc_crc32c_masked(buf + i + 12, (size_t)len))
                break;
            size_t rec = 16 + (size_t)len;
            if (event_step(buf + i + 12, (size_t)len) > n) {
                records++;
            } else {
                memmove(buf + keep, buf + i, rec);
                keep += rec;
            }
            i += rec;
        }
        if ((rc = rewrite_file(core, p, buf, keep, size)) == 0 && records)
            ghc_log(core, GHC_LOG_INFO, "train: %s: dropped %lld record%s after step %lld", p, (long long)records,
                    records == 1 ? "" : "s", (long long)n);
        free(buf);
    }
    if (d)
        closedir(d);
    return rc;
}

static int open_outputs(struct trainer *tr)
{
    ghc_core_t *core = tr->core;
    int rc;
    char p[8400];
    struct stat st;
    if (tr->resumed && (rc = drop_after(tr, tr->step)) < 0)
        return rc;
    snprintf(p, sizeof(p), "%s/metrics.jsonl", tr->out);
    tr->made_metrics = !tr->resumed || stat(p, &st) != 0;
    if (!(tr->metrics = fopen(p, tr->resumed ? "a" : "w")))
        return ghc_error_set(core, GHC_EIO, "%s: cannot open: %s", p, strerror(errno));
    if (tr->c.tensorboard) {
        if ((rc = ghc_tboard_open(core, tr->out, &tr->tb)) < 0)
            return rc;
        snprintf(tr->tb_path, sizeof(tr->tb_path), "%s", ghc_tboard_path(tr->tb));
    }
    return 0;
}

/* After a failure before the run's first checkpoint: remove what it wrote into output_dir
 * (its files closed), so that the folder is as it was and the next run is not refused. The
 * error message stays. */
static void undo_outputs(struct trainer *tr)
{
    ghc_core_t *core = tr->core;
    char msg[GHC_ERRMSG_MAX], p[8400];
    int code = ghc_error_code(core);
    bool any = tr->made_metrics || *tr->tb_path || tr->made_demo || tr->made_resolved || *tr->made_out;
    if (!any)
        return;
    snprintf(msg, sizeof(msg), "%s", ghc_error_message(core));
    snprintf(p, sizeof(p), "%s/metrics.jsonl", tr->out);
    if (tr->made_metrics)
        unlink(p);
    if (*tr->tb_path)
        unlink(tr->tb_path);
    snprintf(p, sizeof(p), "%s/demo-data", tr->out);
    if (tr->made_demo)
        rm_rf(core, p);
    snprintf(p, sizeof(p), "%s/checkpoint-%lld.tmp", tr->out, (long long)tr->step);
    rm_rf(core, p);
    snprintf(p, sizeof(p), "%s/resolved.cfg", tr->out);
    if (tr->made_resolved)
        unlink(p);
    if (*tr->made_out) {
        /* the folders mkdir made, deepest first, while empty */
        snprintf(p, sizeof(p), "%s", tr->out);
        size_t top = strlen(tr->made_out);
        while (strlen(p) >= top && rmdir(p) == 0) {
            char *slash = strrchr(p, '/');
            if (!slash || slash == p)
                break;
            *slash = '\0';
        }
    }
    ghc_log(core, GHC_LOG_INFO, "train: no checkpoint was written: removed what this run wrote to %s, which "
            "is as it was before", tr->out);
    ghc_error_set(core, code, "%s", msg);
}

static void trainer_free(struct trainer *tr)
{
    if (tr->ds)
        ghc_dataset_free(tr->ds);
    ghc_dataset_free(tr->vds);
    ghc_tensor_free(tr->sq);
    ghc_tensor_free(tr->norms);
    ghc_tboard_free(tr->tb);
    if (tr->metrics)
        fclose(tr->metrics);
    tr->ds = tr->vds = NULL;
    tr->sq = tr->norms = NULL;
    tr->tb = NULL;
    tr->metrics = NULL;
}

/* ---- the run -------------------------------------------------------------------------------- */

static int need(ghc_core_t *core, const void *inst, const char *section)
{
    if (inst)
        return 0;
    return ghc_error_set(core, GHC_ECONFIG, "train: the configuration has no `%s` section; training needs one "
                         "(see doc/config.md)", section);
}

/* The training data (and the held-out validation data): opened, checked against the model,
 * and put at the resumed position. With a demo section, after its data was generated. */
static int open_data(struct trainer *tr)
{
    ghc_core_t *core = tr->core;
    int rc;
    if ((rc = ghc_dataset_open(core, &tr->ds)) < 0 || (rc = check_samples(tr, tr->ds, "data")) < 0)
        return rc;
    ghc_dataset_set_copy(tr->ds, ghc_op_copy);
    if (tr->c.validate_every && ghc_config_section(core, "validation")) {
        if ((rc = ghc_dataset_open_section(core, "validation", &tr->vds)) < 0 ||
            (rc = check_samples(tr, tr->vds, "validation")) < 0)
            return rc;
        ghc_dataset_set_copy(tr->vds, ghc_op_copy);
    }
    if (tr->resumed && (rc = ghc_dataset_seek(tr->ds, tr->resume_epoch, tr->resume_cursor)) < 0)
        return rc;
    return 0;
}

/* Everything that can be checked before output_dir is touched: the sections, the data against
 * the model (the demo's shapes instead of its data, which a run generates later), the
 * adapters, the resumed checkpoint. */
static int prepare(struct trainer *tr, const struct ghc_train_opts *opts)
{
    ghc_core_t *core = tr->core;
    int rc;
    stop_signal = 0;
    tr->model = ghc_model_get(core);
    tr->net = ghc_network_get(core);
    tr->opt = ghc_optimizer_get(core);
    tr->sched = ghc_scheduler_get(core);
    tr->mp = ghc_mempolicy_get(core);
    if ((rc = need(core, tr->model, "model")) < 0 || (rc = need(core, tr->net, "network")) < 0 ||
        (rc = need(core, tr->opt, "optimizer")) < 0)
        return rc;
    ghc_cfg_t *s;
    if ((rc = ghc_cfg_get_group(core->config->root, "train", train_keys, &s)) < 0)
        return rc;
    if (!s)
        return ghc_error_set(core, GHC_ECONFIG, "train: the configuration has no `train` section (at least `train = { steps = N; };`)");
    if ((rc = read_cfg(core, s, &tr->c, &tr->sampler)) < 0)
        return rc;
    int64_t seed = 42;
    if ((rc = ghc_cfg_get_int(core->config->root, "seed", 42, 0, INT64_MAX, &seed)) < 0 ||
        (rc = ghc_train_check_output(core, opts)) < 0)
        return rc;
    tr->sampler.seed = (uint64_t)seed ^ 0x243f6a8885a308d3ull;
    tr->noise_rng.seed = (uint64_t)seed ^ 0x13198a2e03707344ull;
    snprintf(tr->out, sizeof(tr->out), "%s", ghc_config_output_dir(core));
    tr->device = ghc_model_device(tr->model);
    tr->n_experts = ghc_model_experts(tr->model);
    if (tr->n_experts > 2)
        return ghc_error_set(core, GHC_EUNSUPPORTED, "train: models of %d experts are not supported (1 or 2)", tr->n_experts);
    if (tr->n_experts == 2) {
        tr->boundary = find_boundary(tr->model);
        ghc_log(core, GHC_LOG_INFO, "train: two experts, boundary sigma %.6g (high noise at and above)", tr->boundary);
    }
    if ((rc = model_input(tr)) < 0 || (rc = ghc_cfg_get_group(core->config->root, "demo", ghc_demo_keys, &s)) < 0)
        return rc;
    tr->demo = s != NULL;
    if (tr->demo) {
        /* the data's folders are the demo's, written by the run: check what exists now */
        ghc_cfg_t *g;
        if ((rc = check_demo(tr, s)) < 0 ||
            (rc = ghc_cfg_get_group(core->config->root, "data", ghc_dataset_keys(false), &g)) < 0 ||
            (tr->c.validate_every &&
             (rc = ghc_cfg_get_group(core->config->root, "validation", ghc_dataset_keys(false), &g)) < 0))
            return rc;
    }
    if ((rc = setup_adapters(tr)) < 0 || (!tr->demo && (rc = open_data(tr)) < 0))
        return rc;
    if (opts && opts->resume && (rc = resume(tr, opts->resume)) < 0)
        return rc;
    if (!tr->demo && tr->resumed && (rc = ghc_dataset_seek(tr->ds, tr->resume_epoch, tr->resume_cursor)) < 0)
        return rc;
    /* the sampler's acceptance in each trained range, said once (spec/training.md 2.1) */
    for (int a = 0; a < tr->n_adapters && tr->sampler.family != GHC_SAMPLER_FLUX_SHIFT; a++) {
        expert_range(tr, tr->adapter_expert[a], &tr->sampler.lo, &tr->sampler.hi);
        double acc = ghc_sampler_acceptance(&tr->sampler, tr->sampler.shift);
        ghc_log(core, acc < 1e-3 ? GHC_LOG_WARN : GHC_LOG_INFO, "train: %s sampler: %.1f%% of draws fall in [%.4g, %.4g]",
                ghc_sampler_family_names[tr->sampler.family], 100.0 * acc, tr->sampler.lo, tr->sampler.hi);
    }
    return 0;
}

int ghc_train_check(ghc_core_t *core, const struct ghc_train_opts *opts)
{
    struct trainer tr = { .core = core, .active = -1 };
    int rc = prepare(&tr, opts);
    trainer_free(&tr);
    return rc;
}

int ghc_train(ghc_core_t *core, const struct ghc_train_opts *opts)
{
    struct trainer tr = { .core = core, .active = -1 };
    char p[8400];
    struct stat st;
    int rc;
    if ((rc = prepare(&tr, opts)) < 0)
        goto out;
    /* from here on output_dir is written */
    snprintf(p, sizeof(p), "%s/resolved.cfg", tr.out);
    if ((rc = mkdir_p(core, tr.out, tr.made_out, sizeof(tr.made_out))) < 0)
        goto out;
    tr.made_resolved = stat(p, &st) != 0;
    if ((rc = ghc_config_write(core, p)) < 0)
        goto out;
    ghc_log(core, GHC_LOG_INFO, "wrote %s", p);
    if (tr.demo) {
        snprintf(p, sizeof(p), "%s/demo-data", tr.out);
        tr.made_demo = stat(p, &st) != 0;
        if ((rc = ghc_demo_generate(core)) < 0 || (rc = open_data(&tr)) < 0)
            goto out;
    }
    if ((rc = open_outputs(&tr)) < 0)
        goto out;
    ghc_log(core, GHC_LOG_INFO, "train: %lld steps, mode %s, %lld samples per epoch, on %s",
            (long long)tr.c.steps, mode_names[tr.c.mode], (long long)ghc_dataset_size(tr.ds),
            tr.device == GHC_DEVICE_CPU ? "the CPU" : "the GPU");
    tr.t_start = now_s();
    tr.first_step = tr.step;
    int progress = opts ? opts->progress : 0;
    while (tr.step < tr.c.steps) {
        if (stop_signal)
            break;
        if ((rc = train_step(&tr, progress)) < 0)
            goto out;
        if (tr.c.validate_every && tr.step % tr.c.validate_every == 0 && (rc = validate(&tr)) < 0)
            goto out;
        if (tr.c.save_every && tr.step % tr.c.save_every == 0 && tr.step < tr.c.steps && (rc = checkpoint(&tr)) < 0)
            goto out;
    }
    if (progress && stop_signal)
        fputc('\n', stderr);
    if ((rc = checkpoint(&tr)) < 0)
        goto out;
    if (stop_signal) {
        rc = ghc_error_set(core, GHC_EINTERRUPTED, "train: stopped by signal %d at step %lld; continue with --resume "
                           "%s/checkpoint-%lld", (int)stop_signal, (long long)tr.step, tr.out, (long long)tr.step);
        goto out;
    }
    char first_file[8400] = "";
    if ((rc = save_adapters(&tr, tr.out, -1, first_file, sizeof(first_file))) < 0)
        goto out;
    ghc_log(core, GHC_LOG_INFO, "train: done: %lld steps in %.1f s, final loss (avg) %.6g; adapter%s: %s%s",
            (long long)tr.step, now_s() - tr.t_start, tr.loss_ema, tr.n_adapters > 1 ? "s" : "", first_file,
            tr.n_adapters > 1 ? " (and the low-noise one beside it)" : "");
out:
    trainer_free(&tr);
    if (rc < 0 && !tr.wrote_checkpoint)
        undo_outputs(&tr);
    return rc;
}
