/* gh200_uvm.c: the `gh200_uvm` memory policy: device memory from a caching pool while the
 * device has room (stage 0), managed memory with placement advice per role once free device
 * memory falls below the threshold (stage 1), a managed budget of HBM x oversubscription_ratio
 * on coherent (GH200) and integrated (GB10) platforms, capped at the device's free memory on
 * discrete ones (x86 + H100/H200, where oversubscription can hang the GPU), prefetch of the next
 * block's managed weights on a side stream, and statistics. Saved activations (GHC_ROLE_SAVED)
 * in pinned host memory moved through a ring of device buffers (saved.h, as offload), except
 * on an integrated machine (one memory: they stay where kernels read them). The decisions live
 * in uvm_sm.c (pure, CPU-tested); this file makes the CUDA calls. Behaviour: doc/memory.md,
 * "gh200_uvm". */
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include <gh200core/mempolicy.h>

#include "../offload/saved.h"
#include "uvm_sm.h"
#include "uvm_impl.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

enum blk_at { AT_DEVICE = 0, AT_MANAGED, AT_PINNED };

struct uvm_block {                 /* one live allocation */
    void              *ptr;
    size_t             bytes;
    enum ghc_mem_role  role;
    enum blk_at        at;
    enum uvm_advice    advice;     /* managed: the advice applied */
    bool               on_gpu;     /* managed: prefetched to the GPU since the last advice */
    struct uvm_block  *next;
};

struct uvm_group {                 /* a block's weights, for prefetch ahead of use */
    void      **ptrs;
    size_t     *bytes;
    int         n;
    bool        pending;           /* a prefetch was issued; `ev` marks its end */
    cudaEvent_t ev;
};

struct uvm {
    ghc_core_t            *core;
    int                    device;
    enum ghc_mem_platform  platform;
    enum uvm_pattern       pattern;
    bool                   hints, telemetry;
    uint64_t               budget;         /* device bytes GPU-preferred managed data may take */
    struct uvm_sm          sm;
    pthread_mutex_t        lock;
    cudaMemPool_t          pool;
    cudaStream_t           side;           /* prefetch stream */
    struct uvm_block      *blocks;
    struct uvm_group      *groups;
    int64_t                n_groups;
    int                    dir;            /* +1 forward walk, -1 backward */
    uint64_t               role[GHC_ROLE_MAX], role_managed[GHC_ROLE_MAX], role_peak[GHC_ROLE_MAX];
    uint64_t               live, live_dev, live_pinned, peak, gpu_pref, prefetched;
    struct uvm_telemetry  *tel;
    bool                   saved_host;     /* saved activations pinned on the host, through `saved` */
    struct saved_ring      saved;
};

static const struct ghc_cfg_key uvm_keys[] = {
    { "device", GHC_CFG_INT, "0", "0 to 1023", NULL },
    { "oversubscription_ratio", GHC_CFG_FLOAT, "5.0", "(> 0, at most 1000)", NULL },
    { "access_pattern", GHC_CFG_STRING, "gpu_first", "gpu_first, balanced, cpu_first", NULL },
    { "stage1_threshold", GHC_CFG_FLOAT, "0.15", "0 to 1", NULL },
    { "stage1_min_gib", GHC_CFG_FLOAT, "10.0", "0 to 1e6", NULL },
    { "hysteresis", GHC_CFG_FLOAT, "0.05", "0 to 0.5", NULL },
    { "headroom_mib", GHC_CFG_INT, "-1", "-1 to 2^30", NULL },     /* -1: automatic */
    { "enable_uvm_hints", GHC_CFG_BOOL, "true", NULL, NULL },
    { "telemetry", GHC_CFG_BOOL, "false", NULL, NULL },
    { "saved", GHC_CFG_STRING, "auto", "auto, host, device", NULL },   /* auto: device if integrated */
    { "saved_ring", GHC_CFG_INT, "3", "2 to 64", NULL },
    { "saved_ahead", GHC_CFG_INT, "2", "0 to 63", NULL },
    { NULL, 0, NULL, NULL, NULL }
};

/* ---- settings -------------------------------------------------------------------------------- */

struct uvm_settings {
    int64_t          device, headroom_mib, saved_ring, saved_ahead;
    double           ratio, threshold, min_gib, hysteresis;
    enum uvm_pattern pattern;
    bool             hints, telemetry;
    int              saved;            /* 0 auto, 1 host, 2 device */
};

/* Read and check every setting, the environment overriding the config; no CUDA yet, so bad
 * settings are reported on any machine. */
