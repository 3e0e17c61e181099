/* test_gemm_attn_cuda.c: the CUDA GEMM (cuBLASLt) and attention (flash-style kernels, and
 * cuDNN's fused attention where libcudnn.so.9 loads) against the CPU reference ops on the same
 * inputs, through the public ops of ops.h. The attention cases run once on our kernels and once
 * on cuDNN's path, and check which path ran.
 *
 * Every GPU output is poisoned with NaN before the op, so an element left unwritten fails the
 * comparison. The measure is the relative error norm ||gpu - ref|| / ||ref|| with per-dtype
 * tolerances (f32 1e-5; bf16 2e-2, which covers bf16 rounding of outputs and of P and dS in the
 * flash kernels). Large shapes (Wan2.2 A14B: 4096 tokens, dim 5120, ffn 13824, 40 heads x 128)
 * are checked on a subset of rows or heads to keep the CPU time low.
 *
 * Exits 77 (automake SKIP) without a device; runs with CK_NOFORK (CUDA does not survive fork). */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gh200core/gh200core.h>
#include <gh200core/ops.h>

#include "../kernels/cuda/device.h"
#include "../kernels/cuda/kernels.h"
#include "testutil.h"

#define TOL_F32 1e-5
#define TOL_BF16 2e-2
#define TOL_FP8 2e-2

static ghc_core_t *core;
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

/* ---- helpers ------------------------------------------------------------------------------ */

static double urand(void)   /* [0, 1), xorshift64* */
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 2685821657736338717ull) >> 11) * (1.0 / 9007199254740992.0);
}

static ghc_tensor_t *mk(enum ghc_dtype dt, int device, int ndim, const int64_t *shape)
{
    ghc_tensor_t *t = ghc_tensor_init(core, dt, ndim, shape, device, GHC_ROLE_ACTIVATIONS);
    ck_assert_msg(t != NULL, "tensor: %s", ghc_error_message(core));
    return t;
}
#define SHAPE(...) (int)(sizeof((int64_t[]){ __VA_ARGS__ }) / sizeof(int64_t)), (const int64_t[]){ __VA_ARGS__ }
#define CPU(dt, ...) mk(dt, GHC_DEVICE_CPU, SHAPE(__VA_ARGS__))
#define GPU(dt, ...) mk(dt, 0, SHAPE(__VA_ARGS__))

static float getf(const ghc_tensor_t *t, int64_t i)
{
    const void *p = ghc_tensor_cdata(t);
    switch (ghc_tensor_dtype(t)) {
    case GHC_DTYPE_F32: return ((const float *)p)[i];
    case GHC_DTYPE_BF16: return ghc_bf16_to_f32(((const uint16_t *)p)[i]);
    case GHC_DTYPE_F8_E4M3: return ghc_e4m3_to_f32(((const uint8_t *)p)[i]);
    default: ck_abort_msg("dtype %s", ghc_dtype_name(ghc_tensor_dtype(t)));
    }
    return 0;
}

static void setf(ghc_tensor_t *t, int64_t i, float v)
{
    void *p = ghc_tensor_data(t);
    switch (ghc_tensor_dtype(t)) {
    case GHC_DTYPE_F32: ((float *)p)[i] = v; break;
    case GHC_DTYPE_BF16: ((uint16_t *)p)[i] = ghc_f32_to_bf16(v); break;
    case GHC_DTYPE_F8_E4M3: ((uint8_t *)p)[i] = ghc_f32_to_e4m3(v); break;
    default: ck_abort_msg("dtype %s", ghc_dtype_name(ghc_tensor_dtype(t)));
    }
}

/* Uniform in [-amp, amp). */
static void fill_rand(ghc_tensor_t *t, float amp)
{
    int64_t n = ghc_tensor_numel(t);
    for (int64_t i = 0; i < n; i++)
        setf(t, i, (float)((2.0 * urand() - 1.0) * amp));
}

static void ok(int rc)
{
    ck_assert_msg(rc == 0, "op failed (%d): %s", rc, ghc_error_message(core));
}

static void sync0(void) { ok(ghc_op_sync(core, 0, NULL)); }

/* A GPU copy of a CPU tensor. */
static ghc_tensor_t *up(const ghc_tensor_t *c)
{
    ghc_tensor_t *g = mk(ghc_tensor_dtype(c), 0, ghc_tensor_ndim(c), ghc_tensor_shape(c));
    ok(ghc_op_copy(g, c, NULL));
    return g;
}

/* A CPU copy of a GPU tensor (synchronised). */
static ghc_tensor_t *down(const ghc_tensor_t *g)
{
    ghc_tensor_t *c = mk(ghc_tensor_dtype(g), GHC_DEVICE_CPU, ghc_tensor_ndim(g), ghc_tensor_shape(g));
    ok(ghc_op_copy(c, g, NULL));
    sync0();
    return c;
}

static void poison(ghc_tensor_t *g) { ok(ghc_op_fill(g, NAN, NULL)); }

/* ||got - ref|| / ||ref|| over elements [0, n) of both; a NaN anywhere fails. */
static double rel_err_n(const ghc_tensor_t *got, int64_t got_off, const ghc_tensor_t *ref, int64_t ref_off,
                        int64_t n, const char *what)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double a = getf(got, got_off + i), b = getf(ref, ref_off + i);
        ck_assert_msg(!isnan(a) && !isinf(a), "%s: element %lld is %g (unwritten or broken), ref %g", what,
                      (long long)i, a, b);
        num += (a - b) * (a - b);
        den += b * b;
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void expect_close(const ghc_tensor_t *got_gpu, const ghc_tensor_t *ref, double tol, const char *what)
{
    ghc_tensor_t *got = down(got_gpu);
    ck_assert_int_eq(ghc_tensor_numel(got), ghc_tensor_numel(ref));
    double e = rel_err_n(got, 0, ref, 0, ghc_tensor_numel(ref), what);
    printf("  %-58s rel err %.2e (tol %.0e)\n", what, e, tol);
    ck_assert_msg(e <= tol, "%s: relative error %g > %g", what, e, tol);
    ghc_tensor_free(got);
}

static double tol_of(enum ghc_dtype dt) { return dt == GHC_DTYPE_F32 ? TOL_F32 : TOL_BF16; }

/* ---- GEMM --------------------------------------------------------------------------------- */

