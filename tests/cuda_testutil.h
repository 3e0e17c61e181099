/* cuda_testutil.h: what the GPU suites that check CUDA ops against the CPU references share
 * (test_ops_cuda.c, test_vae_cuda.c): a pool of test tensors freed after each case, host <->
 * device copies, random inputs, NaN-poisoned outputs, and the comparisons (relative error norm,
 * bit for bit) that print one line per case. Include once per suite, after check.h; `core` is
 * the suite's (set in its main). */
#ifndef GHC_TESTS_CUDA_TESTUTIL_H
#define GHC_TESTS_CUDA_TESTUTIL_H

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

#define F32  GHC_DTYPE_F32
#define BF16 GHC_DTYPE_BF16
#define CPUD GHC_DEVICE_CPU

static ghc_core_t *core;
static uint64_t seed_base = 20250601, seed_next;

/* ---- tensors ------------------------------------------------------------------------------ */

/* Every tensor a test makes, freed at the end of its case (pool_release back to a mark) or
 * after the test, also after a failure (pool_free). */
#define POOL_MAX 4096
static ghc_tensor_t *pool[POOL_MAX];
static int npool;

static inline void pool_release(int mark)
{
    ghc_op_sync(core, 0, NULL);
    while (npool > mark)
        ghc_tensor_free(pool[--npool]);
}

static inline void pool_free(void) { pool_release(0); }

static inline ghc_tensor_t *keep(ghc_tensor_t *t)
{
    ck_assert_msg(t != NULL, "tensor: %s", ghc_error_message(core));
    ck_assert_msg(npool < POOL_MAX, "test tensor pool full");
    pool[npool++] = t;
    return t;
}

static inline ghc_tensor_t *mk(enum ghc_dtype dt, int device, int nd, const int64_t *shape)
{
    return keep(ghc_tensor_init(core, dt, nd, shape, device, GHC_ROLE_ACTIVATIONS));
}
#define NARG(...) (int)(sizeof((int64_t[]){ __VA_ARGS__ }) / sizeof(int64_t))
#define SHP(...) NARG(__VA_ARGS__), (const int64_t[]){ __VA_ARGS__ }

static inline ghc_tensor_t *like(const ghc_tensor_t *t, enum ghc_dtype dt, int device)
{
    return mk(dt, device, ghc_tensor_ndim(t), ghc_tensor_shape(t));
}

static inline void ok_(int rc, const char *what, int line)
{
    ck_assert_msg(rc == 0, "line %d: %s failed (%d): %s", line, what, rc, ghc_error_message(core));
}
#define OK(expr) ok_((expr), #expr, __LINE__)

static inline void sync0(void) { OK(ghc_op_sync(core, 0, NULL)); }

/* A GPU tensor of dtype dt and t's shape; misaligned: a view one element into a larger
 * buffer, so that no vector path applies. */
static inline ghc_tensor_t *gpu_like(const ghc_tensor_t *t, enum ghc_dtype dt, bool misaligned)
{
    if (!misaligned)
        return like(t, dt, 0);
    int64_t n = ghc_tensor_numel(t) + 1;
    ghc_tensor_t *buf = mk(dt, 0, 1, &n);
    char *p = (char *)ghc_tensor_data(buf) + ghc_dtype_size(dt);
    return keep(ghc_tensor_wrap(core, dt, ghc_tensor_ndim(t), ghc_tensor_shape(t), 0, p));
}

/* The GPU copy of a CPU tensor, complete on return (the CPU side may change next: in-place
 * ops, accumulation). */
static inline ghc_tensor_t *up_(const ghc_tensor_t *c, bool misaligned)
{
    ghc_tensor_t *g = gpu_like(c, ghc_tensor_dtype(c), misaligned);
    OK(ghc_op_copy(g, c, NULL));
    sync0();
    return g;
}
#define up(c) up_((c), false)

/* The CPU copy of a GPU tensor, after the stream is done. */
static inline ghc_tensor_t *down(const ghc_tensor_t *g)
{
    ghc_tensor_t *c = like(g, ghc_tensor_dtype(g), CPUD);
    OK(ghc_op_copy(c, g, NULL));
    sync0();
    return c;
}

