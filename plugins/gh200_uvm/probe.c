/* probe.c: the machine probe behind `gh200core diag`: environment, GPU and driver, the
 * attributes that classify the platform (doc/memory.md, "Platform"), HBM and host memory, a managed
 * allocation test (past HBM only on coherent or integrated platforms; elsewhere up to the safe
 * cap, with the reason), and bandwidth probes (pinned copies, managed prefetch, the C2C link on
 * coherent machines). The core formats the items (core/diag.c); nothing is printed here. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "uvm_sm.h"
#include "uvm_impl.h"

#define GIB  (1024.0 * 1024.0 * 1024.0)
#define PROBE_BYTES ((size_t)256 << 20)   /* bandwidth probe size */

/* One timed transfer of n bytes on s. */
typedef cudaError_t (*probe_fn)(void *dst, void *src, size_t n, int device, cudaStream_t s);

static cudaError_t do_copy(void *dst, void *src, size_t n, int device, cudaStream_t s)
{
    (void)device;
    return cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, s);
}

/* Managed prefetch to the GPU; probe_rate() moves the range back to the host, untimed, first. */
static cudaError_t do_prefetch_gpu(void *dst, void *src, size_t n, int device, cudaStream_t s)
{
    (void)dst;
    struct cudaMemLocation gpu = { .type = cudaMemLocationTypeDevice, .id = device };
    return cudaMemPrefetchAsync(src, n, gpu, 0, s);
}

