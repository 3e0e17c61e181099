/* lycoris.c: the `lycoris` network plugin: LoRA, LoHa and LoKr adapters on a model's linear
 * targets, trained through the model's adapter hooks, saved in the files
 * ComfyUI, diffusers and musubi-tuner load. This file is the glue: configuration, target
 * selection, factor shapes and initialisation, parameters, dropout seeding, the hooks and the
 * plugin descriptor. The math is in algo*.c (one file per algorithm), files in file.c; doc/lycoris.md describes the keys
 * and where we differ from LyCORIS and ComfyUI. */
#include <config.h>

#include <fnmatch.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lycoris_impl.h"

/* ---- small helpers -------------------------------------------------------------------------- */

const char *lyc_algo_name(enum lyc_algo a)
{
    static const char *const names[] = { "lora", "loha", "lokr" };
    return (unsigned)a < 3 ? names[a] : "?";
}

const char *lyc_param_suffix(const struct lyc_module *md, int i)
{
    static const char *const lora[] = { "lora_down.weight", "lora_up.weight", NULL, NULL };
    static const char *const loha[] = { "hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b" };
    if (i < 0 || i >= LYC_MAX_PARAMS)
        return NULL;
    switch (md->algo) {
    case LYC_LORA: return i == 2 && md->dora ? "dora_scale" : lora[i];
    case LYC_LOHA: return loha[i];
    case LYC_LOKR:
        if (i == 0) return md->w1_lr ? "lokr_w1_a" : "lokr_w1";
        if (i == 1) return md->w1_lr ? "lokr_w1_b" : NULL;
        if (i == 2) return md->w2_lr ? "lokr_w2_a" : "lokr_w2";
        return md->w2_lr ? "lokr_w2_b" : NULL;
    }
    return NULL;
}

void lyc_factorization(int64_t d, int64_t f, int64_t *m, int64_t *n)
{
    if (f > 0 && d % f == 0) {
        int64_t o = d / f;
        *m = f < o ? f : o;
        *n = f < o ? o : f;
        return;
    }
    int64_t F = f < 0 ? d : f, a = 1, b = d;
    while (a < b) {
        int64_t a2 = a + 1;
        while (d % a2)
            a2++;
        if (a2 > F)
            break;
        a = a2;
        b = d / a2;
    }
    *m = a < b ? a : b;
    *n = a < b ? b : a;
}

/* ---- configuration -------------------------------------------------------------------------- */

static const struct ghc_cfg_key lyc_keys[] = {
    /* name                 type             default     range */
    { "algo",               GHC_CFG_STRING, "lora",     "lora, loha, lokr, locon" },
    { "rank",               GHC_CFG_INT,    "16",       "1 to 1000000" },
    { "alpha",              GHC_CFG_FLOAT,  "0",        "0 to 1e12" },     /* 0: alpha = rank (scale 1) */
    { "rs_lora",            GHC_CFG_BOOL,   "false" },
    { "factor",             GHC_CFG_INT,    "-1",       "-1 to 2^20" },    /* LoKr; -1 = most balanced */
    { "decompose_both",     GHC_CFG_BOOL,   "false" },  /* LoKr: W1 low-rank too when r < max(a, c)/2 */
    { "full_matrix",        GHC_CFG_BOOL,   "false" },  /* LoKr: both factors full (scale 1) */
    { "rank_dropout",       GHC_CFG_FLOAT,  "0",        "0 to 0.999" },
    { "rank_dropout_scale", GHC_CFG_BOOL,   "false" },
    { "module_dropout",     GHC_CFG_FLOAT,  "0",        "0 to 1" },
    { "dora_wd",            GHC_CFG_BOOL,   "false" },  /* DoRA on LoRA, output axis */
    { "preset",             GHC_CFG_STRING, "attn_ffn", "attn, attn_ffn, full" },
    { "include",            GHC_CFG_LIST,   NULL,       "(fnmatch patterns on official target names)" },
    { "exclude",            GHC_CFG_LIST,   NULL,       "(fnmatch patterns)" },
    { "overrides",          GHC_CFG_LIST,   NULL,       "(\"pattern:rank\" or \"pattern:rank:alpha\")" },
    { "format",             GHC_CFG_STRING, "musubi",   "comfyui, musubi, diffusers" },
    { "extra_formats",      GHC_CFG_LIST,   NULL,       "(more namings, each a file beside the first)" },
    { "save_dtype",         GHC_CFG_STRING, "bf16",     "bf16, f16, f32" },
    { "title",              GHC_CFG_STRING },
    { "seed",               GHC_CFG_INT,    "0",        "0 to 2^63-1" },
    { "device",             GHC_CFG_INT,    "(the model's rule)", "-1 to 1023" }, /* -1 = CPU */
    { "fold",               GHC_CFG_BOOL,   "false" },  /* LoRA: delta-W folded into the model's GEMM weight
                                                           (numerics: W + delta-W rounded to W's dtype) */
    { NULL, 0 }
};


static int read_list(ghc_cfg_t *cfg, const char *key, const char ***out, int *n)
{
    int rc = ghc_cfg_list_len(cfg, key, n);
    if (rc < 0 || !*n)
        return rc;
    if (!(*out = calloc((size_t)*n, sizeof(char *))))
        return ghc_error_set(ghc_cfg_core(cfg), GHC_ENOMEM, "lycoris: out of memory");
    for (int i = 0; i < *n; i++)
        if ((rc = ghc_cfg_list_string(cfg, key, i, &(*out)[i])) < 0)
            return rc;
    return 0;
}