/* One GEMM on both devices from the same random inputs; a, b shapes as stored. */
static void gemm_case(enum ghc_dtype dt_ab, enum ghc_dtype dt_c, int nda, const int64_t *sa, int ndb,
                      const int64_t *sb, int ndc, const int64_t *sc, struct ghc_gemm args, enum ghc_dtype dt_bias,
                      const char *what)
{
    ghc_tensor_t *a = mk(dt_ab, GHC_DEVICE_CPU, nda, sa), *b = mk(dt_ab, GHC_DEVICE_CPU, ndb, sb);
    ghc_tensor_t *c = mk(dt_c, GHC_DEVICE_CPU, ndc, sc);
    fill_rand(a, 1.0f);
    fill_rand(b, 1.0f);
    fill_rand(c, 1.0f);   /* the old C (counts when beta != 0) */
    int64_t N = sc[ndc - 1];
    ghc_tensor_t *bias = NULL, *pre = NULL, *gbias = NULL, *gpre = NULL;
    if (args.epilogue != GHC_EPI_NONE) {
        bias = mk(dt_bias, GHC_DEVICE_CPU, 1, &N);
        fill_rand(bias, 1.0f);
        gbias = up(bias);
    }
    ghc_tensor_t *ga = up(a), *gb = up(b), *gc = up(c);
    if (args.beta == 0.0f)
        poison(gc);
    if (args.pre_gelu) {   /* the caller sets pre_gelu to any non-NULL value to ask for it */
        pre = mk(dt_c, GHC_DEVICE_CPU, ndc, sc);
        gpre = mk(dt_c, 0, ndc, sc);
        poison(gpre);
    }
    struct ghc_gemm ca = args, ga_args = args;
    ca.bias = bias;
    ca.pre_gelu = pre;
    ga_args.bias = gbias;
    ga_args.pre_gelu = gpre;
    ok(ghc_op_gemm(c, a, b, &ca, NULL));
    ok(ghc_op_gemm(gc, ga, gb, &ga_args, NULL));
    double tol = dt_ab == GHC_DTYPE_F8_E4M3 ? TOL_FP8 : tol_of(dt_c);
    if (dt_ab == GHC_DTYPE_F32 && dt_c == GHC_DTYPE_F32)
        tol = TOL_F32;
    expect_close(gc, c, tol, what);
    if (pre) {
        char w[200];
        snprintf(w, sizeof(w), "%s pre_gelu", what);
        expect_close(gpre, pre, tol, w);
    }
    ghc_tensor_free(a);
    ghc_tensor_free(b);
    ghc_tensor_free(c);
    ghc_tensor_free(ga);
    ghc_tensor_free(gb);
    ghc_tensor_free(gc);
    ghc_tensor_free(bias);
    ghc_tensor_free(gbias);
    ghc_tensor_free(pre);
    ghc_tensor_free(gpre);
}

START_TEST(gemm_transposes)
{
    const enum ghc_dtype dts[] = { GHC_DTYPE_F32, GHC_DTYPE_BF16 };
    const int64_t M = 67, N = 45, K = 83;
    for (int d = 0; d < 2; d++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                int64_t sa[2] = { ta ? K : M, ta ? M : K }, sb[2] = { tb ? N : K, tb ? K : N }, sc[2] = { M, N };
                struct ghc_gemm g = { .trans_a = ta, .trans_b = tb };
                char w[128];
                snprintf(w, sizeof(w), "gemm %s %lldx%lldx%lld trans_a=%d trans_b=%d", ghc_dtype_name(dts[d]),
                         (long long)M, (long long)N, (long long)K, ta, tb);
                gemm_case(dts[d], dts[d], 2, sa, 2, sb, 2, sc, g, GHC_DTYPE_F32, w);
            }
    /* bf16 operands, f32 output; and alpha */
    struct ghc_gemm g = { .trans_b = true, .alpha = 0.75f };
    gemm_case(GHC_DTYPE_BF16, GHC_DTYPE_F32, 2, (const int64_t[]){ 128, 96 }, 2, (const int64_t[]){ 80, 96 }, 2,
              (const int64_t[]){ 128, 80 }, g, GHC_DTYPE_F32, "gemm bf16 -> f32 alpha 0.75");
}
END_TEST

START_TEST(gemm_batched)
{
    const enum ghc_dtype dts[] = { GHC_DTYPE_F32, GHC_DTYPE_BF16 };
    for (int d = 0; d < 2; d++) {
        enum ghc_dtype dt = dts[d];
        char w[128];
        /* shared weight B [N, K] (nn.Linear) with batched x: folds into one GEMM */
        snprintf(w, sizeof(w), "gemm %s batch 3, shared weight B^T", ghc_dtype_name(dt));
        gemm_case(dt, dt, 3, (const int64_t[]){ 3, 40, 64 }, 2, (const int64_t[]){ 48, 64 }, 3,
                  (const int64_t[]){ 3, 40, 48 }, (struct ghc_gemm){ .trans_b = true }, GHC_DTYPE_F32, w);
        /* shared A with batched B (stride 0 on A) */
        snprintf(w, sizeof(w), "gemm %s batch 3, shared A", ghc_dtype_name(dt));
        gemm_case(dt, dt, 2, (const int64_t[]){ 40, 64 }, 3, (const int64_t[]){ 3, 64, 48 }, 3,
                  (const int64_t[]){ 3, 40, 48 }, (struct ghc_gemm){ 0 }, GHC_DTYPE_F32, w);
        /* batched A^T with shared B (no fold: stride 0 on B) */
        snprintf(w, sizeof(w), "gemm %s batch 4, A^T batched, shared B", ghc_dtype_name(dt));
        gemm_case(dt, dt, 3, (const int64_t[]){ 4, 64, 40 }, 2, (const int64_t[]){ 64, 24 }, 3,
                  (const int64_t[]){ 4, 40, 24 }, (struct ghc_gemm){ .trans_a = true }, GHC_DTYPE_F32, w);
        /* both batched, both transposed */
        snprintf(w, sizeof(w), "gemm %s batch 2, both batched, A^T B^T", ghc_dtype_name(dt));
        gemm_case(dt, dt, 3, (const int64_t[]){ 2, 32, 40 }, 3, (const int64_t[]){ 2, 56, 32 }, 3,
                  (const int64_t[]){ 2, 40, 56 }, (struct ghc_gemm){ .trans_a = true, .trans_b = true },
                  GHC_DTYPE_F32, w);
    }
}
END_TEST