static int uvm_settings_read(ghc_core_t *core, ghc_cfg_t *cfg, struct uvm_settings *s)
{
    int rc;
    const char *pat, *env;
    static const char *const saved[] = { "auto", "host", "device", NULL };
    if ((rc = ghc_cfg_get_choice(cfg, "saved", 0, saved, &s->saved)) < 0 ||
        (rc = ghc_cfg_get_int(cfg, "saved_ring", 3, 2, 64, &s->saved_ring)) < 0 ||
        (rc = ghc_cfg_get_int(cfg, "saved_ahead", 2, 0, 63, &s->saved_ahead)) < 0 ||
        (rc = ghc_cfg_get_int(cfg, "device", 0, 0, 1023, &s->device)) < 0 ||
        (rc = ghc_cfg_get_float(cfg, "oversubscription_ratio", 5.0, -INFINITY, INFINITY, &s->ratio)) < 0 ||
        (rc = ghc_cfg_get_string(cfg, "access_pattern", "gpu_first", &pat)) < 0 ||
        (rc = ghc_cfg_get_float(cfg, "stage1_threshold", 0.15, 0.0, 1.0, &s->threshold)) < 0 ||
        (rc = ghc_cfg_get_float(cfg, "stage1_min_gib", 10.0, 0.0, 1e6, &s->min_gib)) < 0 ||
        (rc = ghc_cfg_get_float(cfg, "hysteresis", 0.05, 0.0, 0.5, &s->hysteresis)) < 0 ||
        (rc = ghc_cfg_get_int(cfg, "headroom_mib", -1, -1, INT64_C(1) << 30, &s->headroom_mib)) < 0 ||
        (rc = ghc_cfg_get_bool(cfg, "enable_uvm_hints", true, &s->hints)) < 0 ||
        (rc = ghc_cfg_get_bool(cfg, "telemetry", false, &s->telemetry)) < 0)
        return rc;
    if (!(s->ratio > 0.0) || s->ratio > 1000.0)
        return ghc_error_set(core, GHC_ECONFIG, "%s: gh200_uvm: oversubscription_ratio must be > 0 and <= 1000 "
                             "(a multiple of the GPU's memory, default 5.0), got %g",
                             ghc_cfg_where(cfg, "oversubscription_ratio"), s->ratio);
    if (!uvm_pattern_parse(pat, &s->pattern))
        return ghc_error_set(core, GHC_ECONFIG, "%s: gh200_uvm: access_pattern '%s' is unknown; expected gpu_first, "
                             "balanced or cpu_first", ghc_cfg_where(cfg, "access_pattern"), pat);
    if ((env = getenv("GH200_UVM_OVERSUBSCRIPTION_RATIO")) && !uvm_ratio_parse(env, &s->ratio))
        return ghc_error_set(core, GHC_ECONFIG, "GH200_UVM_OVERSUBSCRIPTION_RATIO='%s': expected a number > 0 and "
                             "<= 1000 (overrides %s)", env, ghc_cfg_where(cfg, "oversubscription_ratio"));
    if ((env = getenv("GH200_UVM_ACCESS_PATTERN")) && !uvm_pattern_parse(env, &s->pattern))
        return ghc_error_set(core, GHC_ECONFIG, "GH200_UVM_ACCESS_PATTERN='%s': expected gpu_first, balanced or "
                             "cpu_first (overrides %s)", env, ghc_cfg_where(cfg, "access_pattern"));
    return 0;
}

/* ---- the budget the state machine reads ------------------------------------------------------ */

uint64_t uvm_host_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kib = 0;
    if (!f)
        return 0;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1)
            break;
    fclose(f);
    return (uint64_t)kib * 1024;
}

static uint64_t env_free(void *user)
{
    struct uvm *u = user;
    if (u->platform == GHC_PLATFORM_INTEGRATED)
        return uvm_host_available();   /* cudaMemGetInfo undercounts there: the pool is the host's */
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess)
        cudaGetLastError();
    return fr;
}

static void env_light(void *user)
{
    struct uvm *u = user;
    cudaMemPoolTrimTo(u->pool, 0);   /* frees whose stream work is done; no synchronisation */
    cudaGetLastError();
}

/* Synchronise, trim to zero slack, and send cold managed ranges (the inactive expert, latents,
 * host-advised data) to the host so the device has room. */
static void env_hard(void *user)
{
    struct uvm *u = user;
    cudaDeviceSynchronize();
    cudaMemPoolTrimTo(u->pool, 0);
    struct cudaMemLocation host = { .type = cudaMemLocationTypeHost, .id = 0 };
    for (struct uvm_block *b = u->blocks; b; b = b->next)
        if (b->at == AT_MANAGED && b->advice != UVM_ADVICE_GPU && b->on_gpu) {
            cudaMemPrefetchAsync(b->ptr, b->bytes, host, 0, u->side);
            b->on_gpu = false;
        }
    cudaStreamSynchronize(u->side);
    cudaGetLastError();
}

