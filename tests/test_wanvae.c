/* test_wanvae.c: the convolution / VAE ops of ops.h against naive references written here, and
 * the Wan VAE module (plugins/wanvae) against the golden fixtures of tests/fixtures/wanvae (tiny
 * random AutoencoderKLWan models of the Wan2.1 and the Wan2.2 VAE run by diffusers,
 * tests/fixtures/README.md): encode and decode under both namings, an image, the chunked clip,
 * other dtypes and a prefix, the real layouts' names, and the errors for bad files and bad
 * shapes. CPU, f32. */
#include <math.h>

#include <gh200core/gh200core.h>
#include <gh200core/ops.h>
#include <gh200core/safetensors.h>

#include "../plugins/wanvae/wanvae.h"
#include "testutil.h"

/* f32 against diffusers' f32 CPU run: the sums run in another order (a few ulp per layer). */
#define RTOL 1e-5
#define ATOL 1e-5

static ghc_core_t *core;
static ghc_tensor_t *pool[1024];
static int npool;

static void setup(void)
{
    core = ghc_core_init();
    ck_assert_ptr_nonnull(core);
    npool = 0;
}

static void teardown(void)
{
    for (int i = 0; i < npool; i++)
        ghc_tensor_free(pool[i]);
    npool = 0;
    ghc_core_free(core);
}

static ghc_tensor_t *keep(ghc_tensor_t *t)
{
    ck_assert_msg(t != NULL, "tensor: %s", ghc_error_message(core));
    ck_assert_int_lt(npool, 1024);
    return pool[npool++] = t;
}

static ghc_tensor_t *mk(enum ghc_dtype dt, int nd, const int64_t *shape)
{
    return keep(ghc_tensor_init(core, dt, nd, shape, GHC_DEVICE_CPU, GHC_ROLE_WORKSPACE));
}
#define NARG(...) (int)(sizeof((int64_t[]){ __VA_ARGS__ }) / sizeof(int64_t))
#define T(dt, ...) mk(dt, NARG(__VA_ARGS__), (const int64_t[]){ __VA_ARGS__ })
#define F32 GHC_DTYPE_F32
#define BF16 GHC_DTYPE_BF16

static float get(const ghc_tensor_t *t, int64_t i)
{
    if (ghc_tensor_dtype(t) == BF16)
        return ghc_bf16_to_f32(((const uint16_t *)ghc_tensor_cdata(t))[i]);
    return ((const float *)ghc_tensor_cdata(t))[i];
}

/* Seeded values in [-1, 1) (an LCG; bf16 tensors get them rounded). */
static void fill(ghc_tensor_t *t, uint32_t seed)
{
    uint32_t s = seed * 2654435761u + 12345u;
    for (int64_t i = 0; i < ghc_tensor_numel(t); i++) {
        s = s * 1664525u + 1013904223u;
        float v = (float)(s >> 8) / (float)(1u << 23) - 1.0f;
        if (ghc_tensor_dtype(t) == BF16)
            ((uint16_t *)ghc_tensor_data(t))[i] = ghc_f32_to_bf16(v);
        else
            ((float *)ghc_tensor_data(t))[i] = v;
    }
}

/* got == ref within atol + rtol |ref| everywhere. */
static void near(const char *what, const ghc_tensor_t *got, const ghc_tensor_t *ref, double atol, double rtol)
{
    ck_assert_msg(ghc_tensor_same_shape(got, ref), "%s: shapes differ", what);
    for (int64_t i = 0; i < ghc_tensor_numel(ref); i++) {
        double g = get(got, i), r = get(ref, i), e = fabs(g - r);
        ck_assert_msg(e <= atol + rtol * fabs(r), "%s[%lld]: %.9g vs %.9g", what, (long long)i, g, r);
    }
    ck_assert_msg(ghc_tensor_numel(ref) > 0, "%s: empty", what);
}

static ghc_tensor_t *dims5(enum ghc_dtype dt, int64_t b, int64_t c, int64_t t, int64_t h, int64_t w)
{
    return T(dt, b, c, t, h, w);
}
#define AT(t, b, c, f, h, w) \
    ((((b) * ghc_tensor_dim(t, 1) + (c)) * ghc_tensor_dim(t, 2) + (f)) * ghc_tensor_dim(t, 3) + (h)) * \
        ghc_tensor_dim(t, 4) + (w)

/* ---- ops: the causal convolution ---------------------------------------------------------------- */

/* The convolution of ops.h written out: sequence frame s < pad_t - c is zero, s < pad_t is cache
 * frame s - (pad_t - c), else x frame s - pad_t; out-of-frame pixels are zero. f64. */
static double naive_conv(const ghc_tensor_t *x, const ghc_tensor_t *cache, const ghc_tensor_t *w,
                         const ghc_tensor_t *bias, const struct ghc_conv3d *g, int64_t b, int64_t co, int64_t to,
                         int64_t ho, int64_t wo)
{
    const int64_t cf = cache ? ghc_tensor_dim(cache, 2) : 0;
    const int st = g->stride_t ? g->stride_t : 1, sh = g->stride_h ? g->stride_h : 1, sw = g->stride_w ? g->stride_w : 1;
    double acc = bias ? get(bias, co) : 0.0;
    for (int64_t ci = 0; ci < ghc_tensor_dim(x, 1); ci++)
        for (int64_t kt = 0; kt < ghc_tensor_dim(w, 2); kt++)
            for (int64_t kh = 0; kh < ghc_tensor_dim(w, 3); kh++)
                for (int64_t kw = 0; kw < ghc_tensor_dim(w, 4); kw++) {
                    int64_t s = to * st + kt, hi = ho * sh + kh - g->pad_top, wi = wo * sw + kw - g->pad_left;
                    if (hi < 0 || hi >= ghc_tensor_dim(x, 3) || wi < 0 || wi >= ghc_tensor_dim(x, 4) ||
                        s < g->pad_t - cf)
                        continue;
                    double v = s < g->pad_t ? get(cache, AT(cache, b, ci, s - (g->pad_t - cf), hi, wi))
                                            : get(x, AT(x, b, ci, s - g->pad_t, hi, wi));
                    acc += v * get(w, ((co * ghc_tensor_dim(w, 1) + ci) * ghc_tensor_dim(w, 2) + kt) *
                                          ghc_tensor_dim(w, 3) * ghc_tensor_dim(w, 4) +
                                      kh * ghc_tensor_dim(w, 4) + kw);
                }
    return acc;
}

/* conv3d against naive_conv for one geometry; xdt the input dtype (bf16 checks the widening). */
static void conv_case(const struct ghc_conv3d *g, int64_t cf, int64_t T_, int64_t kT, int64_t kH, int64_t kW,
                      enum ghc_dtype xdt, uint32_t seed)
{
    const int64_t B = 2, Ci = 3, Co = 4, H = 5, W = 7;
    ghc_tensor_t *x = dims5(xdt, B, Ci, T_, H, W), *w = dims5(F32, Co, Ci, kT, kH, kW), *bias = T(F32, Co);
    ghc_tensor_t *cache = cf ? dims5(F32, B, Ci, cf, H, W) : NULL;
    fill(x, seed), fill(w, seed + 1), fill(bias, seed + 2);
    if (cache)
        fill(cache, seed + 3);
    const int st = g->stride_t ? g->stride_t : 1, sh = g->stride_h ? g->stride_h : 1, sw = g->stride_w ? g->stride_w : 1;
    const int64_t To = (g->pad_t + T_ - kT) / st + 1, Ho = (H + g->pad_top + g->pad_bottom - kH) / sh + 1,
                  Wo = (W + g->pad_left + g->pad_right - kW) / sw + 1;
    ghc_tensor_t *y = dims5(F32, B, Co, To, Ho, Wo), *ref = dims5(F32, B, Co, To, Ho, Wo);
    ck_assert_msg(ghc_op_conv3d(y, x, cache, w, bias, g, NULL) == 0, "%s", ghc_error_message(core));
    for (int64_t b = 0; b < B; b++)
        for (int64_t co = 0; co < Co; co++)
            for (int64_t to = 0; to < To; to++)
                for (int64_t ho = 0; ho < Ho; ho++)
                    for (int64_t wo = 0; wo < Wo; wo++)
                        ((float *)ghc_tensor_data(ref))[AT(ref, b, co, to, ho, wo)] =
                            (float)naive_conv(x, cache, w, bias, g, b, co, to, ho, wo);
    near("conv3d", y, ref, 1e-5, 1e-5);
}