/* gemm on column views (ghc_tensor_view_cols) of wider device tensors, as K-concatenation and
 * slices of a wider output use them: A B^T with a batched A [3, 40, 64] from columns 16..79 of
 * [3, 40, 96] (the shared-weight fold) and B [48, 64] from a [48, 80] weight; A^T B with A
 * [3, 64, 40] from columns 8..47 of [3, 64, 56] and B [64, 48] from a [64, 80]; C [3, 40, 48]
 * written into columns 8..55 of [3, 40, 64] with beta. Against the CPU on the same views (which
 * test_ops_cpu checks against dense copies); C's other columns keep their bits. */
START_TEST(gemm_column_views)
{
    const enum ghc_dtype dts[] = { GHC_DTYPE_F32, GHC_DTYPE_BF16 };
    for (int d = 0; d < 2; d++)
        for (int t = 0; t < 2; t++) {
            const bool tr = t == 1;
            ghc_tensor_t *xa = tr ? CPU(dts[d], 3, 64, 56) : CPU(dts[d], 3, 40, 96);
            ghc_tensor_t *xb = tr ? CPU(dts[d], 64, 80) : CPU(dts[d], 48, 80), *xc = CPU(GHC_DTYPE_F32, 3, 40, 64);
            fill_rand(xa, 1.0f);
            fill_rand(xb, 1.0f);
            fill_rand(xc, 1.0f);
            ghc_tensor_t *ga = up(xa), *gb = up(xb), *gc = up(xc);
            ghc_tensor_t *v[6] = {
                tr ? ghc_tensor_view_cols(xa, 8, 40) : ghc_tensor_view_cols(xa, 16, 64),
                tr ? ghc_tensor_view_cols(xb, 16, 48) : ghc_tensor_view_cols(xb, 16, 64), ghc_tensor_view_cols(xc, 8, 48),
                tr ? ghc_tensor_view_cols(ga, 8, 40) : ghc_tensor_view_cols(ga, 16, 64),
                tr ? ghc_tensor_view_cols(gb, 16, 48) : ghc_tensor_view_cols(gb, 16, 64), ghc_tensor_view_cols(gc, 8, 48)
            };
            for (int k = 0; k < 6; k++)
                ck_assert_msg(v[k] != NULL, "%s", ghc_error_message(core));
            struct ghc_gemm g = { .trans_a = tr, .trans_b = !tr, .alpha = 0.5f, .beta = 0.75f };
            ok(ghc_op_gemm(v[2], v[0], v[1], &g, NULL));
            ok(ghc_op_gemm(v[5], v[3], v[4], &g, NULL));
            char w[128];
            snprintf(w, sizeof(w), "gemm %s on column views, %s", ghc_dtype_name(dts[d]), tr ? "A^T B" : "A B^T");
            expect_close(gc, xc, dts[d] == GHC_DTYPE_F32 ? TOL_F32 : TOL_BF16, w);
            ghc_tensor_t *hc = down(gc);   /* the columns outside the view: untouched */
            for (int64_t i = 0; i < ghc_tensor_numel(hc); i++)
                if (i % 64 < 8 || i % 64 >= 56)
                    ck_assert_msg(getf(hc, i) == getf(xc, i), "%s: C[%lld] outside the view changed", w, (long long)i);
            for (int k = 0; k < 6; k++)
                ghc_tensor_free(v[k]);
            ghc_tensor_t *all[] = { xa, xb, xc, ga, gb, gc, hc };
            for (size_t k = 0; k < sizeof(all) / sizeof(all[0]); k++)
                ghc_tensor_free(all[k]);
        }
}
END_TEST

/* An epilogue into a column view C (since API 20): A [40, 64] B^T [48, 64] + bias (then GELU, with
 * a dense pre_gelu) into columns 8..55 of [40, 64], the bias in C's dtype (cuBLASLt's fused
 * epilogue, C's rows ldc apart) and in the other (the product, then our epilogue kernel over
 * the view). Against the CPU on the same views; C's other columns keep their bits. */
START_TEST(gemm_view_c_epilogues)
{
    const enum ghc_dtype dts[] = { GHC_DTYPE_F32, GHC_DTYPE_BF16 };
    for (int d = 0; d < 2; d++)
        for (int e = 0; e < 4; e++) {
            const enum ghc_dtype dt = dts[d], other = dt == GHC_DTYPE_F32 ? GHC_DTYPE_BF16 : GHC_DTYPE_F32;
            const bool gelu = e >= 2, native = e % 2 == 0;
            ghc_tensor_t *a = CPU(dt, 40, 64), *b = CPU(dt, 48, 64), *xc = CPU(dt, 40, 64);
            ghc_tensor_t *bias = CPU(native ? dt : other, 48), *pre = CPU(dt, 40, 48);
            fill_rand(a, 1.0f);
            fill_rand(b, 1.0f);
            fill_rand(xc, 1.0f);
            fill_rand(bias, 1.0f);
            ghc_tensor_t *ga = up(a), *gb = up(b), *gc = up(xc), *gbias = up(bias), *gpre = GPU(dt, 40, 48);
            poison(gpre);
            ghc_tensor_t *vc = ghc_tensor_view_cols(xc, 8, 48), *vg = ghc_tensor_view_cols(gc, 8, 48);
            ck_assert(vc && vg);
            struct ghc_gemm g = { .trans_b = true, .epilogue = gelu ? GHC_EPI_BIAS_GELU : GHC_EPI_BIAS, .bias = bias,
                                  .pre_gelu = gelu ? pre : NULL };
            ok(ghc_op_gemm(vc, a, b, &g, NULL));
            g.bias = gbias;
            g.pre_gelu = gelu ? gpre : NULL;
            ok(ghc_op_gemm(vg, ga, gb, &g, NULL));
            char w[128];
            snprintf(w, sizeof(w), "gemm %s %s into a column view C (bias %s)", ghc_dtype_name(dt),
                     gelu ? "BIAS_GELU + pre_gelu" : "BIAS", ghc_dtype_name(native ? dt : other));
            expect_close(gc, xc, tol_of(dt), w);
            if (gelu) {
                char wp[160];
                snprintf(wp, sizeof(wp), "%s pre_gelu", w);
                expect_close(gpre, pre, tol_of(dt), wp);
            }
            ghc_tensor_t *hc = down(gc);   /* the columns outside the view: untouched */
            for (int64_t i = 0; i < ghc_tensor_numel(hc); i++)
                if (i % 64 < 8 || i % 64 >= 56)
                    ck_assert_msg(getf(hc, i) == getf(xc, i), "%s: C[%lld] outside the view changed", w, (long long)i);
            ghc_tensor_t *all[] = { a, b, xc, bias, pre, ga, gb, gc, gbias, gpre, vc, vg, hc };
            for (size_t k = 0; k < sizeof(all) / sizeof(all[0]); k++)
                ghc_tensor_free(all[k]);
        }
}
END_TEST