static int read_overrides(struct lycoris *net, ghc_cfg_t *cfg)
{
    const char **items = NULL;
    int n = 0, rc = read_list(cfg, "overrides", &items, &n);
    if (rc < 0 || !n)
        goto out;
    if (!(net->ov = calloc((size_t)n, sizeof(*net->ov)))) {
        rc = ghc_error_set(net->core, GHC_ENOMEM, "lycoris: out of memory");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        const char *s = items[i], *c1 = strchr(s, ':');
        char *end;
        struct lyc_override *o = &net->ov[net->n_ov];
        o->alpha = -1;
        long r = c1 ? strtol(c1 + 1, &end, 10) : 0;
        if (!c1 || c1 == s || r < 1 || r > 1000000 || (*end && *end != ':')) {
            rc = ghc_error_set(net->core, GHC_ECONFIG, "%s: lycoris: override %d '%s': expected \"pattern:rank\" or "
                               "\"pattern:rank:alpha\" with rank >= 1", ghc_cfg_where(cfg, "overrides"), i, s);
            goto out;
        }
        if (*end == ':') {
            char *e2;
            o->alpha = strtod(end + 1, &e2);
            if (e2 == end + 1 || *e2 || !(o->alpha >= 0)) {
                rc = ghc_error_set(net->core, GHC_ECONFIG, "%s: lycoris: override %d '%s': alpha must be a number >= 0",
                                   ghc_cfg_where(cfg, "overrides"), i, s);
                goto out;
            }
        }
        o->rank = (int32_t)r;
        if (!(o->pattern = strndup(s, (size_t)(c1 - s)))) {
            rc = ghc_error_set(net->core, GHC_ENOMEM, "lycoris: out of memory");
            goto out;
        }
        net->n_ov++;
    }
out:
    free(items);
    return rc;
}

/* extra_formats: each a naming other than `format`'s, at most once; diffusers naming holds
 * plain LoRA only (as `format`). */
static int read_formats(struct lycoris *net, ghc_cfg_t *cfg, int fmt, bool dora, int algo)
{
    const char **items = NULL;
    int n = 0, rc = read_list(cfg, "extra_formats", &items, &n);
    for (int i = 0; i < n && rc == 0; i++) {
        int f = 0;
        while (f < LYC_N_FORMATS && strcmp(items[i], lyc_format_name((enum lyc_format)f)) != 0)
            f++;
        bool dup = f == fmt;
        for (int k = 0; k < net->n_extra; k++)
            dup |= net->extra[k] == (enum lyc_format)f;
        if (f == LYC_N_FORMATS || dup)
            rc = ghc_error_set(net->core, GHC_ECONFIG, "%s: lycoris: extra_formats: '%s' is %s", ghc_cfg_where(cfg,
                               "extra_formats"), items[i], f == LYC_N_FORMATS ? "not one of \"comfyui\", \"musubi\", "
                               "\"diffusers\"" : "already written (format or an earlier entry)");
        else if (f == LYC_FMT_DIFFUSERS && (dora || (algo != 0 && algo != 3)))
            rc = ghc_error_set(net->core, GHC_ECONFIG, "%s: lycoris: extra_formats: \"diffusers\" holds plain LoRA "
                               "only (diffusers loads no LoHa, LoKr or DoRA for Wan)", ghc_cfg_where(cfg, "extra_formats"));
        else
            net->extra[net->n_extra++] = (enum lyc_format)f;
    }
    free(items);
    return rc;
}

static void expert_free(struct lyc_expert *e)
{
    for (int32_t i = 0; i < e->n_mods; i++) {
        struct lyc_module *md = &e->mods[i];
        for (int k = 0; k < LYC_MAX_PARAMS; k++) {
            ghc_tensor_free(md->p[k]);
            ghc_tensor_free(md->g[k]);
        }
        ghc_tensor_free(md->mask);
        ghc_tensor_free(md->hc);
        free(md->wn2);
        free(md->bias);
    }
    free(e->mods);
    free(e->by_target);
    free(e->params);
    free(e->names);
    *e = (struct lyc_expert){ 0 };
}

static void lyc_free(void *self)
{
    struct lycoris *net = self;
    if (!net)
        return;
    for (int e = 0; e < LYC_MAX_EXPERTS; e++)
        expert_free(&net->ex[e]);
    lyc_ws_free(net);
    free(net->hbuf);
    for (int i = 0; i < net->n_ov; i++)
        free(net->ov[i].pattern);
    free(net->ov);
    free(net->include);
    free(net->exclude);
    free(net);
}

