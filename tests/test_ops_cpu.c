/* test_ops_cpu.c: the CPU reference ops of ops.h. Each forward op is checked against a float64
 * reference written here on small seeded random inputs (atol + rtol per op and dtype); each
 * backward op against central finite differences of its own forward on f32 tensors; the
 * random generator against the Random123 known answers and the stream layout of ops.h; and
 * argument checking against the errors ops.h promises. */
#include <math.h>

#include <gh200core/gh200core.h>
#include <gh200core/ops.h>

#include "testutil.h"

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

/* ---- tensors and helpers ------------------------------------------------------------------ */

static ghc_core_t *core;
static ghc_tensor_t *pool[512];
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

static ghc_tensor_t *mk(enum ghc_dtype dt, int nd, const int64_t *shape)
{
    ghc_tensor_t *t = ghc_tensor_init(core, dt, nd, shape, GHC_DEVICE_CPU, GHC_ROLE_WORKSPACE);
    ck_assert_msg(t != NULL, "tensor: %s", ghc_error_message(core));
    ck_assert_int_lt(npool, 512);
    pool[npool++] = t;
    return t;
}
#define NARG(...) (int)(sizeof((int64_t[]){ __VA_ARGS__ }) / sizeof(int64_t))
#define T(dt, ...) mk(dt, NARG(__VA_ARGS__), (const int64_t[]){ __VA_ARGS__ })
#define F32 GHC_DTYPE_F32
#define BF16 GHC_DTYPE_BF16
#define N(t) ghc_tensor_numel(t)

static ghc_tensor_t *like(const ghc_tensor_t *t, enum ghc_dtype dt)
{
    return mk(dt, ghc_tensor_ndim(t), ghc_tensor_shape(t));
}

static double get(const ghc_tensor_t *t, int64_t i)
{
    const void *p = ghc_tensor_cdata(t);
    switch (ghc_tensor_dtype(t)) {
    case GHC_DTYPE_F32:     return ((const float *)p)[i];
    case GHC_DTYPE_BF16:    return ghc_bf16_to_f32(((const uint16_t *)p)[i]);
    case GHC_DTYPE_F16:     return ghc_f16_to_f32(((const uint16_t *)p)[i]);
    case GHC_DTYPE_F8_E4M3: return ghc_e4m3_to_f32(((const uint8_t *)p)[i]);
    case GHC_DTYPE_F8_E5M2: return ghc_e5m2_to_f32(((const uint8_t *)p)[i]);
    default:                ck_abort_msg("get: dtype"); return 0;
    }
}

static void set(ghc_tensor_t *t, int64_t i, double v)
{
    void *p = ghc_tensor_data(t);
    float f = (float)v;
    switch (ghc_tensor_dtype(t)) {
    case GHC_DTYPE_F32:     ((float *)p)[i] = f; break;
    case GHC_DTYPE_BF16:    ((uint16_t *)p)[i] = ghc_f32_to_bf16(f); break;
    case GHC_DTYPE_F16:     ((uint16_t *)p)[i] = ghc_f32_to_f16(f); break;
    case GHC_DTYPE_F8_E4M3: ((uint8_t *)p)[i] = ghc_f32_to_e4m3(f); break;
    case GHC_DTYPE_F8_E5M2: ((uint8_t *)p)[i] = ghc_f32_to_e5m2(f); break;
    default:                ck_abort_msg("set: dtype");
    }
}

/* v rounded to nearest even in dtype dt, as a double. */
static double rt(enum ghc_dtype dt, float v)
{
    switch (dt) {
    case GHC_DTYPE_F32:     return v;
    case GHC_DTYPE_BF16:    return ghc_bf16_to_f32(ghc_f32_to_bf16(v));
    case GHC_DTYPE_F16:     return ghc_f16_to_f32(ghc_f32_to_f16(v));
    case GHC_DTYPE_F8_E4M3: return ghc_e4m3_to_f32(ghc_f32_to_e4m3(v));
    case GHC_DTYPE_F8_E5M2: return ghc_e5m2_to_f32(ghc_f32_to_e5m2(v));
    default:                ck_abort_msg("rt: dtype"); return 0;
    }
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static void seed(uint64_t s) { rng_state = s * 0x9e3779b97f4a7c15ull + 1; }
static double urand(void)   /* [-1, 1) */
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 0x2545f4914f6cdd1dull) >> 11) * 0x1p-52 - 1.0;
}

/* Uniform [lo, hi) values, stored in t's dtype. Returns t. */
static ghc_tensor_t *rnd(ghc_tensor_t *t, double lo, double hi)
{
    for (int64_t i = 0; i < N(t); i++)
        set(t, i, lo + (hi - lo) * 0.5 * (urand() + 1.0));
    return t;
}

static void fillv(ghc_tensor_t *t, double v)
{
    for (int64_t i = 0; i < N(t); i++)
        set(t, i, v);
}

#define OK(expr) do { int rc_ = (expr); ck_assert_msg(rc_ == 0, "%s: %d %s", #expr, rc_, ghc_error_message(core)); } while (0)

/* Every element of t within atol + rtol |ref| of ref. */
static void expect(const char *what, const ghc_tensor_t *t, const double *ref, double atol, double rtol)
{
    for (int64_t i = 0; i < N(t); i++) {
        double v = get(t, i);
        ck_assert_msg(fabs(v - ref[i]) <= atol + rtol * fabs(ref[i]), "%s[%lld]: %.9g vs ref %.9g", what,
                      (long long)i, v, ref[i]);
    }
}

static double *dalloc(int64_t n)
{
    double *p = calloc((size_t)(n ? n : 1), sizeof(double));
    ck_assert_ptr_nonnull(p);
    return p;
}

/* ---- finite differences ------------------------------------------------------------------- */

/* A scalar loss of the current inputs (sum of upstream weights times the op's output). */
typedef double (*loss_fn)(void *ctx);

static double dotw(const ghc_tensor_t *y, const ghc_tensor_t *w)
{
    double s = 0;
    for (int64_t i = 0; i < N(y); i++)
        s += get(y, i) * get(w, i);
    return s;
}

/* grad (the op's backward) against central differences of loss in every element of the f32
 * tensor x: |fd - g| <= rtol (|g| + 0.1 max|g|) + atol. */
static void fd_check(const char *what, loss_fn f, void *ctx, ghc_tensor_t *x, const ghc_tensor_t *grad,
                     double h, double rtol, double atol)
{
    float *p = ghc_tensor_data(x);
    double gmax = 0;
    for (int64_t j = 0; j < N(grad); j++)
        gmax = fmax(gmax, fabs(get(grad, j)));
    ck_assert_msg(gmax > 0, "%s: gradient is all zero", what);
    for (int64_t j = 0; j < N(x); j++) {
        float old = p[j];
        float up = old + (float)h, dn = old - (float)h;
        p[j] = up;
        double lp = f(ctx);
        p[j] = dn;
        double lm = f(ctx);
        p[j] = old;
        double fd = (lp - lm) / ((double)up - (double)dn), g = get(grad, j);
        ck_assert_msg(fabs(fd - g) <= rtol * (fabs(g) + 0.1 * gmax) + atol, "%s: d/dx[%lld] = %.7g, fd %.7g", what,
                      (long long)j, g, fd);
    }
}

/* ---- random numbers ----------------------------------------------------------------------- */

START_TEST(philox_known_answers)
{
    static const uint32_t ctr[3][4] = {
        { 0, 0, 0, 0 },
        { 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu },
        { 0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u } };
    static const uint32_t key[3][2] = { { 0, 0 }, { 0xffffffffu, 0xffffffffu }, { 0xa4093822u, 0x299f31d0u } };
    static const uint32_t want[3][4] = {
        { 0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u },
        { 0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu },
        { 0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u } };
    for (int v = 0; v < 3; v++) {
        uint32_t out[4];
        ghc_philox4x32(ctr[v], key[v], out);
        for (int l = 0; l < 4; l++)
            ck_assert_msg(out[l] == want[v][l], "vector %d lane %d: %08x vs %08x", v, l, out[l], want[v][l]);
    }
}
END_TEST

/* Lane i % 4 of the block for element i of a call with `rng` (ops.h). */
static uint32_t lane(const struct ghc_rng *rng, int64_t i)
{
    uint64_t n = rng->offset + (uint64_t)(i / 4);
    uint32_t c[4] = { (uint32_t)n, (uint32_t)(n >> 32), 0, 0 }, k[2] = { (uint32_t)rng->seed,
                                                                         (uint32_t)(rng->seed >> 32) };
    uint32_t out[4];
    ghc_philox4x32(c, k, out);
    return out[i % 4];
}

START_TEST(rand_uniform_stream)
{
    struct ghc_rng rng = { 0x123456789abcdef0ull, 7 };
    ghc_tensor_t *t = T(F32, 1001), *t2 = T(F32, 1001), *tb = T(BF16, 1001);
    OK(ghc_op_rand_uniform(t, &rng, NULL));
    for (int64_t i = 0; i < N(t); i++) {
        float want = (float)(lane(&rng, i) >> 8) * 0x1p-24f;
        ck_assert_msg(get(t, i) == want, "[%lld] %g vs %g", (long long)i, get(t, i), (double)want);
        ck_assert(get(t, i) >= 0.0 && get(t, i) < 1.0);
    }
    OK(ghc_op_rand_uniform(t2, &rng, NULL));
    ck_assert(memcmp(ghc_tensor_data(t), ghc_tensor_data(t2), ghc_tensor_nbytes(t)) == 0);
    OK(ghc_op_rand_uniform(tb, &rng, NULL));
    for (int64_t i = 0; i < N(t); i++)
        ck_assert(((uint16_t *)ghc_tensor_data(tb))[i] == ghc_f32_to_bf16((float)get(t, i)));

    /* splitting: 1000 numbers equal 500 + 500 with the offset advanced by ceil(500 / 4) */
    ghc_tensor_t *whole = T(F32, 1000), *h1 = T(F32, 500), *h2 = T(F32, 500);
    struct ghc_rng r1 = { 42, 1000 }, r2 = { 42, 1000 + 125 };
    OK(ghc_op_rand_uniform(whole, &r1, NULL));
    OK(ghc_op_rand_uniform(h1, &r1, NULL));
    OK(ghc_op_rand_uniform(h2, &r2, NULL));
    ck_assert(memcmp(ghc_tensor_data(whole), ghc_tensor_data(h1), 500 * 4) == 0);
    ck_assert(memcmp((float *)ghc_tensor_data(whole) + 500, ghc_tensor_data(h2), 500 * 4) == 0);

    /* the block number fills the counter as (lo32, hi32, 0, 0) */
    struct ghc_rng far = { 5, 0xfffffffeull };
    ghc_tensor_t *f = T(F32, 16);
    OK(ghc_op_rand_uniform(f, &far, NULL));
    uint32_t c[4] = { 1, 1, 0, 0 }, k[2] = { 5, 0 }, out[4];   /* element 12: block 2^32 + 1 */
    ghc_philox4x32(c, k, out);
    ck_assert(get(f, 12) == (float)(out[0] >> 8) * 0x1p-24f);

    /* moments of 1e5 numbers */
    ghc_tensor_t *big = T(F32, 100000);
    OK(ghc_op_rand_uniform(big, &(struct ghc_rng){ 3, 0 }, NULL));
    double m = 0, v = 0;
    for (int64_t i = 0; i < N(big); i++)
        m += get(big, i);
    m /= (double)N(big);
    for (int64_t i = 0; i < N(big); i++)
        v += (get(big, i) - m) * (get(big, i) - m);
    v /= (double)N(big);
    ck_assert_msg(fabs(m - 0.5) < 0.005 && fabs(v - 1.0 / 12) < 0.002, "mean %g var %g", m, v);
}
END_TEST

START_TEST(rand_normal_stream)
{
    struct ghc_rng rng = { 0xfeedfacecafebeefull, 11 };
    ghc_tensor_t *t = T(F32, 100000);
    OK(ghc_op_rand_normal(t, &rng, NULL));
    /* the element layout of ops.h: 4b+0, 4b+1 from lanes (0,1); 4b+2, 4b+3 from lanes (2,3) */
    for (int64_t i = 0; i < 64; i++) {
        int64_t p = (i & ~1);
        double u1 = lane(&rng, p) * 0x1p-32, u2 = lane(&rng, p + 1) * 0x1p-32;
        double r = sqrt(-2.0 * log(1.0 - u1)), a = 2.0 * M_PI * u2;
        double want = (i & 1) ? r * sin(a) : r * cos(a);
        ck_assert_msg(fabs(get(t, i) - want) <= 1e-6 * fabs(want) + 1e-7, "[%lld] %g vs %g", (long long)i,
                      get(t, i), want);
    }
    double m = 0, v = 0, in1 = 0;
    for (int64_t i = 0; i < N(t); i++) {
        double z = get(t, i);
        ck_assert(isfinite(z));
        m += z;
        in1 += fabs(z) < 1.0;
    }
    m /= (double)N(t);
    for (int64_t i = 0; i < N(t); i++)
        v += (get(t, i) - m) * (get(t, i) - m);
    v /= (double)N(t);
    in1 /= (double)N(t);
    ck_assert_msg(fabs(m) < 0.015 && fabs(v - 1.0) < 0.02 && fabs(in1 - 0.6827) < 0.01, "mean %g var %g P(|z|<1) %g",
                  m, v, in1);

    ghc_tensor_t *whole = T(F32, 1000), *h1 = T(F32, 500), *h2 = T(F32, 500), *again = T(F32, 1000);
    OK(ghc_op_rand_normal(whole, &(struct ghc_rng){ 9, 0 }, NULL));
    OK(ghc_op_rand_normal(again, &(struct ghc_rng){ 9, 0 }, NULL));
    OK(ghc_op_rand_normal(h1, &(struct ghc_rng){ 9, 0 }, NULL));
    OK(ghc_op_rand_normal(h2, &(struct ghc_rng){ 9, 125 }, NULL));
    ck_assert(memcmp(ghc_tensor_data(whole), ghc_tensor_data(again), 4000) == 0);
    ck_assert(memcmp(ghc_tensor_data(whole), ghc_tensor_data(h1), 2000) == 0);
    ck_assert(memcmp((float *)ghc_tensor_data(whole) + 500, ghc_tensor_data(h2), 2000) == 0);
    ghc_tensor_t *tb = T(BF16, 1000);
    OK(ghc_op_rand_normal(tb, &(struct ghc_rng){ 9, 0 }, NULL));
    for (int64_t i = 0; i < 1000; i++)
        ck_assert(((uint16_t *)ghc_tensor_data(tb))[i] == ghc_f32_to_bf16((float)get(whole, i)));
}
END_TEST

/* ---- fill, copy, cast --------------------------------------------------------------------- */