START_TEST(gemm_epilogues)
{
    static ghc_tensor_t *want_pre = (ghc_tensor_t *)1;   /* a marker: "ask for pre_gelu" */
    const enum ghc_dtype dts[] = { GHC_DTYPE_F32, GHC_DTYPE_BF16 };
    for (int d = 0; d < 2; d++) {
        enum ghc_dtype dt = dts[d], other = dt == GHC_DTYPE_F32 ? GHC_DTYPE_BF16 : GHC_DTYPE_F32;
        char w[160];
        const int64_t sa[2] = { 72, 96 }, sb[2] = { 64, 96 }, sc[2] = { 72, 64 };
        const int64_t sb_odd[2] = { 61, 96 }, sc_odd[2] = { 72, 61 };
        snprintf(w, sizeof(w), "gemm %s BIAS (bias %s)", ghc_dtype_name(dt), ghc_dtype_name(dt));
        gemm_case(dt, dt, 2, sa, 2, sb, 2, sc, (struct ghc_gemm){ .trans_b = true, .epilogue = GHC_EPI_BIAS }, dt, w);
        snprintf(w, sizeof(w), "gemm %s BIAS (bias %s, unfused)", ghc_dtype_name(dt), ghc_dtype_name(other));
        gemm_case(dt, dt, 2, sa, 2, sb, 2, sc, (struct ghc_gemm){ .trans_b = true, .epilogue = GHC_EPI_BIAS }, other,
                  w);
        snprintf(w, sizeof(w), "gemm %s BIAS_GELU", ghc_dtype_name(dt));
        gemm_case(dt, dt, 2, sa, 2, sb, 2, sc, (struct ghc_gemm){ .trans_b = true, .epilogue = GHC_EPI_BIAS_GELU },
                  dt, w);
        snprintf(w, sizeof(w), "gemm %s BIAS_GELU + pre_gelu", ghc_dtype_name(dt));
        gemm_case(dt, dt, 2, sa, 2, sb, 2, sc,
                  (struct ghc_gemm){ .trans_b = true, .epilogue = GHC_EPI_BIAS_GELU, .pre_gelu = want_pre }, dt, w);
        snprintf(w, sizeof(w), "gemm %s BIAS_GELU + pre_gelu, N=61 (unfused)", ghc_dtype_name(dt));
        gemm_case(dt, dt, 2, sa, 2, sb_odd, 2, sc_odd,
                  (struct ghc_gemm){ .trans_b = true, .epilogue = GHC_EPI_BIAS_GELU, .pre_gelu = want_pre }, dt, w);
        snprintf(w, sizeof(w), "gemm %s beta 0.5", ghc_dtype_name(dt));
        gemm_case(dt, dt, 2, sa, 2, sb, 2, sc, (struct ghc_gemm){ .trans_b = true, .beta = 0.5f }, dt, w);
        snprintf(w, sizeof(w), "gemm %s alpha 2 beta 1 + BIAS", ghc_dtype_name(dt));
        gemm_case(dt, dt, 2, sa, 2, sb, 2, sc,
                  (struct ghc_gemm){ .trans_b = true, .alpha = 2.0f, .beta = 1.0f, .epilogue = GHC_EPI_BIAS }, dt, w);
        snprintf(w, sizeof(w), "gemm %s batch 2 BIAS_GELU + pre_gelu, shared A", ghc_dtype_name(dt));
        gemm_case(dt, dt, 2, (const int64_t[]){ 40, 64 }, 3, (const int64_t[]){ 2, 64, 48 }, 3,
                  (const int64_t[]){ 2, 40, 48 },
                  (struct ghc_gemm){ .epilogue = GHC_EPI_BIAS_GELU, .pre_gelu = want_pre }, dt, w);
    }
}
END_TEST

START_TEST(gemm_fp8)
{
    const int64_t sa[2] = { 128, 256 }, sb[2] = { 96, 256 }, sc[2] = { 128, 96 };
    struct ghc_gemm g = { .trans_b = true, .scale_a = 0.5f, .scale_b = 2.5f };
    gemm_case(GHC_DTYPE_F8_E4M3, GHC_DTYPE_BF16, 2, sa, 2, sb, 2, sc, g, GHC_DTYPE_BF16, "gemm fp8 e4m3 -> bf16, scales");
    gemm_case(GHC_DTYPE_F8_E4M3, GHC_DTYPE_F32, 2, sa, 2, sb, 2, sc, g, GHC_DTYPE_BF16, "gemm fp8 e4m3 -> f32, scales");
    g.epilogue = GHC_EPI_BIAS;
    gemm_case(GHC_DTYPE_F8_E4M3, GHC_DTYPE_BF16, 2, sa, 2, sb, 2, sc, g, GHC_DTYPE_BF16,
              "gemm fp8 e4m3 -> bf16, scales, BIAS bf16");
    gemm_case(GHC_DTYPE_F8_E4M3, GHC_DTYPE_F32, 2, sa, 2, sb, 2, sc, g, GHC_DTYPE_F32,
              "gemm fp8 e4m3 -> f32, scales, BIAS f32");
    g.epilogue = GHC_EPI_BIAS_GELU;
    gemm_case(GHC_DTYPE_F8_E4M3, GHC_DTYPE_BF16, 2, sa, 2, sb, 2, sc, g, GHC_DTYPE_BF16,
              "gemm fp8 e4m3 -> bf16, scales, BIAS_GELU");
    /* batched activations with a shared fp8 weight */
    gemm_case(GHC_DTYPE_F8_E4M3, GHC_DTYPE_BF16, 3, (const int64_t[]){ 2, 64, 256 }, 2, sb, 3,
              (const int64_t[]){ 2, 64, 96 }, (struct ghc_gemm){ .trans_b = true, .scale_a = 1.5f, .scale_b = 0.25f },
              GHC_DTYPE_BF16, "gemm fp8 e4m3 batch 2, shared weight");

    /* a layout Hopper's fp8 kernels do not have: a clear error, no crash */
    ghc_tensor_t *a = GPU(GHC_DTYPE_F8_E4M3, 128, 256), *b = GPU(GHC_DTYPE_F8_E4M3, 256, 96);
    ghc_tensor_t *c = GPU(GHC_DTYPE_BF16, 128, 96);
    ok(ghc_op_fill(a, 0.5, NULL));
    ok(ghc_op_fill(b, 0.5, NULL));
    int rc = ghc_op_gemm(c, a, b, &(struct ghc_gemm){ 0 }, NULL);
    printf("  gemm fp8 trans_b=false: rc %d: %s\n", rc, rc ? ghc_error_message(core) : "(accepted)");
    if (rc == 0) {   /* accepted after all: then it must be right (0.5 * 0.5 * 256 = 64) */
        ghc_tensor_t *h = down(c);
        for (int64_t i = 0; i < ghc_tensor_numel(h); i++)
            ck_assert_msg(getf(h, i) == 64.0f, "[%lld] %g", (long long)i, getf(h, i));
        ghc_tensor_free(h);
    }
    ghc_tensor_free(a);
    ghc_tensor_free(b);
    ghc_tensor_free(c);
}
END_TEST

