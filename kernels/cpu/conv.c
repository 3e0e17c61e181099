/* kernels/cpu/conv.c: the convolution / VAE ops of ops.h on the CPU: the causal 3-D convolution
 * with its feature cache, the channel RMS norm (alone or with the SiLU after it) and affine map, nearest x2 upsampling, frame
 * copies, the per-frame single-head attention and clamp. Plain loops over f32 copies of the
 * operands (bf16 ones are widened first), fp32 accumulation. */
#include <config.h>

#include <math.h>
#include <stdlib.h>

#include "cpu.h"

/* t's elements as f32: its own memory when it is f32, else a new copy in *owned (freed by the
 * caller). NULL (GHC_ENOMEM set) when the copy cannot be made. */
static const float *as_f32(const ghc_tensor_t *t, float **owned, const char *op)
{
    *owned = NULL;
    if (ghc_tensor_dtype(t) == GHC_DTYPE_F32)
        return ghc_tensor_cdata(t);
    return *owned = ghc_cpu_f32_copy(t, op);
}

/* Store n f32 values into t from element `at` on (a plain copy for an f32 tensor). */
static void store_f32(ghc_tensor_t *t, int64_t at, const float *v, int64_t n)
{
    if (ghc_tensor_dtype(t) == GHC_DTYPE_F32) {
        memcpy((float *)ghc_tensor_data(t) + at, v, (size_t)n * sizeof(float));
        return;
    }
    for (int64_t i = 0; i < n; i++)
        GHC_CPU_SET(t, at + i, v[i]);
}

static int no_memory(const ghc_tensor_t *t, const char *op)
{
    return ghc_error_set(ghc_tensor_core(t), GHC_ENOMEM, "%s: out of memory", op);
}

/* ---- causal 3-D convolution --------------------------------------------------------------------- */

int ghc_cpu_conv3d(ghc_tensor_t *y, const ghc_tensor_t *x, const ghc_tensor_t *cache, const ghc_tensor_t *w,
                   const ghc_tensor_t *bias, const ghc_tensor_t *residual, const struct ghc_conv3d *a)
{
    const int64_t B = ghc_tensor_dim(x, 0), Ci = ghc_tensor_dim(x, 1), T = ghc_tensor_dim(x, 2);
    const int64_t H = ghc_tensor_dim(x, 3), W = ghc_tensor_dim(x, 4);
    const int64_t Co = ghc_tensor_dim(w, 0), kT = ghc_tensor_dim(w, 2), kH = ghc_tensor_dim(w, 3),
                  kW = ghc_tensor_dim(w, 4);
    const int64_t To = ghc_tensor_dim(y, 2), Ho = ghc_tensor_dim(y, 3), Wo = ghc_tensor_dim(y, 4);
    const int64_t cf = cache ? ghc_tensor_dim(cache, 2) : 0, zf = a->pad_t - cf;   /* zero front frames */
    const int64_t plane = H * W, oplane = Ho * Wo;
    float *ox = NULL, *oc = NULL, *ow = NULL, *ob = NULL, *acc = NULL;
    int rc = 0;
    const float *xs = as_f32(x, &ox, "conv3d"), *ws = as_f32(w, &ow, "conv3d");
    const float *cs = cache ? as_f32(cache, &oc, "conv3d") : NULL, *bs = bias ? as_f32(bias, &ob, "conv3d") : NULL;
    if (!xs || !ws || (cache && !cs) || (bias && !bs)) {
        rc = GHC_ENOMEM;
        goto out;
    }
    if (!(acc = malloc((size_t)(To * oplane) * sizeof(float)))) {
        rc = no_memory(y, "conv3d");
        goto out;
    }
    for (int64_t b = 0; b < B; b++)
        for (int64_t co = 0; co < Co; co++) {
            const float b0 = bs ? bs[co] : 0.0f;
            for (int64_t i = 0; i < To * oplane; i++)
                acc[i] = b0;
            for (int64_t ci = 0; ci < Ci; ci++)
                for (int64_t kt = 0; kt < kT; kt++)
                    for (int64_t to = 0; to < To; to++) {
                        /* frame s of the sequence [zeros(zf), cache, x] */
                        const int64_t s = to * a->stride_t + kt;
                        const float *src;
                        if (s < zf)
                            continue;
                        if (s < a->pad_t)
                            src = cs + ((b * Ci + ci) * cf + (s - zf)) * plane;
                        else
                            src = xs + ((b * Ci + ci) * T + (s - a->pad_t)) * plane;
                        float *dst = acc + to * oplane;
                        for (int64_t kh = 0; kh < kH; kh++)
                            for (int64_t kw = 0; kw < kW; kw++) {
                                const float wv = ws[(((co * Ci + ci) * kT + kt) * kH + kh) * kW + kw];
                                /* output columns whose input column lies inside [0, W) */
                                int64_t wo0 = 0, wo1 = Wo;
                                while (wo0 < Wo && wo0 * a->stride_w + kw - a->pad_left < 0)
                                    wo0++;
                                while (wo1 > wo0 && (wo1 - 1) * a->stride_w + kw - a->pad_left >= W)
                                    wo1--;
                                for (int64_t ho = 0; ho < Ho; ho++) {
                                    const int64_t hi = ho * a->stride_h + kh - a->pad_top;
                                    if (hi < 0 || hi >= H)
                                        continue;
                                    const float *row = src + hi * W + kw - a->pad_left;
                                    float *orow = dst + ho * Wo;
                                    for (int64_t wo = wo0; wo < wo1; wo++)
                                        orow[wo] += wv * row[wo * a->stride_w];
                                }
                            }
                    }
            store_f32(y, (b * Co + co) * To * oplane, acc, To * oplane);
            for (int64_t i = (b * Co + co) * To * oplane; residual && i < (b * Co + co + 1) * To * oplane; i++)
                GHC_CPU_SET(y, i, GHC_CPU_GET(y, i) + GHC_CPU_GET(residual, i));   /* as ghc_cpu_add */
        }
out:
    free(acc);
    free(ox);
    free(oc);
    free(ow);
    free(ob);
    return rc;
}

