/* bench_mem.c: the memory policies on a multi-block A14B-dims training step (wan22, bf16,
 * checkpointing per block, forward + backward of the frozen base): step time under `device`,
 * `offload` (weights streamed per block from pinned memory) and `gh200_uvm` (telemetry on:
 * GPU page faults in the step after the batch's latents and text were prefetched); the
 * offload overhead against device; the pinned copy bandwidth and the rate offload streams at:
 * bytes copied over the time its copy stream spent copying them (CUDA events around each
 * block's copy, from the policy's stats), in the full step and in a 1-token step where compute
 * is negligible; and, for comparison, the 1-token step's bytes over its wall time (which also
 * holds the in-place reads of the weights outside the blocks and the waits for free ring
 * slots). Then saved activations (issue 23): device vs offload with the saved units (block
 * inputs) in pinned host memory through its saved ring, with checkpointing "block" and
 * "block_attn" (the attention output kept: no attention forward in the recomputation): step
 * time, the device pool's peak (cudaMemPoolAttrUsedMemHigh, reset per run: weights,
 * activations and rings; pinned host memory is not in it), the card's use after the steps
 * (cudaMemGetInfo, the pool trimmed between runs), the saved role and what went home and back
 * per step, whether the prediction (and so the loss) is the same bits in every run (gh200_uvm
 * with its saved ring too), and d noisy's largest difference (attention's dQ is summed with
 * atomics: a second device run gives the run-to-run floor). Not a test: figures only (exit 1
 * only when a run failed or the predictions differ).
 * --attention own keeps to our attention kernels (default: cuDNN's where it loads).
 *   bench_mem [--layers N] [--tokens T] [--reps R] [--csv FILE] [--saved-only] [--attention own|auto] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include <gh200core/gh200core.h>
#include <gh200core/mempolicy.h>
#include <gh200core/model.h>
#include <gh200core/ops.h>

#include "../kernels/cuda/kernels.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int check(ghc_core_t *core, int rc, const char *what)
{
    if (rc < 0)
        fprintf(stderr, "bench_mem: %s: %s\n", what, ghc_error_message(core));
    return rc;
}

static ghc_tensor_t *filled(ghc_core_t *core, int ndim, const int64_t *shape, enum ghc_mem_role role, float scale)
{
    ghc_tensor_t *h = ghc_tensor_init(core, GHC_DTYPE_F32, ndim, shape, GHC_DEVICE_CPU, GHC_ROLE_WORKSPACE);
    ghc_tensor_t *d = ghc_tensor_init(core, GHC_DTYPE_F32, ndim, shape, 0, role);
    if (!h || !d)
        return NULL;
    float *p = ghc_tensor_data(h);
    for (int64_t i = 0; i < ghc_tensor_numel(h); i++)
        p[i] = scale * (float)sin(0.001 * (double)i + 0.3);
    ghc_op_copy(d, h, NULL);
    ghc_op_sync(core, 0, NULL);
    ghc_tensor_free(h);
    return d;
}

struct result {
    double step_s, streamed, stream_s, faults, htod;
    double lite_s, lite_streamed, lite_stream_s;   /* a 1-token step: the weight copies alone */
    double pool_peak, card_used;                   /* bytes: the pool's high-water mark, the card's use */
    double saved, saved_out, saved_in, saved_hits, saved_ring;   /* the role; per step: home, back, hits; ring */
    double loss;                                   /* mean(out^2) of the last step */
    uint64_t out_hash, dx_hash;                    /* FNV-1a of the prediction's and d noisy's bytes */
    float   *dx;                                   /* d noisy of the last step (host copy; freed by main) */
    size_t   n;
};

/* max |a - b| / max |b|: d noisy sums attention's dQ with atomics (in no fixed order), so it
 * may differ in the last bits from run to run even under one policy */
static double max_rel(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]), m = fabs((double)b[i]);
        num = d > num ? d : num;
        den = m > den ? m : den;
    }
    return den > 0 ? num / den : num;
}