/* Wan2.2 A14B shapes, bf16, y = x W^T + b: the GPU against the CPU on 16 rows of x. */
static void gemm_wan(int64_t M, int64_t K, int64_t N, bool gelu)
{
    const int64_t R = 16;
    ghc_tensor_t *x = CPU(GHC_DTYPE_BF16, M, K), *w = CPU(GHC_DTYPE_BF16, N, K), *bias = CPU(GHC_DTYPE_BF16, N);
    fill_rand(x, 1.0f);
    fill_rand(w, 0.03f);
    fill_rand(bias, 0.5f);
    ghc_tensor_t *gx = up(x), *gw = up(w), *gbias = up(bias), *gy = GPU(GHC_DTYPE_BF16, M, N);
    poison(gy);
    struct ghc_gemm g = { .trans_b = true, .epilogue = gelu ? GHC_EPI_BIAS_GELU : GHC_EPI_BIAS, .bias = gbias };
    ok(ghc_op_gemm(gy, gx, gw, &g, NULL));
    ghc_tensor_t *y = down(gy);

    /* rows 0..7 and M-8..M-1 on the CPU */
    ghc_tensor_t *xs = CPU(GHC_DTYPE_BF16, R, K), *ys = CPU(GHC_DTYPE_BF16, R, N);
    size_t row_b = (size_t)K * 2;
    for (int64_t r = 0; r < R; r++) {
        int64_t src = r < R / 2 ? r : M - R + r;
        memcpy((char *)ghc_tensor_data(xs) + r * row_b, (const char *)ghc_tensor_cdata(x) + src * row_b, row_b);
    }
    g.bias = bias;
    ok(ghc_op_gemm(ys, xs, w, &g, NULL));
    double e1 = rel_err_n(y, 0, ys, 0, (R / 2) * N, "wan gemm first rows");
    double e2 = rel_err_n(y, (M - R / 2) * N, ys, (R / 2) * N, (R / 2) * N, "wan gemm last rows");
    /* every element written */
    for (int64_t i = 0; i < M * N; i += 997)
        ck_assert_msg(!isnan(getf(y, i)), "wan gemm: element %lld unwritten", (long long)i);
    printf("  gemm bf16 Wan %lldx%lld -> %lld%s: rel err %.2e / %.2e (tol %.0e)\n", (long long)M, (long long)K,
           (long long)N, gelu ? " +GELU" : "", e1, e2, TOL_BF16);
    ck_assert_msg(e1 <= TOL_BF16 && e2 <= TOL_BF16, "wan gemm rel err %g %g", e1, e2);
    ghc_tensor_free(x);
    ghc_tensor_free(w);
    ghc_tensor_free(bias);
    ghc_tensor_free(gx);
    ghc_tensor_free(gw);
    ghc_tensor_free(gbias);
    ghc_tensor_free(gy);
    ghc_tensor_free(y);
    ghc_tensor_free(xs);
    ghc_tensor_free(ys);
}

START_TEST(gemm_wan_shapes)
{
    gemm_wan(4096, 5120, 5120, false);    /* q, k, v, o */
    gemm_wan(4096, 5120, 13824, true);    /* ffn up + GELU */
    gemm_wan(4096, 13824, 5120, false);   /* ffn down */
}
END_TEST

/* ---- attention ---------------------------------------------------------------------------- */

struct attn_set {
    ghc_tensor_t *q, *k, *v, *o, *lse, *dout, *dq, *dk, *dv;
};

static void attn_free(struct attn_set *s)
{
    ghc_tensor_free(s->q);
    ghc_tensor_free(s->k);
    ghc_tensor_free(s->v);
    ghc_tensor_free(s->o);
    ghc_tensor_free(s->lse);
    ghc_tensor_free(s->dout);
    ghc_tensor_free(s->dq);
    ghc_tensor_free(s->dk);
    ghc_tensor_free(s->dv);
    memset(s, 0, sizeof(*s));
}

/* The attention path the GPU cases run on (GHC_K_ATTN_OWN or GHC_K_ATTN_CUDNN), and a check
 * that the last call took it: cuDNN's wherever it loaded and the problem is bf16 with Dh a
 * multiple of 8 up to 128; ours otherwise. */
static int attn_impl = GHC_K_ATTN_OWN;

static void expect_path(enum ghc_dtype dt, int64_t Dh, const char *what)
{
    const bool cudnn = attn_impl == GHC_K_ATTN_CUDNN && dt == GHC_DTYPE_BF16 && Dh % 8 == 0 && Dh <= 128;
    const char *last = ghc_k_attention_last();
    ck_assert_msg(cudnn == !strcmp(last, "cudnn"), "%s: ran on the %s path, expected %s (%s)", what, last,
                  cudnn ? "cudnn" : "ours", ghc_k_cudnn_why());
}

/* Runs fn once on our kernels and, where cuDNN loads, once on its path. */
static void on_each_path(void (*fn)(void))
{
    attn_impl = GHC_K_ATTN_OWN;
    ghc_k_attention_impl(attn_impl);
    fn();
    if (ghc_k_cudnn_version() > 0) {
        printf("  cuDNN %d: the same cases on its fused attention\n", ghc_k_cudnn_version());
        attn_impl = GHC_K_ATTN_CUDNN;
        ghc_k_attention_impl(attn_impl);
        fn();
    } else {
        printf("  cuDNN (libcudnn.so.9) not loaded: its path not tested\n");
    }
    attn_impl = GHC_K_ATTN_AUTO;
    ghc_k_attention_impl(attn_impl);
}

