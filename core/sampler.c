/* sampler.c: sigma samplers of the flow-matching trainer (doc/config.md, the train section):
 * uniform, sigmoid, logit-normal, shift(k) over a sigmoid or uniform base, flux_shift; each
 * restricted to an expert's range by rejection, so the shape inside the range is the family's
 * own (no affine rescale), with a hard error instead of a silent unrestricted fallback.
 * Random numbers come from Philox4x32-10 keyed by the seed: the state is one counter. */
#include <math.h>

#include <gh200core/ops.h>

#include "train_impl.h"

const char *const ghc_sampler_family_names[] = { "uniform", "sigmoid", "logit_normal", "shift",
                                                 "flux_shift", NULL };
const char *const ghc_sampler_base_names[] = { "sigmoid", "uniform", NULL };

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
static double logit(double p) { return log(p) - log1p(-p); }
static double norm_cdf(double z) { return 0.5 * erfc(-z / sqrt(2.0)); }

double ghc_sampler_flux_k(int64_t tokens_per_frame)
{
    double mu = 0.5 + ((double)tokens_per_frame - 256.0) * (1.15 - 0.5) / (4096.0 - 256.0);
    return exp(mu);
}

/* s = k s0 / (1 + (k - 1) s0)  <=>  s0 = s / (k - (k - 1) s). */
static double shift_fwd(double k, double s0) { return k * s0 / (1.0 + (k - 1.0) * s0); }
static double shift_inv(double k, double s) { return s / (k - (k - 1.0) * s); }

static double base_cdf(const struct ghc_sampler *s, enum ghc_sampler_family fam, double x)
{
    if (x <= 0.0)
        return 0.0;
    if (x >= 1.0)
        return 1.0;
    switch (fam) {
    case GHC_SAMPLER_SIGMOID:      return norm_cdf(logit(x) / s->scale);
    case GHC_SAMPLER_LOGIT_NORMAL: return norm_cdf((logit(x) - s->mean) / s->std);
    default:                       return x;
    }
}

double ghc_sampler_cdf(const struct ghc_sampler *s, double k, double x)
{
    if (s->family == GHC_SAMPLER_SHIFT || s->family == GHC_SAMPLER_FLUX_SHIFT) {
        enum ghc_sampler_family b = s->base == GHC_SAMPLER_BASE_SIGMOID ? GHC_SAMPLER_SIGMOID
                                                                        : GHC_SAMPLER_UNIFORM;
        return base_cdf(s, b, x <= 0.0 ? 0.0 : x >= 1.0 ? 1.0 : shift_inv(k, x));
    }
    return base_cdf(s, s->family, x);
}

double ghc_sampler_acceptance(const struct ghc_sampler *s, double k)
{
    return ghc_sampler_cdf(s, k, s->hi) - ghc_sampler_cdf(s, k, s->lo);
}

/* Two uniforms in (0, 1) from one Philox block (24-bit lanes, offset by half a step so that
 * neither end is ever hit: logit() and the inverse normal stay finite). */
static void next_uniforms(struct ghc_sampler *s, double u[4])
{
    uint32_t ctr[4] = { (uint32_t)s->counter, (uint32_t)(s->counter >> 32), 0, 0 };
    uint32_t key[2] = { (uint32_t)s->seed, (uint32_t)(s->seed >> 32) };
    uint32_t out[4];
    ghc_philox4x32(ctr, key, out);
    s->counter++;
    for (int i = 0; i < 4; i++)
        u[i] = ((double)(out[i] >> 8) + 0.5) * 0x1p-24;
}

static double draw_unrestricted(struct ghc_sampler *s, double k)
{
    double u[4];
    next_uniforms(s, u);
    /* Box-Muller on (u0, u1); u2, u3 are unused, so one block is one draw whatever the family
     * (the counter then says exactly how many draws were made). */
    double n = sqrt(-2.0 * log(u[0])) * cos(2.0 * M_PI * u[1]);
    double s0;
    switch (s->family) {
    case GHC_SAMPLER_UNIFORM:      return u[0];
    case GHC_SAMPLER_SIGMOID:      return sigmoid(s->scale * n);
    case GHC_SAMPLER_LOGIT_NORMAL: return sigmoid(s->mean + s->std * n);
    default:
        s0 = s->base == GHC_SAMPLER_BASE_SIGMOID ? sigmoid(s->scale * n) : u[0];
        return shift_fwd(k, s0);
    }
}

static bool in_range(const struct ghc_sampler *s, double x)
{
    return x >= s->lo && (x < s->hi || (s->hi >= 1.0 && x <= 1.0));
}

int ghc_sampler_draw(ghc_core_t *core, struct ghc_sampler *s, double k, double *sigma)
{
    for (int64_t i = 0; i < s->max_tries; i++) {
        double x = draw_unrestricted(s, k);
        if (in_range(s, x)) {
            *sigma = x;
            return 0;
        }
    }
    return ghc_error_set(core, GHC_EINVAL,
                         "train: the %s sampler drew %lld values and none fell in the expert's range "
                         "[%g, %g) (acceptance %.3g): choose a family or shift that reaches that range",
                         ghc_sampler_family_names[s->family], (long long)s->max_tries, s->lo, s->hi,
                         ghc_sampler_acceptance(s, k));
}