/* Median GB/s of 3 timed runs of fn, or -1 on a CUDA error. */
static double probe_rate(probe_fn fn, void *dst, void *src, size_t n, int device, cudaStream_t s)
{
    double ms[3];
    cudaEvent_t a, b;
    if (cudaEventCreate(&a) != cudaSuccess || cudaEventCreate(&b) != cudaSuccess)
        return -1;
    for (int r = 0; r < 3; r++) {
        float t = 0;
        if (fn == do_prefetch_gpu) {   /* the move back is not timed */
            struct cudaMemLocation host = { .type = cudaMemLocationTypeHost, .id = 0 };
            if (cudaMemPrefetchAsync(src, n, host, 0, s) != cudaSuccess || cudaStreamSynchronize(s) != cudaSuccess)
                goto fail;
        }
        if (cudaEventRecord(a, s) != cudaSuccess || fn(dst, src, n, device, s) != cudaSuccess)
            goto fail;
        if (cudaEventRecord(b, s) != cudaSuccess || cudaEventSynchronize(b) != cudaSuccess ||
            cudaEventElapsedTime(&t, a, b) != cudaSuccess)
            goto fail;
        ms[r] = t;
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    for (int i = 0; i < 2; i++)   /* sort 3 */
        for (int j = i + 1; j < 3; j++)
            if (ms[j] < ms[i]) {
                double x = ms[i];
                ms[i] = ms[j];
                ms[j] = x;
            }
    return ms[1] > 0 ? (double)n / (ms[1] * 1e-3) / 1e9 : -1;
fail:
    cudaGetLastError();
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return -1;
}

static void probe_bw(struct ghc_probe *out, const char *key, const char *what, double gbs)
{
    if (gbs < 0)
        ghc_probe_add(out, "bandwidth", key, GHC_PROBE_FAIL, NAN, "GB/s", "%s: a CUDA call failed", what);
    else
        ghc_probe_add(out, "bandwidth", key, GHC_PROBE_INFO, gbs, "GB/s", "%s, 256 MiB, median of 3", what);
}

/* ---- the managed allocation test ------------------------------------------------------------ */

static void probe_managed(struct ghc_probe *out, int dev, enum ghc_mem_platform pf, const struct ghc_probe_opts *o,
                          size_t fr, size_t tot, cudaStream_t s)
{
    double scale = o->oversubscription_scale > 0 ? o->oversubscription_scale : 0.25;
    uint64_t headroom = (uint64_t)fmax(0.05 * (double)tot, 2.0 * GIB);
    uint64_t want = (uint64_t)(scale * (double)tot), size = want;
    char why[160] = "";
    if (pf == GHC_PLATFORM_DISCRETE) {
        uint64_t safe = fr > headroom ? fr - headroom : 0;
        if (size > safe) {
            size = safe;
            snprintf(why, sizeof(why), "capped from %.1f GiB: discrete GPU, managed memory may not exceed free %.1f "
                     "GiB - headroom %.1f GiB", want / GIB, fr / GIB, headroom / GIB);
        }
    } else {
        uint64_t host = uvm_host_available(), safe = host > headroom ? host - headroom : 0;
        if (pf == GHC_PLATFORM_COHERENT)
            safe += fr > headroom ? fr - headroom : 0;
        if (size > safe) {
            size = safe;
            snprintf(why, sizeof(why), "capped from %.1f GiB at the available memory minus headroom", want / GIB);
        }
    }
    if (size < ((uint64_t)64 << 20)) {
        ghc_probe_add(out, "alloc", "managed_test", GHC_PROBE_SKIP, 0, "GiB", "not enough room for a managed test%s%s",
                      *why ? ": " : "", why);
        return;
    }
    void *p = NULL;
    struct cudaMemLocation gpu = { .type = cudaMemLocationTypeDevice, .id = dev };
    cudaError_t e = cudaMallocManaged(&p, size, cudaMemAttachGlobal);
    /* populate: on the GPU what fits (prefetch), the rest stays where first touch puts it */
    uint64_t on_gpu = size < fr - (fr > headroom ? headroom : 0) ? size : 0;
    if (e == cudaSuccess && on_gpu)
        e = cudaMemPrefetchAsync(p, on_gpu, gpu, 0, s);
    if (e == cudaSuccess)
        e = cudaMemsetAsync(p, 0x5a, size, s);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(s);
    unsigned char probe = 0;
    if (e == cudaSuccess)
        e = cudaMemcpy(&probe, (char *)p + size - 1, 1, cudaMemcpyDefault);
    bool ok = e == cudaSuccess && probe == 0x5a;
    ghc_probe_add(out, "alloc", "managed_test", ok ? GHC_PROBE_PASS : GHC_PROBE_FAIL, size / GIB, "GiB",
                  "%s %.2fx HBM managed, written on the GPU%s%s", ok ? "allocated" : "failed:", size / (double)tot,
                  ok ? "" : ": ", ok ? "" : cudaGetErrorString(e));
    if (*why)
        ghc_probe_add(out, "alloc", "managed_cap_reason", GHC_PROBE_INFO, NAN, "", "%s", why);
    if (p)
        cudaFree(p);
    cudaGetLastError();
}

/* ---- the probe ----------------------------------------------------------------------------------- */

int uvm_probe(ghc_core_t *core, const struct ghc_probe_opts *o, struct ghc_probe *out)
{
    (void)core;
    int rt = 0, drv = 0, n = 0;
    cudaRuntimeGetVersion(&rt);
    cudaDriverGetVersion(&drv);
    ghc_probe_add(out, "env", "cuda_runtime", GHC_PROBE_INFO, rt, "", "%d.%d", rt / 1000, rt % 1000 / 10);
    ghc_probe_add(out, "env", "cuda_driver_api", GHC_PROBE_INFO, drv, "", "%d.%d", drv / 1000, drv % 1000 / 10);
    static const char *const vars[] = { "CUDA_VISIBLE_DEVICES", "GH200_UVM_OVERSUBSCRIPTION_RATIO",
                                        "GH200_UVM_ACCESS_PATTERN", "PYTORCH_CUDA_ALLOC_CONF" };
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
        ghc_probe_add(out, "env", vars[i], GHC_PROBE_INFO, NAN, "", "%s", getenv(vars[i]) ? getenv(vars[i]) : "(unset)");
    uint64_t host = uvm_host_available();
    ghc_probe_add(out, "memory", "host_available", GHC_PROBE_INFO, host / GIB, "GiB", "MemAvailable");
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n < 1) {
        cudaGetLastError();
        ghc_probe_add(out, "gpu", "devices", GHC_PROBE_FAIL, 0, "", "no CUDA device (%s)",
                      e != cudaSuccess ? cudaGetErrorString(e) : "count 0");
        ghc_probe_add(out, "gpu", "platform", GHC_PROBE_INFO, NAN, "", "%s", ghc_mem_platform_name(GHC_PLATFORM_NONE));
        return 0;
    }
    ghc_probe_add(out, "gpu", "devices", GHC_PROBE_PASS, n, "", "%d CUDA device%s", n, n == 1 ? "" : "s");
    int dev = 0;
    struct cudaDeviceProp prop;
    cudaSetDevice(dev);
    if (cudaGetDeviceProperties(&prop, dev) == cudaSuccess)
        ghc_probe_add(out, "gpu", "name", GHC_PROBE_INFO, prop.major * 10 + prop.minor, "", "%s (sm_%d%d)", prop.name,
                      prop.major, prop.minor);
    static const struct { const char *key; enum cudaDeviceAttr attr; } attrs[] = {
        { "integrated", cudaDevAttrIntegrated },
        { "managed_memory", cudaDevAttrManagedMemory },
        { "concurrent_managed_access", cudaDevAttrConcurrentManagedAccess },
        { "pageable_memory_access", cudaDevAttrPageableMemoryAccess },
        { "uses_host_page_tables", cudaDevAttrPageableMemoryAccessUsesHostPageTables },
        { "direct_managed_access_from_host", cudaDevAttrDirectManagedMemAccessFromHost },
        { "host_native_atomics", cudaDevAttrHostNativeAtomicSupported },
        { "async_engines", cudaDevAttrAsyncEngineCount },
        { "memory_pools", cudaDevAttrMemoryPoolsSupported },
        { "numa_config", cudaDevAttrNumaConfig },
    };
    int v[sizeof(attrs) / sizeof(attrs[0])];
    for (size_t i = 0; i < sizeof(attrs) / sizeof(attrs[0]); i++) {
        v[i] = -1;
        if (cudaDeviceGetAttribute(&v[i], attrs[i].attr, dev) != cudaSuccess)
            cudaGetLastError();
        ghc_probe_add(out, "gpu", attrs[i].key, GHC_PROBE_INFO, v[i], "", NULL);
    }
    enum ghc_mem_platform pf = uvm_platform_classify(v[0], v[4], v[2]);
    static const char *const pf_text[] = {
        "no concurrent managed access: no managed policy; use device or offload",
        "discrete GPU (x86 + PCIe class): managed memory capped at the free device memory; offload goes past HBM",
        "coherent (GH200 class, NVLink-C2C + ATS): managed memory may oversubscribe HBM",
        "integrated (GB10 class): one memory pool; budget against MemAvailable",
    };
    ghc_probe_add(out, "gpu", "platform", pf == GHC_PLATFORM_NONE ? GHC_PROBE_FAIL : GHC_PROBE_PASS, (double)pf, "",
                  "%s: %s", ghc_mem_platform_name(pf), pf_text[pf]);
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess)
        cudaGetLastError();
    ghc_probe_add(out, "memory", "hbm_total", GHC_PROBE_INFO, tot / GIB, "GiB", NULL);
    ghc_probe_add(out, "memory", "hbm_free", GHC_PROBE_INFO, fr / GIB, "GiB", NULL);

    cudaStream_t s;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
        cudaGetLastError();
        ghc_probe_add(out, "gpu", "stream", GHC_PROBE_FAIL, NAN, "", "cannot create a stream");
        return 0;
    }
    if (o->skip_allocation)
        ghc_probe_add(out, "alloc", "managed_test", GHC_PROBE_SKIP, NAN, "", "--skip-allocation");
    else if (pf == GHC_PLATFORM_NONE)
        ghc_probe_add(out, "alloc", "managed_test", GHC_PROBE_SKIP, NAN, "", "no concurrent managed access");
    else
        probe_managed(out, dev, pf, o, fr, tot, s);

    void *h = NULL, *d = NULL, *m = NULL, *pg = NULL;
    if (cudaMallocHost(&h, PROBE_BYTES) == cudaSuccess && cudaMalloc(&d, PROBE_BYTES) == cudaSuccess) {
        memset(h, 1, PROBE_BYTES);
        probe_bw(out, "pinned_h2d", "pinned host -> device cudaMemcpyAsync", probe_rate(do_copy, d, h, PROBE_BYTES, dev, s));
        probe_bw(out, "pinned_d2h", "device -> pinned host cudaMemcpyAsync", probe_rate(do_copy, h, d, PROBE_BYTES, dev, s));
        if (pf != GHC_PLATFORM_NONE && cudaMallocManaged(&m, PROBE_BYTES, cudaMemAttachGlobal) == cudaSuccess) {
            memset(m, 1, PROBE_BYTES);
            probe_bw(out, "managed_prefetch_h2d", "managed prefetch host -> device",
                     probe_rate(do_prefetch_gpu, NULL, m, PROBE_BYTES, dev, s));
        }
        if (pf == GHC_PLATFORM_COHERENT && (pg = malloc(PROBE_BYTES))) {
            memset(pg, 1, PROBE_BYTES);
            probe_bw(out, "c2c_pageable_h2d", "NVLink-C2C: malloc'ed host -> device",
                     probe_rate(do_copy, d, pg, PROBE_BYTES, dev, s));
        }
    } else {
        ghc_probe_add(out, "bandwidth", "buffers", GHC_PROBE_FAIL, NAN, "", "cannot allocate 256 MiB probe buffers");
    }
    cudaGetLastError();
    free(pg);
    if (m)
        cudaFree(m);
    if (d)
        cudaFree(d);
    if (h)
        cudaFreeHost(h);
    cudaStreamDestroy(s);
    cudaGetLastError();
    return 0;
}