/* Forward and backward at one shape: CPU and GPU from the same inputs; the backward of both
 * runs from the CPU forward's o and lse, so that both see identical inputs. */
static void attn_case(enum ghc_dtype dt, int64_t B, int64_t Lq, int64_t Lk, int64_t H, int64_t Dh, float amp,
                      bool bwd)
{
    struct attn_set c = { 0 }, g = { 0 };
    const float scale = 1.0f / sqrtf((float)Dh);
    c.q = CPU(dt, B, Lq, H, Dh);
    c.k = CPU(dt, B, Lk, H, Dh);
    c.v = CPU(dt, B, Lk, H, Dh);
    c.o = CPU(dt, B, Lq, H, Dh);
    c.lse = CPU(GHC_DTYPE_F32, B, H, Lq);
    fill_rand(c.q, amp);
    fill_rand(c.k, 1.0f);
    fill_rand(c.v, 1.0f);
    g.q = up(c.q);
    g.k = up(c.k);
    g.v = up(c.v);
    g.o = GPU(dt, B, Lq, H, Dh);
    g.lse = GPU(GHC_DTYPE_F32, B, H, Lq);
    poison(g.o);
    poison(g.lse);
    ok(ghc_op_attention_fwd(c.o, c.lse, c.q, c.k, c.v, scale, NULL));
    ok(ghc_op_attention_fwd(g.o, g.lse, g.q, g.k, g.v, scale, NULL));
    char w[160];
    snprintf(w, sizeof(w), "attn fwd %s B%lld Lq%lld Lk%lld H%lld Dh%lld amp%g: o", ghc_dtype_name(dt), (long long)B,
             (long long)Lq, (long long)Lk, (long long)H, (long long)Dh, (double)amp);
    expect_path(dt, Dh, w);
    expect_close(g.o, c.o, tol_of(dt), w);
    snprintf(w, sizeof(w), "attn fwd %s B%lld Lq%lld Lk%lld H%lld Dh%lld: lse", ghc_dtype_name(dt), (long long)B,
             (long long)Lq, (long long)Lk, (long long)H, (long long)Dh);
    expect_close(g.lse, c.lse, dt == GHC_DTYPE_F32 ? TOL_F32 : 1e-3, w);
    if (bwd) {
        c.dout = CPU(dt, B, Lq, H, Dh);
        fill_rand(c.dout, 1.0f);
        c.dq = CPU(dt, B, Lq, H, Dh);
        c.dk = CPU(dt, B, Lk, H, Dh);
        c.dv = CPU(dt, B, Lk, H, Dh);
        g.dout = up(c.dout);
        ghc_tensor_free(g.o);
        ghc_tensor_free(g.lse);
        g.o = up(c.o);
        g.lse = up(c.lse);
        g.dq = GPU(dt, B, Lq, H, Dh);
        g.dk = GPU(dt, B, Lk, H, Dh);
        g.dv = GPU(dt, B, Lk, H, Dh);
        poison(g.dq);
        poison(g.dk);
        poison(g.dv);
        ok(ghc_op_attention_bwd(c.dq, c.dk, c.dv, c.dout, c.q, c.k, c.v, c.o, c.lse, scale, NULL));
        ok(ghc_op_attention_bwd(g.dq, g.dk, g.dv, g.dout, g.q, g.k, g.v, g.o, g.lse, scale, NULL));
        expect_path(dt, Dh, "attn bwd");
        const char *names[3] = { "dq", "dk", "dv" };
        ghc_tensor_t *gg[3] = { g.dq, g.dk, g.dv }, *cc[3] = { c.dq, c.dk, c.dv };
        for (int i = 0; i < 3; i++) {
            snprintf(w, sizeof(w), "attn bwd %s B%lld Lq%lld Lk%lld H%lld Dh%lld: %s", ghc_dtype_name(dt),
                     (long long)B, (long long)Lq, (long long)Lk, (long long)H, (long long)Dh, names[i]);
            expect_close(gg[i], cc[i], tol_of(dt), w);
        }
        /* dq alone (cross-attention): dk, dv NULL */
        poison(g.dq);
        ok(ghc_op_attention_bwd(g.dq, NULL, NULL, g.dout, g.q, g.k, g.v, g.o, g.lse, scale, NULL));
        snprintf(w, sizeof(w), "attn bwd %s dq only", ghc_dtype_name(dt));
        expect_path(dt, Dh, w);
        expect_close(g.dq, c.dq, tol_of(dt), w);
    }
    attn_free(&c);
    attn_free(&g);
}

/* o as a column view [B, Lq, W] (W > H Dh, the heads at column c0), as the model writes the
 * attention output next to other columns: the forward writes only the view, the backward reads
 * o through it; against the dense CPU result. */
