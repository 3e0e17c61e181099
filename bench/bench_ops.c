/* bench_ops.c: GEMMs and attention at Wan2.2 A14B shapes on the GPU, in TFLOP/s, and the
 * memory-bound ops (norms, RoPE, elementwise, loss, casts, RNG) in GB/s, next to the
 * peaks measured in the same run (an 8192^3 bf16 GEMM for compute, a device-to-device copy for
 * bandwidth). Not a test: it shares inputs with the tests, not pass/fail.
 *
 *   bench_ops [--csv PATH] [--iters N] [--quick] [--only gemm|attention|memory]
 *
 * Needs GHC_BUILD_PLUGINS (or GHC_PLUGIN_PATH) pointing at the folder with the `device`
 * memory-policy plugin. Times with CUDA events around each call, after warm-up (a few calls, then
 * about 250 ms more of them), and reports the median. Inputs are random normal (Philox on the GPU), never zeros. FLOP counts: GEMM 2 M N K;
 * attention forward 4 B H L^2 Dh, backward 2.5x that, forward+backward 3.5x. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include <gh200core/gh200core.h>
#include <gh200core/ops.h>

#include "../kernels/cuda/device.h"
#include "../kernels/cuda/kernels.h"

static ghc_core_t *core;
static int iters = 20;
static FILE *csv;
static double peak_tflops, peak_gbs;
static uint64_t seed = 1234;

static void die(const char *what)
{
    fprintf(stderr, "bench_ops: %s: %s\n", what, ghc_error_message(core));
    exit(EXIT_FAILURE);
}

static void cuda_ok(cudaError_t e, const char *what)
{
    if (e != cudaSuccess) {
        fprintf(stderr, "bench_ops: %s: %s\n", what, cudaGetErrorString(e));
        exit(EXIT_FAILURE);
    }
}

static ghc_tensor_t *gpu(enum ghc_dtype dt, int ndim, const int64_t *shape)
{
    ghc_tensor_t *t = ghc_tensor_init(core, dt, ndim, shape, 0, GHC_ROLE_ACTIVATIONS);
    if (!t)
        die("tensor");
    return t;
}
#define SHAPE(...) (int)(sizeof((int64_t[]){ __VA_ARGS__ }) / sizeof(int64_t)), (const int64_t[]){ __VA_ARGS__ }
#define GPU(dt, ...) gpu(dt, SHAPE(__VA_ARGS__))

/* Random normal values times `amp` (amp != 1 goes through a scale op). */
static void randn(ghc_tensor_t *t, float amp)
{
    struct ghc_rng r = { seed++, 0 };
    if (ghc_op_rand_normal(t, &r, NULL))
        die("rand_normal");
    if (amp != 1.0f && ghc_op_scale(t, t, amp, NULL))
        die("scale");
}

typedef int (*bench_fn)(void *ctx);

static int cmp_f(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* Median milliseconds of `n` timed calls after `warm` untimed ones and then enough more to
 * keep the GPU busy for about 250 ms (so that clocks settle as they will for the timed calls,
 * whatever ran before). */
static double time_ms(bench_fn fn, void *ctx, int warm, int n)
{
    for (int i = 0; i < warm; i++)
        if (fn(ctx))
            die("warm-up call");
    cudaEvent_t w0, w1;
    cuda_ok(cudaEventCreate(&w0), "event");
    cuda_ok(cudaEventCreate(&w1), "event");
    cuda_ok(cudaEventRecord(w0, NULL), "record");
    if (fn(ctx))
        die("warm-up call");
    cuda_ok(cudaEventRecord(w1, NULL), "record");
    cuda_ok(cudaEventSynchronize(w1), "synchronize");
    float one = 1;
    cuda_ok(cudaEventElapsedTime(&one, w0, w1), "elapsed");
    cudaEventDestroy(w0);
    cudaEventDestroy(w1);
    int extra = one > 0 ? (int)(250.0f / one) : 0;
    for (int i = 0; i < (extra < 1000 ? extra : 1000); i++)
        if (fn(ctx))
            die("warm-up call");
    cudaEvent_t *ev = malloc(sizeof(cudaEvent_t) * 2 * (size_t)n);
    float *ms = malloc(sizeof(float) * (size_t)n);
    if (!ev || !ms)
        exit(EXIT_FAILURE);
    for (int i = 0; i < 2 * n; i++)
        cuda_ok(cudaEventCreate(&ev[i]), "event");
    for (int i = 0; i < n; i++) {
        cuda_ok(cudaEventRecord(ev[2 * i], NULL), "record");
        if (fn(ctx))
            die("timed call");
        cuda_ok(cudaEventRecord(ev[2 * i + 1], NULL), "record");
    }
    cuda_ok(cudaDeviceSynchronize(), "synchronize");
    for (int i = 0; i < n; i++)
        cuda_ok(cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]), "elapsed");
    for (int i = 0; i < 2 * n; i++)
        cudaEventDestroy(ev[i]);
    qsort(ms, (size_t)n, sizeof(float), cmp_f);
    double med = n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
    free(ev);
    free(ms);
    return med;
}