static inline void poison(ghc_tensor_t *g) { OK(ghc_op_fill(g, NAN, NULL)); }

/* A poisoned GPU output like t. */
static inline ghc_tensor_t *gout(const ghc_tensor_t *t, enum ghc_dtype dt, bool misaligned)
{
    ghc_tensor_t *g = gpu_like(t, dt, misaligned);
    poison(g);
    return g;
}

static inline double get(const ghc_tensor_t *t, int64_t i)
{
    const void *p = ghc_tensor_cdata(t);
    switch (ghc_tensor_dtype(t)) {
    case GHC_DTYPE_F32:  return ((const float *)p)[i];
    case GHC_DTYPE_BF16: return ghc_bf16_to_f32(((const uint16_t *)p)[i]);
    default:             ck_abort_msg("get: dtype %s", ghc_dtype_name(ghc_tensor_dtype(t)));
    }
    return 0;
}

static inline void set(ghc_tensor_t *t, int64_t i, double v)
{
    void *p = ghc_tensor_data(t);
    switch (ghc_tensor_dtype(t)) {
    case GHC_DTYPE_F32:  ((float *)p)[i] = (float)v; break;
    case GHC_DTYPE_BF16: ((uint16_t *)p)[i] = ghc_f32_to_bf16((float)v); break;
    default:             ck_abort_msg("set: dtype %s", ghc_dtype_name(ghc_tensor_dtype(t)));
    }
}

static inline struct ghc_rng fresh_rng(void) { return (struct ghc_rng){ seed_base * 1000003u + seed_next++, 0 }; }

/* A CPU tensor of N(bias, amp^2) values, fresh for every call. */
static inline ghc_tensor_t *randn(enum ghc_dtype dt, double amp, double bias, int nd, const int64_t *shape)
{
    ghc_tensor_t *t = mk(dt, CPUD, nd, shape);
    struct ghc_rng r = fresh_rng();
    OK(ghc_op_rand_normal(t, &r, NULL));
    if (amp != 1.0 || bias != 0.0)
        for (int64_t i = 0; i < ghc_tensor_numel(t); i++)
            set(t, i, get(t, i) * amp + bias);
    return t;
}

static inline const char *dn(enum ghc_dtype dt) { return dt == F32 ? "f32" : dt == BF16 ? "bf16" : ghc_dtype_name(dt); }

static inline const char *shape_str(const ghc_tensor_t *t, char *buf, size_t len)
{
    size_t n = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ghc_tensor_ndim(t); i++)
        n += (size_t)snprintf(buf + n, len > n ? len - n : 0, "%s%" PRId64, i ? ", " : "", ghc_tensor_dim(t, i));
    snprintf(buf + n, len > n ? len - n : 0, "]");
    return buf;
}

/* ---- comparisons -------------------------------------------------------------------------- */

/* Compare the GPU tensor `g` with the CPU reference `ref` (f32 or bf16 each): the relative
 * error norm must be <= tol and `g` free of NaN and inf where `ref` is finite. `what` names the
 * op and case; the line printed and any failure add the shape and the worst element. */
static inline void expect_close(const char *what, const ghc_tensor_t *g, const ghc_tensor_t *ref, double tol)
{
    ghc_tensor_t *got = down(g);
    int64_t n = ghc_tensor_numel(ref), bad = 0, first_bad = -1, worst = 0;
    ck_assert_int_eq(ghc_tensor_numel(got), n);
    double num = 0, den = 0, wd = -1;
    for (int64_t i = 0; i < n; i++) {
        double a = get(got, i), b = get(ref, i);
        if (!isfinite(a) && isfinite(b)) {
            if (first_bad < 0)
                first_bad = i;
            bad++;
            continue;
        }
        if (!isfinite(b))
            continue;
        double d = fabs(a - b);
        num += d * d;
        den += b * b;
        if (d > wd) {
            wd = d;
            worst = i;
        }
    }
    double e = den > 0 ? sqrt(num / den) : sqrt(num);
    char sh[96];
    shape_str(ref, sh, sizeof(sh));
    printf("  %-58s %-22s %s rel err %.2e (tol %.0e)%s\n", what, sh, dn(ghc_tensor_dtype(g)), e, tol,
           bad ? "  NON-FINITE" : "");
    fflush(stdout);
    ck_assert_msg(bad == 0, "%s %s: %" PRId64 " of %" PRId64 " GPU elements are NaN/inf (unwritten?), first [%" PRId64
                  "] = %g, cpu %g", what, sh, bad, n, first_bad, get(got, first_bad), get(ref, first_bad));
    ck_assert_msg(e <= tol, "%s %s (%s): relative error %.3e > %.0e; worst [%" PRId64 "]: gpu %.9g cpu %.9g", what, sh,
                  dn(ghc_tensor_dtype(g)), e, tol, worst, get(got, worst), get(ref, worst));
}

