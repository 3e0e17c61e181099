/* test_umt5_cuda.c: the umT5 text encoder on a GPU (kernels/cuda/text.cu and plugins/umt5 with a
 * CUDA place). The three text-encoder ops against the CPU reference ops on the same random
 * inputs: embedding and rel_pos_bias bit for bit (every float dtype of table, f32 and bf16 out,
 * I32 and I64 ids, odd sizes, causal and bidirectional buckets, a row of NaN for an id out of
 * range); attention_bias_fwd within f32 (2e-5 relative) and bf16 tolerances on odd shapes, with
 * and without bias and mask, a batch entry whose keys are all masked (O = 0), and umT5-XXL's
 * [3, 512, 64, 64] with per-entry lengths; its fused bf16 kernel (Dh 64) on tails of Lq and Lk,
 * masks with holes and a whole masked tile, in f32, bf16, f16 and fp8, beside the GEMM path
 * (Dh 40, f32) on the same masks. The encoder
 * against the golden fixtures on the GPU in f32 (1e-4) and bf16 (umt5_golden.h's tolerance),
 * padded, unpadded and batched; a random encoder of 4 heads of 64 on a batch of 200-token
 * prompts, GPU against CPU; and the `umt5` plugin made by the core with `device` and `dtype`.
 *
 * Every GPU output is poisoned with NaN first, so an element left unwritten fails. Exits 77
 * (automake SKIP) without a device; runs with CK_NOFORK (CUDA does not survive fork). */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gh200core/gh200core.h>
#include <gh200core/encoder.h>
#include <gh200core/ops.h>

#include "../kernels/cuda/device.h"
#include "testutil.h"
#include "umt5_golden.h"   /* defines: golden_check, random_batch_check, UMT5_BF16_ATOL */

#define F32  GHC_DTYPE_F32
#define BF16 GHC_DTYPE_BF16
#define CPUD GHC_DEVICE_CPU

static ghc_core_t *core;

/* ---- tensors ------------------------------------------------------------------------------ */

static void ok_(int rc, const char *what, int line)
{
    ck_assert_msg(rc == 0, "line %d: %s failed (%d): %s", line, what, rc, ghc_error_message(core));
}
#define OK(expr) ok_((expr), #expr, __LINE__)

static ghc_tensor_t *mk(enum ghc_dtype dt, int device, int nd, const int64_t *shape)
{
    ghc_tensor_t *t = ghc_tensor_init(core, dt, nd, shape, device, GHC_ROLE_ACTIVATIONS);
    ck_assert_msg(t != NULL, "tensor: %s", ghc_error_message(core));
    return t;
}
#define NARG(...) (int)(sizeof((int64_t[]){ __VA_ARGS__ }) / sizeof(int64_t))
#define SHP(...) NARG(__VA_ARGS__), (const int64_t[]){ __VA_ARGS__ }

/* A CPU tensor of dtype dt: normal(0, 1) times amp, drawn in f32 and rounded once. */
static ghc_tensor_t *randn(enum ghc_dtype dt, float amp, uint64_t seed, int nd, const int64_t *shape)
{
    ghc_tensor_t *f = mk(F32, CPUD, nd, shape), *t = mk(dt, CPUD, nd, shape);
    struct ghc_rng rng = { seed, 0 };
    OK(ghc_op_rand_normal(f, &rng, NULL));
    OK(ghc_op_scale(f, f, amp, NULL));
    OK(ghc_tensor_convert_cpu(t, f, 1.0f));
    ghc_tensor_free(f);
    return t;
}

/* A GPU copy of a CPU tensor. */
static ghc_tensor_t *up(const ghc_tensor_t *t)
{
    ghc_tensor_t *g = mk(ghc_tensor_dtype(t), 0, ghc_tensor_ndim(t), ghc_tensor_shape(t));
    OK(ghc_op_copy(g, t, NULL));
    return g;
}

/* A GPU tensor full of NaN (an element left unwritten fails). */
static ghc_tensor_t *poisoned(enum ghc_dtype dt, int nd, const int64_t *shape)
{
    ghc_tensor_t *g = mk(dt, 0, nd, shape);
    OK(ghc_op_fill(g, NAN, NULL));
    return g;
}

/* A CPU copy of a GPU tensor, after the stream's work. */
static ghc_tensor_t *down(const ghc_tensor_t *g)
{
    ghc_tensor_t *t = mk(ghc_tensor_dtype(g), CPUD, ghc_tensor_ndim(g), ghc_tensor_shape(g));
    OK(ghc_op_copy(t, g, NULL));
    OK(ghc_op_sync(core, 0, NULL));
    return t;
}