static void row(const char *op, const char *shape, double ms, double flops, double bytes)
{
    double tf = flops > 0 ? flops / (ms * 1e-3) / 1e12 : 0;
    double gbs = bytes > 0 ? bytes / (ms * 1e-3) / 1e9 : 0;
    char pct[32] = "";
    if (tf > 0 && peak_tflops > 0)
        snprintf(pct, sizeof(pct), "%5.1f%%", 100.0 * tf / peak_tflops);
    else if (gbs > 0 && peak_gbs > 0)
        snprintf(pct, sizeof(pct), "%5.1f%%", 100.0 * gbs / peak_gbs);
    printf("%-24s %-30s %10.3f %10.1f %10.1f %8s\n", op, shape, ms, tf, gbs, pct);
    fflush(stdout);
    if (csv)
        fprintf(csv, "ours,%s,%s,%.6f,%.3f,%.3f\n", op, shape, ms, tf, gbs);
}

/* ---- GEMM --------------------------------------------------------------------------------- */

struct gemm_ctx {
    ghc_tensor_t *c, *a, *b;
    struct ghc_gemm args;
};

static int gemm_call(void *p)
{
    struct gemm_ctx *g = p;
    return ghc_op_gemm(g->c, g->a, g->b, &g->args, NULL);
}

/* y[M, N] = x[M, K] W[N, K]^T (+ bias) in `dt` (bf16 or fp8 e4m3 with bf16 output). */
static void bench_linear(const char *name, int64_t M, int64_t K, int64_t N, enum ghc_epilogue epi, enum ghc_dtype dt)
{
    struct gemm_ctx g = { 0 };
    g.a = GPU(dt, M, K);
    g.b = GPU(dt, N, K);
    g.c = GPU(GHC_DTYPE_BF16, M, N);
    if (dt == GHC_DTYPE_BF16) {
        randn(g.a, 1.0f);
        randn(g.b, 0.02f);
    } else {   /* fp8: random values cast from bf16 */
        ghc_tensor_t *ta = GPU(GHC_DTYPE_BF16, M, K), *tb = GPU(GHC_DTYPE_BF16, N, K);
        randn(ta, 1.0f);
        randn(tb, 1.0f);
        if (ghc_op_cast(g.a, ta, 1.0f, NULL, NULL) || ghc_op_cast(g.b, tb, 1.0f, NULL, NULL))
            die("cast to fp8");
        ghc_op_sync(core, 0, NULL);
        ghc_tensor_free(ta);
        ghc_tensor_free(tb);
        g.args.scale_a = 1.0f;
        g.args.scale_b = 0.02f;
    }
    ghc_tensor_t *bias = NULL;
    if (epi != GHC_EPI_NONE) {
        bias = GPU(GHC_DTYPE_BF16, N);
        randn(bias, 0.1f);
    }
    g.args.trans_b = true;
    g.args.epilogue = epi;
    g.args.bias = bias;
    double ms = time_ms(gemm_call, &g, 3, iters);
    char shape[64];
    snprintf(shape, sizeof(shape), "%lldx%lld->%lld", (long long)M, (long long)K, (long long)N);
    row(name, shape, ms, 2.0 * M * N * K, 0);
    ghc_tensor_free(g.a);
    ghc_tensor_free(g.b);
    ghc_tensor_free(g.c);
    ghc_tensor_free(bias);
}

/* ---- peaks -------------------------------------------------------------------------------- */

struct copy_ctx {
    void *dst;
    const void *src;
    size_t bytes;
};

static int copy_call(void *p)
{
    struct copy_ctx *c = p;
    return cudaMemcpyAsync(c->dst, c->src, c->bytes, cudaMemcpyDeviceToDevice, NULL) != cudaSuccess;
}