START_TEST(test_conv3d_geometries)
{
    const struct ghc_conv3d k3 = { .pad_t = 2, .pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1 };
    const struct ghc_conv3d down = { .stride_h = 2, .stride_w = 2, .pad_bottom = 1, .pad_right = 1 };
    const struct ghc_conv3d tdown = { .stride_t = 2, .pad_t = 1 };
    const struct ghc_conv3d plain = { 0 };
    conv_case(&k3, 0, 3, 3, 3, 3, F32, 1);      /* k3 causal, zero front frames */
    conv_case(&k3, 1, 1, 3, 3, 3, F32, 2);      /* one cached frame, one zero frame */
    conv_case(&k3, 2, 4, 3, 3, 3, F32, 3);      /* the full cache */
    conv_case(&k3, 2, 2, 3, 3, 3, BF16, 4);     /* bf16 input */
    conv_case(&down, 0, 2, 1, 3, 3, F32, 5);    /* downsample2d: ZeroPad2d(0,1,0,1), stride 2 */
    conv_case(&tdown, 1, 4, 3, 1, 1, F32, 6);   /* downsample3d's time_conv with its cached frame */
    conv_case(&plain, 0, 2, 1, 1, 1, F32, 7);   /* 1x1x1 */
}
END_TEST

/* The feature cache's promise: a causal conv over frames [0, 5) in one call equals chunk [0, 1)
 * without a cache followed by chunk [1, 5) with the last 2 input frames seen so far as cache
 * (one real frame and one zero frame: what the VAE's slot holds after a 1-frame chunk). */
START_TEST(test_conv3d_chunked)
{
    const struct ghc_conv3d k3 = { .pad_t = 2, .pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1 };
    ghc_tensor_t *x = dims5(F32, 1, 3, 5, 4, 6), *w = dims5(F32, 2, 3, 3, 3, 3), *bias = T(F32, 2);
    fill(x, 11), fill(w, 12), fill(bias, 13);
    ghc_tensor_t *full = dims5(F32, 1, 2, 5, 4, 6), *joined = dims5(F32, 1, 2, 5, 4, 6);
    ck_assert_int_eq(ghc_op_conv3d(full, x, NULL, w, bias, &k3, NULL), 0);
    ghc_tensor_t *c0 = dims5(F32, 1, 3, 1, 4, 6), *c1 = dims5(F32, 1, 3, 4, 4, 6), *cache = dims5(F32, 1, 3, 2, 4, 6);
    ghc_tensor_t *y0 = dims5(F32, 1, 2, 1, 4, 6), *y1 = dims5(F32, 1, 2, 4, 4, 6);
    ck_assert_int_eq(ghc_op_copy_frames(c0, 0, x, 0, 1, NULL), 0);
    ck_assert_int_eq(ghc_op_copy_frames(c1, 0, x, 1, 4, NULL), 0);
    ck_assert_int_eq(ghc_op_conv3d(y0, c0, NULL, w, bias, &k3, NULL), 0);
    ck_assert_int_eq(ghc_op_fill(cache, 0.0, NULL), 0);
    ck_assert_int_eq(ghc_op_copy_frames(cache, 1, x, 0, 1, NULL), 0);
    ck_assert_int_eq(ghc_op_conv3d(y1, c1, cache, w, bias, &k3, NULL), 0);
    ck_assert_int_eq(ghc_op_copy_frames(joined, 0, y0, 0, 1, NULL), 0);
    ck_assert_int_eq(ghc_op_copy_frames(joined, 1, y1, 0, 4, NULL), 0);
    near("chunked conv", joined, full, 1e-6, 1e-6);
    /* the cache matters: without it chunk 1 differs */
    ck_assert_int_eq(ghc_op_conv3d(y1, c1, NULL, w, bias, &k3, NULL), 0);
    ck_assert_int_eq(ghc_op_copy_frames(joined, 1, y1, 0, 4, NULL), 0);
    double diff = 0.0;
    for (int64_t i = 0; i < ghc_tensor_numel(full); i++)
        diff = fmax(diff, fabs(get(joined, i) - get(full, i)));
    ck_assert_msg(diff > 1e-3, "chunk 1 without its cache matched (%g)", diff);
}
END_TEST

START_TEST(test_conv3d_errors)
{
    const struct ghc_conv3d k3 = { .pad_t = 2, .pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1 };
    ghc_tensor_t *x = dims5(F32, 1, 3, 2, 4, 4), *w = dims5(F32, 2, 4, 3, 3, 3), *y = dims5(F32, 1, 2, 2, 4, 4);
    ck_assert_int_eq(ghc_op_conv3d(y, x, NULL, w, NULL, &k3, NULL), GHC_EINVAL);
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), "conv3d: tensor 'w'"));
    ghc_tensor_t *w3 = dims5(F32, 2, 3, 3, 3, 3), *cache = dims5(F32, 1, 3, 3, 4, 4);
    ck_assert_int_eq(ghc_op_conv3d(y, x, cache, w3, NULL, &k3, NULL), GHC_EINVAL);   /* 3 > pad_t frames */
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), "'cache'"));
    ghc_tensor_t *ybad = dims5(F32, 1, 2, 3, 4, 4);
    ck_assert_int_eq(ghc_op_conv3d(ybad, x, NULL, w3, NULL, &k3, NULL), GHC_EINVAL);
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), "shape [1, 2, 2, 4, 4]"));
}
END_TEST

/* conv3d_add: bit for bit conv3d then add (y = y + residual), in f32 and in bf16 (where the
 * convolution is rounded before the addition), with a cache and a bias; its errors name it. */