static float get(const ghc_tensor_t *t, int64_t i)
{
    switch (ghc_tensor_dtype(t)) {
    case GHC_DTYPE_F32:  return ((const float *)ghc_tensor_cdata(t))[i];
    case GHC_DTYPE_BF16: return ghc_bf16_to_f32(((const uint16_t *)ghc_tensor_cdata(t))[i]);
    default:             ck_abort_msg("dtype"); return 0;
    }
}

/* The GPU result g equals the CPU's c bit for bit. */
static void same_bits(const ghc_tensor_t *g, const ghc_tensor_t *c, const char *what)
{
    ghc_tensor_t *h = down(g);
    ck_assert_int_eq(ghc_tensor_nbytes(h), ghc_tensor_nbytes(c));
    const size_t es = ghc_dtype_size(ghc_tensor_dtype(c));
    const unsigned char *a = ghc_tensor_cdata(h), *b = ghc_tensor_cdata(c);
    for (int64_t i = 0; i < ghc_tensor_numel(c); i++)
        ck_assert_msg(memcmp(a + (size_t)i * es, b + (size_t)i * es, es) == 0, "%s [%lld]: %g vs %g", what,
                      (long long)i, get(h, i), get(c, i));
    printf("%-60s bit-identical (%lld elements)\n", what, (long long)ghc_tensor_numel(c));
    ghc_tensor_free(h);
}

/* The GPU result g within atol + rtol |c| of the CPU's c; prints the worst error. */
static void close_to(const ghc_tensor_t *g, const ghc_tensor_t *c, double atol, double rtol, const char *what)
{
    ghc_tensor_t *h = down(g);
    double worst = 0.0;
    for (int64_t i = 0; i < ghc_tensor_numel(c); i++) {
        const double a = get(h, i), b = get(c, i), e = fabs(a - b);
        ck_assert_msg(e <= atol + rtol * fabs(b), "%s [%lld]: %.8g vs %.8g", what, (long long)i, a, b);
        worst = e > worst ? e : worst;
    }
    printf("%-60s max abs error %.3g\n", what, worst);
    ghc_tensor_free(h);
}

/* ---- embedding ---------------------------------------------------------------------------- */

static void embedding_case(enum ghc_dtype ty, enum ghc_dtype tt, enum ghc_dtype ti, int64_t V, int64_t D, int64_t n)
{
    char what[160];
    ghc_tensor_t *tab = randn(tt, 2.0f, 31 + (uint64_t)tt, SHP(V, D));
    ghc_tensor_t *ids = mk(ti, CPUD, SHP(n));
    for (int64_t i = 0; i < n; i++) {
        const int64_t id = (i * 7919 + 13) % V;
        if (ti == GHC_DTYPE_I32)
            ((int32_t *)ghc_tensor_data(ids))[i] = (int32_t)id;
        else
            ((int64_t *)ghc_tensor_data(ids))[i] = id;
    }
    ghc_tensor_t *y = mk(ty, CPUD, SHP(n, D));
    OK(ghc_op_embedding(y, tab, ids, NULL));
    ghc_tensor_t *gt = up(tab), *gi = up(ids), *gy = poisoned(ty, SHP(n, D));
    OK(ghc_op_embedding(gy, gt, gi, NULL));
    snprintf(what, sizeof(what), "embedding %s <- %s [%lld, %lld] by %lld %s", ghc_dtype_name(ty),
             ghc_dtype_name(tt), (long long)V, (long long)D, (long long)n, ghc_dtype_name(ti));
    same_bits(gy, y, what);
    ghc_tensor_free(tab);
    ghc_tensor_free(ids);
    ghc_tensor_free(y);
    ghc_tensor_free(gt);
    ghc_tensor_free(gi);
    ghc_tensor_free(gy);
}

