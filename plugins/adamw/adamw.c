/* adamw.c: the `adamw` optimizer: AdamW as torch.optim.AdamW computes it (fp32 moments, bias
 * correction per tensor, decoupled weight decay), with per-group lr and weight decay
 * (high_noise_* / low_noise_* falling back to the plain keys), on the params' device through
 * ghc_op_adamw (one multi-tensor launch per step on the GPU). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "optim_common.h"

struct adamw {
    struct optim base;
    double lr[3], weight_decay[3];
    double beta1, beta2, eps;
    float  last_factor[3];
};

static const struct optim_state_kind adamw_kinds[OPTIM_STATES] = { { "exp_avg", NULL }, { "exp_avg_sq", NULL } };

static const struct ghc_cfg_key adamw_keys[] = {
    OPTIM_STAGE_KEYS("lr", "1e-3", "0 to 1e3"),
    OPTIM_STAGE_KEYS("weight_decay", "1e-2", "0 to 1e3"),
    { "beta1", GHC_CFG_FLOAT, "0.9",   "0 to 0.999999",    NULL },
    { "beta2", GHC_CFG_FLOAT, "0.999", "0 to 0.999999999", NULL },
    { "eps",   GHC_CFG_FLOAT, "1e-8",  "0 to 1",           NULL },
    { "seed",  GHC_CFG_INT,   "0",     "0 to 2^63-1",      NULL },
    { NULL, 0, NULL, NULL, NULL }
};

static int adamw_init(ghc_core_t *core, ghc_cfg_t *cfg, void **self)
{
    struct adamw *a = calloc(1, sizeof(*a));
    int64_t seed;
    int rc;
    if (!a)
        return ghc_error_set(core, GHC_ENOMEM, "adamw: out of memory");
    if ((rc = optim_cfg_group_float(cfg, "lr", 1e-3, 0.0, 1e3, a->lr)) < 0 ||
        (rc = optim_cfg_group_float(cfg, "weight_decay", 1e-2, 0.0, 1e3, a->weight_decay)) < 0 ||
        (rc = ghc_cfg_get_float(cfg, "beta1", 0.9, 0.0, 0.999999, &a->beta1)) < 0 ||
        (rc = ghc_cfg_get_float(cfg, "beta2", 0.999, 0.0, 0.999999999, &a->beta2)) < 0 ||
        (rc = ghc_cfg_get_float(cfg, "eps", 1e-8, 0.0, 1.0, &a->eps)) < 0 ||
        (rc = ghc_cfg_get_int(cfg, "seed", 0, 0, INT64_MAX, &seed)) < 0) {
        free(a);
        return rc;
    }
    a->base = (struct optim){ .core = core, .name = "adamw", .kinds = adamw_kinds, .seed = (uint64_t)seed };
    for (int g = 0; g < 3; g++)
        a->last_factor[g] = 1.0f;
    *self = a;
    return 0;
}

static int adamw_init_state(void *self, struct optim_param *op)
{
    struct adamw *a = self;
    ghc_tensor_t *v = op->p->value;
    for (int s = 0; s < 2; s++)
        if (!(op->state[s] = optim_state_new(&a->base, v, GHC_DTYPE_F32, ghc_tensor_ndim(v), ghc_tensor_shape(v), NULL)))
            return ghc_error_code(a->base.core) ? ghc_error_code(a->base.core) : GHC_ENOMEM;
    return 0;
}

static int adamw_add_params(void *self, struct ghc_param *params, int32_t n)
{
    return optim_add(&((struct adamw *)self)->base, params, n, adamw_init_state, self);
}

/* The per-step scalars as torch computes them from Python floats (f64, then f32). */
static struct ghc_adamw_args adamw_args(const struct adamw *a, int g, float factor, int64_t k)
{
    double lr = a->lr[g] * (double)factor, bc1 = 1.0 - pow(a->beta1, (double)k), bc2 = 1.0 - pow(a->beta2, (double)k);
    return (struct ghc_adamw_args){
        .decay = (float)(1.0 - lr * a->weight_decay[g]),
        .beta1_comp = (float)(1.0 - a->beta1),
        .beta2 = (float)a->beta2,
        .beta2_comp = (float)(1.0 - a->beta2),
        .bc2_sqrt = (float)pow(bc2, 0.5),
        .eps = (float)a->eps,
        .step_size = (float)(lr / bc1),
    };
}