static void bench_peaks(void)
{
    struct gemm_ctx g = { 0 };
    const int64_t n = 8192;
    g.a = GPU(GHC_DTYPE_BF16, n, n);
    g.b = GPU(GHC_DTYPE_BF16, n, n);
    g.c = GPU(GHC_DTYPE_BF16, n, n);
    randn(g.a, 1.0f);
    randn(g.b, 1.0f);
    g.args.trans_b = true;
    double ms = time_ms(gemm_call, &g, 5, iters);
    peak_tflops = 2.0 * n * n * n / (ms * 1e-3) / 1e12;
    peak_gbs = 0;
    row("peak: gemm bf16", "8192x8192x8192", ms, 2.0 * n * n * n, 0);
    ghc_tensor_free(g.a);
    ghc_tensor_free(g.b);
    ghc_tensor_free(g.c);

    struct copy_ctx c;
    c.bytes = (size_t)2 << 30;
    void *src = NULL, *dst = NULL;
    cuda_ok(cudaMalloc(&src, c.bytes), "malloc");
    cuda_ok(cudaMalloc(&dst, c.bytes), "malloc");
    cuda_ok(cudaMemset(src, 0x3c, c.bytes), "memset");
    c.src = src;
    c.dst = dst;
    ms = time_ms(copy_call, &c, 3, iters);
    peak_gbs = 2.0 * c.bytes / (ms * 1e-3) / 1e9;
    double save = peak_tflops;
    peak_tflops = 0;   /* the copy row shows % of bandwidth */
    row("peak: d2d copy (r+w)", "2 GiB", ms, 0, 2.0 * c.bytes);
    peak_tflops = save;
    cudaFree(src);
    cudaFree(dst);
}

/* ---- attention ---------------------------------------------------------------------------- */

struct attn_ctx {
    ghc_tensor_t *q, *k, *v, *o, *lse, *dout, *dq, *dk, *dv;
    float scale;
};

static int attn_fwd_call(void *p)
{
    struct attn_ctx *a = p;
    return ghc_op_attention_fwd(a->o, a->lse, a->q, a->k, a->v, a->scale, NULL);
}

static int attn_bwd_call(void *p)
{
    struct attn_ctx *a = p;
    return ghc_op_attention_bwd(a->dq, a->dk, a->dv, a->dout, a->q, a->k, a->v, a->o, a->lse, a->scale, NULL);
}

static int attn_fwd_bwd_call(void *p)
{
    int rc = attn_fwd_call(p);
    return rc ? rc : attn_bwd_call(p);
}

/* Self-attention (Lk = Lq) or cross-attention (Lk = 512 text rows) at Wan's heads, on our
 * kernels and on cuDNN's fused attention where libcudnn.so.9 loads; each row names the path
 * that ran. */
static void bench_attention(int64_t B, int64_t L, int64_t Lk, int64_t H, int64_t D)
{
    struct attn_ctx a;
    a.q = GPU(GHC_DTYPE_BF16, B, L, H, D);
    a.k = GPU(GHC_DTYPE_BF16, B, Lk, H, D);
    a.v = GPU(GHC_DTYPE_BF16, B, Lk, H, D);
    a.o = GPU(GHC_DTYPE_BF16, B, L, H, D);
    a.dout = GPU(GHC_DTYPE_BF16, B, L, H, D);
    a.dq = GPU(GHC_DTYPE_BF16, B, L, H, D);
    a.dk = GPU(GHC_DTYPE_BF16, B, Lk, H, D);
    a.dv = GPU(GHC_DTYPE_BF16, B, Lk, H, D);
    a.lse = GPU(GHC_DTYPE_F32, B, H, L);
    a.scale = 1.0f / sqrtf((float)D);
    randn(a.q, 1.0f);
    randn(a.k, 1.0f);
    randn(a.v, 1.0f);
    randn(a.dout, 1.0f);
    int n = L > 8192 ? (iters < 5 ? iters : 5) : iters;
    double fwd_flops = 4.0 * B * H * (double)L * Lk * D;
    char shape[80];
    snprintf(shape, sizeof(shape), "B%lld L%lld Lk%lld H%lld D%lld", (long long)B, (long long)L, (long long)Lk,
             (long long)H, (long long)D);
    const int impls[2] = { GHC_K_ATTN_OWN, GHC_K_ATTN_CUDNN };
    for (int i = 0; i < (ghc_k_cudnn_version() > 0 ? 2 : 1); i++) {
        ghc_k_attention_impl(impls[i]);
        char name[64];
        double ms = time_ms(attn_fwd_call, &a, 2, n);
        snprintf(name, sizeof(name), "attention fwd [%s]", ghc_k_attention_last());
        row(name, shape, ms, fwd_flops, 0);
        ms = time_ms(attn_bwd_call, &a, 1, n);
        snprintf(name, sizeof(name), "attention bwd [%s]", ghc_k_attention_last());
        row(name, shape, ms, 2.5 * fwd_flops, 0);
        ms = time_ms(attn_fwd_bwd_call, &a, 1, n);
        snprintf(name, sizeof(name), "attention fwd+bwd [%s]", ghc_k_attention_last());
        row(name, shape, ms, 3.5 * fwd_flops, 0);
    }
    ghc_k_attention_impl(GHC_K_ATTN_AUTO);
    if (*ghc_k_cudnn_why())
        printf("cuDNN declined: %s\n", ghc_k_cudnn_why());
    ghc_tensor_t *all[] = { a.q, a.k, a.v, a.o, a.dout, a.dq, a.dk, a.dv, a.lse };
    for (size_t i = 0; i < sizeof(all) / sizeof(*all); i++)
        ghc_tensor_free(all[i]);
}

