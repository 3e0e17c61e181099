/* test_ops_cuda.c: the CUDA kernels of kernels/cuda/ other than GEMM and attention (casts and
 * random numbers, fills, copies, LayerNorm, RMSNorm, RoPE, patchify/unpatchify, activations,
 * elementwise ops, reductions and the MSE loss) against the CPU reference ops, through the
 * public ops of ops.h, on the same fresh random inputs.
 *
 * Every GPU output is poisoned with NaN first, so an element left unwritten fails. Float ops
 * are judged by the relative error norm ||gpu - cpu|| / ||cpu|| against per-op tolerances
 * (f32 outputs 1e-6 .. 1e-5; bf16 outputs 1e-2, a few bf16 roundings); the generator, fills,
 * copies, casts (stochastic rounding included) and the patch permutations must match bit for
 * bit, normals within one ulp (the device's f64 log/sin/cos may differ from libm in the last
 * f64 bit). Shapes include
 * odd sizes (scalar tails), misaligned views (the non-vector paths) and Wan2.2 A14B shapes:
 * 4096 tokens x dim 5120 for norms and elementwise ops with [1, 5120] modulation, RoPE on
 * [1, 4096, 40, 128] with f, h, w = 16, 16, 16, and the loss on [16, 21, 60, 104] latents.
 * Each case prints one line: op, shape, dtypes and error. GHC_TEST_SEED picks other inputs.
 *
 * The LoRA ops of K-concatenation (since API 8; group lora): lora_cast_bwd and lora_fwd
 * against the CPU op on the same inputs, both the tensor-core and the plain path; the cast and
 * the factors' copies bit for bit, the products within bf16 rounding, repeated calls bit for bit.
 *
 * Column views (since API 7; group column_views, attention and GEMM included): cast, copy,
 * layernorm_fwd, gelu_tanh and attention write into (cast and copy also read from) a view of
 * a wider tensor whose other columns hold a sentinel; the view's columns must hold the bits
 * of the same op's dense result on the GPU (or, for the fallback paths a view can select, be
 * within tolerance of it) and the sentinel must survive. GEMM with A and B views and an
 * epilogue is checked against the CPU reference.
 *
 * Model inputs (since API 14; group model_inputs): timestep_embedding within 1 ulp of the CPU
 * op (f64 pow/sin/cos on the device), pad_rows bit for bit.
 *
 * Exits 77 (automake SKIP) without a device; runs with CK_NOFORK (CUDA does not survive fork). */
#include <check.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gh200core/gh200core.h>
#include <gh200core/ops.h>

#include "../kernels/cuda/device.h"
#include "testutil.h"

#include "cuda_testutil.h"   /* defines: core, the test tensor pool, up/down, randn, expect_close, expect_bits */

/* Within `ulps` units in the last place (f32 or bf16 bit patterns as ordered integers). */
static int64_t ordered(const ghc_tensor_t *t, int64_t i)
{
    int64_t v;
    if (ghc_tensor_dtype(t) == F32) {
        int32_t u;
        memcpy(&u, (const float *)ghc_tensor_cdata(t) + i, 4);
        v = u;
        return v < 0 ? INT32_MIN - v : v;
    }
    int16_t h = ((const int16_t *)ghc_tensor_cdata(t))[i];
    v = h;
    return v < 0 ? INT16_MIN - v : v;
}

static void expect_ulps(const char *what, const ghc_tensor_t *g, const ghc_tensor_t *ref, int64_t ulps)
{
    ghc_tensor_t *got = down(g);
    int64_t n = ghc_tensor_numel(ref), off = 0, worst = 0, wi = 0, nonfinite = 0;
    for (int64_t i = 0; i < n; i++) {
        double a = get(got, i);
        if (!isfinite(a))
            nonfinite++;
        int64_t d = llabs(ordered(got, i) - ordered(ref, i));
        if (d) {
            off++;
            if (d > worst) {
                worst = d;
                wi = i;
            }
        }
    }
    char sh[96];
    shape_str(ref, sh, sizeof(sh));
    printf("  %-58s %-22s %s %" PRId64 " of %" PRId64 " differ, by <= %" PRId64 " ulp (allowed %" PRId64 ")\n", what, sh,
           dn(ghc_tensor_dtype(ref)), off, n, worst, ulps);
    fflush(stdout);
    ck_assert_msg(nonfinite == 0, "%s %s: %" PRId64 " non-finite values", what, sh, nonfinite);
    ck_assert_msg(worst <= ulps, "%s %s: element [%" PRId64 "] is %" PRId64 " ulp off: gpu %.9g cpu %.9g", what, sh, wi,
                  worst, get(got, wi), get(ref, wi));
}

/* ---- random numbers ----------------------------------------------------------------------- */

/* The CPU generator against the Random123 known answers (the GPU is compared with it below). */
START_TEST(philox_known_answers)
{
    static const struct {
        uint32_t ctr[4], key[2], out[4];
    } kat[] = {
        { { 0, 0, 0, 0 }, { 0, 0 }, { 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8 } },
        { { ~0u, ~0u, ~0u, ~0u }, { ~0u, ~0u }, { 0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd } },
        { { 0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344 }, { 0xa4093822, 0x299f31d0 },
          { 0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1 } },
    };
    for (size_t k = 0; k < sizeof(kat) / sizeof(*kat); k++) {
        uint32_t out[4];
        ghc_philox4x32(kat[k].ctr, kat[k].key, out);
        for (int l = 0; l < 4; l++)
            ck_assert_msg(out[l] == kat[k].out[l], "philox KAT %zu lane %d: 0x%08x, expected 0x%08x", k, l, out[l],
                          kat[k].out[l]);
    }
}
END_TEST

static const int64_t rng_sizes[] = { 1, 3, 4, 5, 1000, 4097, (1 << 20) + 3 };
static const struct ghc_rng rng_streams[] = {
    { 0, 0 },
    { 0xdeadbeefcafef00dull, 12345 },
    { 42, 0xfffffffeull },           /* block counters cross 2^32: the high counter word */
    { 7, 0x123456789abcull },
};

static void rand_cases(bool normal)
{
    enum ghc_dtype dts[] = { F32, BF16 };
    for (size_t d = 0; d < 2; d++)
        for (size_t s = 0; s < sizeof(rng_sizes) / sizeof(*rng_sizes); s++)
            for (size_t r = 0; r < sizeof(rng_streams) / sizeof(*rng_streams); r++) {
                int64_t n = rng_sizes[s];
                int mark = npool;
                ghc_tensor_t *c = mk(dts[d], CPUD, 1, &n);
                ghc_tensor_t *g = gout(c, dts[d], s == 5 && r == 1);   /* one misaligned case */
                OK(normal ? ghc_op_rand_normal(c, &rng_streams[r], NULL) : ghc_op_rand_uniform(c, &rng_streams[r], NULL));
                OK(normal ? ghc_op_rand_normal(g, &rng_streams[r], NULL) : ghc_op_rand_uniform(g, &rng_streams[r], NULL));
                char what[192];
                snprintf(what, sizeof(what), "%s seed %#" PRIx64 " offset %#" PRIx64, normal ? "rand_normal" : "rand_uniform",
                         rng_streams[r].seed, rng_streams[r].offset);
                if (normal)
                    expect_ulps(what, g, c, 1);
                else
                    expect_bits(what, g, c);
                pool_release(mark);
            }
}

START_TEST(rand_uniform_bits)
{
    rand_cases(false);
}
END_TEST

START_TEST(rand_normal_ulps)
{
    rand_cases(true);
}
END_TEST

/* Moments of a large GPU normal sample (summed on the host in f64): the stream is not
 * degenerate. */
START_TEST(rand_normal_moments)
{
    int64_t n = 1 << 22;
    ghc_tensor_t *g = mk(F32, 0, 1, &n);
    struct ghc_rng r = fresh_rng();
    OK(ghc_op_rand_normal(g, &r, NULL));
    ghc_tensor_t *c = down(g);
    double s1 = 0, s2 = 0;
    for (int64_t i = 0; i < n; i++) {
        double z = get(c, i);
        s1 += z;
        s2 += z * z;
    }
    double mean = s1 / (double)n, var = s2 / (double)n;
    printf("  rand_normal moments over %" PRId64 ": mean %.2e, E[z^2] %.5f\n", n, mean, var);
    ck_assert_msg(fabs(mean) < 5.0 / sqrt((double)n) && fabs(var - 1.0) < 5.0 * sqrt(2.0 / (double)n),
                  "normal moments off: mean %g, E[z^2] %g", mean, var);
}
END_TEST

/* ---- fill, copy, cast --------------------------------------------------------------------- */

static const enum ghc_dtype float_dts[] = { GHC_DTYPE_F32, GHC_DTYPE_BF16, GHC_DTYPE_F16, GHC_DTYPE_F8_E4M3,
                                            GHC_DTYPE_F8_E5M2 };
#define N_FLOAT_DTS 5

START_TEST(fill_bits)
{
    static const double values[] = { 0.0, -0.0, 1.5, -3.25, 1.0 / 3.0, 1e30, -70000.0, 1e-40, INFINITY, NAN };
    static const int64_t sizes[] = { 1, 7, 1000, 65537 };
    for (int d = 0; d < N_FLOAT_DTS; d++)
        for (size_t v = 0; v < sizeof(values) / sizeof(*values); v++)
            for (size_t s = 0; s < sizeof(sizes) / sizeof(*sizes); s++) {
                int mark = npool;
                ghc_tensor_t *c = mk(float_dts[d], CPUD, 1, &sizes[s]);
                ghc_tensor_t *g = gpu_like(c, float_dts[d], s == 3 && v == 2);
                OK(ghc_op_fill(c, values[v], NULL));
                OK(ghc_op_fill(g, values[v], NULL));
                char what[192];
                snprintf(what, sizeof(what), "fill %g", values[v]);
                if (sizes[s] == 65537 || v == 0)
                    expect_bits(what, g, c);
                else {   /* quietly: 200 cases */
                    ghc_tensor_t *got = down(g);
                    ck_assert_msg(!memcmp(ghc_tensor_cdata(got), ghc_tensor_cdata(c), ghc_tensor_nbytes(c)),
                                  "fill %g %s numel %" PRId64 ": GPU bytes differ from the CPU's", values[v],
                                  ghc_dtype_name(float_dts[d]), sizes[s]);
                }
                pool_release(mark);
            }
}
END_TEST

/* Random bytes: every bit pattern of the narrow formats, NaN and inf included. */
static ghc_tensor_t *random_bits(enum ghc_dtype dt, int64_t n)
{
    ghc_tensor_t *t = mk(dt, CPUD, 1, &n);
    size_t bytes = ghc_tensor_nbytes(t);
    unsigned char *p = ghc_tensor_data(t);
    struct ghc_rng r = fresh_rng();
    uint32_t key[2] = { (uint32_t)r.seed, (uint32_t)(r.seed >> 32) };
    for (size_t o = 0; o < bytes; o += 16) {
        uint32_t ctr[4] = { (uint32_t)(o / 16), (uint32_t)((uint64_t)o >> 36), 0, 0 }, out[4];
        ghc_philox4x32(ctr, key, out);
        memcpy(p + o, out, bytes - o < 16 ? bytes - o : 16);
    }
    return t;
}

