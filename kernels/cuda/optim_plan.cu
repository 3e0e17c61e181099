/* optim_plan.cu: automagic's host side (ghc_k_automagic and its switches, ops.h "optimizer
 * updates"): the plan, made once per (device, stream, tensor list): the tensor table in
 * device memory, the chunk lists of the separate passes (optim_automagic.cu), and the thin
 * tensors that the cluster kernel (optim_am_fused.cu) takes, grouped by kind into launches
 * on streams of their own; then the launches of a step, no host synchronisation in the
 * steady state. */
#include <algorithm>
#include <mutex>
#include <vector>

#include "optim_impl.cuh"   /* defines: am_desc, am_plan_dev, af_layout_of, af_kernel, am_launch_* */

#define AM_PLANS 16     /* cached plans: (device, stream, tensor list) */

/* ---- switches: profiling and measurement aids, all read here --------------------------------- */

/* The entries' switches (kernels.h), read and set under g_am_lock. */
static std::mutex g_am_lock;
static struct {
    bool        on;
    cudaEvent_t ev[4];
    double      ms[3];
    int64_t     calls;
} g_am_prof;   /* ghc_k_automagic_profile */
static bool g_af_off;     /* ghc_k_automagic_fused(0) */
static int  g_af_late;    /* ghc_k_automagic_fused(2): the new scale always after the update */
static bool g_af_serial;  /* ghc_k_automagic_serial(1) */

extern "C" void ghc_k_automagic_profile(int on, double ms[3])
{
    std::lock_guard<std::mutex> lk(g_am_lock);
    for (int k = 0; k < 3 && ms; k++)
        ms[k] = g_am_prof.calls ? g_am_prof.ms[k] / g_am_prof.calls : 0.0;
    memset(g_am_prof.ms, 0, sizeof(g_am_prof.ms));
    g_am_prof.calls = 0;
    g_am_prof.on = on != 0;
}

extern "C" void ghc_k_automagic_fused(int on)
{
    std::lock_guard<std::mutex> lk(g_am_lock);
    g_af_off = on == 0;
    g_af_late = on == 2;
}

extern "C" void ghc_k_automagic_serial(int on)
{
    std::lock_guard<std::mutex> lk(g_am_lock);
    g_af_serial = on != 0;
}

/* ---- automagic plans: the device table, made once per (device, stream, tensor list) ---------- */

struct am_plan {
    int                  dev;
    cudaStream_t         stream;
    std::vector<am_desc> desc;   /* as uploaded (offsets of the first call) */
    void                *buf;
    am_plan_dev          d;
    int32_t              total1, totalf;   /* totalf: the flat chunks listed in d.listf */
    int32_t              thin1;   /* the first thin1 chunks of d.list1 go to k_am_stats_thin */
    struct group {
        int32_t  K, wide, nc, first, count;   /* d.fl[first ..] */
        int32_t  span, ncl;                   /* the largest span; clusters resident (launched) */
        int32_t  pbuf;                        /* the params through shared memory (af_layout::par) */
        uint32_t smem;
    };
    std::vector<group>   fused;   /* the launches of k_am_fused */
    uint64_t             used;
};

/* k_am_fused's groups after the first run on streams of their own, per device (made once) */
#define AF_STREAMS 7
static struct {
    cudaStream_t s[AF_STREAMS];
    cudaEvent_t  fork, join[AF_STREAMS];
    bool         made;
} g_af_st[64];

static cudaError_t af_streams(int dev)
{
    if (g_af_st[dev].made)
        return cudaSuccess;
    cudaError_t e = cudaEventCreateWithFlags(&g_af_st[dev].fork, cudaEventDisableTiming);
    for (int i = 0; i < AF_STREAMS && e == cudaSuccess; i++)
        if ((e = cudaStreamCreateWithFlags(&g_af_st[dev].s[i], cudaStreamNonBlocking)) == cudaSuccess)
            e = cudaEventCreateWithFlags(&g_af_st[dev].join[i], cudaEventDisableTiming);
    g_af_st[dev].made = e == cudaSuccess;
    return e;
}