/* ---- advice ------------------------------------------------------------------------------------ */

/* Apply `advice` to a managed block (once per change; advice costs ~32 ms per GiB). */
static void uvm_apply_advice(struct uvm *u, struct uvm_block *b, enum uvm_advice advice)
{
    struct cudaMemLocation gpu = { .type = cudaMemLocationTypeDevice, .id = u->device };
    struct cudaMemLocation host = { .type = cudaMemLocationTypeHost, .id = 0 };
    if (b->advice == advice)
        return;
    if (b->advice == UVM_ADVICE_GPU)
        u->gpu_pref -= b->bytes;
    if (advice == UVM_ADVICE_NONE) {
        cudaMemAdvise(b->ptr, b->bytes, cudaMemAdviseUnsetPreferredLocation, gpu);
        cudaMemAdvise(b->ptr, b->bytes, cudaMemAdviseUnsetAccessedBy, gpu);
    } else {
        cudaMemAdvise(b->ptr, b->bytes, cudaMemAdviseSetPreferredLocation, advice == UVM_ADVICE_GPU ? gpu : host);
        cudaMemAdvise(b->ptr, b->bytes, cudaMemAdviseSetAccessedBy, gpu);
    }
    if (advice == UVM_ADVICE_GPU)
        u->gpu_pref += b->bytes;
    cudaGetLastError();
    b->advice = advice;
    b->on_gpu = false;
}

static enum uvm_advice uvm_advice_now(struct uvm *u, enum ghc_mem_role role, size_t bytes)
{
    return uvm_advice_for(role, u->pattern, u->sm.stage, u->hints, u->gpu_pref + bytes <= u->budget);
}

/* ---- the saved ring's buffers: the device pool -------------------------------------------------- */

static int uvm_buf_alloc(void *ctx, size_t n, void **buf)
{
    struct uvm *u = ctx;
    cudaError_t e = cudaMallocFromPoolAsync(buf, n, u->pool, NULL);
    if (e == cudaSuccess)
        return 0;
    cudaGetLastError();
    return ghc_error_set(u->core, GHC_ENOMEM, "gh200_uvm: cannot make a saved-activation buffer of %.1f MiB on "
                         "cuda:%d: %s (fewer buffers: saved_ring; or saved = \"device\")", n / 1048576.0, u->device,
                         cudaGetErrorString(e));
}

static void uvm_buf_free(void *ctx, void *buf)
{
    (void)ctx;
    cudaFreeAsync(buf, NULL);
}

/* ---- init ---------------------------------------------------------------------------------------- */