static int lyc_init(ghc_core_t *core, ghc_cfg_t *cfg, void **self)
{
    static const char *const algos[] = { "lora", "loha", "lokr", "locon", NULL };
    static const char *const presets[] = { "attn", "attn_ffn", "full", NULL };
    static const char *const formats[] = { "comfyui", "musubi", "diffusers", NULL };
    static const char *const dtypes[] = { "bf16", "f16", "f32", NULL };
    int rc, algo, fmt, dt;
    int64_t rank, factor, seed, device;
    bool dora;
    struct lycoris *net = calloc(1, sizeof(*net));
    if (!net)
        return ghc_error_set(core, GHC_ENOMEM, "lycoris: out of memory");
    net->core = core;
    if ((rc = ghc_cfg_get_choice(cfg, "algo", 0, algos, &algo)) < 0 ||
        (rc = ghc_cfg_get_int(cfg, "rank", 16, 1, 1000000, &rank)) < 0 ||
        (rc = ghc_cfg_get_float(cfg, "alpha", 0.0, 0.0, 1e12, &net->alpha)) < 0 ||
        (rc = ghc_cfg_get_bool(cfg, "rs_lora", false, &net->rs_lora)) < 0 ||
        (rc = ghc_cfg_get_int(cfg, "factor", -1, -1, 1 << 20, &factor)) < 0 ||
        (rc = ghc_cfg_get_bool(cfg, "decompose_both", false, &net->decompose_both)) < 0 ||
        (rc = ghc_cfg_get_bool(cfg, "full_matrix", false, &net->full_matrix)) < 0 ||
        (rc = ghc_cfg_get_float(cfg, "rank_dropout", 0.0, 0.0, 0.999, &net->rank_dropout)) < 0 ||
        (rc = ghc_cfg_get_bool(cfg, "rank_dropout_scale", false, &net->rank_dropout_scale)) < 0 ||
        (rc = ghc_cfg_get_float(cfg, "module_dropout", 0.0, 0.0, 1.0, &net->module_dropout)) < 0 ||
        (rc = ghc_cfg_get_bool(cfg, "dora_wd", false, &dora)) < 0 ||
        (rc = ghc_cfg_get_choice(cfg, "preset", 1, presets, &net->preset)) < 0 ||
        (rc = ghc_cfg_get_choice(cfg, "format", LYC_FMT_MUSUBI, formats, &fmt)) < 0 ||
        (rc = ghc_cfg_get_choice(cfg, "save_dtype", 0, dtypes, &dt)) < 0 ||
        (rc = ghc_cfg_get_string(cfg, "title", NULL, &net->title)) < 0 ||
        (rc = ghc_cfg_get_int(cfg, "seed", 0, 0, INT64_MAX, &seed)) < 0 ||
        (rc = ghc_cfg_get_bool(cfg, "fold", false, &net->fold)) < 0 ||
        (rc = read_list(cfg, "include", &net->include, &net->n_include)) < 0 ||
        (rc = read_list(cfg, "exclude", &net->exclude, &net->n_exclude)) < 0 ||
        (rc = read_overrides(net, cfg)) < 0 || (rc = read_formats(net, cfg, fmt, dora, algo)) < 0)
        goto fail;
    if (factor == 0) {
        rc = ghc_error_set(core, GHC_ECONFIG, "%s: lycoris: factor must be -1 (most balanced) or >= 1",
                           ghc_cfg_where(cfg, "factor"));
        goto fail;
    }
    if (dora && (algo == 1 || algo == 2 || net->rank_dropout > 0 || fmt == 2)) {
        rc = ghc_error_set(core, GHC_ECONFIG, "%s: lycoris: dora_wd is implemented for algo \"lora\" without "
                           "rank_dropout, saved in format \"comfyui\" or \"musubi\" (doc/lycoris.md)",
                           ghc_cfg_where(cfg, "dora_wd"));
        goto fail;
    }
    net->dora = dora;
    net->model = ghc_model_get(core);
    net->algo = algo == 3 ? LYC_LORA : (enum lyc_algo)algo;
    net->rank = (int32_t)rank;
    net->factor = factor;
    net->format = (enum lyc_format)fmt;
    net->save_dtype = dt == 0 ? GHC_DTYPE_BF16 : dt == 1 ? GHC_DTYPE_F16 : GHC_DTYPE_F32;
    net->seed = (uint64_t)seed;
    if (net->format == LYC_FMT_DIFFUSERS && net->algo != LYC_LORA) {
        rc = ghc_error_set(core, GHC_ECONFIG, "%s: lycoris: format \"diffusers\" holds LoRA only (diffusers loads no "
                           "%s for Wan); use \"comfyui\" or \"musubi\"", ghc_cfg_where(cfg, "format"),
                           lyc_algo_name(net->algo));
        goto fail;
    }
    if (ghc_cfg_has(cfg, "device")) {
        if ((rc = ghc_cfg_get_int(cfg, "device", GHC_DEVICE_CPU, GHC_DEVICE_CPU, 1023, &device)) < 0)
            goto fail;
    } else {
        device = ghc_mem_default_device(core);
    }
    net->device = (int)device;
    ghc_log(core, GHC_LOG_INFO, "lycoris: %s%s rank %d alpha %g%s on %s", lyc_algo_name(net->algo),
            net->dora ? " + DoRA" : "", (int)net->rank,
            net->alpha > 0 ? net->alpha : (double)net->rank, net->rs_lora ? " (rs_lora)" : "",
            net->device == GHC_DEVICE_CPU ? "cpu" : "cuda");
    if (net->dora)   /* the tools disagree on DoRA: say where the file does what we train */
        ghc_log(core, GHC_LOG_WARN, "lycoris: DoRA files apply as trained in ComfyUI and `gh200core merge` only "
                "(dora_scale stored for ComfyUI's weight_decompose, metadata %s = base_weight); musubi-tuner "
                "ignores dora_scale (LoRA part alone), LyCORIS (musubi-tuner --lycoris) divides it by |W + dW| "
                "instead of |W|, diffusers refuses it: for those, merge with `gh200core merge` first "
                "(doc/lycoris.md)", LYC_DORA_NORM_KEY);
    *self = net;
    return 0;
fail:
    lyc_free(net);
    return rc;
}