static am_plan    g_am[AM_PLANS];
static int        g_am_count;
static uint64_t   g_am_clock;

/* The magic pair of d >= 1 for am_div: l = ceil(log2 d), m = 2^32 (2^l - d) / d + 1. */
static void am_magic(int64_t d, uint32_t *m, int32_t *l)
{
    int k = 0;
    while ((INT64_C(1) << k) < d)
        k++;
    *l = k;
    *m = (uint32_t)((((uint64_t)1 << 32) * (((uint64_t)1 << k) - (uint64_t)d)) / (uint64_t)d + 1);
}

/* A launch of k_am_fused: grid blocks of AF_T threads in clusters of nc, smem bytes of dynamic
 * shared memory, on stream s (at: the cluster attribute, which cfg points to). */
static cudaLaunchConfig_t af_config(cudaLaunchAttribute *at, int nc, unsigned grid, size_t smem, cudaStream_t s)
{
    at->id = cudaLaunchAttributeClusterDimension;
    at->val.clusterDim.x = (unsigned)nc;
    at->val.clusterDim.y = at->val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(AF_T);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    return cfg;
}

/* What k_am_fused may do on each device, found once: the largest cluster (0: not yet asked,
 * -1: none: no cluster launch, too little shared memory, or switched off) and the shared
 * memory a block may have. */
#define AF_DEVS 64
static struct {
    int max_nc, optin;
} g_af_dev[AF_DEVS];

