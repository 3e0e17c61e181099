/* gradient_ramp.c: the `gradient_ramp` scheduler: the accumulation window grows from
 * initial_effective_batch_size to target_effective_batch_size samples over batch_rampup_steps
 * optimizer steps (the GH200 SimpleTuner fork's ramp with the project's semantics, doc/config.md):
 * the window size of step s
 *   GA(s) = clamp(ceil(GA0 + (GA1 - GA0) min(s / R, 1)^gamma), GA0, GA1)   (floor when GA1 < GA0)
 * with GA = max(1, round_half_even(E / micro_batch_size)); it is a pure function of s, fixed
 * when the window opens, so the trainer's checkpointed step is the ramp's position. Each change
 * is logged. The lr factor is the shared warmup / cosine schedule. */
#include <math.h>
#include <stdlib.h>

#include <gh200core/run.h>
#include <gh200core/scheduler.h>

struct ramp {
    ghc_core_t *core;
    int64_t ga0, ga1, steps;
    double  gamma;
    int64_t micro_batch_size;
    int32_t last;                 /* the GA last returned, to log changes */
    struct ghc_lr_schedule lr;
};

static const struct ghc_cfg_key ramp_keys[] = {
    /* accumulation without a ramp */
    { "micro_batches", GHC_CFG_INT, "1", "1 to 65536", NULL },
    /* E0, samples */
    { "initial_effective_batch_size", GHC_CFG_INT, "(data.batch_size x micro_batches)", "1 to 2^30", NULL },
    /* E1, samples */
    { "target_effective_batch_size", GHC_CFG_INT, "(initial_effective_batch_size)", "1 to 2^30", NULL },
    /* R, optimizer steps; 0: E1 from the start */
    { "batch_rampup_steps", GHC_CFG_INT, "0", "0 to 2^40", NULL },
    /* quadratic: gamma 2, upstream's shape */
    { "ease", GHC_CFG_STRING, "quadratic", "quadratic, linear", NULL },
    GHC_LR_SCHEDULE_KEYS,
    { NULL, 0, NULL, NULL, NULL }
};

static int64_t ga_of(int64_t samples, int64_t b)
{
    double q = nearbyint((double)samples / (double)b);   /* the default rounding: half to even */
    return q < 1.0 ? 1 : (int64_t)q;
}

static int ramp_init(ghc_core_t *core, ghc_cfg_t *cfg, void **self)
{
    static const char *const eases[] = { "quadratic", "linear", NULL };
    int64_t a, b = 1, e0, e1, steps;
    int ease, rc;
    ghc_cfg_t *data = ghc_config_section(core, "data");
    if (data && ghc_cfg_has(data, "batch_size") &&
        (rc = ghc_cfg_get_int(data, "batch_size", 1, 1, 65536, &b)) < 0)
        return rc;
    if ((rc = ghc_cfg_get_int(cfg, "micro_batches", 1, 1, 65536, &a)) < 0 ||
        (rc = ghc_cfg_get_int(cfg, "initial_effective_batch_size", a * b, 1, INT64_C(1) << 30, &e0)) < 0 ||
        (rc = ghc_cfg_get_int(cfg, "target_effective_batch_size", e0, 1, INT64_C(1) << 30, &e1)) < 0 ||
        (rc = ghc_cfg_get_int(cfg, "batch_rampup_steps", 0, 0, INT64_C(1) << 40, &steps)) < 0 ||
        (rc = ghc_cfg_get_choice(cfg, "ease", 0, eases, &ease)) < 0)
        return rc;
    struct ramp *r = calloc(1, sizeof(*r));
    if (!r)
        return ghc_error_set(core, GHC_ENOMEM, "gradient_ramp: out of memory");
    if ((rc = ghc_lr_schedule_read(cfg, &r->lr)) < 0) {
        free(r);
        return rc;
    }
    r->core = core;
    r->micro_batch_size = b;
    r->ga0 = ga_of(e0, b);
    r->ga1 = ga_of(e1, b);
    r->steps = steps;
    r->gamma = ease == 0 ? 2.0 : 1.0;
    ghc_log(core, GHC_LOG_INFO, "gradient_ramp: %lld -> %lld micro-batches of %lld over %lld steps (%s)",
            (long long)r->ga0, (long long)r->ga1, (long long)b, (long long)steps, eases[ease]);
    *self = r;
    return 0;
}

static int32_t ramp_micro_batches(void *self, int64_t step)
{
    struct ramp *r = self;
    int64_t ga;
    if (r->steps <= 0) {
        ga = r->ga1;
    } else {
        double p = step >= r->steps ? 1.0 : (double)step / (double)r->steps;
        double g = (double)r->ga0 + (double)(r->ga1 - r->ga0) * pow(p, r->gamma);
        if (r->ga1 >= r->ga0) {
            ga = (int64_t)ceil(g);
            ga = ga < r->ga0 ? r->ga0 : ga > r->ga1 ? r->ga1 : ga;
        } else {
            ga = (int64_t)floor(g);
            ga = ga < r->ga1 ? r->ga1 : ga > r->ga0 ? r->ga0 : ga;
        }
    }
    if ((int32_t)ga != r->last) {
        if (r->last)
            ghc_log(r->core, GHC_LOG_INFO, "gradient_ramp: step %lld: %lld micro-batches (%lld samples) per step",
                    (long long)step, (long long)ga, (long long)(ga * r->micro_batch_size));
        r->last = (int32_t)ga;
    }
    return (int32_t)ga;
}

static float ramp_lr_factor(void *self, int64_t step)
{
    return ghc_lr_schedule_factor(&((struct ramp *)self)->lr, step);
}

static void ramp_free(void *self) { free(self); }

static const struct ghc_scheduler_ops ramp_ops = {
    .struct_size = sizeof(struct ghc_scheduler_ops),
    .name = "gradient_ramp",
    .keys = ramp_keys,
    .init = ramp_init,
    .micro_batches = ramp_micro_batches,
    .lr_factor = ramp_lr_factor,
    .free = ramp_free,
};

static int ramp_plugin_init(ghc_core_t *core) { return ghc_register_scheduler(core, &ramp_ops); }

GHC_PLUGIN_EXPORT const struct ghc_plugin ghc_plugin_gradient_ramp = {
    .abi = GHC_PLUGIN_ABI,
    .api = GHC_API_VERSION,
    .struct_size = sizeof(struct ghc_plugin),
    .kinds = GHC_KIND_BIT(GHC_KIND_SCHEDULER),
    .name = "gradient_ramp",
    .version = GHC_VERSION,
    .description = "accumulation window ramped from an initial to a target effective batch, warmup/cosine lr",
    .init = ramp_plugin_init,
};