/* ---- target selection and module shapes ------------------------------------------------------ */

static bool match_any(const char *const *pat, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (fnmatch(pat[i], name, 0) == 0)
            return true;
    return false;
}

static bool selected(const struct lycoris *net, const struct ghc_model_target *t)
{
    bool in_block = t->block >= 0;
    bool attn = strstr(t->name, "attn.") != NULL;
    bool base = net->preset == 2 || (in_block && (net->preset == 1 || attn));
    if (net->n_include && match_any(net->include, net->n_include, t->name))
        base = true;
    if (net->n_exclude && match_any(net->exclude, net->n_exclude, t->name))
        base = false;
    return base;
}

/* Rank, alpha, scale, LoKr factor shapes and the saved alpha of module md, as LyCORIS makes
 * them (doc/lycoris.md, "Files"). */
static void module_shape(const struct lycoris *net, struct lyc_module *md)
{
    md->algo = net->algo;
    md->rank = net->rank;
    md->alpha = net->alpha;
    for (int i = 0; i < net->n_ov; i++)
        if (fnmatch(net->ov[i].pattern, md->name, 0) == 0) {
            md->rank = net->ov[i].rank;
            if (net->ov[i].alpha >= 0)
                md->alpha = net->ov[i].alpha;
        }
    if (md->alpha <= 0)
        md->alpha = md->rank;
    double r = md->rank;
    if (md->algo == LYC_LOKR) {
        lyc_factorization(md->out, net->factor, &md->a, &md->b);
        lyc_factorization(md->in, net->factor, &md->c, &md->d);
        md->w1_lr = net->decompose_both && !net->full_matrix && r < (double)(md->a > md->c ? md->a : md->c) / 2;
        md->w2_lr = !net->full_matrix && r < (double)(md->b > md->d ? md->b : md->d) / 2;
        if (!md->w1_lr && !md->w2_lr)
            md->alpha = md->rank;   /* both full: scale 1, as LyCORIS */
    }
    double rf = net->rs_lora ? sqrt(r) : r;
    md->scale = (float)(md->alpha / rf);
    md->alpha_saved = (float)(md->alpha * r / rf);
    if (md->algo == LYC_LOKR && !md->w1_lr && !md->w2_lr)
        md->alpha_saved = (float)(md->b / md->a);   /* LyCORIS's defensive value */
}

/* Shapes of the module's parameter slots; 0 rows for an unused slot. */
static void param_shape(const struct lyc_module *md, int i, int64_t shape[2])
{
    int64_t r = md->rank;
    shape[0] = shape[1] = 0;
    switch (md->algo) {
    case LYC_LORA:
        if (i == 0) { shape[0] = r; shape[1] = md->in; }
        if (i == 1) { shape[0] = md->out; shape[1] = r; }
        if (i == 2 && md->dora) { shape[0] = md->out; shape[1] = 1; }
        break;
    case LYC_LOHA:
        shape[0] = i % 2 ? r : md->out;
        shape[1] = i % 2 ? md->in : r;
        break;
    case LYC_LOKR:
        if (i == 0) { shape[0] = md->a; shape[1] = md->w1_lr ? r : md->c; }
        if (i == 1 && md->w1_lr) { shape[0] = r; shape[1] = md->c; }
        if (i == 2) { shape[0] = md->b; shape[1] = md->w2_lr ? r : md->d; }
        if (i == 3 && md->w2_lr) { shape[0] = r; shape[1] = md->d; }
        break;
    }
}

/* Initial values, LyCORIS's (one factor of each product zero, so delta-W starts at 0), into host
 * memory v of n = rows x cols: 0 zeros, 1 kaiming(a=sqrt 5) U(+-1/sqrt(cols)), 2 N(0, 0.1^2),
 * 3 N(0, 1). */
static int init_kind(const struct lyc_module *md, int i)
{
    switch (md->algo) {
    case LYC_LORA: return i == 0 ? 1 : 0;
    case LYC_LOHA: return i == 0 ? 2 : i == 2 ? 0 : 3;
    case LYC_LOKR:
        if (i < 2) return 1;
        if (i == 2) return md->w2_lr ? 1 : 0;
        return 0;
    }
    return 0;
}

static int init_values(struct lycoris *net, struct lyc_module *md, int i, ghc_tensor_t *host)
{
    int kind = init_kind(md, i);
    float *v = ghc_tensor_data(host);
    int64_t n = ghc_tensor_numel(host), cols = ghc_tensor_dim(host, 1);
    struct ghc_rng rng = { net->seed ^ (0x9e3779b97f4a7c15ull * (uint64_t)(md->target + 1)), (uint64_t)i << 40 };
    int rc = 0;
    if (kind == 0)
        return ghc_op_fill(host, 0.0, NULL);
    if (kind == 1 && (rc = ghc_op_rand_uniform(host, &rng, NULL)) == 0) {
        double bound = 1.0 / sqrt((double)cols);
        for (int64_t k = 0; k < n; k++)
            v[k] = (float)((2.0 * v[k] - 1.0) * bound);
    }
    if (kind >= 2 && (rc = ghc_op_rand_normal(host, &rng, NULL)) == 0 && kind == 2)
        for (int64_t k = 0; k < n; k++)
            v[k] *= 0.1f;
    return rc;
}