START_TEST(copy_roundtrip)
{
    static const enum ghc_dtype dts[] = { GHC_DTYPE_F32, GHC_DTYPE_BF16, GHC_DTYPE_F8_E4M3, GHC_DTYPE_I64,
                                          GHC_DTYPE_U8 };
    for (size_t d = 0; d < sizeof(dts) / sizeof(*dts); d++) {
        ghc_tensor_t *c = random_bits(dts[d], 100003);
        ghc_tensor_t *g1 = up(c), *g2 = up_(c, true);
        if (ghc_dtype_is_float(dts[d]))
            poison(g2);
        OK(ghc_op_copy(g2, g1, NULL));   /* device to device */
        expect_bits("copy cpu -> gpu -> gpu -> cpu", g2, c);
    }
}
END_TEST

START_TEST(cast_bits)
{
    static const float scales[] = { 1.0f, 0.37f, 300.0f };
    const int64_t n = 100003;
    for (int s = 0; s < N_FLOAT_DTS; s++) {
        ghc_tensor_t *src = random_bits(float_dts[s], n);
        ghc_tensor_t *gsrc = up(src);
        for (int d = 0; d < N_FLOAT_DTS; d++)
            for (size_t k = 0; k < sizeof(scales) / sizeof(*scales); k++) {
                int mark = npool;
                ghc_tensor_t *ref = like(src, float_dts[d], CPUD);
                ghc_tensor_t *g = gpu_like(src, float_dts[d], d == 1 && k == 1);
                OK(ghc_op_cast(ref, src, scales[k], NULL, NULL));
                OK(ghc_op_cast(g, gsrc, scales[k], NULL, NULL));
                char what[192];
                snprintf(what, sizeof(what), "cast %s -> %s x %g", ghc_dtype_name(float_dts[s]),
                         ghc_dtype_name(float_dts[d]), (double)scales[k]);
                expect_bits(what, g, ref);
                pool_release(mark);
            }
    }
}
END_TEST

START_TEST(cast_stochastic_bits)
{
    static const float scales[] = { 1.0f, 0.37f };
    for (int s = 0; s < N_FLOAT_DTS; s++)
        for (size_t k = 0; k < 2; k++)
            for (size_t r = 0; r < sizeof(rng_streams) / sizeof(*rng_streams); r++) {
                int64_t n = r == 0 ? 5 : 100003;
                int mark = npool;
                /* finite random values at several scales, plus raw bit patterns (NaN, inf) */
                ghc_tensor_t *src = s <= 1 && r % 2 ? randn(float_dts[s], 1e3, 0, 1, &n) : random_bits(float_dts[s], n);
                ghc_tensor_t *gsrc = up(src);
                ghc_tensor_t *ref = like(src, BF16, CPUD), *g = gpu_like(src, BF16, r == 3);
                poison(g);
                OK(ghc_op_cast(ref, src, scales[k], &rng_streams[r], NULL));
                OK(ghc_op_cast(g, gsrc, scales[k], &rng_streams[r], NULL));
                char what[192];
                snprintf(what, sizeof(what), "cast %s -> BF16 x %g stochastic, seed %#" PRIx64,
                         ghc_dtype_name(float_dts[s]), (double)scales[k], rng_streams[r].seed);
                expect_bits(what, g, ref);
                pool_release(mark);
            }
}
END_TEST

/* Stochastic rounding is unbiased: x = 1 + 2^-10 (an eighth of a bf16 ulp above 1) rounds
 * up an eighth of the time, so the mean stays x (nearest-even rounding would give 1). The
 * mean is taken on the host in f64. */
START_TEST(cast_stochastic_unbiased)
{
    int64_t n = 1 << 22;
    ghc_tensor_t *x = mk(F32, 0, 1, &n), *y = mk(BF16, 0, 1, &n);
    const double want = 1.0 + ldexp(1.0, -10), ulp = ldexp(1.0, -7), p = 0.125;
    OK(ghc_op_fill(x, want, NULL));
    struct ghc_rng r = fresh_rng();
    OK(ghc_op_cast(y, x, 1.0f, &r, NULL));
    ghc_tensor_t *c = down(y);
    double sum = 0;
    for (int64_t i = 0; i < n; i++)
        sum += get(c, i);
    double mean = sum / (double)n, sd = ulp * sqrt(p * (1 - p) / (double)n);
    printf("  stochastic rounding of %.10f to bf16: mean %.10f (%.1f sd off)\n", want, mean, (mean - want) / sd);
    ck_assert_msg(fabs(mean - want) < 6 * sd, "stochastic rounding biased: mean %.10f, want %.10f", mean, want);
}
END_TEST

/* ---- LayerNorm ---------------------------------------------------------------------------- */

enum { AFFINE = 1, MODULATED = 2, STATS = 4, MISALIGNED = 8, PARAMS_BF16 = 16, ACCUMULATE = 32 };

static void layernorm_case(enum ghc_dtype xdt, enum ghc_dtype ydt, int nd, const int64_t *shape, int flags)
{
    int mark = npool;
    const float eps = 1e-6f;
    int64_t D = shape[nd - 1], B = shape[0], rows = 1;
    for (int i = 0; i < nd - 1; i++)
        rows *= shape[i];
    enum ghc_dtype pdt = flags & PARAMS_BF16 ? BF16 : F32;
    bool mis = flags & MISALIGNED;
    ghc_tensor_t *x = randn(xdt, 2.0, 0.5, nd, shape);
    ghc_tensor_t *w = NULL, *b = NULL, *sh = NULL, *sc = NULL, *gw = NULL, *gb = NULL, *gsh = NULL, *gsc = NULL;
    if (flags & AFFINE) {
        w = randn(pdt, 0.5, 1.0, 1, &D);
        b = randn(pdt, 0.3, 0.0, 1, &D);
        gw = up(w);
        gb = up(b);
    }
    if (flags & MODULATED) {
        /* [B, D] per sample (x [B, L, D]), else [D] */
        sh = nd >= 3 ? randn(pdt, 0.5, 0.0, SHP(B, D)) : randn(pdt, 0.5, 0.0, 1, &D);
        sc = nd >= 3 ? randn(pdt, 0.5, 0.0, SHP(B, D)) : randn(pdt, 0.5, 0.0, 1, &D);
        gsh = up(sh);
        gsc = up(sc);
    }
    ghc_tensor_t *y = like(x, ydt, CPUD), *st = mk(F32, CPUD, SHP(rows, 2));
    ghc_tensor_t *gx = up_(x, mis), *gy = gout(x, ydt, mis), *gst = NULL;
    if (flags & STATS) {
        gst = mk(F32, 0, SHP(rows, 2));
        poison(gst);
    }
    OK(ghc_op_layernorm_fwd(y, st, x, w, b, sh, sc, eps, NULL));
    OK(ghc_op_layernorm_fwd(gy, gst, gx, gw, gb, gsh, gsc, eps, NULL));
    char what[192];
    snprintf(what, sizeof(what), "layernorm_fwd x %s%s%s%s%s", dn(xdt), flags & AFFINE ? " affine" : "",
             flags & MODULATED ? " modulated" : "", flags & PARAMS_BF16 ? " (bf16 params)" : "", mis ? " misaligned" : "");
    expect_close(what, gy, y, ydt == F32 ? 1e-5 : 1e-2);
    if (gst) {
        snprintf(what, sizeof(what), "layernorm_fwd stats x %s", dn(xdt));
        expect_close(what, gst, st, 1e-5);
    }

    /* backward from the CPU's stats, into a dx of each dtype */
    ghc_tensor_t *dy = randn(ydt, 1.0, 0.0, nd, shape), *gdy = up_(dy, mis), *gst2 = up(st);
    for (int dxd = 0; dxd < 2; dxd++) {
        enum ghc_dtype dxdt = dxd ? BF16 : F32;
        bool acc = flags & ACCUMULATE;
        ghc_tensor_t *dx = acc ? randn(dxdt, 1.0, 0.0, nd, shape) : like(x, dxdt, CPUD);
        ghc_tensor_t *gdx = acc ? up_(dx, mis) : gout(x, dxdt, mis);
        OK(ghc_op_layernorm_bwd(dx, dy, x, st, w, sc, acc, NULL));
        OK(ghc_op_layernorm_bwd(gdx, gdy, gx, gst2, gw, gsc, acc, NULL));
        snprintf(what, sizeof(what), "layernorm_bwd x %s dy %s%s%s%s", dn(xdt), dn(ydt), flags & AFFINE ? " affine" : "",
                 flags & MODULATED ? " modulated" : "", acc ? " accumulate" : "");
        expect_close(what, gdx, dx, dxdt == F32 ? 1e-5 : 1e-2);
    }
    pool_release(mark);
}

START_TEST(layernorm_small)
{
    for (int xd = 0; xd < 2; xd++)
        for (int yd = 0; yd < 2; yd++) {
            enum ghc_dtype xdt = xd ? BF16 : F32, ydt = yd ? BF16 : F32;
            layernorm_case(xdt, ydt, SHP(2, 7, 64), STATS);
            layernorm_case(xdt, ydt, SHP(3, 5, 33), AFFINE | MODULATED | STATS);          /* odd D: scalar path */
            layernorm_case(xdt, ydt, SHP(2, 9, 96), AFFINE | MODULATED | PARAMS_BF16 | ACCUMULATE);
            layernorm_case(xdt, ydt, SHP(6, 40), MODULATED | STATS | MISALIGNED);          /* [D] modulation */
        }
    layernorm_case(F32, F32, SHP(3, 1), STATS);                                              /* D = 1 */
    layernorm_case(F32, F32, SHP(2, 3, 1000), AFFINE | MODULATED | STATS | ACCUMULATE);
}
END_TEST

/* Rows too long for the shared-memory cache (f32 forward > 12288, backward > 6144). */
START_TEST(layernorm_long_rows)
{
    layernorm_case(F32, F32, SHP(1, 5, 16384), AFFINE | MODULATED | STATS);
    layernorm_case(BF16, BF16, SHP(1, 3, 8192), MODULATED | STATS | ACCUMULATE);
    layernorm_case(F32, BF16, SHP(4, 12289), STATS);
}
END_TEST

/* Wan2.2 A14B: 4096 tokens x 5120, the modulated norms (shift/scale [1, 5120]) on the fp32
 * residual, the affine norm3, and bf16 in and out. */
START_TEST(layernorm_wan)
{
    layernorm_case(F32, F32, SHP(1, 4096, 5120), MODULATED | STATS);
    layernorm_case(F32, BF16, SHP(1, 4096, 5120), MODULATED | STATS | ACCUMULATE);
    layernorm_case(F32, F32, SHP(1, 4096, 5120), AFFINE | STATS);
    layernorm_case(BF16, BF16, SHP(1, 4096, 5120), MODULATED | PARAMS_BF16 | STATS);
}
END_TEST

/* ---- RMSNorm ------------------------------------------------------------------------------ */