static int uvm_init(ghc_core_t *core, ghc_cfg_t *cfg, void **self)
{
    struct uvm_settings s;
    int rc, n = 0, integrated = 0, hpt = 0, cma = 0;
    if ((rc = uvm_settings_read(core, cfg, &s)) < 0)
        return rc;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n < 1) {
        cudaGetLastError();
        return ghc_error_set(core, GHC_EUNSUPPORTED, "%s: gh200_uvm: no CUDA device (%s); use mempolicy \"host\" on "
                             "a machine without a GPU", ghc_cfg_where(cfg, NULL),
                             e != cudaSuccess ? cudaGetErrorString(e) : "count 0");
    }
    if (s.device >= n)
        return ghc_error_set(core, GHC_ECONFIG, "%s: gh200_uvm: device %lld, but there %s %d CUDA device%s",
                             ghc_cfg_where(cfg, "device"), (long long)s.device, n == 1 ? "is" : "are", n, n == 1 ? "" : "s");
    int dev = (int)s.device;
    cudaDeviceGetAttribute(&integrated, cudaDevAttrIntegrated, dev);
    cudaDeviceGetAttribute(&hpt, cudaDevAttrPageableMemoryAccessUsesHostPageTables, dev);
    cudaDeviceGetAttribute(&cma, cudaDevAttrConcurrentManagedAccess, dev);
    enum ghc_mem_platform platform = uvm_platform_classify(integrated, hpt, cma);
    if (platform == GHC_PLATFORM_NONE)
        return ghc_error_set(core, GHC_EUNSUPPORTED, "%s: gh200_uvm: CUDA device %d has no concurrent managed access "
                             "(Windows/WSL or an old GPU); use mempolicy \"device\" or \"offload\"",
                             ghc_cfg_where(cfg, NULL), dev);
    struct uvm *u = calloc(1, sizeof(*u));
    if (!u)
        return ghc_error_set(core, GHC_ENOMEM, "gh200_uvm: out of memory");
    *u = (struct uvm){ .core = core, .device = dev, .platform = platform, .pattern = s.pattern, .hints = s.hints,
                       .telemetry = s.telemetry, .dir = 1,
                       .saved_host = s.saved == 1 || (s.saved == 0 && platform != GHC_PLATFORM_INTEGRATED) };
    pthread_mutex_init(&u->lock, NULL);
    uint64_t keep = UINT64_MAX;
    size_t fr = 0, tot = 0;
    if ((e = cudaSetDevice(dev)) != cudaSuccess || (e = cudaMemGetInfo(&fr, &tot)) != cudaSuccess ||
        (e = cudaDeviceGetDefaultMemPool(&u->pool, dev)) != cudaSuccess ||
        (e = cudaMemPoolSetAttribute(u->pool, cudaMemPoolAttrReleaseThreshold, &keep)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&u->side, cudaStreamNonBlocking)) != cudaSuccess) {
        cudaGetLastError();
        rc = ghc_error_set(core, GHC_ECUDA, "gh200_uvm: setting up device %d: %s", dev, cudaGetErrorString(e));
        goto fail;
    }
    uint64_t host = uvm_host_available(), total = tot, free_b = fr;
    if (platform == GHC_PLATFORM_INTEGRATED) {   /* one memory: budget against what the host has free */
        free_b = host;
        if (host && host < total)
            total = host;
    }
    uint64_t headroom = s.headroom_mib >= 0 ? (uint64_t)s.headroom_mib << 20
                        : (uint64_t)fmax(0.05 * (double)total, 2.0 * GIB);
    bool capped;
    uint64_t cap = uvm_cap(platform, total, free_b, host, s.ratio, headroom, &capped);
    uvm_sm_init(&u->sm, total, s.threshold, (uint64_t)(s.min_gib * GIB), s.hysteresis, cap, headroom,
                platform == GHC_PLATFORM_DISCRETE);
    u->budget = free_b > headroom ? free_b - headroom : 0;
    ghc_log(core, GHC_LOG_INFO, "gh200_uvm: %s platform, device %d: %.1f of %.1f GiB free, stage 1 below %.1f GiB "
            "(back above %.1f), managed cap %.1f GiB, %s, hints %s", ghc_mem_platform_name(platform), dev,
            free_b / GIB, total / GIB, u->sm.cfg.t_in / GIB, (u->sm.cfg.t_in + u->sm.cfg.hysteresis) / GIB, cap / GIB,
            uvm_pattern_name(s.pattern), s.hints ? "on" : "off");
    if (capped)
        ghc_log(core, GHC_LOG_WARN, "gh200_uvm: discrete GPU (not coherent, not integrated): managed memory capped at "
                "%.1f GiB = free %.1f GiB - headroom %.1f GiB instead of %.1f x %.1f GiB; oversubscription here can "
                "hang the GPU (use offload to go past HBM)", cap / GIB, free_b / GIB, headroom / GIB, s.ratio,
                total / GIB);
    if (s.telemetry && (rc = uvm_telemetry_init(core, dev, &u->tel)) < 0)
        goto fail;
    struct saved_io io;
    if ((rc = saved_cuda_io(core, dev, uvm_buf_alloc, uvm_buf_free, u, &io)) < 0) {
        uvm_telemetry_free(u->tel);
        goto fail;
    }
    saved_ring_init(&u->saved, core, "gh200_uvm", &io, (int)s.saved_ring, (int)s.saved_ahead, false);
    ghc_log(core, GHC_LOG_INFO, "gh200_uvm: saved activations %s", u->saved_host ? "in pinned host memory, through a "
            "ring of device buffers" : "placed like activations");
    *self = u;
    return 0;
fail:
    if (u->side)
        cudaStreamDestroy(u->side);
    pthread_mutex_destroy(&u->lock);
    free(u);
    return rc;
}

/* ---- alloc / release -------------------------------------------------------------------------- */

static int uvm_oom(struct uvm *u, size_t bytes, enum ghc_mem_role role, const char *why)
{
    char use[512];
    uint64_t by_role[GHC_ROLE_MAX];
    pthread_mutex_lock(&u->lock);
    memcpy(by_role, u->role, sizeof(by_role));
    pthread_mutex_unlock(&u->lock);
    return ghc_error_set(u->core, GHC_ENOMEM, "gh200_uvm: out of memory: %zu bytes (%.2f GiB) of %s: %s (stage %d, "
                         "managed %.2f of %.2f GiB cap, device free %.2f GiB); in use by role: %s", bytes, bytes / GIB,
                         ghc_mem_role_name(role), why, u->sm.stage, u->sm.managed / GIB, u->sm.cfg.managed_cap / GIB,
                         env_free(u) / GIB, ghc_mem_usage_text(by_role, GHC_ROLE_MAX, use, sizeof(use)));
}