static uint64_t fnv(const void *p, size_t n, uint64_t h)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* The default pool of device 0 (the device and offload policies' caching pool). */
static cudaMemPool_t pool0(void)
{
    cudaMemPool_t p = NULL;
    cudaDeviceGetDefaultMemPool(&p, 0);
    return p;
}

/* Median time of `reps` steps (after one warm-up) of the model under `policy`. */
#define A14B_DIMS "dim = 5120; ffn_dim = 13824; heads = 40;"

static int run(const char *policy, const char *ckpt, const char *dims, int layers, int64_t frames, int64_t hl,
               int64_t wl, int reps, bool lite, struct result *r)
{
    char cfg[1024];
    snprintf(cfg, sizeof(cfg),
             "mempolicy = { %s };\nmodel = { plugin = \"wan22\"; dtype = \"bf16\"; device = 0; checkpointing = \"%s\";\n"
             "  random = { %s layers = %d; seed = 1; }; };\n", policy, ckpt, dims, layers);
    /* the card as the previous run left it: cached pool memory back, the high-water mark reset */
    cudaDeviceSynchronize();
    cudaMemPool_t pool = pool0();
    uint64_t zero = 0;
    if (pool) {
        cudaMemPoolTrimTo(pool, 0);
        cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero);
    }
    cudaGetLastError();
    double t_init = now();
    ghc_core_t *core = ghc_core_init();
    int rc = 0;
    const char *pp = getenv("GHC_BUILD_PLUGINS");
    if (pp)
        ghc_plugin_add_path(core, pp);
    if ((rc = check(core, ghc_config_load_string(core, cfg, "bench.cfg", NULL, NULL, 0), "config")) < 0 ||
        (rc = check(core, ghc_run_init(core), "run")) < 0)
        goto out;
    ghc_model_t *m = ghc_model_get(core);
    ghc_mempolicy_t *mp = ghc_mempolicy_get(core);
    fprintf(stderr, "bench_mem: %s ready in %.1f s\n", policy, now() - t_init);
    const int64_t lat[5] = { 1, 16, frames, hl, wl };
    ghc_tensor_t *noisy = filled(core, 5, lat, GHC_ROLE_LATENTS, 1.0f);
    ghc_tensor_t *text = filled(core, 3, (const int64_t[]){ 1, 64, 4096 }, GHC_ROLE_TEXT_EMBEDS, 0.5f);
    ghc_tensor_t *ts = filled(core, 1, (const int64_t[]){ 1 }, GHC_ROLE_WORKSPACE, 0.0f);
    ghc_tensor_t *out = filled(core, 5, lat, GHC_ROLE_ACTIVATIONS, 0.0f);
    ghc_tensor_t *dout = filled(core, 5, lat, GHC_ROLE_ACTIVATIONS, 1e-3f);
    ghc_tensor_t *dx = filled(core, 5, lat, GHC_ROLE_ACTIVATIONS, 0.0f);
    if (!noisy || !text || !ts || !out || !dout || !dx) {
        rc = check(core, GHC_ENOMEM, "batch");
        goto out;
    }
    struct ghc_model_batch b = { .noisy = noisy, .timesteps = ts, .text_embed = text };
    double t[16];
    struct ghc_mem_stats st0 = { .struct_size = sizeof(st0) }, st = st0;
    for (int i = 0; i <= reps && i < 16; i++) {
        ghc_mem_stats(mp, &st0);
        cudaDeviceSynchronize();
        double t0 = now();
        ghc_mem_phase(mp, GHC_PHASE_STEP_BEGIN, i);
        ghc_mem_prefetch(mp, ghc_tensor_data(noisy), ghc_tensor_nbytes(noisy), 0, NULL);
        ghc_mem_prefetch(mp, ghc_tensor_data(text), ghc_tensor_nbytes(text), 0, NULL);
        if ((rc = check(core, ghc_model_forward(m, 0, &b, out, true, NULL), "forward")) < 0 ||
            (rc = check(core, ghc_model_backward(m, 0, dout, dx, NULL), "backward")) < 0)
            goto out;
        cudaDeviceSynchronize();
        t[i] = now() - t0;
        ghc_mem_phase(mp, GHC_PHASE_STEP_END, i);   /* telemetry: counters of this step */
        st = (struct ghc_mem_stats){ .struct_size = sizeof(st) };
        ghc_mem_stats(mp, &st);
    }
    for (int i = 1; i <= reps; i++)   /* sort the timed ones, 1..reps */
        for (int j = i + 1; j <= reps; j++)
            if (t[j] < t[i]) {
                double x = t[i];
                t[i] = t[j];
                t[j] = x;
            }
    r->step_s = t[1 + reps / 2];
    r->streamed = (double)(st.streamed_bytes - st0.streamed_bytes);
    r->stream_s = (double)(st.stream_ns - st0.stream_ns) * 1e-9;
    r->faults = (double)st.page_faults;
    r->htod = (double)st.bytes_htod;
    r->saved = (double)st.bytes_role[GHC_ROLE_SAVED];
    r->saved_out = (double)(st.saved_out_bytes - st0.saved_out_bytes);
    r->saved_in = (double)(st.saved_in_bytes - st0.saved_in_bytes);
    r->saved_hits = (double)(st.saved_hits - st0.saved_hits);
    r->saved_ring = (double)st.saved_ring_bytes;
    {   /* the last step's prediction and d noisy, as bytes */
        size_t n = (size_t)ghc_tensor_numel(out);
        float *h = malloc(n * sizeof(float));
        if (h) {
            cudaMemcpy(h, ghc_tensor_data(out), n * sizeof(float), cudaMemcpyDeviceToHost);
            double sum = 0;
            for (size_t k = 0; k < n; k++)
                sum += (double)h[k] * h[k];
            r->loss = sum / (double)n;
            r->out_hash = fnv(h, n * sizeof(float), 0xcbf29ce484222325ull);
            cudaMemcpy(h, ghc_tensor_data(dx), n * sizeof(float), cudaMemcpyDeviceToHost);
            r->dx_hash = fnv(h, n * sizeof(float), 0xcbf29ce484222325ull);
            free(r->dx);
            r->dx = h;
            r->n = n;
        }
    }
    size_t fr = 0, tot = 0;
    uint64_t high = 0;
    if (cudaMemGetInfo(&fr, &tot) == cudaSuccess)
        r->card_used = (double)(tot - fr);
    if (pool && cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high) == cudaSuccess)
        r->pool_peak = (double)high;
    cudaGetLastError();
    if (!lite)
        goto done;
    /* one token: compute is negligible, the step is the weight traffic (offload) */
    ghc_tensor_t *n1 = filled(core, 5, (const int64_t[]){ 1, 16, 1, 2, 2 }, GHC_ROLE_LATENTS, 1.0f);
    ghc_tensor_t *o1 = filled(core, 5, (const int64_t[]){ 1, 16, 1, 2, 2 }, GHC_ROLE_ACTIVATIONS, 0.0f);
    ghc_tensor_t *d1 = filled(core, 5, (const int64_t[]){ 1, 16, 1, 2, 2 }, GHC_ROLE_ACTIVATIONS, 1e-3f);
    struct ghc_model_batch b1 = { .noisy = n1, .timesteps = ts, .text_embed = text };
    for (int i = 0; i < 2 && n1 && o1 && d1; i++) {
        ghc_mem_stats(mp, &st0);
        cudaDeviceSynchronize();
        double t0 = now();
        if ((rc = check(core, ghc_model_forward(m, 0, &b1, o1, true, NULL), "forward")) < 0 ||
            (rc = check(core, ghc_model_backward(m, 0, d1, NULL, NULL), "backward")) < 0)
            break;
        cudaDeviceSynchronize();
        r->lite_s = now() - t0;
        ghc_mem_stats(mp, &st);
        r->lite_streamed = (double)(st.streamed_bytes - st0.streamed_bytes);
        r->lite_stream_s = (double)(st.stream_ns - st0.stream_ns) * 1e-9;
    }
    ghc_tensor_free(n1);
    ghc_tensor_free(o1);
    ghc_tensor_free(d1);