static void rmsnorm_case(enum ghc_dtype xdt, enum ghc_dtype ydt, enum ghc_dtype wdt, int nd, const int64_t *shape,
                         bool mis)
{
    int mark = npool;
    const float eps = 1e-6f;
    int64_t D = shape[nd - 1], rows = 1;
    for (int i = 0; i < nd - 1; i++)
        rows *= shape[i];
    ghc_tensor_t *x = randn(xdt, 3.0, 0.2, nd, shape), *w = randn(wdt, 0.5, 1.0, 1, &D);
    ghc_tensor_t *y = like(x, ydt, CPUD), *rs = mk(F32, CPUD, 1, &rows);
    ghc_tensor_t *gx = up_(x, mis), *gw = up(w), *gy = gout(x, ydt, mis), *grs = mk(F32, 0, 1, &rows);
    poison(grs);
    OK(ghc_op_rmsnorm_fwd(y, rs, x, w, eps, NULL));
    OK(ghc_op_rmsnorm_fwd(gy, grs, gx, gw, eps, NULL));
    char what[192];
    snprintf(what, sizeof(what), "rmsnorm_fwd x %s w %s%s", dn(xdt), dn(wdt), mis ? " misaligned" : "");
    expect_close(what, gy, y, ydt == F32 ? 1e-5 : 1e-2);
    expect_close("rmsnorm_fwd rstd", grs, rs, 1e-5);
    /* rstd NULL is allowed */
    poison(gy);
    OK(ghc_op_rmsnorm_fwd(gy, NULL, gx, gw, eps, NULL));
    expect_close("rmsnorm_fwd (no rstd)", gy, y, ydt == F32 ? 1e-5 : 1e-2);

    ghc_tensor_t *dy = randn(ydt, 1.0, 0.0, nd, shape), *gdy = up_(dy, mis), *grs2 = up(rs);
    for (int dxd = 0; dxd < 2; dxd++) {
        enum ghc_dtype dxdt = dxd ? BF16 : F32;
        ghc_tensor_t *dx = like(x, dxdt, CPUD), *gdx = gout(x, dxdt, mis);
        OK(ghc_op_rmsnorm_bwd(dx, dy, x, rs, w, NULL));
        OK(ghc_op_rmsnorm_bwd(gdx, gdy, gx, grs2, gw, NULL));
        snprintf(what, sizeof(what), "rmsnorm_bwd x %s dy %s w %s", dn(xdt), dn(ydt), dn(wdt));
        expect_close(what, gdx, dx, dxdt == F32 ? 1e-5 : 1e-2);
    }
    pool_release(mark);
}

START_TEST(rmsnorm_small)
{
    for (int xd = 0; xd < 2; xd++)
        for (int yd = 0; yd < 2; yd++) {
            enum ghc_dtype xdt = xd ? BF16 : F32, ydt = yd ? BF16 : F32;
            rmsnorm_case(xdt, ydt, F32, SHP(3, 5, 64), false);
            rmsnorm_case(xdt, ydt, BF16, SHP(2, 3, 37), false);
            rmsnorm_case(xdt, ydt, F32, SHP(7, 128), true);
        }
    rmsnorm_case(F32, F32, F32, SHP(3, 16384), false);   /* no cache */
    rmsnorm_case(BF16, BF16, F32, SHP(2, 8192), false);  /* backward without cache */
}
END_TEST

/* Wan's q/k norms: RMSNorm over all 5120 features of 4096 tokens, bf16 activations. */
START_TEST(rmsnorm_wan)
{
    rmsnorm_case(BF16, BF16, F32, SHP(1, 4096, 5120), false);
    rmsnorm_case(BF16, BF16, BF16, SHP(1, 4096, 5120), false);
    rmsnorm_case(F32, F32, F32, SHP(1, 4096, 5120), false);
}
END_TEST

/* ---- RoPE --------------------------------------------------------------------------------- */

static void rope_case(enum ghc_dtype xdt, enum ghc_dtype ydt, int64_t B, int64_t f, int64_t h, int64_t w, int64_t H,
                      int64_t Dh, bool mis)
{
    int mark = npool;
    ghc_tensor_t *x = randn(xdt, 1.0, 0.0, SHP(B, f * h * w, H, Dh)), *gx = up_(x, mis);
    for (int inv = 0; inv < 2; inv++) {
        ghc_tensor_t *y = like(x, ydt, CPUD), *gy = gout(x, ydt, mis);
        OK(ghc_op_rope(y, x, f, h, w, inv, NULL));
        OK(ghc_op_rope(gy, gx, f, h, w, inv, NULL));
        char what[192];
        snprintf(what, sizeof(what), "rope%s x %s f,h,w %" PRId64 ",%" PRId64 ",%" PRId64 "%s", inv ? " inverse" : "",
                 dn(xdt), f, h, w, mis ? " misaligned" : "");
        expect_close(what, gy, y, ydt == F32 ? 1e-6 : 1e-2);
    }
    pool_release(mark);
}

START_TEST(rope_small)
{
    for (int xd = 0; xd < 2; xd++)
        for (int yd = 0; yd < 2; yd++) {
            enum ghc_dtype xdt = xd ? BF16 : F32, ydt = yd ? BF16 : F32;
            rope_case(xdt, ydt, 2, 2, 3, 4, 3, 12, false);     /* d_t 4, d_h = d_w = 4 */
            rope_case(xdt, ydt, 1, 3, 5, 2, 2, 128, false);    /* 44 / 42 / 42 */
            rope_case(xdt, ydt, 2, 1, 1, 7, 5, 16, true);      /* 8 / 4 / 4 */
        }
    rope_case(F32, F32, 1, 2, 2, 2, 1, 2, false);              /* Dh 2: all time */
    rope_case(F32, F32, 1, 4, 33, 60, 1, 128, false);          /* positions up to 59 */
}
END_TEST

/* RMSNorm with its RoPE (ghc_op_rmsnorm_rope_*) against the CPU's: 4- or 8-wide (fused kernels;
 * 8 for bf16 x where Dh allows) and not (D % 4 = 2: the two ops), forward and backward. */
static void rmsnorm_rope_case(enum ghc_dtype xdt, enum ghc_dtype ydt, int64_t B, int64_t f, int64_t h, int64_t w,
                              int64_t H, int64_t Dh)
{
    int mark = npool;
    const int64_t L = f * h * w, D = H * Dh, rows = B * L;
    ghc_tensor_t *x = randn(xdt, 2.0, 0.1, SHP(B, L, D)), *wt = randn(F32, 0.5, 1.0, 1, &D);
    ghc_tensor_t *y = like(x, ydt, CPUD), *rs = mk(F32, CPUD, 1, &rows);
    ghc_tensor_t *gx = up(x), *gw = up(wt), *gy = gout(x, ydt, false), *grs = mk(F32, 0, 1, &rows);
    OK(ghc_op_rmsnorm_rope_fwd(y, rs, x, wt, 1e-6f, H, f, h, w, NULL));
    OK(ghc_op_rmsnorm_rope_fwd(gy, grs, gx, gw, 1e-6f, H, f, h, w, NULL));
    char what[192];
    snprintf(what, sizeof(what), "rmsnorm_rope_fwd x %s y %s D %" PRId64, dn(xdt), dn(ydt), D);
    expect_close(what, gy, y, ydt == F32 ? 1e-5 : 1e-2);
    expect_close("rmsnorm_rope_fwd rstd", grs, rs, 1e-5);
    ghc_tensor_t *dy = randn(ydt, 1.0, 0.0, SHP(B, L, D)), *gdy = up(dy);
    ghc_tensor_t *dx = like(x, F32, CPUD), *gdx = gout(x, F32, false);
    OK(ghc_op_rmsnorm_rope_bwd(dx, dy, x, rs, wt, H, f, h, w, NULL));
    OK(ghc_op_rmsnorm_rope_bwd(gdx, gdy, gx, up(rs), gw, H, f, h, w, NULL));
    snprintf(what, sizeof(what), "rmsnorm_rope_bwd x %s dy %s D %" PRId64, dn(xdt), dn(ydt), D);
    expect_close(what, gdx, dx, 1e-4);
    expect_bits("rmsnorm_rope_bwd leaves dy", gdy, dy);
    pool_release(mark);
}

START_TEST(rmsnorm_rope_small)
{
    for (int yd = 0; yd < 2; yd++) {
        enum ghc_dtype ydt = yd ? BF16 : F32;
        rmsnorm_rope_case(F32, ydt, 2, 2, 3, 4, 3, 12);    /* 4-wide: fused */
        rmsnorm_rope_case(BF16, ydt, 1, 3, 5, 2, 2, 128);  /* bf16 x: 8-wide */
        rmsnorm_rope_case(BF16, ydt, 2, 2, 3, 4, 2, 12);   /* bf16 x, Dh 12: 4-wide */
        rmsnorm_rope_case(F32, ydt, 2, 1, 2, 3, 3, 6);     /* D 18: the two ops */
        rmsnorm_rope_case(BF16, ydt, 1, 2, 2, 2, 2, 6);    /* D 12 but Dh 6: the two ops */
    }
    rmsnorm_rope_case(F32, BF16, 1, 4, 16, 16, 40, 128);   /* Wan's heads, 1024 tokens */
    rmsnorm_rope_case(BF16, BF16, 1, 4, 16, 16, 40, 128);  /* the same from bf16 (block_qkv) */
}
END_TEST

/* In place (y = x), and inverse(rope(x)) = x. */
START_TEST(rope_in_place)
{
    ghc_tensor_t *x = randn(F32, 1.0, 0.0, SHP(1, 2 * 4 * 6, 4, 128));
    ghc_tensor_t *y = like(x, F32, CPUD), *g = up(x);
    OK(ghc_op_rope(y, x, 2, 4, 6, false, NULL));
    OK(ghc_op_rope(g, g, 2, 4, 6, false, NULL));
    expect_close("rope in place", g, y, 1e-6);
    OK(ghc_op_rope(g, g, 2, 4, 6, true, NULL));
    expect_close("rope then inverse rope = x", g, x, 1e-6);
}
END_TEST

/* Wan2.2 A14B self-attention q/k: [1, 4096, 40, 128], 16 x 16 x 16 latent tokens. */
START_TEST(rope_wan)
{
    rope_case(BF16, BF16, 1, 16, 16, 16, 40, 128, false);
    rope_case(F32, F32, 1, 16, 16, 16, 40, 128, false);
}
END_TEST

/* ---- activations -------------------------------------------------------------------------- */

static void unary_case(const char *op, enum ghc_dtype xdt, enum ghc_dtype ydt, int nd, const int64_t *shape, bool mis)
{
    int mark = npool;
    ghc_tensor_t *x = randn(xdt, 3.0, 0.0, nd, shape), *gx = up_(x, mis);
    ghc_tensor_t *y = like(x, ydt, CPUD), *gy = gout(x, ydt, mis);
    double tol = ydt == F32 ? 2e-6 : 1e-2;
    bool bwd = strstr(op, "_bwd") != NULL;
    ghc_tensor_t *dy = NULL, *gdy = NULL;
    if (bwd) {
        dy = randn(xdt, 1.0, 0.0, nd, shape);
        gdy = up_(dy, mis);
    }
    if (!strcmp(op, "gelu_tanh")) {
        OK(ghc_op_gelu_tanh(y, x, NULL));
        OK(ghc_op_gelu_tanh(gy, gx, NULL));
    } else if (!strcmp(op, "gelu_tanh_bwd")) {
        OK(ghc_op_gelu_tanh_bwd(y, dy, x, NULL));
        OK(ghc_op_gelu_tanh_bwd(gy, gdy, gx, NULL));
    } else if (!strcmp(op, "silu")) {
        OK(ghc_op_silu(y, x, NULL));
        OK(ghc_op_silu(gy, gx, NULL));
    } else if (!strcmp(op, "silu_bwd")) {
        OK(ghc_op_silu_bwd(y, dy, x, NULL));
        OK(ghc_op_silu_bwd(gy, gdy, gx, NULL));
    } else if (!strcmp(op, "scale")) {
        OK(ghc_op_scale(y, x, -0.375f, NULL));
        OK(ghc_op_scale(gy, gx, -0.375f, NULL));
        tol = ydt == F32 ? 1e-7 : 1e-2;
    } else {
        ck_abort_msg("unknown op %s", op);
    }
    char what[192];
    snprintf(what, sizeof(what), "%s x %s%s", op, dn(xdt), mis ? " misaligned" : "");
    expect_close(what, gy, y, tol);
    pool_release(mark);
}

