/* umt5_golden.h: the umT5 encoder against the golden fixtures of tests/fixtures/umt5, shared by
 * test_umt5 (CPU: f32 tight, bf16 within bf16's precision) and test_umt5_cuda (the same on a
 * GPU). Every golden prompt runs three ways: padded with its mask, on its true tokens only, and
 * all prompts as one padded batch (ghc_umt5_encode_batch). Also a random encoder of umT5's head
 * size on a place against the same on the CPU in f32. Header-only: static functions, one copy
 * per test program. */
#ifndef GHC_UMT5_GOLDEN_H
#define GHC_UMT5_GOLDEN_H

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <gh200core/safetensors.h>

#include "../plugins/umt5/umt5.h"
#include "testutil.h"

/* The tolerance of a bf16 place (bf16 linears and activations; f32 residual, norms and
 * softmax) against the f32 goldens: the worst error on the CPU is about 0.06 on outputs of
 * magnitude up to a few (golden_check prints it). */
#define UMT5_BF16_ATOL 0.15
#define UMT5_BF16_RTOL 0.05
/* random_batch_check's in bf16 (see there) */
#define UMT5_BF16_RANDOM_ATOL 0.6
#define UMT5_BF16_RANDOM_RTOL 0.1
#define UMT5_BF16_RANDOM_L2   0.05

/* tests/fixtures/umt5/<name> (caller frees). */
static char *fixture(const char *name)
{
    char *p = malloc(1024);
    ck_assert_ptr_nonnull(p);
    snprintf(p, 1024, "%s/tests/fixtures/umt5/%s", tu_env("GHC_TOP_SRCDIR"), name);
    return p;
}

/* y [L, D] (a CPU f32 tensor) against rows of `want` within atol + rtol |want|; returns the
 * largest error. */
static double golden_rows(const ghc_tensor_t *y, const float *want, int64_t L, int64_t D, double atol, double rtol,
                          const char *what)
{
    ck_assert_int_eq(ghc_tensor_ndim(y), 2);
    ck_assert_int_eq(ghc_tensor_dim(y, 0), L);   /* trimmed to the true length */
    ck_assert_int_eq(ghc_tensor_dim(y, 1), D);
    ck_assert_int_eq(ghc_tensor_device(y), GHC_DEVICE_CPU);
    const float *py = ghc_tensor_cdata(y);
    double worst = 0.0;
    for (int64_t i = 0; i < L * D; i++) {
        const double err = fabs((double)py[i] - want[i]);
        ck_assert_msg(err <= atol + rtol * fabs(want[i]), "%s [%lld]: %.8g vs %.8g", what, (long long)i, py[i],
                      want[i]);
        worst = err > worst ? err : worst;
    }
    return worst;
}

/* Load `file` on `place` and check its output for every golden prompt against golden `out`
 * (out_f32 or out_quant). */
static void golden_check(ghc_core_t *core, const char *file, const char *out_name, const struct ghc_umt5_place *place,
                         double atol, double rtol)
{
    char *p = fixture(file), *g = fixture("golden.safetensors"), what[256];
    ghc_umt5_t *enc = ghc_umt5_init(core, p, NULL, place);
    ck_assert_msg(enc != NULL, "%s", ghc_error_message(core));
    const struct ghc_umt5_config *c = ghc_umt5_get_config(enc);
    ck_assert_int_eq(c->vocab, 416);
    ck_assert_int_eq(c->d_model, 32);
    ck_assert_int_eq(c->d_kv, 8);
    ck_assert_int_eq(c->d_ff, 40);
    ck_assert_int_eq(c->layers, 2);
    ck_assert_int_eq(c->heads, 4);
    ck_assert_int_eq(c->num_buckets, 32);
    ck_assert_int_eq(c->max_distance, 128);
    ghc_st_t *st = ghc_st_open(core, g);
    ck_assert_ptr_nonnull(st);
    ghc_tensor_t *ids = ghc_st_load(st, "ids", GHC_DTYPE_I32, GHC_ROLE_WORKSPACE);
    ghc_tensor_t *mask = ghc_st_load(st, "mask", GHC_DTYPE_I32, GHC_ROLE_WORKSPACE);
    ghc_tensor_t *want = ghc_st_load(st, out_name, GHC_DTYPE_F32, GHC_ROLE_WORKSPACE);
    ck_assert(ids && mask && want);
    const int64_t B = ghc_tensor_dim(ids, 0), n = ghc_tensor_dim(ids, 1), D = c->d_model;
    ck_assert_int_eq(B, 3);
    const char *where = !place || place->device < 0 ? "cpu" : "cuda";
    const char *dt = ghc_dtype_name(place ? place->dtype : GHC_DTYPE_F32);
    double worst = 0.0;
    ghc_tensor_t *batch[3];
    ck_assert_msg(ghc_umt5_encode_batch(enc, ghc_tensor_cdata(ids), ghc_tensor_cdata(mask), (int32_t)B, (int32_t)n,
                                        batch) == 0, "%s", ghc_error_message(core));
    for (int64_t b = 0; b < B; b++) {
        const int32_t *pi = (const int32_t *)ghc_tensor_cdata(ids) + b * n;
        const int32_t *pm = (const int32_t *)ghc_tensor_cdata(mask) + b * n;
        const float *pw = (const float *)ghc_tensor_cdata(want) + b * n * D;
        int32_t L = 0;
        while (L < n && pm[L])
            L++;
        for (int pass = 0; pass < 3; pass++) {
            ghc_tensor_t *y = pass == 2 ? batch[b] : pass ? ghc_umt5_encode(enc, pi, NULL, L)
                                                          : ghc_umt5_encode(enc, pi, pm, (int32_t)n);
            ck_assert_msg(y != NULL, "%s", ghc_error_message(core));
            snprintf(what, sizeof(what), "%s %s on %s %s prompt %lld %s", file, out_name, where, dt, (long long)b,
                     pass == 0 ? "padded" : pass == 1 ? "true tokens" : "in a batch");
            const double e = golden_rows(y, pw, L, D, atol, rtol, what);
            worst = e > worst ? e : worst;
            ghc_tensor_free(y);
        }
    }
    printf("umt5 golden %s (%s) on %s in %s: max abs error %.3g\n", file, out_name, where, dt, worst);
    ghc_tensor_free(ids);
    ghc_tensor_free(mask);
    ghc_tensor_free(want);
    ghc_st_free(st);
    ghc_umt5_free(enc);
    free(p);
    free(g);
}