START_TEST(fill_copy)
{
    ghc_tensor_t *a = T(F32, 3, 5), *b = T(BF16, 7), *e = T(GHC_DTYPE_F8_E4M3, 4), *c = T(F32, 15);
    OK(ghc_op_fill(a, 0.1, NULL));
    OK(ghc_op_fill(b, 0.1, NULL));
    OK(ghc_op_fill(e, 500.0, NULL));
    for (int64_t i = 0; i < N(a); i++)
        ck_assert(get(a, i) == 0.1f);
    for (int64_t i = 0; i < N(b); i++)
        ck_assert(((uint16_t *)ghc_tensor_data(b))[i] == ghc_f32_to_bf16(0.1f));
    for (int64_t i = 0; i < N(e); i++)
        ck_assert(get(e, i) == 448.0);
    rnd(a, -1, 1);
    OK(ghc_op_copy(c, a, NULL));
    ck_assert(memcmp(ghc_tensor_data(c), ghc_tensor_data(a), 60) == 0);
    ck_assert_int_eq(ghc_op_copy(b, a, NULL), GHC_EINVAL);
    ck_assert_int_eq(ghc_op_sync(core, GHC_DEVICE_CPU, NULL), 0);
}
END_TEST

START_TEST(cast_nearest)
{
    seed(1);
    ghc_tensor_t *x = rnd(T(F32, 257), -300, 300);
    set(x, 0, NAN);
    set(x, 1, INFINITY);
    set(x, 2, 1e-30);
    enum ghc_dtype dts[] = { BF16, GHC_DTYPE_F16, GHC_DTYPE_F8_E4M3, GHC_DTYPE_F8_E5M2, F32 };
    for (int d = 0; d < 5; d++) {
        ghc_tensor_t *y = like(x, dts[d]);
        OK(ghc_op_cast(y, x, 0.5f, NULL, NULL));
        for (int64_t i = 0; i < N(x); i++) {
            double want = rt(dts[d], (float)get(x, i) * 0.5f), got = get(y, i);
            ck_assert_msg((isnan(want) && isnan(got)) || want == got, "%s[%lld]: %g vs %g",
                          ghc_dtype_name(dts[d]), (long long)i, got, want);
        }
        /* and back to f32 exactly */
        ghc_tensor_t *z = like(x, F32);
        OK(ghc_op_cast(z, y, 1.0f, NULL, NULL));
        for (int64_t i = 3; i < N(x); i++)
            ck_assert(get(z, i) == get(y, i));
    }
}
END_TEST

START_TEST(cast_stochastic)
{
    const int64_t n = 100000;
    /* between bf16 codes 1.0 and 1 + 2^-7, at 30% of the gap; and a negative at 70% */
    const double vals[2] = { 1.0 + 0.3 * 0x1p-7, -(2.0 + 0.7 * 0x1p-6) };
    const double lo[2] = { 1.0, -2.0 }, hi[2] = { 1.0 + 0x1p-7, -(2.0 + 0x1p-6) }, frac[2] = { 0.3, 0.7 };
    for (int c = 0; c < 2; c++) {
        ghc_tensor_t *x = T(F32, n), *y = T(BF16, n);
        fillv(x, vals[c]);
        struct ghc_rng rng = { 1234 + (uint64_t)c, 99 };
        OK(ghc_op_cast(y, x, 1.0f, &rng, NULL));
        double mean = 0, up = 0;
        float xf = (float)vals[c];
        uint32_t xb;
        memcpy(&xb, &xf, 4);
        for (int64_t i = 0; i < n; i++) {
            double v = get(y, i);
            ck_assert_msg(v == lo[c] || v == hi[c], "[%lld] = %g", (long long)i, v);
            uint16_t want = (uint16_t)((xb + (lane(&rng, i) >> 16)) >> 16);
            ck_assert(((uint16_t *)ghc_tensor_data(y))[i] == want);
            mean += v;
            up += v == hi[c];
        }
        mean /= (double)n;
        up /= (double)n;
        ck_assert_msg(fabs(up - frac[c]) < 0.01, "P(up) %g, want %g", up, frac[c]);
        ck_assert_msg(fabs(mean - (double)xf) < 0.01 * fabs(hi[c] - lo[c]), "mean %.9g vs %.9g", mean, (double)xf);
    }
    /* specials and exact values pass through; scale applies first */
    ghc_tensor_t *x = T(F32, 8), *y = T(BF16, 8);
    double sp[8] = { NAN, INFINITY, -INFINITY, 0.0, 1.0, -0.5, 3.0, 256.0 };
    for (int i = 0; i < 8; i++)
        set(x, i, sp[i]);
    OK(ghc_op_cast(y, x, 2.0f, &(struct ghc_rng){ 5, 0 }, NULL));
    ck_assert(isnan(get(y, 0)));
    ck_assert(get(y, 1) == INFINITY && get(y, 2) == -INFINITY);
    for (int i = 3; i < 8; i++)
        ck_assert_msg(get(y, i) == 2.0 * sp[i], "[%d] %g", i, get(y, i));
    ck_assert_int_eq(ghc_op_cast(T(GHC_DTYPE_F16, 8), x, 1.0f, &(struct ghc_rng){ 5, 0 }, NULL), GHC_EINVAL);
}
END_TEST

/* ---- GEMM --------------------------------------------------------------------------------- */

static double gelu_d(double z)
{
    return 0.5 * z * (1.0 + tanh(sqrt(2.0 / M_PI) * (z + 0.044715 * z * z * z)));
}

/* One GEMM against a float64 reference on the stored (rounded) operands. */
static void gemm_case(enum ghc_dtype dab, enum ghc_dtype dc, bool ta, bool tb, bool ba, bool bb,
                      enum ghc_epilogue epi, float alpha, float beta, enum ghc_dtype dbias, float sa, float sb)
{
    const int64_t M = 5, K = 7, Nn = 6, Bt = 3;
    bool batched = ba || bb;
    int64_t sha[3] = { Bt, ta ? K : M, ta ? M : K }, shb[3] = { Bt, tb ? Nn : K, tb ? K : Nn };
    int64_t shc[3] = { Bt, M, Nn };
    ghc_tensor_t *a = mk(dab, ba ? 3 : 2, ba ? sha : sha + 1), *b = mk(dab, bb ? 3 : 2, bb ? shb : shb + 1);
    ghc_tensor_t *c = mk(dc, batched ? 3 : 2, batched ? shc : shc + 1);
    bool fp8 = dab == GHC_DTYPE_F8_E4M3;
    rnd(a, fp8 ? -3 : -1, fp8 ? 3 : 1);
    rnd(b, fp8 ? -3 : -1, fp8 ? 3 : 1);
    if (beta != 0.0f)
        rnd(c, -1, 1);
    else
        fillv(c, NAN);   /* must not be read */
    struct ghc_gemm args = { .trans_a = ta, .trans_b = tb, .alpha = alpha, .beta = beta, .epilogue = epi,
                             .scale_a = sa, .scale_b = sb };
    ghc_tensor_t *bias = NULL, *pre = NULL;
    if (epi != GHC_EPI_NONE)
        args.bias = bias = rnd(T(dbias, Nn), -1, 1);
    if (epi == GHC_EPI_BIAS_GELU)
        args.pre_gelu = pre = like(c, dc);
    double *ref = dalloc(N(c)), *rpre = dalloc(N(c));
    double al = (alpha != 0.0f ? alpha : 1.0) * (fp8 ? (double)(sa ? sa : 1) * (sb ? sb : 1) : 1.0);
    for (int64_t bi = 0; bi < (batched ? Bt : 1); bi++)
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < Nn; n++) {
                double s = 0, s_abs = 0;
                for (int64_t k = 0; k < K; k++) {
                    int64_t ia = (ba ? bi * M * K : 0) + (ta ? k * M + m : m * K + k);
                    int64_t ib = (bb ? bi * K * Nn : 0) + (tb ? n * K + k : k * Nn + n);
                    s += get(a, ia) * get(b, ib);
                    s_abs += fabs(get(a, ia) * get(b, ib));
                }
                int64_t ic = (bi * M + m) * Nn + n;
                double v = al * s + (beta != 0.0f ? beta * get(c, ic) : 0.0) + (bias ? get(bias, n) : 0.0);
                rpre[ic] = v;
                ref[ic] = epi == GHC_EPI_BIAS_GELU ? gelu_d(v) : v;
                (void)s_abs;
            }
    OK(ghc_op_gemm(c, a, b, &args, NULL));
    char what[128];
    snprintf(what, sizeof(what), "gemm %s->%s ta=%d tb=%d ba=%d bb=%d epi=%d beta=%g", ghc_dtype_name(dab),
             ghc_dtype_name(dc), ta, tb, ba, bb, (int)epi, (double)beta);
    double atol = dc == F32 ? 2e-5 * (fp8 ? 30 : 1) : 2e-2, rtol = dc == F32 ? 1e-5 : 8e-3;
    expect(what, c, ref, atol, rtol);
    if (pre)
        expect("pre_gelu", pre, rpre, atol, rtol);
    free(ref);
    free(rpre);
}

START_TEST(gemm_all)
{
    seed(2);
    for (int t = 0; t < 4; t++)
        gemm_case(F32, F32, t & 1, t & 2, false, false, GHC_EPI_NONE, 0.0f, 0.0f, F32, 0, 0);
    for (int t = 0; t < 4; t++) {
        gemm_case(F32, F32, t & 1, t & 2, true, true, GHC_EPI_NONE, 1.5f, 0.0f, F32, 0, 0);
        gemm_case(F32, F32, t & 1, t & 2, true, false, GHC_EPI_NONE, 1.0f, 0.0f, F32, 0, 0);   /* shared B */
        gemm_case(F32, F32, t & 1, t & 2, false, true, GHC_EPI_NONE, 1.0f, 0.0f, F32, 0, 0);   /* shared A */
    }
    gemm_case(F32, F32, false, true, false, false, GHC_EPI_BIAS, 0.5f, 0.0f, F32, 0, 0);       /* linear */
    gemm_case(F32, F32, false, true, true, false, GHC_EPI_BIAS, 1.0f, 0.7f, BF16, 0, 0);
    gemm_case(F32, F32, true, false, false, false, GHC_EPI_NONE, 1.0f, 1.0f, F32, 0, 0);       /* accumulate */
    gemm_case(F32, F32, false, true, false, false, GHC_EPI_BIAS_GELU, 1.0f, 0.0f, BF16, 0, 0);
    gemm_case(F32, BF16, false, true, true, false, GHC_EPI_BIAS_GELU, 2.0f, 0.0f, F32, 0, 0);
    for (int t = 0; t < 4; t++) {
        gemm_case(BF16, BF16, t & 1, t & 2, false, false, GHC_EPI_NONE, 1.0f, 0.0f, F32, 0, 0);
        gemm_case(BF16, F32, t & 1, t & 2, true, true, GHC_EPI_BIAS, 1.0f, 0.5f, BF16, 0, 0);
    }
    gemm_case(GHC_DTYPE_F8_E4M3, F32, false, true, false, false, GHC_EPI_NONE, 1.0f, 0.0f, F32, 0.5f, 3.0f);
    gemm_case(GHC_DTYPE_F8_E4M3, BF16, false, true, true, false, GHC_EPI_BIAS, 1.0f, 0.0f, BF16, 0.25f, 0.0f);
    gemm_case(GHC_DTYPE_F8_E4M3, F32, true, false, false, true, GHC_EPI_BIAS_GELU, 0.5f, 0.0f, F32, 0.1f, 2.0f);
}
END_TEST

/* rc is GHC_EINVAL with a message that starts with "op:" and holds `part`. */
static void expect_einval(int rc, const char *op, const char *part)
{
    const char *msg = ghc_error_message(core);
    ck_assert_msg(rc == GHC_EINVAL, "%s: rc %d (%s)", op, rc, msg);
    ck_assert_int_eq(ghc_error_code(core), GHC_EINVAL);
    ck_assert_msg(strncmp(msg, op, strlen(op)) == 0 && msg[strlen(op)] == ':', "'%s' does not start with %s:", msg, op);
    ck_assert_msg(strstr(msg, part) != NULL, "'%s' lacks '%s'", msg, part);
    ghc_error_clear(core);
}

/* ---- column views (ghc_tensor_view_cols) ---------------------------------------------------- */

/* A dense copy of column view v (rows ghc_tensor_row_stride(v) apart in its parent). */
static ghc_tensor_t *dense_of(const ghc_tensor_t *v)
{
    ghc_tensor_t *d = like(v, ghc_tensor_dtype(v));
    const int64_t D = ghc_tensor_dim(v, -1), ld = ghc_tensor_row_stride(v);
    for (int64_t i = 0; i < N(v); i++)
        set(d, i, get(v, i / D * ld + i % D));
    return d;
}

/* gemm on column views of wider tensors (a batched A [2, 5, 7] from columns 3..9 of [2, 5, 12],
 * B from columns of a [6, 10] weight, both transposes, C [2, 5, 6] written into columns 1..6 of
 * [2, 5, 9] with beta): the same bits as gemm on dense copies, and C's parent keeps its other
 * columns; ops without views refuse them, and so does gemm for a C view with an epilogue; a
 * view of all columns is dense. */
START_TEST(gemm_column_views)
{
    seed(9);
    for (int t = 0; t < 4; t++) {
        const bool ta = t & 1, tb = t & 2;
        ghc_tensor_t *xa = rnd(ta ? T(F32, 2, 7, 8) : T(F32, 2, 5, 12), -1, 1);
        ghc_tensor_t *xb = rnd(tb ? T(F32, 6, 10) : T(F32, 7, 9), -1, 1), *xc = T(F32, 2, 5, 9);
        fillv(xc, 7.0);
        ghc_tensor_t *av = ghc_tensor_view_cols(xa, ta ? 2 : 3, ta ? 5 : 7), *bv = ghc_tensor_view_cols(xb, 2, tb ? 7 : 6);
        ghc_tensor_t *cv = ghc_tensor_view_cols(xc, 1, 6);
        ck_assert(av && bv && cv);
        pool[npool++] = av, pool[npool++] = bv, pool[npool++] = cv;
        ck_assert_int_eq(ghc_tensor_row_stride(av), ta ? 8 : 12);
        ck_assert_int_eq(ghc_tensor_row_stride(cv), 9);
        for (int64_t i = 0; i < N(cv); i++)   /* C's old values, for beta */
            set(xc, i / 6 * 9 + 1 + i % 6, 0.25 * (double)(i % 11));
        ghc_tensor_t *ad = dense_of(av), *bd = dense_of(bv), *cd = dense_of(cv);
        struct ghc_gemm g = { .trans_a = ta, .trans_b = tb, .alpha = 1.5f, .beta = 0.5f };
        OK(ghc_op_gemm(cv, av, bv, &g, NULL));
        OK(ghc_op_gemm(cd, ad, bd, &g, NULL));
        for (int64_t i = 0; i < N(xc); i++) {
            const int64_t col = i % 9, row = i / 9;
            double want = col >= 1 && col < 7 ? get(cd, row * 6 + col - 1) : 7.0;
            ck_assert_msg(get(xc, i) == want, "ta=%d tb=%d: C parent [%lld]: %.9g, want %.9g", ta, tb, (long long)i,
                          get(xc, i), want);
        }
    }
    ghc_tensor_t *x = rnd(T(F32, 4, 8), -1, 1), *y = T(F32, 4, 3), *bias = T(F32, 3), *w = rnd(T(F32, 3, 5), -1, 1);
    ghc_tensor_t *xv = ghc_tensor_view_cols(x, 2, 5), *all = ghc_tensor_view_cols(x, 0, 8);
    ck_assert(xv && all);
    pool[npool++] = xv, pool[npool++] = all;
    ck_assert_int_eq(ghc_tensor_row_stride(all), 8);   /* every column: dense */
    OK(ghc_op_scale(T(F32, 4, 8), all, 2.0f, NULL));
    expect_einval(ghc_op_scale(T(F32, 4, 5), xv, 2.0f, NULL), "scale", "column views");
    struct ghc_gemm lin = { .trans_b = true, .epilogue = GHC_EPI_BIAS, .bias = bias };
    ghc_tensor_t *yw = T(F32, 4, 6), *yv = ghc_tensor_view_cols(yw, 1, 3), *pre = T(F32, 4, 3), *g = T(F32, 4, 3);
    ck_assert(yv);
    pool[npool++] = yv;
    OK(ghc_op_gemm(y, xv, w, &lin, NULL));   /* a view A with an epilogue (since API 7) */
    /* a view C with an epilogue (since API 20): the dense C's values, its other columns kept;
     * pre_gelu dense */
    struct ghc_gemm lg = { .trans_b = true, .epilogue = GHC_EPI_BIAS_GELU, .bias = bias, .pre_gelu = pre };
    OK(ghc_op_gemm(g, xv, w, &(struct ghc_gemm){ .trans_b = true, .epilogue = GHC_EPI_BIAS_GELU, .bias = bias }, NULL));
    for (int e = 0; e < 2; e++) {
        OK(ghc_op_fill(yw, 7.0, NULL));
        OK(ghc_op_fill(pre, 9.0, NULL));
        OK(ghc_op_gemm(yv, xv, w, e ? &lg : &lin, NULL));
        for (int64_t i = 0; i < 24; i++) {
            const int64_t col = i % 6, row = i / 6;
            double want = col >= 1 && col < 4 ? get(e ? g : y, row * 3 + col - 1) : 7.0;
            ck_assert_msg(get(yw, i) == want, "epilogue %d: C parent [%lld]: %.9g, want %.9g", e, (long long)i,
                          get(yw, i), want);
        }
    }
    for (int64_t i = 0; i < 12; i++)
        ck_assert_msg(get(pre, i) == get(y, i), "pre_gelu [%lld]: %.9g, want %.9g", (long long)i, get(pre, i),
                      get(y, i));
    ck_assert_ptr_null(ghc_tensor_view_cols(x, 4, 5));
    ghc_error_clear(core);
    ck_assert_int_eq(ghc_tensor_reshape(xv, 1, (const int64_t[]){ 20 }), GHC_EINVAL);
    ghc_error_clear(core);
}
END_TEST

