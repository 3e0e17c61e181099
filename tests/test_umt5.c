/* test_umt5.c: the umT5 text encoder module (plugins/umt5) against the golden fixtures of
 * tests/fixtures/umt5 (sentencepiece, ftfy and transformers; tests/fixtures/README.md, "umt5"):
 * the tokenizer's ids and Wan's cleaning exactly, the encoder's last hidden state within f32
 * tolerances for every file naming (transformers sharded f32, ComfyUI fp8 scaled, Wan's official
 * names in bf16), the relative-position buckets, the new text-encoder ops against naive loops
 * written here, and the messages for bad input. */
#include <config.h>

#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gh200core/encoder.h>
#include <gh200core/gh200core.h>
#include <gh200core/ops.h>
#include <gh200core/safetensors.h>

#include "../plugins/umt5/umt5.h"
#include "testutil.h"
#include "umt5_golden.h"   /* defines: fixture, golden_check, UMT5_BF16_ATOL */

static ghc_core_t *core;

static void setup(void) { core = ghc_core_init(); }
static void teardown(void) { ghc_core_free(core); }

static json_t *tokens_json(void)
{
    char *p = fixture("tokens.json");
    json_error_t err;
    json_t *j = json_load_file(p, 0, &err);
    ck_assert_msg(j != NULL, "%s:%d: %s", p, err.line, err.text);
    free(p);
    return j;
}

/* ---- tokenizer ------------------------------------------------------------------------------- */

#ifdef GHC_HAVE_SENTENCEPIECE
/* Every prompt's ids (cleaned, truncated, EOS, padding, mask) equal the reference's. */
static void check_ids(ghc_umt5_tok_t *tok)
{
    json_t *j = tokens_json(), *cases = json_object_get(j, "cases");
    const int32_t text_len = (int32_t)json_integer_value(json_object_get(j, "text_len"));
    ck_assert_int_gt(json_array_size(cases), 10);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)text_len), *mask = malloc(sizeof(int32_t) * (size_t)text_len);
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) {
        const char *text = json_string_value(json_object_get(c, "text"));
        json_t *want = json_object_get(c, "ids");
        int L = ghc_umt5_tok_encode(tok, text, true, text_len, ids, mask);
        ck_assert_msg(L == (int)json_array_size(want), "case %zu: L %d, want %zu (%s)", i, L, json_array_size(want),
                      L < 0 ? ghc_error_message(core) : "");
        for (int32_t k = 0; k < text_len; k++) {
            int32_t w = k < L ? (int32_t)json_integer_value(json_array_get(want, (size_t)k)) : GHC_UMT5_PAD_ID;
            ck_assert_msg(ids[k] == w, "case %zu ('%s'): id[%d] = %d, want %d", i, text, k, ids[k], w);
            ck_assert_int_eq(mask[k], k < L);
        }
        ck_assert_int_eq(ids[L - 1], GHC_UMT5_EOS_ID);
    }
    free(ids);
    free(mask);
    json_decref(j);
}

START_TEST(tok_ids)
{
    char *p = fixture("spiece.model");
    ghc_umt5_tok_t *tok = ghc_umt5_tok_init(core, p);
    ck_assert_msg(tok != NULL, "%s", ghc_error_message(core));
    ck_assert_int_eq(ghc_umt5_tok_size(tok), 400);
    check_ids(tok);
    ghc_umt5_tok_free(tok);
    free(p);
}
END_TEST

/* The model from bytes in memory (ComfyUI's spiece_model tensor) tokenises the same. */
START_TEST(tok_bytes)
{
    char *p = fixture("spiece.model");
    FILE *f = fopen(p, "rb");
    ck_assert_ptr_nonnull(f);
    char buf[65536];
    size_t n = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    ghc_umt5_tok_t *tok = ghc_umt5_tok_init_bytes(core, "spiece_model", buf, n);
    ck_assert_msg(tok != NULL, "%s", ghc_error_message(core));
    check_ids(tok);
    ghc_umt5_tok_free(tok);
    /* a truncated model is refused, naming it */
    ck_assert_ptr_null(ghc_umt5_tok_init_bytes(core, "spiece_model", buf, n / 3));
    ck_assert_int_eq(ghc_error_code(core), GHC_EFORMAT);
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), "spiece_model"));
    free(p);
}
END_TEST