/* ---- per-channel ops -------------------------------------------------------------------------- */

/* x [B, C, S...]: B, C and S (the product of the dims after the channels). */
static void bcs(const ghc_tensor_t *x, int64_t *B, int64_t *C, int64_t *S)
{
    *B = ghc_tensor_dim(x, 0);
    *C = ghc_tensor_dim(x, 1);
    *S = *B > 0 && *C > 0 ? ghc_tensor_numel(x) / (*B * *C) : 0;
}

int ghc_cpu_channel_rmsnorm(ghc_tensor_t *y, const ghc_tensor_t *x, const ghc_tensor_t *gamma, bool silu)
{
    const enum ghc_dtype yt = ghc_tensor_dtype(y);
    int64_t B, C, S;
    bcs(x, &B, &C, &S);
    const float rc = (float)sqrt((double)C);
    float *ss = malloc((size_t)(S ? S : 1) * sizeof(float));
    if (!ss)
        return no_memory(y, "channel_rmsnorm");
    for (int64_t b = 0; b < B; b++) {
        for (int64_t p = 0; p < S; p++)
            ss[p] = 0.0f;
        for (int64_t c = 0; c < C; c++)
            for (int64_t p = 0; p < S; p++) {
                const float v = GHC_CPU_GET(x, (b * C + c) * S + p);
                ss[p] += v * v;
            }
        for (int64_t p = 0; p < S; p++)
            ss[p] = fmaxf(sqrtf(ss[p]), 1e-12f);
        for (int64_t c = 0; c < C; c++) {
            const float g = GHC_CPU_GET(gamma, c);
            for (int64_t p = 0; p < S; p++) {
                const int64_t i = (b * C + c) * S + p;
                float v = GHC_CPU_GET(x, i) / ss[p] * rc * g;
                if (silu) { /* the norm stored into y, then silu of y (ghc_cpu_silu's arithmetic) */
                    v = ghc_cpu_round(yt, v);
                    v = v * (1.0f / (1.0f + expf(-v)));
                }
                GHC_CPU_SET(y, i, v);
            }
        }
    }
    free(ss);
    return 0;
}

int ghc_cpu_channel_affine(ghc_tensor_t *y, const ghc_tensor_t *x, const ghc_tensor_t *scale,
                           const ghc_tensor_t *shift)
{
    int64_t B, C, S;
    bcs(x, &B, &C, &S);
    for (int64_t b = 0; b < B; b++)
        for (int64_t c = 0; c < C; c++) {
            const float m = GHC_CPU_GET(scale, c), s = shift ? GHC_CPU_GET(shift, c) : 0.0f;
            for (int64_t p = 0; p < S; p++) {
                const int64_t i = (b * C + c) * S + p;
                GHC_CPU_SET(y, i, GHC_CPU_GET(x, i) * m + s);
            }
        }
    return 0;
}

/* ---- frames ------------------------------------------------------------------------------------ */