done:
    ghc_tensor_free(dx);
    ghc_tensor_free(noisy);
    ghc_tensor_free(text);
    ghc_tensor_free(ts);
    ghc_tensor_free(out);
    ghc_tensor_free(dout);
out:
    ghc_core_free(core);
    return rc;
}

static double pinned_gbs(void)
{
    size_t n = (size_t)1 << 30;
    void *h = NULL, *d = NULL;
    cudaEvent_t a, b;
    float ms = 0;
    if (cudaMallocHost(&h, n) != cudaSuccess || cudaMalloc(&d, n) != cudaSuccess)
        return -1;
    memset(h, 1, n);
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    cudaMemcpy(d, h, n, cudaMemcpyHostToDevice);
    cudaEventRecord(a, NULL);
    for (int i = 0; i < 3; i++)
        cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, NULL);
    cudaEventRecord(b, NULL);
    cudaEventSynchronize(b);
    cudaEventElapsedTime(&ms, a, b);
    cudaFree(d);
    cudaFreeHost(h);
    return 3.0 * (double)n / (ms * 1e-3) / 1e9;
}

int main(int argc, char **argv)
{
    int layers = 4, reps = 3;
    int64_t tokens = 32760;
    const char *csv = NULL;
    bool saved_only = false;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : "0";
        if (!strcmp(argv[i], "--saved-only"))
            saved_only = true;
        else if (!strcmp(argv[i], "--layers"))
            layers = atoi(v), i++;
        else if (!strcmp(argv[i], "--tokens"))
            tokens = atoll(v), i++;
        else if (!strcmp(argv[i], "--reps"))
            reps = atoi(v), i++;
        else if (!strcmp(argv[i], "--csv"))
            csv = v, i++;
        else if (!strcmp(argv[i], "--attention"))
            ghc_k_attention_impl(!strcmp(v, "own") ? GHC_K_ATTN_OWN : GHC_K_ATTN_AUTO), i++;
    }
    if (reps < 1)
        reps = 1;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
        fprintf(stderr, "bench_mem: no CUDA device\n");
        return 77;
    }
    /* 480x832x81: latent 21 x 60 x 104, 32760 tokens; fewer tokens shrink the frames */
    int64_t frames = tokens / (30 * 52) > 0 ? tokens / (30 * 52) : 1;
    int64_t T = frames * 30 * 52;
    double pin = pinned_gbs();
    int rc = 0;
    printf("attention                       %s (cuDNN %d)\n",
           ghc_k_attention_impl(-1) == GHC_K_ATTN_OWN ? "ours" : "cuDNN's where it takes the problem",
           ghc_k_cudnn_version());
    printf("pinned H2D copy                 %8.1f GB/s\n", pin);
    fflush(stdout);
    if (!saved_only) {
        struct result dev = { 0 }, off = { 0 }, uvm = { 0 };
        rc |= run("plugin = \"device\";", "block", A14B_DIMS, layers, frames, 60, 104, reps, true, &dev);
        printf("device step                     %8.3f s\n", dev.step_s);
        fflush(stdout);
        /* the weights alone streamed: the saved activations on the device, as before them */
        rc |= run("plugin = \"offload\"; saved = \"device\";", "block", A14B_DIMS, layers, frames, 60, 104, reps, true,
                  &off);
        printf("offload step                    %8.3f s\n", off.step_s);
        fflush(stdout);
        /* page faults do not depend on the model's size: a small one with telemetry */
        rc |= run("plugin = \"gh200_uvm\"; telemetry = true;", "block", "dim = 512; ffn_dim = 1024; heads = 4;", 4,
                  frames, 60, 104, reps, true, &uvm);
        if (layers <= 2)
            printf("note: with %d blocks the offload ring (2 buffers) holds every block after the first step, so "
                   "nothing is streamed; use --layers 4 or more\n", layers);
        printf("bench_mem: A14B dims, %d blocks, %lld tokens, bf16, checkpointing per block, fwd+bwd of the base\n",
               layers, (long long)T);
        printf("offload step                    %8.3f s   overhead %+.1f%% (target <= 15%%)\n", off.step_s,
               100.0 * (off.step_s / dev.step_s - 1.0));
        double gbs = off.stream_s > 0 ? off.streamed / off.stream_s / 1e9 : 0;
        double lite_gbs = off.lite_stream_s > 0 ? off.lite_streamed / off.lite_stream_s / 1e9 : 0;
        printf("offload streamed per step       %8.2f GB in %.3f s of copy-stream time\n", off.streamed / 1e9,
               off.stream_s);
        printf("offload streaming, full step    %8.1f GB/s  = %.0f%% of pinned (target >= 90%%)\n", gbs,
               100.0 * gbs / pin);
        printf("offload streaming, 1 token      %8.1f GB/s  = %.0f%% of pinned (%.2f GB in %.3f s of copy-stream time)\n",
               lite_gbs, 100.0 * lite_gbs / pin, off.lite_streamed / 1e9, off.lite_stream_s);
        printf("device 1-token step             %8.3f s\n", dev.lite_s);
        printf("offload 1-token step            %8.3f s   streamed bytes / step time %.1f GB/s = %.0f%% of pinned "
               "(holds in-place reads and waits for ring slots)\n", off.lite_s, off.lite_streamed / off.lite_s / 1e9,
               100.0 * off.lite_streamed / off.lite_s / 1e9 / pin);
        printf("gh200_uvm (dim 512) step        %8.3f s   GPU page faults %.0f, migrated H2D %.1f MiB (last step)\n",
               uvm.step_s, uvm.faults, uvm.htod / 1048576.0);
        if (csv) {
            FILE *f = fopen(csv, "w");
            if (f) {
                fprintf(f, "layers,tokens,pinned_gbs,device_s,offload_s,offload_overhead,stream_gbs,stream_1tok_gbs,"
                        "wall_1tok_gbs,uvm_s,uvm_faults\n");
                fprintf(f, "%d,%lld,%.2f,%.4f,%.4f,%.4f,%.2f,%.2f,%.2f,%.4f,%.0f\n", layers, (long long)T, pin,
                        dev.step_s, off.step_s, off.step_s / dev.step_s - 1.0, gbs, lite_gbs,
                        off.lite_streamed / off.lite_s / 1e9, uvm.step_s, uvm.faults);
                fclose(f);
            }
        }
        fflush(stdout);
    }

    /* ---- saved activations: on the card vs pinned on the host, "block" vs "block_attn" ---- */
    enum { NS = 7 };
    static const struct { const char *name, *policy, *ckpt; } sv[NS] = {
        { "device, block", "plugin = \"device\";", "block" },
        { "device, block (again)", "plugin = \"device\";", "block" },   /* the run-to-run floor of d noisy */
        { "offload saved=device, block", "plugin = \"offload\"; saved = \"device\";", "block" },
        { "offload saved=host, block", "plugin = \"offload\"; saved = \"host\";", "block" },
        { "device, block_attn", "plugin = \"device\";", "block_attn" },
        { "offload saved=host, block_attn", "plugin = \"offload\"; saved = \"host\";", "block_attn" },
        { "gh200_uvm saved=host, block_attn", "plugin = \"gh200_uvm\"; saved = \"host\";", "block_attn" },
    };
    struct result r[NS] = { 0 };
    int failed[NS] = { 0 };
    for (int k = 0; k < NS; k++) {
        failed[k] = run(sv[k].policy, sv[k].ckpt, A14B_DIMS, layers, frames, 60, 104, reps, false, &r[k]) != 0;
        rc |= failed[k];
        fprintf(stderr, "bench_mem: %s: %.3f s/step\n", sv[k].name, r[k].step_s);
    }
    printf("\nbench_mem: saved activations, A14B dims, %d blocks, %lld tokens, bf16 (median of %d steps; GiB = 2^30 B, "
           "GB = 1e9 B)\n", layers, (long long)T, reps);
    printf("%-32s %8s %8s %10s %10s %12s %18s %6s %9s  %-16s %s\n", "run", "s/step", "vs run1", "pool peak",
           "card used", "saved GiB", "home/back GB/step", "hits", "ring GiB", "loss", "prediction, d noisy vs run 1");
    bool same = true;
    for (int k = 0; k < NS; k++) {
        if (failed[k]) {
            printf("%-32s failed\n", sv[k].name);
            continue;
        }
        bool bits = r[k].out_hash == r[0].out_hash;
        same = same && bits && !failed[0];
        char dxs[64] = "-";
        if (r[k].dx_hash == r[0].dx_hash)
            snprintf(dxs, sizeof(dxs), "same bits");
        else if (r[k].dx && r[0].dx && r[k].n == r[0].n)
            snprintf(dxs, sizeof(dxs), "max rel %.2g", max_rel(r[k].dx, r[0].dx, r[k].n));
        printf("%-32s %8.3f %+7.1f%% %10.2f %10.2f %7.2f %-4s %8.2f / %-7.2f %6.0f %9.2f  %-16.9g %s, %s\n", sv[k].name,
               r[k].step_s, 100.0 * (r[k].step_s / r[0].step_s - 1.0), r[k].pool_peak / 1073741824.0,
               r[k].card_used / 1073741824.0, r[k].saved / 1073741824.0, r[k].saved_out > 0 ? "host" : "card",
               r[k].saved_out / 1e9, r[k].saved_in / 1e9, r[k].saved_hits, r[k].saved_ring / 1073741824.0, r[k].loss,
               bits ? "same bits" : "BITS DIFFER", dxs);
    }
    printf("prediction and loss: %s across the %d runs (d noisy: attention's dQ is summed with atomics, so its last "
           "bits may vary from run to run: compare with run 2, the same as run 1)\n",
           same ? "the same bits" : "DIFFERENT bits", NS);
    if (r[0].step_s > 0 && r[2].step_s > 0 && r[3].step_s > 0 && r[4].step_s > 0 && r[5].step_s > 0)
        printf("offload, saved pinned on the host instead of on the card (block): %+.1f%% step time, pool peak %.2f -> "
               "%.2f GiB; block_attn instead of block: %+.1f%% step time and %+.2f GiB pool peak on the card (device), "
               "%+.1f%% step time with the saved units on the host (offload)\n",
               100.0 * (r[3].step_s / r[2].step_s - 1.0), r[2].pool_peak / 1073741824.0, r[3].pool_peak / 1073741824.0,
               100.0 * (r[4].step_s / r[0].step_s - 1.0), (r[4].pool_peak - r[0].pool_peak) / 1073741824.0,
               100.0 * (r[5].step_s / r[3].step_s - 1.0));
    for (int k = 0; k < NS; k++)
        free(r[k].dx);
    return rc || !same ? 1 : 0;
}