/* ---- memory-bound ops: GB/s against the copy peak of the same run ------------------------ */

/* One call of a memory-bound op; `bytes` counts what it must read and write at least. */
struct mem_ctx {
    int (*call)(struct mem_ctx *m);
    ghc_tensor_t *x, *y, *dy, *dx, *a, *b, *w, *shift, *scale, *stats, *rstd, *out;
    struct ghc_rng rng;
    int64_t f, h, wd;
};

static int mem_call(void *p)
{
    struct mem_ctx *m = p;
    return m->call(m);
}

static int ln_fwd(struct mem_ctx *m) { return ghc_op_layernorm_fwd(m->y, m->stats, m->x, NULL, NULL, m->shift, m->scale, 1e-6f, NULL); }
static int ln_bwd(struct mem_ctx *m) { return ghc_op_layernorm_bwd(m->dx, m->dy, m->x, m->stats, NULL, m->scale, false, NULL); }
static int rms_fwd(struct mem_ctx *m) { return ghc_op_rmsnorm_fwd(m->y, m->rstd, m->x, m->w, 1e-6f, NULL); }
static int rms_bwd(struct mem_ctx *m) { return ghc_op_rmsnorm_bwd(m->dx, m->dy, m->x, m->rstd, m->w, NULL); }
static int rope(struct mem_ctx *m) { return ghc_op_rope(m->x, m->x, m->f, m->h, m->wd, false, NULL); }
static int gelu(struct mem_ctx *m) { return ghc_op_gelu_tanh(m->y, m->x, NULL); }
static int gelu_bwd(struct mem_ctx *m) { return ghc_op_gelu_tanh_bwd(m->dx, m->dy, m->x, NULL); }
static int add(struct mem_ctx *m) { return ghc_op_add(m->y, m->a, m->b, 1.0f, 1.0f, NULL); }
static int gated(struct mem_ctx *m) { return ghc_op_gated_residual(m->x, m->y, m->scale, NULL); }
static int mse(struct mem_ctx *m) { return ghc_op_mse_loss(m->out, m->dx, m->a, m->b, NULL); }
static int cast_sr(struct mem_ctx *m) { m->rng.offset += 1u << 23; return ghc_op_cast(m->y, m->x, 1.0f, &m->rng, NULL); }
static int randn_f32(struct mem_ctx *m) { m->rng.offset += 1u << 23; return ghc_op_rand_normal(m->x, &m->rng, NULL); }
static int sum(struct mem_ctx *m) { return ghc_op_sum(m->out, m->x, NULL); }

static void mem_row(const char *name, const char *shape, struct mem_ctx *m, double bytes)
{
    double ms = time_ms(mem_call, m, 3, iters);
    double save = peak_tflops;
    peak_tflops = 0;   /* % of the copy bandwidth */
    row(name, shape, ms, 0, bytes);
    peak_tflops = save;
}

/* The elementwise, norm, RoPE, loss, cast and RNG ops at Wan A14B shapes (4096 tokens, dim
 * 5120, ffn 13824, 40 heads x 128), with the dtypes the model uses: the residual stream f32,
 * GEMM operands bf16. */