/* ---- column views as results and operands (since API 7) ------------------------------------ */

#define SENTINEL 12345.0

/* A view of columns [col0, col0 + D) of a new tensor of `shape` (last dim D) but pad columns
 * wider, every element of which is SENTINEL (in dt); *parent gets the wide tensor. */
static ghc_tensor_t *view_in(enum ghc_dtype dt, const ghc_tensor_t *shape_of, int64_t col0, int64_t pad,
                             ghc_tensor_t **parent)
{
    int nd = ghc_tensor_ndim(shape_of);
    int64_t sh[GHC_TENSOR_MAX_DIMS];
    memcpy(sh, ghc_tensor_shape(shape_of), (size_t)nd * sizeof(int64_t));
    sh[nd - 1] += pad;
    *parent = mk(dt, nd, sh);
    fillv(*parent, SENTINEL);
    ghc_tensor_t *v = ghc_tensor_view_cols(*parent, col0, ghc_tensor_dim(shape_of, -1));
    ck_assert_msg(v != NULL, "view: %s", ghc_error_message(core));
    ck_assert_int_lt(npool, 512);
    pool[npool++] = v;
    return v;
}

/* The bits of dense d in a view (view_in) of a SENTINEL-filled wider tensor. */
static ghc_tensor_t *embed(const ghc_tensor_t *d, int64_t col0, int64_t pad, ghc_tensor_t **parent)
{
    ghc_tensor_t *v = view_in(ghc_tensor_dtype(d), d, col0, pad, parent);
    const size_t es = ghc_dtype_size(ghc_tensor_dtype(d));
    const int64_t D = ghc_tensor_dim(d, -1), ld = ghc_tensor_row_stride(v);
    for (int64_t r = 0; r < N(d) / D; r++)
        memcpy((char *)ghc_tensor_data(v) + (size_t)(r * ld) * es, (const char *)ghc_tensor_cdata(d) + (size_t)(r * D) * es,
               (size_t)D * es);
    return v;
}

/* View v (view_in) holds the bits of dense d, and every other element of its parent is still
 * SENTINEL. */
static void expect_view(const char *what, const ghc_tensor_t *parent, const ghc_tensor_t *v, const ghc_tensor_t *d)
{
    const size_t es = ghc_dtype_size(ghc_tensor_dtype(parent));
    const int64_t D = ghc_tensor_dim(v, -1), ld = ghc_tensor_row_stride(v);
    const int64_t col0 = ((const char *)ghc_tensor_cdata(v) - (const char *)ghc_tensor_cdata(parent)) / (int64_t)es;
    const double sentinel = rt(ghc_tensor_dtype(parent), (float)SENTINEL);
    const char *pp = ghc_tensor_cdata(parent), *dp = ghc_tensor_cdata(d);
    ck_assert_msg(ghc_tensor_dtype(d) == ghc_tensor_dtype(parent) && N(d) == N(v), "%s: dense result unlike the view",
                  what);
    for (int64_t i = 0; i < N(parent); i++) {
        const int64_t r = i / ld, j = i % ld - col0;
        if (j >= 0 && j < D)
            ck_assert_msg(memcmp(pp + (size_t)i * es, dp + (size_t)(r * D + j) * es, es) == 0,
                          "%s: view [%lld, %lld] = %.9g, dense %.9g", what, (long long)r, (long long)j, get(parent, i),
                          get(d, r * D + j));
        else
            ck_assert_msg(get(parent, i) == sentinel, "%s: row %lld column %lld outside the view became %.9g", what,
                          (long long)r, (long long)(i % ld), get(parent, i));
    }
}

static void expect_same_bits(const char *what, const ghc_tensor_t *a, const ghc_tensor_t *b)
{
    ck_assert_msg(ghc_tensor_nbytes(a) == ghc_tensor_nbytes(b) &&
                  memcmp(ghc_tensor_cdata(a), ghc_tensor_cdata(b), ghc_tensor_nbytes(a)) == 0, "%s: bits differ", what);
}

/* cast f32 -> bf16, bf16 -> bf16 and bf16 -> f32 into a view, from a view and view to view:
 * the bits of the dense cast, the parent's other columns untouched. */
START_TEST(views_cast)
{
    seed(21);
    static const enum ghc_dtype dts[3][2] = { { F32, BF16 }, { BF16, BF16 }, { BF16, F32 } };
    for (int p = 0; p < 3; p++) {
        const enum ghc_dtype sd = dts[p][0], dd = dts[p][1];
        ghc_tensor_t *src = rnd(T(sd, 2, 5, 7), -300, 300), *want = like(src, dd), *got = like(src, dd), *pd, *ps;
        OK(ghc_op_cast(want, src, 0.5f, NULL, NULL));
        ghc_tensor_t *dv = view_in(dd, src, 3, 4, &pd);
        OK(ghc_op_cast(dv, src, 0.5f, NULL, NULL));
        expect_view("cast into a view", pd, dv, want);
        ghc_tensor_t *sv = embed(src, 2, 5, &ps);
        OK(ghc_op_cast(got, sv, 0.5f, NULL, NULL));
        expect_same_bits("cast from a view", got, want);
        dv = view_in(dd, src, 1, 2, &pd);
        OK(ghc_op_cast(dv, sv, 0.5f, NULL, NULL));
        expect_view("cast view to view", pd, dv, want);
        expect_view("cast source", ps, sv, src);   /* the source's parent is only read */
    }
    /* stochastic rounding takes dense tensors only; a view needs the other's last dim */
    ghc_tensor_t *x = rnd(T(F32, 4, 6), -1, 1), *px, *xv = embed(x, 1, 3, &px), *pb;
    ghc_tensor_t *bv = view_in(BF16, x, 0, 2, &pb);
    expect_einval(ghc_op_cast(bv, x, 1.0f, &(struct ghc_rng){ 1, 0 }, NULL), "cast", "stochastic rounding");
    expect_einval(ghc_op_cast(T(BF16, 4, 6), xv, 1.0f, &(struct ghc_rng){ 1, 0 }, NULL), "cast", "stochastic rounding");
    expect_einval(ghc_op_cast(T(BF16, 24), xv, 1.0f, NULL, NULL), "cast", "last dimension");
    expect_einval(ghc_op_cast(bv, T(F32, 6, 4), 1.0f, NULL, NULL), "cast", "last dimension");
    /* dense tensors of other shapes (equal numel) still cast element by element */
    ghc_tensor_t *flat = T(BF16, 24), *same = T(BF16, 4, 6);
    OK(ghc_op_cast(flat, x, 1.0f, NULL, NULL));
    OK(ghc_op_cast(same, x, 1.0f, NULL, NULL));
    expect_same_bits("cast to another dense shape", flat, same);
}
END_TEST

/* copy into a view, from a view and view to view (f32, bf16): the source's bits. */
START_TEST(views_copy)
{
    seed(22);
    static const enum ghc_dtype dts[2] = { F32, BF16 };
    for (int p = 0; p < 2; p++) {
        ghc_tensor_t *src = rnd(T(dts[p], 3, 2, 5), -10, 10), *got = like(src, dts[p]), *pd, *ps;
        ghc_tensor_t *dv = view_in(dts[p], src, 2, 3, &pd);
        OK(ghc_op_copy(dv, src, NULL));
        expect_view("copy into a view", pd, dv, src);
        ghc_tensor_t *sv = embed(src, 4, 4, &ps);
        OK(ghc_op_copy(got, sv, NULL));
        expect_same_bits("copy from a view", got, src);
        dv = view_in(dts[p], src, 0, 1, &pd);
        OK(ghc_op_copy(dv, sv, NULL));
        expect_view("copy view to view", pd, dv, src);
    }
    ghc_tensor_t *x = T(F32, 4, 6), *px, *xv = view_in(F32, x, 1, 1, &px);
    expect_einval(ghc_op_copy(xv, T(F32, 6, 4), NULL), "copy", "last dimension");
    expect_einval(ghc_op_copy(T(F32, 24), xv, NULL), "copy", "last dimension");
}
END_TEST

/* layernorm_fwd into a view y (x f32 or bf16, y f32 or bf16, affine, [B, D] shift/scale): the
 * dense y's bits and the same stats. */
START_TEST(views_layernorm)
{
    seed(23);
    for (int d = 0; d < 4; d++) {
        const enum ghc_dtype dx = d & 1 ? BF16 : F32, dy = d & 2 ? BF16 : F32;
        ghc_tensor_t *x = rnd(T(dx, 2, 3, 8), -2, 3), *y = like(x, dy), *st = T(F32, 6, 2), *st2 = T(F32, 6, 2);
        ghc_tensor_t *w = rnd(T(F32, 8), 0.5, 1.5), *b = rnd(T(BF16, 8), -1, 1);
        ghc_tensor_t *sh = rnd(T(F32, 2, 8), -1, 1), *sc = rnd(T(F32, 2, 8), -0.5, 0.5), *py;
        OK(ghc_op_layernorm_fwd(y, st, x, w, b, sh, sc, 1e-6f, NULL));
        ghc_tensor_t *yv = view_in(dy, x, 5, 7, &py);
        OK(ghc_op_layernorm_fwd(yv, st2, x, w, b, sh, sc, 1e-6f, NULL));
        expect_view("layernorm_fwd into a view", py, yv, y);
        expect_same_bits("layernorm_fwd stats with a view y", st2, st);
    }
}
END_TEST

/* gelu_tanh into a view y (f32 and bf16 out): the dense y's bits; a view y over x's memory
 * is refused. */
START_TEST(views_gelu)
{
    seed(24);
    for (int d = 0; d < 4; d++) {
        const enum ghc_dtype dx = d & 1 ? BF16 : F32, dy = d & 2 ? BF16 : F32;
        ghc_tensor_t *x = rnd(T(dx, 5, 13), -5, 5), *y = like(x, dy), *py;
        OK(ghc_op_gelu_tanh(y, x, NULL));
        ghc_tensor_t *yv = view_in(dy, x, 6, 7, &py);
        OK(ghc_op_gelu_tanh(yv, x, NULL));
        expect_view("gelu_tanh into a view", py, yv, y);
    }
    ghc_tensor_t *wide = T(F32, 5, 26);
    ghc_tensor_t *x = ghc_tensor_wrap(core, F32, 2, (const int64_t[]){ 5, 13 }, GHC_DEVICE_CPU, ghc_tensor_data(wide));
    ghc_tensor_t *yv = ghc_tensor_view_cols(wide, 13, 13);
    ck_assert(x && yv);
    pool[npool++] = x, pool[npool++] = yv;
    expect_einval(ghc_op_gelu_tanh(yv, x, NULL), "gelu_tanh", "in place");
    expect_einval(ghc_op_gelu_tanh(T(F32, 5, 13), yv, NULL), "gelu_tanh", "column views");
}
END_TEST

/* attention with o as [B, Lq, H Dh], dense and a view: the bits of o [B, Lq, H, Dh]; the
 * backward with o a view gives the gradients of the 4-D o bit for bit. */
START_TEST(views_attention)
{
    seed(25);
    const int64_t B = 2, Lq = 3, Lk = 5, H = 2, Dh = 4;
    for (int d = 0; d < 2; d++) {
        const enum ghc_dtype dt = d ? BF16 : F32;
        ghc_tensor_t *q = rnd(T(dt, B, Lq, H, Dh), -1, 1), *k = rnd(T(dt, B, Lk, H, Dh), -1, 1);
        ghc_tensor_t *v = rnd(T(dt, B, Lk, H, Dh), -1, 1), *dout = rnd(like(q, dt), -1, 1);
        ghc_tensor_t *o4 = like(q, dt), *o3 = T(dt, B, Lq, H * Dh), *lse = T(F32, B, H, Lq), *lse2 = like(lse, F32);
        ghc_tensor_t *po, *ov = view_in(dt, o3, 3, 6, &po);
        OK(ghc_op_attention_fwd(o4, lse, q, k, v, 0.6f, NULL));
        OK(ghc_op_attention_fwd(o3, lse2, q, k, v, 0.6f, NULL));
        expect_same_bits("attention_fwd o [B, Lq, H Dh]", o3, o4);
        expect_same_bits("attention_fwd lse with o 3-D", lse2, lse);
        OK(ghc_op_attention_fwd(ov, lse2, q, k, v, 0.6f, NULL));
        expect_view("attention_fwd into a view o", po, ov, o4);
        expect_same_bits("attention_fwd lse with a view o", lse2, lse);
        ghc_tensor_t *g[2][3];
        for (int f = 0; f < 2; f++) {
            for (int j = 0; j < 3; j++)
                g[f][j] = like(j ? k : q, dt);
            OK(ghc_op_attention_bwd(g[f][0], g[f][1], g[f][2], dout, q, k, v, f ? ov : o4, lse, 0.6f, NULL));
        }
        expect_same_bits("attention_bwd dq with a view o", g[1][0], g[0][0]);
        expect_same_bits("attention_bwd dk with a view o", g[1][1], g[0][1]);
        expect_same_bits("attention_bwd dv with a view o", g[1][2], g[0][2]);
    }
    ghc_tensor_t *q = T(F32, 1, 2, 2, 4), *k = T(F32, 1, 3, 2, 4), *lse = T(F32, 1, 2, 2), *p4, *p3;
    ghc_tensor_t *o4v = view_in(F32, T(F32, 1, 2, 2, 4), 0, 2, &p4), *o3v = view_in(F32, T(F32, 1, 2, 9), 0, 2, &p3);
    expect_einval(ghc_op_attention_fwd(o4v, lse, q, k, k, 1, NULL), "attention_fwd", "3-D");
    expect_einval(ghc_op_attention_fwd(o3v, lse, q, k, k, 1, NULL), "attention_fwd", "[1, 2, 8]");
    expect_einval(ghc_op_attention_bwd(T(F32, 1, 2, 2, 4), NULL, NULL, q, q, k, k, T(F32, 1, 2, 4, 2), lse, 1, NULL),
                  "attention_bwd", "'o'");
}
END_TEST

