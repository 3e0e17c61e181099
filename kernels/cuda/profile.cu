/* profile.cu: ghc_op_profile_start / _stop (ops.h): where a GPU's time goes between two points
 * of a run, from CUPTI's activity records (every kernel, copy and memset with its start and
 * end on the GPU), libcupti loaded at run time (dlopen of libcupti.so.13: a build needs only
 * CUPTI's headers, a machine without the library gets a clear error). Host code only.
 *
 * The report: the wall time, the time the GPU was busy (the union of all records' intervals)
 * and idle (waiting for the host: launches, synchronisations, host-side work), the busy time by
 * class (matrix products, attention, convolutions, copies by direction, other kernels) and the
 * kernels that took the most, demangled, per step. */
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cxxabi.h>
#include <dlfcn.h>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime.h>
#include <cupti_activity.h>

#include "kernels.h"

namespace {

struct cupti_api {
    void *lib = nullptr;
    CUptiResult (*register_callbacks)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc);
    CUptiResult (*enable)(CUpti_ActivityKind);
    CUptiResult (*disable)(CUpti_ActivityKind);
    CUptiResult (*flush_all)(uint32_t);
    CUptiResult (*next_record)(uint8_t *, size_t, CUpti_Activity **);
    CUptiResult (*timestamp)(uint64_t *);
    CUptiResult (*result_string)(CUptiResult, const char **);
};

struct interval {
    uint64_t start, end;
};

struct entry {
    double   ns = 0;
    uint64_t count = 0, bytes = 0;
};

struct profile {
    std::mutex                    lock;
    std::vector<interval>         busy;
    std::map<std::string, entry>  kernels;   /* by demangled name */
    entry                         copies[3];  /* host to device, device to host, other */
    entry                         memsets;
    uint64_t                      t0 = 0, t1 = 0;
    bool                          running = false, registered = false;
};

cupti_api g_api;
profile   g_prof;
char      g_why[256];

const CUpti_ActivityKind kinds[] = { CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                     CUPTI_ACTIVITY_KIND_MEMSET };

bool load_cupti()
{
    if (g_api.lib)
        return true;
    const char *env = getenv("GHC_CUPTI_LIBRARY");
    void *h = dlopen(env && *env ? env : "libcupti.so.13", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(g_why, sizeof(g_why), "cannot load CUPTI (%s): %s", env && *env ? env : "libcupti.so.13", dlerror());
        return false;
    }
#define SYM(field, name)                                                                                   \
    if (!(*(void **)&g_api.field = dlsym(h, name))) {                                                      \
        snprintf(g_why, sizeof(g_why), "CUPTI has no %s", name);                                           \
        dlclose(h);                                                                                        \
        return false;                                                                                      \
    }
    SYM(register_callbacks, "cuptiActivityRegisterCallbacks");
    SYM(enable, "cuptiActivityEnable");
    SYM(disable, "cuptiActivityDisable");
    SYM(flush_all, "cuptiActivityFlushAll");
    SYM(next_record, "cuptiActivityGetNextRecord");
    SYM(timestamp, "cuptiGetTimestamp");
    SYM(result_string, "cuptiGetResultString");
#undef SYM
    g_api.lib = h;
    return true;
}

const char *why(CUptiResult r)
{
    const char *s = "unknown";
    if (g_api.result_string)
        g_api.result_string(r, &s);
    return s;
}

void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
    const size_t n = 8u << 20;
    *buffer = (uint8_t *)aligned_alloc(8, n);
    *size = *buffer ? n : 0;
    *max_records = 0;
}

std::string demangle(const char *name)
{
    if (!name)
        return "(unnamed)";
    int status = 0;
    char *d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
    std::string s = status == 0 && d ? d : name;
    free(d);
    return s;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t *buffer, size_t, size_t valid)
{
    CUpti_Activity *rec = nullptr;
    std::lock_guard<std::mutex> g(g_prof.lock);
    while (g_api.next_record(buffer, valid, &rec) == CUPTI_SUCCESS) {
        uint64_t s = 0, e = 0;
        if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || rec->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
            const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
            s = k->start, e = k->end;
            entry &x = g_prof.kernels[demangle(k->name)];
            x.ns += (double)(e - s);
            x.count++;
        } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)rec;
            s = m->start, e = m->end;
            int c = m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_HTOD ? 0 : m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOH ? 1 : 2;
            g_prof.copies[c].ns += (double)(e - s);
            g_prof.copies[c].count++;
            g_prof.copies[c].bytes += m->bytes;
        } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
            const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)rec;
            s = m->start, e = m->end;
            g_prof.memsets.ns += (double)(e - s);
            g_prof.memsets.count++;
            g_prof.memsets.bytes += m->bytes;
        } else {
            continue;
        }
        if (e > s)
            g_prof.busy.push_back({ s, e });
    }
    free(buffer);
}