static int uvm_alloc(void *self, size_t bytes, enum ghc_mem_role role, int device, void **ptr)
{
    struct uvm *u = self;
    struct uvm_env env = { u, env_free, env_light, env_hard };
    struct uvm_block *b = calloc(1, sizeof(*b));
    size_t n = bytes ? bytes : 1;
    cudaError_t e = cudaSuccess;
    enum uvm_where where = UVM_AT_DEVICE;
    if (!b)
        return ghc_error_set(u->core, GHC_ENOMEM, "gh200_uvm: out of memory");
    *b = (struct uvm_block){ .bytes = bytes, .role = role };
    bool home = device != GHC_DEVICE_CPU && role == GHC_ROLE_SAVED && u->saved_host;
    if (device == GHC_DEVICE_CPU || home) {
        b->at = AT_PINNED;
        if ((e = cudaMallocHost(&b->ptr, n)) != cudaSuccess) {
            cudaGetLastError();
            free(b);
            return uvm_oom(u, bytes, role, "pinned host memory");
        }
        int rc = 0;
        pthread_mutex_lock(&u->lock);
        if (home)
            rc = saved_ring_add(&u->saved, b->ptr, bytes);
        pthread_mutex_unlock(&u->lock);
        if (rc < 0) {
            cudaFreeHost(b->ptr);
            free(b);
            return rc;
        }
    } else {
        if (device != u->device) {
            free(b);
            return ghc_error_set(u->core, GHC_EUNSUPPORTED, "gh200_uvm: %s asked for on cuda:%d, but the policy "
                                 "manages cuda:%d", ghc_mem_role_name(role), device, u->device);
        }
        pthread_mutex_lock(&u->lock);
        enum uvm_result r = uvm_sm_place(&u->sm, &env, n, uvm_kind_for(role, u->hints), &where);
        for (int tries = 0; r == UVM_OK && where == UVM_AT_DEVICE; tries++) {
            if ((e = cudaMallocFromPoolAsync(&b->ptr, n, u->pool, NULL)) == cudaSuccess)
                break;
            cudaGetLastError();
            if (tries == 2) {
                r = UVM_OOM_DEVICE;
                break;
            }
            r = uvm_sm_device_failed(&u->sm, &env, n, tries > 0, &where);
        }
        if (r == UVM_OK && where == UVM_AT_MANAGED && (e = cudaMallocManaged(&b->ptr, n, cudaMemAttachGlobal)) != cudaSuccess) {
            cudaGetLastError();
            uvm_sm_release(&u->sm, n);
            r = UVM_OOM_CAP;
        }
        if (r != UVM_OK) {
            pthread_mutex_unlock(&u->lock);
            free(b);
            return uvm_oom(u, bytes, role, r == UVM_OOM_CAP ? "the managed cap is reached even after hard reclamation"
                                                             : "the device is full even after hard reclamation");
        }
        b->at = where == UVM_AT_MANAGED ? AT_MANAGED : AT_DEVICE;
        if (b->at == AT_MANAGED)
            uvm_apply_advice(u, b, uvm_advice_now(u, role, n));
        pthread_mutex_unlock(&u->lock);
    }
    pthread_mutex_lock(&u->lock);
    b->next = u->blocks;
    u->blocks = b;
    if ((u->role[role] += bytes) > u->role_peak[role])
        u->role_peak[role] = u->role[role];
    u->live += bytes;
    if (b->at == AT_MANAGED)
        u->role_managed[role] += bytes;
    else if (b->at == AT_DEVICE)
        u->live_dev += bytes;
    else
        u->live_pinned += bytes;
    if (u->live > u->peak)
        u->peak = u->live;
    pthread_mutex_unlock(&u->lock);
    *ptr = b->ptr;
    return 0;
}

static struct uvm_block *uvm_find(struct uvm *u, const void *ptr, struct uvm_block ***link)
{
    for (struct uvm_block **p = &u->blocks; *p; p = &(*p)->next)
        if ((*p)->ptr == ptr) {
            if (link)
                *link = p;
            return *p;
        }
    return NULL;
}

