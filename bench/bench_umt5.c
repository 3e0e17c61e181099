/* bench_umt5.c: our umT5 encoder forward on a GPU, the C side of bench/umt5.sh. Loads a checkpoint
 * (the random umT5-XXL bench/umt5_ref.py writes, or any umT5 safetensors) through the core's
 * `device` memory policy, as `gh200core prepare` gets its text encoder's memory, runs the batch
 * of prompts of an inputs file (I32 "ids" and "mask" [B, L]) through ghc_umt5_encode_batch (the
 * batched form of what the `umt5` plugin runs per caption: host ids in, host f32 embeddings
 * out, each call ending in a synchronisation), and prints one line of results:
 *
 *   ours: load_s=... encode_ms=<mean> min_ms=... per_prompt_ms=... pool_peak_gib=... card_gib=... B=... L=...
 *
 * encode_ms is the mean wall time of --iters calls after --warmup; per_prompt_ms the time of the
 * same prompts one by one on their true tokens (ghc_umt5_encode without a mask, as the plugin
 * encodes a caption for `prepare`), the mean over --iters rounds; pool_peak_gib the device
 * pool's high-water mark over the timed calls (weights, activations; reset after the load),
 * card_gib the card's memory in use after them (cudaMemGetInfo: also the kernels' scratch,
 * cuBLASLt's workspace and the CUDA context). --out writes the outputs as "out" f32 [B, L, D]
 * (the rows past each prompt's length 0) for bench/umt5_ref.py to compare.
 *
 *   bench_umt5 --weights W.safetensors --inputs I.safetensors [--out O.safetensors]
 *              [--dtype bf16|f32] [--device N] [--warmup 1] [--iters 3] [--plugins DIR]
 *
 * --device -1 runs on the CPU under the `host` policy (a check of the driver without a GPU; the
 * memory columns are then 0).
 * Exit status 0, 1 when a step fails (the message names it), 2 for bad arguments. */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include <gh200core/gh200core.h>
#include <gh200core/ops.h>
#include <gh200core/safetensors.h>

#include "../plugins/umt5/umt5.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int usage(const char *why)
{
    fprintf(stderr, "bench_umt5: %s\nusage: bench_umt5 --weights W.safetensors --inputs I.safetensors "
            "[--out O.safetensors] [--dtype bf16|f32] [--device N] [--warmup N] [--iters N] [--plugins DIR]\n", why);
    return 2;
}

/* Write the outputs as "out" f32 [B, L, D], rows past each prompt's length 0. */
static int write_out(ghc_core_t *core, const char *path, ghc_tensor_t *const *y, int32_t B, int32_t L, int64_t D)
{
    float *all = calloc((size_t)B * (size_t)L * (size_t)D, sizeof(float));
    if (!all)
        return ghc_error_set(core, GHC_ENOMEM, "bench_umt5: out of memory for the outputs");
    for (int32_t b = 0; b < B; b++)
        memcpy(all + (size_t)b * (size_t)L * (size_t)D, ghc_tensor_cdata(y[b]), ghc_tensor_nbytes(y[b]));
    ghc_st_writer_t *w = ghc_st_writer_init(core);
    int rc = !w ? GHC_ENOMEM : ghc_st_writer_add_raw(w, "out", GHC_DTYPE_F32, 3, (const int64_t[]){ B, L, D }, all);
    if (rc == 0)
        rc = ghc_st_writer_finish(w, path);
    ghc_st_writer_free(w);
    free(all);
    return rc;
}

