/* optim.cu: the fused optimizer updates of ops.h ("optimizer updates") as multi-tensor launches:
 * the list of tensors travels by value in the kernel parameters (__grid_constant__, up to
 * 32 KB: CUDA 12.1+ on sm_70+), so a step makes a handful of launches and no host
 * synchronisation or copy.
 *   adamw:     element-wise; the tensors are cut into chunks of AW_CHUNK elements, one block
 *              each (a block finds its tensor by binary search of the chunk starts). The same
 *              roundings as kernels/cpu/optim.c (explicit _rn intrinsics, fmaf where the CPU
 *              has one), so a GPU step is bit-identical to the CPU's.
 *   automagic: one block of AM_THREADS per tensor, the passes (second moment, RMS, polarity and
 *              learning rates, int8 mask) separated by __syncthreads(); reductions in f32 in a
 *              fixed tree order (deterministic; within float rounding of the CPU's f64 sums). */
#include "common.cuh"

#define AW_MAX     256
#define AW_THREADS 256
#define AW_CHUNK   (AW_THREADS * 4 * 8)
#define AM_MAX     224
#define AM_THREADS 1024
#define AM_MAX_B   1024   /* factored tensors: at most this many [R, C] matrices (P.shape[:-2]) */

/* f32 -> bf16 by stochastic rounding with 32 random bits (kernels/cpu/random.c's rule). */
GHC_D uint16_t sr_bf16(float x, uint32_t r)
{
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7fffffffu) >= 0x7f800000u)
        return ghc_dev_f32_to_bf16(x);
    return (uint16_t)((u + (r >> 16)) >> 16);
}

GHC_D float ld_f(const void *p, int bf16, int64_t i)
{
    return bf16 ? ghc_dev_bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

GHC_D void st_param(void *p, int bf16, int64_t i, float x, uint64_t seed, uint64_t offset)
{
    if (!bf16) {
        ((float *)p)[i] = x;
        return;
    }
    uint32_t r[4];
    ghc_dev_philox_block(seed, offset, (uint64_t)i / 4, r);
    ((uint16_t *)p)[i] = sr_bf16(x, r[i % 4]);
}

/* ---- adamw -------------------------------------------------------------------------------- */

struct aw_tensor {
    void       *p;
    const void *g;
    float      *m, *v;
    int64_t     n;
    uint64_t    seed, offset;
    int32_t     p_bf16, g_bf16;
};

struct aw_list {
    aw_tensor t[AW_MAX];
    int32_t   start[AW_MAX + 1];   /* first chunk of each tensor; start[count] = all chunks */
    int32_t   count;
};

GHC_D float aw_elem(float x, float g, float *m, float *v, const ghc_adamw_args &a)
{
    x = __fmul_rn(x, a.decay);
    float mi = __fmaf_rn(a.beta1_comp, __fsub_rn(g, *m), *m);
    float vi = __fmaf_rn(__fmul_rn(a.beta2_comp, g), g, __fmul_rn(*v, a.beta2));
    *m = mi;
    *v = vi;
    float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), a.bc2_sqrt), a.eps);
    return __fadd_rn(x, __fdiv_rn(__fmul_rn(-a.step_size, mi), denom));
}

static __global__ void __launch_bounds__(AW_THREADS) k_adamw(const __grid_constant__ aw_list L, const ghc_adamw_args a)
{
    int lo = 0, hi = L.count - 1;
    while (lo < hi) {                       /* the last tensor whose start <= blockIdx.x */
        int mid = (lo + hi + 1) / 2;
        if (L.start[mid] <= (int32_t)blockIdx.x)
            lo = mid;
        else
            hi = mid - 1;
    }
    const aw_tensor &t = L.t[lo];
    int64_t c0 = (int64_t)(blockIdx.x - L.start[lo]) * AW_CHUNK, c1 = c0 + AW_CHUNK;
    if (c1 > t.n)
        c1 = t.n;
    bool vec = !t.p_bf16 && !t.g_bf16;
    for (int64_t i = c0 + 4 * (int64_t)threadIdx.x; i < c1; i += 4 * AW_THREADS) {
        if (vec && i + 4 <= c1) {
            float4 x = *(const float4 *)((const float *)t.p + i), g = *(const float4 *)((const float *)t.g + i);
            float4 m = *(const float4 *)(t.m + i), v = *(const float4 *)(t.v + i);
            x.x = aw_elem(x.x, g.x, &m.x, &v.x, a);
            x.y = aw_elem(x.y, g.y, &m.y, &v.y, a);
            x.z = aw_elem(x.z, g.z, &m.z, &v.z, a);
            x.w = aw_elem(x.w, g.w, &m.w, &v.w, a);
            *(float4 *)((float *)t.p + i) = x;
            *(float4 *)(t.m + i) = m;
            *(float4 *)(t.v + i) = v;
            continue;
        }
        for (int64_t j = i; j < i + 4 && j < c1; j++) {
            float x = aw_elem(ld_f(t.p, t.p_bf16, j), ld_f(t.g, t.g_bf16, j), &t.m[j], &t.v[j], a);
            st_param(t.p, t.p_bf16, j, x, t.seed, t.offset);
        }
    }
}