static const char *const unary_ops[] = { "gelu_tanh", "gelu_tanh_bwd", "silu", "silu_bwd", "scale" };

START_TEST(activations_small)
{
    for (size_t o = 0; o < 5; o++)
        for (int xd = 0; xd < 2; xd++)
            for (int yd = 0; yd < 2; yd++) {
                enum ghc_dtype xdt = xd ? BF16 : F32, ydt = yd ? BF16 : F32;
                unary_case(unary_ops[o], xdt, ydt, SHP(1000003), false);   /* scalar tail */
                unary_case(unary_ops[o], xdt, ydt, SHP(3, 7, 64), true);
                unary_case(unary_ops[o], xdt, ydt, SHP(1), false);
            }
}
END_TEST

/* The FFN activations of A14B (4096 x 13824) and the time-path SiLU sizes. */
START_TEST(activations_wan)
{
    unary_case("gelu_tanh", BF16, BF16, SHP(4096, 13824), false);
    unary_case("gelu_tanh_bwd", BF16, BF16, SHP(4096, 13824), false);
    unary_case("gelu_tanh", F32, F32, SHP(1, 4096, 5120), false);
    unary_case("silu", F32, F32, SHP(1, 4096, 5120), false);
    unary_case("silu_bwd", F32, F32, SHP(1, 4096, 5120), false);
    unary_case("scale", F32, F32, SHP(1, 4096, 5120), false);
}
END_TEST

/* ---- binary ops and the gated residual ---------------------------------------------------- */

enum bshape { B_FULL, B_ROW, B_SAMPLE };

static ghc_tensor_t *bcast_operand(enum ghc_dtype dt, enum bshape bs, int nd, const int64_t *shape)
{
    switch (bs) {
    case B_ROW:    return randn(dt, 1.0, 0.5, 1, &shape[nd - 1]);
    case B_SAMPLE: return randn(dt, 1.0, 0.5, SHP(shape[0], shape[nd - 1]));
    default:       return randn(dt, 1.0, 0.0, nd, shape);
    }
}

static const char *bs_name(enum bshape bs) { return bs == B_ROW ? "b [D]" : bs == B_SAMPLE ? "b [B, D]" : "b full"; }

static void binary_case(bool mul, enum ghc_dtype ydt, enum ghc_dtype adt, enum ghc_dtype bdt, enum bshape bs, int nd,
                        const int64_t *shape, bool in_place, bool mis)
{
    int mark = npool;
    const float alpha = 0.75f, beta = -1.25f;
    ghc_tensor_t *a = randn(adt, 1.0, 0.0, nd, shape), *b = bcast_operand(bdt, bs, nd, shape);
    ghc_tensor_t *ga = up_(a, mis), *gb = up(b);
    ghc_tensor_t *y, *gy;
    if (in_place) {   /* y = a: the CPU works on its own copy of a */
        ck_assert_int_eq(ydt, adt);
        y = like(a, adt, CPUD);
        OK(ghc_op_copy(y, a, NULL));
        gy = ga;
        OK(mul ? ghc_op_mul(y, y, b, NULL) : ghc_op_add(y, y, b, alpha, beta, NULL));
        OK(mul ? ghc_op_mul(gy, gy, gb, NULL) : ghc_op_add(gy, gy, gb, alpha, beta, NULL));
    } else {
        y = like(a, ydt, CPUD);
        gy = gout(a, ydt, mis);
        OK(mul ? ghc_op_mul(y, a, b, NULL) : ghc_op_add(y, a, b, alpha, beta, NULL));
        OK(mul ? ghc_op_mul(gy, ga, gb, NULL) : ghc_op_add(gy, ga, gb, alpha, beta, NULL));
    }
    char what[192];
    snprintf(what, sizeof(what), "%s a %s %s %s%s%s", mul ? "mul" : "add", dn(adt), bs_name(bs), dn(bdt),
             in_place ? " in place" : "", mis ? " misaligned" : "");
    expect_close(what, gy, y, ydt == F32 ? 1e-6 : 1e-2);
    pool_release(mark);
}

START_TEST(binary_small)
{
    for (int m = 0; m < 2; m++)
        for (int bs = 0; bs < 3; bs++)
            for (int yd = 0; yd < 2; yd++)
                for (int ad = 0; ad < 2; ad++)
                    for (int bd = 0; bd < 2; bd++) {
                        enum ghc_dtype ydt = yd ? BF16 : F32, adt = ad ? BF16 : F32, bdt = bd ? BF16 : F32;
                        binary_case(m, ydt, adt, bdt, (enum bshape)bs, SHP(3, 5, 64), false, false);
                        binary_case(m, ydt, adt, bdt, (enum bshape)bs, SHP(2, 7, 33), false, false);   /* odd D */
                        binary_case(m, ydt, adt, bdt, (enum bshape)bs, SHP(2, 4, 64), false, true);
                    }
    binary_case(false, F32, F32, F32, B_FULL, SHP(1000003), true, false);
    binary_case(true, BF16, BF16, F32, B_ROW, SHP(5, 6, 128), true, false);
    binary_case(false, F32, F32, BF16, B_SAMPLE, SHP(4, 3, 2, 128), false, false);   /* 4-D a */
}
END_TEST

static void gated_case(enum ghc_dtype ydt, enum ghc_dtype gdt, enum bshape bs, bool gated, int nd, const int64_t *shape,
                       bool mis)
{
    int mark = npool;
    ghc_tensor_t *x = randn(F32, 1.0, 0.0, nd, shape), *y = randn(ydt, 1.0, 0.0, nd, shape);
    ghc_tensor_t *gate = gated ? bcast_operand(gdt, bs, nd, shape) : NULL;
    ghc_tensor_t *gx = up_(x, mis), *gy = up_(y, mis), *gg = gate ? up(gate) : NULL;
    ghc_tensor_t *gt = up_(x, mis);   /* into another tensor: the same bits as in place */
    OK(ghc_op_gated_residual_to(gt, gx, gy, gg, NULL));
    OK(ghc_op_gated_residual(x, y, gate, NULL));
    OK(ghc_op_gated_residual(gx, gy, gg, NULL));
    char what[192];
    expect_bits("gated_residual_to against in place", gt, down(gx));
    snprintf(what, sizeof(what), "gated_residual y %s gate %s%s", dn(ydt),
             gated ? (bs == B_ROW ? "[D]" : bs == B_SAMPLE ? "[B, D]" : "full") : "none", mis ? " misaligned" : "");
    expect_close(what, gx, x, 1e-6);
    pool_release(mark);
}

START_TEST(gated_residual_small)
{
    for (int yd = 0; yd < 2; yd++)
        for (int gd = 0; gd < 2; gd++)
            for (int bs = 0; bs < 3; bs++) {
                enum ghc_dtype ydt = yd ? BF16 : F32, gdt = gd ? BF16 : F32;
                gated_case(ydt, gdt, (enum bshape)bs, true, SHP(2, 5, 64), false);
                gated_case(ydt, gdt, (enum bshape)bs, true, SHP(3, 3, 17), false);
                gated_case(ydt, gdt, (enum bshape)bs, true, SHP(2, 4, 32), true);
            }
    gated_case(F32, F32, B_FULL, false, SHP(2, 5, 64), false);
    gated_case(BF16, F32, B_FULL, false, SHP(1001), true);
}
END_TEST

/* Wan2.2 A14B: x [1, 4096, 5120] f32 residual; modulation and gates [1, 5120] f32. */
START_TEST(elementwise_wan)
{
    const int64_t s[] = { 1, 4096, 5120 };
    gated_case(BF16, F32, B_SAMPLE, true, 3, s, false);
    gated_case(F32, F32, B_SAMPLE, true, 3, s, false);
    gated_case(BF16, F32, B_FULL, false, 3, s, false);
    binary_case(false, F32, F32, F32, B_SAMPLE, 3, s, false, false);
    binary_case(false, BF16, BF16, BF16, B_FULL, 3, s, false, false);
    binary_case(true, BF16, BF16, F32, B_SAMPLE, 3, s, false, false);
    binary_case(true, F32, F32, F32, B_FULL, 3, s, true, false);
}
END_TEST

/* ---- reductions and the loss -------------------------------------------------------------- */

/* |gpu - cpu| <= tol * sum |x| (the condition of the sum), for sum and mean. */
static void sum_case(enum ghc_dtype dt, int nd, const int64_t *shape, bool mis)
{
    int mark = npool;
    ghc_tensor_t *x = randn(dt, 1.0, 0.1, nd, shape), *gx = up_(x, mis);
    int64_t n = ghc_tensor_numel(x);
    double l1 = 0;
    for (int64_t i = 0; i < n; i++)
        l1 += fabs(get(x, i));
    for (int mean = 0; mean < 2; mean++) {
        ghc_tensor_t *o = mk(F32, CPUD, 1, (const int64_t[]){ 1 }), *go = mk(F32, 0, 1, (const int64_t[]){ 1 });
        poison(go);
        OK(mean ? ghc_op_mean(o, x, NULL) : ghc_op_sum(o, x, NULL));
        OK(mean ? ghc_op_mean(go, gx, NULL) : ghc_op_sum(go, gx, NULL));
        double g = get(down(go), 0), c = get(o, 0), scale = mean ? l1 / (double)n : l1;
        double err = fabs(g - c) / (scale > 0 ? scale : 1);
        char sh[96];
        shape_str(x, sh, sizeof(sh));
        printf("  %-58s %-22s %s gpu %.9g cpu %.9g err/cond %.2e (tol 1e-6)\n", mean ? "mean" : "sum", sh, dn(dt), g, c,
               err);
        ck_assert_msg(isfinite(g) && err <= 1e-6, "%s %s %s: gpu %.9g cpu %.9g (error %.3e of sum |x|)",
                      mean ? "mean" : "sum", sh, dn(dt), g, c, err);
    }
    pool_release(mark);
}

START_TEST(sum_mean)
{
    for (int d = 0; d < 2; d++) {
        enum ghc_dtype dt = d ? BF16 : F32;
        sum_case(dt, SHP(1), false);
        sum_case(dt, SHP(7), true);
        sum_case(dt, SHP(1000003), false);
        sum_case(dt, SHP(3, 5, 64), true);
        sum_case(dt, SHP(16, 21, 60, 104), false);   /* A14B latents */
    }
}
END_TEST

static void sum_rows_case(enum ghc_dtype xdt, enum ghc_dtype odt, int nd, const int64_t *shape, bool mis)
{
    int mark = npool;
    int64_t D = shape[nd - 1];
    ghc_tensor_t *x = randn(xdt, 1.0, 0.3, nd, shape), *gx = up_(x, mis);
    ghc_tensor_t *o = mk(odt, CPUD, 1, &D), *go = mk(odt, 0, 1, &D);
    poison(go);
    OK(ghc_op_sum_rows(o, x, NULL));
    OK(ghc_op_sum_rows(go, gx, NULL));
    char what[192];
    char sh[96];
    snprintf(what, sizeof(what), "sum_rows x %s %s%s", shape_str(x, sh, sizeof(sh)), dn(xdt), mis ? " misaligned" : "");
    expect_close(what, go, o, odt == F32 ? 1e-5 : 1e-2);
    pool_release(mark);
}