int ghc_cpu_upsample2x(ghc_tensor_t *y, const ghc_tensor_t *x)
{
    const int64_t planes = ghc_tensor_dim(x, 0) * ghc_tensor_dim(x, 1) * ghc_tensor_dim(x, 2);
    const int64_t H = ghc_tensor_dim(x, 3), W = ghc_tensor_dim(x, 4);
    for (int64_t p = 0; p < planes; p++)
        for (int64_t h = 0; h < 2 * H; h++)
            for (int64_t w = 0; w < 2 * W; w++)
                GHC_CPU_SET(y, (p * 2 * H + h) * 2 * W + w, GHC_CPU_GET(x, (p * H + h / 2) * W + w / 2));
    return 0;
}

int ghc_cpu_copy_frames(ghc_tensor_t *dst, int64_t dst_t, const ghc_tensor_t *src, int64_t src_t, int64_t n)
{
    const int64_t rows = ghc_tensor_dim(dst, 0) * ghc_tensor_dim(dst, 1);
    const int64_t Td = ghc_tensor_dim(dst, 2), Ts = ghc_tensor_dim(src, 2);
    const size_t frame = (size_t)(ghc_tensor_dim(dst, 3) * ghc_tensor_dim(dst, 4)) * ghc_dtype_size(ghc_tensor_dtype(dst));
    char *d = ghc_tensor_data(dst);
    const char *s = ghc_tensor_cdata(src);
    for (int64_t r = 0; r < rows; r++)   /* memmove: dst may be src */
        memmove(d + (size_t)(r * Td + dst_t) * frame, s + (size_t)(r * Ts + src_t) * frame, (size_t)n * frame);
    return 0;
}

/* ---- the Wan2.2 shortcuts and patches ------------------------------------------------------------ */

int ghc_cpu_avg_down3d(ghc_tensor_t *y, const ghc_tensor_t *x, int32_t ft, int32_t fs)
{
    const int64_t B = ghc_tensor_dim(y, 0), Co = ghc_tensor_dim(y, 1), To = ghc_tensor_dim(y, 2);
    const int64_t Ho = ghc_tensor_dim(y, 3), Wo = ghc_tensor_dim(y, 4);
    const int64_t Ci = ghc_tensor_dim(x, 1), T = ghc_tensor_dim(x, 2), H = ghc_tensor_dim(x, 3), W = ghc_tensor_dim(x, 4);
    const int64_t phi = (int64_t)ft * fs * fs, g = Ci * phi / Co, pad = (ft - T % ft) % ft;
    for (int64_t b = 0; b < B; b++)
        for (int64_t o = 0; o < Co; o++)
            for (int64_t t = 0; t < To; t++)
                for (int64_t i = 0; i < Ho; i++)
                    for (int64_t j = 0; j < Wo; j++) {
                        float acc = 0.0f;
                        for (int64_t k = 0; k < g; k++) {
                            const int64_t e = o * g + k, c = e / phi, r = e % phi;
                            const int64_t f = t * ft + r / (fs * fs) - pad;   /* frame of x (< 0: padding) */
                            if (f >= 0)
                                acc += GHC_CPU_GET(x, (((b * Ci + c) * T + f) * H + i * fs + (r / fs) % fs) * W +
                                                          j * fs + r % fs);
                        }
                        GHC_CPU_SET(y, (((b * Co + o) * To + t) * Ho + i) * Wo + j, acc / (float)g);
                    }
    return 0;
}

int ghc_cpu_dup_up3d(ghc_tensor_t *y, const ghc_tensor_t *x, int32_t ft, int32_t fs, int32_t drop)
{
    const int64_t B = ghc_tensor_dim(y, 0), Co = ghc_tensor_dim(y, 1), To = ghc_tensor_dim(y, 2);
    const int64_t Ho = ghc_tensor_dim(y, 3), Wo = ghc_tensor_dim(y, 4);
    const int64_t Ci = ghc_tensor_dim(x, 1), T = ghc_tensor_dim(x, 2), H = ghc_tensor_dim(x, 3), W = ghc_tensor_dim(x, 4);
    const int64_t r = Co * ft * fs * fs / Ci;
    for (int64_t b = 0; b < B; b++)
        for (int64_t o = 0; o < Co; o++)
            for (int64_t t = 0; t < To; t++)
                for (int64_t h = 0; h < Ho; h++)
                    for (int64_t w = 0; w < Wo; w++) {
                        const int64_t tt = t + drop, e = ((o * ft + tt % ft) * fs + h % fs) * fs + w % fs;
                        GHC_CPU_SET(y, (((b * Co + o) * To + t) * Ho + h) * Wo + w,
                                    GHC_CPU_GET(x, (((b * Ci + e / r) * T + tt / ft) * H + h / fs) * W + w / fs));
                    }
    return 0;
}

