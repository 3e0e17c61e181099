/* kernels/cpu/optim.c: the CPU reference of the fused optimizer updates (ops.h, "optimizer
 * updates"): AdamW as torch.optim.AdamW's single-tensor path computes it on the CPU, and
 * Automagic v1. Contraction of a * b + c into an FMA is off in this file: where PyTorch's
 * vectorised kernels use an FMA (lerp, add with alpha, addcmul) the code calls fmaf(), and
 * nowhere else, so that the results are bit-identical to PyTorch's on any CPU. */
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <config.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "cpu.h"

/* The Philox lanes of block b of rng. */
static void philox_lanes(const struct ghc_rng *rng, uint64_t b, uint32_t out[4])
{
    uint64_t n = rng->offset + b;
    const uint32_t ctr[4] = { (uint32_t)n, (uint32_t)(n >> 32), 0, 0 };
    const uint32_t key[2] = { (uint32_t)rng->seed, (uint32_t)(rng->seed >> 32) };
    ghc_philox4x32(ctr, key, out);
}

/* Store the new value of element i of a param: f32 as is, bf16 by stochastic rounding with
 * lane i of rng (ghc_op_cast's rule). */
static void store_param(ghc_tensor_t *p, int64_t i, float x, const struct ghc_rng *rng)
{
    if (ghc_tensor_dtype(p) == GHC_DTYPE_F32) {
        ((float *)ghc_tensor_data(p))[i] = x;
        return;
    }
    uint32_t lanes[4], u;
    philox_lanes(rng, (uint64_t)i / 4, lanes);
    memcpy(&u, &x, 4);
    uint16_t b;
    if (isnan(x) || (u & 0x7fffffffu) == 0x7f800000u)
        b = ghc_f32_to_bf16(x);
    else
        b = (uint16_t)((u + (lanes[i % 4] >> 16)) >> 16);
    ((uint16_t *)ghc_tensor_data(p))[i] = b;
}

int ghc_cpu_adamw(struct ghc_optim_tensor *ts, int32_t n, const struct ghc_adamw_args *a)
{
    for (int32_t t = 0; t < n; t++) {
        ghc_tensor_t *p = ts[t].param;
        float *m = ghc_tensor_data(ts[t].state[0]), *v = ghc_tensor_data(ts[t].state[1]);
        int64_t numel = ghc_tensor_numel(p);
        for (int64_t i = 0; i < numel; i++) {
            float g = GHC_CPU_GET(ts[t].grad, i), x = GHC_CPU_GET(p, i);
            x = x * a->decay;
            m[i] = fmaf(a->beta1_comp, g - m[i], m[i]);
            v[i] = fmaf(a->beta2_comp * g, g, v[i] * a->beta2);
            float denom = sqrtf(v[i]) / a->bc2_sqrt + a->eps;
            x = x + (-a->step_size * m[i]) / denom;
            store_param(p, i, x, &ts[t].rng);
        }
    }
    return 0;
}

/* ---- automagic ---------------------------------------------------------------------------- */

static bool bit_get(const int32_t *w, int64_t i) { return ((uint32_t)w[i / 32] >> (i % 32)) & 1u; }

static void bit_set(int32_t *w, int64_t i, bool on)
{
    uint32_t m = 1u << (i % 32), x = (uint32_t)w[i / 32];
    w[i / 32] = (int32_t)(on ? x | m : x & ~m);
}

/* The preconditioned update of element i before clipping (state already updated). */
static float automagic_u(const struct ghc_optim_tensor *t, int64_t i, float g, int64_t R, int64_t C,
                         const float *rmean)
{
    const float *s0 = ghc_tensor_cdata(t->state[0]);
    if (!t->state[1])
        return (1.0f / sqrtf(s0[i])) * g;
    const float *col = ghc_tensor_cdata(t->state[1]);
    int64_t b = i / (R * C), r = (i / C) % R, c = i % C;
    float rf = 1.0f / sqrtf(s0[b * R + r] / rmean[b]), cf = 1.0f / sqrtf(col[b * C + c]);
    return (rf * cf) * g;
}

static float ema(float old, float x, const struct ghc_automagic_args *a)
{
    return fmaf(x, a->beta2_comp, old * a->beta2);
}