extern "C" int ghc_k_adamw(struct ghc_optim_tensor *ts, int32_t n, const struct ghc_adamw_args *args, void *stream)
{
    ghc_k_device_guard dg(ts[0].param);
    GHC_K_TRY(dg.err);
    cudaStream_t s = (cudaStream_t)stream;
    static aw_list L;   /* 17 KB: not on the stack; launches copy it */
    for (int32_t base = 0; base < n;) {
        int32_t k = 0, chunks = 0;
        for (; base + k < n && k < AW_MAX; k++) {
            const ghc_optim_tensor &o = ts[base + k];
            int64_t numel = ghc_tensor_numel(o.param);
            int64_t nc = (numel + AW_CHUNK - 1) / AW_CHUNK;
            if (k > 0 && (int64_t)chunks + nc > INT32_MAX / 2)
                break;
            L.t[k] = aw_tensor{ ghc_tensor_data(o.param), ghc_tensor_cdata(o.grad), ghc_k_ptr<float>(o.state[0]),
                                ghc_k_ptr<float>(o.state[1]), numel, o.rng.seed, o.rng.offset,
                                ghc_tensor_dtype(o.param) == GHC_DTYPE_BF16, ghc_tensor_dtype(o.grad) == GHC_DTYPE_BF16 };
            L.start[k] = chunks;
            chunks += (int32_t)nc;
        }
        L.start[k] = chunks;
        L.count = k;
        if (chunks > 0)
            k_adamw<<<chunks, AW_THREADS, 0, s>>>(L, *args);
        GHC_K_TRY(cudaGetLastError());
        base += k;
    }
    return 0;
}

/* ---- automagic ---------------------------------------------------------------------------- */

struct am_tensor {
    void       *p;
    const void *g;
    float      *s0, *s1;      /* R and C (factored), or S and NULL */
    void       *mask;         /* u8 codes or f32 */
    float      *aux;          /* [scale, mean lr] */
    uint32_t   *pol, *agree;
    int64_t     n, R, C;
    uint64_t    seed, offset;
    int32_t     p_bf16, g_bf16, m8;
};

struct am_list {
    am_tensor t[AM_MAX];
    int32_t   count;
};

/* Sum (or max) over the block of one value per thread, in a fixed order; every thread gets it. */
template <bool MAX>
GHC_D float block_reduce(float x, float *sh)
{
    for (int o = 16; o > 0; o /= 2) {
        float y = __shfl_xor_sync(0xffffffffu, x, o);
        x = MAX ? fmaxf(x, y) : __fadd_rn(x, y);
    }
    int w = threadIdx.x / 32, l = threadIdx.x % 32;
    __syncthreads();
    if (l == 0)
        sh[w] = x;
    __syncthreads();
    if (w == 0) {
        x = l < (int)(blockDim.x / 32) ? sh[l] : (MAX ? -INFINITY : 0.0f);
        for (int o = 16; o > 0; o /= 2) {
            float y = __shfl_xor_sync(0xffffffffu, x, o);
            x = MAX ? fmaxf(x, y) : __fadd_rn(x, y);
        }
        if (l == 0)
            sh[32] = x;
    }
    __syncthreads();
    return sh[32];
}

GHC_D float am_ema(float old, float x, const ghc_automagic_args &a)
{
    return __fmaf_rn(x, a.beta2_comp, __fmul_rn(old, a.beta2));
}

GHC_D float am_v(const am_tensor &t, int64_t i, const ghc_automagic_args &a)
{
    float g = ld_f(t.g, t.g_bf16, i);
    return __fadd_rn(__fmul_rn(g, g), a.eps);
}