/* gemm with A and B column views and the BIAS and BIAS_GELU epilogues (a K-concatenated linear
 * layer x [2, 5, 7] of [2, 5, 12], W [6, 7] of [6, 10]): the bits of the dense operands'
 * gemm, pre_gelu too; fp8 views are refused. */
START_TEST(views_gemm_epilogue)
{
    seed(26);
    for (int d = 0; d < 2; d++)
        for (int e = 0; e < 2; e++) {
            const enum ghc_dtype dt = d ? BF16 : F32;
            const enum ghc_epilogue epi = e ? GHC_EPI_BIAS_GELU : GHC_EPI_BIAS;
            ghc_tensor_t *xa = rnd(T(dt, 2, 5, 12), -1, 1), *xb = rnd(T(dt, 6, 10), -1, 1);
            ghc_tensor_t *av = ghc_tensor_view_cols(xa, 3, 7), *bv = ghc_tensor_view_cols(xb, 2, 7);
            ck_assert(av && bv);
            pool[npool++] = av, pool[npool++] = bv;
            ghc_tensor_t *bias = rnd(T(F32, 6), -1, 1), *c = T(dt, 2, 5, 6), *cd = T(dt, 2, 5, 6);
            ghc_tensor_t *pre = e ? T(dt, 2, 5, 6) : NULL, *pred = e ? T(dt, 2, 5, 6) : NULL;
            struct ghc_gemm g = { .trans_b = true, .alpha = 0.75f, .epilogue = epi, .bias = bias, .pre_gelu = pre };
            OK(ghc_op_gemm(c, av, bv, &g, NULL));
            g.pre_gelu = pred;
            OK(ghc_op_gemm(cd, dense_of(av), dense_of(bv), &g, NULL));
            expect_same_bits("gemm with view A and B and an epilogue", c, cd);
            if (pre)
                expect_same_bits("gemm pre_gelu with view A and B", pre, pred);
        }
    ghc_tensor_t *x8 = T(GHC_DTYPE_F8_E4M3, 4, 8), *w8 = T(GHC_DTYPE_F8_E4M3, 3, 5);
    ghc_tensor_t *x8v = ghc_tensor_view_cols(x8, 1, 5);
    ck_assert(x8v);
    pool[npool++] = x8v;
    expect_einval(ghc_op_gemm(T(F32, 4, 3), x8v, w8, &(struct ghc_gemm){ .trans_b = true }, NULL), "gemm",
                  "only in bf16 or f32");
}
END_TEST

/* lora_cast_bwd (since API 8): dy cast into the first M columns of a [.., M + 16] (as wan22's
 * cast with spare columns), dh into r of the spare columns, h from a view, db accumulating, A
 * into a view of rows: g holds the bits of ghc_op_cast, dh and db the sums over the rounded g
 * (double reference), the parents' other columns stay; wrong shapes and dtypes are refused. */
START_TEST(lora_cast_bwd)
{
    seed(31);
    static const struct { enum ghc_dtype dt; int64_t B, L, M, r; } cs[] = {
        { BF16, 2, 7, 12, 5 }, { F32, 1, 9, 8, 3 }, { BF16, 1, 1, 4, 1 }, { BF16, 1, 3, 5, 16 },
    };
    for (size_t k = 0; k < sizeof(cs) / sizeof(cs[0]); k++) {
        const enum ghc_dtype dt = cs[k].dt;
        const int64_t B = cs[k].B, L = cs[k].L, M = cs[k].M, r = cs[k].r, Nr = B * L;
        ghc_tensor_t *dy = rnd(T(F32, B, L, M), -2, 2), *gp = T(dt, B, L, M + 16), *hp;
        fillv(gp, SENTINEL);
        ghc_tensor_t *gv = ghc_tensor_view_cols(gp, 0, M), *dhv = ghc_tensor_view_cols(gp, M, r);
        ck_assert(gv && dhv);
        pool[npool++] = gv, pool[npool++] = dhv;
        ghc_tensor_t *hd = rnd(T(dt, B, L, r), -1, 1), *hv = embed(hd, 3, 6, &hp);
        ghc_tensor_t *b = rnd(T(dt, M, r), -1, 1), *db = rnd(T(F32, M, r), -1, 1);
        double *rdh = dalloc(Nr * r), *rdb = dalloc(M * r);
        for (int64_t i = 0; i < M * r; i++)
            rdb[i] = get(db, i);
        for (int64_t n = 0; n < Nr; n++)
            for (int64_t m = 0; m < M; m++) {
                const double gr = rt(dt, (float)get(dy, n * M + m));
                for (int64_t j = 0; j < r; j++) {
                    rdh[n * r + j] += 0.75 * gr * get(b, m * r + j);
                    rdb[m * r + j] += gr * get(hd, n * r + j);
                }
            }
        ghc_tensor_t *af = rnd(T(F32, r, 6), -1, 1), *wp = T(dt, r, 9);   /* A into a [r, 6] view */
        fillv(wp, SENTINEL);
        ghc_tensor_t *wv = ghc_tensor_view_cols(wp, 2, 6);
        ck_assert(wv);
        pool[npool++] = wv;
        OK(ghc_op_lora_cast_bwd(gv, dhv, db, dy, hv, b, 0.75f, wv, af, NULL));
        for (int64_t i = 0; i < r * 9; i++)
            ck_assert_msg(get(wp, i) == (i % 9 >= 2 && i % 9 < 8 ? rt(dt, (float)get(af, i / 9 * 6 + i % 9 - 2))
                                                              : rt(dt, (float)SENTINEL)),
                          "lora_cast_bwd: wrows [%lld, %lld]", (long long)(i / 9), (long long)(i % 9));
        ghc_tensor_t *gc = like(dy, dt);
        OK(ghc_op_cast(gc, dy, 1.0f, NULL, NULL));
        expect_same_bits("lora_cast_bwd g", dense_of(gv), gc);
        expect("lora_cast_bwd dh", dense_of(dhv), rdh, 1e-5, dt == BF16 ? 8e-3 : 1e-5);
        expect("lora_cast_bwd db", db, rdb, 1e-5, 1e-5);
        for (int64_t i = 0; i < N(gp); i++)
            if (i % (M + 16) >= M + r)
                ck_assert_msg(get(gp, i) == rt(dt, (float)SENTINEL), "lora_cast_bwd: spare column %lld changed",
                              (long long)(i % (M + 16)));
        free(rdh);
        free(rdb);
    }
    ghc_tensor_t *dy = rnd(T(F32, 6, 8), -1, 1), *g = T(BF16, 6, 8), *dh = T(BF16, 6, 2), *h = T(BF16, 6, 2);
    ghc_tensor_t *b = T(BF16, 8, 2), *db = T(F32, 8, 2);
    expect_einval(ghc_op_lora_cast_bwd(g, dh, T(F32, 8, 3), dy, h, b, 1.0f, NULL, NULL, NULL), "lora_cast_bwd", "'db'");
    expect_einval(ghc_op_lora_cast_bwd(g, dh, db, dy, T(F32, 6, 2), b, 1.0f, NULL, NULL, NULL), "lora_cast_bwd", "'h'");
    expect_einval(ghc_op_lora_cast_bwd(g, dh, db, T(F32, 6, 9), h, b, 1.0f, NULL, NULL, NULL), "lora_cast_bwd", "'dy'");
    expect_einval(ghc_op_lora_cast_bwd(g, T(BF16, 5, 2), db, dy, h, b, 1.0f, NULL, NULL, NULL), "lora_cast_bwd", "'dh'");
    expect_einval(ghc_op_lora_cast_bwd(g, dh, db, dy, h, T(BF16, 7, 2), 1.0f, NULL, NULL, NULL), "lora_cast_bwd", "'b'");
    expect_einval(ghc_op_lora_cast_bwd(g, dh, db, dy, h, b, 1.0f, T(BF16, 2, 5), NULL, NULL), "lora_cast_bwd", "'a'");
    expect_einval(ghc_op_lora_cast_bwd(g, dh, db, dy, h, b, 1.0f, T(BF16, 3, 5), T(F32, 3, 5), NULL), "lora_cast_bwd",
                  "'wrows'");
    OK(ghc_op_lora_cast_bwd(g, dh, db, dy, h, b, 1.0f, T(BF16, 2, 5), T(F32, 2, 5), NULL));
}
END_TEST

/* lora_fwd (since API 8): h = s x a^T from a view of x into a view (a f32, rounded to x's
 * dtype; double reference), keep a copy of it, B into a view of spare columns; with x NULL, h
 * from keep; wrong shapes are refused. */
START_TEST(lora_fwd)
{
    seed(37);
    static const struct { enum ghc_dtype dt; int64_t B, L, K, r; } cs[] = {
        { BF16, 2, 5, 12, 4 }, { F32, 1, 7, 9, 3 }, { BF16, 1, 2, 6, 16 },
    };
    for (size_t k = 0; k < sizeof(cs) / sizeof(cs[0]); k++) {
        const enum ghc_dtype dt = cs[k].dt;
        const int64_t B = cs[k].B, L = cs[k].L, K = cs[k].K, r = cs[k].r, Nr = B * L;
        ghc_tensor_t *xd = rnd(T(dt, B, L, K), -1, 1), *xp, *xv = embed(xd, 1, 20, &xp);
        ghc_tensor_t *hv = ghc_tensor_view_cols(xp, K + 2, r);   /* h in x's spare columns, as in wan22 */
        ck_assert(hv);
        pool[npool++] = hv;
        ghc_tensor_t *a = rnd(T(F32, r, K), -1, 1), *keep = T(dt, Nr, r), *b = rnd(T(F32, 5, r), -1, 1);
        ghc_tensor_t *wp = T(dt, 5, r + 3), *wv = ghc_tensor_view_cols(wp, 3, r);
        ck_assert(wv);
        pool[npool++] = wv;
        fillv(wp, SENTINEL);
        OK(ghc_op_lora_fwd(hv, keep, xv, a, 0.5f, wv, b, NULL));
        double *ref = dalloc(Nr * r);
        for (int64_t n = 0; n < Nr; n++)
            for (int64_t j = 0; j < r; j++) {
                for (int64_t q = 0; q < K; q++)
                    ref[n * r + j] += get(xd, n * K + q) * rt(dt, (float)get(a, j * K + q));
                ref[n * r + j] *= 0.5;
            }
        ghc_tensor_t *hd = dense_of(hv);
        expect("lora_fwd h", hd, ref, 1e-5, dt == BF16 ? 8e-3 : 1e-5);
        expect_same_bits("lora_fwd keep", keep, hd);
        for (int64_t i = 0; i < N(wp); i++)
            ck_assert_msg(get(wp, i) == (i % (r + 3) >= 3 ? rt(dt, (float)get(b, i / (r + 3) * r + i % (r + 3) - 3))
                                                           : rt(dt, (float)SENTINEL)),
                          "lora_fwd: wcols element %lld", (long long)i);
        for (int64_t i = 0; i < N(xp); i++)   /* x and the other spare columns kept */
            if (i % (K + 20) < 1 || (i % (K + 20) >= K + 1 && (i % (K + 20) < K + 2 || i % (K + 20) >= K + 2 + r)))
                ck_assert_msg(get(xp, i) == rt(dt, (float)SENTINEL), "lora_fwd: x's column %lld changed",
                              (long long)(i % (K + 20)));
        fillv(keep, 0.0);   /* h from keep: zeros now */
        OK(ghc_op_lora_fwd(hv, keep, NULL, NULL, 1.0f, NULL, NULL, NULL));
        hd = dense_of(hv);
        for (int64_t i = 0; i < N(hd); i++)
            ck_assert_msg(get(hd, i) == 0.0, "lora_fwd: h from keep [%lld]", (long long)i);
        free(ref);
    }
    ghc_tensor_t *x = rnd(T(BF16, 6, 8), -1, 1), *h = T(BF16, 6, 2), *a = T(F32, 2, 8);
    expect_einval(ghc_op_lora_fwd(h, NULL, x, T(F32, 3, 8), 1.0f, NULL, NULL, NULL), "lora_fwd", "'a'");
    expect_einval(ghc_op_lora_fwd(h, NULL, T(BF16, 6, 9), a, 1.0f, NULL, NULL, NULL), "lora_fwd", "'x'");
    expect_einval(ghc_op_lora_fwd(h, T(BF16, 5, 2), x, a, 1.0f, NULL, NULL, NULL), "lora_fwd", "'keep'");
    expect_einval(ghc_op_lora_fwd(h, NULL, NULL, NULL, 1.0f, NULL, NULL, NULL), "lora_fwd", "'x'");
    expect_einval(ghc_op_lora_fwd(h, NULL, x, a, 1.0f, T(BF16, 4, 3), T(F32, 4, 3), NULL), "lora_fwd", "'wcols'");
    expect_einval(ghc_op_lora_fwd(h, NULL, x, a, 1.0f, T(BF16, 4, 2), NULL, NULL), "lora_fwd", "'b'");
    OK(ghc_op_lora_fwd(h, NULL, x, a, 1.0f, T(BF16, 4, 2), T(F32, 4, 2), NULL));
}
END_TEST

/* ---- attention ---------------------------------------------------------------------------- */

#define AROW(b, i, h, L, H, Dh) ((((b) * (L) + (i)) * (H) + (h)) * (Dh))

static void attention_ref(const ghc_tensor_t *q, const ghc_tensor_t *k, const ghc_tensor_t *v, double scale,
                          double *o, double *lse)
{
    int64_t B = ghc_tensor_dim(q, 0), Lq = ghc_tensor_dim(q, 1), H = ghc_tensor_dim(q, 2), Dh = ghc_tensor_dim(q, 3);
    int64_t Lk = ghc_tensor_dim(k, 1);
    double *s = dalloc(Lk);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < Lq; i++) {
                double m = -INFINITY, sum = 0;
                for (int64_t j = 0; j < Lk; j++) {
                    double d = 0;
                    for (int64_t e = 0; e < Dh; e++)
                        d += get(q, AROW(b, i, h, Lq, H, Dh) + e) * get(k, AROW(b, j, h, Lk, H, Dh) + e);
                    s[j] = scale * d;
                    m = fmax(m, s[j]);
                }
                for (int64_t j = 0; j < Lk; j++)
                    sum += exp(s[j] - m);
                lse[(b * H + h) * Lq + i] = m + log(sum);
                for (int64_t e = 0; e < Dh; e++) {
                    double acc = 0;
                    for (int64_t j = 0; j < Lk; j++)
                        acc += exp(s[j] - m) / sum * get(v, AROW(b, j, h, Lk, H, Dh) + e);
                    o[AROW(b, i, h, Lq, H, Dh) + e] = acc;
                }
            }
    free(s);
}

