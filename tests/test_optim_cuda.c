/* test_optim_cuda.c: the adamw and automagic optimizers on CUDA device 0: the golden
 * trajectories of the CPU suite (adamw bit-identical: the kernel rounds as the CPU does;
 * automagic within a tolerance: f32 tree sums), exact resume on the device, bf16 params, and
 * automagic on every kind of tensor shape against the CPU.
 * Exits 77 (automake SKIP) without a device; runs with CK_NOFORK. */
#include <config.h>

#include "optim_cases.h"

#include "../kernels/cuda/device.h"
#include "../kernels/cuda/kernels.h"

static ghc_core_t *oc_core(const char *section)
{
    char text[2048];
    snprintf(text, sizeof(text), "mempolicy = { plugin = \"device\"; };\n%s", section);
    ghc_core_t *core = ghc_core_init();
    ck_assert_ptr_nonnull(core);
    ck_assert_int_eq(ghc_plugin_add_path(core, tu_env("GHC_BUILD_PLUGINS")), 0);
    ck_assert_msg(ghc_config_load_string(core, text, "t.cfg", NULL, NULL, 0) == 0, "%s", ghc_error_message(core));
    ck_assert_msg(ghc_run_init(core) == 0, "%s", ghc_error_message(core));
    return core;
}

START_TEST(adamw_golden_cuda) { oc_adamw_golden(0, 1e-6); }
END_TEST

START_TEST(automagic_golden_cuda) { oc_automagic_golden(0, 1e-5); }
END_TEST

START_TEST(resume_cuda)
{
    char cfg[1024];
    oc_resume(0, oc_adamw_cfg, GHC_DTYPE_F32, 0);
    oc_resume(0, oc_adamw_cfg, GHC_DTYPE_BF16, 1);
    snprintf(cfg, sizeof(cfg), oc_automagic_cfg, "");
    oc_resume(0, cfg, GHC_DTYPE_F32, 1);
    oc_resume(0, cfg, GHC_DTYPE_BF16, 0);
    snprintf(cfg, sizeof(cfg), oc_automagic_cfg, "lr_mask = \"f32\"; seed = 3;");
    oc_resume(0, cfg, GHC_DTYPE_F32, -1);
}
END_TEST


/* ---- automagic on every kind of shape against the CPU ------------------------------------------ */

/* LoRA's thin A and B at ranks 4, 8, 16 and 32 (the register-resident stats), wide and tall
 * matrices past 32 rows or columns, one row or one column, odd sizes, 1-D over one and several
 * chunks, a batch of matrices ({0, 1, n}: 1-D); from 15 on thin ones in whole groups of 128
 * that the clusters take where their params are f32 (k_am_fused: wide and tall, ranks 4 to 32,
 * clusters of 1 to 16 blocks, a last block shorter than the others). */
#define FU_N 25
#define FU_MAX 40
static const int64_t fu_shape[FU_N][3] = { { 1, 16, 3000 }, { 1, 3000, 16 }, { 1, 40, 1000 }, { 1, 7, 33 },
                                           { 1, 1, 5000 }, { 1, 5000, 1 }, { 0, 1, 2500 }, { 0, 1, 9000 },
                                           { 3, 40, 24 }, { 1, 64, 64 }, { 1, 300, 300 }, { 1, 16, 20000 },
                                           { 1, 2000, 8 }, { 1, 4, 4100 }, { 1, 32, 1500 }, { 1, 2500, 32 },
                                           { 1, 16, 5120 }, { 1, 8, 256 }, { 1, 13824, 16 }, { 1, 2048, 4 },
                                           { 1, 6000, 8 }, { 1, 2048, 4 }, { 1, 8, 1024 }, { 1, 32, 1280 },
                                           { 1, 4, 3968 } };

/* LoRA r16's A [16, 5120] and B [5120, 16], 20 each, all f32 with int8 masks: more than the
 * clusters resident at once (15 clusters of 8 on an H100), so that some clusters step two
 * tensors in turn, the second one's stage and params loaded while the first is computed
 * (fu_run, below). */
static int64_t fu_many[FU_MAX][3];

/* A list fu_run takes: its shapes, how many, whether all are f32 with int8 masks (else bf16
 * params, grads and an f32 mask on some), and the wide and the tall tensor in which u
 * underflows at step 3. */
struct fu_spec {
    const int64_t (*shape)[3];
    int  n;
    bool plain;
    int  under_wide, under_tall;
};

static const struct fu_spec fu_kinds = { fu_shape, FU_N, false, 16, 18 };
static const struct fu_spec fu_many_spec = { (const int64_t (*)[3])fu_many, FU_MAX, true, 0, 35 };