static void bench_memory(void)
{
    const int64_t L = 4096, D = 5120, F = 13824;
    const double n = (double)L * D, nf = (double)L * F;
    struct mem_ctx m = { 0 };
    m.rng.seed = 99;
    m.x = GPU(GHC_DTYPE_F32, 1, L, D);
    m.y = GPU(GHC_DTYPE_BF16, 1, L, D);
    m.dy = GPU(GHC_DTYPE_F32, 1, L, D);
    m.dx = GPU(GHC_DTYPE_F32, 1, L, D);
    m.shift = GPU(GHC_DTYPE_F32, 1, D);
    m.scale = GPU(GHC_DTYPE_F32, 1, D);
    m.stats = GPU(GHC_DTYPE_F32, L, 2);
    m.out = GPU(GHC_DTYPE_F32, 1);
    randn(m.x, 1.0f);
    randn(m.dy, 1.0f);
    randn(m.shift, 0.1f);
    randn(m.scale, 0.1f);
    m.call = ln_fwd;
    mem_row("layernorm fwd +mod", "4096x5120 f32->bf16", &m, n * 6);
    m.call = ln_bwd;
    mem_row("layernorm bwd +mod", "4096x5120 f32", &m, n * 12);
    m.call = gated;
    randn(m.y, 1.0f);
    mem_row("gated residual", "4096x5120 f32 += bf16*g", &m, n * 10);
    m.call = sum;
    mem_row("sum", "4096x5120 f32", &m, n * 4);
    m.call = randn_f32;
    mem_row("rand normal", "4096x5120 f32", &m, n * 4);
    m.call = cast_sr;
    mem_row("cast f32->bf16 stoch.", "4096x5120", &m, n * 6);
    ghc_tensor_t *first[] = { m.x, m.y, m.dy, m.dx };
    for (size_t i = 0; i < sizeof(first) / sizeof(*first); i++)
        ghc_tensor_free(first[i]);

    /* bf16 rows: q/k RMSNorm over the full dim, RoPE, elementwise */
    ghc_tensor_t *x16 = GPU(GHC_DTYPE_BF16, 1, L, D), *y16 = GPU(GHC_DTYPE_BF16, 1, L, D);
    ghc_tensor_t *dy16 = GPU(GHC_DTYPE_BF16, 1, L, D), *dx16 = GPU(GHC_DTYPE_BF16, 1, L, D);
    m.w = GPU(GHC_DTYPE_F32, D);
    m.rstd = GPU(GHC_DTYPE_F32, L);
    randn(x16, 1.0f);
    randn(dy16, 1.0f);
    randn(m.w, 1.0f);
    m.x = x16;
    m.y = y16;
    m.dy = dy16;
    m.dx = dx16;
    m.call = rms_fwd;
    mem_row("rmsnorm fwd", "4096x5120 bf16", &m, n * 4);
    m.call = rms_bwd;
    mem_row("rmsnorm bwd", "4096x5120 bf16", &m, n * 6);
    m.a = x16;
    m.b = dy16;
    m.call = add;
    mem_row("add", "4096x5120 bf16", &m, n * 6);
    int64_t rope_shape[] = { 1, L, 40, 128 };
    if (ghc_tensor_reshape(x16, 4, rope_shape))
        die("reshape");
    m.f = 16;
    m.h = 16;
    m.wd = 16;
    m.call = rope;
    mem_row("rope (in place)", "1x4096x40x128 bf16", &m, n * 4);
    ghc_tensor_t *all16[] = { x16, y16, dy16, dx16, m.w, m.rstd };
    for (size_t i = 0; i < sizeof(all16) / sizeof(*all16); i++)
        ghc_tensor_free(all16[i]);

    /* the FFN activation */
    m.x = GPU(GHC_DTYPE_BF16, L, F);
    m.y = GPU(GHC_DTYPE_BF16, L, F);
    m.dy = GPU(GHC_DTYPE_BF16, L, F);
    m.dx = GPU(GHC_DTYPE_BF16, L, F);
    randn(m.x, 1.0f);
    randn(m.dy, 1.0f);
    m.call = gelu;
    mem_row("gelu_tanh", "4096x13824 bf16", &m, nf * 4);
    m.call = gelu_bwd;
    mem_row("gelu_tanh bwd", "4096x13824 bf16", &m, nf * 6);
    ghc_tensor_t *allf[] = { m.x, m.y, m.dy, m.dx };
    for (size_t i = 0; i < sizeof(allf) / sizeof(*allf); i++)
        ghc_tensor_free(allf[i]);

    /* the flow-matching loss on a 81-frame 480x832 latent (16 x 21 x 60 x 104) */
    m.a = GPU(GHC_DTYPE_F32, 1, 16, 21, 60, 104);
    m.b = GPU(GHC_DTYPE_F32, 1, 16, 21, 60, 104);
    m.dx = GPU(GHC_DTYPE_F32, 1, 16, 21, 60, 104);
    randn(m.a, 1.0f);
    randn(m.b, 1.0f);
    m.call = mse;
    mem_row("mse loss + grad", "16x21x60x104 f32", &m, 16.0 * 21 * 60 * 104 * 12);
    ghc_tensor_t *rest[] = { m.a, m.b, m.dx, m.shift, m.scale, m.stats, m.out };
    for (size_t i = 0; i < sizeof(rest) / sizeof(*rest); i++)
        ghc_tensor_free(rest[i]);
}