/* Without cleaning, text goes to SentencePiece as it is; text_len 1 keeps the EOS only. */
START_TEST(tok_raw_and_short)
{
    char *p = fixture("spiece.model");
    ghc_umt5_tok_t *tok = ghc_umt5_tok_init(core, p);
    ck_assert_ptr_nonnull(tok);
    int32_t a[64], b[64], m[64];
    int La = ghc_umt5_tok_encode(tok, "&amp; cat", false, 64, a, NULL);
    int Lb = ghc_umt5_tok_encode(tok, "&amp; cat", true, 64, b, NULL);
    ck_assert_int_gt(La, Lb);   /* "&amp;" raw is several pieces, cleaned it is "&" */
    ck_assert_int_eq(ghc_umt5_tok_encode(tok, "the cat runs", true, 1, a, m), 1);
    ck_assert_int_eq(a[0], GHC_UMT5_EOS_ID);
    ck_assert_int_eq(m[0], 1);
    ck_assert_int_eq(ghc_umt5_tok_encode(tok, "x", true, 0, a, m), GHC_EINVAL);
    ck_assert_int_eq(ghc_umt5_tok_encode(tok, "bad \xC3\x28 utf-8", true, 64, a, m), GHC_EINVAL);
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), "byte 4"));
    ghc_umt5_tok_free(tok);
    free(p);
}
END_TEST

START_TEST(tok_errors)
{
    char *dir = tu_tmpdir();
    char path[4200];
    snprintf(path, sizeof(path), "%s/spiece.model", dir);
    ck_assert_ptr_null(ghc_umt5_tok_init(core, path));
    ck_assert_int_eq(ghc_error_code(core), GHC_EIO);
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), path));
    char *bad = tu_write(dir, "spiece.model", "this is not a protobuf \x01\x02\x03 at all");
    ck_assert_ptr_null(ghc_umt5_tok_init(core, bad));
    ck_assert_int_eq(ghc_error_code(core), GHC_EFORMAT);
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), bad));
    char *js = tu_write(dir, "tokenizer.json", "{}");
    ck_assert_ptr_null(ghc_umt5_tok_init(core, js));
    ck_assert_int_eq(ghc_error_code(core), GHC_EUNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), "spiece.model"));
    free(bad);
    free(js);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST
#else
START_TEST(tok_unsupported)
{
    char *p = fixture("spiece.model");
    ck_assert_ptr_null(ghc_umt5_tok_init(core, p));
    ck_assert_int_eq(ghc_error_code(core), GHC_EUNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), "sentencepiece"));
    free(p);
}
END_TEST
#endif

/* Wan's cleaning of every prompt, as Python's ftfy + html.unescape + regex gave it. */
START_TEST(clean_text)
{
    json_t *j = tokens_json(), *cases = json_object_get(j, "cases");
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) {
        const char *text = json_string_value(json_object_get(c, "text"));
        const char *want = json_string_value(json_object_get(c, "clean"));
        char *got = ghc_umt5_clean(core, text);
        ck_assert_msg(got != NULL, "%s", ghc_error_message(core));
        ck_assert_msg(strcmp(got, want) == 0, "case %zu: '%s' -> '%s', want '%s'", i, text, got, want);
        free(got);
    }
    json_decref(j);
    /* invalid UTF-8: overlong, surrogate, truncated */
    const char *bad[] = { "a\xC0\xAF", "b\xED\xA0\x80", "c\xE4\xB8" };
    for (size_t k = 0; k < 3; k++) {
        ck_assert_ptr_null(ghc_umt5_clean(core, bad[k]));
        ck_assert_int_eq(ghc_error_code(core), GHC_EINVAL);
        ck_assert_ptr_nonnull(strstr(ghc_error_message(core), "byte 1"));
    }
}
END_TEST

/* ---- ops -------------------------------------------------------------------------------------- */

static ghc_tensor_t *tensor(enum ghc_dtype dt, int ndim, const int64_t *shape)
{
    ghc_tensor_t *t = ghc_tensor_init(core, dt, ndim, shape, GHC_DEVICE_CPU, GHC_ROLE_WORKSPACE);
    ck_assert_msg(t != NULL, "%s", ghc_error_message(core));
    return t;
}

static ghc_tensor_t *randn(enum ghc_dtype dt, int ndim, const int64_t *shape, uint64_t seed)
{
    ghc_tensor_t *t = tensor(dt, ndim, shape);
    struct ghc_rng rng = { seed, 0 };
    ck_assert_int_eq(ghc_op_rand_normal(t, &rng, NULL), 0);
    return t;
}