START_TEST(embedding_ops)
{
    static const enum ghc_dtype tables[] = { GHC_DTYPE_F32, GHC_DTYPE_BF16, GHC_DTYPE_F16, GHC_DTYPE_F8_E4M3,
                                             GHC_DTYPE_F8_E5M2 };
    for (size_t t = 0; t < sizeof(tables) / sizeof(tables[0]); t++)
        for (int y = 0; y < 2; y++)
            embedding_case(y ? BF16 : F32, tables[t], t % 2 ? GHC_DTYPE_I64 : GHC_DTYPE_I32, 37, 13, 19);
    embedding_case(BF16, BF16, GHC_DTYPE_I32, 4099, 4096, 512);   /* umT5's width, 512 tokens */
    embedding_case(F32, F32, GHC_DTYPE_I64, 5, 1, 1);
    /* an id out of range: a row of NaN on the GPU (ops.h), the other rows right */
    const int64_t V = 9, D = 7;
    ghc_tensor_t *tab = randn(F32, 1.0f, 5, SHP(V, D)), *ids = mk(GHC_DTYPE_I32, CPUD, SHP(3));
    int32_t *pi = ghc_tensor_data(ids);
    pi[0] = 4, pi[1] = (int32_t)V, pi[2] = -1;
    ghc_tensor_t *gt = up(tab), *gi = up(ids), *gy = poisoned(F32, SHP(3, D));
    OK(ghc_op_fill(gy, 0.0, NULL));
    OK(ghc_op_embedding(gy, gt, gi, NULL));
    ghc_tensor_t *h = down(gy);
    for (int64_t d = 0; d < D; d++) {
        ck_assert_float_eq(get(h, d), get(tab, 4 * D + d));
        ck_assert(isnan(get(h, D + d)) && isnan(get(h, 2 * D + d)));
    }
    ghc_tensor_free(h);
    ghc_tensor_free(tab);
    ghc_tensor_free(ids);
    ghc_tensor_free(gt);
    ghc_tensor_free(gi);
    ghc_tensor_free(gy);
}
END_TEST

/* ---- relative-position bias --------------------------------------------------------------- */

static void rel_pos_case(enum ghc_dtype tt, int64_t H, int64_t Lq, int64_t Lk, int32_t nb, int32_t maxd, bool bidir)
{
    char what[160];
    ghc_tensor_t *tab = randn(tt, 1.0f, 77 + (uint64_t)H, SHP(nb, H));
    ghc_tensor_t *bias = mk(F32, CPUD, SHP(H, Lq, Lk));
    OK(ghc_op_rel_pos_bias(bias, tab, nb, maxd, bidir, NULL));
    ghc_tensor_t *gt = up(tab), *gb = poisoned(F32, SHP(H, Lq, Lk));
    OK(ghc_op_rel_pos_bias(gb, gt, nb, maxd, bidir, NULL));
    snprintf(what, sizeof(what), "rel_pos_bias %s [%lld, %lld, %lld] %d buckets, max %d, %s", ghc_dtype_name(tt),
             (long long)H, (long long)Lq, (long long)Lk, nb, maxd, bidir ? "bidirectional" : "causal");
    same_bits(gb, bias, what);
    ghc_tensor_free(tab);
    ghc_tensor_free(bias);
    ghc_tensor_free(gt);
    ghc_tensor_free(gb);
}

START_TEST(rel_pos_bias_ops)
{
    rel_pos_case(F32, 3, 40, 37, 32, 128, true);
    rel_pos_case(BF16, 5, 1, 300, 32, 128, true);
    rel_pos_case(F32, 2, 301, 3, 32, 128, true);
    rel_pos_case(F32, 3, 70, 70, 32, 20, false);
    rel_pos_case(BF16, 4, 33, 65, 8, 16, true);
    rel_pos_case(F32, 64, 512, 512, 32, 128, true);   /* umT5-XXL's layer */
}
END_TEST

/* ---- attention with bias and mask --------------------------------------------------------- */

/* q [B, Lq, H, Dh], k and v [B, Lk, H, Dh] in dt; bias [H, Lq, Lk] f32 (with_bias); key mask
 * [B, Lk] in mask_dt with entry b's first len[b] keys kept (lens NULL: no mask), and of those,
 * with holes, every key j with (3 j + b) % 11 == 4 masked too, and with holes > 1 also keys 64 to
 * 127 (a whole tile of 64 in the middle); o flat [B, Lq, H Dh] when flat_o. GPU against the CPU
 * op on the same inputs. */