static ghc_tensor_t *dev_tensor(struct lycoris *net, const int64_t *shape, enum ghc_mem_role role)
{
    return ghc_tensor_init(net->core, GHC_DTYPE_F32, 2, shape, net->device, role);
}

static int module_alloc(struct lycoris *net, struct lyc_module *md)
{
    int rc = 0;
    for (int i = 0; i < LYC_MAX_PARAMS && rc == 0; i++) {
        int64_t shape[2];
        param_shape(md, i, shape);
        if (!shape[0])
            continue;
        ghc_tensor_t *host = ghc_tensor_init(net->core, GHC_DTYPE_F32, 2, shape, GHC_DEVICE_CPU, GHC_ROLE_WORKSPACE);
        if (!host || !(md->p[i] = dev_tensor(net, shape, GHC_ROLE_ADAPTER)) ||
            !(md->g[i] = dev_tensor(net, shape, GHC_ROLE_GRADS))) {
            ghc_tensor_free(host);
            return ghc_error_code(net->core) ? ghc_error_code(net->core) : GHC_ENOMEM;
        }
        if ((rc = init_values(net, md, i, host)) == 0 && (rc = ghc_op_copy(md->p[i], host, NULL)) == 0 &&
            (rc = ghc_op_fill(md->g[i], 0.0, NULL)) == 0)
            rc = ghc_op_sync(net->core, net->device, NULL);
        ghc_tensor_free(host);
    }
    if (rc == 0 && net->rank_dropout > 0) {
        md->mask = ghc_tensor_init(net->core, GHC_DTYPE_F32, 1, (const int64_t[]){ md->out }, net->device,
                                   GHC_ROLE_ADAPTER);
        if (!md->mask)
            return ghc_error_code(net->core);
    }
    return rc;
}

/* ---- ops: attach, params, hooks ---------------------------------------------------------------- */

/* What the preset selected, in words; for "full", whether the model offers anything beyond the
 * block linears ("full" adds targets outside blocks: none on Wan2.2, whose model exposes only
 * the 10 linears of each block, so there it selects what "attn_ffn" does). */
static void log_preset(struct lycoris *net, int32_t expert, const struct ghc_model_target *targets, int32_t n)
{
    static const char *const names[] = { "attn", "attn_ffn", "full" };
    int32_t outside = 0, in_block = 0, attn = 0;
    for (int32_t t = 0; t < n; t++) {
        outside += targets[t].block < 0;
        in_block += targets[t].block >= 0;
        attn += targets[t].block >= 0 && strstr(targets[t].name, "attn.") != NULL;
    }
    int32_t sel = net->preset == 0 ? attn : net->preset == 1 ? in_block : n;
    char note[160] = "";
    if (net->preset == 2 && !outside)
        snprintf(note, sizeof(note), "; the model offers no target outside its blocks, so \"full\" selects what "
                 "\"attn_ffn\" does here");
    else if (net->preset == 2)
        snprintf(note, sizeof(note), "; %d of them outside the blocks (not in \"attn_ffn\")", (int)outside);
    ghc_log(net->core, GHC_LOG_INFO, "lycoris: expert %d: preset \"%s\": %d of the model's %d targets (%d block "
            "linears, %d of them attention)%s%s", (int)expert, names[net->preset], (int)sel, (int)n, (int)in_block,
            (int)attn, note, net->n_include || net->n_exclude ? ", before include/exclude" : "");
}

/* Which tools load the files save writes for expert, and what to do where one does not. The
 * rules are those of the tools' Wan loaders: checked for a model that claims Wan's architecture,
 * or with no model in the run (file.c, file_architecture); diffusers only where the targets have
 * diffusers names. */
static void log_loaders(struct lycoris *net, int32_t expert)
{
    static const char *const tool[] = { "ComfyUI", "musubi-tuner", "diffusers" };
    char why[768], list[96] = "", missing[96] = "";
    ghc_model_t *model = ghc_model_get(net->core);
    const char *arch = model ? ghc_model_architecture(model) : NULL;
    if (model && (!arch || strncmp(arch, "wan", 3) != 0)) {
        ghc_log(net->core, GHC_LOG_INFO, "lycoris: expert %d: adapter files in %s naming; which tools load them is "
                "not checked (the rules known are the Wan loaders' of ComfyUI, musubi-tuner and diffusers; the "
                "model's architecture is %s%s%s)", (int)expert, lyc_format_name(net->format), arch ? "\"" : "",
                arch ? arch : "not given", arch ? "\"" : "");
        return;
    }
    unsigned known = LYC_TOOL_COMFYUI | LYC_TOOL_MUSUBI;
    for (int32_t m = 0; m < net->ex[expert].n_mods; m++)
        known |= net->ex[expert].mods[m].alias ? LYC_TOOL_DIFFUSERS : 0u;
    unsigned all = lyc_loaders(net, &net->ex[expert], net->format, why, sizeof(why));
    for (int k = 0; k < net->n_extra; k++)
        all |= lyc_loaders(net, &net->ex[expert], net->extra[k], NULL, 0);
    for (int t = 0; t < 3; t++) {
        if (!(known & (1u << t)))
            continue;
        char *dst = all & (1u << t) ? list : missing;
        size_t o = strlen(dst);
        snprintf(dst + o, sizeof(list) - o, "%s%s", o ? ", " : "", tool[t]);
    }
    if (!*missing) {
        ghc_log(net->core, GHC_LOG_INFO, "lycoris: expert %d: the adapter files (%s naming%s) load in %s",
                (int)expert, lyc_format_name(net->format), net->n_extra ? " and extra_formats" : "", list);
        return;
    }
    /* a file in another naming that would add tools, where one can */
    char hint[160] = "";
    for (int f = 0; f < LYC_N_FORMATS && !*hint; f++) {
        unsigned add = lyc_loaders(net, &net->ex[expert], (enum lyc_format)f, NULL, 0) & ~all;
        for (int t = 0; t < 3; t++) {
            size_t o = strlen(hint);
            if (add & (1u << t))
                snprintf(hint + o, sizeof(hint) - o, "%s%s", o ? " and " : "", tool[t]);
        }
        if (*hint) {
            char names[64];
            snprintf(names, sizeof(names), "%s", hint);
            snprintf(hint, sizeof(hint), "; extra_formats = [ \"%s\" ] adds a file %s load%s",
                     lyc_format_name((enum lyc_format)f), names, strstr(names, " and ") ? "" : "s");
        }
    }
    ghc_log(net->core, GHC_LOG_WARN, "lycoris: expert %d: no file this run writes applies in %s as trained (%s "
            "naming: %s)%s; they load in: %s", (int)expert, missing, lyc_format_name(net->format), why, hint,
            *list ? list : "none");
}