/* Bit-identical bytes. On a mismatch, report the count and the first element. */
static inline void expect_bits(const char *what, const ghc_tensor_t *g, const ghc_tensor_t *ref)
{
    ghc_tensor_t *got = down(g);
    size_t es = ghc_dtype_size(ghc_tensor_dtype(ref));
    int64_t n = ghc_tensor_numel(ref), diff = 0, first = -1;
    const unsigned char *a = ghc_tensor_cdata(got), *b = ghc_tensor_cdata(ref);
    for (int64_t i = 0; i < n; i++)
        if (memcmp(a + (size_t)i * es, b + (size_t)i * es, es)) {
            if (first < 0)
                first = i;
            diff++;
        }
    char sh[96];
    shape_str(ref, sh, sizeof(sh));
    printf("  %-58s %-22s %s %s\n", what, sh, ghc_dtype_name(ghc_tensor_dtype(ref)),
           diff ? "DIFFERENT" : "bit-identical");
    fflush(stdout);
    if (diff) {
        uint64_t ga = 0, rb = 0;
        memcpy(&ga, a + (size_t)first * es, es);
        memcpy(&rb, b + (size_t)first * es, es);
        ck_abort_msg("%s %s %s: %" PRId64 " of %" PRId64 " elements differ; first [%" PRId64 "]: gpu 0x%0*" PRIx64
                     " cpu 0x%0*" PRIx64, what, sh, ghc_dtype_name(ghc_tensor_dtype(ref)), diff, n, first,
                     (int)(2 * es), ga, (int)(2 * es), rb);
    }
}


/* ---- the suite ---------------------------------------------------------------------------- */

/* The start of a suite's main: 77 (automake's SKIP) without a device, EXIT_FAILURE when the
 * core cannot be made, else 0 with `core` on the device policy and GHC_TEST_SEED read. */
static inline int cuda_suite_start(void)
{
    if (ghc_k_device_count() < 1) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    const char *seed = getenv("GHC_TEST_SEED");
    if (seed && *seed)
        seed_base = strtoull(seed, NULL, 0);
    return (core = tu_device_core()) ? 0 : EXIT_FAILURE;
}

/* Run the suite `name` of n groups, one test case each (900 s, the pool freed after every
 * test), in-process (CUDA does not survive fork), then free the core. The exit status. */
#define CUDA_GROUP_TESTS 12
struct cuda_group {
    const char  *name;
    const TTest *tests[CUDA_GROUP_TESTS];
};

static inline int cuda_suite_run(const char *name, const struct cuda_group *groups, size_t n)
{
    Suite *s = suite_create(name);
    for (size_t g = 0; g < n; g++) {
        TCase *tc = tcase_create(groups[g].name);
        tcase_set_timeout(tc, 900);
        tcase_add_checked_fixture(tc, NULL, pool_free);
        for (int i = 0; i < CUDA_GROUP_TESTS && groups[g].tests[i]; i++)
            tcase_add_test(tc, groups[g].tests[i]);
        suite_add_tcase(s, tc);
    }
    int status = tu_run_suite(s, true);
    ghc_run_free(core);
    ghc_core_free(core);
    return status;
}

#endif /* GHC_TESTS_CUDA_TESTUTIL_H */