static void attention_fwd_case(enum ghc_dtype dt, int64_t B, int64_t Lq, int64_t Lk, int64_t H, int64_t Dh,
                               float scale, double amp)
{
    ghc_tensor_t *q = rnd(T(dt, B, Lq, H, Dh), -amp, amp), *k = rnd(T(dt, B, Lk, H, Dh), -amp, amp);
    ghc_tensor_t *v = rnd(T(dt, B, Lk, H, Dh), -1, 1), *o = like(q, dt), *lse = T(F32, B, H, Lq);
    double *ro = dalloc(N(o)), *rl = dalloc(N(lse));
    attention_ref(q, k, v, scale, ro, rl);
    OK(ghc_op_attention_fwd(o, lse, q, k, v, scale, NULL));
    expect("attention o", o, ro, dt == F32 ? 2e-6 : 8e-3, dt == F32 ? 1e-5 : 8e-3);
    expect("attention lse", lse, rl, 2e-5, 1e-5);
    free(ro);
    free(rl);
}

START_TEST(attention_forward)
{
    seed(3);
    attention_fwd_case(F32, 2, 3, 5, 2, 4, 0.7f, 1.0);
    attention_fwd_case(F32, 1, 4, 3, 3, 8, 0.35355339f, 2.0);
    attention_fwd_case(BF16, 2, 3, 5, 2, 6, 0.5f, 1.0);
    attention_fwd_case(F32, 1, 2, 3, 1, 128, 0.08838834764831845f, 1.0);
    attention_fwd_case(BF16, 1, 3, 2, 2, 128, 0.08838834764831845f, 1.0);
    attention_fwd_case(F32, 1, 1, 1, 1, 2, 1.0f, 1.0);
}
END_TEST

struct attn_ctx {
    ghc_tensor_t *q, *k, *v, *o, *lse, *w;
    float scale;
};

static double attn_loss(void *p)
{
    struct attn_ctx *c = p;
    OK(ghc_op_attention_fwd(c->o, c->lse, c->q, c->k, c->v, c->scale, NULL));
    return dotw(c->o, c->w);
}

START_TEST(attention_backward)
{
    seed(4);
    struct attn_ctx c;
    c.q = rnd(T(F32, 2, 3, 2, 4), -1, 1);
    c.k = rnd(T(F32, 2, 4, 2, 4), -1, 1);
    c.v = rnd(T(F32, 2, 4, 2, 4), -1, 1);
    c.o = like(c.q, F32);
    c.lse = T(F32, 2, 2, 3);
    c.w = rnd(like(c.q, F32), -1, 1);
    c.scale = 0.8f;
    ghc_tensor_t *dq = like(c.q, F32), *dk = like(c.k, F32), *dv = like(c.v, F32), *dq2 = like(c.q, F32);
    attn_loss(&c);
    OK(ghc_op_attention_bwd(dq, dk, dv, c.w, c.q, c.k, c.v, c.o, c.lse, c.scale, NULL));
    fd_check("attention dq", attn_loss, &c, c.q, dq, 1e-3, 1e-2, 1e-4);
    fd_check("attention dk", attn_loss, &c, c.k, dk, 1e-3, 1e-2, 1e-4);
    fd_check("attention dv", attn_loss, &c, c.v, dv, 1e-3, 1e-2, 1e-4);
    /* dq alone (cross-attention) is the same */
    attn_loss(&c);
    OK(ghc_op_attention_bwd(dq2, NULL, NULL, c.w, c.q, c.k, c.v, c.o, c.lse, c.scale, NULL));
    ck_assert(memcmp(ghc_tensor_data(dq), ghc_tensor_data(dq2), ghc_tensor_nbytes(dq)) == 0);

    /* bf16 tensors give the f32 gradients within bf16 rounding */
    ghc_tensor_t *qb = like(c.q, BF16), *kb = like(c.k, BF16), *vb = like(c.v, BF16), *wb = like(c.w, BF16);
    ghc_tensor_t *ob = like(c.q, BF16), *dqb = like(c.q, BF16), *dkb = like(c.k, BF16), *dvb = like(c.v, BF16);
    OK(ghc_op_cast(qb, c.q, 1, NULL, NULL));
    OK(ghc_op_cast(kb, c.k, 1, NULL, NULL));
    OK(ghc_op_cast(vb, c.v, 1, NULL, NULL));
    OK(ghc_op_cast(wb, c.w, 1, NULL, NULL));
    OK(ghc_op_attention_fwd(ob, c.lse, qb, kb, vb, c.scale, NULL));
    OK(ghc_op_attention_bwd(dqb, dkb, dvb, wb, qb, kb, vb, ob, c.lse, c.scale, NULL));
    const ghc_tensor_t *pairs[3][2] = { { dqb, dq }, { dkb, dk }, { dvb, dv } };
    for (int p = 0; p < 3; p++) {
        double *r = dalloc(N(pairs[p][1]));
        for (int64_t i = 0; i < N(pairs[p][1]); i++)
            r[i] = get(pairs[p][1], i);
        expect("attention bf16 grad", pairs[p][0], r, 3e-2, 3e-2);
        free(r);
    }
}
END_TEST

/* ||t - ref|| / ||ref||, over all elements. */
static double rel_err(const ghc_tensor_t *t, const double *ref)
{
    double e = 0, r = 0;
    for (int64_t i = 0; i < N(t); i++) {
        double d = get(t, i) - ref[i];
        e += d * d;
        r += ref[i] * ref[i];
    }
    return sqrt(e / r);
}

/* Cross-attention as a short caption meets it: 512 key rows of which 500 are zero padding, so
 * the softmax denominator and every sum over key rows add hundreds of equal small terms. Both
 * directions against float64 computed here from the same f32 inputs. Normwise relative errors
 * (o, lse, dq, dk, dv) measured with f32 sums: 4.2e-6, 6.4e-7, 4.1e-6, 4.0e-6, 4.1e-6 (the
 * denominator's error in lse reaches every gradient through exp(s - lse)); with f64 sums:
 * 2.6e-8, 2.3e-8, 1.8e-7, 1.9e-7, 1.6e-7 (the gradients' floor is lse rounded to f32). The
 * bounds sit between, at least 3x from either. */
START_TEST(attention_padded_accuracy)
{
    enum { B = 1, H = 2, LQ = 64, LK = 512, REAL = 12, DH = 64 };
    const double scale = 0.125;
    seed(21);
    ghc_tensor_t *q = rnd(T(F32, B, LQ, H, DH), -2, 2), *k = rnd(T(F32, B, LK, H, DH), -2, 2);
    ghc_tensor_t *v = rnd(T(F32, B, LK, H, DH), -3, 3), *dout = rnd(like(q, F32), -1, 1);
    for (int64_t i = (int64_t)REAL * H * DH; i < N(k); i++) {
        set(k, i, 0.0);
        set(v, i, 0.0);
    }
    ghc_tensor_t *o = like(q, F32), *lse = T(F32, B, H, LQ), *dq = like(q, F32), *dk = like(k, F32), *dv = like(v, F32);
    OK(ghc_op_attention_fwd(o, lse, q, k, v, (float)scale, NULL));
    OK(ghc_op_attention_bwd(dq, dk, dv, dout, q, k, v, o, lse, (float)scale, NULL));

    double *ro = dalloc(N(o)), *rl = dalloc(N(lse)), *rdq = dalloc(N(q)), *rdk = dalloc(N(k)), *rdv = dalloc(N(v));
    double *p = dalloc(LK);
    attention_ref(q, k, v, scale, ro, rl);
    for (int64_t h = 0; h < H; h++)
        for (int64_t i = 0; i < LQ; i++) {
            int64_t oi = AROW(0, i, h, LQ, H, DH);
            double di = 0;
            for (int64_t e = 0; e < DH; e++)
                di += get(dout, oi + e) * ro[oi + e];
            for (int64_t j = 0; j < LK; j++) {
                int64_t oj = AROW(0, j, h, LK, H, DH);
                double s = 0, dp = 0;
                for (int64_t e = 0; e < DH; e++) {
                    s += get(q, oi + e) * get(k, oj + e);
                    dp += get(dout, oi + e) * get(v, oj + e);
                }
                p[j] = exp(scale * s - rl[h * LQ + i]);
                double ds = p[j] * (dp - di);
                for (int64_t e = 0; e < DH; e++) {
                    rdq[oi + e] += scale * ds * get(k, oj + e);
                    rdk[oj + e] += scale * ds * get(q, oi + e);
                    rdv[oj + e] += p[j] * get(dout, oi + e);
                }
            }
        }
    double eo = rel_err(o, ro), el = rel_err(lse, rl), eq = rel_err(dq, rdq), ek = rel_err(dk, rdk), ev = rel_err(dv, rdv);
    ck_assert_msg(eo < 4e-7 && el < 1e-7 && eq < 6e-7 && ek < 6e-7 && ev < 6e-7,
                  "relative errors: o %.2g lse %.2g dq %.2g dk %.2g dv %.2g", eo, el, eq, ek, ev);
    free(p);
    free(rdv);
    free(rdk);
    free(rdq);
    free(rl);
    free(ro);
}
END_TEST

/* ---- LayerNorm ---------------------------------------------------------------------------- */

/* Index of a broadcast operand (ops.h rule) for element i of a. */
static int64_t bidx(const ghc_tensor_t *a, const ghc_tensor_t *b, int64_t i)
{
    int64_t D = ghc_tensor_dim(a, -1);
    if (ghc_tensor_same_shape(a, b))
        return i;
    if (ghc_tensor_ndim(b) == 1)
        return i % D;
    return (i / (N(a) / ghc_tensor_dim(a, 0))) * D + i % D;
}

static void layernorm_fwd_case(enum ghc_dtype dx, enum ghc_dtype dy, bool affine, bool bias_only,
                               int mod /* 0 none, 1 [D], 2 [B, D], 3 like x */)
{
    const int64_t B = 2, L = 3, D = 8;
    const float eps = 1e-6f;
    ghc_tensor_t *x = rnd(T(dx, B, L, D), -2, 3), *y = T(dy, B, L, D), *st = T(F32, B * L, 2);
    ghc_tensor_t *w = affine && !bias_only ? rnd(T(F32, D), 0.5, 1.5) : NULL;
    ghc_tensor_t *bs = affine ? rnd(T(BF16, D), -1, 1) : NULL;
    ghc_tensor_t *sh = NULL, *sc = NULL;
    if (mod == 1) {
        sh = rnd(T(F32, D), -1, 1);
        sc = rnd(T(BF16, D), -0.5, 0.5);
    } else if (mod == 2) {
        sh = rnd(T(F32, B, D), -1, 1);
        sc = rnd(T(F32, B, D), -0.5, 0.5);
    } else if (mod == 3) {
        sh = rnd(like(x, F32), -1, 1);
        sc = rnd(like(x, F32), -0.5, 0.5);
    }
    OK(ghc_op_layernorm_fwd(y, st, x, w, bs, sh, sc, eps, NULL));
    double *ref = dalloc(N(x)), *rst = dalloc(N(st));
    for (int64_t r = 0; r < B * L; r++) {
        double m = 0, v = 0;
        for (int64_t j = 0; j < D; j++)
            m += get(x, r * D + j);
        m /= D;
        for (int64_t j = 0; j < D; j++)
            v += (get(x, r * D + j) - m) * (get(x, r * D + j) - m);
        v /= D;
        double rstd = 1.0 / sqrt(v + eps);
        rst[2 * r] = m;
        rst[2 * r + 1] = rstd;
        for (int64_t j = 0; j < D; j++) {
            int64_t i = r * D + j;
            double z = (get(x, i) - m) * rstd;
            if (w)
                z *= get(w, j);
            if (bs)
                z += get(bs, j);
            if (sc)
                z *= 1.0 + get(sc, bidx(x, sc, i));
            if (sh)
                z += get(sh, bidx(x, sh, i));
            ref[i] = z;
        }
    }
    expect("layernorm y", y, ref, dy == F32 ? 2e-5 : 1e-2, dy == F32 ? 2e-5 : 8e-3);
    expect("layernorm stats", st, rst, 1e-5, 1e-5);
    /* stats are optional */
    ghc_tensor_t *y2 = like(y, dy);
    OK(ghc_op_layernorm_fwd(y2, NULL, x, w, bs, sh, sc, eps, NULL));
    ck_assert(memcmp(ghc_tensor_data(y), ghc_tensor_data(y2), ghc_tensor_nbytes(y)) == 0);
    free(ref);
    free(rst);
}

START_TEST(layernorm_forward)
{
    seed(5);
    for (int mod = 0; mod < 4; mod++) {
        layernorm_fwd_case(F32, F32, false, false, mod);
        layernorm_fwd_case(F32, F32, true, false, mod);
    }
    layernorm_fwd_case(F32, F32, true, true, 2);
    layernorm_fwd_case(BF16, F32, false, false, 2);
    layernorm_fwd_case(F32, BF16, true, false, 1);
    layernorm_fwd_case(BF16, BF16, false, false, 3);
}
END_TEST

struct ln_ctx {
    ghc_tensor_t *x, *y, *w, *b, *sh, *sc, *dyw;
};

static double ln_loss(void *p)
{
    struct ln_ctx *c = p;
    OK(ghc_op_layernorm_fwd(c->y, NULL, c->x, c->w, c->b, c->sh, c->sc, 1e-6f, NULL));
    return dotw(c->y, c->dyw);
}

START_TEST(layernorm_backward)
{
    seed(6);
    for (int v = 0; v < 5; v++) {
        struct ln_ctx c = { 0 };
        c.x = rnd(T(F32, 2, 3, 6), -1, 2);
        c.y = like(c.x, F32);
        c.dyw = rnd(like(c.x, F32), -1, 1);
        if (v == 1 || v == 2 || v == 4) {
            c.w = rnd(T(F32, 6), 0.5, 1.5);
            c.b = rnd(T(F32, 6), -1, 1);
        }
        if (v == 2) {
            c.sh = rnd(T(F32, 2, 6), -1, 1);
            c.sc = rnd(T(F32, 2, 6), -0.5, 0.5);
        } else if (v == 3) {
            c.sc = rnd(T(BF16, 6), -0.5, 0.5);
        } else if (v == 4) {
            c.sh = rnd(like(c.x, F32), -1, 1);
            c.sc = rnd(like(c.x, F32), -0.5, 0.5);
        }
        ghc_tensor_t *st = T(F32, 6, 2), *dx = like(c.x, F32);
        OK(ghc_op_layernorm_fwd(c.y, st, c.x, c.w, c.b, c.sh, c.sc, 1e-6f, NULL));
        OK(ghc_op_layernorm_bwd(dx, c.dyw, c.x, st, c.w, c.sc, false, NULL));
        char what[64];
        snprintf(what, sizeof(what), "layernorm dx (variant %d)", v);
        fd_check(what, ln_loss, &c, c.x, dx, 1e-3, 1e-2, 2e-4);
        /* accumulate adds to what is there */
        ghc_tensor_t *acc = rnd(like(c.x, F32), -1, 1);
        double *ref = dalloc(N(acc));
        for (int64_t i = 0; i < N(acc); i++)
            ref[i] = get(acc, i) + get(dx, i);
        OK(ghc_op_layernorm_bwd(acc, c.dyw, c.x, st, c.w, c.sc, true, NULL));
        expect("layernorm accumulate", acc, ref, 1e-6, 1e-6);
        /* bf16 dx and dy */
        ghc_tensor_t *dxb = like(c.x, BF16), *dyb = like(c.x, BF16);
        OK(ghc_op_cast(dyb, c.dyw, 1, NULL, NULL));
        OK(ghc_op_layernorm_bwd(dxb, dyb, c.x, st, c.w, c.sc, false, NULL));
        for (int64_t i = 0; i < N(acc); i++)
            ref[i] = get(dx, i);
        expect("layernorm bf16 dx", dxb, ref, 3e-2, 2e-2);
        free(ref);
    }
}
END_TEST

