/* train_check.c: what the trainer checks before it writes anything, the same for a run and
 * for --dry-run (ghc_train_check): the train section's keys and values, output_dir, the data
 * (or the demo's shapes) against what the model takes, the adapters attached, and the
 * checkpoint a run resumes from. */
#include <config.h>

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gh200core/dataset.h>
#include <gh200core/gh200core.h>
#include <gh200core/ops.h>
#include <gh200core/tensor.h>
#include <gh200core/train.h>

#include "dataset_impl.h"   /* defines: ghc_dataset_open_fit */
#include "train_impl.h"

/* ---- configuration -------------------------------------------------------------------------- */

const char *const ghc_train_mode_names[] = { "single", "separate", "shared", NULL };
const char *const ghc_train_expert_names[] = { "high", "low", NULL };
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
    /* steps whose GPU time is written to <output_dir>/profile.md (CUPTI); 0: none */
    { "profile_steps", GHC_CFG_INT,    "0",       "0 to 2^20",                NULL },
    /* steps run before the profiled ones (warm-up) */
    { "profile_skip",  GHC_CFG_INT,    "2",       "0 to 2^40",                NULL },
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

/* train.name names the adapter files, <name>[_<expert>].safetensors, in output_dir and in
 * each checkpoint: a plain file name that is none of the files beside them. */
static int check_name(ghc_core_t *core, ghc_cfg_t *s, const char *name)
{
    static const char *const taken[] = { "params", "optimizer", "trainer", "resolved", "metrics", NULL };
    const char *why = NULL;
    if (!*name)
        why = "it must not be empty";
    else if (strchr(name, '/') || strchr(name, '\\'))
        why = "it must be a plain file name, without a path separator";
    else if (name[0] == '.')
        why = "it must not start with '.' (\".\", \"..\" and hidden files)";
    else if (!strncmp(name, "events.out.tfevents", 19))
        why = "it would be taken for a TensorBoard event file (and cut on resume)";
    for (int i = 0; taken[i] && !why; i++)
        if (!strcmp(name, taken[i]))
            why = "a checkpoint's or output_dir's own file of that name would be overwritten";
    for (const char *c = name; *c && !why; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f)
            why = "it must not hold control characters";
    if (!why)
        return 0;
    char shown[64] = "";
    size_t n = 0;
    for (const char *c = name; *c && n + 5 < sizeof(shown); c++)
        n += (size_t)snprintf(shown + n, sizeof(shown) - n, (unsigned char)*c < 0x20 || *c == 0x7f ? "\\x%02x" : "%c",
                              (unsigned char)*c);
    return ghc_error_set(core, GHC_ECONFIG, "%s: train.name = \"%s\": the adapter file's name: %s (e.g. name = "
                         "\"adapter\")", ghc_cfg_where(s, "name"), shown, why);
}