static void af_device(int dev)
{
    if (dev < 0 || dev >= AF_DEVS || g_af_dev[dev].max_nc)
        return;
    int cl = 0, optin = 0;
    g_af_dev[dev].max_nc = -1;
    if (cudaDeviceGetAttribute(&cl, cudaDevAttrClusterLaunch, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess || !cl ||
        optin < 64 * 1024) {
        cudaGetLastError();
        return;
    }
    for (int k = 0; k < 8; k++) {
        af_fn f = af_kernel(4 << (k % 4), k < 4);
        if (cudaFuncSetAttribute((const void *)f, cudaFuncAttributeMaxDynamicSharedMemorySize, optin) != cudaSuccess ||
            cudaFuncSetAttribute((const void *)f, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
            cudaGetLastError();
            return;
        }
    }
    cudaLaunchAttribute at;
    const cudaLaunchConfig_t cfg = af_config(&at, AF_MAXNC, AF_MAXNC, (size_t)optin, 0);
    int num = 0;
    bool big = cudaOccupancyMaxActiveClusters(&num, af_kernel(16, true), &cfg) == cudaSuccess && num > 0;
    cudaGetLastError();
    g_af_dev[dev].optin = optin;
    g_af_dev[dev].max_nc = big ? AF_MAXNC : 8;
}

/* The cluster size k_am_fused takes t with on device dev and the long side's lines a block
 * (*span), or 0: t must be thin (f32 g), one matrix, f32 params, the int8 mask, every array
 * 16-byte aligned and the long side in groups of 128 elements (whole bulk copies and polarity
 * words per block); the smallest power of two (clusters pack into the GPCs) whose blocks fit
 * in an SM's shared memory. */
static int32_t af_fit(const am_desc &t, int dev, int32_t *span)
{
    if (g_af_off || !t.thin || t.B != 1 || t.p_bf16 || !t.m8 || (t.wide ? t.C : t.n) % 128 != 0)
        return 0;
    uintptr_t al = (uintptr_t)t.p | (uintptr_t)t.g | (uintptr_t)t.s0 | (uintptr_t)t.s1 | (uintptr_t)t.mask |
                   (uintptr_t)t.pol | (uintptr_t)t.agree;
    if (al % 16 != 0)
        return 0;
    af_device(dev);
    if (dev < 0 || dev >= AF_DEVS || g_af_dev[dev].max_nc < 1)
        return 0;
    const int K = t.thin, L = t.wide ? t.C : t.R, unit = t.wide ? 128 : 128 / K;
    for (int nc = 1; nc <= g_af_dev[dev].max_nc; nc *= 2) {
        int sp = (L + nc - 1) / nc;
        sp = (sp + unit - 1) / unit * unit;
        if (af_layout_of(K, sp, false, t.wide).bytes <= (uint32_t)g_af_dev[dev].optin) {
            *span = sp;
            return nc;
        }
    }
    return 0;
}

/* The table of a call (zeroed padding, so that tables compare with memcmp), the chunk starts
 * and the scratch size in floats. */
static cudaError_t am_describe(int dev, const ghc_optim_tensor *ts, int32_t n, std::vector<am_desc> &d,
                               std::vector<int32_t> &s1, std::vector<int32_t> &sf, int64_t *floats)
{
    d.resize((size_t)n);
    memset(d.data(), 0, sizeof(am_desc) * (size_t)n);
    s1.assign((size_t)n + 1, 0);
    sf.assign((size_t)n + 1, 0);
    int64_t off = 0, c1 = 0, cf = 0;
    for (int32_t i = 0; i < n; i++) {
        const ghc_optim_tensor &o = ts[i];
        const ghc_tensor_t *p = o.param;
        am_desc &t = d[(size_t)i];
        int64_t N = ghc_tensor_numel(p);
        bool f = o.state[1] != NULL;
        if (N > INT32_MAX - AM_CH)
            return cudaErrorInvalidValue;
        int64_t R = f ? ghc_tensor_dim(p, -2) : 1, C = f ? ghc_tensor_dim(p, -1) : N;
        t.p = ghc_tensor_data(o.param);
        t.g = ghc_tensor_cdata(o.grad);
        t.s0 = ghc_k_ptr<float>(o.state[0]);
        t.s1 = ghc_k_ptr<float>(o.state[1]);
        t.mask = ghc_tensor_data(o.state[2]);
        t.aux = ghc_k_ptr<float>(o.state[3]);
        t.pol = ghc_k_ptr<uint32_t>(o.state[4]);
        t.agree = ghc_k_ptr<uint32_t>(o.state[5]);
        t.seed = o.rng.seed;
        t.offset = o.rng.offset;
        t.n = (int32_t)N;
        t.R = (int32_t)R;
        t.C = (int32_t)C;
        t.B = R * C ? (int32_t)(N / (R * C)) : 0;
        t.p_bf16 = ghc_tensor_dtype(p) == GHC_DTYPE_BF16;
        t.g_bf16 = ghc_tensor_dtype(o.grad) == GHC_DTYPE_BF16;
        t.m8 = ghc_tensor_dtype(o.state[2]) == GHC_DTYPE_U8;
        t.nf = (int32_t)((N + AM_CH - 1) / AM_CH);
        t.vec = (uintptr_t)t.p % (t.p_bf16 ? 8 : 16) == 0 && (uintptr_t)t.g % (t.g_bf16 ? 8 : 16) == 0 &&
                (f || (uintptr_t)t.s0 % 16 == 0) && (uintptr_t)t.mask % (t.m8 ? 4 : 16) == 0;
        int64_t nch1 = t.nf;
        t.part = off;
        if (f && N > 0) {
            t.wide = R < C;
            int64_t K = t.wide ? R : C, L = t.wide ? C : R, span = (AM_SCH + K - 1) / K;
            span = span < 32 ? 32 : span;   /* partials at most 1/16 of the tensor */
            span = span > L ? L : span;
            if ((K == 4 || K == 8 || K == 16 || K == 32) && !t.g_bf16 && (uintptr_t)t.g % 16 == 0 && C % 4 == 0) {
                t.thin = (int32_t)K;   /* k_am_stats_thin: a block's columns (wide) or rows (tall) */
                span = t.wide ? AM_T * (K == 32 ? 1 : K == 16 ? 2 : 4) : AM_T / (K / 4) * AM_TU;
            }
            t.span = (int32_t)span;
            t.cpm = (int32_t)((L + span - 1) / span);
            nch1 = (int64_t)t.B * t.cpm;
            if ((t.fused = af_fit(t, dev, &t.span)) != 0)
                nch1 = 0;   /* k_am_fused takes it all */
            off += nch1 * 2 * K;
            t.rmean = off;
            off += t.B;
            t.rcf = off;
            off += (int64_t)t.B * (R + C);
            am_magic(C, &t.mC, &t.lC);
            am_magic(R * C, &t.mRC, &t.lRC);
        } else {
            off += t.nf;
        }
        t.lrp = off;
        off += 2 * (int64_t)t.nf;
        if (N == 0)
            nch1 = 1;   /* a stats chunk that does nothing, so that its block runs the finish */
        c1 += nch1;
        cf += t.nf;
        if (c1 > INT32_MAX || cf > INT32_MAX)
            return cudaErrorInvalidValue;
        s1[(size_t)i + 1] = (int32_t)c1;
        sf[(size_t)i + 1] = (int32_t)cf;
    }
    *floats = off;
    return cudaSuccess;
}

/* The cached plan of this call, or a new one (allocated and its table copied on `s`: the
 * first call with a tensor list may synchronise, later ones neither copy nor synchronise).
 * The bf16 rounding offsets may move between calls by one common delta (the step counter).
 * Called with g_am_lock held. */
static cudaError_t am_plan_get(int dev, cudaStream_t s, const ghc_optim_tensor *ts, int32_t n, am_plan **out,
                               uint64_t *delta)
{
    std::vector<am_desc> d;
    std::vector<int32_t> s1, sf;
    int64_t floats = 0;
    cudaError_t e = am_describe(dev, ts, n, d, s1, sf, &floats);
    if (e != cudaSuccess)
        return e;
    for (int k = 0; k < g_am_count; k++) {
        am_plan &p = g_am[k];
        if (p.dev != dev || p.stream != s || p.desc.size() != (size_t)n)
            continue;
        uint64_t dl = d[0].offset - p.desc[0].offset;
        bool same = true;
        for (int32_t i = 0; i < n && same; i++) {
            am_desc x;
            memcpy(&x, &d[(size_t)i], sizeof(x));
            x.offset -= dl;
            same = memcmp(&x, &p.desc[(size_t)i], sizeof(x)) == 0;
        }
        if (same) {
            p.used = ++g_am_clock;
            *out = &p;
            *delta = dl;
            return cudaSuccess;
        }
    }
    int slot = g_am_count;
    if (slot == AM_PLANS) {   /* the least recently used goes, once its work is done */
        slot = 0;
        for (int k = 1; k < AM_PLANS; k++)
            if (g_am[k].used < g_am[slot].used)
                slot = k;
        ghc_k_device_guard dg(g_am[slot].dev);
        if ((e = cudaDeviceSynchronize()) != cudaSuccess)
            return e;
        cudaFree(g_am[slot].buf);
        g_am[slot].buf = NULL;
        g_am[slot].desc.clear();
    } else {
        g_am_count++;
    }
    am_plan &p = g_am[slot];
    const size_t n1 = (size_t)s1[(size_t)n], nf = (size_t)sf[(size_t)n];
    size_t tb = (sizeof(am_desc) * (size_t)n + 255) & ~(size_t)255, sb = sizeof(int32_t) * ((size_t)n + 1);
    /* ..., own1, ownf, list1 [n1], done [n] (zero), listf [nf], fl [n] */
    size_t hdr = tb + 2 * sb + sizeof(int32_t) * (2 * n1 + 2 * nf + 2 * (size_t)n);
    size_t bytes = ((hdr + 255) & ~(size_t)255) + sizeof(float) * (2 * (size_t)n + (size_t)floats);
    std::vector<char> h(hdr);
    memcpy(h.data(), d.data(), sizeof(am_desc) * (size_t)n);
    memcpy(h.data() + tb, s1.data(), sb);
    memcpy(h.data() + tb + sb, sf.data(), sb);
    int32_t *own = (int32_t *)(h.data() + tb + 2 * sb);   /* chunk -> tensor: one load, not a search */
    for (int32_t i = 0; i < n; i++) {
        for (int32_t c = s1[(size_t)i]; c < s1[(size_t)i + 1]; c++)
            own[c] = i;
        for (int32_t c = sf[(size_t)i]; c < sf[(size_t)i + 1]; c++)
            own[n1 + (size_t)c] = i;
    }
    int32_t *list = own + n1 + nf, nthin = 0, k1 = 0;   /* the thin tensors' stats chunks first */
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1)
            nthin = k1;
        for (int32_t i = 0; i < n; i++)
            if ((d[(size_t)i].thin != 0) == (pass == 0))
                for (int32_t c = s1[(size_t)i]; c < s1[(size_t)i + 1]; c++)
                    list[k1++] = c;
    }
    int32_t *listf = list + n1 + n, *fl = listf + nf, kf = 0, nfl = 0;
    for (int32_t i = 0; i < n; i++)   /* the flat chunks of the tensors k_am_fused does not take */
        if (!d[(size_t)i].fused)
            for (int32_t c = sf[(size_t)i]; c < sf[(size_t)i + 1]; c++)
                listf[kf++] = c;
    std::vector<am_plan::group> groups;   /* k_am_fused's tensors by (K, wide, cluster size) */
    for (int32_t i = 0; i < n; i++) {
        const am_desc &t = d[(size_t)i];
        if (!t.fused)
            continue;
        bool seen = false;
        for (const am_plan::group &g : groups)
            seen = seen || (g.K == t.thin && g.wide == t.wide && g.nc == t.fused);
        if (seen)
            continue;
        am_plan::group g = { t.thin, t.wide, t.fused, nfl, 0, 0, 0, 0, 0 };
        for (int32_t j = i; j < n; j++) {
            const am_desc &u = d[(size_t)j];
            if (u.fused == g.nc && u.thin == g.K && u.wide == g.wide) {
                fl[nfl++] = j;
                g.count++;
                g.span = std::max(g.span, u.span);
            }
        }
        /* the params through shared memory too where they fit */
        g.pbuf = af_layout_of(g.K, g.span, true, g.wide).bytes <= (uint32_t)g_af_dev[dev].optin;
        g.smem = af_layout_of(g.K, g.span, g.pbuf, g.wide).bytes;
        cudaLaunchAttribute at;
        const cudaLaunchConfig_t cfg = af_config(&at, g.nc, (unsigned)g.nc, g.smem, s);
        int act = 0;
        e = cudaOccupancyMaxActiveClusters(&act, af_kernel(g.K, g.wide), &cfg);
        if (e == cudaSuccess && act < 1)
            e = cudaErrorInvalidConfiguration;   /* af_fit admitted only what fits */
        if (e != cudaSuccess) {
            g_am[slot] = g_am[--g_am_count];   /* drop the slot (the last one moves in) */
            return e;
        }
        g.ncl = std::min(act, g.count);
        groups.push_back(g);
    }
    void *buf = NULL;
    if ((e = cudaMalloc(&buf, bytes)) != cudaSuccess ||
        (e = cudaMemcpyAsync(buf, h.data(), hdr, cudaMemcpyHostToDevice, s)) != cudaSuccess) {
        cudaFree(buf);
        g_am[slot] = g_am[--g_am_count];   /* drop the slot (the last one moves in) */
        return e;
    }
    char *c = (char *)buf;
    float *scal = (float *)(c + ((hdr + 255) & ~(size_t)255));
    p.dev = dev;
    p.stream = s;
    p.desc.swap(d);
    p.buf = buf;
    const int32_t *own_d = (const int32_t *)(c + tb + 2 * sb);
    p.d = am_plan_dev{ (const am_desc *)c, (const int32_t *)(c + tb), (const int32_t *)(c + tb + sb), scal,
                       scal + 2 * (size_t)n, n, own_d, own_d + n1, own_d + n1 + nf,
                       (int32_t *)(own_d + 2 * n1 + nf), own_d + 2 * n1 + nf + n, own_d + 2 * n1 + 2 * nf + n };
    p.total1 = s1[(size_t)n];
    p.thin1 = nthin;
    p.totalf = kf;
    p.fused.swap(groups);
    p.used = ++g_am_clock;
    *out = &p;
    *delta = 0;
    return cudaSuccess;
}