static void attention_mask_case(enum ghc_dtype dt, int64_t B, int64_t Lq, int64_t Lk, int64_t H, int64_t Dh,
                                bool with_bias, const int64_t *lens, int holes, enum ghc_dtype mask_dt, float scale,
                                bool flat_o, double atol, double rtol)
{
    char what[200];
    const uint64_t sd = (uint64_t)(B * 1000 + Lq * 10 + Dh);
    const float amp = 1.0f / sqrtf(sqrtf((float)Dh));   /* scores of order 1 */
    ghc_tensor_t *q = randn(dt, amp, sd + 1, SHP(B, Lq, H, Dh)), *k = randn(dt, amp, sd + 2, SHP(B, Lk, H, Dh));
    ghc_tensor_t *v = randn(dt, 1.0f, sd + 3, SHP(B, Lk, H, Dh));
    ghc_tensor_t *bias = with_bias ? randn(F32, 2.0f, sd + 4, SHP(H, Lq, Lk)) : NULL, *mask = NULL;
    if (lens) {
        ghc_tensor_t *m32 = mk(F32, CPUD, SHP(B, Lk));
        float *m = ghc_tensor_data(m32);
        for (int64_t b = 0; b < B; b++)
            for (int64_t j = 0; j < Lk; j++)
                m[b * Lk + j] = j < lens[b] && !(holes && (3 * j + b) % 11 == 4) && !(holes > 1 && j >= 64 && j < 128)
                              ? 1.0f : 0.0f;
        mask = mk(mask_dt, CPUD, SHP(B, Lk));
        OK(ghc_tensor_convert_cpu(mask, m32, 1.0f));
        ghc_tensor_free(m32);
    }
    ghc_tensor_t *o = flat_o ? mk(dt, CPUD, SHP(B, Lq, H * Dh)) : mk(dt, CPUD, SHP(B, Lq, H, Dh));
    OK(ghc_op_attention_bias_fwd(o, q, k, v, bias, mask, scale, NULL));
    ghc_tensor_t *gq = up(q), *gk = up(k), *gv = up(v), *gb = bias ? up(bias) : NULL, *gm = mask ? up(mask) : NULL;
    ghc_tensor_t *go = poisoned(dt, ghc_tensor_ndim(o), ghc_tensor_shape(o));
    OK(ghc_op_attention_bias_fwd(go, gq, gk, gv, gb, gm, scale, NULL));
    snprintf(what, sizeof(what), "attention_bias %s [%lld, %lld|%lld, %lld, %lld]%s%s%s%s scale %g", ghc_dtype_name(dt),
             (long long)B, (long long)Lq, (long long)Lk, (long long)H, (long long)Dh, with_bias ? " bias" : "",
             lens ? " mask " : "", lens ? ghc_dtype_name(mask_dt) : "", holes ? " holes" : "", (double)scale);
    close_to(go, o, atol, rtol, what);
    /* an entry whose keys are all masked gets exactly 0 */
    ghc_tensor_t *h = down(go);
    for (int64_t b = 0; lens && b < B; b++)
        for (int64_t i = 0; lens[b] == 0 && i < Lq * H * Dh; i++)
            ck_assert_msg(get(h, b * Lq * H * Dh + i) == 0.0f, "%s: entry %lld all masked, [%lld] = %g", what,
                          (long long)b, (long long)i, get(h, b * Lq * H * Dh + i));
    ghc_tensor_t *ts[] = { q, k, v, bias, mask, o, gq, gk, gv, gb, gm, go, h };
    for (size_t i = 0; i < sizeof(ts) / sizeof(ts[0]); i++)
        ghc_tensor_free(ts[i]);
}

/* The same with a plain f32 mask of lengths. */
static void attention_case(enum ghc_dtype dt, int64_t B, int64_t Lq, int64_t Lk, int64_t H, int64_t Dh,
                           bool with_bias, const int64_t *lens, float scale, bool flat_o, double atol, double rtol)
{
    attention_mask_case(dt, B, Lq, Lk, H, Dh, with_bias, lens, 0, F32, scale, flat_o, atol, rtol);
}