/* A tensor of dtype dt on `dev` holding v (f32 values; raw bytes for U8 and I32). */
static ghc_tensor_t *fu_tensor(ghc_core_t *core, int dev, enum ghc_dtype dt, int ndim, const int64_t *shape,
                               const void *v)
{
    bool raw = dt == GHC_DTYPE_U8 || dt == GHC_DTYPE_I32;
    ghc_tensor_t *t = ghc_tensor_init(core, dt, ndim, shape, dev, GHC_ROLE_OPTIMIZER_STATE);
    ghc_tensor_t *h = ghc_tensor_init(core, raw ? dt : GHC_DTYPE_F32, ndim, shape, GHC_DEVICE_CPU, GHC_ROLE_WORKSPACE);
    ck_assert_ptr_nonnull(t);
    ck_assert_ptr_nonnull(h);
    memcpy(ghc_tensor_data(h), v, ghc_tensor_nbytes(h));
    if (raw || dt == GHC_DTYPE_F32 || dev == GHC_DEVICE_CPU) {
        ck_assert_int_eq(dev == GHC_DEVICE_CPU && !raw ? ghc_tensor_convert_cpu(t, h, 1.0f) : ghc_op_copy(t, h, NULL), 0);
    } else {   /* f32 over, then cast there */
        ghc_tensor_t *d = ghc_tensor_init(core, GHC_DTYPE_F32, ndim, shape, dev, GHC_ROLE_WORKSPACE);
        ck_assert_ptr_nonnull(d);
        ck_assert_int_eq(ghc_op_copy(d, h, NULL), 0);
        ck_assert_int_eq(ghc_op_cast(t, d, 1.0f, NULL, NULL), 0);
        ck_assert_int_eq(ghc_op_sync(core, dev, NULL), 0);
        ghc_tensor_free(d);
    }
    ck_assert_int_eq(ghc_op_sync(core, dev, NULL), 0);
    ghc_tensor_free(h);
    return t;
}

/* The list on `dev` (the same values on either): bf16 params on some, an f32 mask on one, random
 * codes, polarity and second moments. */
static void fu_list(ghc_core_t *core, int dev, struct ghc_optim_tensor *ts, const struct fu_spec *L)
{
    const int64_t (*sh)[3] = L->shape;
    for (int i = 0; i < L->n; i++) {
        const bool fact = sh[i][0] != 0, m8 = L->plain || i != 9;
        const int64_t B = fact ? sh[i][0] : 1, R = sh[i][1], C = sh[i][2], n = B * R * C;
        const int64_t shape[3] = { B, R, C }, words = (n + 31) / 32, two = 2;
        const int nd = fact ? (B > 1 ? 3 : 2) : 1;
        const int64_t rows[2] = { B, R }, cols[2] = { B, C };
        float *v = malloc((size_t)n * sizeof(float));
        int32_t *w = calloc((size_t)words, sizeof(int32_t));
        ck_assert(v && w);
        srand(17u + (unsigned)i);
        for (int64_t e = 0; e < n; e++)
            v[e] = (float)(rand() % 2001 - 1000) * 1e-4f;
        ts[i].param = fu_tensor(core, dev, i % 4 == 1 && !L->plain ? GHC_DTYPE_BF16 : GHC_DTYPE_F32, nd, fact ? shape + 3 - nd : &n, v);
        for (int64_t e = 0; e < n; e++)   /* second moments: positive */
            v[e] = (float)(rand() % 1000 + 1) * 1e-9f;
        ts[i].state[0] = fact ? fu_tensor(core, dev, GHC_DTYPE_F32, nd - 1, B > 1 ? rows : rows + 1, v)
                              : fu_tensor(core, dev, GHC_DTYPE_F32, 1, &n, v);
        ts[i].state[1] = fact ? fu_tensor(core, dev, GHC_DTYPE_F32, nd - 1, B > 1 ? cols : cols + 1, v) : NULL;
        if (m8) {
            uint8_t *q = (uint8_t *)v;
            for (int64_t e = 0; e < n; e++)
                q[e] = (uint8_t)(rand() % 127 + 1);
            ts[i].state[2] = fu_tensor(core, dev, GHC_DTYPE_U8, nd, fact ? shape + 3 - nd : &n, q);
        } else {
            for (int64_t e = 0; e < n; e++)
                v[e] = (float)(rand() % 100 + 1) * 1e-6f;
            ts[i].state[2] = fu_tensor(core, dev, GHC_DTYPE_F32, nd, fact ? shape + 3 - nd : &n, v);
        }
        const float aux[2] = { 1e-4f / 127.0f, 0.0f };
        ts[i].state[3] = fu_tensor(core, dev, GHC_DTYPE_F32, 1, &two, aux);
        for (int64_t e = 0; e < words; e++)
            w[e] = rand();
        if (n % 32)   /* the bits past the tensor: zero, as the optimizer makes them */
            w[words - 1] &= (int32_t)((1u << (n % 32)) - 1u);
        ts[i].state[4] = fu_tensor(core, dev, GHC_DTYPE_I32, 1, &words, w);
        ts[i].state[5] = fu_tensor(core, dev, GHC_DTYPE_I32, 1, &words, w);
        ts[i].rng.seed = 11;
        free(v);
        free(w);
    }
}