/* The class of a kernel, by its name: cuBLASLt's and CUTLASS's products, attention (ours,
 * cuDNN's), cuDNN's convolutions, the rest. */
int kernel_class(const std::string &n)
{
    static const char *const gemm[] = { "gemm", "xmma", "cutlass", "cublas", "nvjet", "ghc_lora" };
    static const char *const attn[] = { "attention", "attn", "sdpa", "fmha", "flash", "softmax" };
    static const char *const conv[] = { "conv", "implicit", "wgrad", "dgrad" };
    for (const char *p : attn)
        if (n.find(p) != std::string::npos)
            return 1;
    for (const char *p : gemm)
        if (n.find(p) != std::string::npos)
            return 0;
    for (const char *p : conv)
        if (n.find(p) != std::string::npos)
            return 2;
    return 3;
}

} // namespace

extern "C" const char *ghc_k_profile_why(void) { return g_why; }

extern "C" int ghc_k_profile_start(int dev)
{
    if (!load_cupti())
        return -1;
    cudaError_t ce = cudaSetDevice(dev);
    if (ce == cudaSuccess)
        ce = cudaDeviceSynchronize();
    if (ce != cudaSuccess) {
        snprintf(g_why, sizeof(g_why), "CUDA device %d: %s", dev, cudaGetErrorString(ce));
        return -1;
    }
    CUptiResult r = CUPTI_SUCCESS;
    if (!g_prof.registered && (r = g_api.register_callbacks(buffer_requested, buffer_completed)) != CUPTI_SUCCESS) {
        snprintf(g_why, sizeof(g_why), "cuptiActivityRegisterCallbacks: %s", why(r));
        return -1;
    }
    g_prof.registered = true;
    {
        std::lock_guard<std::mutex> g(g_prof.lock);
        g_prof.busy.clear();
        g_prof.kernels.clear();
        for (entry &c : g_prof.copies)
            c = entry();
        g_prof.memsets = entry();
    }
    for (CUpti_ActivityKind k : kinds)
        if ((r = g_api.enable(k)) != CUPTI_SUCCESS) {
            snprintf(g_why, sizeof(g_why), "cuptiActivityEnable(%d): %s", (int)k, why(r));
            for (CUpti_ActivityKind d : kinds)
                g_api.disable(d);
            return -1;
        }
    g_api.timestamp(&g_prof.t0);
    g_prof.running = true;
    return 0;
}