START_TEST(attention_ops)
{
    const int64_t l2[2] = { 9, 0 }, l3[3] = { 70, 1, 41 }, l5[5] = { 13, 13, 2, 0, 7 };
    attention_case(F32, 2, 9, 13, 3, 5, true, l2, 1.0f, true, 2e-5, 2e-5);
    attention_case(F32, 2, 9, 13, 3, 5, false, NULL, 0.5f, false, 2e-5, 2e-5);
    attention_case(F32, 3, 33, 70, 4, 64, false, l3, 0.125f, false, 2e-5, 2e-5);
    attention_case(F32, 5, 1, 13, 7, 3, true, l5, 1.0f, true, 2e-5, 2e-5);
    attention_case(F32, 1, 77, 77, 64, 64, true, NULL, 1.0f, true, 2e-5, 2e-5);
    attention_case(BF16, 2, 9, 13, 3, 5, true, l2, 1.0f, true, 2e-2, 2e-2);
    attention_case(BF16, 3, 33, 70, 4, 64, true, l3, 1.0f, false, 2e-2, 2e-2);
    attention_case(BF16, 5, 1, 13, 7, 8, false, l5, 1.0f, true, 2e-2, 2e-2);
    /* umT5-XXL's layer: 3 prompts of 512 positions, 64 heads of 64 (two rounds of scores) */
    const int64_t xxl[3] = { 512, 300, 77 };
    attention_case(BF16, 3, 512, 512, 64, 64, true, xxl, 1.0f, true, 2e-2, 2e-2);
    attention_case(F32, 1, 512, 512, 64, 64, true, xxl + 1, 1.0f, true, 2e-5, 2e-5);
}
END_TEST

/* The fused bf16 kernel (Dh 64) against the CPU: tails of Lq and Lk (not multiples of its tiles
 * of 64), keys masked inside the kept ones, a whole masked tile between kept ones, key tiles
 * past the last kept key (not visited), an entry with every key masked (O exactly 0), masks
 * in f32, bf16 and fp8, with and without bias, scale other than 1; and beside it the GEMM path
 * (Dh 40, and f32 at Dh 64) on the same masks. */
START_TEST(attention_fused)
{
    const int64_t none[2] = { 77, 0 }, l130[2] = { 130, 97 }, l512[2] = { 512, 200 }, some[2] = { 0, 129 };
    const int64_t part[2] = { 300, 70 }, one[1] = { 65 };
    const double at = 2e-2, rt = 2e-2;
    attention_mask_case(BF16, 2, 77, 77, 3, 64, true, none, 1, F32, 1.0f, true, at, rt);
    attention_mask_case(BF16, 2, 77, 130, 3, 64, true, l130, 2, F32, 1.0f, false, at, rt);
    attention_mask_case(BF16, 2, 512, 512, 3, 64, true, l512, 2, BF16, 1.0f, true, at, rt);
    attention_mask_case(BF16, 2, 512, 130, 3, 64, true, some, 1, F32, 1.0f, true, at, rt);
    attention_mask_case(BF16, 2, 77, 512, 3, 64, true, part, 1, GHC_DTYPE_F8_E4M3, 1.0f, false, at, rt);
    attention_mask_case(BF16, 2, 130, 77, 3, 64, false, none, 1, GHC_DTYPE_F16, 0.125f, true, at, rt);
    attention_mask_case(BF16, 1, 1, 65, 2, 64, true, one, 1, F32, 1.0f, true, at, rt);
    attention_mask_case(BF16, 2, 77, 130, 3, 64, true, NULL, 0, F32, 0.5f, true, at, rt);
    attention_mask_case(BF16, 2, 64, 128, 3, 64, false, NULL, 0, F32, 1.0f, false, at, rt);
    /* the GEMM path on the same kinds of masks */
    attention_mask_case(BF16, 2, 77, 130, 3, 40, true, l130, 2, F32, 1.0f, true, at, rt);
    attention_mask_case(BF16, 2, 77, 77, 3, 40, true, none, 1, BF16, 1.0f, false, at, rt);
    attention_mask_case(F32, 2, 77, 130, 3, 64, true, l130, 2, BF16, 1.0f, true, 2e-5, 2e-5);
}
END_TEST

/* ---- the encoder -------------------------------------------------------------------------- */

START_TEST(encoder_golden_f32)
{
    const struct ghc_umt5_place f32 = { 0, F32 };
    golden_check(core, "hf/model.safetensors.index.json", "out_f32", &f32, 1e-4, 1e-4);
    golden_check(core, "comfy_fp8_scaled.safetensors", "out_quant", &f32, 1e-4, 1e-4);
    golden_check(core, "official.safetensors", "out_quant", &f32, 1e-4, 1e-4);
}
END_TEST

START_TEST(encoder_golden_bf16)
{
    const struct ghc_umt5_place bf16 = { 0, BF16 };
    golden_check(core, "hf/model.safetensors.index.json", "out_f32", &bf16, UMT5_BF16_ATOL, UMT5_BF16_RTOL);
    golden_check(core, "comfy_fp8_scaled.safetensors", "out_quant", &bf16, UMT5_BF16_ATOL, UMT5_BF16_RTOL);
    golden_check(core, "official.safetensors", "out_quant", &bf16, UMT5_BF16_ATOL, UMT5_BF16_RTOL);
}
END_TEST