static void fu_free(struct ghc_optim_tensor *ts, int n)
{
    for (int i = 0; i < n; i++) {
        ghc_tensor_free(ts[i].param);
        for (int k = 0; k < 6; k++)
            ghc_tensor_free(ts[i].state[k]);
    }
}

/* got (on the device) against want (on the CPU): bytes equal (tol < 0), or as floats within
 * tol relative to max(|want|, floor). */
static int fu_mode;   /* fu_run's: in the messages */

static void fu_check(ghc_core_t *core, ghc_tensor_t *got_t, ghc_tensor_t *want_t, double tol, double floor,
                     int tensor, int step, const char *what)
{
    if (!got_t)
        return;
    ghc_tensor_t *h = oc_host(core, got_t);
    const int64_t n = ghc_tensor_numel(h);
    if (tol < 0) {
        ck_assert_msg(memcmp(ghc_tensor_data(h), ghc_tensor_data(want_t), ghc_tensor_nbytes(h)) == 0,
                      "mode %d, tensor %d, step %d: %s differs from the CPU's", fu_mode, tensor, step, what);
    } else {
        ghc_tensor_t *a = ghc_tensor_init(core, GHC_DTYPE_F32, 1, &n, GHC_DEVICE_CPU, GHC_ROLE_WORKSPACE);
        ghc_tensor_t *b = ghc_tensor_init(core, GHC_DTYPE_F32, 1, &n, GHC_DEVICE_CPU, GHC_ROLE_WORKSPACE);
        ck_assert(a && b);
        ck_assert_int_eq(ghc_tensor_convert_cpu(a, h, 1.0f), 0);
        ck_assert_int_eq(ghc_tensor_convert_cpu(b, want_t, 1.0f), 0);
        const float *x = ghc_tensor_cdata(a), *y = ghc_tensor_cdata(b);
        for (int64_t e = 0; e < n; e++)
            ck_assert_msg(fabs((double)x[e] - y[e]) <= tol * fmax(fabs(y[e]), floor),
                          "mode %d, tensor %d, step %d: %s[%lld] = %.9g, the CPU's %.9g", fu_mode, tensor, step, what,
                          (long long)e, x[e], y[e]);
        ghc_tensor_free(a);
        ghc_tensor_free(b);
    }
    ghc_tensor_free(h);
}

/* Six steps of the same list on the GPU and on the CPU (random grads with exact zeros, bf16 grads
 * on some, weight decay): masks, scales and polarity bit for bit (and in the separate passes
 * their agreement scratch), second moments and the mean lr within f32 sums' rounding, params
 * within that too (bf16 ones within one ulp);
 * fused: with the thin tensors' clusters (1, the default; 2: the clusters taking the new int8
 * scale after the update, as they do where a u underflows) or every tensor in the separate
 * passes (0). */