START_TEST(sum_rows)
{
    for (int xd = 0; xd < 2; xd++)
        for (int od = 0; od < 2; od++) {
            enum ghc_dtype xdt = xd ? BF16 : F32, odt = od ? BF16 : F32;
            sum_rows_case(xdt, odt, SHP(3, 5, 7), false);
            sum_rows_case(xdt, odt, SHP(100000, 3), true);
            sum_rows_case(xdt, odt, SHP(1, 70), false);
            sum_rows_case(xdt, odt, SHP(1, 4096, 5120), false);   /* bias gradients of A14B */
        }
}
END_TEST

static void mse_case(enum ghc_dtype pdt, enum ghc_dtype tdt, int gmode, int nd, const int64_t *shape, bool mis)
{
    int mark = npool;
    ghc_tensor_t *p = randn(pdt, 1.0, 0.0, nd, shape), *t = randn(tdt, 1.0, 0.2, nd, shape);
    ghc_tensor_t *gp = up_(p, mis), *gt = up(t);
    enum ghc_dtype gdt = gmode == 2 ? BF16 : F32;
    ghc_tensor_t *l = mk(F32, CPUD, 1, (const int64_t[]){ 1 }), *gl = mk(F32, 0, 1, (const int64_t[]){ 1 });
    ghc_tensor_t *g = gmode ? like(p, gdt, CPUD) : NULL, *gg = gmode ? gout(p, gdt, mis) : NULL;
    poison(gl);
    OK(ghc_op_mse_loss(l, g, p, t, NULL));
    OK(ghc_op_mse_loss(gl, gg, gp, gt, NULL));
    char what[192];
    char sh[96];
    shape_str(p, sh, sizeof(sh));
    snprintf(what, sizeof(what), "mse_loss %s pred %s target %s%s", sh, dn(pdt), dn(tdt), mis ? " misaligned" : "");
    expect_close(what, gl, l, 1e-5);
    if (gmode) {
        snprintf(what, sizeof(what), "mse_loss grad pred %s target %s%s", dn(pdt), dn(tdt), mis ? " misaligned" : "");
        expect_close(what, gg, g, gdt == F32 ? 1e-6 : 1e-2);
    }
    pool_release(mark);
}

START_TEST(mse_loss)
{
    for (int pd = 0; pd < 2; pd++)
        for (int td = 0; td < 2; td++)
            for (int gm = 0; gm < 3; gm++) {
                enum ghc_dtype pdt = pd ? BF16 : F32, tdt = td ? BF16 : F32;
                mse_case(pdt, tdt, gm, SHP(1), false);
                mse_case(pdt, tdt, gm, SHP(3, 5, 33), gm == 1);
                mse_case(pdt, tdt, gm, SHP(16, 21, 60, 104), false);   /* A14B latents */
            }
}
END_TEST

/* ---- patches ------------------------------------------------------------------------------ */

/* Patchify (lat + cond), its backward, unpatchify and its backward: permutations, so the GPU
 * must match the CPU bit for bit. ldt: the sources' dtype, rdt: the destinations'. */
static void patch_case(enum ghc_dtype ldt, enum ghc_dtype rdt, int64_t B, int64_t Cl, int64_t Cc, int64_t Co, int64_t F,
                       int64_t H, int64_t W, bool misaligned)
{
    int mark = npool;
    const int64_t L = F * (H / 2) * (W / 2), C = Cl + Cc;
    ghc_tensor_t *lat = randn(ldt, 1, 0, SHP(B, Cl, F, H, W)), *cond = Cc ? randn(ldt, 1, 0, SHP(B, Cc, F, H, W)) : NULL;
    ghc_tensor_t *head = randn(ldt, 1, 0, SHP(B, L, 4 * Co)), *dout = randn(ldt, 1, 0, SHP(B, Co, F, H, W));
    ghc_tensor_t *glat = up_(lat, misaligned), *gcond = cond ? up(cond) : NULL, *ghead = up_(head, misaligned);
    ghc_tensor_t *gdout = up(dout);
    ghc_tensor_t *rows = mk(rdt, CPUD, SHP(B, L, 4 * C)), *grows = gout(rows, rdt, misaligned);
    ghc_tensor_t *dlat = like(lat, rdt, CPUD), *gdlat = gout(dlat, rdt, misaligned);
    ghc_tensor_t *out = like(dout, rdt, CPUD), *gout_ = gout(out, rdt, misaligned);
    ghc_tensor_t *drows = like(head, rdt, CPUD), *gdrows = gout(drows, rdt, false);
    ghc_tensor_t *grows_src = gpu_like(rows, rdt, false);   /* patchify_bwd reads the CPU's rows on both sides */
    OK(ghc_op_patchify(rows, lat, cond, NULL));
    OK(ghc_op_patchify(grows, glat, gcond, NULL));
    OK(ghc_op_copy(grows_src, rows, NULL));
    sync0();
    OK(ghc_op_patchify_bwd(dlat, rows, NULL));
    OK(ghc_op_patchify_bwd(gdlat, grows_src, NULL));
    OK(ghc_op_unpatchify(out, head, NULL));
    OK(ghc_op_unpatchify(gout_, ghead, NULL));
    OK(ghc_op_unpatchify_bwd(drows, dout, NULL));
    OK(ghc_op_unpatchify_bwd(gdrows, gdout, NULL));
    char what[192];
    snprintf(what, sizeof(what), "patchify %s + %" PRId64 " cond -> %s%s", dn(ldt), Cc, dn(rdt),
             misaligned ? " misaligned" : "");
    expect_bits(what, grows, rows);
    snprintf(what, sizeof(what), "patchify_bwd %s -> %s%s", dn(rdt), dn(rdt), misaligned ? " misaligned" : "");
    expect_bits(what, gdlat, dlat);
    snprintf(what, sizeof(what), "unpatchify %s -> %s%s", dn(ldt), dn(rdt), misaligned ? " misaligned" : "");
    expect_bits(what, gout_, out);
    snprintf(what, sizeof(what), "unpatchify_bwd %s -> %s", dn(ldt), dn(rdt));
    expect_bits(what, gdrows, drows);
    pool_release(mark);
}

START_TEST(patches_small)
{
    static const enum ghc_dtype dts[] = { F32, BF16 };
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++) {
            patch_case(dts[a], dts[b], 2, 3, 0, 3, 3, 6, 10, false);    /* odd F, H/2, W/2, C */
            patch_case(dts[a], dts[b], 1, 3, 5, 7, 1, 2, 2, true);      /* one token, concatenation */
            patch_case(dts[a], dts[b], 2, 16, 20, 16, 3, 6, 4, false);  /* I2V channels */
        }
}
END_TEST

START_TEST(patches_wan)
{
    patch_case(F32, F32, 1, 16, 20, 16, 21, 60, 104, false);   /* A14B I2V: 32760 tokens x 144 */
    patch_case(BF16, F32, 1, 48, 0, 48, 21, 44, 80, false);    /* 5B TI2V channels */
}
END_TEST

/* ---- model inputs (since API 14) ------------------------------------------------------------ */

/* timestep_embedding: f64 angles and CUDA's f64 pow/sincos against the C library's, so within
 * 1 ulp of the CPU op's f32 (rarely off at all); t from 0 to 1000 and a few fixed values. */
static void timestep_case(enum ghc_dtype tdt, int64_t B, int64_t dim, bool cos_first, double max_period)
{
    int mark = npool;
    ghc_tensor_t *t = mk(tdt, CPUD, SHP(B));
    struct ghc_rng r = fresh_rng();
    OK(ghc_op_rand_uniform(t, &r, NULL));
    static const double fixed[] = { 0.0, 1.0, 999.0, 1000.0, 500.0, 0.5 };
    for (int64_t b = 0; b < B; b++)
        set(t, b, b < 6 ? fixed[b] : 1000.0 * get(t, b));
    ghc_tensor_t *out = mk(F32, CPUD, SHP(B, dim)), *gt = up(t), *gout_ = gout(out, F32, false);
    OK(ghc_op_timestep_embedding(out, t, cos_first, max_period, NULL));
    OK(ghc_op_timestep_embedding(gout_, gt, cos_first, max_period, NULL));
    char what[160];
    snprintf(what, sizeof(what), "timestep_embedding t %s, %s first, max_period %g", dn(tdt),
             cos_first ? "cos" : "sin", max_period);
    expect_ulps(what, gout_, out, 1);
    pool_release(mark);
}

/* pad_rows: loads and stores only, so bit for bit; masks with 0, -0, NaN and other values. */
static void pad_rows_case(enum ghc_dtype xdt, enum ghc_dtype ydt, enum ghc_dtype mdt, int64_t B, int64_t Lx, int64_t Ly,
                          int64_t D, bool masked)
{
    int mark = npool;
    ghc_tensor_t *x = randn(xdt, 1, 0, SHP(B, Lx, D)), *mask = masked ? mk(mdt, CPUD, SHP(B, Lx)) : NULL;
    for (int64_t i = 0; masked && i < B * Lx; i++)
        set(mask, i, i % 7 == 3 ? 0.0 : i % 11 == 5 ? -0.0 : i % 13 == 1 ? NAN : i % 5 == 0 ? 0.25 : 1.0);
    ghc_tensor_t *y = mk(ydt, CPUD, SHP(B, Ly, D)), *gx = up(x), *gm = mask ? up(mask) : NULL;
    ghc_tensor_t *gy = gout(y, ydt, false);
    OK(ghc_op_pad_rows(y, x, mask, NULL));
    OK(ghc_op_pad_rows(gy, gx, gm, NULL));
    char what[160];
    snprintf(what, sizeof(what), "pad_rows %s -> %s, %" PRId64 " of %" PRId64 " rows%s%s", dn(xdt), dn(ydt), Lx, Ly,
             masked ? ", mask " : "", masked ? dn(mdt) : "");
    expect_bits(what, gy, y);
    pool_release(mark);
}

START_TEST(timestep_embedding_cases)
{
    timestep_case(F32, 64, 256, true, 10000.0);    /* Wan: freq_dim 256, cos first */
    timestep_case(F32, 1, 256, true, 10000.0);     /* the trainer's batch of one */
    timestep_case(BF16, 9, 33, false, 100.0);      /* odd dim, sin first, bf16 t */
}
END_TEST

START_TEST(pad_rows_cases)
{
    static const enum ghc_dtype dts[] = { F32, BF16 };
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++) {
            pad_rows_case(dts[a], dts[b], F32, 2, 7, 12, 5, false);
            pad_rows_case(dts[a], dts[b], dts[a], 3, 9, 9, 6, true);
            pad_rows_case(dts[a], dts[b], BF16, 2, 5, 16, 3, true);
        }
    pad_rows_case(F32, BF16, F32, 1, 300, 512, 4096, true);   /* Wan: umt5 rows into 512 x 4096 */
}
END_TEST

/* ---- column views (since API 7) ----------------------------------------------------------- */

#define SENTINEL 12345.0