static int adamw_step(void *self, int32_t group, int64_t step, float lr_factor, void *stream)
{
    struct adamw *a = self;
    struct optim *o = &a->base;
    int g = optim_group_slot(group), rc = 0;
    struct ghc_optim_tensor *ts = malloc(sizeof(*ts) * (size_t)(o->n ? o->n : 1));
    bool *done = calloc((size_t)(o->n ? o->n : 1), 1);
    if (!ts || !done) {
        rc = ghc_error_set(o->core, GHC_ENOMEM, "adamw: out of memory");
        goto out;
    }
    a->last_factor[g] = lr_factor;
    /* one launch per distinct step count (normally all params of a group share it) */
    for (int32_t i = 0; i < o->n; i++) {
        struct optim_param *first = &o->ps[i];
        if (done[i] || first->p->group != group || !first->p->grad)
            continue;
        int32_t m = 0;
        int64_t k0 = first->k;
        for (int32_t j = i; j < o->n; j++) {
            struct optim_param *op = &o->ps[j];
            if (done[j] || op->p->group != group || !op->p->grad || op->k != k0)
                continue;
            done[j] = true;
            op->k = k0 + 1;
            ts[m++] = (struct ghc_optim_tensor){ .param = op->p->value, .grad = op->p->grad,
                                                 .state = { op->state[0], op->state[1] },
                                                 .rng = optim_rng(o, op, step) };
        }
        struct ghc_adamw_args args = adamw_args(a, g, lr_factor, k0 + 1);
        if ((rc = ghc_op_adamw(ts, m, &args, stream)) < 0)
            goto out;
    }
out:
    free(done);
    free(ts);
    return rc;
}

static float adamw_lr(void *self, int32_t group)
{
    struct adamw *a = self;
    int g = optim_group_slot(group);
    return (float)(a->lr[g] * (double)a->last_factor[g]);
}

static int adamw_save(void *self, const char *path)
{
    struct adamw *a = self;
    char b1[32], b2[32], eps[32];
    snprintf(b1, sizeof(b1), "%.17g", a->beta1);
    snprintf(b2, sizeof(b2), "%.17g", a->beta2);
    snprintf(eps, sizeof(eps), "%.17g", a->eps);
    const char *meta[] = { "beta1", b1, "beta2", b2, "eps", eps, NULL };
    return optim_save(&a->base, path, meta);
}

static int adamw_load(void *self, const char *path) { return optim_load(&((struct adamw *)self)->base, path); }

static void adamw_free(void *self)
{
    struct adamw *a = self;
    optim_free(&a->base);
    free(a);
}

static const struct ghc_optimizer_ops adamw_ops = {
    .struct_size = sizeof(struct ghc_optimizer_ops),
    .name = "adamw",
    .keys = adamw_keys,
    .init = adamw_init,
    .add_params = adamw_add_params,
    .step = adamw_step,
    .lr = adamw_lr,
    .save = adamw_save,
    .load = adamw_load,
    .free = adamw_free,
};

static int adamw_plugin_init(ghc_core_t *core) { return ghc_register_optimizer(core, &adamw_ops); }

GHC_PLUGIN_EXPORT const struct ghc_plugin ghc_plugin_adamw = {
    .abi = GHC_PLUGIN_ABI,
    .api = GHC_API_VERSION,
    .struct_size = sizeof(struct ghc_plugin),
    .kinds = GHC_KIND_BIT(GHC_KIND_OPTIMIZER),
    .name = "adamw",
    .version = GHC_VERSION,
    .description = "AdamW (torch.optim.AdamW's arithmetic), per-expert lr and weight decay",
    .init = adamw_plugin_init,
};
