/* bench_optim.c: update throughput of the fused optimizer ops on GPU 0 for the LoRA r16
 * adapter params of one Wan2.2 A14B expert (40 blocks x 10 linears, A [16, in], B [out, 16]:
 * 76.7 M params, 800 tensors), as GB/s of state traffic (the bytes each element must move at
 * least: adamw reads g, p, m, v and writes p, m, v = 28 B a param; automagic with the int8 mask
 * reads g, p, mask, polarity and writes p, mask, polarity = 14.25 B a param, and reads and
 * writes its factored second moment, the row and column states (f32, R + C of them: 8 (R + C)
 * B a tensor, 0.5 B a param at r16), against the device-to-device cudaMemcpy bandwidth (2 x
 * bytes / time) measured in the same run. Prints both and the ratio; for automagic also the
 * ratio counting the 14.25 B only (the figure earlier builds printed). */
#include <config.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include <gh200core/gh200core.h>
#include <gh200core/ops.h>

#include "../kernels/cuda/device.h"
#include "../kernels/cuda/kernels.h"

#define BLOCKS 40
#define RANK 16

/* automagic's state traffic a step for an [r, c] tensor with the int8 mask: 14.25 B a param and
 * the row and column states read and written */
static double am_traffic(int64_t r, int64_t c)
{
    return 14.25 * (double)(r * c) + 8.0 * (double)(r + c);
}

/* The kernels' measurement switches, from this program's environment (the library reads none):
 * GHC_AUTOMAGIC_FUSED=0 keeps every tensor out of k_am_fused's clusters, whatever mode a
 * measurement below asks for; GHC_AUTOMAGIC_SERIAL (set) launches the clusters' groups one
 * after another on the caller's stream (ghc_k_automagic_serial). */
static bool no_fused;

static void fused(int on) { ghc_k_automagic_fused(no_fused ? 0 : on); }

static void need(bool ok, const char *what, ghc_core_t *core)
{
    if (!ok) {
        fprintf(stderr, "bench_optim: %s: %s\n", what, core ? ghc_error_message(core) : "");
        exit(1);
    }
}

static ghc_tensor_t *dev_tensor(ghc_core_t *core, enum ghc_dtype dt, int64_t n0, int64_t n1, double fill)
{
    int64_t sh[2] = { n0, n1 };
    ghc_tensor_t *t = ghc_tensor_init(core, dt, n1 ? 2 : 1, sh, 0, GHC_ROLE_OPTIMIZER_STATE);
    need(t != NULL, "alloc", core);
    if (dt == GHC_DTYPE_U8 || dt == GHC_DTYPE_I32)
        need(cudaMemset(ghc_tensor_data(t), dt == GHC_DTYPE_U8 ? 127 : 0, ghc_tensor_nbytes(t)) == cudaSuccess, "memset", core);
    else
        need(ghc_op_fill(t, fill, NULL) == 0, "fill", core);
    return t;
}

static float time_ms(int iters, void (*fn)(void *), void *arg)
{
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    fn(arg);                          /* warm-up */
    cudaEventRecord(a, NULL);
    for (int i = 0; i < iters; i++)
        fn(arg);
    cudaEventRecord(b, NULL);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return ms / (float)iters;
}

struct job {
    struct ghc_optim_tensor *ts;
    int32_t n;
    int kind;
    void *src, *dst;
    size_t bytes;
};

static void run_job(void *arg)
{
    struct job *j = arg;
    static const struct ghc_adamw_args aw = { 0.99999f, 0.1f, 0.999f, 0.001f, 0.5f, 1e-8f, 1e-4f };
    static const struct ghc_automagic_args am = { 0.999f, 0.001f, 1e-30f, 1.0f, 1e-6f, 1e-7f, 1e-3f, 0.0f };
    if (j->kind == 0)
        cudaMemcpyAsync(j->dst, j->src, j->bytes, cudaMemcpyDeviceToDevice, NULL);
    else if (j->kind == 1)
        ghc_op_adamw(j->ts, j->n, &aw, NULL);
    else
        ghc_op_automagic(j->ts, j->n, &am, NULL);
}