/* A CPU tensor of dtype dt shaped like t but pad columns wider: SENTINEL everywhere, except
 * that with `fill` columns [col0, col0 + D) hold the bits of t (dt must be t's dtype). */
static ghc_tensor_t *widen(const ghc_tensor_t *t, enum ghc_dtype dt, int64_t col0, int64_t pad, bool fill)
{
    const int nd = ghc_tensor_ndim(t);
    int64_t sh[GHC_TENSOR_MAX_DIMS];
    memcpy(sh, ghc_tensor_shape(t), (size_t)nd * sizeof(int64_t));
    const int64_t D = sh[nd - 1], ld = D + pad;
    sh[nd - 1] = ld;
    ghc_tensor_t *w = mk(dt, CPUD, nd, sh);
    for (int64_t i = 0; i < ghc_tensor_numel(w); i++)
        set(w, i, SENTINEL);
    if (fill) {
        const size_t es = ghc_dtype_size(dt);
        for (int64_t r = 0; r < ghc_tensor_numel(t) / D; r++)
            memcpy((char *)ghc_tensor_data(w) + (size_t)(r * ld + col0) * es,
                   (const char *)ghc_tensor_cdata(t) + (size_t)(r * D) * es, (size_t)D * es);
    }
    return w;
}

/* The view of columns [col0, col0 + D) of the GPU copy of widen(t, ...); *gparent gets the
 * wide GPU tensor. */
static ghc_tensor_t *gview(const ghc_tensor_t *t, enum ghc_dtype dt, int64_t col0, int64_t pad, bool fill,
                           ghc_tensor_t **gparent)
{
    *gparent = up(widen(t, dt, col0, pad, fill));
    ghc_tensor_t *v = ghc_tensor_view_cols(*gparent, col0, ghc_tensor_dim(t, -1));
    ck_assert_msg(v != NULL, "view: %s", ghc_error_message(core));
    return keep(v);
}

/* The GPU view v of gparent (from gview) holds the bits of the dense `want` (GPU or CPU), and
 * every other element of gparent is still SENTINEL. */
static void expect_view_bits(const char *what, const ghc_tensor_t *gparent, const ghc_tensor_t *v,
                             const ghc_tensor_t *want)
{
    ghc_tensor_t *p = down(gparent), *w = ghc_tensor_device(want) == CPUD ? (ghc_tensor_t *)want : down(want);
    const size_t es = ghc_dtype_size(ghc_tensor_dtype(p));
    const int64_t D = ghc_tensor_dim(v, -1), ld = ghc_tensor_row_stride(v);
    const int64_t col0 = ((const char *)ghc_tensor_cdata(v) - (const char *)ghc_tensor_cdata(gparent)) / (int64_t)es;
    const double sentinel = ghc_tensor_dtype(p) == F32 ? SENTINEL : ghc_bf16_to_f32(ghc_f32_to_bf16((float)SENTINEL));
    const char *pp = ghc_tensor_cdata(p), *wp = ghc_tensor_cdata(w);
    int64_t diff = 0, first = -1, outside = 0, ofirst = -1;
    ck_assert(ghc_tensor_dtype(w) == ghc_tensor_dtype(p) && ghc_tensor_numel(w) == ghc_tensor_numel(v));
    for (int64_t i = 0; i < ghc_tensor_numel(p); i++) {
        const int64_t r = i / ld, j = i % ld - col0;
        if (j >= 0 && j < D) {
            if (memcmp(pp + (size_t)i * es, wp + (size_t)(r * D + j) * es, es) && diff++ == 0)
                first = i;
        } else if (get(p, i) != sentinel && outside++ == 0) {
            ofirst = i;
        }
    }
    char sh[96];
    shape_str(v, sh, sizeof(sh));
    printf("  %-58s %-22s %s %s\n", what, sh, ghc_dtype_name(ghc_tensor_dtype(p)),
           diff || outside ? "DIFFERENT" : "bit-identical, other columns kept");
    fflush(stdout);
    ck_assert_msg(outside == 0, "%s %s: %" PRId64 " elements outside the view changed; first row %" PRId64 " column %" PRId64
                  " = %g", what, sh, outside, ofirst / ld, ofirst % ld, get(p, ofirst));
    ck_assert_msg(diff == 0, "%s %s: %" PRId64 " of %" PRId64 " view elements differ from the dense result; first row %"
                  PRId64 " column %" PRId64 ": %.9g, dense %.9g", what, sh, diff, ghc_tensor_numel(v), first / ld,
                  first % ld - col0, get(p, first), get(w, first / ld * D + first % ld - col0));
}

/* The columns of GPU view v compared with the dense GPU `want` within tol (fallback paths). */
static void expect_view_close(const char *what, const ghc_tensor_t *v, const ghc_tensor_t *want, double tol)
{
    ghc_tensor_t *d = gout(v, ghc_tensor_dtype(v), false);
    OK(ghc_op_copy(d, v, NULL));
    expect_close(what, d, down(want), tol);
}

/* cast f32 -> bf16, bf16 -> bf16 and bf16 -> f32 into a view, from a view and view to view,
 * aligned and not, against the CPU's dense cast bit for bit. */
START_TEST(views_cast)
{
    static const enum ghc_dtype dts[3][2] = { { F32, BF16 }, { BF16, BF16 }, { BF16, F32 } };
    for (int p = 0; p < 3; p++)
        for (int a = 0; a < 2; a++) {
            int mark = npool;
            const enum ghc_dtype sd = dts[p][0], dd = dts[p][1];
            const int64_t col0 = a ? 3 : 8, pad = a ? 5 : 24;
            ghc_tensor_t *src = randn(sd, 100.0, 0.0, SHP(3, 37, 40)), *want = like(src, dd, CPUD), *gp, *gs;
            OK(ghc_op_cast(want, src, 0.5f, NULL, NULL));
            ghc_tensor_t *dv = gview(src, dd, col0, pad, false, &gp);
            OK(ghc_op_cast(dv, up(src), 0.5f, NULL, NULL));
            char what[160];
            snprintf(what, sizeof(what), "cast %s -> %s into a view (col %" PRId64 ")", dn(sd), dn(dd), col0);
            expect_view_bits(what, gp, dv, want);
            ghc_tensor_t *sv = gview(src, sd, col0 + 1, pad, true, &gs), *g = gout(src, dd, a);
            OK(ghc_op_cast(g, sv, 0.5f, NULL, NULL));
            snprintf(what, sizeof(what), "cast %s -> %s from a view (col %" PRId64 ")", dn(sd), dn(dd), col0 + 1);
            expect_bits(what, g, want);
            dv = gview(src, dd, col0, pad, false, &gp);
            OK(ghc_op_cast(dv, sv, 0.5f, NULL, NULL));
            snprintf(what, sizeof(what), "cast %s -> %s view to view", dn(sd), dn(dd));
            expect_view_bits(what, gp, dv, want);
            ghc_tensor_t *flat = mk(dd, 0, SHP(3 * 37 * 40));   /* dense, another shape: element by element */
            OK(ghc_op_cast(flat, up(src), 0.5f, NULL, NULL));
            snprintf(what, sizeof(what), "cast %s -> %s to another dense shape", dn(sd), dn(dd));
            expect_bits(what, flat, want);
            pool_release(mark);
        }
}
END_TEST

/* copy device to device, host to device and device to host into a view, from a view and view
 * to view (cudaMemcpy2DAsync): the source's bits. */
START_TEST(views_copy)
{
    static const enum ghc_dtype dts[2] = { F32, BF16 };
    for (int d = 0; d < 2; d++) {
        int mark = npool;
        ghc_tensor_t *src = randn(dts[d], 1.0, 0.0, SHP(5, 33, 24)), *gsrc = up(src), *gp, *gs;
        ghc_tensor_t *dv = gview(src, dts[d], 5, 11, false, &gp);
        OK(ghc_op_copy(dv, gsrc, NULL));
        expect_view_bits("copy gpu -> gpu view", gp, dv, src);
        dv = gview(src, dts[d], 2, 3, false, &gp);
        OK(ghc_op_copy(dv, src, NULL));
        expect_view_bits("copy cpu -> gpu view", gp, dv, src);
        ghc_tensor_t *sv = gview(src, dts[d], 7, 9, true, &gs), *g = gout(src, dts[d], true);
        OK(ghc_op_copy(g, sv, NULL));
        expect_bits("copy gpu view -> gpu", g, src);
        ghc_tensor_t *h = like(src, dts[d], CPUD);
        OK(ghc_op_copy(h, sv, NULL));
        expect_bits("copy gpu view -> cpu", up(h), src);
        ghc_tensor_t *hp = widen(src, dts[d], 1, 4, true), *hv = keep(ghc_tensor_view_cols(hp, 1, 24));
        g = gout(src, dts[d], false);
        OK(ghc_op_copy(g, hv, NULL));
        expect_bits("copy cpu view -> gpu", g, src);
        dv = gview(src, dts[d], 0, 1, false, &gp);
        OK(ghc_op_copy(dv, sv, NULL));
        expect_view_bits("copy gpu view -> gpu view", gp, dv, src);
        g = mk(dts[d], 0, SHP(5 * 33 * 24));
        OK(ghc_op_copy(g, gsrc, NULL));
        expect_bits("copy gpu -> gpu of another dense shape", g, src);
        pool_release(mark);
    }
}
END_TEST

/* layernorm_fwd (affine, [B, D] modulation) into a view y: the bits of the dense y of the same
 * path (aligned view: 4-wide; misaligned: scalar, like a misaligned dense y) and the same
 * stats; also a Wan row (5120) into columns 0..5119 of a K-concatenated [.., 5120 + 64]. */
static void views_layernorm_case(enum ghc_dtype xdt, enum ghc_dtype ydt, int nd, const int64_t *shape, int64_t col0,
                                 int64_t pad)
{
    int mark = npool;
    const int64_t D = shape[nd - 1], B = shape[0];
    int64_t rows = 1;
    for (int i = 0; i < nd - 1; i++)
        rows *= shape[i];
    const bool mis = (col0 % 4) || (pad % 4);
    ghc_tensor_t *x = randn(xdt, 2.0, 0.5, nd, shape), *gx = up(x);
    ghc_tensor_t *gw = up(randn(F32, 0.5, 1.0, 1, &D)), *gb = up(randn(BF16, 0.3, 0.0, 1, &D));
    ghc_tensor_t *gsh = up(randn(F32, 0.5, 0.0, SHP(B, D))), *gsc = up(randn(F32, 0.5, 0.0, SHP(B, D)));
    ghc_tensor_t *gy = gout(x, ydt, mis), *gst = mk(F32, 0, SHP(rows, 2)), *gst2 = mk(F32, 0, SHP(rows, 2)), *gp;
    OK(ghc_op_layernorm_fwd(gy, gst, gx, gw, gb, gsh, gsc, 1e-6f, NULL));
    ghc_tensor_t *yv = gview(x, ydt, col0, pad, false, &gp);
    OK(ghc_op_layernorm_fwd(yv, gst2, gx, gw, gb, gsh, gsc, 1e-6f, NULL));
    char what[160];
    snprintf(what, sizeof(what), "layernorm_fwd x %s into a view (col %" PRId64 ", +%" PRId64 ")", dn(xdt), col0, pad);
    expect_view_bits(what, gp, yv, gy);
    expect_bits("layernorm_fwd stats with a view y", gst2, down(gst));
    pool_release(mark);
}