START_TEST(test_conv3d_add)
{
    const struct ghc_conv3d k3 = { .pad_t = 2, .pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1 };
    for (int d = 0; d < 2; d++) {
        const enum ghc_dtype dt = d ? BF16 : F32;
        ghc_tensor_t *x = dims5(dt, 2, 3, 2, 5, 6), *cache = dims5(dt, 2, 3, 1, 5, 6), *w = dims5(F32, 4, 3, 3, 3, 3);
        ghc_tensor_t *bias = T(F32, 4), *res = dims5(dt, 2, 4, 2, 5, 6);
        ghc_tensor_t *ref = dims5(dt, 2, 4, 2, 5, 6), *y = dims5(dt, 2, 4, 2, 5, 6);
        fill(x, 51 + d), fill(cache, 53), fill(w, 54), fill(bias, 55), fill(res, 56);
        ck_assert_int_eq(ghc_op_conv3d(ref, x, cache, w, bias, &k3, NULL), 0);
        ck_assert_int_eq(ghc_op_add(ref, ref, res, 1.0f, 1.0f, NULL), 0);
        ck_assert_int_eq(ghc_op_conv3d_add(y, x, cache, w, bias, res, &k3, NULL), 0);
        ck_assert_msg(memcmp(ghc_tensor_cdata(y), ghc_tensor_cdata(ref),
                             (size_t)ghc_tensor_numel(y) * ghc_dtype_size(dt)) == 0,
                      "conv3d_add %s differs from conv3d then add", d ? "bf16" : "f32");
    }
    ghc_tensor_t *x = dims5(F32, 1, 3, 2, 4, 4), *w = dims5(F32, 2, 3, 3, 3, 3), *y = dims5(F32, 1, 2, 2, 4, 4);
    ghc_tensor_t *rb = dims5(BF16, 1, 2, 2, 4, 4), *rs = dims5(F32, 1, 2, 1, 4, 4);
    ck_assert_int_eq(ghc_op_conv3d_add(y, x, NULL, w, NULL, NULL, &k3, NULL), GHC_EINVAL);
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), "conv3d_add: tensor 'residual'"));
    ck_assert_int_eq(ghc_op_conv3d_add(y, x, NULL, w, NULL, rb, &k3, NULL), GHC_EINVAL);   /* not y's dtype */
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), "conv3d_add: tensor 'residual'"));
    ck_assert_int_eq(ghc_op_conv3d_add(y, x, NULL, w, NULL, rs, &k3, NULL), GHC_EINVAL);   /* not y's shape */
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), "conv3d_add: tensor 'residual'"));
    ck_assert_int_eq(ghc_op_conv3d_add(y, x, NULL, w, NULL, y, &k3, NULL), GHC_EINVAL);    /* y itself */
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), "other than 'y'"));
}
END_TEST

/* ---- ops: the others ---------------------------------------------------------------------------- */

START_TEST(test_channel_ops)
{
    ghc_tensor_t *x = dims5(F32, 2, 5, 3, 2, 3), *g = T(F32, 5, 1, 1, 1), *y = dims5(F32, 2, 5, 3, 2, 3);
    ghc_tensor_t *ref = dims5(F32, 2, 5, 3, 2, 3), *sc = T(F32, 5), *sh = T(F32, 5);
    fill(x, 21), fill(g, 22), fill(sc, 23), fill(sh, 24);
    float *xv = ghc_tensor_data(x);
    for (int c = 0; c < 5; c++)   /* one position of zeros: the norm is max(0, 1e-12) */
        xv[AT(x, 1, c, 2, 1, 2)] = 0.0f;
    ck_assert_int_eq(ghc_op_channel_rmsnorm(y, x, g, NULL), 0);
    const int64_t S = 3 * 2 * 3;
    for (int64_t b = 0; b < 2; b++)
        for (int64_t p = 0; p < S; p++) {
            double ss = 0.0;
            for (int c = 0; c < 5; c++)
                ss += (double)xv[(b * 5 + c) * S + p] * xv[(b * 5 + c) * S + p];
            for (int c = 0; c < 5; c++)
                ((float *)ghc_tensor_data(ref))[(b * 5 + c) * S + p] =
                    (float)(xv[(b * 5 + c) * S + p] / fmax(sqrt(ss), 1e-12) * sqrt(5.0) * get(g, c));
        }
    near("channel_rmsnorm", y, ref, 1e-6, 1e-5);
    ck_assert_float_eq(get(y, AT(y, 1, 3, 2, 1, 2)), 0.0f);
    ck_assert_int_eq(ghc_op_channel_rmsnorm(x, x, g, NULL), 0);   /* in place */
    near("channel_rmsnorm in place", x, y, 0.0, 0.0);

    fill(x, 25);
    ck_assert_int_eq(ghc_op_channel_affine(y, x, sc, sh, NULL), 0);
    for (int64_t i = 0; i < ghc_tensor_numel(x); i++)
        ((float *)ghc_tensor_data(ref))[i] = get(x, i) * get(sc, (i / S) % 5) + get(sh, (i / S) % 5);
    near("channel_affine", y, ref, 1e-6, 1e-6);
    ghc_tensor_t *bad = T(F32, 4);
    ck_assert_int_eq(ghc_op_channel_affine(y, x, bad, NULL, NULL), GHC_EINVAL);
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), "'scale'"));
}
END_TEST

/* The fused norm and SiLU: bit for bit ghc_op_channel_rmsnorm then ghc_op_silu (in place, as
 * the encoder ran them), in f32 and in bf16 (where the norm is rounded before the SiLU), out of
 * place and in place; its operand errors name it. */
START_TEST(test_channel_rmsnorm_silu)
{
    for (int d = 0; d < 2; d++) {
        const enum ghc_dtype dt = d ? BF16 : F32;
        ghc_tensor_t *x = dims5(dt, 2, 13, 3, 5, 7), *g = T(F32, 13, 1, 1, 1);
        ghc_tensor_t *ref = dims5(dt, 2, 13, 3, 5, 7), *y = dims5(dt, 2, 13, 3, 5, 7);
        fill(x, 41 + d), fill(g, 43);
        const size_t bytes = (size_t)ghc_tensor_numel(x) * ghc_dtype_size(dt);
        ck_assert_int_eq(ghc_op_channel_rmsnorm(ref, x, g, NULL), 0);
        ck_assert_int_eq(ghc_op_silu(ref, ref, NULL), 0);
        ck_assert_int_eq(ghc_op_channel_rmsnorm_silu(y, x, g, NULL), 0);
        ck_assert_msg(memcmp(ghc_tensor_cdata(y), ghc_tensor_cdata(ref), bytes) == 0,
                      "channel_rmsnorm_silu %s differs from channel_rmsnorm then silu", d ? "bf16" : "f32");
        ck_assert_int_eq(ghc_op_channel_rmsnorm_silu(x, x, g, NULL), 0);   /* in place */
        ck_assert_msg(memcmp(ghc_tensor_cdata(x), ghc_tensor_cdata(ref), bytes) == 0,
                      "channel_rmsnorm_silu %s in place differs", d ? "bf16" : "f32");
        /* the SiLU is there: negative outputs stay above -0.28 (SiLU's minimum) */
        bool neg = false;
        for (int64_t i = 0; i < ghc_tensor_numel(y); i++) {
            ck_assert_msg(get(y, i) > -0.28f, "channel_rmsnorm_silu[%lld] = %g", (long long)i, get(y, i));
            neg = neg || get(y, i) < 0.0f;
        }
        ck_assert(neg);
    }
    ghc_tensor_t *x = dims5(F32, 1, 4, 1, 2, 2), *y = dims5(F32, 1, 4, 1, 2, 2), *g3 = T(F32, 3);
    ghc_tensor_t *yb = dims5(F32, 1, 4, 1, 2, 3), *g4 = T(F32, 4);
    ck_assert_int_eq(ghc_op_channel_rmsnorm_silu(y, x, g3, NULL), GHC_EINVAL);
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), "channel_rmsnorm_silu: tensor 'gamma'"));
    ck_assert_int_eq(ghc_op_channel_rmsnorm_silu(yb, x, g4, NULL), GHC_EINVAL);
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), "channel_rmsnorm_silu: tensor 'y'"));
}
END_TEST