/* ---- RMSNorm ------------------------------------------------------------------------------ */

START_TEST(rmsnorm_forward)
{
    seed(7);
    const float eps = 1e-6f;
    ghc_tensor_t *x = rnd(T(F32, 4, 16), -2, 2), *w = rnd(T(F32, 16), 0.5, 1.5);
    ghc_tensor_t *y = like(x, F32), *rstd = T(F32, 4);
    OK(ghc_op_rmsnorm_fwd(y, rstd, x, w, eps, NULL));
    double ref[64], rr[4];
    for (int r = 0; r < 4; r++) {
        double s = 0;
        for (int j = 0; j < 16; j++)
            s += get(x, r * 16 + j) * get(x, r * 16 + j);
        rr[r] = 1.0 / sqrt(s / 16 + eps);
        for (int j = 0; j < 16; j++)
            ref[r * 16 + j] = get(x, r * 16 + j) * rr[r] * get(w, j);
    }
    expect("rmsnorm y", y, ref, 1e-5, 1e-5);
    expect("rmsnorm rstd", rstd, rr, 1e-6, 1e-6);
    /* bf16 output: normalise in fp32, cast to bf16, then multiply by the weight */
    ghc_tensor_t *xb = rnd(T(BF16, 4, 16), -2, 2), *wb = rnd(T(BF16, 16), 0.5, 1.5), *yb = like(xb, BF16);
    OK(ghc_op_rmsnorm_fwd(yb, rstd, xb, wb, eps, NULL));
    for (int r = 0; r < 4; r++) {
        float rs = (float)get(rstd, r);
        for (int j = 0; j < 16; j++) {
            float n = ghc_bf16_to_f32(ghc_f32_to_bf16((float)get(xb, r * 16 + j) * rs));
            uint16_t want = ghc_f32_to_bf16(n * (float)get(wb, j));
            ck_assert_msg(((uint16_t *)ghc_tensor_data(yb))[r * 16 + j] == want, "rmsnorm bf16 [%d, %d]", r, j);
        }
    }
    ghc_tensor_t *y2 = like(x, F32);
    OK(ghc_op_rmsnorm_fwd(y2, NULL, x, w, eps, NULL));
    ck_assert(memcmp(ghc_tensor_data(y), ghc_tensor_data(y2), ghc_tensor_nbytes(y)) == 0);
}
END_TEST

struct rms_ctx {
    ghc_tensor_t *x, *y, *w, *dyw;
};

static double rms_loss(void *p)
{
    struct rms_ctx *c = p;
    OK(ghc_op_rmsnorm_fwd(c->y, NULL, c->x, c->w, 1e-6f, NULL));
    return dotw(c->y, c->dyw);
}

START_TEST(rmsnorm_backward)
{
    seed(8);
    struct rms_ctx c;
    c.x = rnd(T(F32, 3, 10), -1, 1);
    c.y = like(c.x, F32);
    c.w = rnd(T(F32, 10), 0.5, 1.5);
    c.dyw = rnd(like(c.x, F32), -1, 1);
    ghc_tensor_t *rstd = T(F32, 3), *dx = like(c.x, F32);
    OK(ghc_op_rmsnorm_fwd(c.y, rstd, c.x, c.w, 1e-6f, NULL));
    OK(ghc_op_rmsnorm_bwd(dx, c.dyw, c.x, rstd, c.w, NULL));
    fd_check("rmsnorm dx", rms_loss, &c, c.x, dx, 1e-3, 1e-2, 2e-4);
}
END_TEST

/* ---- RoPE --------------------------------------------------------------------------------- */

/* Rotation of element pair p of a head at token (fi, hi, wi), as the official Wan code splits
 * the head: dims [0, d_t) time, then two blocks of d_hw = 2 floor(Dh / 6). */
static void rope_angle(int64_t Dh, int64_t p, int64_t fi, int64_t hi, int64_t wi, double *theta)
{
    int64_t d_hw = 2 * (Dh / 6), d_t = Dh - 2 * d_hw, dim = 2 * p;
    if (dim < d_t)
        *theta = fi * pow(10000.0, -(double)(2 * p) / d_t);
    else if (dim < d_t + d_hw)
        *theta = hi * pow(10000.0, -(double)(dim - d_t) / d_hw);
    else
        *theta = wi * pow(10000.0, -(double)(dim - d_t - d_hw) / d_hw);
}

static void rope_case(enum ghc_dtype dt, int64_t B, int64_t f, int64_t h, int64_t w, int64_t H, int64_t Dh)
{
    int64_t L = f * h * w;
    ghc_tensor_t *x = rnd(T(dt, B, L, H, Dh), -1, 1), *y = like(x, dt);
    OK(ghc_op_rope(y, x, f, h, w, false, NULL));
    double *ref = dalloc(N(x));
    for (int64_t b = 0; b < B; b++)
        for (int64_t l = 0; l < L; l++)
            for (int64_t hh = 0; hh < H; hh++)
                for (int64_t p = 0; p < Dh / 2; p++) {
                    double th;
                    rope_angle(Dh, p, l / (h * w), (l / w) % h, l % w, &th);
                    int64_t o = ((b * L + l) * H + hh) * Dh + 2 * p;
                    ref[o] = get(x, o) * cos(th) - get(x, o + 1) * sin(th);
                    ref[o + 1] = get(x, o) * sin(th) + get(x, o + 1) * cos(th);
                }
    expect("rope", y, ref, dt == F32 ? 2e-6 : 8e-3, dt == F32 ? 1e-6 : 8e-3);
    free(ref);
}

START_TEST(rope_forward)
{
    seed(9);
    rope_case(F32, 1, 2, 3, 4, 2, 128);
    rope_case(F32, 2, 3, 2, 2, 1, 12);
    rope_case(F32, 1, 2, 2, 2, 2, 16);
    rope_case(BF16, 1, 2, 2, 3, 1, 128);
    /* the 44/42/42 split of Dh = 128, token by token */
    ghc_tensor_t *x = T(F32, 1, 8, 1, 128), *y = like(x, F32);
    fillv(x, 0);
    for (int64_t l = 0; l < 8; l++)
        for (int64_t d = 0; d < 128; d += 2)
            set(x, l * 128 + d, 1.0);
    OK(ghc_op_rope(y, x, 2, 2, 2, false, NULL));
    /* token 4 = (f 1, h 0, w 0): time pairs rotate, pair 22 (dims 44, 45) and 43 (86, 87) don't */
    ck_assert(fabs(get(y, 4 * 128 + 0) - cos(1.0)) < 1e-6 && fabs(get(y, 4 * 128 + 1) - sin(1.0)) < 1e-6);
    ck_assert(fabs(get(y, 4 * 128 + 3) - sin(pow(10000.0, -2.0 / 44))) < 1e-6);
    ck_assert(get(y, 4 * 128 + 44) == 1.0 && get(y, 4 * 128 + 45) == 0.0);
    ck_assert(get(y, 4 * 128 + 86) == 1.0 && get(y, 4 * 128 + 87) == 0.0);
    /* token 2 = (0, 1, 0): pair 22 rotates by 1 rad, pair 21 (dims 42, 43) and 43 don't */
    ck_assert(get(y, 2 * 128 + 42) == 1.0 && get(y, 2 * 128 + 43) == 0.0);
    ck_assert(fabs(get(y, 2 * 128 + 45) - sin(1.0)) < 1e-6);
    ck_assert(fabs(get(y, 2 * 128 + 47) - sin(pow(10000.0, -2.0 / 42))) < 1e-6);
    ck_assert(get(y, 2 * 128 + 86) == 1.0 && get(y, 2 * 128 + 87) == 0.0);
    /* token 1 = (0, 0, 1): only the width pairs, from dim 86 */
    ck_assert(get(y, 1 * 128 + 84) == 1.0 && get(y, 1 * 128 + 85) == 0.0);
    ck_assert(fabs(get(y, 1 * 128 + 87) - sin(1.0)) < 1e-6);
    ck_assert(fabs(get(y, 1 * 128 + 127) - sin(pow(10000.0, -40.0 / 42))) < 1e-6);
}
END_TEST

START_TEST(rope_inverse)
{
    seed(10);
    const int64_t f = 2, h = 3, w = 2, L = 12;
    ghc_tensor_t *x = rnd(T(F32, 2, L, 2, 128), -1, 1), *g = rnd(like(x, F32), -1, 1);
    ghc_tensor_t *rx = like(x, F32), *rtg = like(x, F32);
    OK(ghc_op_rope(rx, x, f, h, w, false, NULL));
    OK(ghc_op_rope(rtg, g, f, h, w, true, NULL));
    double a = dotw(rx, g), b = dotw(x, rtg);   /* <R x, g> = <x, R^T g> */
    ck_assert_msg(fabs(a - b) <= 1e-5 * (fabs(a) + 1), "%g vs %g", a, b);
    /* inverse undoes forward, also in place */
    ghc_tensor_t *z = like(x, F32);
    OK(ghc_op_copy(z, x, NULL));
    OK(ghc_op_rope(z, z, f, h, w, false, NULL));
    ck_assert(memcmp(ghc_tensor_data(z), ghc_tensor_data(rx), ghc_tensor_nbytes(z)) == 0);
    OK(ghc_op_rope(z, z, f, h, w, true, NULL));
    double *ref = dalloc(N(x));
    for (int64_t i = 0; i < N(x); i++)
        ref[i] = get(x, i);
    expect("rope inverse", z, ref, 1e-6, 1e-6);
    free(ref);
}
END_TEST

/* RMSNorm with its RoPE in one op: the bits of the two ops, forward and backward, in f32 and
 * bf16; dy is not written. */
START_TEST(rmsnorm_rope)
{
    seed(12);
    const int64_t f = 2, h = 3, w = 2, L = 12, H = 3, Dh = 12, D = H * Dh;
    for (int d = 0; d < 2; d++) {
        const enum ghc_dtype dt = d ? BF16 : F32;
        ghc_tensor_t *x = rnd(T(F32, 2, L, D), -2, 2), *wt = rnd(T(F32, D), 0.5, 1.5);
        ghc_tensor_t *y = T(dt, 2, L, D), *y2 = T(dt, 2, L, D), *rs = T(F32, 2 * L), *rs2 = T(F32, 2 * L);
        OK(ghc_op_rmsnorm_fwd(y, rs, x, wt, 1e-6f, NULL));
        OK(ghc_tensor_reshape(y, 4, (const int64_t[]){ 2, L, H, Dh }));
        OK(ghc_op_rope(y, y, f, h, w, false, NULL));
        OK(ghc_op_rmsnorm_rope_fwd(y2, rs2, x, wt, 1e-6f, H, f, h, w, NULL));
        ck_assert_int_eq(memcmp(ghc_tensor_cdata(y), ghc_tensor_cdata(y2), ghc_tensor_nbytes(y)), 0);
        ck_assert_int_eq(memcmp(ghc_tensor_cdata(rs), ghc_tensor_cdata(rs2), ghc_tensor_nbytes(rs)), 0);
        /* backward: rope inverse into t, then the norm's backward */
        ghc_tensor_t *dy = rnd(T(dt, 2, L, D), -1, 1), *dy0 = T(dt, 2, L, D), *t = T(dt, 2, L, H, Dh);
        ghc_tensor_t *dx = T(F32, 2, L, D), *dx2 = T(F32, 2, L, D);
        OK(ghc_op_copy(dy0, dy, NULL));
        OK(ghc_tensor_reshape(dy, 4, (const int64_t[]){ 2, L, H, Dh }));
        OK(ghc_op_rope(t, dy, f, h, w, true, NULL));
        OK(ghc_tensor_reshape(dy, 3, (const int64_t[]){ 2, L, D }));
        OK(ghc_tensor_reshape(t, 3, (const int64_t[]){ 2, L, D }));
        OK(ghc_op_rmsnorm_bwd(dx, t, x, rs, wt, NULL));
        OK(ghc_op_rmsnorm_rope_bwd(dx2, dy, x, rs, wt, H, f, h, w, NULL));
        ck_assert_int_eq(memcmp(ghc_tensor_cdata(dx), ghc_tensor_cdata(dx2), ghc_tensor_nbytes(dx)), 0);
        ck_assert_int_eq(memcmp(ghc_tensor_cdata(dy), ghc_tensor_cdata(dy0), ghc_tensor_nbytes(dy)), 0);
    }
    /* what the op checks */
    ghc_tensor_t *x = T(F32, 1, 12, 36), *y = T(F32, 1, 12, 36), *wt = T(F32, 36);
    ck_assert_int_eq(ghc_op_rmsnorm_rope_fwd(y, NULL, x, wt, 1e-6f, 5, 2, 3, 2, NULL), GHC_EINVAL);   /* 36 % 5 */
    ck_assert_int_eq(ghc_op_rmsnorm_rope_fwd(y, NULL, x, wt, 1e-6f, 4, 2, 3, 2, NULL), GHC_EINVAL);   /* Dh 9 odd */
    ck_assert_int_eq(ghc_op_rmsnorm_rope_fwd(y, NULL, x, wt, 1e-6f, 3, 2, 2, 2, NULL), GHC_EINVAL);   /* L 12 != 8 */
    ck_assert_int_eq(ghc_op_rmsnorm_rope_fwd(y, NULL, x, wt, 1e-6f, 3, 2, 3, 2, NULL), 0);
}
END_TEST

/* ---- patches ------------------------------------------------------------------------------ */

/* Row b * L + tok, column col of a [B, L, 4 C] patch matrix: the latent element it holds,
 * written from the rows' side (ops.h, ghc_op_patchify): tok = (fi, hi, wi) row-major,
 * k = kh 2 + kw, column c 4 + k (c_major, the Conv3d weight) or k C + c (the head). */
static void patch_src(int64_t tok, int64_t col, int64_t C, int64_t h, int64_t w, bool c_major, int64_t *c,
                      int64_t *fi, int64_t *y, int64_t *x)
{
    int64_t k = c_major ? col % 4 : col / C;
    *c = c_major ? col / 4 : col % C;
    *fi = tok / (h * w);
    *y = 2 * ((tok / w) % h) + k / 2;
    *x = 2 * (tok % w) + k % 2;
}