int ghc_cpu_vae_patch(ghc_tensor_t *y, const ghc_tensor_t *x, int32_t p, bool un)
{
    /* the patched side [B, C p p, F, h, w] against the pixel side [B, C, F, h p, w p] */
    const ghc_tensor_t *pix = un ? y : x;
    const int64_t B = ghc_tensor_dim(pix, 0), C = ghc_tensor_dim(pix, 1), F = ghc_tensor_dim(pix, 2);
    const int64_t h = ghc_tensor_dim(pix, 3) / p, w = ghc_tensor_dim(pix, 4) / p;
    for (int64_t b = 0; b < B; b++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t r = 0; r < p; r++)
                for (int64_t q = 0; q < p; q++)
                    for (int64_t f = 0; f < F; f++)
                        for (int64_t i = 0; i < h; i++)
                            for (int64_t j = 0; j < w; j++) {
                                const int64_t pi = (((b * C + c) * F + f) * h * p + i * p + q) * w * p + j * p + r;
                                const int64_t ci = (((b * C + c) * p + r) * p + q) * F + f;
                                const int64_t qi = (ci * h + i) * w + j;
                                if (un)
                                    GHC_CPU_SET(y, pi, GHC_CPU_GET(x, qi));
                                else
                                    GHC_CPU_SET(y, qi, GHC_CPU_GET(x, pi));
                            }
    return 0;
}

/* ---- attention ------------------------------------------------------------------------------- */

int ghc_cpu_frame_attention(ghc_tensor_t *o, const ghc_tensor_t *qkv, float scale)
{
    const int64_t B = ghc_tensor_dim(o, 0), C = ghc_tensor_dim(o, 1), T = ghc_tensor_dim(o, 2);
    const int64_t N = ghc_tensor_dim(o, 3) * ghc_tensor_dim(o, 4);
    float *own = NULL, *k = NULL, *v = NULL, *q = NULL, *p = NULL, *acc = NULL;
    int rc = 0;
    const float *a = as_f32(qkv, &own, "frame_attention");
    k = malloc((size_t)(N * C) * sizeof(float));
    v = malloc((size_t)(N * C) * sizeof(float));
    q = malloc((size_t)C * sizeof(float));
    acc = malloc((size_t)C * sizeof(float));
    p = malloc((size_t)N * sizeof(float));
    if (!a || !k || !v || !q || !acc || !p) {
        rc = no_memory(o, "frame_attention");
        goto out;
    }
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) {
            /* element (channel ch, token j) of frame (b, t) */
#define QKV(ch, j) a[((b * 3 * C + (ch)) * T + t) * N + (j)]
            for (int64_t j = 0; j < N; j++)   /* keys and values token-major */
                for (int64_t c = 0; c < C; c++) {
                    k[j * C + c] = QKV(C + c, j);
                    v[j * C + c] = QKV(2 * C + c, j);
                }
            for (int64_t i = 0; i < N; i++) {
                float mx = -INFINITY, sum = 0.0f;
                for (int64_t c = 0; c < C; c++)
                    q[c] = QKV(c, i);
                for (int64_t j = 0; j < N; j++) {
                    float d = 0.0f;
                    for (int64_t c = 0; c < C; c++)
                        d += q[c] * k[j * C + c];
                    p[j] = d * scale;
                    mx = fmaxf(mx, p[j]);
                }
                for (int64_t c = 0; c < C; c++)
                    acc[c] = 0.0f;
                for (int64_t j = 0; j < N; j++) {
                    p[j] = expf(p[j] - mx);
                    sum += p[j];
                    for (int64_t c = 0; c < C; c++)
                        acc[c] += p[j] * v[j * C + c];
                }
                for (int64_t c = 0; c < C; c++)
                    GHC_CPU_SET(o, ((b * C + c) * T + t) * N + i, acc[c] / sum);
            }
#undef QKV
        }
out:
    free(own);
    free(k);
    free(v);
    free(q);
    free(acc);
    free(p);
    return rc;
}

/* ---- clamp --------------------------------------------------------------------------------------- */

int ghc_cpu_clamp(ghc_tensor_t *y, const ghc_tensor_t *x, float lo, float hi)
{
    for (int64_t i = 0; i < ghc_tensor_numel(x); i++) {
        float v = GHC_CPU_GET(x, i);
        if (v < lo)
            v = lo;
        else if (v > hi)
            v = hi;
        GHC_CPU_SET(y, i, v);
    }
    return 0;
}