/* The update before clipping (kernels/cpu/optim.c, automagic_u). */
GHC_D float am_u(const am_tensor &t, int64_t i, const float *rmean)
{
    float g = ld_f(t.g, t.g_bf16, i);
    if (!t.s1)
        return __fmul_rn(__fdiv_rn(1.0f, __fsqrt_rn(t.s0[i])), g);
    int64_t RC = t.R * t.C, b = i / RC, r = (i / t.C) % t.R, c = i % t.C;
    float rf = __fdiv_rn(1.0f, __fsqrt_rn(__fdiv_rn(t.s0[b * t.R + r], rmean[b])));
    float cf = __fdiv_rn(1.0f, __fsqrt_rn(t.s1[b * t.C + c]));
    return __fmul_rn(__fmul_rn(rf, cf), g);
}

GHC_D float am_lr(float lr, bool same, const ghc_automagic_args &a)
{
    lr = same ? __fadd_rn(lr, a.lr_bump) : __fsub_rn(lr, a.lr_bump);
    return fminf(fmaxf(lr, a.min_lr), a.max_lr);
}

static __global__ void __launch_bounds__(AM_THREADS) k_automagic(const __grid_constant__ am_list L, const ghc_automagic_args a)
{
    __shared__ float sh[AM_THREADS + 33];
    __shared__ float rmean[AM_MAX_B];
    const am_tensor &t = L.t[blockIdx.x];
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, nw = AM_THREADS / 32;
    const float old_scale = t.aux[0];
    const int64_t N = t.n;
    float *red = sh + AM_THREADS;

    /* 1. second moment */
    if (t.s1) {
        int64_t R = t.R, C = t.C, B = R * C ? N / (R * C) : 0;
        for (int64_t b = 0; b < B; b++) {
            for (int64_t r = warp; r < R; r += nw) {           /* rows: a warp each */
                float s = 0.0f;
                for (int64_t c = lane; c < C; c += 32)
                    s = __fadd_rn(s, am_v(t, (b * R + r) * C + c, a));
                for (int o = 16; o > 0; o /= 2)
                    s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, o));
                if (lane == 0)
                    t.s0[b * R + r] = am_ema(t.s0[b * R + r], __fdiv_rn(s, (float)C), a);
            }
            /* columns: G groups of threads, each over a strided share of the rows */
            int64_t Cb = C < AM_THREADS ? C : AM_THREADS;
            int G = (int)(AM_THREADS / Cb);
            for (int64_t c0 = 0; c0 < C; c0 += Cb) {
                int64_t c = c0 + tid % Cb;
                int grp = (int)(tid / Cb);
                float s = 0.0f;
                if (grp < G && c < C)
                    for (int64_t r = grp; r < R; r += G)
                        s = __fadd_rn(s, am_v(t, (b * R + r) * C + c, a));
                __syncthreads();
                sh[tid] = s;
                __syncthreads();
                if (tid < Cb && c0 + tid < C) {
                    float tot = 0.0f;
                    for (int k = 0; k < G; k++)
                        tot = __fadd_rn(tot, sh[k * Cb + tid]);
                    t.s1[b * C + c0 + tid] = am_ema(t.s1[b * C + c0 + tid], __fdiv_rn(tot, (float)R), a);
                }
            }
            __syncthreads();
            float s = 0.0f;
            for (int64_t r = tid; r < R; r += AM_THREADS)
                s = __fadd_rn(s, t.s0[b * R + r]);
            s = block_reduce<false>(s, red);
            if (tid == 0)
                rmean[b] = __fdiv_rn(s, (float)R);
        }
    } else {
        for (int64_t i = tid; i < N; i += AM_THREADS)
            t.s0[i] = am_ema(t.s0[i], am_v(t, i, a), a);
    }
    __syncthreads();

    /* 2. RMS of the update */
    float ss = 0.0f;
    for (int64_t i = tid; i < N; i += AM_THREADS) {
        float u = am_u(t, i, rmean);
        ss = __fadd_rn(ss, __fmul_rn(u, u));
    }
    ss = block_reduce<false>(ss, red);
    float rms = __fdiv_rn(sqrtf(ss), (float)sqrt((double)N));
    float div = __fdiv_rn(rms, a.clip);
    if (!(div >= 1.0f))
        div = 1.0f;

    /* 3. polarity, learning rates, the param: a warp per 32-element word */
    float lr_max = 0.0f, lr_sum = 0.0f;
    const uint8_t *q = (const uint8_t *)t.mask;
    float *mf = (float *)t.mask;
    for (int64_t base = (int64_t)warp * 32; base < N; base += AM_THREADS) {
        int64_t i = base + lane;
        bool in = i < N, up = false, same = false;
        float lr = 0.0f, u = 0.0f;
        uint32_t old = t.pol[base / 32];
        if (in) {
            u = __fdiv_rn(am_u(t, i, rmean), div);
            up = u > 0.0f;
            same = up == (bool)((old >> lane) & 1u);
            lr = t.m8 ? __fmul_rn((float)(int8_t)q[i], old_scale) : mf[i];
            lr = am_lr(lr, same, a);
        }
        uint32_t wu = __ballot_sync(0xffffffffu, up), ws = __ballot_sync(0xffffffffu, same);
        if (lane == 0) {
            t.pol[base / 32] = wu;
            t.agree[base / 32] = ws;
        }
        if (in) {
            lr_max = fmaxf(lr_max, fabsf(lr));
            lr_sum = __fadd_rn(lr_sum, lr);
            float x = ld_f(t.p, t.p_bf16, i), upd = __fmul_rn(u, lr);
            if (a.weight_decay != 0.0f)
                x = __fadd_rn(x, __fmul_rn(__fmul_rn(x, -a.weight_decay), lr));
            x = __fadd_rn(x, -upd);
            st_param(t.p, t.p_bf16, i, x, t.seed, t.offset);
            if (!t.m8)
                mf[i] = lr;
        }
    }
    lr_max = block_reduce<true>(lr_max, red);
    lr_sum = block_reduce<false>(lr_sum, red);
    if (tid == 0)
        t.aux[1] = N ? __fdiv_rn(lr_sum, (float)N) : 0.0f;

    /* 4. the int8 mask against the new absmax */
    if (t.m8) {
        float ns = lr_max > 0.0f ? (float)((double)lr_max / 127.0) : 1.0f;
        uint8_t *qw = (uint8_t *)t.mask;
        for (int64_t i = tid; i < N; i += AM_THREADS) {
            bool same = (t.agree[i / 32] >> (i % 32)) & 1u;
            float lr = am_lr(__fmul_rn((float)(int8_t)qw[i], old_scale), same, a);
            float c = fminf(fmaxf(rintf(__fdiv_rn(lr, ns)), -127.0f), 127.0f);
            qw[i] = (uint8_t)(int8_t)c;
        }
        __syncthreads();
        if (tid == 0)
            t.aux[0] = ns;
    }
}