static int lyc_attach(void *self, int32_t expert, const struct ghc_model_target *targets, int32_t n)
{
    struct lycoris *net = self;
    if (expert >= LYC_MAX_EXPERTS)
        return ghc_error_set(net->core, GHC_EINVAL, "lycoris: expert %d: at most %d experts", (int)expert,
                             LYC_MAX_EXPERTS);
    struct lyc_expert *e = &net->ex[expert];
    int rc = 0;
    size_t names_len = 0;
    expert_free(e);
    for (int i = 0; i < LYC_HKEEP; i++)   /* no kept H may name a module freed here */
        net->hk[i].md = NULL;
    if (!(e->by_target = malloc((size_t)(n ? n : 1) * sizeof(int32_t))) ||
        !(e->mods = calloc((size_t)(n ? n : 1), sizeof(*e->mods))))
        goto nomem;
    e->n_targets = n;
    for (int32_t t = 0; t < n; t++) {
        e->by_target[t] = -1;
        if (!selected(net, &targets[t]))
            continue;
        struct lyc_module *md = &e->mods[e->n_mods];
        *md = (struct lyc_module){ .target = t, .name = targets[t].name, .alias = targets[t].alias,
                                   .in = targets[t].in_features, .out = targets[t].out_features,
                                   .dora = net->dora, .expert = expert };
        module_shape(net, md);
        e->by_target[t] = e->n_mods++;
        if ((rc = module_alloc(net, md)) < 0 || (md->dora && (rc = lyc_dora_init(net, md)) < 0))
            goto fail;
        for (int i = 0; i < LYC_MAX_PARAMS; i++)
            if (md->p[i]) {
                e->n_params++;
                names_len += strlen(md->name) + strlen(lyc_param_suffix(md, i)) + 2 + 16;
            }
    }
    if (!e->n_mods) {
        rc = ghc_error_set(net->core, GHC_EINVAL, "lycoris: no target selected for expert %d among %d (preset, "
                           "include and exclude leave none)", (int)expert, (int)n);
        goto fail;
    }
    if (!(e->params = calloc((size_t)e->n_params, sizeof(*e->params))) || !(e->names = malloc(names_len)))
        goto nomem;
    char *p = e->names;
    int32_t k = 0;
    int64_t total = 0;
    /* With two experts the two adapters' params share module names: prefix them by expert so
     * that names stay unique in the optimizer and its state file. */
    ghc_model_t *model = ghc_model_get(net->core);
    bool prefix = model && ghc_model_experts(model) > 1;
    for (int32_t m = 0; m < e->n_mods; m++) {
        struct lyc_module *md = &e->mods[m];
        for (int i = 0; i < LYC_MAX_PARAMS; i++) {
            if (!md->p[i])
                continue;
            int len = prefix ? sprintf(p, "expert%d.%s.%s", (int)expert, md->name, lyc_param_suffix(md, i))
                             : sprintf(p, "%s.%s", md->name, lyc_param_suffix(md, i));
            e->params[k++] = (struct ghc_param){ .name = p, .value = md->p[i], .grad = md->g[i], .group = expert };
            p += len + 1;
            total += ghc_tensor_numel(md->p[i]);
        }
    }
    e->attached = true;
    ghc_log(net->core, GHC_LOG_INFO, "lycoris: expert %d: %s on %d of %d targets, %lld parameters", (int)expert,
            lyc_algo_name(net->algo), (int)e->n_mods, (int)n, (long long)total);
    log_preset(net, expert, targets, n);
    log_loaders(net, expert);
    return 0;
nomem:
    rc = ghc_error_set(net->core, GHC_ENOMEM, "lycoris: out of memory");
fail:
    expert_free(e);
    return rc;
}

static struct lyc_expert *attached(struct lycoris *net, int32_t expert, const char *what)
{
    if (expert < 0 || expert >= LYC_MAX_EXPERTS || !net->ex[expert].attached) {
        ghc_error_set(net->core, GHC_EINVAL, "lycoris: %s: expert %d has no adapters (call attach first)", what,
                      (int)expert);
        return NULL;
    }
    return &net->ex[expert];
}