static void uvm_release(void *self, void *ptr)
{
    struct uvm *u = self;
    struct uvm_block **link = NULL;
    pthread_mutex_lock(&u->lock);
    struct uvm_block *b = uvm_find(u, ptr, &link);
    if (b) {
        *link = b->next;
        u->role[b->role] -= b->bytes;
        u->live -= b->bytes;
        if (b->at == AT_MANAGED) {
            u->role_managed[b->role] -= b->bytes;
            uvm_sm_release(&u->sm, b->bytes ? b->bytes : 1);
            if (b->advice == UVM_ADVICE_GPU)
                u->gpu_pref -= b->bytes;
        } else if (b->at == AT_DEVICE) {
            u->live_dev -= b->bytes;
        } else {
            u->live_pinned -= b->bytes;
            if (b->role == GHC_ROLE_SAVED)
                saved_ring_drop(&u->saved, ptr);
        }
    }
    pthread_mutex_unlock(&u->lock);
    if (!b) {
        ghc_log(u->core, GHC_LOG_ERROR, "gh200_uvm: release of %p, which it did not allocate", ptr);
        return;
    }
    if (b->at == AT_DEVICE)
        cudaFreeAsync(ptr, NULL);
    else if (b->at == AT_PINNED) {
        if (b->role == GHC_ROLE_SAVED)
            cudaDeviceSynchronize();   /* a copy of the saved ring may still use it */
        cudaFreeHost(ptr);
    }
    else
        cudaFree(ptr);   /* managed: synchronises, as the data may be in use anywhere */
    cudaGetLastError();
    free(b);
}

/* ---- advise, prefetch, phases ------------------------------------------------------------------ */

static int uvm_advise(void *self, void *ptr, size_t bytes, enum ghc_mem_role role)
{
    struct uvm *u = self;
    (void)bytes;
    pthread_mutex_lock(&u->lock);
    struct uvm_block *b = uvm_find(u, ptr, NULL);
    if (b && b->role != role) {
        u->role[b->role] -= b->bytes;
        if ((u->role[role] += b->bytes) > u->role_peak[role])
            u->role_peak[role] = u->role[role];
        if (b->at == AT_MANAGED) {
            u->role_managed[b->role] -= b->bytes;
            u->role_managed[role] += b->bytes;
        }
        b->role = role;
        if (b->at == AT_MANAGED)
            uvm_apply_advice(u, b, uvm_advice_now(u, role, b->bytes));
    }
    pthread_mutex_unlock(&u->lock);
    return 0;   /* hints on memory the policy does not manage are no-ops */
}

/* Prefetch a managed block to `device` on `stream` (the side stream when NULL); no-op for
 * device or pinned memory and for a block already prefetched there. Lock held. */
static void uvm_prefetch_block(struct uvm *u, struct uvm_block *b, int device, cudaStream_t stream)
{
    if (b->at != AT_MANAGED || (device != GHC_DEVICE_CPU && b->on_gpu))
        return;
    struct cudaMemLocation loc = device == GHC_DEVICE_CPU
        ? (struct cudaMemLocation){ .type = cudaMemLocationTypeHost, .id = 0 }
        : (struct cudaMemLocation){ .type = cudaMemLocationTypeDevice, .id = device };
    if (cudaMemPrefetchAsync(b->ptr, b->bytes ? b->bytes : 1, loc, 0, stream) != cudaSuccess) {
        cudaGetLastError();
        return;
    }
    b->on_gpu = device != GHC_DEVICE_CPU;
    u->prefetched += b->bytes;
}

static int uvm_prefetch(void *self, void *ptr, size_t bytes, int device, void *stream)
{
    struct uvm *u = self;
    (void)bytes;
    pthread_mutex_lock(&u->lock);
    struct uvm_block *b = uvm_find(u, ptr, NULL);
    if (b)
        uvm_prefetch_block(u, b, device, stream ? (cudaStream_t)stream : u->side);
    pthread_mutex_unlock(&u->lock);
    if (b && b->at == AT_MANAGED && !stream) {   /* the compute stream waits for it before use */
        cudaEvent_t ev;
        if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) == cudaSuccess) {
            cudaEventRecord(ev, u->side);
            cudaStreamWaitEvent(NULL, ev, 0);
            cudaEventDestroy(ev);
        }
        cudaGetLastError();
    }
    return 0;
}