static void patch_case(enum ghc_dtype ldt, enum ghc_dtype rdt, int64_t B, int64_t Cl, int64_t Cc, int64_t F,
                       int64_t H, int64_t W)
{
    const int64_t h = H / 2, w = W / 2, L = F * h * w, C = Cl + Cc;
    ghc_tensor_t *lat = rnd(T(ldt, B, Cl, F, H, W), -2, 2), *cond = Cc ? rnd(T(ldt, B, Cc, F, H, W), -2, 2) : NULL;
    ghc_tensor_t *rows = T(rdt, B, L, 4 * C), *hrows = rnd(T(ldt, B, L, 4 * Cl), -2, 2);
    ghc_tensor_t *out = T(rdt, B, Cl, F, H, W), *dlat = T(rdt, B, Cl, F, H, W), *drows = T(rdt, B, L, 4 * Cl);
    fillv(rows, NAN);
    OK(ghc_op_patchify(rows, lat, cond, NULL));
    OK(ghc_op_patchify_bwd(dlat, rows, NULL));         /* the lat channels of rows, back */
    OK(ghc_op_unpatchify(out, hrows, NULL));
    OK(ghc_op_unpatchify_bwd(drows, out, NULL));      /* back to hrows (rounded to rdt) */
    for (int64_t b = 0; b < B; b++)
        for (int64_t tok = 0; tok < L; tok++) {
            for (int64_t col = 0; col < 4 * C; col++) {
                int64_t c, fi, y, x;
                patch_src(tok, col, C, h, w, true, &c, &fi, &y, &x);
                double want = c < Cl ? get(lat, (((b * Cl + c) * F + fi) * H + y) * W + x)
                                     : get(cond, (((b * Cc + c - Cl) * F + fi) * H + y) * W + x);
                int64_t ri = (b * L + tok) * 4 * C + col;
                ck_assert_msg(get(rows, ri) == rt(rdt, (float)want), "patchify [%lld, %lld, %lld]: %g vs %g",
                              (long long)b, (long long)tok, (long long)col, get(rows, ri), want);
                if (c < Cl)
                    ck_assert(get(dlat, (((b * Cl + c) * F + fi) * H + y) * W + x) == get(rows, ri));
            }
            for (int64_t col = 0; col < 4 * Cl; col++) {
                int64_t c, fi, y, x, ri = (b * L + tok) * 4 * Cl + col;
                patch_src(tok, col, Cl, h, w, false, &c, &fi, &y, &x);
                double got = get(out, (((b * Cl + c) * F + fi) * H + y) * W + x);
                ck_assert_msg(got == rt(rdt, (float)get(hrows, ri)), "unpatchify [%lld, %lld, %lld]: %g vs %g",
                              (long long)b, (long long)tok, (long long)col, got, get(hrows, ri));
                ck_assert(get(drows, ri) == got);
            }
        }
}

START_TEST(patches)
{
    seed(11);
    patch_case(F32, F32, 2, 3, 0, 3, 6, 10);      /* odd F, H/2, W/2 and C */
    patch_case(F32, F32, 1, 3, 5, 1, 2, 2);       /* I2V-like concatenation, one token */
    patch_case(BF16, F32, 2, 1, 2, 2, 4, 6);
    patch_case(F32, BF16, 1, 5, 3, 3, 2, 6);      /* rounded once into bf16 */
    patch_case(F32, F32, 1, 16, 20, 1, 4, 6);     /* Wan2.2 I2V channels */
    /* a hand-checked element: lat [1, 2, 1, 2, 4] (two tokens) into [1, 2, 8] */
    ghc_tensor_t *lat = T(F32, 1, 2, 1, 2, 4), *rows = T(F32, 1, 2, 8), *back = T(F32, 1, 2, 1, 2, 4);
    for (int64_t i = 0; i < N(lat); i++)
        set(lat, i, (double)i);
    OK(ghc_op_patchify(rows, lat, NULL, NULL));
    /* token 1 (wi 1): channel 1 at (y 1, x 2) = lat 8 + 4 + 2 = 14 is column 1 * 4 + 2 */
    ck_assert(get(rows, 8 + 6) == 14.0);
    OK(ghc_op_unpatchify(back, rows, NULL));
    /* head layout: token 1 column k C + c = 6 is k 3, c 0: (y 1, x 3) of channel 0 = 7 */
    ck_assert(get(back, 7) == get(rows, 8 + 6));
}
END_TEST

/* ---- model inputs (since API 14) ------------------------------------------------------------ */

/* timestep_embedding against the f64 formula of ops.h written out here, bit for bit (the CPU
 * op is the reference wan22's host loop was: the same f64 expression, rounded once), for both
 * orders, an odd dim, another max_period and bf16 timesteps (read as f32). */
static void timestep_case(enum ghc_dtype tdt, int64_t B, int64_t dim, bool cos_first, double max_period)
{
    ghc_tensor_t *t = T(tdt, B), *out = T(F32, B, dim);
    for (int64_t b = 0; b < B; b++)
        set(t, b, b == 0 ? 0.0 : b == 1 ? 999.0 : 1000.0 * 0.5 * (urand() + 1.0));
    fillv(out, 7.0);   /* every element is written */
    OK(ghc_op_timestep_embedding(out, t, cos_first, max_period, NULL));
    const int64_t half = dim / 2;
    const float *o = ghc_tensor_cdata(out);
    for (int64_t b = 0; b < B; b++) {
        for (int64_t k = 0; k < half; k++) {
            double a = (double)(float)get(t, b) * pow(max_period, -(double)k / (double)half);
            float c = (float)cos(a), sn = (float)sin(a);
            float want0 = cos_first ? c : sn, want1 = cos_first ? sn : c;
            ck_assert_msg(memcmp(&o[b * dim + k], &want0, 4) == 0 && memcmp(&o[b * dim + half + k], &want1, 4) == 0,
                          "timestep_embedding[%lld, %lld]: %.9g %.9g vs %.9g %.9g", (long long)b, (long long)k,
                          o[b * dim + k], o[b * dim + half + k], want0, want1);
            /* and within 1e-6 of the exact value (an independent check of the formula) */
            double ea = get(t, b) * exp(-log(max_period) * (double)k / (double)half);
            ck_assert(fabs(o[b * dim + k] - (cos_first ? cos(ea) : sin(ea))) < 1e-6 + 1e-12 * fabs(ea));
        }
        if (dim % 2)
            ck_assert(o[b * dim + dim - 1] == 0.0f);
    }
    /* t = 0: cos 1, sin 0 */
    ck_assert(o[0] == (cos_first ? 1.0f : 0.0f) && o[half] == (cos_first ? 0.0f : 1.0f));
}

START_TEST(timestep_embedding)
{
    seed(31);
    timestep_case(F32, 3, 256, true, 10000.0);    /* Wan: freq_dim 256, cos first */
    timestep_case(F32, 2, 16, false, 10000.0);    /* sin first */
    timestep_case(BF16, 4, 9, true, 100.0);       /* odd dim, bf16 timesteps */
}
END_TEST

/* pad_rows against the host loop wan22 had (zero fill, then each kept row cast): the same bits,
 * for x f32 / bf16 into y f32 / bf16, with and without a mask (0, -0, 0.5 and NaN entries). */
START_TEST(pad_rows)
{
    seed(37);
    const int64_t B = 2, Lx = 5, Ly = 8, D = 3;
    for (int xd = 0; xd < 2; xd++)
        for (int yd = 0; yd < 2; yd++)
            for (int with_mask = 0; with_mask < 2; with_mask++) {
                ghc_tensor_t *x = rnd(T(xd ? BF16 : F32, B, Lx, D), -3, 3), *y = T(yd ? BF16 : F32, B, Ly, D);
                ghc_tensor_t *ref = like(y, ghc_tensor_dtype(y)), *mask = T(F32, B, Lx);
                const float mv[2 * 5] = { 1, 0, 0.5f, -0.0f, 1, NAN, 1, 1, 0, 1 };
                for (int64_t i = 0; i < B * Lx; i++)
                    set(mask, i, mv[i]);
                fillv(y, 9.0);
                OK(ghc_op_pad_rows(y, x, with_mask ? mask : NULL, NULL));
                OK(ghc_op_fill(ref, 0.0, NULL));
                for (int64_t b = 0; b < B; b++)
                    for (int64_t r = 0; r < Lx; r++) {
                        if (with_mask && mv[b * Lx + r] == 0.0f)
                            continue;
                        ghc_tensor_t *src = ghc_tensor_wrap(core, ghc_tensor_dtype(x), 1, (const int64_t[]){ D },
                                                            GHC_DEVICE_CPU, (char *)ghc_tensor_data(x) +
                                                            (size_t)((b * Lx + r) * D) * ghc_dtype_size(ghc_tensor_dtype(x)));
                        ghc_tensor_t *dst = ghc_tensor_wrap(core, ghc_tensor_dtype(y), 1, (const int64_t[]){ D },
                                                            GHC_DEVICE_CPU, (char *)ghc_tensor_data(ref) +
                                                            (size_t)((b * Ly + r) * D) * ghc_dtype_size(ghc_tensor_dtype(y)));
                        ck_assert(src && dst);
                        OK(ghc_op_cast(dst, src, 1.0f, NULL, NULL));
                        ghc_tensor_free(src);
                        ghc_tensor_free(dst);
                    }
                ck_assert_msg(memcmp(ghc_tensor_cdata(y), ghc_tensor_cdata(ref), ghc_tensor_nbytes(y)) == 0,
                              "pad_rows: x %s, y %s, mask %d: not the bits of the host loop", xd ? "bf16" : "f32",
                              yd ? "bf16" : "f32", with_mask);
                /* spot checks: a kept row, a masked row, a padding row */
                ck_assert(get(y, (1 * Ly + 0) * D + 1) == rt(ghc_tensor_dtype(y), (float)get(x, (1 * Lx + 0) * D + 1)));
                ck_assert(get(y, (0 * Ly + 1) * D) == (with_mask ? 0.0 : rt(ghc_tensor_dtype(y), (float)get(x, 1 * D))));
                ck_assert(get(y, (1 * Ly + 7) * D + 2) == 0.0);
            }
    /* Lx = Ly, no mask: a plain cast */
    ghc_tensor_t *x = rnd(T(F32, 1, 4, 6), -1, 1), *y = T(BF16, 1, 4, 6), *c = like(y, BF16);
    OK(ghc_op_pad_rows(y, x, NULL, NULL));
    OK(ghc_op_cast(c, x, 1.0f, NULL, NULL));
    ck_assert(memcmp(ghc_tensor_cdata(y), ghc_tensor_cdata(c), ghc_tensor_nbytes(y)) == 0);
}
END_TEST

/* ---- activations -------------------------------------------------------------------------- */

static double silu_d(double z) { return z / (1.0 + exp(-z)); }

START_TEST(activations_forward)
{
    seed(11);
    for (int act = 0; act < 2; act++) {
        ghc_tensor_t *x = rnd(T(F32, 5, 13), -5, 5), *y = like(x, F32), *yb = like(x, BF16);
        ghc_tensor_t *xb = like(x, BF16), *y2 = like(x, F32);
        OK(ghc_op_cast(xb, x, 1, NULL, NULL));
        double *ref = dalloc(N(x)), *refb = dalloc(N(x));
        for (int64_t i = 0; i < N(x); i++) {
            ref[i] = act ? silu_d(get(x, i)) : gelu_d(get(x, i));
            refb[i] = act ? silu_d(get(xb, i)) : gelu_d(get(xb, i));
        }
        int (*op)(ghc_tensor_t *, const ghc_tensor_t *, void *) = act ? ghc_op_silu : ghc_op_gelu_tanh;
        OK(op(y, x, NULL));
        expect(act ? "silu" : "gelu", y, ref, 1e-6, 1e-5);
        OK(op(yb, x, NULL));
        expect(act ? "silu bf16 out" : "gelu bf16 out", yb, ref, 1e-3, 4e-3);
        OK(op(y2, xb, NULL));
        expect(act ? "silu bf16 in" : "gelu bf16 in", y2, refb, 1e-6, 1e-5);
        OK(op(x, x, NULL));   /* in place */
        ck_assert(memcmp(ghc_tensor_data(x), ghc_tensor_data(y), ghc_tensor_nbytes(x)) == 0);
        free(ref);
        free(refb);
    }
}
END_TEST

struct act_ctx {
    ghc_tensor_t *x, *y, *w;
    int act;
};

static double act_loss(void *p)
{
    struct act_ctx *c = p;
    OK(c->act ? ghc_op_silu(c->y, c->x, NULL) : ghc_op_gelu_tanh(c->y, c->x, NULL));
    return dotw(c->y, c->w);
}

START_TEST(activations_backward)
{
    seed(12);
    for (int act = 0; act < 2; act++) {
        struct act_ctx c = { rnd(T(F32, 40), -4, 4), NULL, NULL, act };
        c.y = like(c.x, F32);
        c.w = rnd(like(c.x, F32), -1, 1);
        ghc_tensor_t *dx = like(c.x, F32);
        OK(act ? ghc_op_silu_bwd(dx, c.w, c.x, NULL) : ghc_op_gelu_tanh_bwd(dx, c.w, c.x, NULL));
        fd_check(act ? "silu dx" : "gelu dx", act_loss, &c, c.x, dx, 1e-3, 1e-2, 1e-4);
        /* and against the closed forms of the derivatives in f64 */
        double ref[40];
        for (int64_t i = 0; i < 40; i++) {
            double z = get(c.x, i), d;
            if (act) {
                double sg = 1.0 / (1.0 + exp(-z));
                d = sg * (1.0 + z * (1.0 - sg));
            } else {
                double k = sqrt(2.0 / M_PI), t = tanh(k * (z + 0.044715 * z * z * z));
                d = 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * z * z);
            }
            ref[i] = get(c.w, i) * d;
        }
        expect(act ? "silu dx closed form" : "gelu dx closed form", dx, ref, 1e-6, 1e-5);
    }
}
END_TEST

/* ---- elementwise -------------------------------------------------------------------------- */