static int lyc_params(void *self, int32_t expert, struct ghc_param **out, int32_t *n)
{
    struct lyc_expert *e = attached(self, expert, "params");
    if (!e)
        return GHC_EINVAL;
    *out = e->params;
    *n = e->n_params;
    return 0;
}

/* The module on `target` of the hooked expert, or NULL (not adapted). */
static struct lyc_module *hooked(struct lycoris *net, int32_t target)
{
    struct lyc_expert *e = &net->ex[net->hook_expert];
    if (target < 0 || target >= e->n_targets || e->by_target[target] < 0)
        return NULL;
    return &e->mods[e->by_target[target]];
}

static int check_x(struct lycoris *net, const struct lyc_module *md, const ghc_tensor_t *x)
{
    if (ghc_tensor_device(x) != net->device || ghc_tensor_dim(x, -1) != md->in)
        return ghc_error_set(net->core, GHC_EINVAL, "lycoris: %s: input [.., %lld] on device %d, expected [.., %lld] "
                             "on device %d (the network's 'device')", md->name, (long long)ghc_tensor_dim(x, -1),
                             ghc_tensor_device(x), (long long)md->in, net->device);
    return 0;
}

/* LoRA without DoRA: its part is the rank-r product s (x A^T) B^T, and its input gradient dH A
 * is as readily written as added (DoRA's output is not a sum: added only). */
static bool plain_lora(const struct lyc_module *md)
{
    return md->algo == LYC_LORA && !md->dora;
}

/* fold (the user's numerical choice, key fold), else K-concatenation: LoRA without DoRA and
 * without rank dropout (whose mask is no factor the model's GEMMs could take). */
static bool folds(const struct lycoris *net, const struct lyc_module *md)
{
    return net->fold && plain_lora(md) && !md->mask;
}

static bool concats(const struct lycoris *net, const struct lyc_module *md)
{
    return !net->fold && plain_lora(md) && !md->mask;
}

/* What the core may do on `target` (model.h, struct ghc_adapter_plan). Returns 1 (filled), as
 * every member that did its work; also for a target without an adapter (adapted false). */
static int hook_plan(void *user, int32_t target, struct ghc_adapter_plan *out)
{
    struct lycoris *net = user;
    const struct lyc_module *md = hooked(net, target);
    struct ghc_adapter_plan p = { .struct_size = out->struct_size };
    if (md) {
        p.adapted = true;
        p.forward_writes = !md->dora;
        p.backward_writes = plain_lora(md);
        p.fold = folds(net, md);
        p.concat_rank = concats(net, md) ? md->rank : 0;
    }
    memcpy(out, &p, out->struct_size < sizeof(p) ? out->struct_size : sizeof(p));
    return 1;
}

static int hook_forward(void *user, int32_t target, const ghc_tensor_t *x, ghc_tensor_t *y, bool write, void *stream)
{
    struct lycoris *net = user;
    struct lyc_module *md = hooked(net, target);
    if (!md || md->dropped)
        return 0;
    int rc = check_x(net, md, x);
    if (rc == 0)
        rc = lyc_forward(net, md, x, y, write, stream);
    return rc < 0 ? rc : 1;
}

static int hook_backward(void *user, int32_t target, const ghc_tensor_t *x, const ghc_tensor_t *dy,
                         const ghc_tensor_t *g, ghc_tensor_t *dx, bool accumulate, void *stream)
{
    struct lycoris *net = user;
    struct lyc_module *md = hooked(net, target);
    if (!md || md->dropped)
        return 0;
    int rc = check_x(net, md, x);
    if (rc == 0)
        rc = lyc_backward(net, md, x, dy, g, dx, accumulate, stream);
    return rc < 0 ? rc : 1;
}

/* fold: 0 for a module dropped in this step (wf untouched: the core runs the frozen weight alone). */
static int hook_fold(void *user, int32_t target, const ghc_tensor_t *w, ghc_tensor_t *wf, void *stream)
{
    struct lycoris *net = user;
    struct lyc_module *md = hooked(net, target);
    if (!md || md->dropped || !folds(net, md))
        return 0;
    return lyc_fold(net, md, w, wf, stream);
}

static int hook_grads(void *user, int32_t target, const ghc_tensor_t *x, const ghc_tensor_t *g, void *stream)
{
    struct lycoris *net = user;
    struct lyc_module *md = hooked(net, target);
    if (!md || md->dropped)
        return 0;
    int rc = check_x(net, md, x);
    if (rc == 0)
        rc = lyc_grads(net, md, x, g, stream);
    return rc < 0 ? rc : 1;
}

static int hook_concat_forward(void *user, int32_t target, const ghc_tensor_t *x, ghc_tensor_t *h,
                               ghc_tensor_t *wcols, bool again, void *stream)
{
    struct lycoris *net = user;
    struct lyc_module *md = hooked(net, target);
    if (!md || md->dropped || !concats(net, md))
        return 0;
    int rc = check_x(net, md, x);
    return rc < 0 ? rc : lyc_concat_forward(net, md, x, h, wcols, again, stream);
}

static int hook_concat_backward(void *user, int32_t target, const ghc_tensor_t *x, const ghc_tensor_t *h,
                                const ghc_tensor_t *dy, ghc_tensor_t *g, ghc_tensor_t *dh, ghc_tensor_t *wrows,
                                void *stream)
{
    struct lycoris *net = user;
    struct lyc_module *md = hooked(net, target);
    if (!md || md->dropped || !concats(net, md))
        return 0;
    int rc = check_x(net, md, x);
    return rc < 0 ? rc : lyc_concat_backward(net, md, x, h, dy, g, dh, wrows, stream);
}