START_TEST(views_layernorm)
{
    for (int xd = 0; xd < 2; xd++)
        for (int yd = 0; yd < 2; yd++) {
            enum ghc_dtype xdt = xd ? BF16 : F32, ydt = yd ? BF16 : F32;
            views_layernorm_case(xdt, ydt, SHP(2, 50, 96), 8, 24);
            views_layernorm_case(xdt, ydt, SHP(2, 50, 96), 3, 5);
            views_layernorm_case(xdt, ydt, SHP(3, 7, 33), 4, 4);   /* odd D: scalar */
        }
    views_layernorm_case(F32, BF16, SHP(1, 256, 5120), 0, 64);
    views_layernorm_case(F32, F32, SHP(1, 64, 16384), 16, 16);     /* no row cache */
}
END_TEST

/* gelu_tanh into a view y (4-wide where aligned, scalar otherwise): the dense y's bits. */
START_TEST(views_gelu)
{
    static const int64_t cols[][3] = { { 1000, 8, 24 }, { 1000, 1, 3 }, { 13, 2, 5 }, { 13824, 0, 64 } };
    for (int xd = 0; xd < 2; xd++)
        for (int yd = 0; yd < 2; yd++)
            for (int c = 0; c < 4; c++) {
                int mark = npool;
                const enum ghc_dtype xdt = xd ? BF16 : F32, ydt = yd ? BF16 : F32;
                const int64_t rows = c == 3 ? 512 : 37;
                ghc_tensor_t *x = randn(xdt, 3.0, 0.0, SHP(1, rows, cols[c][0])), *gx = up(x), *gp;
                ghc_tensor_t *gy = gout(x, ydt, false), *yv = gview(x, ydt, cols[c][1], cols[c][2], false, &gp);
                OK(ghc_op_gelu_tanh(gy, gx, NULL));
                OK(ghc_op_gelu_tanh(yv, gx, NULL));
                char what[160];
                snprintf(what, sizeof(what), "gelu_tanh x %s into a view (col %" PRId64 ", +%" PRId64 ")", dn(xdt),
                         cols[c][1], cols[c][2]);
                expect_view_bits(what, gp, yv, gy);
                pool_release(mark);
            }
}
END_TEST

/* attention_fwd with o [B, Lq, H Dh], dense and a view: the bits of o [B, Lq, H, Dh] where the
 * path is the same (f32; bf16 with 16-byte token rows), else (bf16, a view of odd stride: the
 * fp32 fallback) within bf16 tolerance; attention_bwd with o a view: the 4-D o's dk and dv bit
 * for bit, dq (fp32 atomics) within 1e-2 (bf16) and bit for bit (f32). */
static void views_attention_case(enum ghc_dtype dt, int64_t B, int64_t Lq, int64_t Lk, int64_t H, int64_t Dh)
{
    int mark = npool;
    const float scale = 1.0f / sqrtf((float)Dh);
    const bool bf = dt == BF16;
    ghc_tensor_t *gq = up(randn(dt, 1.0, 0.0, SHP(B, Lq, H, Dh))), *gk = up(randn(dt, 1.0, 0.0, SHP(B, Lk, H, Dh)));
    ghc_tensor_t *gv = up(randn(dt, 1.0, 0.0, SHP(B, Lk, H, Dh))), *gdo = up(randn(dt, 1.0, 0.0, SHP(B, Lq, H, Dh)));
    ghc_tensor_t *o3 = mk(dt, CPUD, SHP(B, Lq, H * Dh));
    ghc_tensor_t *go4 = gout(gq, dt, false), *go3 = gout(o3, dt, false), *glse = mk(F32, 0, SHP(B, H, Lq));
    ghc_tensor_t *glse2 = mk(F32, 0, SHP(B, H, Lq)), *gp, *gp2;
    OK(ghc_op_attention_fwd(go4, glse, gq, gk, gv, scale, NULL));
    OK(ghc_op_attention_fwd(go3, glse2, gq, gk, gv, scale, NULL));
    char what[192], sh[64];
    snprintf(sh, sizeof(sh), "B %" PRId64 " Lq %" PRId64 " Lk %" PRId64 " H %" PRId64 " Dh %" PRId64, B, Lq, Lk, H, Dh);
    snprintf(what, sizeof(what), "attention_fwd o 3-D dense, %s", sh);
    expect_bits(what, go3, down(go4));
    expect_bits("attention_fwd lse, o 3-D dense", glse2, down(glse));
    ghc_tensor_t *ov = gview(o3, dt, 8, 16, false, &gp);   /* token rows 16-byte aligned */
    OK(ghc_op_attention_fwd(ov, glse2, gq, gk, gv, scale, NULL));
    snprintf(what, sizeof(what), "attention_fwd o a view, %s", sh);
    expect_view_bits(what, gp, ov, go4);
    expect_bits("attention_fwd lse, o a view", glse2, down(glse));
    ghc_tensor_t *ov2 = gview(o3, dt, 3, 5, false, &gp2);  /* odd stride: fp32 fallback for bf16 */
    OK(ghc_op_attention_fwd(ov2, glse2, gq, gk, gv, scale, NULL));
    snprintf(what, sizeof(what), "attention_fwd o a view of odd stride, %s", sh);
    if (bf)
        expect_view_close(what, ov2, go4, 2e-2);
    else
        expect_view_bits(what, gp2, ov2, go4);

    ghc_tensor_t *g[3][3];
    const ghc_tensor_t *os[3] = { go4, ov, ov2 };
    for (int f = 0; f < 3; f++) {
        for (int j = 0; j < 3; j++)
            g[f][j] = gout(j ? gk : gq, dt, false);
        OK(ghc_op_attention_bwd(g[f][0], g[f][1], g[f][2], gdo, gq, gk, gv, os[f], glse, scale, NULL));
    }
    static const char *const names[3] = { "dq", "dk", "dv" };
    for (int f = 1; f < 3; f++)
        for (int j = 0; j < 3; j++) {
            snprintf(what, sizeof(what), "attention_bwd %s, o a view%s, %s", names[j], f == 2 ? " of odd stride" : "",
                     sh);
            if (bf && (j == 0 || f == 2))
                expect_close(what, g[f][j], down(g[0][j]), j == 0 && f == 1 ? 1e-2 : 2e-2);
            else
                expect_bits(what, g[f][j], down(g[0][j]));
        }
    pool_release(mark);
}

START_TEST(views_attention)
{
    views_attention_case(BF16, 2, 100, 77, 3, 64);
    views_attention_case(BF16, 1, 130, 200, 2, 128);   /* Hopper: the wgmma kernels */
    views_attention_case(BF16, 2, 40, 33, 2, 32);
    views_attention_case(F32, 2, 20, 33, 2, 32);
}
END_TEST

/* gemm with A and B column views (a K-concatenated linear layer: x [2, 64, 96] of [2, 64, 160],
 * W [80, 96] of [80, 128]) and the BIAS (fused, and unfused with a bias of the other dtype) and
 * BIAS_GELU (+ pre_gelu) epilogues, against the CPU's gemm on dense copies. */
START_TEST(views_gemm_epilogue)
{
    for (int d = 0; d < 2; d++)
        for (int e = 0; e < 3; e++) {
            int mark = npool;
            const enum ghc_dtype dt = d ? BF16 : F32, bdt = e == 1 ? (d ? F32 : BF16) : dt;
            const enum ghc_epilogue epi = e == 2 ? GHC_EPI_BIAS_GELU : GHC_EPI_BIAS;
            ghc_tensor_t *a = randn(dt, 1.0, 0.0, SHP(2, 64, 96)), *b = randn(dt, 0.1, 0.0, SHP(80, 96));
            ghc_tensor_t *bias = randn(bdt, 1.0, 0.0, SHP(80)), *c = mk(dt, CPUD, SHP(2, 64, 80)), *gpa, *gpb;
            ghc_tensor_t *pre = e == 2 ? mk(dt, CPUD, SHP(2, 64, 80)) : NULL;
            struct ghc_gemm g = { .trans_b = true, .alpha = 0.75f, .epilogue = epi, .bias = bias, .pre_gelu = pre };
            OK(ghc_op_gemm(c, a, b, &g, NULL));
            ghc_tensor_t *av = gview(a, dt, 32, 64, true, &gpa), *bv = gview(b, dt, 16, 32, true, &gpb);
            ghc_tensor_t *gc = gout(c, dt, false), *gpre = pre ? gout(pre, dt, false) : NULL;
            g.bias = up(bias);
            g.pre_gelu = gpre;
            OK(ghc_op_gemm(gc, av, bv, &g, NULL));
            char what[160];
            snprintf(what, sizeof(what), "gemm %s, A and B views, %s (bias %s)", dn(dt),
                     e == 2 ? "BIAS_GELU" : "BIAS", dn(bdt));
            expect_close(what, gc, c, dt == F32 ? 1e-5 : 2e-2);
            if (gpre)
                expect_close("gemm pre_gelu, A and B views", gpre, pre, dt == F32 ? 1e-5 : 2e-2);
            pool_release(mark);
        }
}
END_TEST

/* ---- LoRA in K-concatenated GEMMs (since API 8) ------------------------------------------------ */

/* The GPU tensor `got` (any shape) holds the bits of the CPU tensor `want`, both read through
 * dense copies (either may be a column view). */
static void expect_bits_dense(const char *what, const ghc_tensor_t *got, const ghc_tensor_t *want)
{
    ghc_tensor_t *g = gout(want, ghc_tensor_dtype(want), false), *w = like(want, ghc_tensor_dtype(want), CPUD);
    OK(ghc_op_copy(g, got, NULL));
    OK(ghc_op_copy(w, want, NULL));
    expect_bits(what, g, w);
}

/* dy [.., M] f32 cast into the first M columns of a [.., M + pad] (wan22's cast with spare
 * columns), dh into r of the spare columns, h from a view, db accumulating, scale 0.5, and A
 * (f32 [r, 40]) into a view of a weight's spare rows: against the CPU op on the same inputs, g
 * and the A copy bit for bit, dh and db within tolerance (another order of sums); the spare
 * columns past r keep their sentinel; a second call gives the same bits (the partial sums add in
 * a fixed order). misaligned: dy one element into a larger buffer (the plain path). */
