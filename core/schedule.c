/* schedule.c: the learning-rate factor schedule the scheduler plugins share (warmup, then
 * constant or cosine decay). */
#include <math.h>

#include <gh200core/scheduler.h>

int ghc_lr_schedule_read(ghc_cfg_t *cfg, struct ghc_lr_schedule *out)
{
    static const char *const decays[] = { "none", "cosine", NULL };
    int64_t warmup, decay_steps;
    double min_factor;
    int decay, rc;
    if ((rc = ghc_cfg_get_int(cfg, "warmup_steps", 0, 0, INT64_C(1) << 40, &warmup)) < 0 ||
        (rc = ghc_cfg_get_choice(cfg, "lr_decay", 0, decays, &decay)) < 0 ||
        (rc = ghc_cfg_get_int(cfg, "decay_steps", 0, 0, INT64_C(1) << 40, &decay_steps)) < 0 ||
        (rc = ghc_cfg_get_float(cfg, "min_lr_factor", 0.0, 0.0, 1.0, &min_factor)) < 0)
        return rc;
    if (decay == GHC_LR_DECAY_COSINE && decay_steps <= warmup)
        return ghc_error_set(ghc_cfg_core(cfg), GHC_ECONFIG,
                             "%s: lr_decay = \"cosine\" needs decay_steps (the step where the factor "
                             "reaches min_lr_factor) greater than warmup_steps (%lld)",
                             ghc_cfg_where(cfg, ghc_cfg_has(cfg, "decay_steps") ? "decay_steps" : "lr_decay"),
                             (long long)warmup);
    *out = (struct ghc_lr_schedule){ .warmup_steps = warmup, .decay = (enum ghc_lr_decay)decay,
                                     .decay_steps = decay_steps, .min_factor = min_factor };
    return 0;
}

float ghc_lr_schedule_factor(const struct ghc_lr_schedule *s, int64_t step)
{
    if (step < s->warmup_steps)
        return (float)(step + 1) / (float)s->warmup_steps;
    if (s->decay != GHC_LR_DECAY_COSINE)
        return 1.0f;
    double p = (double)(step - s->warmup_steps) / (double)(s->decay_steps - s->warmup_steps);
    if (p > 1.0)
        p = 1.0;
    return (float)(s->min_factor + (1.0 - s->min_factor) * 0.5 * (1.0 + cos(M_PI * p)));
}