static void attn_view_case(int64_t B, int64_t Lq, int64_t Lk, int64_t H, int64_t Dh, int64_t W, int64_t c0)
{
    const enum ghc_dtype dt = GHC_DTYPE_BF16;
    const float scale = 1.0f / sqrtf((float)Dh);
    struct attn_set c = { 0 }, g = { 0 };
    c.q = CPU(dt, B, Lq, H, Dh);
    c.k = CPU(dt, B, Lk, H, Dh);
    c.v = CPU(dt, B, Lk, H, Dh);
    c.o = CPU(dt, B, Lq, H, Dh);
    c.lse = CPU(GHC_DTYPE_F32, B, H, Lq);
    c.dout = CPU(dt, B, Lq, H, Dh);
    c.dq = CPU(dt, B, Lq, H, Dh);
    c.dk = CPU(dt, B, Lk, H, Dh);
    c.dv = CPU(dt, B, Lk, H, Dh);
    fill_rand(c.q, 2.0f);
    fill_rand(c.k, 1.0f);
    fill_rand(c.v, 1.0f);
    fill_rand(c.dout, 1.0f);
    ok(ghc_op_attention_fwd(c.o, c.lse, c.q, c.k, c.v, scale, NULL));
    ok(ghc_op_attention_bwd(c.dq, c.dk, c.dv, c.dout, c.q, c.k, c.v, c.o, c.lse, scale, NULL));
    g.q = up(c.q);
    g.k = up(c.k);
    g.v = up(c.v);
    g.dout = up(c.dout);
    g.lse = GPU(GHC_DTYPE_F32, B, H, Lq);
    ghc_tensor_t *wide = GPU(dt, B, Lq, W);
    poison(wide);
    ghc_tensor_t *ov = ghc_tensor_view_cols(wide, c0, H * Dh);
    ok(ghc_op_attention_fwd(ov, g.lse, g.q, g.k, g.v, scale, NULL));
    expect_path(dt, Dh, "attn fwd into a column view");
    ghc_tensor_t *hw = down(wide);
    double num = 0, den = 0;
    for (int64_t r = 0; r < B * Lq; r++)
        for (int64_t j = 0; j < W; j++) {
            const double x = getf(hw, r * W + j);
            if (j < c0 || j >= c0 + H * Dh) {
                ck_assert_msg(isnan(x), "attn fwd view: column %lld outside the view written", (long long)j);
                continue;
            }
            const double ref = getf(c.o, r * H * Dh + j - c0);
            num += (x - ref) * (x - ref);
            den += ref * ref;
        }
    printf("  %-58s rel err %.2e (tol %.0e)\n", "attn fwd into a column view: o", sqrt(num / den), TOL_BF16);
    ck_assert(sqrt(num / den) <= TOL_BF16);
    g.dq = GPU(dt, B, Lq, H, Dh);
    g.dk = GPU(dt, B, Lk, H, Dh);
    g.dv = GPU(dt, B, Lk, H, Dh);
    poison(g.dq);
    poison(g.dk);
    poison(g.dv);
    ok(ghc_op_attention_bwd(g.dq, g.dk, g.dv, g.dout, g.q, g.k, g.v, ov, g.lse, scale, NULL));
    expect_path(dt, Dh, "attn bwd from a column view");
    expect_close(g.dq, c.dq, TOL_BF16, "attn bwd from a column view o: dq");
    expect_close(g.dk, c.dk, TOL_BF16, "attn bwd from a column view o: dk");
    expect_close(g.dv, c.dv, TOL_BF16, "attn bwd from a column view o: dv");
    ghc_tensor_free(ov);
    ghc_tensor_free(wide);
    ghc_tensor_free(hw);
    attn_free(&c);
    attn_free(&g);
}

static void small_bf16_cases(void)
{
    /* tensor-core path: Dh 16 (forward), 32, 64, 128; tails in both Lq and Lk */
    attn_case(GHC_DTYPE_BF16, 2, 33, 33, 2, 16, 2.0f, true);
    attn_case(GHC_DTYPE_BF16, 2, 100, 77, 3, 32, 2.0f, true);
    attn_case(GHC_DTYPE_BF16, 2, 129, 65, 2, 64, 2.0f, true);
    attn_case(GHC_DTYPE_BF16, 2, 300, 300, 4, 64, 1.0f, true);
    attn_case(GHC_DTYPE_BF16, 2, 64, 128, 2, 128, 2.0f, true);
    attn_case(GHC_DTYPE_BF16, 2, 257, 190, 3, 128, 2.0f, true);
    attn_case(GHC_DTYPE_BF16, 1, 300, 300, 2, 128, 8.0f, true);   /* peaked softmax: rescaling */
    attn_case(GHC_DTYPE_BF16, 2, 5, 3, 2, 128, 2.0f, true);       /* tiny */
    /* the simple path for bf16: a head dim the tensor-core kernels do not take */
    attn_case(GHC_DTYPE_BF16, 2, 70, 45, 2, 48, 2.0f, true);
    /* Dh not a multiple of 8 (ours, also when cuDNN is asked) */
    attn_case(GHC_DTYPE_BF16, 1, 20, 20, 2, 6, 2.0f, true);
    /* o as a column view: the model's layout */
    attn_view_case(2, 77, 64, 2, 64, 2 * 64 + 24, 16);
    attn_view_case(1, 130, 90, 3, 128, 3 * 128 + 64, 32);
}

START_TEST(attention_small_bf16)
{
    on_each_path(small_bf16_cases);
}
END_TEST

START_TEST(attention_small_f32)
{
    attn_case(GHC_DTYPE_F32, 2, 33, 33, 2, 16, 2.0f, true);
    attn_case(GHC_DTYPE_F32, 2, 100, 77, 3, 64, 2.0f, true);
    attn_case(GHC_DTYPE_F32, 2, 129, 300, 4, 128, 2.0f, true);
    attn_case(GHC_DTYPE_F32, 1, 40, 50, 2, 6, 2.0f, true);
}
END_TEST

/* Wan self-attention: B 1, L 4096, H 40, Dh 128, bf16. The GPU does all heads; the CPU checks
 * heads 0 and 39 (forward) and head 17 (backward), cut out of the same tensors. */
static ghc_tensor_t *pick_heads(const ghc_tensor_t *t, const int *heads, int nh)
{
    int64_t B = ghc_tensor_dim(t, 0), L = ghc_tensor_dim(t, 1), H = ghc_tensor_dim(t, 2), D = ghc_tensor_dim(t, 3);
    ghc_tensor_t *s = CPU(ghc_tensor_dtype(t), B, L, nh, D);
    size_t es = ghc_dtype_size(ghc_tensor_dtype(t));
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < L; i++)
            for (int j = 0; j < nh; j++)
                memcpy((char *)ghc_tensor_data(s) + (((b * L + i) * nh + j) * D) * es,
                       (const char *)ghc_tensor_cdata(t) + (((b * L + i) * H + heads[j]) * D) * es, D * es);
    return s;
}

static void compare_heads(const ghc_tensor_t *gpu_cpu, const ghc_tensor_t *ref, const int *heads, int nh,
                          const char *what)
{
    ghc_tensor_t *s = pick_heads(gpu_cpu, heads, nh);
    double e = rel_err_n(s, 0, ref, 0, ghc_tensor_numel(ref), what);
    printf("  %-58s rel err %.2e (tol %.0e)\n", what, e, TOL_BF16);
    ck_assert_msg(e <= TOL_BF16, "%s: relative error %g", what, e);
    ghc_tensor_free(s);
}