static int uvm_group(void *self, int64_t group, void *const *ptrs, const size_t *bytes, int n)
{
    struct uvm *u = self;
    if (group < 0 || group > (1 << 20))
        return ghc_error_set(u->core, GHC_EINVAL, "gh200_uvm: group %lld out of range", (long long)group);
    if (group >= u->n_groups) {
        struct uvm_group *g = realloc(u->groups, (size_t)(group + 1) * sizeof(*g));
        if (!g)
            return ghc_error_set(u->core, GHC_ENOMEM, "gh200_uvm: out of memory");
        memset(g + u->n_groups, 0, (size_t)(group + 1 - u->n_groups) * sizeof(*g));
        u->groups = g;
        u->n_groups = group + 1;
    }
    struct uvm_group *g = &u->groups[group];
    free(g->ptrs);
    free(g->bytes);
    g->ptrs = malloc((size_t)n * sizeof(*g->ptrs));
    g->bytes = malloc((size_t)n * sizeof(*g->bytes));
    if (!g->ptrs || !g->bytes)
        return ghc_error_set(u->core, GHC_ENOMEM, "gh200_uvm: out of memory");
    memcpy(g->ptrs, ptrs, (size_t)n * sizeof(*ptrs));
    memcpy(g->bytes, bytes, (size_t)n * sizeof(*bytes));
    g->n = n;
    if (!g->ev && cudaEventCreateWithFlags(&g->ev, cudaEventDisableTiming) != cudaSuccess) {
        cudaGetLastError();
        return ghc_error_set(u->core, GHC_ECUDA, "gh200_uvm: cannot create an event");
    }
    return 0;
}

/* Prefetch group i's managed parts to the GPU on the side stream and mark its end. */
static void uvm_group_prefetch(struct uvm *u, int64_t i)
{
    if (i < 0 || i >= u->n_groups || !u->groups[i].n)
        return;
    struct uvm_group *g = &u->groups[i];
    bool any = false;
    pthread_mutex_lock(&u->lock);
    for (int k = 0; k < g->n; k++) {
        struct uvm_block *b = uvm_find(u, g->ptrs[k], NULL);
        if (b && b->at == AT_MANAGED && !b->on_gpu) {
            uvm_prefetch_block(u, b, u->device, u->side);
            any = true;
        }
    }
    pthread_mutex_unlock(&u->lock);
    if (any) {
        cudaEventRecord(g->ev, u->side);
        g->pending = true;
    }
}

static int uvm_phase(void *self, enum ghc_mem_phase phase, int64_t index)
{
    struct uvm *u = self;
    switch (phase) {
    case GHC_PHASE_FORWARD_BEGIN:
        u->dir = 1;
        uvm_group_prefetch(u, 0);
        break;
    case GHC_PHASE_BACKWARD_BEGIN:
        u->dir = -1;
        uvm_group_prefetch(u, index - 1);
        break;
    case GHC_PHASE_BLOCK_BEGIN:
        if (index >= 0 && index < u->n_groups && u->groups[index].pending) {
            cudaStreamWaitEvent(NULL, u->groups[index].ev, 0);   /* the block's weights are there */
            u->groups[index].pending = false;
        }
        uvm_group_prefetch(u, index + u->dir);
        break;
    case GHC_PHASE_STEP_END: {
        pthread_mutex_lock(&u->lock);
        uvm_sm_reevaluate(&u->sm, env_free(u));
        pthread_mutex_unlock(&u->lock);
        if (u->tel) {
            struct uvm_tel_counts c;
            uvm_telemetry_flush(u->tel, &c);
            ghc_log(u->core, GHC_LOG_INFO, "gh200_uvm: step %lld: %llu GPU page faults, %llu CPU page faults, "
                    "%.1f MiB HtoD, %.1f MiB DtoH, %llu thrashing", (long long)index,
                    (unsigned long long)c.gpu_faults, (unsigned long long)c.cpu_faults, c.htod / 1048576.0,
                    c.dtoh / 1048576.0, (unsigned long long)c.thrashing);
        }
        break;
    }
    default:
        break;
    }
    cudaGetLastError();
    return 0;
}

/* ---- saved activations ------------------------------------------------------------------------- */

static int uvm_saved_begin(void *self, void *ptr, size_t bytes, int64_t unit, bool write, void *stream, void **at)
{
    struct uvm *u = self;
    pthread_mutex_lock(&u->lock);
    int rc = saved_ring_begin(&u->saved, ptr, bytes, unit, write, stream, at);
    pthread_mutex_unlock(&u->lock);
    return rc;
}

static int uvm_saved_end(void *self, void *ptr, void *stream)
{
    struct uvm *u = self;
    pthread_mutex_lock(&u->lock);
    int rc = saved_ring_end(&u->saved, ptr, stream);
    pthread_mutex_unlock(&u->lock);
    return rc;
}

static int uvm_trim(void *self, bool hard)
{
    struct uvm *u = self;
    pthread_mutex_lock(&u->lock);
    if (hard) {
        env_hard(u);
        u->sm.hard++;
    } else {
        env_light(u);
        u->sm.light++;
    }
    uvm_sm_reevaluate(&u->sm, env_free(u));   /* the forks' empty-cache fix */
    pthread_mutex_unlock(&u->lock);
    return 0;
}