int main(int argc, char **argv)
{
    const char *weights = NULL, *inputs = NULL, *out = NULL, *dtype = "bf16", *plugins = getenv("GHC_PLUGIN_PATH");
    int device = 0, warmup = 1, iters = 3;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            return usage("an option lacks its value");
        if (!strcmp(a, "--weights")) weights = v;
        else if (!strcmp(a, "--inputs")) inputs = v;
        else if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--dtype")) dtype = v;
        else if (!strcmp(a, "--device")) device = atoi(v);
        else if (!strcmp(a, "--warmup")) warmup = atoi(v);
        else if (!strcmp(a, "--iters")) iters = atoi(v);
        else if (!strcmp(a, "--plugins")) plugins = v;
        else return usage("unknown option");
        i++;
    }
    if (!weights || !inputs || iters < 1 || warmup < 0 || device < -1)
        return usage("--weights and --inputs are needed; --iters >= 1, --warmup >= 0, --device >= -1");
    if (strcmp(dtype, "bf16") && strcmp(dtype, "f32"))
        return usage("--dtype is bf16 or f32");
    if (!plugins || !*plugins)
        return usage("no plugin folder: --plugins DIR or GHC_PLUGIN_PATH (the build's plugins/.libs)");

    ghc_core_t *core = ghc_core_init();
    ghc_umt5_t *enc = NULL;
    ghc_st_t *st = NULL;
    ghc_tensor_t *ids = NULL, *mask = NULL, **y = NULL;
    int rc = 1;
    char cfg[128];
    /* the `device` policy on a GPU; --device -1 (a check of the driver on a CPU): `host` */
    snprintf(cfg, sizeof(cfg), "mempolicy = { plugin = \"%s\"; };\n", device < 0 ? "host" : "device");
    if (!core || ghc_plugin_add_path(core, plugins) || ghc_config_load_string(core, cfg, "bench_umt5", NULL, NULL, 0) ||
        ghc_run_init(core))
        goto fail;
    if (!(st = ghc_st_open(core, inputs)) || !(ids = ghc_st_load(st, "ids", GHC_DTYPE_I32, GHC_ROLE_WORKSPACE)) ||
        !(mask = ghc_st_load(st, "mask", GHC_DTYPE_I32, GHC_ROLE_WORKSPACE)))
        goto fail;
    if (ghc_tensor_ndim(ids) != 2 || !ghc_tensor_same_shape(ids, mask)) {
        ghc_error_set(core, GHC_EFORMAT, "%s: 'ids' and 'mask' must both be [B, L]", inputs);
        goto fail;
    }
    const int32_t B = (int32_t)ghc_tensor_dim(ids, 0), L = (int32_t)ghc_tensor_dim(ids, 1);
    const struct ghc_umt5_place place = { device, strcmp(dtype, "bf16") ? GHC_DTYPE_F32 : GHC_DTYPE_BF16 };
    double t0 = now_s();
    if (!(enc = ghc_umt5_init(core, weights, NULL, &place)))
        goto fail;
    const double load_s = now_s() - t0;
    if (!(y = calloc((size_t)B, sizeof(*y))))
        goto fail;
    for (int i = 0; i < warmup; i++) {
        if (ghc_umt5_encode_batch(enc, ghc_tensor_cdata(ids), ghc_tensor_cdata(mask), B, L, y) < 0)
            goto fail;
        for (int32_t b = 0; b < B; b++)
            ghc_tensor_free(y[b]);
    }
    /* the pool's high-water mark from here: the weights (live) plus the encode's peak */
    cudaMemPool_t pool = NULL;
    uint64_t zero = 0, high = 0;
    if (device >= 0 && cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess)
        cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero);
    double sum = 0.0, best = 1e30;
    for (int i = 0; i < iters; i++) {
        t0 = now_s();
        if (ghc_umt5_encode_batch(enc, ghc_tensor_cdata(ids), ghc_tensor_cdata(mask), B, L, y) < 0)
            goto fail;
        const double t = now_s() - t0;
        sum += t;
        best = t < best ? t : best;
        if (i + 1 < iters)
            for (int32_t b = 0; b < B; b++)
                ghc_tensor_free(y[b]);
    }
    /* BENCH_PROFILE=FILE: one more batch, its GPU time by kernel (CUPTI) into FILE */
    const char *prof = getenv("BENCH_PROFILE");
    FILE *pf = prof && *prof && device >= 0 ? fopen(prof, "w") : NULL;
    if (pf) {
        for (int32_t b = 0; b < B; b++)
            ghc_tensor_free(y[b]);
        if (ghc_op_profile_start(core, device) < 0 ||
            ghc_umt5_encode_batch(enc, ghc_tensor_cdata(ids), ghc_tensor_cdata(mask), B, L, y) < 0 ||
            ghc_op_profile_stop(core, device, pf, 1, "bench_umt5: one batch") < 0)
            fprintf(stderr, "bench_umt5: profile: %s\n", ghc_error_message(core));
        fclose(pf);
    }
    /* as the plugin runs a caption (what `prepare` does): each prompt alone, on its true tokens */
    double per = 0.0;
    for (int i = 0; i < iters; i++)
        for (int32_t b = 0; b < B; b++) {
            const int32_t *pm = (const int32_t *)ghc_tensor_cdata(mask) + (int64_t)b * L;
            int32_t n = 0;
            while (n < L && pm[n])
                n++;
            t0 = now_s();
            ghc_tensor_t *one = ghc_umt5_encode(enc, (const int32_t *)ghc_tensor_cdata(ids) + (int64_t)b * L, NULL,
                                                n ? n : 1);
            per += now_s() - t0;
            if (!one)
                goto fail;
            ghc_tensor_free(one);
        }
    size_t fr = 0, tot = 0;
    if (pool)
        cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high);
    if (device >= 0)
        cudaMemGetInfo(&fr, &tot);
    cudaGetLastError();
    printf("ours: load_s=%.2f encode_ms=%.2f min_ms=%.2f per_prompt_ms=%.2f pool_peak_gib=%.3f card_gib=%.3f B=%d "
           "L=%d dtype=%s\n", load_s, 1e3 * sum / iters, 1e3 * best, 1e3 * per / iters, (double)high / 1073741824.0,
           (double)(tot - fr) / 1073741824.0, B, L, dtype);
    if (out && write_out(core, out, y, B, L, ghc_umt5_get_config(enc)->d_model) < 0)
        goto fail;
    rc = 0;
fail:
    if (rc)
        fprintf(stderr, "bench_umt5: %s\n", core ? ghc_error_message(core) : "no core");
    for (int32_t b = 0; y && b < (ids ? (int32_t)ghc_tensor_dim(ids, 0) : 0); b++)
        ghc_tensor_free(y[b]);
    free(y);
    ghc_umt5_free(enc);
    ghc_tensor_free(ids);
    ghc_tensor_free(mask);
    ghc_st_free(st);
    ghc_run_free(core);
    ghc_core_free(core);
    return rc;
}
