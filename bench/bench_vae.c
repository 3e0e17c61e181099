/* bench_vae.c: our Wan VAE encode on the GPU (bench/vae.sh runs it beside diffusers). Makes the
 * `wanvae` vae plugin through the core as `gh200core prepare` does (a configuration with the
 * device memory policy and a vae section, ghc_run_init, ghc_vae_get) and encodes the clip of a
 * safetensors file (tensor "video", [3, F, H, W] f32 in [-1, 1]) through ghc_vae_encode: the clip
 * from the host, the latent back to it, as prepare hands them over (the copies are in the time).
 * One warm-up encode (cuDNN's plans, the pool's growth), then --iters timed ones (wall clock, the
 * result on the host). Prints the times, the device pool's peak during the timed encodes
 * (cudaMemPoolAttrUsedMemHigh: weights, activations, caches), the card's use after them
 * (cudaMemGetInfo less what was in use before the core started: the pool, the ops' scratch,
 * cuDNN's and cuBLASLt's workspaces) and which convolution path ran; writes the latent (f32,
 * normalised, [16, T, H / 8, W / 8]) to --out. Not a test: figures only (exit 1 when a run fails).
 *   bench_vae --weights FILE --video FILE [--out FILE] [--iters N] [--device N] [--dtype bf16|f32]
 *             [--conv auto|own] [--tile N] [--plugins DIR]
 * --tile N: the plugin's spatial tiling (tiles of N pixels every 3/4 N; doc/vae.md).
 * The plugins come from --plugins or $GHC_BUILD_PLUGINS (a build's plugins/.libs). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include <gh200core/gh200core.h>
#include <gh200core/encoder.h>
#include <gh200core/ops.h>
#include <gh200core/safetensors.h>

#include "../kernels/cuda/kernels.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int usage(void)
{
    fprintf(stderr, "usage: bench_vae --weights FILE --video FILE [--out FILE] [--iters N] [--device N] "
                    "[--dtype bf16|f32] [--conv auto|own] [--tile N] [--plugins DIR]\n");
    return 2;
}

static int fail(ghc_core_t *core, const char *what)
{
    fprintf(stderr, "bench_vae: %s: %s\n", what, core ? ghc_error_message(core) : "no core");
    return 1;
}

int main(int argc, char **argv)
{
    const char *weights = NULL, *video_path = NULL, *out = NULL, *dtype = "bf16", *conv = "auto";
    const char *plugins = getenv("GHC_BUILD_PLUGINS");
    int iters = 3, device = 0, tile = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            return usage();
        if (!strcmp(a, "--weights"))
            weights = v;
        else if (!strcmp(a, "--video"))
            video_path = v;
        else if (!strcmp(a, "--out"))
            out = v;
        else if (!strcmp(a, "--iters"))
            iters = atoi(v);
        else if (!strcmp(a, "--device"))
            device = atoi(v);
        else if (!strcmp(a, "--dtype"))
            dtype = v;
        else if (!strcmp(a, "--conv"))
            conv = v;
        else if (!strcmp(a, "--tile"))
            tile = atoi(v);
        else if (!strcmp(a, "--plugins"))
            plugins = v;
        else
            return usage();
        i++;
    }
    if (!weights || !video_path || iters < 1 || device < 0 || tile < 0 || (strcmp(dtype, "bf16") && strcmp(dtype, "f32")) ||
        (strcmp(conv, "auto") && strcmp(conv, "own")))
        return usage();
    if (!strcmp(conv, "own"))
        ghc_k_conv_impl(GHC_K_CONV_OWN);
    size_t fr0 = 0, tot = 0;
    cudaSetDevice(device);
    if (cudaMemGetInfo(&fr0, &tot) != cudaSuccess) {
        fprintf(stderr, "bench_vae: no CUDA device %d\n", device);
        return 1;
    }
    ghc_core_t *core = ghc_core_init();
    char cfg[4096];
    snprintf(cfg, sizeof(cfg), "mempolicy = { plugin = \"device\"; };\nvae = { plugin = \"wanvae\"; path = \"%s\"; "
             "device = %d; dtype = \"%s\"; tile = %d; };\n", weights, device, dtype, tile);
    if (!core || (plugins && ghc_plugin_add_path(core, plugins) < 0) ||
        ghc_config_load_string(core, cfg, "bench_vae.cfg", NULL, NULL, 0) < 0 || ghc_run_init(core) < 0)
        return fail(core, "setup");
    double t0 = now();
    ghc_vae_t *vae = ghc_vae_get(core);
    if (!vae)
        return fail(core, weights);
    fprintf(stderr, "bench_vae: VAE loaded in %.1f s\n", now() - t0);
    ghc_st_t *st = ghc_st_open(core, video_path);
    ghc_tensor_t *video = st ? ghc_st_load(st, "video", GHC_DTYPE_F32, GHC_ROLE_WORKSPACE) : NULL;
    ghc_st_free(st);
    if (!video)
        return fail(core, video_path);
    const int64_t *sh = ghc_tensor_shape(video);
    printf("bench_vae: clip [3, %lld, %lld, %lld], %s activations, device %d, cuDNN %d, tile %d\n", (long long)sh[1],
           (long long)sh[2], (long long)sh[3], dtype, device, ghc_k_cudnn_version(), tile);
    ghc_tensor_t *lat = NULL;
    t0 = now();
    if (ghc_vae_encode(vae, video, &lat) < 0)
        return fail(core, "encode (warm-up)");
    printf("bench_vae: warm-up encode %.3f s\n", now() - t0);
    ghc_tensor_free(lat);
    lat = NULL;
    cudaMemPool_t pool = NULL;
    uint64_t zero = 0, high = 0;
    cudaDeviceSynchronize();
    if (cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess)
        cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero);
    cudaGetLastError();
    double best = 1e30, sum = 0;
    for (int i = 0; i < iters; i++) {
        ghc_tensor_free(lat);
        lat = NULL;
        t0 = now();
        if (ghc_vae_encode(vae, video, &lat) < 0)
            return fail(core, "encode");
        const double t = now() - t0;
        printf("bench_vae: encode %d: %.3f s\n", i + 1, t);
        best = t < best ? t : best;
        sum += t;
    }
    size_t fr = 0;
    cudaMemGetInfo(&fr, &tot);
    if (pool)
        cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high);
    /* BENCH_PROFILE=FILE: one more encode, its GPU time by kernel (CUPTI) into FILE */
    const char *prof = getenv("BENCH_PROFILE");
    FILE *pf = prof && *prof ? fopen(prof, "w") : NULL;
    if (pf) {
        ghc_tensor_free(lat);
        lat = NULL;
        if (ghc_op_profile_start(core, device) < 0 || ghc_vae_encode(vae, video, &lat) < 0 ||
            ghc_op_profile_stop(core, device, pf, 1, "bench_vae: one encode") < 0)
            fprintf(stderr, "bench_vae: profile: %s\n", ghc_error_message(core));
        fclose(pf);
    }
    cudaGetLastError();
    const double gib = 1024.0 * 1024.0 * 1024.0;
    /* one line for bench/vae.sh */
    printf("RESULT ours time_s=%.4f mean_s=%.4f pool_peak_gib=%.3f card_gib=%.3f conv=%s\n", best, sum / iters,
           (double)high / gib, (double)(fr0 > fr ? fr0 - fr : 0) / gib, ghc_k_conv_last());
    if (out) {
        ghc_st_writer_t *w = ghc_st_writer_init(core);
        if (!w || ghc_st_writer_add(w, "latent", lat) < 0 || ghc_st_writer_finish(w, out) < 0)
            return fail(core, out);
        ghc_st_writer_free(w);
    }
    ghc_tensor_free(lat);
    ghc_tensor_free(video);
    ghc_core_free(core);
    return 0;
}