static void wan_shape_case(void)
{
    const int64_t B = 1, L = 4096, H = 40, D = 128;
    const float scale = 1.0f / sqrtf(128.0f);
    ghc_tensor_t *q = CPU(GHC_DTYPE_BF16, B, L, H, D), *k = CPU(GHC_DTYPE_BF16, B, L, H, D);
    ghc_tensor_t *v = CPU(GHC_DTYPE_BF16, B, L, H, D), *dout = CPU(GHC_DTYPE_BF16, B, L, H, D);
    fill_rand(q, 3.0f);
    fill_rand(k, 1.0f);
    fill_rand(v, 1.0f);
    fill_rand(dout, 1.0f);
    ghc_tensor_t *gq = up(q), *gk = up(k), *gv = up(v), *gdo = up(dout);
    ghc_tensor_t *go = GPU(GHC_DTYPE_BF16, B, L, H, D), *glse = GPU(GHC_DTYPE_F32, B, H, L);
    ghc_tensor_t *gdq = GPU(GHC_DTYPE_BF16, B, L, H, D), *gdk = GPU(GHC_DTYPE_BF16, B, L, H, D);
    ghc_tensor_t *gdv = GPU(GHC_DTYPE_BF16, B, L, H, D);
    poison(go);
    poison(glse);
    poison(gdq);
    poison(gdk);
    poison(gdv);
    ok(ghc_op_attention_fwd(go, glse, gq, gk, gv, scale, NULL));
    expect_path(GHC_DTYPE_BF16, D, "attn fwd Wan L4096");
    ok(ghc_op_attention_bwd(gdq, gdk, gdv, gdo, gq, gk, gv, go, glse, scale, NULL));
    expect_path(GHC_DTYPE_BF16, D, "attn bwd Wan L4096");
    ghc_tensor_t *o = down(go), *lse = down(glse), *dq = down(gdq), *dk = down(gdk), *dv = down(gdv);

    /* forward: heads 0 and 39 */
    const int fh[2] = { 0, 39 };
    ghc_tensor_t *sq = pick_heads(q, fh, 2), *sk = pick_heads(k, fh, 2), *sv = pick_heads(v, fh, 2);
    ghc_tensor_t *so = CPU(GHC_DTYPE_BF16, B, L, 2, D), *slse = CPU(GHC_DTYPE_F32, B, 2, L);
    ok(ghc_op_attention_fwd(so, slse, sq, sk, sv, scale, NULL));
    compare_heads(o, so, fh, 2, "attn fwd bf16 Wan L4096 H40 Dh128 (heads 0, 39): o");
    double num = 0, den = 0;
    for (int j = 0; j < 2; j++)
        for (int64_t i = 0; i < L; i++) {
            double a = getf(lse, fh[j] * L + i), b = getf(slse, j * L + i);
            ck_assert_msg(!isnan(a), "lse unwritten");
            num += (a - b) * (a - b);
            den += b * b;
        }
    printf("  %-58s rel err %.2e\n", "attn fwd Wan: lse", sqrt(num / den));
    ck_assert(sqrt(num / den) < 1e-3);
    for (int64_t i = 0; i < ghc_tensor_numel(lse); i++)
        ck_assert_msg(!isnan(getf(lse, i)), "lse[%lld] unwritten", (long long)i);
    for (int64_t i = 0; i < ghc_tensor_numel(o); i += 13)
        ck_assert_msg(!isnan(getf(o, i)), "o[%lld] unwritten", (long long)i);

    /* backward: head 17, from the GPU's o and lse of that head */
    const int bh[1] = { 17 };
    ghc_tensor_t *bq = pick_heads(q, bh, 1), *bk = pick_heads(k, bh, 1), *bv = pick_heads(v, bh, 1);
    ghc_tensor_t *bo = pick_heads(o, bh, 1), *bdo = pick_heads(dout, bh, 1);
    ghc_tensor_t *blse = CPU(GHC_DTYPE_F32, B, 1, L);
    memcpy(ghc_tensor_data(blse), (const float *)ghc_tensor_cdata(lse) + 17 * L, L * sizeof(float));
    ghc_tensor_t *bdq = CPU(GHC_DTYPE_BF16, B, L, 1, D), *bdk = CPU(GHC_DTYPE_BF16, B, L, 1, D);
    ghc_tensor_t *bdv = CPU(GHC_DTYPE_BF16, B, L, 1, D);
    ok(ghc_op_attention_bwd(bdq, bdk, bdv, bdo, bq, bk, bv, bo, blse, scale, NULL));
    compare_heads(dq, bdq, bh, 1, "attn bwd bf16 Wan (head 17): dq");
    compare_heads(dk, bdk, bh, 1, "attn bwd bf16 Wan (head 17): dk");
    compare_heads(dv, bdv, bh, 1, "attn bwd bf16 Wan (head 17): dv");
    ghc_tensor_t *all[] = { q, k, v, dout, gq, gk, gv, gdo, go, glse, gdq, gdk, gdv, o, lse, dq, dk, dv,
                            sq, sk, sv, so, slse, bq, bk, bv, bo, bdo, blse, bdq, bdk, bdv };
    for (size_t i = 0; i < sizeof(all) / sizeof(*all); i++)
        ghc_tensor_free(all[i]);
}

START_TEST(attention_wan_shape)
{
    on_each_path(wan_shape_case);
}
END_TEST

int main(void)
{
    if (ghc_k_device_count() < 1) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    if (!(core = tu_device_core()))
        return EXIT_FAILURE;
    char name[256];
    int major = 0, minor = 0;
    size_t fr = 0, tot = 0;
    if (ghc_k_device_info(0, name, sizeof(name), &major, &minor, &fr, &tot) == 0)
        printf("device 0: %s, sm_%d%d\n", name, major, minor);

    Suite *s = suite_create("gemm_attn_cuda");
    TCase *tg = tcase_create("gemm");
    tcase_set_timeout(tg, 600);
    tcase_add_test(tg, gemm_transposes);
    tcase_add_test(tg, gemm_batched);
    tcase_add_test(tg, gemm_column_views);
    tcase_add_test(tg, gemm_view_c_epilogues);
    tcase_add_test(tg, gemm_epilogues);
    tcase_add_test(tg, gemm_fp8);
    tcase_add_test(tg, gemm_wan_shapes);
    suite_add_tcase(s, tg);
    TCase *ta = tcase_create("attention");
    tcase_set_timeout(ta, 600);
    tcase_add_test(ta, attention_small_bf16);
    tcase_add_test(ta, attention_small_f32);
    tcase_add_test(ta, attention_wan_shape);
    suite_add_tcase(s, ta);
    int status = tu_run_suite(s, true);
    ghc_run_free(core);
    ghc_core_free(core);
    return status;
}