START_TEST(elementwise_broadcast)
{
    seed(13);
    for (int mode = 0; mode < 3; mode++) {
        ghc_tensor_t *a = rnd(T(F32, 2, 3, 4), -1, 1);
        ghc_tensor_t *b = mode == 0 ? rnd(like(a, BF16), -1, 1) : mode == 1 ? rnd(T(F32, 4), -1, 1)
                                                                            : rnd(T(F32, 2, 4), -1, 1);
        ghc_tensor_t *y = like(a, F32), *yb = like(a, BF16);
        double ra[24], rm[24], rg[24], rr[24];
        for (int64_t i = 0; i < 24; i++) {
            double bv = get(b, bidx(a, b, i));
            ra[i] = 0.5 * get(a, i) - 2.0 * bv;
            rm[i] = get(a, i) * bv;
        }
        OK(ghc_op_add(y, a, b, 0.5f, -2.0f, NULL));
        expect("add", y, ra, 1e-6, 1e-6);
        OK(ghc_op_add(yb, a, b, 0.5f, -2.0f, NULL));
        expect("add bf16", yb, ra, 1e-6, 4e-3);
        OK(ghc_op_mul(y, a, b, NULL));
        expect("mul", y, rm, 1e-6, 1e-6);
        /* gated residual on the f32 stream, y bf16 */
        ghc_tensor_t *x = rnd(like(a, F32), -1, 1), *x0 = like(a, F32), *yy = rnd(like(a, BF16), -1, 1);
        OK(ghc_op_copy(x0, x, NULL));
        for (int64_t i = 0; i < 24; i++) {
            rg[i] = get(x, i) + get(yy, i) * get(b, bidx(a, b, i));
            rr[i] = get(x, i) + get(yy, i);
        }
        /* into another tensor: the same bits as the copy and the in-place op below */
        ghc_tensor_t *xt = like(a, F32), *xt0 = like(a, F32);
        OK(ghc_op_gated_residual_to(xt, x, yy, b, NULL));
        OK(ghc_op_gated_residual_to(xt0, x, yy, NULL, NULL));
        OK(ghc_op_gated_residual(x, yy, b, NULL));
        expect("gated_residual", x, rg, 1e-6, 1e-6);
        ck_assert_int_eq(memcmp(ghc_tensor_cdata(xt), ghc_tensor_cdata(x), ghc_tensor_nbytes(x)), 0);
        expect("gated_residual_to, no gate", xt0, rr, 1e-6, 1e-6);
        OK(ghc_op_gated_residual(x0, yy, NULL, NULL));
        expect("residual", x0, rr, 1e-6, 1e-6);
        /* in place: y = a */
        OK(ghc_op_mul(a, a, b, NULL));
        expect("mul in place", a, rm, 1e-6, 1e-6);
    }
    ghc_tensor_t *x = rnd(T(BF16, 7), -1, 1), *y = T(F32, 7);
    double r[7];
    for (int i = 0; i < 7; i++)
        r[i] = -3.0 * get(x, i);
    OK(ghc_op_scale(y, x, -3.0f, NULL));
    expect("scale", y, r, 1e-6, 1e-6);
    OK(ghc_op_scale(x, x, -3.0f, NULL));
    expect("scale in place", x, r, 1e-6, 4e-3);
}
END_TEST

/* ---- reductions and losses ---------------------------------------------------------------- */

START_TEST(reductions)
{
    seed(14);
    ghc_tensor_t *x = rnd(T(F32, 3, 4, 5), -1, 1), *out = T(F32, 1), *rows = T(F32, 5), *rowsb = T(BF16, 5);
    double s = 0, rr[5] = { 0 };
    for (int64_t i = 0; i < N(x); i++) {
        s += get(x, i);
        rr[i % 5] += get(x, i);
    }
    OK(ghc_op_sum(out, x, NULL));
    expect("sum", out, &s, 1e-6, 1e-6);
    double m = s / 60;
    OK(ghc_op_mean(out, x, NULL));
    expect("mean", out, &m, 1e-7, 1e-6);
    OK(ghc_op_sum_rows(rows, x, NULL));
    expect("sum_rows", rows, rr, 1e-6, 1e-6);
    OK(ghc_op_sum_rows(rowsb, x, NULL));
    expect("sum_rows bf16", rowsb, rr, 1e-6, 4e-3);
    /* f64 accumulation: 1e8 + 1000 ones - 1e8 is exact */
    ghc_tensor_t *big = T(F32, 1002), *scalar = mk(F32, 0, NULL);
    fillv(big, 1.0);
    set(big, 0, 1e8);
    set(big, 1001, -1e8);
    OK(ghc_op_sum(scalar, big, NULL));
    ck_assert_msg(get(scalar, 0) == 1000.0, "sum %g", get(scalar, 0));
    ghc_tensor_t *xb = rnd(T(BF16, 33), -1, 1);
    double sb = 0;
    for (int64_t i = 0; i < 33; i++)
        sb += get(xb, i);
    OK(ghc_op_sum(out, xb, NULL));
    expect("sum bf16", out, &sb, 1e-6, 1e-6);
}
END_TEST

struct mse_ctx {
    ghc_tensor_t *loss, *pred, *target;
};

static double mse_value(void *p)
{
    struct mse_ctx *c = p;
    OK(ghc_op_mse_loss(c->loss, NULL, c->pred, c->target, NULL));
    return get(c->loss, 0);
}

START_TEST(mse)
{
    seed(15);
    struct mse_ctx c = { T(F32, 1), rnd(T(F32, 2, 3, 4), -1, 1), rnd(T(F32, 2, 3, 4), -1, 1) };
    ghc_tensor_t *grad = like(c.pred, F32);
    OK(ghc_op_mse_loss(c.loss, grad, c.pred, c.target, NULL));
    double l = 0, g[24];
    for (int64_t i = 0; i < 24; i++) {
        double d = get(c.pred, i) - get(c.target, i);
        l += d * d / 24;
        g[i] = 2 * d / 24;
    }
    expect("mse loss", c.loss, &l, 1e-7, 1e-6);
    expect("mse grad", grad, g, 1e-7, 1e-6);
    fd_check("mse grad", mse_value, &c, c.pred, grad, 1e-3, 1e-2, 1e-4);
    ghc_tensor_t *pb = like(c.pred, BF16), *tb = like(c.pred, BF16), *gb = like(c.pred, BF16);
    OK(ghc_op_cast(pb, c.pred, 1, NULL, NULL));
    OK(ghc_op_cast(tb, c.target, 1, NULL, NULL));
    OK(ghc_op_mse_loss(c.loss, gb, pb, tb, NULL));
    l = 0;
    for (int64_t i = 0; i < 24; i++) {
        double d = get(pb, i) - get(tb, i);
        l += d * d / 24;
        g[i] = 2 * d / 24;
    }
    expect("mse loss bf16", c.loss, &l, 1e-7, 1e-6);
    expect("mse grad bf16", gb, g, 1e-6, 4e-3);
}
END_TEST

/* ---- argument checking -------------------------------------------------------------------- */

/* rc is GHC_EINVAL and the message names the op and contains `part`. */

START_TEST(validation)
{
    ghc_tensor_t *a = T(F32, 2, 3, 4), *y = T(F32, 2, 3, 4), *bad5 = T(F32, 5), *i32 = T(GHC_DTYPE_I32, 4, 3);
    ghc_tensor_t *w = T(F32, 3, 4), *c = T(F32, 4, 4);
    float dummy[24];
    ghc_tensor_t *gpu = ghc_tensor_wrap(core, F32, 3, (const int64_t[]){ 2, 3, 4 }, 0, dummy);
    ck_assert_ptr_nonnull(gpu);
    pool[npool++] = gpu;

    expect_einval(ghc_op_add(y, a, bad5, 1, 1, NULL), "add", "tensor 'b' is [5] F32 cpu");
    expect_einval(ghc_op_timestep_embedding(T(F32, 2, 8), bad5, true, 1e4, NULL), "timestep_embedding", "'t'");
    expect_einval(ghc_op_timestep_embedding(T(BF16, 2, 8), T(F32, 2), true, 1e4, NULL), "timestep_embedding", "'out'");
    expect_einval(ghc_op_timestep_embedding(T(F32, 2, 8), T(F32, 2), true, 0.0, NULL), "timestep_embedding",
                  "max_period");
    expect_einval(ghc_op_pad_rows(T(F32, 2, 2, 4), a, NULL, NULL), "pad_rows", "'x'");   /* Lx 3 > Ly 2 */
    expect_einval(ghc_op_pad_rows(T(F32, 2, 5, 4), a, bad5, NULL), "pad_rows", "'mask'");
    expect_einval(ghc_op_add(y, a, gpu, 1, 1, NULL), "add", "cuda:0");
    expect_einval(ghc_op_mul(y, a, T(BF16, 3, 4), NULL), "mul", "'b'");       /* [L, D] is not a rule */
    expect_einval(ghc_op_mul(y, a, T(GHC_DTYPE_F16, 4), NULL), "mul", "F32 or BF16");
    expect_einval(ghc_op_scale(NULL, a, 1, NULL), "scale", "'y' is NULL");
    expect_einval(ghc_op_scale(T(F32, 24), a, 1, NULL), "scale", "'y'");
    expect_einval(ghc_op_gemm(c, i32, w, NULL, NULL), "gemm", "'a' is [4, 3] I32 cpu");
    expect_einval(ghc_op_gemm(c, T(F32, 4, 5), w, NULL, NULL), "gemm", "'b'");
    expect_einval(ghc_op_gemm(T(F32, 4, 3), T(F32, 4, 3), T(BF16, 3, 4), NULL, NULL), "gemm", "'b'");
    expect_einval(ghc_op_gemm(w, T(F32, 3, 4), c, &(struct ghc_gemm){ .epilogue = GHC_EPI_BIAS }, NULL), "gemm",
                  "'bias' is NULL");
    expect_einval(ghc_op_gemm(w, T(F32, 3, 4), c,
                              &(struct ghc_gemm){ .epilogue = GHC_EPI_BIAS_GELU, .bias = T(F32, 4), .beta = 1 }, NULL),
                  "gemm", "beta");
    expect_einval(ghc_op_gemm(T(F32, 3, 4), T(F32, 2, 3, 4), c, NULL, NULL), "gemm", "3 dimensions");
    expect_einval(ghc_op_layernorm_fwd(y, T(BF16, 6, 2), a, NULL, NULL, NULL, NULL, 1e-6f, NULL), "layernorm_fwd",
                  "'stats'");
    expect_einval(ghc_op_layernorm_fwd(y, NULL, a, NULL, NULL, T(F32, 3, 4), NULL, 1e-6f, NULL), "layernorm_fwd",
                  "'shift'");
    expect_einval(ghc_op_layernorm_bwd(y, a, a, NULL, NULL, NULL, false, NULL), "layernorm_bwd", "'stats' is NULL");
    expect_einval(ghc_op_rmsnorm_fwd(y, NULL, a, T(F32, 3), 1e-6f, NULL), "rmsnorm_fwd", "'weight'");
    ghc_tensor_t *q = T(F32, 1, 2, 1, 3), *k = T(F32, 1, 4, 1, 3);
    expect_einval(ghc_op_attention_fwd(like(q, F32), T(F32, 1, 1, 2), q, k, k, 1, NULL), "attention_fwd", "even");
    ghc_tensor_t *q4 = T(F32, 1, 2, 1, 4), *k4 = T(F32, 1, 3, 1, 4);
    expect_einval(ghc_op_attention_fwd(like(q4, F32), T(F32, 1, 2, 1), q4, k4, k4, 1, NULL), "attention_fwd",
                  "'lse'");
    expect_einval(ghc_op_attention_fwd(like(q4, BF16), T(F32, 1, 1, 2), q4, k4, k4, 1, NULL), "attention_fwd", "'o'");
    expect_einval(ghc_op_rope(T(F32, 1, 6, 1, 4), T(F32, 1, 6, 1, 4), 2, 2, 2, false, NULL), "rope", "f h w");
    expect_einval(ghc_op_patchify(T(F32, 1, 2, 8), T(F32, 1, 2, 1, 3, 4), NULL, NULL), "patchify", "even");
    expect_einval(ghc_op_patchify(T(F32, 1, 2, 8), T(F32, 1, 2, 1, 2, 4), T(F32, 1, 1, 1, 2, 4), NULL), "patchify",
                  "'rows'");
    expect_einval(ghc_op_patchify(T(F32, 1, 2, 12), T(F32, 1, 2, 1, 2, 4), T(F32, 1, 1, 1, 2, 2), NULL), "patchify",
                  "'cond'");
    expect_einval(ghc_op_patchify(T(GHC_DTYPE_F16, 1, 2, 8), T(F32, 1, 2, 1, 2, 4), NULL, NULL), "patchify",
                  "'rows'");
    expect_einval(ghc_op_patchify_bwd(T(F32, 1, 3, 1, 2, 4), T(F32, 1, 2, 8), NULL), "patchify_bwd", "'drows'");
    expect_einval(ghc_op_unpatchify(T(F32, 1, 2, 1, 2, 4), T(F32, 1, 2, 12), NULL), "unpatchify", "'rows'");
    expect_einval(ghc_op_unpatchify_bwd(T(F32, 1, 3, 8), T(F32, 1, 2, 1, 2, 4), NULL), "unpatchify_bwd", "'drows'");
    expect_einval(ghc_op_cast(T(GHC_DTYPE_F16, 3), T(F32, 3), 1, &(struct ghc_rng){ 0 }, NULL), "cast", "BF16");
    expect_einval(ghc_op_cast(T(F32, 3), i32, 1, NULL, NULL), "cast", "'src'");
    expect_einval(ghc_op_mse_loss(T(F32, 2), NULL, a, y, NULL), "mse_loss", "one element");
    expect_einval(ghc_op_mse_loss(T(F32, 1), NULL, a, bad5, NULL), "mse_loss", "'target'");
    expect_einval(ghc_op_sum(T(BF16, 1), a, NULL), "sum", "'out'");
    expect_einval(ghc_op_sum_rows(T(F32, 3), a, NULL), "sum_rows", "'out'");
    expect_einval(ghc_op_gated_residual(T(BF16, 2, 3, 4), y, NULL, NULL), "gated_residual", "'x'");
    expect_einval(ghc_op_rand_uniform(i32, &(struct ghc_rng){ 0 }, NULL), "rand_uniform", "'t'");
    expect_einval(ghc_op_fill(i32, 0, NULL), "fill", "'t'");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ops_cpu");
    TCase *tc = tcase_create("random");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, philox_known_answers);
    tcase_add_test(tc, rand_uniform_stream);
    tcase_add_test(tc, rand_normal_stream);
    tcase_add_test(tc, fill_copy);
    tcase_add_test(tc, cast_nearest);
    tcase_add_test(tc, cast_stochastic);
    suite_add_tcase(s, tc);

    tc = tcase_create("forward");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, gemm_all);
    tcase_add_test(tc, gemm_column_views);
    tcase_add_test(tc, attention_forward);
    tcase_add_test(tc, layernorm_forward);
    tcase_add_test(tc, rmsnorm_forward);
    tcase_add_test(tc, rope_forward);
    tcase_add_test(tc, rmsnorm_rope);
    tcase_add_test(tc, patches);
    tcase_add_test(tc, timestep_embedding);
    tcase_add_test(tc, pad_rows);
    tcase_add_test(tc, activations_forward);
    tcase_add_test(tc, elementwise_broadcast);
    tcase_add_test(tc, reductions);
    suite_add_tcase(s, tc);

    tc = tcase_create("column_views");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, views_cast);
    tcase_add_test(tc, views_copy);
    tcase_add_test(tc, views_layernorm);
    tcase_add_test(tc, views_gelu);
    tcase_add_test(tc, views_attention);
    tcase_add_test(tc, views_gemm_epilogue);
    tcase_add_test(tc, lora_cast_bwd);
    tcase_add_test(tc, lora_fwd);
    suite_add_tcase(s, tc);

    tc = tcase_create("backward");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, attention_backward);
    tcase_add_test(tc, attention_padded_accuracy);
    tcase_add_test(tc, layernorm_backward);
    tcase_add_test(tc, rmsnorm_backward);
    tcase_add_test(tc, rope_inverse);
    tcase_add_test(tc, activations_backward);
    tcase_add_test(tc, mse);
    suite_add_tcase(s, tc);

    tc = tcase_create("validation");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, validation);
    suite_add_tcase(s, tc);

    return tu_run_suite(s, false);
}
