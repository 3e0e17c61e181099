/* test_tensor.c: tensors (shapes, errors, memory through the mempolicy) and the scalar float
 * conversions, checked exhaustively against independent references: every bf16/f16/fp8 code
 * round-trips, and f32 -> f16 matches the compiler's _Float16 conversion, f32 -> fp8 matches
 * a brute-force nearest-code search with ties to even. */
#include <math.h>

#include <gh200core/gh200core.h>
#include <gh200core/tensor.h>

#include "testutil.h"

static uint32_t bits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static float fl(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }

static uint32_t lcg_state = 12345;
static uint32_t lcg(void) { lcg_state = lcg_state * 1664525u + 1013904223u; return lcg_state; }

/* A float spread over many binades, both signs. */
static float random_float(float max_abs)
{
    float m = (float)(lcg() >> 8) / 16777216.0f;
    int e = (int)(lcg() % 40) - 30;
    float v = ldexpf(m, e);
    if (v > max_abs)
        v = max_abs * m;
    return (lcg() & 1) ? -v : v;
}

START_TEST(bf16_exhaustive)
{
    for (uint32_t c = 0; c < 65536; c++) {
        float v = ghc_bf16_to_f32((uint16_t)c);
        if (isnan(v)) {
            ck_assert(isnan(ghc_bf16_to_f32(ghc_f32_to_bf16(v))));
            continue;
        }
        ck_assert_msg(ghc_f32_to_bf16(v) == c, "code 0x%04x", c);
    }
    /* ties to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 */
    ck_assert_uint_eq(ghc_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    ck_assert_uint_eq(ghc_f32_to_bf16(1.0f + 0x1p-7f + 0x1p-8f), 0x3f82);
    ck_assert_uint_eq(ghc_f32_to_bf16(fl(0x3f808001)), 0x3f81);   /* just above half: up */
    ck_assert_uint_eq(ghc_f32_to_bf16(INFINITY), 0x7f80);
    ck_assert_uint_eq(ghc_f32_to_bf16(3.4e38f), 0x7f80);          /* rounds to inf */
    ck_assert(isnan(ghc_bf16_to_f32(ghc_f32_to_bf16(NAN))));
    /* against truncation plus a carry computed in integers */
    for (int i = 0; i < 200000; i++) {
        uint32_t u = lcg();
        float x = fl(u);
        if (isnan(x) || isinf(x))
            continue;
        uint32_t lower = u >> 16, rem = u & 0xffff;
        uint32_t want = lower + (rem > 0x8000 || (rem == 0x8000 && (lower & 1)));
        ck_assert_msg(ghc_f32_to_bf16(x) == (uint16_t)want, "0x%08x", u);
    }
}
END_TEST

START_TEST(f16_exhaustive)
{
    for (uint32_t c = 0; c < 65536; c++) {
        float v = ghc_f16_to_f32((uint16_t)c);
        _Float16 h;
        uint16_t hc = (uint16_t)c;
        memcpy(&h, &hc, 2);
        if (isnan(v)) {
            ck_assert(isnan((float)h));
            continue;
        }
        ck_assert_msg(bits(v) == bits((float)h), "decode 0x%04x: %g vs %g", c, v, (double)(float)h);
        ck_assert_msg(ghc_f32_to_f16(v) == c, "encode 0x%04x", c);
    }
    for (int i = 0; i < 300000; i++) {
        float x = i < 100000 ? random_float(70000.0f) : fl(lcg());
        if (isnan(x))
            continue;
        _Float16 h = (_Float16)x;
        uint16_t want;
        memcpy(&want, &h, 2);
        ck_assert_msg(ghc_f32_to_f16(x) == want, "%a: 0x%04x vs 0x%04x", (double)x, ghc_f32_to_f16(x), want);
    }
}
END_TEST

/* The nearest of the finite codes 0..max_code (magnitudes), ties to the even code. */
static uint8_t nearest_code(float ax, float (*dec)(uint8_t), uint8_t max_code)
{
    uint8_t best = 0;
    double bd = INFINITY;
    for (unsigned c = 0; c <= max_code; c++) {
        double d = fabs((double)dec((uint8_t)c) - (double)ax);
        if (d < bd || (d == bd && (c & 1) == 0)) {
            bd = d;
            best = (uint8_t)c;
        }
    }
    return best;
}

START_TEST(fp8_exhaustive)
{
    for (unsigned c = 0; c < 256; c++) {
        float v = ghc_e4m3_to_f32((uint8_t)c);
        if ((c & 0x7f) == 0x7f) {
            ck_assert(isnan(v));
            continue;
        }
        ck_assert_msg(ghc_f32_to_e4m3(v) == c || (c == 0x80 && ghc_f32_to_e4m3(v) == 0x80), "e4m3 0x%02x", c);
        float w = ghc_e5m2_to_f32((uint8_t)c);
        if ((c & 0x7f) > 0x7c) {
            ck_assert(isnan(w));
            continue;
        }
        ck_assert_msg(ghc_f32_to_e5m2(w) == c, "e5m2 0x%02x", c);
    }
    ck_assert_float_eq(ghc_e4m3_to_f32(0x7e), 448.0f);
    ck_assert_float_eq(ghc_e5m2_to_f32(0x7b), 57344.0f);
    ck_assert_uint_eq(ghc_f32_to_e4m3(1000.0f), 0x7e);             /* saturates */
    ck_assert_uint_eq(ghc_f32_to_e4m3(-1000.0f), 0xfe);
    ck_assert_uint_eq(ghc_f32_to_e5m2(1e6f), 0x7c);                /* inf */
    for (int i = 0; i < 100000; i++) {
        float x = random_float(400.0f);
        uint8_t s = x < 0 ? 0x80 : 0;
        uint8_t want = (uint8_t)(s | nearest_code(fabsf(x), ghc_e4m3_to_f32, 0x7e));
        ck_assert_msg(ghc_f32_to_e4m3(x) == want || (fabsf(x) < 1e-30f), "e4m3 %a: 0x%02x vs 0x%02x",
                      (double)x, ghc_f32_to_e4m3(x), want);
        float y = random_float(50000.0f);
        s = y < 0 ? 0x80 : 0;
        want = (uint8_t)(s | nearest_code(fabsf(y), ghc_e5m2_to_f32, 0x7b));
        ck_assert_msg(ghc_f32_to_e5m2(y) == want || (fabsf(y) < 1e-30f), "e5m2 %a: 0x%02x vs 0x%02x",
                      (double)y, ghc_f32_to_e5m2(y), want);
    }
}
END_TEST

START_TEST(dtypes)
{
    enum ghc_dtype dt;
    for (int i = 0; i < GHC_DTYPE_COUNT; i++) {
        ck_assert(ghc_dtype_from_name(ghc_dtype_name((enum ghc_dtype)i), &dt));
        ck_assert_int_eq(dt, i);
    }
    ck_assert(!ghc_dtype_from_name("F33", &dt));
    ck_assert_uint_eq(ghc_dtype_size(GHC_DTYPE_BF16), 2);
    ck_assert_uint_eq(ghc_dtype_size(GHC_DTYPE_I64), 8);
    ck_assert_uint_eq(ghc_dtype_size(GHC_DTYPE_COUNT), 0);
    ck_assert(ghc_dtype_is_float(GHC_DTYPE_F8_E5M2));
    ck_assert(!ghc_dtype_is_float(GHC_DTYPE_BOOL));
}
END_TEST

START_TEST(tensor_basics)
{
    ghc_core_t *core = ghc_core_init();
    int64_t shape[] = { 2, 3, 4 };
    ghc_tensor_t *t = ghc_tensor_init(core, GHC_DTYPE_BF16, 3, shape, GHC_DEVICE_CPU, GHC_ROLE_ACTIVATIONS);
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(ghc_tensor_numel(t), 24);
    ck_assert_uint_eq(ghc_tensor_nbytes(t), 48);
    ck_assert_int_eq(ghc_tensor_dim(t, -1), 4);
    ck_assert_int_eq(ghc_tensor_dim(t, 0), 2);
    ck_assert_int_eq(ghc_tensor_dim(t, 7), 1);
    ck_assert_int_eq(((uintptr_t)ghc_tensor_data(t)) % 256, 0);
    char buf[64];
    ck_assert_str_eq(ghc_tensor_describe(t, buf, sizeof(buf)), "[2, 3, 4] BF16 cpu");
    int64_t flat[] = { 6, 4 };
    ck_assert_int_eq(ghc_tensor_reshape(t, 2, flat), 0);
    ck_assert_int_eq(ghc_tensor_ndim(t), 2);
    int64_t bad[] = { 5, 5 };
    ck_assert_int_eq(ghc_tensor_reshape(t, 2, bad), GHC_EINVAL);
    ghc_tensor_free(t);
    ghc_tensor_free(NULL);

    ghc_tensor_t *s = ghc_tensor_init(core, GHC_DTYPE_F32, 0, NULL, GHC_DEVICE_CPU, GHC_ROLE_WORKSPACE);
    ck_assert_ptr_nonnull(s);
    ck_assert_int_eq(ghc_tensor_numel(s), 1);
    ghc_tensor_free(s);

    int64_t six[] = { 1, 1, 1, 1, 1, 1 };
    ck_assert_ptr_null(ghc_tensor_init(core, GHC_DTYPE_F32, 6, six, GHC_DEVICE_CPU, GHC_ROLE_WORKSPACE));
    ck_assert_msg(strstr(ghc_error_message(core), "6 dimensions"), "%s", ghc_error_message(core));
    int64_t neg[] = { 3, -1 };
    ck_assert_ptr_null(ghc_tensor_init(core, GHC_DTYPE_F32, 2, neg, GHC_DEVICE_CPU, GHC_ROLE_WORKSPACE));
    int64_t huge[] = { INT64_C(1) << 40, INT64_C(1) << 40 };
    ck_assert_ptr_null(ghc_tensor_init(core, GHC_DTYPE_F32, 2, huge, GHC_DEVICE_CPU, GHC_ROLE_WORKSPACE));
    ck_assert_msg(strstr(ghc_error_message(core), "overflows"), "%s", ghc_error_message(core));
    ck_assert_ptr_null(ghc_tensor_init(core, GHC_DTYPE_F32, 2, flat, 0, GHC_ROLE_WORKSPACE));
    ck_assert_msg(strstr(ghc_error_message(core), "needs a memory policy"), "%s", ghc_error_message(core));

    float data[6] = { 1, 2, 3, 4, 5, 6 };
    int64_t two3[] = { 2, 3 };
    ghc_tensor_t *w = ghc_tensor_wrap(core, GHC_DTYPE_F32, 2, two3, GHC_DEVICE_CPU, data);
    ck_assert_ptr_eq(ghc_tensor_data(w), data);
    ghc_tensor_t *h = ghc_tensor_init(core, GHC_DTYPE_F16, 2, two3, GHC_DEVICE_CPU, GHC_ROLE_WORKSPACE);
    ck_assert_int_eq(ghc_tensor_convert_cpu(h, w, 0.5f), 0);
    ck_assert_float_eq(ghc_f16_to_f32(((uint16_t *)ghc_tensor_data(h))[5]), 3.0f);
    ghc_tensor_t *i32 = ghc_tensor_init(core, GHC_DTYPE_I32, 2, two3, GHC_DEVICE_CPU, GHC_ROLE_WORKSPACE);
    ck_assert_int_eq(ghc_tensor_convert_cpu(i32, w, 1.0f), GHC_EINVAL);
    ghc_tensor_free(i32);
    ghc_tensor_free(h);
    ghc_tensor_free(w);      /* does not free `data` */
    ck_assert_float_eq(data[5], 6.0f);
    ghc_core_free(core);
}
END_TEST

START_TEST(tensor_through_mempolicy)
{
    ghc_core_t *core = ghc_core_init();
    ck_assert_int_eq(ghc_plugin_add_path(core, tu_env("GHC_BUILD_PLUGINS")), 0);
    ck_assert_int_eq(ghc_config_load_string(core, "mempolicy = { plugin = \"host\"; limit_mib = 1; };", "t.cfg",
                                            NULL, NULL, 0), 0);
    ck_assert_msg(ghc_run_init(core) == 0, "%s", ghc_error_message(core));
    int64_t shape[] = { 1000 };
    ghc_tensor_t *t = ghc_tensor_init(core, GHC_DTYPE_F32, 1, shape, GHC_DEVICE_CPU, GHC_ROLE_LATENTS);
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(ghc_tensor_role(t), GHC_ROLE_LATENTS);
    struct ghc_mem_stats st = { .struct_size = sizeof(st) };
    ck_assert_int_eq(ghc_mem_stats(ghc_mempolicy_get(core), &st), 0);
    ck_assert_uint_eq(st.bytes_role[GHC_ROLE_LATENTS], 4000);
    int64_t big[] = { 1 << 20 };
    ck_assert_ptr_null(ghc_tensor_init(core, GHC_DTYPE_F32, 1, big, GHC_DEVICE_CPU, GHC_ROLE_WEIGHTS));
    ck_assert_msg(strstr(ghc_error_message(core), "limit_mib"), "%s", ghc_error_message(core));
    ghc_tensor_free(t);
    ck_assert_int_eq(ghc_mem_stats(ghc_mempolicy_get(core), &st), 0);
    ck_assert_uint_eq(st.bytes_host, 0);
    ghc_core_free(core);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("tensor");
    TCase *tc = tcase_create("convert");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, bf16_exhaustive);
    tcase_add_test(tc, f16_exhaustive);
    tcase_add_test(tc, fp8_exhaustive);
    tcase_add_test(tc, dtypes);
    suite_add_tcase(s, tc);
    tc = tcase_create("tensor");
    tcase_add_test(tc, tensor_basics);
    tcase_add_test(tc, tensor_through_mempolicy);
    suite_add_tcase(s, tc);
    return tu_run_suite(s, false);
}