/* A random encoder with umT5's head size on a padded batch of 200-token prompts: the GPU's
 * outputs (f32 and bf16) against the CPU's f32. */
START_TEST(encoder_random_batch)
{
    const struct ghc_umt5_place f32 = { 0, F32 }, bf16 = { 0, BF16 };
    random_batch_check(core, &f32, 200, 1e-4, 1e-4, 1e-5);
    random_batch_check(core, &bf16, 200, UMT5_BF16_RANDOM_ATOL, UMT5_BF16_RANDOM_RTOL,
                       UMT5_BF16_RANDOM_L2);
}
END_TEST

/* The `umt5` plugin made by the core, as `gh200core prepare` makes it, on the GPU: its encoding
 * of a caption equals (f32) or is near (bf16) the same random encoder's on the CPU. */
START_TEST(plugin_on_gpu)
{
    static const char *const dtypes[2] = { "f32", "bf16" };
    const char *text = "a cat walks on the piano, then sits";
    ghc_tensor_t *ref = NULL;
    for (int d = -1; d < 2; d++) {
        char cfg[512];
        snprintf(cfg, sizeof(cfg), "mempolicy = { plugin = \"device\"; };\n"
                 "text_encoder = { plugin = \"umt5\"; device = %d; dtype = \"%s\"; random = { d_model = 64; "
                 "heads = 2; d_kv = 32; d_ff = 96; layers = 2; seed = 4; }; };\n", d < 0 ? -1 : 0,
                 dtypes[d < 0 ? 0 : d]);
        ghc_core_t *c = ghc_core_init();
        ck_assert_ptr_nonnull(c);
        ck_assert_msg(ghc_plugin_add_path(c, tu_env("GHC_BUILD_PLUGINS")) == 0 &&
                      ghc_config_load_string(c, cfg, "t.cfg", NULL, NULL, 0) == 0 && ghc_run_init(c) == 0, "%s",
                      ghc_error_message(c));
        ghc_text_encoder_t *te = ghc_text_encoder_get(c);
        ck_assert_msg(te != NULL, "%s", ghc_error_message(c));
        ghc_tensor_t *y = NULL;
        ck_assert_msg(ghc_text_encoder_encode(te, text, &y) == 0, "%s", ghc_error_message(c));
        ck_assert_int_eq(ghc_tensor_device(y), CPUD);
        ck_assert_int_eq(ghc_tensor_dim(y, 0), (int64_t)strlen(text) + 1);
        if (d < 0) {
            ref = mk(F32, CPUD, ghc_tensor_ndim(y), ghc_tensor_shape(y));
            memcpy(ghc_tensor_data(ref), ghc_tensor_cdata(y), ghc_tensor_nbytes(y));
        } else {
            const float *a = ghc_tensor_cdata(y), *w = ghc_tensor_cdata(ref);
            const double atol = d ? UMT5_BF16_ATOL : 1e-4, rtol = d ? UMT5_BF16_RTOL : 1e-4;
            for (int64_t i = 0; i < ghc_tensor_numel(y); i++)
                ck_assert_msg(fabs((double)a[i] - w[i]) <= atol + rtol * fabs(w[i]), "plugin %s [%lld]: %g vs %g",
                              dtypes[d], (long long)i, a[i], w[i]);
        }
        ghc_tensor_free(y);
        ghc_run_free(c);
        ghc_core_free(c);
    }
    ghc_tensor_free(ref);
}
END_TEST

/* ---- main --------------------------------------------------------------------------------- */

int main(void)
{
    if (ghc_k_device_count() < 1) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    if (!(core = tu_device_core()))
        return EXIT_FAILURE;
    Suite *s = suite_create("umt5_cuda");
    TCase *tc = tcase_create("ops");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, embedding_ops);
    tcase_add_test(tc, rel_pos_bias_ops);
    tcase_add_test(tc, attention_ops);
    tcase_add_test(tc, attention_fused);
    suite_add_tcase(s, tc);
    tc = tcase_create("encoder");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, encoder_golden_f32);
    tcase_add_test(tc, encoder_golden_bf16);
    tcase_add_test(tc, encoder_random_batch);
    tcase_add_test(tc, plugin_on_gpu);
    suite_add_tcase(s, tc);
    int status = tu_run_suite(s, true);
    ghc_run_free(core);
    ghc_core_free(core);
    return status;
}