START_TEST(test_upsample_copy_clamp)
{
    ghc_tensor_t *x = dims5(BF16, 1, 2, 2, 3, 4), *y = dims5(BF16, 1, 2, 2, 6, 8);
    fill(x, 31);
    ck_assert_int_eq(ghc_op_upsample2x(y, x, NULL), 0);
    for (int c = 0; c < 2; c++)
        for (int f = 0; f < 2; f++)
            for (int h = 0; h < 6; h++)
                for (int w = 0; w < 8; w++)
                    ck_assert_float_eq(get(y, AT(y, 0, c, f, h, w)), get(x, AT(x, 0, c, f, h / 2, w / 2)));

    /* frames between tensors, and inside one tensor with overlap (memmove) */
    ghc_tensor_t *a = dims5(F32, 2, 3, 5, 2, 2), *b = dims5(F32, 2, 3, 2, 2, 2), *a0 = dims5(F32, 2, 3, 5, 2, 2);
    fill(a, 32), fill(b, 33);
    ck_assert_int_eq(ghc_op_copy(a0, a, NULL), 0);
    ck_assert_int_eq(ghc_op_copy_frames(a, 3, b, 0, 2, NULL), 0);
    ck_assert_int_eq(ghc_op_copy_frames(a, 0, a, 1, 3, NULL), 0);
    for (int n = 0; n < 2; n++)
        for (int c = 0; c < 3; c++)
            for (int f = 0; f < 5; f++)
                for (int p = 0; p < 4; p++) {
                    float want = f < 2 ? get(a0, AT(a0, n, c, f + 1, p / 2, p % 2))
                                 : f == 2 ? get(b, AT(b, n, c, 0, p / 2, p % 2))
                                          : get(b, AT(b, n, c, f - 3, p / 2, p % 2));
                    ck_assert_float_eq(get(a, AT(a, n, c, f, p / 2, p % 2)), want);
                }
    ck_assert_int_eq(ghc_op_copy_frames(a, 4, b, 0, 2, NULL), GHC_EINVAL);
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), "out of range"));

    ghc_tensor_t *v = T(F32, 5), *o = T(F32, 5);
    const float in[5] = { -3.0f, -1.0f, 0.25f, 2.0f, NAN };
    memcpy(ghc_tensor_data(v), in, sizeof(in));
    ck_assert_int_eq(ghc_op_clamp(o, v, -1.0f, 1.0f, NULL), 0);
    ck_assert_float_eq(get(o, 0), -1.0f);
    ck_assert_float_eq(get(o, 1), -1.0f);
    ck_assert_float_eq(get(o, 2), 0.25f);
    ck_assert_float_eq(get(o, 3), 1.0f);
    ck_assert(isnan(get(o, 4)));
    ck_assert_int_eq(ghc_op_clamp(o, v, 1.0f, -1.0f, NULL), GHC_EINVAL);
}
END_TEST

START_TEST(test_frame_attention)
{
    const int64_t B = 2, C = 4, Tn = 2, H = 3, W = 2, N = H * W;
    ghc_tensor_t *qkv = dims5(F32, B, 3 * C, Tn, H, W), *o = dims5(F32, B, C, Tn, H, W), *ref = dims5(F32, B, C, Tn, H, W);
    fill(qkv, 41);
    const float scale = 0.5f;
    ck_assert_int_eq(ghc_op_frame_attention(o, qkv, scale, NULL), 0);
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < Tn; t++)
            for (int64_t i = 0; i < N; i++) {
                double s[6], mx = -1e300, sum = 0.0;
                for (int64_t j = 0; j < N; j++) {
                    double d = 0.0;
                    for (int64_t c = 0; c < C; c++)
                        d += get(qkv, AT(qkv, b, c, t, i / W, i % W)) * get(qkv, AT(qkv, b, C + c, t, j / W, j % W));
                    s[j] = d * scale;
                    mx = fmax(mx, s[j]);
                }
                for (int64_t j = 0; j < N; j++)
                    sum += s[j] = exp(s[j] - mx);
                for (int64_t c = 0; c < C; c++) {
                    double acc = 0.0;
                    for (int64_t j = 0; j < N; j++)
                        acc += s[j] / sum * get(qkv, AT(qkv, b, 2 * C + c, t, j / W, j % W));
                    ((float *)ghc_tensor_data(ref))[AT(ref, b, c, t, i / W, i % W)] = (float)acc;
                }
            }
    near("frame_attention", o, ref, 1e-6, 1e-5);
    ghc_tensor_t *bad = dims5(F32, B, 10, Tn, H, W);
    ck_assert_int_eq(ghc_op_frame_attention(o, bad, scale, NULL), GHC_EINVAL);
}
END_TEST

/* The Wan2.2 VAE's shortcuts and patches, against scatter-style references written from the
 * PyTorch reshapes (spec encoders.md 3.2, 3.3): each input element is sent where diffusers'
 * view/permute sends it. */
START_TEST(test_wan22_ops)
{
    /* AvgDown3D 3 -> 6 channels, ft 2, fs 2 (g = 4), 3 frames (one zero frame in front) */
    ghc_tensor_t *x = dims5(F32, 2, 3, 3, 4, 6), *y = dims5(F32, 2, 6, 2, 2, 3), *ref = dims5(F32, 2, 6, 2, 2, 3);
    fill(x, 51);
    ck_assert_int_eq(ghc_op_avg_down3d(y, x, 2, 2, NULL), 0);
    ck_assert_int_eq(ghc_op_fill(ref, 0.0, NULL), 0);
    for (int64_t b = 0; b < 2; b++)
        for (int64_t c = 0; c < 3; c++)
            for (int64_t f = 0; f < 4; f++)   /* padded frames: f = 0 is the zero frame */
                for (int64_t h = 0; h < 4; h++)
                    for (int64_t w = 0; w < 6; w++) {
                        int64_t e = c * 8 + (f % 2) * 4 + (h % 2) * 2 + w % 2;
                        if (f > 0)
                            ((float *)ghc_tensor_data(ref))[AT(ref, b, e / 4, f / 2, h / 2, w / 2)] +=
                                get(x, AT(x, b, c, f - 1, h, w)) / 4.0f;
                    }
    near("avg_down3d", y, ref, 1e-6, 1e-6);
    ck_assert_int_eq(ghc_op_avg_down3d(dims5(F32, 2, 5, 2, 2, 3), x, 2, 2, NULL), GHC_EINVAL);   /* 24 % 5 */

    /* DupUp3D 4 -> 2 channels, ft 2, fs 2 (r = 4), dropping the first frame */
    ghc_tensor_t *u = dims5(F32, 1, 4, 2, 2, 3), *v = dims5(F32, 1, 2, 3, 4, 6), *vref = dims5(F32, 1, 2, 3, 4, 6);
    fill(u, 52);
    ck_assert_int_eq(ghc_op_dup_up3d(v, u, 2, 2, 1, NULL), 0);
    for (int64_t ci = 0; ci < 4; ci++)
        for (int64_t k = 0; k < 4; k++) {
            int64_t e = ci * 4 + k, o = e / 8, it = (e / 4) % 2, ih = (e / 2) % 2, iw = e % 2;
            for (int64_t t = 0; t < 2; t++)
                for (int64_t h = 0; h < 2; h++)
                    for (int64_t w = 0; w < 3; w++)
                        if (t * 2 + it >= 1)
                            ((float *)ghc_tensor_data(vref))[AT(vref, 0, o, t * 2 + it - 1, h * 2 + ih, w * 2 + iw)] =
                                get(u, AT(u, 0, ci, t, h, w));
        }
    near("dup_up3d", v, vref, 0.0, 0.0);

    /* patches: P[c 4 + r 2 + q, f, i, j] = X[c, f, 2 i + q, 2 j + r], and back */
    ghc_tensor_t *px = dims5(F32, 1, 3, 2, 4, 6), *pp = dims5(F32, 1, 12, 2, 2, 3), *back = dims5(F32, 1, 3, 2, 4, 6);
    fill(px, 53);
    ck_assert_int_eq(ghc_op_vae_patchify(pp, px, 2, NULL), 0);
    for (int64_t c = 0; c < 3; c++)
        for (int64_t f = 0; f < 2; f++)
            for (int64_t hh = 0; hh < 4; hh++)
                for (int64_t ww = 0; ww < 6; ww++)
                    ck_assert_float_eq(get(pp, AT(pp, 0, c * 4 + (ww % 2) * 2 + hh % 2, f, hh / 2, ww / 2)),
                                       get(px, AT(px, 0, c, f, hh, ww)));
    ck_assert_int_eq(ghc_op_vae_unpatchify(back, pp, 2, NULL), 0);
    near("unpatchify(patchify(x))", back, px, 0.0, 0.0);
    ck_assert_int_eq(ghc_op_vae_patchify(pp, dims5(F32, 1, 3, 2, 5, 6), 2, NULL), GHC_EINVAL);
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), "multiples of 2"));
}
END_TEST