static float get(const ghc_tensor_t *t, int64_t i)
{
    switch (ghc_tensor_dtype(t)) {
    case GHC_DTYPE_F32:  return ((const float *)ghc_tensor_cdata(t))[i];
    case GHC_DTYPE_BF16: return ghc_bf16_to_f32(((const uint16_t *)ghc_tensor_cdata(t))[i]);
    case GHC_DTYPE_F16:  return ghc_f16_to_f32(((const uint16_t *)ghc_tensor_cdata(t))[i]);
    default:             ck_abort_msg("dtype"); return 0;
    }
}

/* The bucket of every r in [-600, 600] equals transformers'; and the spec's table. */
START_TEST(op_buckets)
{
    char *p = fixture("golden.safetensors");
    ghc_st_t *st = ghc_st_open(core, p);
    ck_assert_msg(st != NULL, "%s", ghc_error_message(core));
    ghc_tensor_t *b = ghc_st_load(st, "buckets", GHC_DTYPE_I32, GHC_ROLE_WORKSPACE);
    ck_assert_ptr_nonnull(b);
    ck_assert_int_eq(ghc_tensor_numel(b), 1201);
    const int32_t *want = ghc_tensor_cdata(b);
    for (int64_t r = -600; r <= 600; r++)
        ck_assert_msg(ghc_rel_pos_bucket(r, 32, 128, true) == want[r + 600], "r %lld: %d, want %d", (long long)r,
                      ghc_rel_pos_bucket(r, 32, 128, true), want[r + 600]);
    /* the powers of two sit on bucket edges: 16 -> 10, 32 -> 12, 64 -> 14 (keys before the query) */
    ck_assert_int_eq(ghc_rel_pos_bucket(-16, 32, 128, true), 10);
    ck_assert_int_eq(ghc_rel_pos_bucket(-15, 32, 128, true), 9);
    ck_assert_int_eq(ghc_rel_pos_bucket(32, 32, 128, true), 16 + 12);
    ck_assert_int_eq(ghc_rel_pos_bucket(64, 32, 128, true), 16 + 14);
    ck_assert_int_eq(ghc_rel_pos_bucket(91, 32, 128, true), 16 + 15);
    ck_assert_int_eq(ghc_rel_pos_bucket(5, 32, 128, false), 0);   /* causal: keys after the query */
    ck_assert_int_eq(ghc_rel_pos_bucket(-20, 32, 128, false), 16 + (int)(logf(20.0f / 16) / logf(8.0f) * 16));
    ghc_tensor_free(b);
    ghc_st_free(st);
    free(p);
}
END_TEST

START_TEST(op_embedding)
{
    const int64_t V = 11, D = 6, n = 5;
    ghc_tensor_t *tab = randn(GHC_DTYPE_BF16, 2, (const int64_t[]){ V, D }, 3);
    ghc_tensor_t *ids = tensor(GHC_DTYPE_I64, 1, (const int64_t[]){ n });
    ghc_tensor_t *y = tensor(GHC_DTYPE_F32, 2, (const int64_t[]){ n, D });
    int64_t *pi = ghc_tensor_data(ids);
    const int64_t v[5] = { 10, 0, 3, 3, 7 };
    memcpy(pi, v, sizeof(v));
    ck_assert_int_eq(ghc_op_embedding(y, tab, ids, NULL), 0);
    for (int64_t i = 0; i < n; i++)
        for (int64_t d = 0; d < D; d++)
            ck_assert_float_eq(get(y, i * D + d), get(tab, v[i] * D + d));
    pi[2] = V;
    ck_assert_int_eq(ghc_op_embedding(y, tab, ids, NULL), GHC_EINVAL);
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), "element 2 is 11"));
    pi[2] = -1;
    ck_assert_int_eq(ghc_op_embedding(y, tab, ids, NULL), GHC_EINVAL);
    ghc_tensor_t *y2 = tensor(GHC_DTYPE_F32, 2, (const int64_t[]){ n, D + 1 });
    pi[2] = 0;
    ck_assert_int_eq(ghc_op_embedding(y2, tab, ids, NULL), GHC_EINVAL);
    ghc_tensor_free(y2);
    ghc_tensor_free(tab);
    ghc_tensor_free(ids);
    ghc_tensor_free(y);
}
END_TEST