static int read_cfg(ghc_core_t *core, ghc_cfg_t *s, struct ghc_train_cfg *c, struct ghc_sampler *smp)
{
    int rc, fam = GHC_SAMPLER_UNIFORM, base = 0;
    if ((rc = ghc_cfg_get_int(s, "steps", 100, 1, INT64_C(1) << 40, &c->steps)) < 0 ||
        (rc = ghc_cfg_get_choice(s, "mode", GHC_TRAIN_MODE_SINGLE, ghc_train_mode_names, &c->mode)) < 0 ||
        (rc = ghc_cfg_get_choice(s, "expert", 0, ghc_train_expert_names, &c->expert)) < 0 ||
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
        (rc = ghc_cfg_get_choice(s, "weighting", GHC_TRAIN_WEIGHTING_NONE, weighting_names, &c->weighting)) < 0 ||
        (rc = ghc_cfg_get_float(s, "max_grad_norm", 1.0, 0.0, 1e30, &c->max_grad_norm)) < 0 ||
        (rc = ghc_cfg_get_int(s, "save_every", 0, 0, INT64_C(1) << 40, &c->save_every)) < 0 ||
        (rc = ghc_cfg_get_int(s, "keep_last", 3, 0, 1 << 20, &c->keep_last)) < 0 ||
        (rc = ghc_cfg_get_string(s, "name", "adapter", &c->name)) < 0 ||
        (rc = ghc_cfg_get_int(s, "max_bad_steps", 5, 1, 1 << 20, &c->max_bad)) < 0 ||
        (rc = ghc_cfg_get_bool(s, "tensorboard", true, &c->tensorboard)) < 0 ||
        (rc = ghc_cfg_get_bool(s, "sync_timing", false, &c->sync_timing)) < 0 ||
        (rc = ghc_cfg_get_int(s, "log_every", 10, 1, INT64_C(1) << 40, &c->log_every)) < 0 ||
        (rc = ghc_cfg_get_int(s, "profile_steps", 0, 0, 1 << 20, &c->profile_steps)) < 0 ||
        (rc = ghc_cfg_get_int(s, "profile_skip", 2, 0, INT64_C(1) << 40, &c->profile_skip)) < 0 ||
        (rc = ghc_cfg_get_int(s, "validate_every", 0, 0, INT64_C(1) << 40, &c->validate_every)) < 0 ||
        (rc = ghc_cfg_get_int(s, "validation_batches", 1, 1, 1 << 20, &c->validation_batches)) < 0 ||
        (rc = ghc_cfg_list_len(s, "validation_sigmas", &c->n_vsig)) < 0)
        return rc;
    if ((rc = check_name(core, s, c->name)) < 0)
        return rc;
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

static int setup_adapters(struct ghc_trainer *tr)
{
    ghc_core_t *core = tr->core;
    const struct ghc_model_target *targets;
    int32_t n_targets;
    int rc;
    if ((rc = ghc_model_targets(tr->model, &targets, &n_targets)) < 0)
        return rc;
    if (tr->n_experts < 2) {
        if (tr->c.mode != GHC_TRAIN_MODE_SINGLE)
            ghc_log(core, GHC_LOG_WARN, "train: mode = \"%s\" needs a two-expert model; this one has one expert: training it alone",
                    ghc_train_mode_names[tr->c.mode]);
        tr->c.mode = GHC_TRAIN_MODE_SINGLE;
        tr->n_adapters = 1;
        tr->adapter_expert[0] = 0;
    } else if (tr->c.mode == GHC_TRAIN_MODE_SINGLE) {
        tr->n_adapters = 1;
        tr->adapter_expert[0] = tr->c.expert;
    } else if (tr->c.mode == GHC_TRAIN_MODE_SEPARATE) {
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
        /* Optimizer groups: the expert's index (per-expert settings), -1 shared (the plain ones). */
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
    if (!(tr->sq = ghc_tensor_init(core, GHC_DTYPE_F32, 1, &maxn, tr->device, GHC_ROLE_WORKSPACE)) ||
        !(tr->norms = ghc_tensor_init(core, GHC_DTYPE_F32, 1, &np, tr->device, GHC_ROLE_WORKSPACE)))
        return ghc_error_code(core) ? ghc_error_code(core) : GHC_ENOMEM;
    return 0;
}

/* ---- the data against the model ------------------------------------------------------------- */

/* What the model takes (model.h, ghc_model_input); a model that does not say leaves the
 * data's shapes to its first forward. */
static int model_input(struct ghc_trainer *tr)
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
    ghc_cfg_t *sec = ghc_config_section(core, section), *set = NULL;
    const char *root = NULL, *dir = ghc_config_dir(core);
    /* the dataset is open: each entry is a group with a path, so these reads cannot fail */
    if (sec && end != entry && *end == '/' && d >= 0 && d < INT_MAX &&
        ghc_cfg_list_group(sec, "datasets", (int)d, ghc_dataset_keys(true), &set) == 0 && set)
        ghc_cfg_get_string(set, "path", NULL, &root);
    if (!root)
        snprintf(buf, len, "%s", entry);
    else if (root[0] == '/' || !strcmp(dir, "."))
        snprintf(buf, len, "%s/%s", root, end + 1);
    else
        snprintf(buf, len, "%s/%s/%s", dir, root, end + 1);
    return buf;
}

static const char *const patch_dims[3] = { "frames", "height", "width" };

struct fit_ctx {
    struct ghc_trainer *tr;
    const char         *section;
};

/* One sample of the data of `section` against what the model takes (ghc_data_fit_fn): the
 * latent's channels, its frames, height and width against the patch, the text embedding's
 * width and rows. The reason names the sample's file and where the model's number came from. */
static bool sample_fits(void *user, const struct ghc_data_sample_info *si, char *msg, size_t len)
{
    const struct fit_ctx *fc = user;
    ghc_core_t *core = fc->tr->core;
    const struct ghc_model_input *in = &fc->tr->in;
    const char *section = fc->section;
    char f[4096];
    const int64_t *ls = si->latent_shape;
    int k = 0;
    while (k < 3 && (in->patch[k] < 2 || ls[1 + k] % in->patch[k] == 0))
        k++;
    if (in->channels && ls[0] != in->channels)
        snprintf(msg, len, "%s: the latent [%lld, %lld, %lld, %lld] has %lld channels; the model takes %lld "
                 "(%s)", sample_file(core, section, si->latent_file, f, sizeof(f)), (long long)ls[0],
                 (long long)ls[1], (long long)ls[2], (long long)ls[3], (long long)ls[0], (long long)in->channels,
                 in->channels_from ? in->channels_from : "the model");
    else if (k < 3)
        snprintf(msg, len, "%s: the latent [%lld, %lld, %lld, %lld]: its %s, %lld, is not a multiple of %lld "
                 "(%s)", sample_file(core, section, si->latent_file, f, sizeof(f)), (long long)ls[0],
                 (long long)ls[1], (long long)ls[2], (long long)ls[3], patch_dims[k], (long long)ls[1 + k],
                 (long long)in->patch[k], in->patch_from ? in->patch_from : "the model's patch");
    else if (in->text_dim && si->text_dim != in->text_dim)
        snprintf(msg, len, "%s: the text embedding is [%lld, %lld], %lld wide; the model's text width is "
                 "%lld (%s)", sample_file(core, section, si->text_file, f, sizeof(f)), (long long)si->text_len,
                 (long long)si->text_dim, (long long)si->text_dim, (long long)in->text_dim,
                 in->text_dim_from ? in->text_dim_from : "the model");
    else if (in->text_len && si->text_len > in->text_len)
        snprintf(msg, len, "%s: the text embedding has %lld rows; the model takes at most %lld (%s)",
                 sample_file(core, section, si->text_file, f, sizeof(f)), (long long)si->text_len,
                 (long long)in->text_len, in->text_len_from ? in->text_len_from : "the model");
    else
        return true;
    return false;
}

/* Open the data of `section` with every sample checked against what the model takes (when it
 * says): at open, so that a sample the model cannot take is an error before anything runs, or
 * with skip_bad_samples left out there with one line. */
static int open_checked(struct ghc_trainer *tr, const char *section, ghc_dataset_t **out)
{
    struct fit_ctx fc = { .tr = tr, .section = section };
    return ghc_dataset_open_fit(tr->core, section, tr->have_in ? sample_fits : NULL, &fc, out);
}

/* The demo's keys, and its shapes against what the model takes (its data does not exist
 * before the run); read by ghc_demo_read, as ghc_demo_generate reads them once the run has
 * begun. The media demo's dataset (data.datasets[0]) instead. */
static int check_demo(struct ghc_trainer *tr, ghc_cfg_t *s)
{
    ghc_core_t *core = tr->core;
    const struct ghc_model_input *in = &tr->in;
    struct ghc_demo_opts o;
    int rc = ghc_demo_read(s, &o);
    if (rc < 0)
        return rc;
    if (ghc_demo_media(&o))
        return ghc_demo_media_check(core);   /* the latents' shapes come from prepare */
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

/* ---- before a run --------------------------------------------------------------------------- */

static int need(ghc_core_t *core, const void *inst, const char *section)
{
    if (inst)
        return 0;
    return ghc_error_set(core, GHC_ECONFIG, "train: the configuration has no `%s` section; training needs one "
                         "(see doc/config.md)", section);
}

/* The trainer's per-batch arrays hold 4096 samples (train.c): a larger batch_size in `data` or
 * `validation` is refused here, naming the key, before anything runs. */
#define GHC_TRAIN_MAX_BATCH 4096

static int check_batch_size(ghc_core_t *core, const char *section)
{
    ghc_cfg_t *g = ghc_config_section(core, section);
    int64_t bs = 1;
    int rc;
    if (!g || !ghc_cfg_has(g, "batch_size"))
        return 0;
    if ((rc = ghc_cfg_get_int(g, "batch_size", 1, 1, 1 << 20, &bs)) < 0)
        return rc;
    if (bs > GHC_TRAIN_MAX_BATCH)
        return ghc_error_set(core, GHC_ECONFIG, "%s: %s.batch_size = %lld: training supports batches of at most %d samples",
                             ghc_cfg_where(g, "batch_size"), section, (long long)bs, GHC_TRAIN_MAX_BATCH);
    return 0;
}

/* ghc_train_prepare opens the data; with a demo section, ghc_train does once it has generated it. */
int ghc_train_open_data(struct ghc_trainer *tr)
{
    ghc_core_t *core = tr->core;
    int rc;
    if ((rc = open_checked(tr, "data", &tr->ds)) < 0)
        return rc;
    if (tr->c.validate_every && ghc_config_section(core, "validation") &&
        (rc = open_checked(tr, "validation", &tr->vds)) < 0)
        return rc;
    if (tr->resumed && (rc = ghc_dataset_seek(tr->ds, tr->resume_epoch, tr->resume_cursor)) < 0)
        return rc;
    return 0;
}

int ghc_train_prepare(struct ghc_trainer *tr, const struct ghc_train_opts *opts)
{
    ghc_core_t *core = tr->core;
    ghc_cfg_t *top = ghc_config_root(core);
    int rc;
    tr->model = ghc_model_get(core);
    tr->net = ghc_network_get(core);
    tr->opt = ghc_optimizer_get(core);
    tr->sched = ghc_scheduler_get(core);
    tr->mp = ghc_mempolicy_get(core);
    if ((rc = need(core, tr->model, "model")) < 0 || (rc = need(core, tr->net, "network")) < 0 ||
        (rc = need(core, tr->opt, "optimizer")) < 0)
        return rc;
    ghc_cfg_t *s;
    if ((rc = ghc_cfg_get_group(top, "train", train_keys, &s)) < 0)
        return rc;
    if (!s)
        return ghc_error_set(core, GHC_ECONFIG, "train: the configuration has no `train` section (at least `train = { steps = N; };`)");
    if ((rc = read_cfg(core, s, &tr->c, &tr->sampler)) < 0 || (rc = check_batch_size(core, "data")) < 0 ||
        (tr->c.validate_every && (rc = check_batch_size(core, "validation")) < 0))
        return rc;
    int64_t seed = 42;
    if ((rc = ghc_cfg_get_int(top, "seed", 42, 0, INT64_MAX, &seed)) < 0 ||
        (rc = ghc_train_check_output(core, opts)) < 0)
        return rc;
    tr->resume = opts ? opts->resume : NULL;
    tr->overwrite = opts && opts->overwrite;
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
    if ((rc = model_input(tr)) < 0 || (rc = ghc_cfg_get_group(top, "demo", ghc_demo_keys, &s)) < 0)
        return rc;
    tr->demo = s != NULL;
    if (tr->demo) {
        /* the data's folders are the demo's, written by the run: check what exists now */
        ghc_cfg_t *g;
        if ((rc = check_demo(tr, s)) < 0 ||
            (rc = ghc_cfg_get_group(top, "data", ghc_dataset_keys(false), &g)) < 0 ||
            (tr->c.validate_every &&
             (rc = ghc_cfg_get_group(top, "validation", ghc_dataset_keys(false), &g)) < 0))
            return rc;
    }
    if ((rc = setup_adapters(tr)) < 0 || (!tr->demo && (rc = ghc_train_open_data(tr)) < 0))
        return rc;
    if (opts && opts->resume && (rc = ghc_checkpoint_read(tr, opts->resume)) < 0)
        return rc;
    if (!tr->demo && tr->resumed && (rc = ghc_dataset_seek(tr->ds, tr->resume_epoch, tr->resume_cursor)) < 0)
        return rc;
    /* the sampler's acceptance in each trained range, said once: where few draws fall in the
     * range, every sigma costs many rejected draws */
    for (int a = 0; a < tr->n_adapters && tr->sampler.family != GHC_SAMPLER_FLUX_SHIFT; a++) {
        ghc_train_expert_range(tr, tr->adapter_expert[a], &tr->sampler.lo, &tr->sampler.hi);
        double acc = ghc_sampler_acceptance(&tr->sampler, tr->sampler.shift);
        ghc_log(core, acc < 1e-3 ? GHC_LOG_WARN : GHC_LOG_INFO, "train: %s sampler: %.1f%% of draws fall in [%.4g, %.4g]",
                ghc_sampler_family_names[tr->sampler.family], 100.0 * acc, tr->sampler.lo, tr->sampler.hi);
    }
    return 0;
}