static void lora_bwd_case(enum ghc_dtype dt, int nd, const int64_t *shape, int64_t r, int64_t pad, bool misaligned)
{
    const int mark = npool;
    ghc_tensor_t *dy = randn(F32, 1.0, 0.0, nd, shape);
    const int64_t M = ghc_tensor_dim(dy, -1), Nr = ghc_tensor_numel(dy) / M;
    int64_t hs[GHC_TENSOR_MAX_DIMS];
    memcpy(hs, shape, (size_t)nd * sizeof(int64_t));
    hs[nd - 1] = r;
    ghc_tensor_t *hd = randn(dt, 0.5, 0.0, nd, hs), *b = randn(F32, 0.05, 0.0, SHP(M, r));
    ghc_tensor_t *db0 = randn(F32, 1.0, 0.0, SHP(M, r)), *gshape = like(dy, dt, CPUD), *a = randn(F32, 0.1, 0.0, SHP(r, 40));
    /* CPU */
    ghc_tensor_t *cp = widen(gshape, dt, 0, pad, false), *hcp = widen(hd, dt, 2, 14, true), *dbc = like(db0, F32, CPUD);
    ghc_tensor_t *gvc = keep(ghc_tensor_view_cols(cp, 0, M)), *dhc = keep(ghc_tensor_view_cols(cp, M, r));
    ghc_tensor_t *hvc = keep(ghc_tensor_view_cols(hcp, 2, r)), *wc = widen(a, dt, 0, 16, false);
    ghc_tensor_t *wvc = keep(ghc_tensor_view_cols(wc, 0, 40));
    OK(ghc_op_copy(dbc, db0, NULL));
    OK(ghc_op_lora_cast_bwd(gvc, dhc, dbc, dy, hvc, b, 0.5f, wvc, a, NULL));
    ghc_tensor_t *dhwant = like(hd, dt, CPUD);
    OK(ghc_op_copy(dhwant, dhc, NULL));
    /* GPU, twice */
    ghc_tensor_t *gdy = up_(dy, misaligned), *ghp, *gb = up(b), *ga = up(a), *dh1 = NULL, *db1 = NULL;
    ghc_tensor_t *ghv = gview(hd, dt, 2, 14, true, &ghp);
    char sh[96], what[200];
    shape_str(dy, sh, sizeof(sh));
    for (int pass = 0; pass < 2; pass++) {
        ghc_tensor_t *gp, *gv = gview(gshape, dt, 0, pad, false, &gp), *gdh = keep(ghc_tensor_view_cols(gp, M, r));
        ghc_tensor_t *gdb = up(db0), *dh = gout(hd, dt, false), *wp, *wv = gview(a, dt, 0, 16, false, &wp);
        OK(ghc_op_lora_cast_bwd(gv, gdh, gdb, gdy, ghv, gb, 0.5f, wv, ga, NULL));
        OK(ghc_op_copy(dh, gdh, NULL));
        if (pass == 1) {
            snprintf(what, sizeof(what), "lora_cast_bwd dh again %s r %" PRId64, sh, r);
            expect_bits(what, dh, down(dh1));
            snprintf(what, sizeof(what), "lora_cast_bwd db again %s r %" PRId64, sh, r);
            expect_bits(what, gdb, down(db1));
            break;
        }
        dh1 = dh;
        db1 = gdb;
        snprintf(what, sizeof(what), "lora_cast_bwd g %s%s", dn(dt), misaligned ? " misaligned dy" : "");
        expect_bits_dense(what, gv, gvc);
        snprintf(what, sizeof(what), "lora_cast_bwd dh r %" PRId64 " pad %" PRId64, r, pad);
        expect_close(what, dh, dhwant, dt == BF16 ? 4e-3 : 1e-5);
        snprintf(what, sizeof(what), "lora_cast_bwd db r %" PRId64, r);
        expect_close(what, gdb, dbc, 1e-5);
        ghc_tensor_t *awant = like(a, dt, CPUD);
        OK(ghc_op_cast(awant, a, 1.0f, NULL, NULL));
        expect_view_bits("lora_cast_bwd a into spare rows", wp, wv, awant);
        ghc_tensor_t *p = down(gp);
        const double sentinel = dt == F32 ? SENTINEL : ghc_bf16_to_f32(ghc_f32_to_bf16((float)SENTINEL));
        int64_t changed = 0;
        for (int64_t i = 0; i < Nr * (M + pad); i++)
            if (i % (M + pad) >= M + r && get(p, i) != sentinel)
                changed++;
        ck_assert_msg(changed == 0, "lora_cast_bwd %s: %" PRId64 " spare columns past r changed", sh, changed);
    }
    pool_release(mark);
}

/* The tensor-core path (bf16, r <= 16): tails in rows and columns (300 rows, 1040 columns: two
 * 512-column strips and 16), 3-D, r below 16, many row strips, a Wan-sized output gradient;
 * the plain path: M not a multiple of 4, f32, a misaligned dy, r above 16. */
START_TEST(lora_cast_bwd_cases)
{
    lora_bwd_case(BF16, SHP(300, 1040), 16, 16, false);
    lora_bwd_case(BF16, SHP(2, 150, 1040), 5, 16, false);
    lora_bwd_case(BF16, SHP(4100, 520), 16, 16, false);
    lora_bwd_case(BF16, SHP(1, 4096, 5120), 16, 16, false);
    lora_bwd_case(BF16, SHP(50, 22), 3, 16, false);
    lora_bwd_case(F32, SHP(40, 24), 4, 16, false);
    lora_bwd_case(BF16, SHP(70, 64), 16, 16, true);
    lora_bwd_case(BF16, SHP(64, 64), 20, 32, false);
}
END_TEST

/* x [.., K] from a view (as wan22's input with spare columns), h = 0.5 x a^T into that input's
 * spare columns, keep, B (f32 [96, r]) into a weight's spare columns, against the CPU op: h and
 * keep within tolerance (another order of sums), keep the bits of h, the B copy bit for bit,
 * x's columns and the other spare columns untouched; twice, the same bits; then h from keep.
 * misaligned: x one element into its buffer's row (the plain path). */
static void lora_fwd_case(enum ghc_dtype dt, int nd, const int64_t *shape, int64_t r, bool misaligned)
{
    const int mark = npool;
    ghc_tensor_t *x = randn(dt, 1.0, 0.0, nd, shape);
    const int64_t K = ghc_tensor_dim(x, -1), Nr = ghc_tensor_numel(x) / K, col0 = misaligned ? 1 : 0, pad = 48;
    int64_t hs[GHC_TENSOR_MAX_DIMS];
    memcpy(hs, shape, (size_t)nd * sizeof(int64_t));
    hs[nd - 1] = r;
    ghc_tensor_t *a = randn(F32, 0.05, 0.0, SHP(r, K)), *b = randn(F32, 0.1, 0.0, SHP(96, r));
    ghc_tensor_t *hshape = like(randn(dt, 1.0, 0.0, nd, hs), dt, CPUD);
    /* CPU */
    ghc_tensor_t *xc = widen(x, dt, col0, pad, true), *xvc = keep(ghc_tensor_view_cols(xc, col0, K));
    ghc_tensor_t *hvc = keep(ghc_tensor_view_cols(xc, col0 + K + 3, r)), *kc = like(hshape, dt, CPUD);
    ghc_tensor_t *wc = widen(b, dt, 0, 16, false), *wvc = keep(ghc_tensor_view_cols(wc, 16, r));
    OK(ghc_op_lora_fwd(hvc, kc, xvc, a, 0.5f, wvc, b, NULL));
    /* GPU, twice */
    ghc_tensor_t *ga = up(a), *gb = up(b), *k1 = NULL;
    char sh[96], what[200];
    shape_str(x, sh, sizeof(sh));
    for (int pass = 0; pass < 2; pass++) {
        ghc_tensor_t *gxp = up(xc), *gxv = keep(ghc_tensor_view_cols(gxp, col0, K));
        ghc_tensor_t *ghv = keep(ghc_tensor_view_cols(gxp, col0 + K + 3, r)), *gk = gout(hshape, dt, false);
        ghc_tensor_t *gwp = up(widen(b, dt, 0, 16, false)), *gwv = keep(ghc_tensor_view_cols(gwp, 16, r));
        OK(ghc_op_lora_fwd(ghv, gk, gxv, ga, 0.5f, gwv, gb, NULL));
        if (pass == 1) {
            snprintf(what, sizeof(what), "lora_fwd h again %s r %" PRId64, sh, r);
            expect_bits(what, gk, down(k1));
            break;
        }
        k1 = gk;
        snprintf(what, sizeof(what), "lora_fwd h %s r %" PRId64 "%s", dn(dt), r, misaligned ? " misaligned x" : "");
        expect_close(what, gk, kc, dt == BF16 ? 4e-3 : 1e-5);
        expect_bits_dense("lora_fwd keep = h", ghv, down(gk));
        expect_bits_dense("lora_fwd b into spare columns", gwv, wvc);
        ghc_tensor_t *p = down(gxp);   /* x and the spare columns but h's: as before */
        int64_t changed = 0;
        const int64_t ld = K + pad;
        for (int64_t i = 0; i < Nr * ld; i++) {
            const int64_t c = i % ld;
            const bool in_h = c >= col0 + K + 3 && c < col0 + K + 3 + r;
            if (!in_h && memcmp((const char *)ghc_tensor_cdata(p) + (size_t)i * ghc_dtype_size(dt),
                                (const char *)ghc_tensor_cdata(xc) + (size_t)i * ghc_dtype_size(dt), ghc_dtype_size(dt)))
                changed++;
        }
        ck_assert_msg(changed == 0, "lora_fwd %s: %" PRId64 " elements of x's buffer outside h changed", sh, changed);
        ghc_tensor_t *g2 = gout(hshape, dt, false);   /* h from keep */
        OK(ghc_op_lora_fwd(g2, gk, NULL, NULL, 1.0f, NULL, NULL, NULL));
        expect_bits("lora_fwd h from keep", g2, down(gk));
    }
    pool_release(mark);
}

/* The tensor-core path (bf16, r <= 16): rows not a multiple of 32, K split unevenly over the
 * warps (5120 + 8), 3-D, r 5, Wan's 13824; the plain path: f32, r above 16, misaligned x. */
START_TEST(lora_fwd_cases)
{
    lora_fwd_case(BF16, SHP(300, 5128), 16, false);
    lora_fwd_case(BF16, SHP(2, 45, 1024), 5, false);
    lora_fwd_case(BF16, SHP(4096, 5120), 16, false);
    lora_fwd_case(BF16, SHP(130, 13824), 16, false);
    lora_fwd_case(F32, SHP(40, 24), 4, false);
    lora_fwd_case(BF16, SHP(33, 64), 20, false);
    lora_fwd_case(BF16, SHP(70, 64), 8, true);
}
END_TEST

/* ---- main --------------------------------------------------------------------------------- */

int main(void)
{
    int rc = cuda_suite_start();
    if (rc)
        return rc;
    char name[256];
    int major = 0, minor = 0;
    size_t fr = 0, tot = 0;
    if (ghc_k_device_info(0, name, sizeof(name), &major, &minor, &fr, &tot) == 0)
        printf("device 0: %s, sm_%d%d; GHC_TEST_SEED=%" PRIu64 "\n", name, major, minor, seed_base);
    const struct cuda_group groups[] = {
        { "random", { philox_known_answers, rand_uniform_bits, rand_normal_ulps, rand_normal_moments } },
        { "memory_cast", { fill_bits, copy_roundtrip, cast_bits, cast_stochastic_bits, cast_stochastic_unbiased } },
        { "layernorm", { layernorm_small, layernorm_long_rows, layernorm_wan } },
        { "rmsnorm", { rmsnorm_small, rmsnorm_wan } },
        { "rope", { rope_small, rope_in_place, rope_wan, rmsnorm_rope_small } },
        { "patches", { patches_small, patches_wan } },
        { "elementwise", { activations_small, activations_wan, binary_small, gated_residual_small, elementwise_wan } },
        { "reduce", { sum_mean, sum_rows, mse_loss } },
        { "column_views", { views_cast, views_copy, views_layernorm, views_gelu, views_attention, views_gemm_epilogue } },
        { "lora", { lora_cast_bwd_cases, lora_fwd_cases } },
        { "model_inputs", { timestep_embedding_cases, pad_rows_cases } },
    };
    return cuda_suite_run("ops_cuda", groups, sizeof(groups) / sizeof(groups[0]));
}