extern "C" int ghc_k_profile_stop(int dev, FILE *out, int32_t steps, const char *title)
{
    if (!g_prof.running) {
        snprintf(g_why, sizeof(g_why), "no profile was started");
        return -1;
    }
    cudaError_t ce = cudaSetDevice(dev);
    if (ce == cudaSuccess)
        ce = cudaDeviceSynchronize();
    g_api.timestamp(&g_prof.t1);
    for (CUpti_ActivityKind k : kinds)
        g_api.disable(k);
    g_api.flush_all(1);
    g_prof.running = false;
    if (ce != cudaSuccess) {
        snprintf(g_why, sizeof(g_why), "CUDA device %d: %s", dev, cudaGetErrorString(ce));
        return -1;
    }
    std::lock_guard<std::mutex> g(g_prof.lock);
    if (!out) {   /* the recording ended, no report */
        g_prof.busy.clear();
        g_prof.kernels.clear();
        return 0;
    }
    /* the union of the busy intervals inside [t0, t1] */
    std::vector<interval> &b = g_prof.busy;
    std::sort(b.begin(), b.end(), [](const interval &x, const interval &y) { return x.start < y.start; });
    double busy = 0;
    uint64_t cs = 0, ce_ = 0;
    bool open = false;
    for (const interval &iv : b) {
        uint64_t s = std::max(iv.start, g_prof.t0), e = std::min(iv.end, g_prof.t1);
        if (e <= s)
            continue;
        if (open && s <= ce_) {
            ce_ = std::max(ce_, e);
            continue;
        }
        if (open)
            busy += (double)(ce_ - cs);
        cs = s, ce_ = e, open = true;
    }
    if (open)
        busy += (double)(ce_ - cs);
    const double n = steps > 0 ? (double)steps : 1.0, ms = 1e-6 / n;
    const double wall = (double)(g_prof.t1 - g_prof.t0);
    double cls[4] = { 0, 0, 0, 0 }, kern = 0;
    std::vector<std::pair<std::string, entry>> ks(g_prof.kernels.begin(), g_prof.kernels.end());
    for (auto &k : ks) {
        cls[kernel_class(k.first)] += k.second.ns;
        kern += k.second.ns;
    }
    std::sort(ks.begin(), ks.end(), [](const auto &x, const auto &y) { return x.second.ns > y.second.ns; });
    double copies = g_prof.copies[0].ns + g_prof.copies[1].ns + g_prof.copies[2].ns + g_prof.memsets.ns;
    fprintf(out, "# %s\n\n", title && *title ? title : "profile");
    fprintf(out, "%d step%s; per step: wall %.2f ms, the GPU busy %.2f ms (%.1f%%), idle %.2f ms (%.1f%%: waiting for "
            "the host). Kernels and copies may overlap one another (streams), so the rows below can add up to more "
            "than the busy time.\n\n", (int)n, n == 1 ? "" : "s", wall * ms, busy * ms, wall > 0 ? 100 * busy / wall : 0,
            (wall - busy) * ms, wall > 0 ? 100 * (wall - busy) / wall : 0);
    fprintf(out, "| what | ms per step | share of wall | calls per step | GB per step |\n|---|---|---|---|---|\n");
    static const char *const names[4] = { "matrix products (cuBLASLt, LoRA)", "attention", "convolutions (cuDNN)",
                                          "other kernels (norms, elementwise, casts, optimizer...)" };
    uint64_t calls[4] = { 0, 0, 0, 0 };
    for (auto &k : ks)
        calls[kernel_class(k.first)] += k.second.count;
    for (int c = 0; c < 4; c++)
        if (cls[c] > 0)
            fprintf(out, "| %s | %.2f | %.1f%% | %.0f | |\n", names[c], cls[c] * ms, wall > 0 ? 100 * cls[c] / wall : 0,
                    (double)calls[c] / n);
    static const char *const cnames[3] = { "copies host to device", "copies device to host", "copies on the device / peer" };
    for (int c = 0; c < 3; c++)
        if (g_prof.copies[c].count)
            fprintf(out, "| %s | %.2f | %.1f%% | %.0f | %.3f |\n", cnames[c], g_prof.copies[c].ns * ms,
                    wall > 0 ? 100 * g_prof.copies[c].ns / wall : 0, (double)g_prof.copies[c].count / n,
                    (double)g_prof.copies[c].bytes / n / 1e9);
    if (g_prof.memsets.count)
        fprintf(out, "| memsets | %.2f | %.1f%% | %.0f | %.3f |\n", g_prof.memsets.ns * ms,
                wall > 0 ? 100 * g_prof.memsets.ns / wall : 0, (double)g_prof.memsets.count / n,
                (double)g_prof.memsets.bytes / n / 1e9);
    fprintf(out, "| GPU idle | %.2f | %.1f%% | | |\n\n", (wall - busy) * ms, wall > 0 ? 100 * (wall - busy) / wall : 0);
    fprintf(out, "Kernels by time (all %.2f ms per step; copies and memsets %.2f ms):\n\n", kern * ms, copies * ms);
    fprintf(out, "| kernel | ms per step | share of kernels | calls per step | us per call |\n|---|---|---|---|---|\n");
    size_t shown = 0;
    for (auto &k : ks) {
        if (shown++ == 30)
            break;
        std::string name = k.first;
        if (name.size() > 110)
            name = name.substr(0, 107) + "...";
        for (char &c : name)
            if (c == '|')
                c = '/';
        fprintf(out, "| `%s` | %.3f | %.1f%% | %.1f | %.1f |\n", name.c_str(), k.second.ns * ms,
                kern > 0 ? 100 * k.second.ns / kern : 0, (double)k.second.count / n,
                k.second.count ? k.second.ns / (double)k.second.count / 1e3 : 0);
    }
    if (ks.size() > 30)
        fprintf(out, "| (%zu more kernels) | | | | |\n", ks.size() - 30);
    fprintf(out, "\n");
    g_prof.busy.clear();
    g_prof.kernels.clear();
    return ferror(out) ? -2 : 0;
}