/* ---- the VAEs against the fixtures ---------------------------------------------------------------- */

/* A tiny model of tests/fixtures/wanvae and what the loader must read from it. */
struct model {
    const char *weights, *names, *cases;
    int         version;
    int64_t     z, base, dec_base, patch;
};
static const struct model M21 = { "weights_diffusers.safetensors", "names_tiny21.txt", "case.safetensors", 21, 16,
                                  4, 4, 1 };
static const struct model M22 = { "weights22_diffusers.safetensors", "names_tiny22.txt", "case22.safetensors", 22,
                                  48, 2, 2, 2 };

static char *fixture(const char *name) { return tu_fixture("wanvae", name); }

/* Tensor `name` of the model's case file as f32. */
static ghc_tensor_t *case_tensor(const struct model *m, const char *name)
{
    return keep(tu_fixture_tensor(core, "wanvae", m->cases, name));
}

static ghc_wanvae_t *open_vae(const char *path)
{
    ghc_wanvae_t *vae = ghc_wanvae_init(core, path, NULL);
    ck_assert_msg(vae != NULL, "%s: %s", path, ghc_error_message(core));
    return vae;
}

/* A names list of the fixture script: per line a diffusers name, its official name and the
 * shape ("16,16,3,3,3"). */
#define MAX_NAMES 256
struct names {
    int     n;
    char    dif[MAX_NAMES][160], off[MAX_NAMES][160];
    int     nd[MAX_NAMES];
    int64_t shape[MAX_NAMES][5];
};

static struct names *read_names(const char *file)
{
    char *path = fixture(file), line[512];
    struct names *l = calloc(1, sizeof(*l));
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(l);
    ck_assert_msg(f != NULL, "%s", path);
    while (fgets(line, sizeof(line), f)) {
        char dims[64];
        ck_assert_int_lt(l->n, MAX_NAMES);
        ck_assert_int_eq(sscanf(line, "%159s %159s %63s", l->dif[l->n], l->off[l->n], dims), 3);
        for (char *p = dims; *p && l->nd[l->n] < 5; l->nd[l->n]++) {
            l->shape[l->n][l->nd[l->n]] = strtoll(p, &p, 10);
            p += *p == ',';
        }
        l->n++;
    }
    fclose(f);
    free(path);
    return l;
}

/* Rewrite fixture `src` into dir/name with every tensor as `dt`, renamed to its official name
 * when `list` (a names file) is given, under prefix; skip (a source name) drops one tensor,
 * reshape (a source name) makes one 1-D. Returns the path (caller frees). */
static char *rewrite(const char *dir, const char *name, const char *src, const char *list, enum ghc_dtype dt,
                     const char *prefix, const char *skip, const char *reshape)
{
    char *in = fixture(src), *out = malloc(1024);
    struct names *l = list ? read_names(list) : NULL;
    ck_assert_ptr_nonnull(out);
    snprintf(out, 1024, "%s/%s", dir, name);
    ghc_st_t *st = ghc_st_open(core, in);
    ck_assert_ptr_nonnull(st);
    ghc_st_writer_t *wr = ghc_st_writer_init(core);
    for (int i = 0; i < ghc_st_count(st); i++) {
        struct ghc_st_info info;
        char key[400];
        const char *to = NULL;
        ghc_st_info_at(st, i, &info);
        if (skip && strcmp(info.name, skip) == 0)
            continue;
        for (int k = 0; l && k < l->n && !to; k++)
            if (strcmp(l->dif[k], info.name) == 0)
                to = l->off[k];
        ck_assert_msg(!l || to, "%s is not in %s", info.name, list);
        ghc_tensor_t *t = ghc_st_load(st, info.name, dt, GHC_ROLE_WORKSPACE);
        ck_assert_ptr_nonnull(t);
        if (reshape && strcmp(info.name, reshape) == 0)
            ck_assert_int_eq(ghc_tensor_reshape(t, 1, (const int64_t[]){ ghc_tensor_numel(t) }), 0);
        snprintf(key, sizeof(key), "%s%s", prefix, to ? to : info.name);
        ck_assert_int_eq(ghc_st_writer_add(wr, key, t), 0);
        ghc_tensor_free(t);
    }
    ck_assert_msg(ghc_st_writer_finish(wr, out) == 0, "%s", ghc_error_message(core));
    ghc_st_writer_free(wr);
    ghc_st_free(st);
    free(l);
    free(in);
    return out;
}

/* The first `frames` frames of a [C, F, H, W] tensor. */
static ghc_tensor_t *first_frames(const ghc_tensor_t *t, int64_t frames)
{
    const int64_t C = ghc_tensor_dim(t, 0), F = ghc_tensor_dim(t, 1), HW = ghc_tensor_dim(t, 2) * ghc_tensor_dim(t, 3);
    ghc_tensor_t *o = T(F32, C, frames, ghc_tensor_dim(t, 2), ghc_tensor_dim(t, 3));
    for (int64_t c = 0; c < C; c++)
        memcpy((float *)ghc_tensor_data(o) + c * frames * HW, (const float *)ghc_tensor_cdata(t) + c * F * HW,
               (size_t)(frames * HW) * sizeof(float));
    return o;
}

/* Encode the case's clip and decode its z, against the reference. */
static void check_case(ghc_wanvae_t *vae, const struct model *m)
{
    ghc_tensor_t *lat = NULL, *out = NULL;
    ck_assert_msg(ghc_wanvae_encode(vae, case_tensor(m, "video"), &lat) == 0, "%s", ghc_error_message(core));
    keep(lat);
    near("latent", lat, case_tensor(m, "latent"), ATOL, RTOL);
    ck_assert_msg(ghc_wanvae_decode(vae, case_tensor(m, "z"), &out) == 0, "%s", ghc_error_message(core));
    keep(out);
    near("decoded", out, case_tensor(m, "decoded"), ATOL, RTOL);
}

/* The model under diffusers names (its bf16 file) or official names (written as f16 from the
 * script's names list, which took them from the spec's tables). */