START_TEST(op_rel_pos_bias)
{
    const int64_t H = 3, Lq = 40, Lk = 37;
    ghc_tensor_t *tab = randn(GHC_DTYPE_F32, 2, (const int64_t[]){ 32, H }, 5);
    ghc_tensor_t *bias = tensor(GHC_DTYPE_F32, 3, (const int64_t[]){ H, Lq, Lk });
    ck_assert_int_eq(ghc_op_rel_pos_bias(bias, tab, 32, 128, true, NULL), 0);
    for (int64_t h = 0; h < H; h++)
        for (int64_t i = 0; i < Lq; i++)
            for (int64_t j = 0; j < Lk; j++)
                ck_assert_float_eq(get(bias, (h * Lq + i) * Lk + j),
                                   get(tab, ghc_rel_pos_bucket(j - i, 32, 128, true) * H + h));
    ck_assert_int_eq(ghc_op_rel_pos_bias(bias, tab, 16, 128, true, NULL), GHC_EINVAL);   /* table rows */
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), "table"));
    ghc_tensor_free(tab);
    ghc_tensor_free(bias);
}
END_TEST

/* Naive masked attention with bias, in double. */
static void naive_attention(double *o, const ghc_tensor_t *q, const ghc_tensor_t *k, const ghc_tensor_t *v,
                            const ghc_tensor_t *bias, const float *mask, float scale)
{
    const int64_t B = ghc_tensor_dim(q, 0), Lq = ghc_tensor_dim(q, 1), H = ghc_tensor_dim(q, 2),
                  Dh = ghc_tensor_dim(q, 3), Lk = ghc_tensor_dim(k, 1);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < Lq; i++) {
                double s[64], m = -INFINITY, z = 0;
                for (int64_t j = 0; j < Lk; j++) {
                    double d = 0;
                    for (int64_t e = 0; e < Dh; e++)
                        d += (double)get(q, ((b * Lq + i) * H + h) * Dh + e) * get(k, ((b * Lk + j) * H + h) * Dh + e);
                    s[j] = d * scale + (bias ? get(bias, (h * Lq + i) * Lk + j) : 0.0);
                    if (mask && mask[b * Lk + j] == 0)
                        s[j] = -INFINITY;
                    m = fmax(m, s[j]);
                }
                for (int64_t j = 0; j < Lk; j++)
                    z += m == -INFINITY ? 0 : exp(s[j] - m);
                for (int64_t e = 0; e < Dh; e++) {
                    double acc = 0;
                    for (int64_t j = 0; j < Lk; j++)
                        acc += m == -INFINITY ? 0 : exp(s[j] - m) / z * get(v, ((b * Lk + j) * H + h) * Dh + e);
                    o[((b * Lq + i) * H + h) * Dh + e] = acc;
                }
            }
}

static void attention_case(enum ghc_dtype dt, bool with_bias, bool with_mask, float scale, double tol)
{
    const int64_t B = 2, Lq = 9, Lk = 13, H = 3, Dh = 5;
    ghc_tensor_t *q = randn(dt, 4, (const int64_t[]){ B, Lq, H, Dh }, 11);
    ghc_tensor_t *k = randn(dt, 4, (const int64_t[]){ B, Lk, H, Dh }, 12);
    ghc_tensor_t *v = randn(dt, 4, (const int64_t[]){ B, Lk, H, Dh }, 13);
    ghc_tensor_t *bias = with_bias ? randn(GHC_DTYPE_F32, 3, (const int64_t[]){ H, Lq, Lk }, 14) : NULL;
    ghc_tensor_t *mask = NULL;
    ghc_tensor_t *o = tensor(dt, 3, (const int64_t[]){ B, Lq, H * Dh });
    if (with_mask) {   /* batch 0: 4 padding keys; batch 1: every key masked (o = 0) */
        mask = tensor(GHC_DTYPE_F32, 2, (const int64_t[]){ B, Lk });
        float *m = ghc_tensor_data(mask);
        for (int64_t j = 0; j < Lk; j++)
            m[j] = j < Lk - 4, m[Lk + j] = 0.0f;
    }
    double *ref = malloc(sizeof(double) * (size_t)(B * Lq * H * Dh));
    naive_attention(ref, q, k, v, bias, mask ? ghc_tensor_cdata(mask) : NULL, scale);
    ck_assert_int_eq(ghc_op_attention_bias_fwd(o, q, k, v, bias, mask, scale, NULL), 0);
    for (int64_t i = 0; i < ghc_tensor_numel(o); i++)
        ck_assert_msg(fabs(get(o, i) - ref[i]) <= tol * (1 + fabs(ref[i])), "[%lld] %g vs %g", (long long)i,
                      get(o, i), ref[i]);
    if (with_mask)
        for (int64_t i = Lq * H * Dh; i < ghc_tensor_numel(o); i++)
            ck_assert_float_eq(get(o, i), 0.0f);
    free(ref);
    ghc_tensor_free(q);
    ghc_tensor_free(k);
    ghc_tensor_free(v);
    ghc_tensor_free(bias);
    ghc_tensor_free(mask);
    ghc_tensor_free(o);
}