static int automagic_one(struct ghc_optim_tensor *t, const struct ghc_automagic_args *a)
{
    ghc_tensor_t *p = t->param;
    const ghc_tensor_t *gt = t->grad;
    int64_t N = ghc_tensor_numel(p);
    float *s0 = ghc_tensor_data(t->state[0]);
    float *aux = ghc_tensor_data(t->state[3]);
    int32_t *pol = ghc_tensor_data(t->state[4]), *agree = ghc_tensor_data(t->state[5]);
    bool factored = t->state[1] != NULL, int8 = ghc_tensor_dtype(t->state[2]) == GHC_DTYPE_U8;
    int64_t C = factored ? ghc_tensor_dim(p, -1) : N, R = factored ? ghc_tensor_dim(p, -2) : 1;
    int64_t B = R * C != 0 ? N / (R * C) : 0;
    float *rmean = NULL;

    /* second moment */
    if (factored) {
        float *row = s0, *col = ghc_tensor_data(t->state[1]);
        if (!(rmean = malloc(sizeof(float) * (size_t)(B ? B : 1))))
            return ghc_error_set(ghc_tensor_core(p), GHC_ENOMEM, "automagic: out of memory");
        for (int64_t b = 0; b < B; b++) {
            for (int64_t r = 0; r < R; r++) {
                double s = 0;
                for (int64_t c = 0; c < C; c++) {
                    float g = GHC_CPU_GET(gt, (b * R + r) * C + c);
                    s += g * g + a->eps;
                }
                row[b * R + r] = ema(row[b * R + r], (float)s / (float)C, a);
            }
            for (int64_t c = 0; c < C; c++) {
                double s = 0;
                for (int64_t r = 0; r < R; r++) {
                    float g = GHC_CPU_GET(gt, (b * R + r) * C + c);
                    s += g * g + a->eps;
                }
                col[b * C + c] = ema(col[b * C + c], (float)s / (float)R, a);
            }
            double s = 0;
            for (int64_t r = 0; r < R; r++)
                s += row[b * R + r];
            rmean[b] = (float)s / (float)R;
        }
    } else {
        for (int64_t i = 0; i < N; i++) {
            float g = GHC_CPU_GET(gt, i);
            s0[i] = ema(s0[i], g * g + a->eps, a);
        }
    }

    /* RMS clip */
    double ss = 0;
    for (int64_t i = 0; i < N; i++) {
        float u = automagic_u(t, i, GHC_CPU_GET(gt, i), R, C, rmean);
        ss += (double)u * u;
    }
    float rms = (float)sqrt(ss) / (float)sqrt((double)N);
    float div = rms / a->clip;
    if (!(div >= 1.0f))
        div = 1.0f;

    /* polarity, learning rates, the param */
    const uint8_t *q = int8 ? ghc_tensor_cdata(t->state[2]) : NULL;
    float *mf = int8 ? NULL : ghc_tensor_data(t->state[2]);
    float scale = aux[0], lr_max = 0.0f;
    double lr_sum = 0;
    for (int64_t i = 0; i < N; i++) {
        float u = automagic_u(t, i, GHC_CPU_GET(gt, i), R, C, rmean) / div;
        bool up = u > 0.0f, same = up == bit_get(pol, i);
        bit_set(pol, i, up);
        bit_set(agree, i, same);
        float lr = int8 ? (float)(int8_t)q[i] * scale : mf[i];
        lr = same ? lr + a->lr_bump : lr - a->lr_bump;
        lr = fminf(fmaxf(lr, a->min_lr), a->max_lr);
        lr_max = fmaxf(lr_max, fabsf(lr));
        lr_sum += lr;
        float x = GHC_CPU_GET(p, i), upd = u * lr;
        if (a->weight_decay != 0.0f)
            x = x + (x * -a->weight_decay) * lr;
        x = x + -upd;
        store_param(p, i, x, &t->rng);
        if (!int8)
            mf[i] = lr;
    }
    aux[1] = N ? (float)(lr_sum / (double)N) : 0.0f;

    /* the int8 mask against the new absmax (upstream's Auto8bitTensor) */
    if (int8) {
        uint8_t *qw = ghc_tensor_data(t->state[2]);
        float ns = lr_max > 0.0f ? (float)((double)lr_max / 127.0) : 1.0f;
        for (int64_t i = 0; i < N; i++) {
            float lr = (float)(int8_t)qw[i] * scale;
            lr = bit_get(agree, i) ? lr + a->lr_bump : lr - a->lr_bump;
            lr = fminf(fmaxf(lr, a->min_lr), a->max_lr);
            float c = rintf(lr / ns);
            c = fminf(fmaxf(c, -127.0f), 127.0f);
            qw[i] = (uint8_t)(int8_t)c;
        }
        aux[0] = ns;
    }
    free(rmean);
    return 0;
}

int ghc_cpu_automagic(struct ghc_optim_tensor *ts, int32_t n, const struct ghc_automagic_args *a)
{
    for (int32_t t = 0; t < n; t++) {
        int rc = automagic_one(&ts[t], a);
        if (rc < 0)
            return rc;
    }
    return 0;
}