extern "C" int ghc_k_automagic(struct ghc_optim_tensor *ts, int32_t n, const struct ghc_automagic_args *args,
                               void *stream)
{
    ghc_k_device_guard dg(ts[0].param);
    GHC_K_TRY(dg.err);
    cudaStream_t s = (cudaStream_t)stream;
    static am_list L;
    for (int32_t base = 0; base < n;) {
        int32_t k = 0;
        for (; base + k < n && k < AM_MAX; k++) {
            const ghc_optim_tensor &o = ts[base + k];
            const ghc_tensor_t *p = o.param;
            bool f = o.state[1] != NULL;
            if (f && ghc_tensor_numel(p) / (ghc_tensor_dim(p, -2) * ghc_tensor_dim(p, -1) ?: 1) > AM_MAX_B)
                return (int)cudaErrorInvalidValue;
            L.t[k] = am_tensor{ ghc_tensor_data(o.param), ghc_tensor_cdata(o.grad), ghc_k_ptr<float>(o.state[0]),
                                ghc_k_ptr<float>(o.state[1]), ghc_tensor_data(o.state[2]), ghc_k_ptr<float>(o.state[3]),
                                ghc_k_ptr<uint32_t>(o.state[4]), ghc_k_ptr<uint32_t>(o.state[5]),
                                ghc_tensor_numel(p), f ? ghc_tensor_dim(p, -2) : 1,
                                f ? ghc_tensor_dim(p, -1) : ghc_tensor_numel(p), o.rng.seed, o.rng.offset,
                                ghc_tensor_dtype(p) == GHC_DTYPE_BF16, ghc_tensor_dtype(o.grad) == GHC_DTYPE_BF16,
                                ghc_tensor_dtype(o.state[2]) == GHC_DTYPE_U8 };
        }
        L.count = k;
        k_automagic<<<k, AM_THREADS, 0, s>>>(L, *args);
        GHC_K_TRY(cudaGetLastError());
        base += k;
    }
    return 0;
}
