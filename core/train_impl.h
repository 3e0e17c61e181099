/* train_impl.h: the trainer's internal pieces (never installed): the sigma samplers, the
 * TensorBoard event writer and the trainer's state. Tested directly by tests/test_train.c. */
#ifndef GHC_TRAIN_IMPL_H
#define GHC_TRAIN_IMPL_H

#include <stdint.h>
#include <stdio.h>

#include <gh200core/gh200core.h>

/* ---- sigma samplers (spec/training.md sections 2 and 3) ------------------------------------- */

enum ghc_sampler_family {
    GHC_SAMPLER_UNIFORM = 0,    /* sigma = u */
    GHC_SAMPLER_SIGMOID,        /* sigma = sigmoid(scale n) */
    GHC_SAMPLER_LOGIT_NORMAL,   /* sigma = sigmoid(mean + std n) */
    GHC_SAMPLER_SHIFT,          /* sigma = k s0 / (1 + (k - 1) s0), s0 from the base */
    GHC_SAMPLER_FLUX_SHIFT,     /* shift with k = exp(mu(S)), S tokens per latent frame */
    GHC_SAMPLER_COUNT
};

/* The base distribution of shift and flux_shift. */
enum ghc_sampler_base { GHC_SAMPLER_BASE_SIGMOID = 0, GHC_SAMPLER_BASE_UNIFORM };

struct ghc_sampler {
    enum ghc_sampler_family family;
    enum ghc_sampler_base   base;
    double   scale;          /* sigmoid scale s */
    double   mean, std;      /* logit-normal */
    double   shift;          /* k of shift */
    double   lo, hi;         /* the accepted range: lo <= sigma < hi, or <= hi when hi = 1 */
    uint64_t seed;
    uint64_t counter;        /* Philox blocks used so far: the whole state */
    int64_t  max_tries;      /* rejection rounds per draw before the hard error */
};

extern const char *const ghc_sampler_family_names[];  /* NULL-terminated, by enum value */
extern const char *const ghc_sampler_base_names[];

/* k of flux_shift for S tokens per latent frame ((H_lat / 2) (W_lat / 2)). */
double ghc_sampler_flux_k(int64_t tokens_per_frame);
/* P(sigma < x) of the unrestricted family (k: the shift factor for shift and flux_shift). */
double ghc_sampler_cdf(const struct ghc_sampler *s, double k, double x);
/* The probability that one unrestricted draw lands in [lo, hi). */
double ghc_sampler_acceptance(const struct ghc_sampler *s, double k);
/* One sigma in the range, by rejection (the family's shape, cut to the range). k as above
 * (ignored unless shift/flux_shift; pass ghc_sampler_flux_k(S) for flux_shift). GHC_EINVAL
 * with a message when max_tries draws all miss. */
int ghc_sampler_draw(ghc_core_t *core, struct ghc_sampler *s, double k, double *sigma);

/* ---- TensorBoard event files ---------------------------------------------------------------- */

/* CRC-32C (Castagnoli) and the masked form of TFRecord. */
uint32_t ghc_crc32c(const void *data, size_t len);
uint32_t ghc_crc32c_masked(const void *data, size_t len);

typedef struct ghc_tboard ghc_tboard_t;
/* Creates dir/events.out.tfevents.<seconds>.<host>.gh200core and writes the version event. */
int  ghc_tboard_open(ghc_core_t *core, const char *dir, ghc_tboard_t **out);
/* One scalar summary (tag, value) at `step`, wall time now. */
int  ghc_tboard_scalar(ghc_tboard_t *tb, const char *tag, int64_t step, float value);
int  ghc_tboard_flush(ghc_tboard_t *tb);
void ghc_tboard_free(ghc_tboard_t *tb);
const char *ghc_tboard_path(const ghc_tboard_t *tb);

/* ---- the embedded demo ---------------------------------------------------------------------- */

/* With a `demo` section: write the demo dataset (a planted adapter's targets) to
 * <output_dir>/demo-data and point the `data` section at it. Without one: nothing. */
int ghc_demo_generate(ghc_core_t *core);
/* The demo section's values, read and checked (ranges, sigma_min <= sigma_max) by the one
 * reader both the pre-run checks and ghc_demo_generate use. shape: channels, frames, height,
 * width, text_len, text_dim; given: whether the file sets it (else the default). */
enum { GHC_DEMO_SHAPES = 6 };
struct ghc_demo_opts {
    int64_t     shape[GHC_DEMO_SHAPES];
    bool        given[GHC_DEMO_SHAPES];
    const char *shape_key[GHC_DEMO_SHAPES];
    int64_t     samples, rank;
    double      strength, sigma_min, sigma_max;
};
int ghc_demo_read(ghc_cfg_t *s, struct ghc_demo_opts *o);
extern const struct ghc_cfg_key ghc_demo_keys[];

#endif /* GHC_TRAIN_IMPL_H */