static int lyc_hook(void *self, int32_t expert, struct ghc_adapter_hook *out)
{
    struct lycoris *net = self;
    if (!attached(net, expert, "hook"))
        return GHC_EINVAL;
    net->hook_expert = expert;
    *out = (struct ghc_adapter_hook){
        .struct_size = sizeof(struct ghc_adapter_hook), .user = net, .plan = hook_plan, .forward = hook_forward,
        .backward = hook_backward, .fold = hook_fold, .grads = hook_grads, .concat_forward = hook_concat_forward,
        .concat_backward = hook_concat_backward,
    };
    return 0;
}

/* ---- dropout ----------------------------------------------------------------------------------- */

/* Uniform [0, 1) number k of stream (seed, step, target): Philox, counter (k/4, step, target). */
static double uniform(const struct lycoris *net, int64_t step, int32_t target, uint64_t k)
{
    uint32_t ctr[4] = { (uint32_t)(k / 4), (uint32_t)((uint64_t)step >> 32), (uint32_t)step, (uint32_t)target };
    uint32_t key[2] = { (uint32_t)net->seed, (uint32_t)(net->seed >> 32) ^ 0x6c79636fu }, o[4];
    ghc_philox4x32(ctr, key, o);
    return (double)(o[k % 4] >> 8) * (1.0 / 16777216.0);
}

/* Draw step `step`'s module-dropout decisions and rank-dropout masks (output rows of delta-W,
 * LyCORIS's rebuild semantics), the same for every call of that step. */
static int lyc_begin_step(void *self, int64_t step)
{
    struct lycoris *net = self;
    int rc = 0;
    net->step = step;
    for (int e = 0; e < LYC_MAX_EXPERTS && rc == 0; e++)
        for (int32_t m = 0; m < net->ex[e].n_mods && rc == 0; m++) {
            struct lyc_module *md = &net->ex[e].mods[m];
            md->dropped = net->module_dropout > 0 && uniform(net, step, md->target, 0) < net->module_dropout;
            if (!md->mask)
                continue;
            ghc_tensor_t *h = ghc_tensor_init(net->core, GHC_DTYPE_F32, 1, (const int64_t[]){ md->out },
                                              GHC_DEVICE_CPU, GHC_ROLE_WORKSPACE);
            if (!h)
                return ghc_error_code(net->core);
            float *v = ghc_tensor_data(h);
            int64_t kept = 0;
            for (int64_t o = 0; o < md->out; o++)
                kept += (v[o] = uniform(net, step, md->target, 4 + (uint64_t)o) > net->rank_dropout ? 1.0f : 0.0f) > 0;
            if (net->rank_dropout_scale && kept)
                for (int64_t o = 0; o < md->out; o++)
                    v[o] *= (float)((double)md->out / (double)kept);   /* d / mean(d) */
            if ((rc = ghc_op_copy(md->mask, h, NULL)) == 0)
                rc = ghc_op_sync(net->core, net->device, NULL);
            ghc_tensor_free(h);
        }
    return rc;
}

/* ---- files ------------------------------------------------------------------------------------- */

static int lyc_save_op(void *self, int32_t expert, const char *path)
{
    if (!attached(self, expert, "save"))
        return GHC_EINVAL;
    return lyc_save(self, expert, path);
}

static int lyc_load_op(void *self, int32_t expert, const char *path)
{
    if (!attached(self, expert, "load"))
        return GHC_EINVAL;
    struct lycoris *net = self;
    for (int i = 0; i < LYC_HKEEP; i++)   /* the loaded factors make every kept H stale */
        net->hk[i].valid = false;
    return lyc_load(self, expert, path);
}

/* ---- registration ------------------------------------------------------------------------------ */

static const struct ghc_network_ops lyc_ops = {
    .struct_size = sizeof(struct ghc_network_ops),
    .name = "lycoris",
    .keys = lyc_keys,
    .init = lyc_init,
    .attach = lyc_attach,
    .hook = lyc_hook,
    .params = lyc_params,
    .save = lyc_save_op,
    .load = lyc_load_op,
    .free = lyc_free,
    .begin_step = lyc_begin_step,
    .merge_open = lyc_merge_open,
    .merge_count = lyc_merge_count,
    .merge_module = lyc_merge_module,
    .merge_apply = lyc_merge_apply,
    .merge_skipped = lyc_merge_skipped,
    .merge_free = lyc_merge_free,
    .estimate = lyc_estimate,
};

static int lyc_plugin_init(ghc_core_t *core)
{
    return ghc_register_network(core, &lyc_ops);
}

GHC_PLUGIN_EXPORT const struct ghc_plugin ghc_plugin_lycoris = {
    .abi = GHC_PLUGIN_ABI,
    .api = GHC_API_VERSION,
    .struct_size = sizeof(struct ghc_plugin),
    .kinds = GHC_KIND_BIT(GHC_KIND_NETWORK),
    .name = "lycoris",
    .version = GHC_VERSION,
    .description = "LoRA, LoHa and LoKr adapters (LyCORIS semantics), ComfyUI/musubi/diffusers files",
    .init = lyc_plugin_init,
};