static void fu_run(const struct fu_spec *L, int fused, int steps)
{
    const int64_t (*sh)[3] = L->shape;
    const int nt = L->n;
    ghc_k_automagic_fused(fused);
    fu_mode = fused;
    ghc_core_t *core = oc_core("");
    static const char *const what[6] = { "row state", "column state", "lr mask", "scale and mean", "polarity",
                                         "agreement" };
    struct ghc_optim_tensor gd[FU_MAX], cp[FU_MAX];
    ghc_tensor_t *gdg[FU_MAX] = { 0 }, *cpg[FU_MAX] = { 0 };   /* their grads */
    memset(gd, 0, sizeof(gd));
    memset(cp, 0, sizeof(cp));
    fu_list(core, 0, gd, L);
    fu_list(core, GHC_DEVICE_CPU, cp, L);
    const struct ghc_automagic_args am = { 0.999f, 0.001f, 1e-30f, 1.0f, 1e-5f, 1e-6f, 2e-4f, 0.01f };
    for (int step = 0; step < steps; step++) {
        for (int i = 0; i < nt; i++) {
            const int64_t R = sh[i][1], C = sh[i][2], n = (sh[i][0] ? sh[i][0] : 1) * R * C;
            float *g = malloc((size_t)n * sizeof(float));
            ck_assert_ptr_nonnull(g);
            srand(1000u * (unsigned)step + (unsigned)i);
            for (int64_t e = 0; e < n; e++)
                g[e] = rand() % 7 == 0 ? 0.0f : (float)(rand() % 2001 - 1000) * 1e-6f;
            /* u underflowing to zero (the clusters' fallback): a huge and a tiny g in columns of
             * a wide tensor (A [16, 5120]) and in rows of a tall one (B [13824, 16] or [5120, 16]) */
            if (step == 3 && i == L->under_wide)
                for (int64_t c = 0; c < C; c += 97) {
                    g[c] = 1e12f;
                    g[C + c] = 1e-40f;
                }
            if (step == 3 && i == L->under_tall)
                for (int64_t r = 0; r < R; r += 89) {
                    g[16 * r] = -1e12f;
                    g[16 * r + 1] = 1e-40f;
                }
            const enum ghc_dtype gt = i % 5 == 2 && !L->plain ? GHC_DTYPE_BF16 : GHC_DTYPE_F32;
            ghc_tensor_free(gdg[i]);
            ghc_tensor_free(cpg[i]);
            gd[i].grad = gdg[i] = fu_tensor(core, 0, gt, 1, &n, g);
            cp[i].grad = cpg[i] = fu_tensor(core, GHC_DEVICE_CPU, gt, 1, &n, g);
            gd[i].rng.offset = cp[i].rng.offset = 1000 * (uint64_t)i + 7 * (uint64_t)step;
            free(g);
        }
        ck_assert_msg(ghc_op_automagic(gd, nt, &am, NULL) == 0, "cuda: %s", ghc_error_message(core));
        ck_assert_msg(ghc_op_automagic(cp, nt, &am, NULL) == 0, "cpu: %s", ghc_error_message(core));
        ck_assert_int_eq(ghc_op_sync(core, 0, NULL), 0);
        for (int i = 0; i < nt; i++) {
            const bool bf = ghc_tensor_dtype(gd[i].param) == GHC_DTYPE_BF16;
            fu_check(core, gd[i].param, cp[i].param, bf ? 8e-3 : 2e-6, bf ? 1e-2 : 1e-3, i, step, "param");
            fu_check(core, gd[i].state[0], cp[i].state[0], 1e-5, 0.0, i, step, what[0]);
            fu_check(core, gd[i].state[1], cp[i].state[1], 1e-5, 0.0, i, step, what[1]);
            fu_check(core, gd[i].state[2], cp[i].state[2], -1, 0.0, i, step, what[2]);
            fu_check(core, gd[i].state[3], cp[i].state[3], 1e-5, 0.0, i, step, what[3]);
            fu_check(core, gd[i].state[4], cp[i].state[4], -1, 0.0, i, step, what[4]);
            if (fused == 0)   /* (scratch: the clusters keep their tensors' agreement bits on chip) */
                fu_check(core, gd[i].state[5], cp[i].state[5], -1, 0.0, i, step, what[5]);
        }
    }
    fu_free(gd, nt);
    fu_free(cp, nt);
    for (int i = 0; i < nt; i++) {
        ghc_tensor_free(gdg[i]);
        ghc_tensor_free(cpg[i]);
    }
    ghc_core_free(core);
    ghc_k_automagic_fused(1);
}

START_TEST(automagic_shapes_cuda)
{
    fu_run(&fu_kinds, 1, 6);
    fu_run(&fu_kinds, 2, 6);
    fu_run(&fu_kinds, 0, 6);
}
END_TEST

/* fu_many: clusters with two tensors each, against the CPU; u underflows at step 3 in the
 * first tensor of a cluster's two (A) and in the second (B): that tensor's fallback; then with
 * every tensor taking the fallback (2) */
START_TEST(automagic_many_cuda)
{
    for (int i = 0; i < FU_MAX; i++) {
        fu_many[i][0] = 1;
        fu_many[i][1] = i < 20 ? 16 : 5120;
        fu_many[i][2] = i < 20 ? 5120 : 16;
    }
    fu_run(&fu_many_spec, 1, 5);
    fu_run(&fu_many_spec, 2, 4);
}
END_TEST

int main(void)
{
    if (ghc_k_device_count() < 1) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    Suite *s = suite_create("optim_cuda");
    TCase *tc = tcase_create("cuda");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, adamw_golden_cuda);
    tcase_add_test(tc, automagic_golden_cuda);
    tcase_add_test(tc, resume_cuda);
    tcase_add_test(tc, automagic_shapes_cuda);
    tcase_add_test(tc, automagic_many_cuda);
    suite_add_tcase(s, tc);
    return tu_run_suite(s, true);
}