int main(void)
{
    if (ghc_k_device_count() < 1) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    const char *plugins = getenv("GHC_BUILD_PLUGINS"), *f = getenv("GHC_AUTOMAGIC_FUSED");
    no_fused = f && strcmp(f, "0") == 0;
    fused(1);
    ghc_k_automagic_serial(getenv("GHC_AUTOMAGIC_SERIAL") != NULL);
    ghc_core_t *core = ghc_core_init();
    need(core && plugins && ghc_plugin_add_path(core, plugins) == 0 &&
         ghc_config_load_string(core, "mempolicy = { plugin = \"device\"; };", "b.cfg", NULL, NULL, 0) == 0 &&
         ghc_run_init(core) == 0, "setup (GHC_BUILD_PLUGINS set?)", core);
    static const int64_t io[10][2] = { { 5120, 5120 }, { 5120, 5120 }, { 5120, 5120 }, { 5120, 5120 }, { 5120, 5120 },
                                       { 5120, 5120 }, { 5120, 5120 }, { 5120, 5120 }, { 5120, 13824 }, { 13824, 5120 } };
    int32_t n = BLOCKS * 10 * 2;
    struct ghc_optim_tensor *aw = calloc((size_t)n, sizeof(*aw)), *am = calloc((size_t)n, sizeof(*am));
    int64_t total = 0;
    double am_bytes = 0.0;   /* automagic's state traffic a step */
    for (int32_t i = 0; i < n; i++) {
        const int64_t *m = io[(i / 2) % 10];
        int64_t r = i % 2 ? m[1] : RANK, c = i % 2 ? RANK : m[0];   /* A [r, in], B [out, r] */
        int64_t numel = r * c, words = (numel + 31) / 32;
        total += numel;
        am_bytes += am_traffic(r, c);
        aw[i].param = dev_tensor(core, GHC_DTYPE_F32, r, c, 0.01);
        aw[i].grad = dev_tensor(core, GHC_DTYPE_F32, r, c, 0.001);
        aw[i].state[0] = dev_tensor(core, GHC_DTYPE_F32, r, c, 0);
        aw[i].state[1] = dev_tensor(core, GHC_DTYPE_F32, r, c, 0);
        am[i].param = aw[i].param;
        am[i].grad = aw[i].grad;
        am[i].state[0] = dev_tensor(core, GHC_DTYPE_F32, r, 0, 0);
        am[i].state[1] = dev_tensor(core, GHC_DTYPE_F32, c, 0, 0);
        am[i].state[2] = dev_tensor(core, GHC_DTYPE_U8, numel, 0, 0);
        am[i].state[3] = dev_tensor(core, GHC_DTYPE_F32, 2, 0, 1e-6 / 127);
        am[i].state[4] = dev_tensor(core, GHC_DTYPE_I32, words, 0, 0);
        am[i].state[5] = dev_tensor(core, GHC_DTYPE_I32, words, 0, 0);
    }
    size_t cbytes = (size_t)1 << 30;
    void *src, *dst;
    need(cudaMalloc(&src, cbytes) == cudaSuccess && cudaMalloc(&dst, cbytes) == cudaSuccess, "cudaMalloc", NULL);
    cudaMemset(src, 1, cbytes);
    struct job copy = { .kind = 0, .src = src, .dst = dst, .bytes = cbytes };
    struct job jaw = { aw, n, 1, NULL, NULL, 0 }, jam = { am, n, 2, NULL, NULL, 0 };
    double copy_gbs = 2.0 * (double)cbytes / (time_ms(20, run_job, &copy) * 1e-3) / 1e9;
    float ms_aw = time_ms(20, run_job, &jaw);
    /* automagic as it runs (the thin tensors in one cluster each), with the new scale after
     * the update, and in the separate passes, in turn, twice: the better of each */
    static const int modes[3] = { 1, 2, 0 };
    float best_ms[3] = { 1e30f, 1e30f, 1e30f };
    for (int rep = 0; rep < 6; rep++) {
        fused(modes[rep % 3]);
        float ms = time_ms(20, run_job, &jam);
        if (ms < best_ms[rep % 3])
            best_ms[rep % 3] = ms;
    }
    const float ms_am = best_ms[0], ms_late = best_ms[1], ms_ps = best_ms[2];
    {   /* a build with -DAF_TRACE (kernels/cuda/optim_am_fused.cu): the clusters' phases in SM cycles, the
         * mean over the first cluster's 8 blocks and its 7th to 23rd wide K = 16 tensors */
        void (*tr)(long long *) = (void (*)(long long *))dlsym(RTLD_DEFAULT, "ghc_k_automagic_trace");
        if (tr) {
            static long long t[8][32][14];
            static const int from[9] = { 0, 1, 2, 6, 7, 8, 3, 4, 5 }, to[9] = { 1, 2, 6, 7, 8, 9, 4, 5, 0 };
            static const char *const what[9] = { "stage wait", "stats", "partials wait", "their sums",
                                                 "trees", "lane 0", "update", "end", "next" };
            double sum[9] = { 0 };
            fused(1);
            run_job(&jam);
            cudaDeviceSynchronize();
            tr(&t[0][0][0]);
            for (int b = 0; b < 8; b++)
                for (int k = 6; k < 23; k++)
                    for (int p = 0; p < 9; p++)
                        sum[p] += (double)(t[b][k + (p == 8)][to[p]] - t[b][k][from[p]]);
            printf("trace (SM cycles a tensor):");
            for (int p = 0; p < 9; p++)
                printf(" %s %.0f%s", what[p], sum[p] / (8 * 17), p < 8 ? "," : "\n");
            double gat = 0, psh = 0, wt = 0, wmin = 0;
            for (int k = 6; k < 23; k++) {
                long long mn = 1LL << 62;
                for (int b = 0; b < 8; b++) {
                    gat += (double)(t[b][k][12] - t[b][k][2]);
                    psh += (double)(t[b][k][13] - t[b][k][12]);
                    wt += (double)(t[b][k][6] - t[b][k][13]);
                    mn = t[b][k][6] - t[b][k][13] < mn ? t[b][k][6] - t[b][k][13] : mn;
                }
                wmin += (double)mn;
            }
            printf("trace: partials wait = gather %.0f, pushes %.0f, wait after pushing %.0f (the least of the "
                   "blocks %.0f) cycles\n",
                   gat / (8 * 17), psh / (8 * 17), wt / (8 * 17), wmin / 17);
        }
    }
    /* automagic on each kind of tensor alone (a list of those only): where the time goes */
    static const char *const kname[4] = { "A [16, 5120]", "B [5120, 16]", "A [16, 13824]", "B [13824, 16]" };
    double kind_ms[4], kind_pct[4];
    int32_t kind_n[4];
    for (int k = 0; k < 4; k++) {
        struct ghc_optim_tensor *sub = calloc((size_t)n, sizeof(*sub));
        double bytes = 0.0;
        int32_t m = 0;
        for (int32_t i = 0; i < n; i++) {
            const int64_t *d = ghc_tensor_shape(am[i].param);
            const int64_t len = i % 2 ? d[0] : d[1];
            if (i % 2 == k % 2 && (len == 13824) == (k >= 2)) {
                sub[m++] = am[i];
                bytes += am_traffic(d[0], d[1]);
            }
        }
        struct job js = { sub, m, 2, NULL, NULL, 0 };
        float best = 1e30f;
        fused(1);
        for (int rep = 0; rep < 2; rep++) {
            float ms = time_ms(20, run_job, &js);
            best = ms < best ? ms : best;
        }
        kind_ms[k] = best;
        kind_pct[k] = 100.0 * bytes / (best * 1e-3) / 1e9 / copy_gbs;
        kind_n[k] = m;
        free(sub);
    }
    fused(0);
    need(cudaGetLastError() == cudaSuccess, "launch", NULL);
    double pass[3];   /* each pass's time over synchronised calls, the separate passes */
    ghc_k_automagic_profile(1, NULL);
    for (int i = 0; i < 10; i++)
        run_job(&jam);
    ghc_k_automagic_profile(0, pass);
    fused(1);
    double gbs_aw = 28.0 * (double)total / (ms_aw * 1e-3) / 1e9, gbs_am = am_bytes / (ms_am * 1e-3) / 1e9;
    double gbs_ps = am_bytes / (ms_ps * 1e-3) / 1e9, gbs_p = 14.25 * (double)total / (ms_am * 1e-3) / 1e9;
    printf("params: %lld in %d tensors (A14B expert, LoRA r%d)\n", (long long)total, (int)n, RANK);
    printf("cudaMemcpy D2D: %.1f GB/s (read + write)\n", copy_gbs);
    printf("adamw:     %.3f ms/step, %.1f GB/s state traffic, %.0f%% of copy\n", ms_aw, gbs_aw, 100.0 * gbs_aw / copy_gbs);
    printf("automagic: %.3f ms/step, %.1f GB/s state traffic (%.2f B a param), %.1f%% of copy (14.25 B a param "
           "only: %.1f%%; a cluster a tensor; the new scale after the update: %.3f ms)\n",
           ms_am, gbs_am, am_bytes / (double)total, 100.0 * gbs_am / copy_gbs, 100.0 * gbs_p / copy_gbs, ms_late);
    printf("automagic, separate passes: %.3f ms/step, %.1f GB/s, %.1f%% of copy; per pass (synchronised calls): "
           "stats and finish %.3f, update %.3f, mask %.3f ms\n",
           ms_ps, gbs_ps, 100.0 * gbs_ps / copy_gbs, pass[0], pass[1], pass[2]);
    printf("automagic by kind of tensor (a list of those alone):");
    for (int k = 0; k < 4; k++)
        printf(" %s x %d: %.3f ms, %.1f%%%s", kname[k], (int)kind_n[k], kind_ms[k], kind_pct[k], k < 3 ? ";" : "\n");
    cudaFree(src);
    cudaFree(dst);
    ghc_core_free(core);   /* the process exits: tensors go with the device context */
    return 0;
}