static void check_vae(const struct model *m, bool official)
{
    char *dir = tu_tmpdir();
    char *path = official ? rewrite(dir, "official.safetensors", m->weights, m->names, GHC_DTYPE_F16, "", NULL, NULL)
                          : fixture(m->weights);
    ghc_wanvae_t *vae = open_vae(path);
    const struct ghc_wanvae_config *g = ghc_wanvae_config(vae);
    ck_assert_int_eq(g->names, official ? GHC_WANVAE_NAMES_OFFICIAL : GHC_WANVAE_NAMES_DIFFUSERS);
    ck_assert_int_eq(g->version, m->version);
    ck_assert_int_eq(g->base_dim, m->base);
    ck_assert_int_eq(g->dec_base_dim, m->dec_base);
    ck_assert_int_eq(g->patch, m->patch);
    ck_assert_int_eq(g->z_dim, m->z);
    ck_assert_int_eq(g->num_res_blocks, 1);
    ck_assert(g->dim_mult[0] == 1 && g->dim_mult[1] == 2 && g->dim_mult[2] == 2 && g->dim_mult[3] == 2);
    ck_assert(!g->temporal_down[0] && g->temporal_down[1] && g->temporal_down[2]);
    check_case(vae, m);
    ghc_wanvae_free(vae);
    free(path);
    tu_rm_rf(dir);
    free(dir);
}

START_TEST(test_vae21_diffusers) { check_vae(&M21, false); }
END_TEST

START_TEST(test_vae21_official) { check_vae(&M21, true); }
END_TEST

START_TEST(test_vae22_diffusers) { check_vae(&M22, false); }
END_TEST

START_TEST(test_vae22_official) { check_vae(&M22, true); }
END_TEST

/* Tiles of `tile` every `stride` pixels are refused (GHC_EINVAL) with `why` in the message. */
static void refuse_tiles(const char *path, int64_t tile, int64_t stride, const char *why)
{
    const struct ghc_wanvae_opts o = { .device = GHC_DEVICE_CPU, .tile = tile, .tile_stride = stride };
    ck_assert_ptr_null(ghc_wanvae_init(core, path, &o));
    ck_assert_int_eq(ghc_error_code(core), GHC_EINVAL);
    ck_assert_msg(strstr(ghc_error_message(core), why), "%s", ghc_error_message(core));
}

/* Spatial tiling against diffusers' enable_tiling (tiles of 32 pixels every 16: 2 x 3 tiles of
 * the 48 x 64 clip, 3 x 4 latent tiles of its decode, the last row and column smaller) on the
 * tiny Wan2.1 model; a tile as large as the frame changes nothing (bit for bit); bad tiles are
 * refused. */
START_TEST(test_vae_tiled)
{
    struct model m = M21;
    m.cases = "case_tiled.safetensors";
    char *path = fixture(M21.weights);
    const struct ghc_wanvae_opts tiled = { .device = GHC_DEVICE_CPU, .tile = 32, .tile_stride = 16 };
    const struct ghc_wanvae_opts whole = { .device = GHC_DEVICE_CPU, .tile = 64 };
    ghc_wanvae_t *vae = ghc_wanvae_init(core, path, &tiled), *ref = ghc_wanvae_init(core, path, &whole);
    ck_assert_msg(vae && ref, "%s", ghc_error_message(core));
    ghc_tensor_t *lat = NULL, *out = NULL, *lat2 = NULL;
    ck_assert_msg(ghc_wanvae_encode(vae, case_tensor(&m, "video"), &lat) == 0, "%s", ghc_error_message(core));
    keep(lat);
    near("tiled latent", lat, case_tensor(&m, "latent"), ATOL, RTOL);
    ck_assert_msg(ghc_wanvae_decode(vae, case_tensor(&m, "z"), &out) == 0, "%s", ghc_error_message(core));
    keep(out);
    near("tiled decode", out, case_tensor(&m, "decoded"), ATOL, RTOL);
    ck_assert_msg(ghc_wanvae_encode(ref, case_tensor(&m, "video"), &lat2) == 0, "%s", ghc_error_message(core));
    keep(lat2);
    ghc_tensor_t *plain = NULL;
    ghc_wanvae_free(vae);
    vae = open_vae(path);   /* no tiling */
    ck_assert_int_eq(ghc_wanvae_encode(vae, case_tensor(&m, "video"), &plain), 0);
    keep(plain);
    ck_assert(memcmp(ghc_tensor_cdata(lat2), ghc_tensor_cdata(plain), ghc_tensor_nbytes(plain)) == 0);
    ghc_wanvae_free(vae);
    ghc_wanvae_free(ref);
    refuse_tiles(path, 36, 0, "multiples of 8");
    refuse_tiles(path, 32, 40, "multiples of 8");
    free(path);
}
END_TEST

/* The tiny Wan2.2 decoder is ill-conditioned at this size (its narrowest stages RMS-normalise 2 to
 * 4 channels): diffusers' own f32 decode of case22_tiled's z differs from its f64 decode by up to
 * 4.6e-5 tiled and 7.6e-5 untiled, so ours is held to 1e-4 there (a seam done wrong is off by
 * 0.1 to 1.5). */
#define DEC22_TOL 1e-4

/* The Wan2.2 VAE tiled as diffusers tiles it (enable_tiling(32, 16): the patchified 80 x 80 clip
 * in 3 x 3 tiles of 64 x 64 pixels every 32, blended over 2 latent rows; the 3 x 3 latent in
 * tiles of 2 x 2 every 1, blended over 8 patch rows, then unpatchified): encode and decode of a
 * 9-frame clip within 1e-5, and unlike the untiled encode; tiles that are not multiples of 16 are
 * refused, and the default stride is one. */
START_TEST(test_vae22_tiled)
{
    struct model m = M22;
    m.cases = "case22_tiled.safetensors";
    char *path = fixture(M22.weights);
    const struct ghc_wanvae_opts tiled = { .device = GHC_DEVICE_CPU, .tile = 32, .tile_stride = 16 };
    ghc_wanvae_t *vae = ghc_wanvae_init(core, path, &tiled), *plain = open_vae(path);
    ck_assert_msg(vae != NULL, "%s", ghc_error_message(core));
    ghc_tensor_t *video = tu_fill_levels(T(F32, 3, 9, 80, 80)), *lat = NULL, *out = NULL, *whole = NULL;
    ck_assert_msg(ghc_wanvae_encode(vae, video, &lat) == 0, "%s", ghc_error_message(core));
    keep(lat);
    near("tiled latent", lat, case_tensor(&m, "latent"), ATOL, RTOL);
    ck_assert_msg(ghc_wanvae_decode(vae, case_tensor(&m, "z"), &out) == 0, "%s", ghc_error_message(core));
    keep(out);
    near("tiled decode", out, case_tensor(&m, "decoded"), DEC22_TOL, DEC22_TOL);
    ck_assert_int_eq(ghc_wanvae_encode(plain, video, &whole), 0);
    keep(whole);
    double diff = 0;
    for (int64_t i = 0; i < ghc_tensor_numel(whole); i++)
        diff = fmax(diff, fabs((double)get(whole, i) - get(lat, i)));
    ck_assert_msg(diff > 1e-3, "tiling changed the latent by only %g", diff);
    ghc_wanvae_free(vae);
    ghc_wanvae_free(plain);
    refuse_tiles(path, 40, 0, "multiples of 16");
    refuse_tiles(path, 32, 24, "multiples of 16");
    const struct ghc_wanvae_opts deflt = { .device = GHC_DEVICE_CPU, .tile = 16 };   /* 3/4 of 16 -> 16 */
    vae = ghc_wanvae_init(core, path, &deflt);
    ck_assert_msg(vae != NULL, "%s", ghc_error_message(core));
    ghc_wanvae_free(vae);
    free(path);
}
END_TEST

