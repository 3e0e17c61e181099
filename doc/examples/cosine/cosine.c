/* cosine.c: the `cosine` scheduler, an example of a third-party plugin built out of tree
 * against an installed gh200core with nothing but pkg-config (see Makefile here and
 * doc/plugin-guide.md). The lr factor rises linearly over warmup_steps, then falls along
 * half a cosine from 1 to min_factor over decay_steps and stays there; every optimizer
 * step accumulates the same number of micro-batches. */
#include <math.h>
#include <stdlib.h>

#include <gh200core/scheduler.h>   /* defines: struct ghc_scheduler_ops, ghc_register_scheduler */

#define COSINE_PI        3.14159265358979323846
#define COSINE_MAX_STEPS (INT64_C(1) << 40)

struct cosine {
    int32_t micro_batches;
    int64_t warmup_steps;
    int64_t decay_steps;
    double  min_factor;
};

/* The keys of the scheduler section besides `plugin`; the core rejects any other key with
 * file:line (and a "did you mean") before cosine_init() runs. */
static const struct ghc_cfg_key cosine_keys[] = {
    { "micro_batches", GHC_CFG_INT },
    { "warmup_steps",  GHC_CFG_INT },
    { "decay_steps",   GHC_CFG_INT },
    { "min_factor",    GHC_CFG_FLOAT },
    { NULL, 0 }
};

static int cosine_init(ghc_core_t *core, ghc_cfg_t *cfg, void **self)
{
    int64_t micro_batches, warmup_steps, decay_steps;
    double min_factor;
    int rc;
    /* decay_steps has no sensible default: the run's length is the user's to say. */
    if (!ghc_cfg_has(cfg, "decay_steps"))
        return ghc_error_set(core, GHC_ECONFIG,
                             "%s: scheduler \"cosine\": missing key 'decay_steps' (optimizer steps from 1 down to min_factor)",
                             ghc_cfg_where(cfg, NULL));
    if ((rc = ghc_cfg_get_int(cfg, "micro_batches", 1, 1, 65536, &micro_batches)) < 0 ||
        (rc = ghc_cfg_get_int(cfg, "warmup_steps", 0, 0, COSINE_MAX_STEPS, &warmup_steps)) < 0 ||
        (rc = ghc_cfg_get_int(cfg, "decay_steps", 1, 1, COSINE_MAX_STEPS, &decay_steps)) < 0 ||
        (rc = ghc_cfg_get_float(cfg, "min_factor", 0.0, 0.0, 1.0, &min_factor)) < 0)
        return rc;   /* the message already says file:line, key and range */
    struct cosine *c = malloc(sizeof(*c));
    if (!c)
        return ghc_error_set(core, GHC_ENOMEM, "cosine: out of memory");
    *c = (struct cosine){
        .micro_batches = (int32_t)micro_batches,
        .warmup_steps = warmup_steps,
        .decay_steps = decay_steps,
        .min_factor = min_factor,
    };
    ghc_log(core, GHC_LOG_DEBUG, "cosine: %lld warmup steps, then %lld steps from 1 to %g, %d micro-batches",
            (long long)warmup_steps, (long long)decay_steps, min_factor, c->micro_batches);
    *self = c;
    return 0;
}

static int32_t cosine_micro_batches(void *self, int64_t step)
{
    (void)step;
    return ((const struct cosine *)self)->micro_batches;
}

/* Warmup: step k (0-based) of W gets (k+1)/W. Decay: t = step - W steps into it, the factor
 * is min + (1 - min) (1 + cos(pi t / D)) / 2, which is 1 at t = 0 and min from t = D on. */
static float cosine_lr_factor(void *self, int64_t step)
{
    const struct cosine *c = self;
    if (step < 0)
        step = 0;
    if (step < c->warmup_steps)
        return (float)(step + 1) / (float)c->warmup_steps;
    int64_t t = step - c->warmup_steps;
    if (t >= c->decay_steps)
        return (float)c->min_factor;
    double wave = 0.5 * (1.0 + cos(COSINE_PI * (double)t / (double)c->decay_steps));
    return (float)(c->min_factor + (1.0 - c->min_factor) * wave);
}

static void cosine_free(void *self) { free(self); }

static const struct ghc_scheduler_ops cosine_ops = {
    .struct_size = sizeof(struct ghc_scheduler_ops),
    .name = "cosine",
    .keys = cosine_keys,
    .init = cosine_init,
    .micro_batches = cosine_micro_batches,
    .lr_factor = cosine_lr_factor,
    .free = cosine_free,
};

static int cosine_plugin_init(ghc_core_t *core) { return ghc_register_scheduler(core, &cosine_ops); }

/* The one exported symbol: ghc_plugin_<name>, in ghc_<name>.so. */
GHC_PLUGIN_EXPORT const struct ghc_plugin ghc_plugin_cosine = {
    .abi = GHC_PLUGIN_ABI,
    .api = GHC_API_VERSION,
    .struct_size = sizeof(struct ghc_plugin),
    .kinds = GHC_KIND_BIT(GHC_KIND_SCHEDULER),
    .name = "cosine",
    .version = "1.0.0",
    .description = "linear warmup, then cosine decay of the lr factor to min_factor",
    .init = cosine_plugin_init,
};
