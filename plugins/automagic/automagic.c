/* automagic.c: the `automagic` optimizer: ai-toolkit's Automagic v1 (doc/optimizers.md): a
 * per-element learning-rate mask moved by sign agreement, a factored second moment for
 * params of 2 or more dims (full for others), RMS clipping of the update and decoupled weight
 * decay at the per-element rate. The mask is int8 codes with one scale per tensor as upstream
 * (lr_mask = "int8", default) or f32 values (lr_mask = "f32"). Per-group lr, min_lr, max_lr and
 * lr_bump: high_noise_* for group 0, low_noise_* for group 1, each falling back to the plain
 * key. The scheduler's lr factor is ignored (upstream ignores the group lr). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../adamw/optim_common.h"

struct automagic {
    struct optim base;
    double lr[3], min_lr[3], max_lr[3], lr_bump[3];
    double eps, clip, beta2, weight_decay;
    bool   mask_f32;
};

static const struct optim_state_kind automagic_kinds[OPTIM_STATES] = {
    { "exp_avg_sq_row", "exp_avg_sq" }, { "exp_avg_sq_col", NULL }, { "lr_mask", NULL }, { "lr_scale", NULL }, { "last_polarity", NULL }, { NULL, NULL },
};

static const struct ghc_cfg_key automagic_keys[] = {
    OPTIM_STAGE_KEYS("lr", "1e-6", "0 to 1e-3"), OPTIM_STAGE_KEYS("min_lr", "1e-7", "0 to 1"),
    OPTIM_STAGE_KEYS("max_lr", "1e-3", "0 to 1"), OPTIM_STAGE_KEYS("lr_bump", "1e-6", "0 to 1"),
    { "eps",            GHC_CFG_FLOAT,  "1e-30", "0 to 1",           NULL },
    { "clip_threshold", GHC_CFG_FLOAT,  "1.0",   "1e-12 to 1e12",    NULL },
    { "beta2",          GHC_CFG_FLOAT,  "0.999", "0 to 0.999999999", NULL },
    { "weight_decay",   GHC_CFG_FLOAT,  "0.0",   "0 to 1e3",         NULL },
    { "lr_mask",        GHC_CFG_STRING, "int8",  "int8, f32",        NULL },
    { "seed",           GHC_CFG_INT,    "0",     "0 to 2^63-1",      NULL },
    { NULL, 0, NULL, NULL, NULL }
};

static int automagic_init(ghc_core_t *core, ghc_cfg_t *cfg, void **self)
{
    static const char *const masks[] = { "int8", "f32", NULL };
    struct automagic *a = calloc(1, sizeof(*a));
    int64_t seed;
    int mask, rc;
    if (!a)
        return ghc_error_set(core, GHC_ENOMEM, "automagic: out of memory");
    if ((rc = optim_cfg_group_float(cfg, "lr", 1e-6, 0.0, 1e-3, a->lr)) < 0 ||
        (rc = optim_cfg_group_float(cfg, "min_lr", 1e-7, 0.0, 1.0, a->min_lr)) < 0 ||
        (rc = optim_cfg_group_float(cfg, "max_lr", 1e-3, 0.0, 1.0, a->max_lr)) < 0 ||
        (rc = optim_cfg_group_float(cfg, "lr_bump", 1e-6, 0.0, 1.0, a->lr_bump)) < 0 ||
        (rc = ghc_cfg_get_float(cfg, "eps", 1e-30, 0.0, 1.0, &a->eps)) < 0 ||
        (rc = ghc_cfg_get_float(cfg, "clip_threshold", 1.0, 1e-12, 1e12, &a->clip)) < 0 ||
        (rc = ghc_cfg_get_float(cfg, "beta2", 0.999, 0.0, 0.999999999, &a->beta2)) < 0 ||
        (rc = ghc_cfg_get_float(cfg, "weight_decay", 0.0, 0.0, 1e3, &a->weight_decay)) < 0 ||
        (rc = ghc_cfg_get_choice(cfg, "lr_mask", 0, masks, &mask)) < 0 ||
        (rc = ghc_cfg_get_int(cfg, "seed", 0, 0, INT64_MAX, &seed)) < 0)
        goto fail;
    for (int g = 0; g < 3; g++) {
        const char *pre = optim_group_prefix[g];
        if (!(a->min_lr[g] <= a->lr[g] && a->lr[g] <= a->max_lr[g])) {
            char key[32];
            snprintf(key, sizeof(key), "%slr", pre);
            rc = ghc_error_set(core, GHC_ECONFIG,
                               "%s: automagic: need %smin_lr <= %slr <= %smax_lr, got %g <= %g <= %g",
                               ghc_cfg_where(cfg, ghc_cfg_has(cfg, key) ? key : NULL), pre, pre, pre,
                               a->min_lr[g], a->lr[g], a->max_lr[g]);
            goto fail;
        }
    }
    a->mask_f32 = mask == 1;
    a->base = (struct optim){ .core = core, .name = "automagic", .kinds = automagic_kinds, .seed = (uint64_t)seed };
    *self = a;
    return 0;
fail:
    free(a);
    return rc;
}

static int automagic_init_state(void *self, struct optim_param *op)
{
    struct automagic *a = self;
    struct optim *o = &a->base;
    ghc_tensor_t *v = op->p->value;
    int nd = ghc_tensor_ndim(v), g = optim_group_slot(op->p->group);
    const int64_t *sh = ghc_tensor_shape(v);
    int64_t n = ghc_tensor_numel(v), words = (n + 31) / 32;
    /* the mask starts at lr everywhere: Auto8bitTensor(ones * lr) gives code 127 */
    float lr = (float)a->lr[g], scale = lr > 0.0f ? (float)((double)lr / 127.0) : 1.0f;
    uint8_t code = (uint8_t)(int8_t)fminf(fmaxf(rintf(lr / scale), -127.0f), 127.0f);
    float aux[2] = { scale, lr };
    int64_t col[GHC_TENSOR_MAX_DIMS], two = 2;
    if (nd >= 2) {
        for (int d = 0; d < nd - 2; d++)
            col[d] = sh[d];
        col[nd - 2] = sh[nd - 1];
        op->state[0] = optim_state_new(o, v, GHC_DTYPE_F32, nd - 1, sh, NULL);
        op->state[1] = optim_state_new(o, v, GHC_DTYPE_F32, nd - 1, col, NULL);
    } else {
        op->state[0] = optim_state_new(o, v, GHC_DTYPE_F32, 1, &n, NULL);
    }
    if (a->mask_f32)
        op->state[2] = optim_state_new(o, v, GHC_DTYPE_F32, 1, &n, &lr);
    else
        op->state[2] = optim_state_new(o, v, GHC_DTYPE_U8, 1, &n, &code);
    op->state[3] = optim_state_new(o, v, GHC_DTYPE_F32, 1, &two, NULL);
    op->state[4] = optim_state_new(o, v, GHC_DTYPE_I32, 1, &words, NULL);
    op->state[5] = optim_state_new(o, v, GHC_DTYPE_I32, 1, &words, NULL);
    for (int s = 0; s < OPTIM_STATES; s++)
        if (!op->state[s] && (s != 1 || nd >= 2))
            return ghc_error_code(o->core) ? ghc_error_code(o->core) : GHC_ENOMEM;
    /* the scale and the mean lr (a second fill: two different values) */
    if (ghc_tensor_device(v) == GHC_DEVICE_CPU) {
        memcpy(ghc_tensor_data(op->state[3]), aux, sizeof(aux));
    } else {
        ghc_tensor_t *h = ghc_tensor_wrap(o->core, GHC_DTYPE_F32, 1, &two, GHC_DEVICE_CPU, aux);
        int rc = h ? ghc_op_copy(op->state[3], h, NULL) : GHC_ENOMEM;
        if (rc >= 0)
            rc = ghc_op_sync(o->core, ghc_tensor_device(v), NULL);
        ghc_tensor_free(h);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int automagic_add_params(void *self, struct ghc_param *params, int32_t n)
{
    return optim_add(&((struct automagic *)self)->base, params, n, automagic_init_state, self);
}

static int automagic_step(void *self, int32_t group, int64_t step, float lr_factor, void *stream)
{
    struct automagic *a = self;
    struct optim *o = &a->base;
    int g = optim_group_slot(group), rc;
    (void)lr_factor;
    struct ghc_optim_tensor *ts = malloc(sizeof(*ts) * (size_t)(o->n ? o->n : 1));
    if (!ts)
        return ghc_error_set(o->core, GHC_ENOMEM, "automagic: out of memory");
    int32_t m = 0;
    for (int32_t i = 0; i < o->n; i++) {
        struct optim_param *op = &o->ps[i];
        if (op->p->group != group || !op->p->grad)
            continue;
        op->k++;
        ts[m] = (struct ghc_optim_tensor){ .param = op->p->value, .grad = op->p->grad, .rng = optim_rng(o, op, step) };
        memcpy(ts[m].state, op->state, sizeof(ts[m].state));
        m++;
    }
    struct ghc_automagic_args args = {
        .beta2 = (float)a->beta2,
        .beta2_comp = (float)(1.0 - a->beta2),
        .eps = (float)a->eps,
        .clip = (float)a->clip,
        .lr_bump = (float)a->lr_bump[g],
        .min_lr = (float)a->min_lr[g],
        .max_lr = (float)a->max_lr[g],
        .weight_decay = (float)a->weight_decay,
    };
    rc = ghc_op_automagic(ts, m, &args, stream);
    free(ts);
    return rc;
}

/* The mean of the group's per-tensor mean lr (upstream's reported lr). Reads the device: for
 * logs, not for the step loop. */
static float automagic_lr(void *self, int32_t group)
{
    struct automagic *a = self;
    struct optim *o = &a->base;
    double sum = 0;
    int n = 0;
    for (int32_t i = 0; i < o->n; i++) {
        struct optim_param *op = &o->ps[i];
        if (op->p->group != group)
            continue;
        float aux[2] = { 0, 0 };
        int64_t two = 2;
        ghc_tensor_t *h = ghc_tensor_wrap(o->core, GHC_DTYPE_F32, 1, &two, GHC_DEVICE_CPU, aux);
        if (!h || ghc_op_copy(h, op->state[3], NULL) < 0 ||
            ghc_op_sync(o->core, ghc_tensor_device(op->state[3]), NULL) < 0) {
            ghc_tensor_free(h);
            return NAN;
        }
        ghc_tensor_free(h);
        sum += aux[1];
        n++;
    }
    return n ? (float)(sum / n) : (float)a->lr[optim_group_slot(group)];
}

static int automagic_save(void *self, const char *path)
{
    struct automagic *a = self;
    char v[16][32];
    const char *meta[40];
    int k = 0;
    for (int g = 0; g < 3; g++) {
        static const char *const names[3][4] = {
            { "high_noise_lr", "high_noise_min_lr", "high_noise_max_lr", "high_noise_lr_bump" },
            { "low_noise_lr", "low_noise_min_lr", "low_noise_max_lr", "low_noise_lr_bump" },
            { "lr", "min_lr", "max_lr", "lr_bump" } };
        const double vals[4] = { a->lr[g], a->min_lr[g], a->max_lr[g], a->lr_bump[g] };
        for (int j = 0; j < 4; j++) {
            snprintf(v[g * 4 + j], sizeof(v[0]), "%.17g", vals[j]);
            meta[k++] = names[g][j];
            meta[k++] = v[g * 4 + j];
        }
    }
    snprintf(v[12], sizeof(v[0]), "%.17g", a->beta2);
    snprintf(v[13], sizeof(v[0]), "%.17g", a->eps);
    snprintf(v[14], sizeof(v[0]), "%.17g", a->clip);
    snprintf(v[15], sizeof(v[0]), "%.17g", a->weight_decay);
    const char *tail[] = { "beta2", v[12], "eps", v[13], "clip_threshold", v[14], "weight_decay", v[15],
                           "lr_mask", a->mask_f32 ? "f32" : "int8", NULL };
    for (int j = 0; tail[j]; j++)
        meta[k++] = tail[j];
    meta[k] = NULL;
    return optim_save(&a->base, path, meta);
}

/* Config wins over the checkpoint for the bounds and the bump (as the GH200 fork does); the
 * mask's kind must match (its tensors differ in dtype, which optim_load reports). */
static int automagic_load(void *self, const char *path) { return optim_load(&((struct automagic *)self)->base, path); }

static void automagic_free(void *self)
{
    struct automagic *a = self;
    optim_free(&a->base);
    free(a);
}

static const struct ghc_optimizer_ops automagic_ops = {
    .struct_size = sizeof(struct ghc_optimizer_ops),
    .name = "automagic",
    .keys = automagic_keys,
    .init = automagic_init,
    .add_params = automagic_add_params,
    .step = automagic_step,
    .lr = automagic_lr,
    .save = automagic_save,
    .load = automagic_load,
    .free = automagic_free,
};

static int automagic_plugin_init(ghc_core_t *core) { return ghc_register_optimizer(core, &automagic_ops); }

GHC_PLUGIN_EXPORT const struct ghc_plugin ghc_plugin_automagic = {
    .abi = GHC_PLUGIN_ABI,
    .api = GHC_API_VERSION,
    .struct_size = sizeof(struct ghc_plugin),
    .kinds = GHC_KIND_BIT(GHC_KIND_OPTIMIZER),
    .name = "automagic",
    .version = GHC_VERSION,
    .description = "Automagic v1 (ai-toolkit): sign-agreement lr mask, factored 2nd moment, stage lr bounds",
    .init = automagic_plugin_init,
};