START_TEST(op_attention_bias)
{
    attention_case(GHC_DTYPE_F32, true, true, 1.0f, 2e-6);
    attention_case(GHC_DTYPE_F32, false, false, 0.5f, 2e-6);
    attention_case(GHC_DTYPE_F32, true, false, 1.0f, 2e-6);
    attention_case(GHC_DTYPE_BF16, true, true, 1.0f, 1e-2);
    /* shape errors name the tensor */
    ghc_tensor_t *q = randn(GHC_DTYPE_F32, 4, (const int64_t[]){ 1, 4, 2, 3 }, 1);
    ghc_tensor_t *o = tensor(GHC_DTYPE_F32, 4, (const int64_t[]){ 1, 4, 2, 3 });
    ghc_tensor_t *bias = tensor(GHC_DTYPE_F32, 3, (const int64_t[]){ 2, 4, 5 });
    ck_assert_int_eq(ghc_op_attention_bias_fwd(o, q, q, q, bias, NULL, 1.0f, NULL), GHC_EINVAL);
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), "'bias'"));
    ck_assert_int_eq(ghc_op_attention_bias_fwd(q, q, q, q, NULL, NULL, 1.0f, NULL), GHC_EINVAL);   /* o aliases */
    ghc_tensor_free(q);
    ghc_tensor_free(o);
    ghc_tensor_free(bias);
}
END_TEST

/* ---- encoder ---------------------------------------------------------------------------------- */

#define ATOL 1e-5
#define RTOL 1e-5

static void check_encoder(const char *file, const char *out_name)
{
    golden_check(core, file, out_name, NULL, ATOL, RTOL);
}

START_TEST(enc_transformers_sharded)
{
    check_encoder("hf/model.safetensors.index.json", "out_f32");
}
END_TEST

START_TEST(enc_comfy_fp8)
{
    check_encoder("comfy_fp8_scaled.safetensors", "out_quant");
}
END_TEST

START_TEST(enc_official)
{
    check_encoder("official.safetensors", "out_quant");
}
END_TEST

/* The bf16 place on the CPU (the same code a GPU runs, through the CPU ops): every file within
 * bf16's precision, padded, unpadded and batched; a random encoder of umT5's head size near its
 * f32 self. */
START_TEST(enc_bf16)
{
    const struct ghc_umt5_place bf16 = { GHC_DEVICE_CPU, GHC_DTYPE_BF16 };
    golden_check(core, "hf/model.safetensors.index.json", "out_f32", &bf16, UMT5_BF16_ATOL, UMT5_BF16_RTOL);
    golden_check(core, "comfy_fp8_scaled.safetensors", "out_quant", &bf16, UMT5_BF16_ATOL, UMT5_BF16_RTOL);
    golden_check(core, "official.safetensors", "out_quant", &bf16, UMT5_BF16_ATOL, UMT5_BF16_RTOL);
    random_batch_check(core, &bf16, 40, UMT5_BF16_RANDOM_ATOL, UMT5_BF16_RANDOM_RTOL, UMT5_BF16_RANDOM_L2);
}
END_TEST

/* A batch of prompts of different true lengths, some unpadded (no mask), equals each prompt run
 * alone; a bad prompt is named by its index, and every output is NULL. */
