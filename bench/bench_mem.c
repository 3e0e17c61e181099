/* bench_mem.c: the memory policies on a multi-block A14B-dims training step (wan22, bf16,
 * checkpointing per block, forward + backward of the frozen base): step time under `device`,
 * `offload` (weights streamed per block from pinned memory) and `gh200_uvm` (telemetry on:
 * GPU page faults in the step after the batch's latents and text were prefetched); the
 * offload overhead against device; the pinned copy bandwidth and the rate offload streams at:
 * bytes copied over the time its copy stream spent copying them (CUDA events around each
 * block's copy, from the policy's stats), in the full step and in a 1-token step where compute
 * is negligible; and, for comparison, the 1-token step's bytes over its wall time (which also
 * holds the in-place reads of the weights outside the blocks and the waits for free ring
 * slots). Not a test: figures only.
 *   bench_mem [--layers N] [--tokens T] [--reps R] [--csv FILE] */
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
};

/* Median time of `reps` steps (after one warm-up) of the model under `policy`. */
#define A14B_DIMS "dim = 5120; ffn_dim = 13824; heads = 40;"

static int run(const char *policy, const char *dims, int layers, int64_t frames, int64_t hl, int64_t wl, int reps,
               struct result *r)
{
    char cfg[1024];
    snprintf(cfg, sizeof(cfg),
             "mempolicy = { %s };\nmodel = { plugin = \"wan22\"; dtype = \"bf16\"; device = 0; checkpointing = \"block\";\n"
             "  random = { %s layers = %d; seed = 1; }; };\n", policy, dims, layers);
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
    if (!noisy || !text || !ts || !out || !dout) {
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
            (rc = check(core, ghc_model_backward(m, 0, dout, NULL, NULL), "backward")) < 0)
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
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--layers"))
            layers = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--tokens"))
            tokens = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps"))
            reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--csv"))
            csv = argv[i + 1];
    }
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
        fprintf(stderr, "bench_mem: no CUDA device\n");
        return 77;
    }
    /* 480x832x81: latent 21 x 60 x 104, 32760 tokens; fewer tokens shrink the frames */
    int64_t frames = tokens / (30 * 52) > 0 ? tokens / (30 * 52) : 1;
    double pin = pinned_gbs();
    struct result dev = { 0 }, off = { 0 }, uvm = { 0 };
    printf("pinned H2D copy                 %8.1f GB/s\n", pin);
    fflush(stdout);
    int rc = run("plugin = \"device\";", A14B_DIMS, layers, frames, 60, 104, reps, &dev);
    printf("device step                     %8.3f s\n", dev.step_s);
    fflush(stdout);
    rc |= run("plugin = \"offload\";", A14B_DIMS, layers, frames, 60, 104, reps, &off);
    printf("offload step                    %8.3f s\n", off.step_s);
    fflush(stdout);
    /* page faults do not depend on the model's size: a small one with telemetry */
    rc |= run("plugin = \"gh200_uvm\"; telemetry = true;", "dim = 512; ffn_dim = 1024; heads = 4;", 4, frames, 60, 104,
              reps, &uvm);
    int64_t T = frames * 30 * 52;
    if (layers <= 2)
        printf("note: with %d blocks the offload ring (2 buffers) holds every block after the first step, so "
               "nothing is streamed; use --layers 4 or more\n", layers);
    printf("bench_mem: A14B dims, %d blocks, %lld tokens, bf16, checkpointing per block, fwd+bwd of the base\n",
           layers, (long long)T);
    printf("offload step                    %8.3f s   overhead %+.1f%% (target <= 15%%)\n", off.step_s,
           100.0 * (off.step_s / dev.step_s - 1.0));
    double gbs = off.stream_s > 0 ? off.streamed / off.stream_s / 1e9 : 0;
    double lite_gbs = off.lite_stream_s > 0 ? off.lite_streamed / off.lite_stream_s / 1e9 : 0;
    printf("offload streamed per step       %8.2f GB in %.3f s of copy-stream time\n", off.streamed / 1e9, off.stream_s);
    printf("offload streaming, full step    %8.1f GB/s  = %.0f%% of pinned (target >= 90%%)\n", gbs, 100.0 * gbs / pin);
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
            fprintf(f, "layers,tokens,pinned_gbs,device_s,offload_s,offload_overhead,stream_gbs,stream_1tok_gbs,wall_1tok_gbs,uvm_s,uvm_faults\n");
            fprintf(f, "%d,%lld,%.2f,%.4f,%.4f,%.4f,%.2f,%.2f,%.2f,%.4f,%.0f\n", layers, (long long)T, pin, dev.step_s,
                    off.step_s, off.step_s / dev.step_s - 1.0, gbs, lite_gbs, off.lite_streamed / off.lite_s / 1e9,
                    uvm.step_s, uvm.faults);
            fclose(f);
        }
    }
    return rc ? 1 : 0;
}