static int uvm_stats(void *self, struct ghc_mem_stats *out)
{
    struct uvm *u = self;
    if (out->struct_size < offsetof(struct ghc_mem_stats, saved_out_bytes))
        return ghc_error_set(u->core, GHC_EINVAL, "gh200_uvm: stats struct_size %u too small", out->struct_size);
    pthread_mutex_lock(&u->lock);
    memcpy(out->bytes_role, u->role, sizeof(u->role));
    memcpy(out->bytes_role_managed, u->role_managed, sizeof(u->role_managed));
    out->stage = u->sm.stage;
    out->bytes_host = u->live_pinned;
    out->bytes_pinned = u->live_pinned;
    out->bytes_device = u->live_dev + saved_ring_bytes(&u->saved);
    out->bytes_managed = u->sm.managed;
    if (out->struct_size >= offsetof(struct ghc_mem_stats, bytes_role_peak) + sizeof(out->bytes_role_peak))
        memcpy(out->bytes_role_peak, u->role_peak, sizeof(u->role_peak));
    if (out->struct_size >= offsetof(struct ghc_mem_stats, saved_ring_bytes) + sizeof(uint64_t)) {
        out->saved_out_bytes = u->saved.out_bytes;
        out->saved_in_bytes = u->saved.in_bytes;
        out->saved_hits = u->saved.hits;
        out->saved_ring_bytes = saved_ring_bytes(&u->saved);
    }
    out->bytes_peak = u->peak;
    out->prefetched_bytes = u->prefetched;
    out->transitions = u->sm.transitions;
    out->light_reclamations = u->sm.light;
    out->hard_reclamations = u->sm.hard;
    out->reclamations = u->sm.light + u->sm.hard;
    out->bytes_gpu_preferred = u->gpu_pref;
    out->device_budget = u->budget;
    out->managed_cap = u->sm.cfg.managed_cap;
    out->platform = (int32_t)u->platform;
    pthread_mutex_unlock(&u->lock);
    if (u->tel) {
        struct uvm_tel_counts c;
        uvm_telemetry_peek(u->tel, &c);
        out->page_faults = c.gpu_faults;
        out->cpu_page_faults = c.cpu_faults;
        out->bytes_htod = c.htod;
        out->bytes_dtoh = c.dtoh;
        out->thrashing = c.thrashing;
    }
    return 0;
}

static void uvm_free(void *self)
{
    struct uvm *u = self;
    if (!u)
        return;
    if (u->live)
        ghc_log(u->core, GHC_LOG_WARN, "gh200_uvm: %llu bytes still allocated at exit", (unsigned long long)u->live);
    saved_ring_free(&u->saved);
    saved_cuda_io_free(&u->saved.io);
    while (u->blocks) {
        struct uvm_block *b = u->blocks;
        u->blocks = b->next;
        free(b);   /* the memory itself goes with the CUDA context */
    }
    for (int64_t i = 0; i < u->n_groups; i++) {
        free(u->groups[i].ptrs);
        free(u->groups[i].bytes);
        if (u->groups[i].ev)
            cudaEventDestroy(u->groups[i].ev);
    }
    free(u->groups);
    uvm_telemetry_free(u->tel);
    if (u->side)
        cudaStreamDestroy(u->side);
    cudaGetLastError();
    pthread_mutex_destroy(&u->lock);
    free(u);
}

static const struct ghc_mempolicy_ops uvm_ops = {
    .struct_size = sizeof(struct ghc_mempolicy_ops),
    .name = "gh200_uvm",
    .keys = uvm_keys,
    .init = uvm_init,
    .alloc = uvm_alloc,
    .release = uvm_release,
    .advise = uvm_advise,
    .prefetch = uvm_prefetch,
    .phase = uvm_phase,
    .stats = uvm_stats,
    .free = uvm_free,
    .trim = uvm_trim,
    .group = uvm_group,
    .probe = uvm_probe,
    .saved_begin = uvm_saved_begin,
    .saved_end = uvm_saved_end,
};

static int uvm_plugin_init(ghc_core_t *core) { return ghc_register_mempolicy(core, &uvm_ops); }

GHC_PLUGIN_EXPORT const struct ghc_plugin ghc_plugin_gh200_uvm = {
    .abi = GHC_PLUGIN_ABI,
    .api = GHC_API_VERSION,
    .struct_size = sizeof(struct ghc_plugin),
    .kinds = GHC_KIND_BIT(GHC_KIND_MEMPOLICY),
    .name = "gh200_uvm",
    .version = GHC_VERSION,
    .description = "device pool, then managed memory past the stage-1 threshold, with placement per role, prefetch "
                   "and a safe cap (GH200, GB10, discrete GPUs)",
    .init = uvm_plugin_init,
};