int main(int argc, char **argv)
{
    const char *csv_path = NULL;
    bool quick = false;
    const char *only = "";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--csv") && i + 1 < argc)
            csv_path = argv[++i];
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc)
            iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick"))
            quick = true;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc)
            only = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--csv PATH] [--iters N] [--quick] [--only gemm|attention|memory]\n", argv[0]);
            return 2;
        }
    }
    if (iters < 1)
        iters = 1;
    if (ghc_k_device_count() < 1) {
        fprintf(stderr, "bench_ops: no CUDA device\n");
        return 77;
    }
    core = ghc_core_init();
    const char *plugins = getenv("GHC_BUILD_PLUGINS");
    if (!core || (plugins && ghc_plugin_add_path(core, plugins)) ||
        ghc_config_load_string(core, "mempolicy = { plugin = \"device\"; };", "bench.cfg", NULL, NULL, 0) ||
        ghc_run_init(core))
        die("setup (set GHC_BUILD_PLUGINS to the folder of the device plugin)");
    if (csv_path) {
        csv = fopen(csv_path, "w");
        if (!csv) {
            perror(csv_path);
            return EXIT_FAILURE;
        }
        fprintf(csv, "impl,op,shape,ms,tflops,gbs\n");
    }
    char name[256];
    int major = 0, minor = 0;
    size_t fr = 0, tot = 0;
    cuda_ok((cudaError_t)ghc_k_device_info(0, name, sizeof(name), &major, &minor, &fr, &tot), "device info");
    printf("GPU: %s (sm_%d%d, %.1f GiB); median of %d timed calls\n", name, major, minor, tot / 1073741824.0, iters);
    printf("%-24s %-30s %10s %10s %10s %8s\n", "op", "shape", "ms", "TFLOP/s", "GB/s", "of peak");

    bench_peaks();
    const int64_t tokens[2] = { 4096, 32760 };
    bool all = !*only;
    for (int t = 0; t < (quick ? 1 : 2) && (all || !strcmp(only, "gemm")); t++) {
        int64_t M = tokens[t];
        bench_linear("gemm bf16 qkvo +bias", M, 5120, 5120, GHC_EPI_BIAS, GHC_DTYPE_BF16);
        bench_linear("gemm bf16 ffn-up +bias", M, 5120, 13824, GHC_EPI_BIAS, GHC_DTYPE_BF16);
        bench_linear("gemm bf16 ffn-up +gelu", M, 5120, 13824, GHC_EPI_BIAS_GELU, GHC_DTYPE_BF16);
        bench_linear("gemm bf16 ffn-down +bias", M, 13824, 5120, GHC_EPI_BIAS, GHC_DTYPE_BF16);
    }
    if (all || !strcmp(only, "gemm"))
        bench_linear("gemm fp8 qkvo +bias", 4096, 5120, 5120, GHC_EPI_BIAS, GHC_DTYPE_F8_E4M3);
    if (all || !strcmp(only, "memory"))
        bench_memory();
    if (all || !strcmp(only, "attention")) {
        if (ghc_k_cudnn_version() > 0)
            printf("cuDNN %d loaded: attention on both paths\n", ghc_k_cudnn_version());
        else
            printf("cuDNN (libcudnn.so.9) not loaded: attention on our kernels only\n");
        bench_attention(1, 4096, 4096, 40, 128);
        bench_attention(1, 4096, 512, 40, 128);
        if (!quick) {
            bench_attention(1, 32760, 32760, 40, 128);
            bench_attention(1, 32760, 512, 40, 128);
        }
    }
    if (csv)
        fclose(csv);
    ghc_run_free(core);
    ghc_core_free(core);
    return 0;
}