/* An image (F = 1: one chunk), and the 9-frame clip (three chunks, the cache carrying frames
 * between them) whose first latent frame is that image's: the encoder is causal; decoding latent
 * frame 0 alone gives pixel frame 0 of the whole decode. Both VAEs. */
START_TEST(test_vae_image_and_chunks)
{
    const struct model *ms[2] = { &M21, &M22 };
    for (int k = 0; k < 2; k++) {
        const struct model *m = ms[k];
        char *path = fixture(m->weights);
        ghc_wanvae_t *vae = open_vae(path);
        ghc_tensor_t *video = case_tensor(m, "video"), *lat = NULL, *img = case_tensor(m, "latent_image");
        ghc_tensor_t *ilat = NULL, *out = NULL;
        ck_assert_msg(ghc_wanvae_encode(vae, first_frames(video, 1), &ilat) == 0, "%s", ghc_error_message(core));
        keep(ilat);
        near("latent_image", ilat, img, ATOL, RTOL);
        ck_assert_int_eq(ghc_wanvae_encode(vae, video, &lat), 0);
        keep(lat);
        near("latent frame 0 of the clip", first_frames(lat, 1), img, ATOL, RTOL);
        ck_assert_int_eq(ghc_wanvae_decode(vae, first_frames(case_tensor(m, "z"), 1), &out), 0);
        keep(out);
        ck_assert_int_eq(ghc_tensor_dim(out, 1), 1);
        near("decoded frame 0", out, first_frames(case_tensor(m, "decoded"), 1), ATOL, RTOL);
        ghc_wanvae_free(vae);
        free(path);
    }
}
END_TEST

/* f32 weights under a prefix (as in a combined checkpoint) give the same latents. */
START_TEST(test_vae_f32_prefix)
{
    char *dir = tu_tmpdir();
    char *path = rewrite(dir, "vae.safetensors", M21.weights, NULL, F32, "vae.", NULL, NULL);
    ghc_wanvae_t *vae = open_vae(path);
    ck_assert_str_eq(ghc_wanvae_config(vae)->prefix, "vae.");
    check_case(vae, &M21);
    ghc_wanvae_free(vae);
    free(path);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* bf16 inputs are read as the f32 values they hold: encoding (decoding) a bf16 clip (latent)
 * gives exactly what its f32 copy gives. */
START_TEST(test_vae_bf16_inputs)
{
    char *path = fixture(M21.weights);
    ghc_wanvae_t *vae = open_vae(path);
    const char *names[2] = { "video", "z" };
    for (int k = 0; k < 2; k++) {
        ghc_tensor_t *f = case_tensor(&M21, names[k]), *b = mk(BF16, 4, ghc_tensor_shape(f)), *a = NULL, *c = NULL;
        ck_assert_int_eq(ghc_tensor_convert_cpu(b, f, 1.0f), 0);
        ck_assert_int_eq(ghc_tensor_convert_cpu(f, b, 1.0f), 0);   /* f: the bf16 values in f32 */
        int (*run)(ghc_wanvae_t *, const ghc_tensor_t *, ghc_tensor_t **) = k ? ghc_wanvae_decode : ghc_wanvae_encode;
        ck_assert_msg(run(vae, b, &a) == 0, "%s", ghc_error_message(core));
        keep(a);
        ck_assert_int_eq(run(vae, f, &c), 0);
        keep(c);
        near(names[k], a, c, 0.0, 0.0);
    }
    ghc_wanvae_free(vae);
    free(path);
}
END_TEST

/* ghc_wanvae_init on `path` fails with `code` and a message holding `what`. */
static void refused(const char *path, int code, const char *what)
{
    ck_assert_ptr_null(ghc_wanvae_init(core, path, NULL));
    ck_assert_int_eq(ghc_error_code(core), code);
    ck_assert_msg(strstr(ghc_error_message(core), what) != NULL, "'%s' not in: %s", what, ghc_error_message(core));
    ck_assert_msg(strstr(ghc_error_message(core), path) != NULL, "the file is not named: %s", ghc_error_message(core));
}

START_TEST(test_vae_file_errors)
{
    char *dir = tu_tmpdir();
    /* a missing tensor, named in the file's naming */
    char *p = rewrite(dir, "a.safetensors", M21.weights, M21.names, BF16, "", "decoder.up_blocks.1.upsamplers.0.time_conv.bias",
                      NULL);
    refused(p, GHC_ENOTFOUND, "missing tensor 'decoder.upsamples.5.time_conv.bias'");
    free(p);
    p = rewrite(dir, "b.safetensors", M21.weights, NULL, BF16, "", "decoder.up_blocks.1.resnets.0.conv_shortcut.weight", NULL);
    refused(p, GHC_ENOTFOUND, "'decoder.up_blocks.1.resnets.0.conv_shortcut.weight'");
    free(p);
    p = rewrite(dir, "c.safetensors", M22.weights, M22.names, BF16, "", "decoder.up_blocks.2.resnets.1.norm2.gamma", NULL);
    refused(p, GHC_ENOTFOUND, "missing tensor 'decoder.upsamples.2.upsamples.1.residual.3.gamma'");
    free(p);
    /* a wrong shape */
    p = rewrite(dir, "d.safetensors", M21.weights, NULL, BF16, "", NULL, "encoder.mid_block.attentions.0.proj.weight");
    refused(p, GHC_EFORMAT, "tensor 'encoder.mid_block.attentions.0.proj.weight' is [64], expected [8, 8, 1, 1]");
    free(p);
    /* a .pth (torch.save writes a zip) */
    p = tu_write(dir, "Wan2.1_VAE.pth", "PK\003\004 not really a zip");
    refused(p, GHC_EUNSUPPORTED, "wan_2.1_vae.safetensors");
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), "diffusion_pytorch_model.safetensors"));
    free(p);
    /* a safetensors file that is no VAE */
    p = fixture(M21.cases);
    refused(p, GHC_EFORMAT, "not a Wan VAE checkpoint");
    free(p);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

START_TEST(test_vae_shape_errors)
{
    char *path = fixture(M21.weights);
    ghc_wanvae_t *vae = open_vae(path);
    ghc_tensor_t *out = NULL;
    ck_assert_int_eq(ghc_wanvae_encode(vae, T(F32, 3, 4, 16, 24), &out), GHC_EINVAL);   /* F = 4 */
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), "1 + 4k frames"));
    ck_assert_ptr_null(out);
    ck_assert_int_eq(ghc_wanvae_encode(vae, T(F32, 3, 5, 12, 24), &out), GHC_EINVAL);   /* H = 12 */
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), "multiples of 8"));
    ck_assert_int_eq(ghc_wanvae_encode(vae, T(F32, 3, 1, 16, 20), &out), GHC_EINVAL);   /* W = 20 */
    ck_assert_int_eq(ghc_wanvae_encode(vae, T(F32, 4, 1, 16, 24), &out), GHC_EINVAL);   /* RGBA */
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), "expected [3, F, H, W]"));
    ck_assert_int_eq(ghc_wanvae_decode(vae, T(F32, 48, 1, 2, 3), &out), GHC_EINVAL);    /* a Wan2.2 latent */
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), "expected [16, T, h, w]"));
    ghc_wanvae_free(vae);
    free(path);
    path = fixture(M22.weights);
    vae = open_vae(path);
    ck_assert_int_eq(ghc_wanvae_encode(vae, T(F32, 3, 1, 24, 32), &out), GHC_EINVAL);   /* Wan2.2: 16 */
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), "multiples of 16"));
    ck_assert_int_eq(ghc_wanvae_decode(vae, T(F32, 16, 1, 2, 3), &out), GHC_EINVAL);
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), "expected [48, T, h, w]"));
    ghc_wanvae_free(vae);
    free(path);
}
END_TEST