extern "C" int ghc_k_automagic(struct ghc_optim_tensor *ts, int32_t n, const struct ghc_automagic_args *args,
                               void *stream)
{
    ghc_k_device_guard dg(ts[0].param);
    GHC_K_TRY(dg.err);
    cudaStream_t s = (cudaStream_t)stream;
    std::lock_guard<std::mutex> lk(g_am_lock);
    am_plan *p = NULL;
    uint64_t delta = 0;
    GHC_K_TRY(am_plan_get(ghc_tensor_device(ts[0].param), s, ts, n, &p, &delta));
    const bool prof = g_am_prof.on;
    for (int k = 0; prof && k < 4; k++)
        GHC_K_TRY(g_am_prof.ev[k] ? cudaSuccess : cudaEventCreate(&g_am_prof.ev[k]));
    if (prof)
        cudaEventRecord(g_am_prof.ev[0], s);
    /* one cluster a tensor; the groups (independent tensors) on streams of their own, so that
     * one group's clusters take the multiprocessors another leaves idle or has finished with */
    const int dev = ghc_tensor_device(ts[0].param);
    const size_t ng = p->fused.size();
    const bool conc = ng > 1 && ng <= AF_STREAMS + 1 && dev >= 0 && dev < 64 && !g_af_serial;
    if (conc) {
        GHC_K_TRY(af_streams(dev));
        GHC_K_TRY(cudaEventRecord(g_af_st[dev].fork, s));
    }
    for (size_t i = 0; i < ng; i++) {
        const am_plan::group &g = p->fused[i];
        cudaStream_t gs = conc && i > 0 ? g_af_st[dev].s[i - 1] : s;
        if (gs != s)
            GHC_K_TRY(cudaStreamWaitEvent(gs, g_af_st[dev].fork, 0));
        cudaLaunchAttribute at;
        const cudaLaunchConfig_t cfg = af_config(&at, g.nc, (unsigned)(g.ncl * g.nc), g.smem, gs);
        GHC_K_TRY(cudaLaunchKernelEx(&cfg, af_kernel(g.K, g.wide), p->d, *args, g.first, g.count, g.span, g_af_late,
                                     g.pbuf));
        if (gs != s) {
            GHC_K_TRY(cudaEventRecord(g_af_st[dev].join[i - 1], gs));
            GHC_K_TRY(cudaStreamWaitEvent(s, g_af_st[dev].join[i - 1], 0));
        }
    }
    am_launch_stats(p->d, *args, p->thin1, p->total1, s);
    if (prof)
        cudaEventRecord(g_am_prof.ev[1], s);
    am_launch_update(p->d, *args, delta, p->totalf, s);
    if (prof)
        cudaEventRecord(g_am_prof.ev[2], s);
    am_launch_mask(p->d, *args, p->totalf, s);
    GHC_K_TRY(cudaGetLastError());
    if (prof) {
        cudaEventRecord(g_am_prof.ev[3], s);
        GHC_K_TRY(cudaEventSynchronize(g_am_prof.ev[3]));
        for (int k = 0; k < 3; k++) {
            float ms = 0;
            cudaEventElapsedTime(&ms, g_am_prof.ev[k], g_am_prof.ev[k + 1]);
            g_am_prof.ms[k] += ms;
        }
        g_am_prof.calls++;
    }
    return 0;
}