START_TEST(enc_batch)
{
    const struct ghc_umt5_config cfg = { .vocab = 50, .d_model = 24, .d_kv = 4, .d_ff = 40, .layers = 2, .heads = 3,
                                         .num_buckets = 32 };
    ghc_umt5_t *enc = ghc_umt5_init_random(core, &cfg, 7, NULL);
    ck_assert_msg(enc != NULL, "%s", ghc_error_message(core));
    enum { B = 4, N = 11 };
    int32_t ids[B * N], mask[B * N];
    const int32_t L[B] = { 11, 3, 7, 1 };
    for (int b = 0; b < B; b++)
        for (int i = 0; i < N; i++) {
            ids[b * N + i] = i < L[b] ? (b * 7 + i * 3) % 49 + 1 : 0;
            mask[b * N + i] = i < L[b];
        }
    ghc_tensor_t *out[B];
    ck_assert_msg(ghc_umt5_encode_batch(enc, ids, mask, B, N, out) == 0, "%s", ghc_error_message(core));
    for (int b = 0; b < B; b++) {
        ghc_tensor_t *one = ghc_umt5_encode(enc, ids + b * N, NULL, L[b]);
        ck_assert_ptr_nonnull(one);
        ck_assert_int_eq(ghc_tensor_dim(out[b], 0), L[b]);
        const float *a = ghc_tensor_cdata(out[b]), *w = ghc_tensor_cdata(one);
        for (int64_t i = 0; i < L[b] * cfg.d_model; i++)
            ck_assert_msg(fabsf(a[i] - w[i]) <= 1e-5f + 1e-5f * fabsf(w[i]), "prompt %d [%lld]: %g vs %g", b,
                          (long long)i, a[i], w[i]);
        ghc_tensor_free(one);
        ghc_tensor_free(out[b]);
    }
    /* without a mask every row runs all N positions */
    ck_assert_int_eq(ghc_umt5_encode_batch(enc, ids, NULL, 2, N, out), 0);
    ck_assert_int_eq(ghc_tensor_dim(out[1], 0), N);
    ghc_tensor_free(out[0]);
    ghc_tensor_free(out[1]);
    /* prompt 2's id out of range, prompt 1's mask not 1s then 0s */
    ids[2 * N + 5] = 50;
    ck_assert_int_eq(ghc_umt5_encode_batch(enc, ids, mask, B, N, out), GHC_EINVAL);
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), "prompt 2: id 50 at position 5"));
    for (int b = 0; b < B; b++)
        ck_assert_ptr_null(out[b]);
    ids[2 * N + 5] = 1;
    mask[1 * N + 9] = 1;
    ck_assert_int_eq(ghc_umt5_encode_batch(enc, ids, mask, B, N, out), GHC_EINVAL);
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), "prompt 1: mask[9]"));
    /* a place other than f32 or bf16, or no device, is refused */
    const struct ghc_umt5_place f16 = { GHC_DEVICE_CPU, GHC_DTYPE_F16 }, bad = { -2, GHC_DTYPE_F32 };
    ck_assert_ptr_null(ghc_umt5_init_random(core, &cfg, 7, &f16));
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), "dtype F16"));
    ck_assert_ptr_null(ghc_umt5_init_random(core, &cfg, 7, &bad));
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), "device -2"));
    ghc_umt5_free(enc);
}
END_TEST

/* A copy of official.safetensors without `drop` and with `reshape` given one more row, under a
 * prefix; returns its path (caller frees). */
static char *rewrite(const char *dir, const char *drop, const char *reshape, const char *prefix)
{
    char *src = fixture("official.safetensors"), *dst = malloc(4200);
    snprintf(dst, 4200, "%s/enc.safetensors", dir);
    ghc_st_t *st = ghc_st_open(core, src);
    ck_assert_ptr_nonnull(st);
    ghc_st_writer_t *w = ghc_st_writer_init(core);
    for (int i = 0; i < ghc_st_count(st); i++) {
        struct ghc_st_info info;
        char name[300];
        ck_assert(ghc_st_info_at(st, i, &info));
        if (drop && strcmp(info.name, drop) == 0)
            continue;
        snprintf(name, sizeof(name), "%s%s", prefix, info.name);
        if (reshape && strcmp(info.name, reshape) == 0) {
            int64_t shape[5];
            memcpy(shape, info.shape, sizeof(int64_t) * (size_t)info.ndim);
            shape[0]++;
            int64_t numel = 1;
            for (int d = 0; d < info.ndim; d++)
                numel *= shape[d];
            void *zeros = calloc((size_t)numel, 2);
            ck_assert_int_eq(ghc_st_writer_add_raw(w, name, info.dtype, info.ndim, shape, zeros), 0);
            free(zeros);
            continue;
        }
        ck_assert_int_eq(ghc_st_writer_add_raw(w, name, info.dtype, info.ndim, info.shape, ghc_st_raw(st, info.name)), 0);
    }
    ck_assert_int_eq(ghc_st_writer_finish(w, dst), 0);
    ghc_st_writer_free(w);
    ghc_st_free(st);
    free(src);
    return dst;
}