/* The real layouts (two residual blocks per stage, widths [1, 2, 4, 4]; spec encoders.md 2.1 and
 * 3.1), narrowed: names_wan21.txt / names_wan22.txt list their 194 / 196 tensors as diffusers
 * builds them, with the official names the fixture script gives them. Both namings, filled with
 * the same seeded numbers, must load as that configuration and encode and decode alike. */
static void check_layout(const char *list, int version, int64_t z, int64_t H, int64_t count)
{
    char *dir = tu_tmpdir();
    struct names *l = read_names(list);
    ck_assert_int_eq(l->n, count);
    ghc_st_writer_t *wr[2] = { ghc_st_writer_init(core), ghc_st_writer_init(core) };
    for (int i = 0; i < l->n; i++) {
        ghc_tensor_t *t = mk(F32, l->nd[i], l->shape[i]);
        const bool gamma = strstr(l->dif[i], "gamma") != NULL;
        fill(t, (uint32_t)(1000 + i));
        for (int64_t e = 0; e < ghc_tensor_numel(t); e++)   /* gammas near 1, the rest small */
            ((float *)ghc_tensor_data(t))[e] = gamma ? 1.0f + 0.2f * get(t, e) : 0.3f * get(t, e);
        ck_assert_int_eq(ghc_st_writer_add(wr[0], l->dif[i], t), 0);
        ck_assert_int_eq(ghc_st_writer_add(wr[1], l->off[i], t), 0);
    }
    ghc_tensor_t *video = T(F32, 3, 5, H, H), *zl = T(F32, z, 2, 2, 2), *out[2][2];
    fill(video, 77), fill(zl, 78);
    for (int k = 0; k < 2; k++) {
        char path[1100];
        snprintf(path, sizeof(path), "%s/%s.safetensors", dir, k ? "official" : "diffusers");
        ck_assert_int_eq(ghc_st_writer_finish(wr[k], path), 0);
        ghc_st_writer_free(wr[k]);
        ghc_wanvae_t *vae = open_vae(path);
        const struct ghc_wanvae_config *g = ghc_wanvae_config(vae);
        ck_assert_int_eq(g->names, k ? GHC_WANVAE_NAMES_OFFICIAL : GHC_WANVAE_NAMES_DIFFUSERS);
        ck_assert_int_eq(g->version, version);
        ck_assert_int_eq(g->num_res_blocks, 2);
        ck_assert(g->dim_mult[0] == 1 && g->dim_mult[1] == 2 && g->dim_mult[2] == 4 && g->dim_mult[3] == 4);
        ck_assert_msg(ghc_wanvae_encode(vae, video, &out[k][0]) == 0, "%s", ghc_error_message(core));
        ck_assert_msg(ghc_wanvae_decode(vae, zl, &out[k][1]) == 0, "%s", ghc_error_message(core));
        keep(out[k][0]), keep(out[k][1]);
        ghc_wanvae_free(vae);
    }
    ck_assert_int_eq(ghc_tensor_dim(out[0][0], 1), 2);
    ck_assert_int_eq(ghc_tensor_dim(out[0][1], 1), 5);
    near("encode, official vs diffusers names", out[1][0], out[0][0], 0.0, 0.0);
    near("decode, official vs diffusers names", out[1][1], out[0][1], 0.0, 0.0);
    free(l);
    tu_rm_rf(dir);
    free(dir);
}

START_TEST(test_vae_layouts)
{
    check_layout("names_wan21.txt", 21, 16, 16, 194);
    check_layout("names_wan22.txt", 22, 48, 32, 196);
}
END_TEST

/* The cache sizes of spec encoders.md 8.2 for the real VAEs (in units of 10 MB, rounded down). */
START_TEST(test_cache_bytes)
{
    const struct ghc_wanvae_config g = { .version = 21, .base_dim = 96, .dec_base_dim = 96, .patch = 1,
                                         .dim_mult = { 1, 2, 4, 4 }, .num_res_blocks = 2,
                                         .temporal_down = { false, true, true }, .z_dim = 16 };
    const struct ghc_wanvae_config g22 = { .version = 22, .base_dim = 160, .dec_base_dim = 256, .patch = 2,
                                           .dim_mult = { 1, 2, 4, 4 }, .num_res_blocks = 2,
                                           .temporal_down = { false, true, true }, .z_dim = 48 };
    ck_assert_int_eq((int64_t)(ghc_wanvae_cache_bytes(&g, false, 480, 832) / 10000000), 224);    /* 2.24 GB */
    ck_assert_int_eq((int64_t)(ghc_wanvae_cache_bytes(&g, true, 480, 832) / 10000000), 377);     /* 3.78 GB */
    ck_assert_int_eq((int64_t)(ghc_wanvae_cache_bytes(&g, false, 704, 1280) / 10000000), 506);   /* 5.06 GB */
    ck_assert_int_eq((int64_t)(ghc_wanvae_cache_bytes(&g22, false, 480, 832) / 10000000), 94);   /* 0.94 GB */
    ck_assert_int_eq((int64_t)(ghc_wanvae_cache_bytes(&g22, true, 480, 832) / 10000000), 285);   /* 2.85 GB */
    ck_assert_int_eq((int64_t)(ghc_wanvae_cache_bytes(&g22, true, 704, 1280) / 10000000), 643);  /* 6.43 GB */
}
END_TEST

int main(void)
{
    Suite *s = suite_create("wanvae");
    TCase *ops = tcase_create("ops");
    tcase_add_checked_fixture(ops, setup, teardown);
    tcase_add_test(ops, test_conv3d_geometries);
    tcase_add_test(ops, test_conv3d_chunked);
    tcase_add_test(ops, test_conv3d_errors);
    tcase_add_test(ops, test_conv3d_add);
    tcase_add_test(ops, test_channel_ops);
    tcase_add_test(ops, test_channel_rmsnorm_silu);
    tcase_add_test(ops, test_upsample_copy_clamp);
    tcase_add_test(ops, test_frame_attention);
    tcase_add_test(ops, test_wan22_ops);
    suite_add_tcase(s, ops);
    TCase *vae = tcase_create("vae");
    tcase_add_checked_fixture(vae, setup, teardown);
    tcase_set_timeout(vae, 120);
    tcase_add_test(vae, test_vae21_diffusers);
    tcase_add_test(vae, test_vae21_official);
    tcase_add_test(vae, test_vae22_diffusers);
    tcase_add_test(vae, test_vae22_official);
    tcase_add_test(vae, test_vae_image_and_chunks);
    tcase_add_test(vae, test_vae_tiled);
    tcase_add_test(vae, test_vae22_tiled);
    tcase_add_test(vae, test_vae_f32_prefix);
    tcase_add_test(vae, test_vae_bf16_inputs);
    tcase_add_test(vae, test_vae_file_errors);
    tcase_add_test(vae, test_vae_shape_errors);
    tcase_add_test(vae, test_vae_layouts);
    tcase_add_test(vae, test_cache_bytes);
    suite_add_tcase(s, vae);
    return tu_run_suite(s, false);
}