/* A random encoder with umT5's head size (4 heads of 64, d_model 256, d_ff 512, 2 layers) on a
 * padded batch of 3 prompts of N <= 256 positions, of lengths N, 2N/3 and 9: its outputs on
 * `place` against the CPU's in f32, each element within atol + rtol |want| and all of them within
 * a relative L2 error of l2. (Its attention logits have a standard deviation of about 8, so bf16's
 * rounding of q and k moves the outputs more than in the golden model: about 2.3% in L2 and 0.2
 * at most on the CPU, for outputs up to 4.) */
static void random_batch_check(ghc_core_t *core, const struct ghc_umt5_place *place, int32_t N, double atol,
                               double rtol, double l2)
{
    const struct ghc_umt5_config cfg = { .vocab = 1000, .d_model = 256, .d_kv = 64, .d_ff = 512, .layers = 2,
                                         .heads = 4, .num_buckets = 32 };
    enum { B = 3 };
    ck_assert(N >= 9 && N <= 256);
    const int32_t L[B] = { N, 2 * N / 3, 9 };
    static int32_t ids[B * 256], mask[B * 256];
    for (int b = 0; b < B; b++)
        for (int i = 0; i < N; i++) {
            ids[b * N + i] = i < L[b] ? (b * 389 + i * 97) % 997 + 2 : 0;
            mask[b * N + i] = i < L[b];
        }
    ghc_umt5_t *cpu = ghc_umt5_init_random(core, &cfg, 5, NULL), *enc = ghc_umt5_init_random(core, &cfg, 5, place);
    ck_assert_msg(cpu && enc, "%s", ghc_error_message(core));
    ghc_tensor_t *want[B], *got[B];
    ck_assert_msg(ghc_umt5_encode_batch(cpu, ids, mask, B, N, want) == 0, "%s", ghc_error_message(core));
    ck_assert_msg(ghc_umt5_encode_batch(enc, ids, mask, B, N, got) == 0, "%s", ghc_error_message(core));
    double worst = 0.0, se = 0.0, sw = 0.0;
    for (int b = 0; b < B; b++) {
        char what[128];
        snprintf(what, sizeof(what), "random encoder on %s %s, prompt %d of %d tokens", place->device < 0 ? "cpu"
                 : "cuda", ghc_dtype_name(place->dtype), b, L[b]);
        const float *pw = ghc_tensor_cdata(want[b]);
        const double e = golden_rows(got[b], pw, L[b], cfg.d_model, atol, rtol, what);
        worst = e > worst ? e : worst;
        for (int64_t i = 0; i < L[b] * cfg.d_model; i++) {
            const double d = (double)((const float *)ghc_tensor_cdata(got[b]))[i] - pw[i];
            se += d * d;
            sw += (double)pw[i] * pw[i];
        }
        ghc_tensor_free(got[b]);
        ghc_tensor_free(want[b]);
    }
    const double rel = sqrt(se / sw);
    printf("umt5 random batch on %s in %s: max abs error %.3g, relative L2 %.3g\n", place->device < 0 ? "cpu"
           : "cuda", ghc_dtype_name(place->dtype), worst, rel);
    ck_assert_msg(rel <= l2, "random encoder on %s: relative L2 error %g > %g", ghc_dtype_name(place->dtype), rel, l2);
    ghc_umt5_free(cpu);
    ghc_umt5_free(enc);
}

#endif /* GHC_UMT5_GOLDEN_H */