/* Loading official.safetensors rewritten (rewrite()) fails with GHC_EFORMAT and `msg`. */
static void expect_load_error(const char *dir, const char *drop, const char *reshape, const char *msg)
{
    char *p = rewrite(dir, drop, reshape, "");
    ck_assert_ptr_null(ghc_umt5_init(core, p, NULL, NULL));
    ck_assert_int_eq(ghc_error_code(core), GHC_EFORMAT);
    ck_assert_msg(strstr(ghc_error_message(core), msg) != NULL, "'%s' lacks '%s'", ghc_error_message(core), msg);
    free(p);
}

START_TEST(enc_errors)
{
    char *dir = tu_tmpdir();
    /* the official names under "encoder." load (musubi's layout) */
    char *p = rewrite(dir, NULL, NULL, "encoder.");
    ghc_umt5_t *enc = ghc_umt5_init(core, p, NULL, NULL);
    ck_assert_msg(enc != NULL, "%s", ghc_error_message(core));
    const int32_t ids[3] = { 5, 9, 1 };
    ghc_tensor_t *y = ghc_umt5_encode(enc, ids, NULL, 3);
    ck_assert_ptr_nonnull(y);
    ghc_tensor_free(y);
    /* bad ids and masks */
    const int32_t bad_ids[2] = { 416, 1 }, bad_mask[3] = { 1, 0, 1 }, no_tokens[3] = { 0, 0, 0 };
    ck_assert_ptr_null(ghc_umt5_encode(enc, bad_ids, NULL, 2));
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), "id 416 at position 0"));
    ck_assert_ptr_null(ghc_umt5_encode(enc, ids, bad_mask, 3));
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), "mask[2]"));
    ck_assert_ptr_null(ghc_umt5_encode(enc, ids, no_tokens, 3));
    ck_assert_ptr_null(ghc_umt5_encode(enc, ids, NULL, 0));
    ghc_umt5_free(enc);
    free(p);
    /* a missing tensor is named; the last block's q missing is not taken for one block fewer */
    expect_load_error(dir, "blocks.1.ffn.fc1.weight", NULL, "'blocks.1.ffn.fc1.weight' is missing");
    expect_load_error(dir, "blocks.1.attn.q.weight", NULL, "'blocks.1.attn.q.weight' is missing");
    /* a wrong shape is named with both shapes */
    expect_load_error(dir, NULL, "blocks.0.attn.v.weight",
                      "'blocks.0.attn.v.weight' has shape [33, 32], expected [32, 32]");
    /* no embedding: not a umT5 */
    expect_load_error(dir, "token_embedding.weight", NULL, "not a umT5 encoder");
    /* a configuration that disagrees with the file; one that agrees and sets max_distance */
    p = fixture("official.safetensors");
    struct ghc_umt5_config want = { .heads = 8 };
    ck_assert_ptr_null(ghc_umt5_init(core, p, &want, NULL));
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), "heads is 4 in the file, the configuration says 8"));
    want = (struct ghc_umt5_config){ .heads = 4, .d_model = 32, .max_distance = 64 };
    enc = ghc_umt5_init(core, p, &want, NULL);
    ck_assert_ptr_nonnull(enc);
    ck_assert_int_eq(ghc_umt5_get_config(enc)->max_distance, 64);
    ghc_umt5_free(enc);
    free(p);
    /* the official .pth is refused naming the safetensors files */
    char *pth = tu_write(dir, "models_t5_umt5-xxl-enc-bf16.pth", "PK");
    ck_assert_ptr_null(ghc_umt5_init(core, pth, NULL, NULL));
    ck_assert_int_eq(ghc_error_code(core), GHC_EUNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), "umt5_xxl_fp16.safetensors"));
    free(pth);
    /* a missing file */
    ck_assert_ptr_null(ghc_umt5_init(core, "/nonexistent/umt5.safetensors", NULL, NULL));
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), "/nonexistent/umt5.safetensors"));
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* The `umt5` plugin's `device` and `dtype` keys, made by the core as `gh200core prepare` makes
 * it: on the CPU bf16 encodes near f32; another dtype is refused naming the file and line. */
START_TEST(plugin_place_keys)
{
    static const char *const dtypes[3] = { "f32", "bf16", "f16" };
    const char *text = "a cat on a piano";
    float ref[17 * 64];
    for (int d = 0; d < 3; d++) {
        char cfg[512];
        snprintf(cfg, sizeof(cfg), "mempolicy = { plugin = \"host\"; };\n"
                 "text_encoder = { plugin = \"umt5\"; device = -1;\n dtype = \"%s\"; random = { d_model = 64; "
                 "heads = 2; d_kv = 32; d_ff = 96; }; };\n", dtypes[d]);
        ghc_core_t *c = ghc_core_init();
        ck_assert_msg(ghc_plugin_add_path(c, tu_env("GHC_BUILD_PLUGINS")) == 0 &&
                      ghc_config_load_string(c, cfg, "t.cfg", NULL, NULL, 0) == 0 && ghc_run_init(c) == 0, "%s",
                      ghc_error_message(c));
        ghc_text_encoder_t *te = ghc_text_encoder_get(c);
        if (d == 2) {
            ck_assert_ptr_null(te);
            ck_assert_msg(strstr(ghc_error_message(c), "t.cfg:3") && strstr(ghc_error_message(c), "f16"), "%s",
                          ghc_error_message(c));
        } else {
            ck_assert_msg(te != NULL, "%s", ghc_error_message(c));
            ghc_tensor_t *y = NULL;
            ck_assert_msg(ghc_text_encoder_encode(te, text, &y) == 0, "%s", ghc_error_message(c));
            ck_assert_int_eq(ghc_tensor_numel(y), 17 * 64);   /* the bytes and the EOS */
            const float *py = ghc_tensor_cdata(y);
            for (int i = 0; i < 17 * 64; i++) {
                if (d == 0)
                    ref[i] = py[i];
                else
                    ck_assert_msg(fabsf(py[i] - ref[i]) <= UMT5_BF16_ATOL + UMT5_BF16_RTOL * fabsf(ref[i]),
                                  "bf16 [%d]: %g vs %g", i, py[i], ref[i]);
            }
            ghc_tensor_free(y);
        }
        ghc_run_free(c);
        ghc_core_free(c);
    }
}
END_TEST

/* umT5-XXL's numbers (spec): the parameter count of the shape. */
START_TEST(config_xxl)
{
    struct ghc_umt5_config c;
    ghc_umt5_config_xxl(&c);
    const int64_t per_layer = 4 * c.d_model * c.heads * c.d_kv + 3 * c.d_model * c.d_ff + 2 * c.d_model +
                              c.num_buckets * c.heads;
    ck_assert_int_eq(c.layers * per_layer + c.vocab * c.d_model + c.d_model, 5680910336LL);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("umt5");
    TCase *t = tcase_create("tokenizer");
    tcase_add_checked_fixture(t, setup, teardown);
#ifdef GHC_HAVE_SENTENCEPIECE
    tcase_add_test(t, tok_ids);
    tcase_add_test(t, tok_bytes);
    tcase_add_test(t, tok_raw_and_short);
    tcase_add_test(t, tok_errors);
#else
    tcase_add_test(t, tok_unsupported);
#endif
    tcase_add_test(t, clean_text);
    suite_add_tcase(s, t);
    t = tcase_create("ops");
    tcase_add_checked_fixture(t, setup, teardown);
    tcase_add_test(t, op_buckets);
    tcase_add_test(t, op_embedding);
    tcase_add_test(t, op_rel_pos_bias);
    tcase_add_test(t, op_attention_bias);
    suite_add_tcase(s, t);
    t = tcase_create("encoder");
    tcase_add_checked_fixture(t, setup, teardown);
    tcase_add_test(t, enc_transformers_sharded);
    tcase_add_test(t, enc_comfy_fp8);
    tcase_add_test(t, enc_official);
    tcase_add_test(t, enc_bf16);
    tcase_add_test(t, enc_batch);
    tcase_add_test(t, plugin_place_keys);
    tcase_add_test(t, enc_errors);
    tcase_add_test(t, config_xxl);
    suite_add_tcase(s, t);
    return tu_run_suite(s, false);
}
