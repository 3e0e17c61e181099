/* optim.cu: the fused optimizer updates of ops.h ("optimizer updates") as multi-tensor launches,
 * no host synchronisation in the steady state.
 *   adamw:     element-wise; the list of tensors travels by value in the kernel parameters
 *              (__grid_constant__, AW_MAX tensors, 17 KB, a launch per AW_MAX); the tensors are
 *              cut into chunks of AW_CHUNK elements, one block each (a block finds its tensor by
 *              binary search of the chunk starts). The same roundings as kernels/cpu/optim.c
 *              (explicit _rn intrinsics, fmaf where the CPU has one): bit-identical to the CPU.
 *   automagic: three passes over all tensors of a call, whatever their number: the tensor
 *              table lives in device memory (a plan, cached per device, stream and list, so
 *              later steps copy nothing); (1) stats over chunks of every tensor (two launches:
 *              the thin tensors, LoRA's A and B, with g held in registers; the others staged
 *              in shared memory): the short side of the factored second moment complete per
 *              chunk, the long side and the update's sum of squares as per-chunk partials;
 *              (2) the block that completes a tensor's last chunk sums its partials in chunk
 *              order (the long side, the mean row, the clipping divisor); (3) the
 *              element-wise update (polarity, lr, param) over flat chunks; (4) the int8 mask
 *              against the new absmax. Reductions in f32 in a fixed order (deterministic;
 *              within float rounding of the CPU's f64 sums). A block finds its chunk's tensor
 *              in a table of the plan (one load). */
#include <mutex>
#include <vector>

#include "common.cuh"

#define AW_MAX     256
#define AW_THREADS 256
#define AW_CHUNK   (AW_THREADS * 4 * 8)

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

#define AM_T     256    /* threads per block in every automagic kernel */
#define AM_CH    8192   /* elements per chunk: exactly for the flat passes (a multiple of 32) */
#define AM_SCH   4096   /* elements per stats chunk of a factored tensor, about (whole lines) */
#define AM_PLANS 16     /* cached plans: (device, stream, tensor list) */
#define AM_U     4      /* loads in flight per thread in the latency-bound loops */
#define AM_TU    8      /* rows a thread in k_am_stats_thin's tall tensors */
#define AM_U4    1      /* groups of 4 elements in flight per thread in the update pass, with */
#define AM_UB    6      /* blocks an SM: more warps beat more loads per thread (H100, update pass:
                        * 1 group at 6 blocks, 40 registers, 0.408 ms; at 5: 0.427; at 4: 0.442;
                        * at 8, 32 registers and 264 bytes spilled: 0.525; 2 groups at 3 blocks, 78
                        * registers: 0.529; at 5: 0.448; 4 groups: 145 registers, 1.34x slower) */

/* One tensor of a call in the plan's device table (each kernel copies its tensor's entry into
 * registers: through a reference every field would be reloaded after each store to a tensor,
 * which the compiler cannot tell from the table). Factored tensors (ndim >= 2) are B
 * matrices [R, C]; 1-D ones have R = 1, C = n and no s1. The stats pass cuts a factored
 * tensor into chunks that hold whole lines of the longer side: column ranges of all R rows
 * (wide: R < C) or row ranges of all C columns (tall), `span` lines each, `cpm` per matrix;
 * the short side's sums are completed in the chunk, the long side's go to the scratch as
 * partials (K = the short side's length); `span` is about AM_SCH / K lines, or for a thin tensor
 * what k_am_stats_thin's block holds. The flat passes cut every tensor into AM_CH chunks. */
struct am_desc {
    void       *p;
    const void *g;
    float      *s0, *s1;
    void       *mask;
    float      *aux;
    uint32_t   *pol, *agree;
    uint64_t    seed, offset;
    int64_t     part;    /* scratch offset: [B][cpm][2][K] sums of v and of g^2 / (new short side) (factored), [nf] (1-D) */
    int64_t     rmean;   /* scratch offset: [B] means of the new R (factored) */
    int64_t     lrp;     /* scratch offset: [nf][2] max and sum of the new lr per flat chunk */
    int64_t     rcf;     /* scratch offset: [B][R] row factors 1/sqrt(R_r/rmean), [B][C] column factors 1/sqrt(C_c) */
    int32_t     n, R, C, B;
    int32_t     p_bf16, g_bf16, m8, wide;
    int32_t     span, cpm, nf;
    uint32_t    mC, mRC;     /* i / C and i / (R C) as (umulhi(m, i) + i) >> l (i < 2^31) */
    int32_t     lC, lRC;
    int32_t     vec;         /* 16-byte aligned p, g (8 if bf16), s0 (1-D) and mask (4 if int8): the
                              * update pass moves 4 elements a load */
    int32_t     thin;        /* the short side's length K (4, 8, 16 or 32) where k_am_stats_thin
                              * takes the tensor (f32 g, 16-byte aligned, rows of whole 16-byte
                              * groups), else 0 */
    int32_t     pad_;        /* no implicit padding (plans compare tables with memcmp) */
};

static_assert(sizeof(am_desc) == 184, "am_desc has no padding");

/* A plan as the kernels see it: the table, the first chunk of each tensor in the stats pass
 * and in the flat passes ([n + 1] each), per tensor [div, old int8 scale], the partials. */
struct am_plan_dev {
    const am_desc *t;
    const int32_t *start1, *startf;
    float         *scal, *scr;
    int32_t        n;
    const int32_t *own1, *ownf;   /* the tensor of each stats chunk and of each flat chunk */
    const int32_t *list1;         /* the stats chunks of k_am_stats_thin, then those of k_am_stats */
    int32_t       *done;          /* [n] stats chunks done per tensor (zero between calls) */
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

/* n / d for n < 2^31 by the magic pair of d (am_magic). */
GHC_D uint32_t am_div(uint32_t n, uint32_t m, int l) { return (__umulhi(m, n) + n) >> l; }

GHC_D float am_ema(float old, float x, const ghc_automagic_args &a)
{
    return __fmaf_rn(x, a.beta2_comp, __fmul_rn(old, a.beta2));
}

GHC_D float am_lr(float lr, bool same, const ghc_automagic_args &a)
{
    lr = same ? __fadd_rn(lr, a.lr_bump) : __fsub_rn(lr, a.lr_bump);
    return fminf(fmaxf(lr, a.min_lr), a.max_lr);
}

/* Stages g[row0 + r][col0 + c] (r < nr, c < nc, nr nc <= AM_SCH; row length C) into gs[r nc + c]
 * (f32) with all threads of the block, the loads issued before any store (one memory latency). */
GHC_D void am_stage(const am_desc &t, int64_t base, int row0, int nr, int col0, int nc, float *gs)
{
    const int64_t first = base + (int64_t)row0 * t.C + col0;
    const bool v4 = !t.g_bf16 && nc % 4 == 0 && t.C % 4 == 0 && first % 4 == 0 && (uintptr_t)t.g % 16 == 0;
    if (v4) {   /* all of a thread's loads (at most AM_SCH / 4 / AM_T) in flight before any store */
        const int q = nc / 4, m = nr * q;   /* float4 per row, in all */
        float4 v[AM_SCH / 4 / AM_T];
#pragma unroll
        for (int u = 0; u < AM_SCH / 4 / AM_T; u++) {
            const int e = threadIdx.x + u * AM_T;
            if (e < m)
                v[u] = *(const float4 *)((const float *)t.g + first + (int64_t)(e / q) * t.C + 4 * (e % q));
        }
#pragma unroll
        for (int u = 0; u < AM_SCH / 4 / AM_T; u++) {
            const int e = threadIdx.x + u * AM_T;
            if (e < m)
                *(float4 *)(gs + (e / q) * nc + 4 * (e % q)) = v[u];
        }
    } else {
        for (int e = threadIdx.x; e < nr * nc; e += AM_T)
            gs[e] = ld_f(t.g, t.g_bf16, first + (int64_t)(e / nc) * t.C + e % nc);
    }
    __syncthreads();
}

struct __align__(16) am_smem {   /* 16: am_stage stores float4 */
    float  gs[AM_SCH];    /* the chunk's g, staged */
    float  side[AM_SCH];  /* 1 / the chunk's new short-side values (span <= AM_SCH) */
    float2 sh[AM_T];
    float  red[33];
};
static_assert(sizeof(am_smem) <= 48 * 1024, "am_smem fits in static shared memory");

/* The stats of chunk k of factored tensor t, m lines of the longer side; ST: the chunk's g fits
 * in shared memory and is read from there (a compile-time choice, so that the loops read one
 * place without a test). */
template <bool ST>
GHC_D void am_stats_fact(const am_plan_dev &P, const ghc_automagic_args &a, const am_desc &t, am_smem &S, int k,
                         int m)
{
    float *side = S.side;
    float2 *sh = S.sh;
    const float *gs = S.gs;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, nw = AM_T / 32;
    float *part = P.scr + t.part;
    const int R = t.R, C = t.C, K = t.wide ? R : C, b = k / t.cpm, j = k % t.cpm;
    const int64_t base = (int64_t)b * R * C;
    float *pv = part + ((int64_t)b * t.cpm + j) * 2 * K, *pq = pv + K;
    /* the chunk's short-side old state into side[] and its g into gs, every load issued before
     * any is waited for (one memory latency): the old state into a register where a thread has
     * one entry (span <= AM_T), then g's loads; each side[] entry is later read and replaced by
     * the thread that owns it */
    const float *prev = t.wide ? t.s1 + (int64_t)b * C + j * t.span : t.s0 + (int64_t)b * R + j * t.span;
    float ov = 0.0f;
    if (m <= AM_T) {
        if (tid < m)
            ov = prev[tid];
    } else {
        for (int e = tid; e < m; e += AM_T)
            side[e] = prev[e];
    }
    if (ST) {
        if (t.wide)
            am_stage(t, base, 0, R, j * t.span, m, S.gs);
        else
            am_stage(t, base, j * t.span, m, 0, C, S.gs);
    }
    if (m <= AM_T && tid < m)
        side[tid] = ov;
    __syncthreads();
    if (t.wide) {
        const int c0 = j * t.span, nc = m;
        /* g[r][c0 + c] */
        auto gv = [&](int r, int c) {
            return ST ? gs[r * nc + c] : ld_f(t.g, t.g_bf16, base + (int64_t)r * C + c0 + c);
        };
        /* columns (complete): threads over columns, G groups over strided rows */
        const int cpp = min(AM_T, nc), G = AM_T / cpp, grp = tid / cpp, cl = tid % cpp;
        for (int cb = 0; cb < nc; cb += cpp) {
            const int c = cb + cl;
            float s = 0.0f;
            if (grp < G && c < nc)
#pragma unroll 4
                for (int r = grp; r < R; r += G) {
                    float g = gv(r, c);
                    s = __fadd_rn(s, __fadd_rn(__fmul_rn(g, g), a.eps));
                }
            __syncthreads();
            sh[tid].x = s;
            __syncthreads();
            if (tid < cpp && c < nc) {
                float tot = 0.0f;
                for (int q = 0; q < G; q++)
                    tot = __fadd_rn(tot, sh[q * cpp + tid].x);
                float nv = am_ema(side[c], __fdiv_rn(tot, (float)R), a);   /* side[c]: the old state */
                t.s1[(int64_t)b * C + c0 + c] = nv;
                side[c] = __frcp_rn(nv);
            }
        }
        __syncthreads();
        /* rows (partial): a warp per row over the chunk's columns */
        for (int r = warp; r < R; r += nw) {
            float sv = 0.0f, sq = 0.0f;
#pragma unroll 4
            for (int c = lane; c < nc; c += 32) {
                float g = gv(r, c), g2 = __fmul_rn(g, g);
                sv = __fadd_rn(sv, __fadd_rn(g2, a.eps));
                sq = __fadd_rn(sq, __fmul_rn(g2, side[c]));
            }
            sv = ghc_warp_sum(sv);
            sq = ghc_warp_sum(sq);
            if (lane == 0) {
                pv[r] = sv;
                pq[r] = sq;
            }
        }
        return;
    }
    const int r0 = j * t.span, nr = m;
    /* g[r0 + r][c] */
    auto gv = [&](int r, int c) {
        return ST ? gs[r * C + c] : ld_f(t.g, t.g_bf16, base + (int64_t)(r0 + r) * C + c);
    };
    /* rows (complete) */
    if (C < 32 && (C & (C - 1)) == 0) {      /* 32 / C rows per warp step, sums over lane segments */
        const int per = 32 / C, step = nw * per;
        float *rs = t.s0 + (int64_t)b * R + r0;
        for (int rb = warp * per; rb < nr; rb += AM_U * step) {
            float s[AM_U], old[AM_U];
#pragma unroll
            for (int v = 0; v < AM_U; v++) {   /* the loads first: AM_U in flight */
                const int r = rb + v * step + lane / C;
                s[v] = old[v] = 0.0f;
                if (r < nr) {
                    float g = gv(r, lane % C);
                    s[v] = __fadd_rn(__fmul_rn(g, g), a.eps);
                    if (lane % C == 0)
                        old[v] = side[r];
                }
            }
#pragma unroll
            for (int v = 0; v < AM_U; v++) {
                const int r = rb + v * step + lane / C;
                float x = s[v];
                if (C == 16) {   /* LoRA's B [out, 16]: unrolled */
#pragma unroll
                    for (int o = 8; o > 0; o /= 2)
                        x = __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, o));
                } else {
                    for (int o = C / 2; o > 0; o /= 2)
                        x = __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, o));
                }
                if (lane % C == 0 && r < nr) {
                    float nv = am_ema(old[v], __fdiv_rn(x, (float)C), a);
                    rs[r] = nv;
                    side[r] = __frcp_rn(nv);
                }
            }
        }
    } else {
        for (int r = warp; r < nr; r += nw) {
            float s = 0.0f;
#pragma unroll 4
            for (int c = lane; c < C; c += 32) {
                float g = gv(r, c);
                s = __fadd_rn(s, __fadd_rn(__fmul_rn(g, g), a.eps));
            }
            s = ghc_warp_sum(s);
            if (lane == 0) {
                float nv = am_ema(side[r], __fdiv_rn(s, (float)C), a);   /* side[r]: the old state */
                t.s0[(int64_t)b * R + r0 + r] = nv;
                side[r] = __frcp_rn(nv);
            }
        }
    }
    __syncthreads();
    /* columns (partial): threads over columns, G groups over strided rows of the chunk */
    const int cpp = min(AM_T, C), G = AM_T / cpp, grp = tid / cpp, cl = tid % cpp;
    for (int cb = 0; cb < C; cb += cpp) {
        const int c = cb + cl;
        float sv = 0.0f, sq = 0.0f;
        if (grp < G && c < C)
#pragma unroll 4
            for (int r = grp; r < nr; r += G) {
                float g = gv(r, c), g2 = __fmul_rn(g, g);
                sv = __fadd_rn(sv, __fadd_rn(g2, a.eps));
                sq = __fadd_rn(sq, __fmul_rn(g2, side[r]));
            }
        __syncthreads();
        sh[tid] = make_float2(sv, sq);
        __syncthreads();
        if (tid < cpp && c < C) {
            float tv = 0.0f, tq = 0.0f;
            for (int q = 0; q < G; q++) {
                tv = __fadd_rn(tv, sh[q * cpp + tid].x);
                tq = __fadd_rn(tq, sh[q * cpp + tid].y);
            }
            pv[c] = tv;
            pq[c] = tq;
        }
    }
}

/* 1. Stats, one block per chunk: the second moment of a 1-D tensor and its update's sum of
 * squares; for a factored one the short side's new state (complete in the chunk) and the
 * chunk's partials of the long side: sums of v = g^2 + eps and of g^2 * (1 / new short-side
 * value), whose totals give the long side's state and, since u^2 = g^2 rmean / (R_r C_c),
 * the update's sum of squares without another pass over g. The chunk's g is staged in shared
 * memory (am_smem, 34 KB, 5 blocks an SM). */
GHC_D void am_stats_chunk(const am_plan_dev &P, const ghc_automagic_args &a, am_smem &S, int chunk)
{
    const int ti = P.own1[chunk];
    const am_desc t = P.t[ti];
    const int k = chunk - P.start1[ti], tid = threadIdx.x;
    float *part = P.scr + t.part;
    if (t.n == 0)   /* an empty tensor's one chunk: only the finish */
        return;
    if (!t.s1) {
        const int i1 = min(t.n, (k + 1) * AM_CH);
        float ss = 0.0f;
        for (int i = k * AM_CH + tid; i < i1; i += AM_T) {
            float g = ld_f(t.g, t.g_bf16, i);
            float s = am_ema(t.s0[i], __fadd_rn(__fmul_rn(g, g), a.eps), a);
            t.s0[i] = s;
            float u = __fmul_rn(__fdiv_rn(1.0f, __fsqrt_rn(s)), g);
            ss = __fadd_rn(ss, __fmul_rn(u, u));
        }
        ss = block_reduce<false>(ss, S.red);
        if (tid == 0)
            part[k] = ss;
        return;
    }
    const int j = k % t.cpm, m = t.wide ? min(t.span, t.C - j * t.span) : min(t.span, t.R - j * t.span);
    if ((int64_t)(t.wide ? t.R : t.C) * m <= AM_SCH)
        am_stats_fact<true>(P, a, t, S, k, m);
    else
        am_stats_fact<false>(P, a, t, S, k, m);
}

/* Line x of a matrix's longer side from the stats partials pb (chunk order): its new state
 * (the EMA of the sum of v over len), returned and stored at st; adds its q sum / new state to w. */
GHC_D float am_long(const float *pb, int K, int cpm, int x, float *st, float len, const ghc_automagic_args &a,
                    float *w)
{
    float sv = 0.0f, sq = 0.0f;
    for (int j = 0; j < cpm; j++) {
        sv = __fadd_rn(sv, __ldcg(pb + (int64_t)j * 2 * K + x));
        sq = __fadd_rn(sq, __ldcg(pb + (int64_t)j * 2 * K + K + x));
    }
    float nv = am_ema(*st, __fdiv_rn(sv, len), a);
    *st = nv;
    *w = __fadd_rn(*w, __fdiv_rn(sq, nv));
    return nv;
}

/* 2. The tensor's finish, run by the block that completes its last stats chunk: the long side's
 * state from the partials (chunk order), the mean of R per matrix, the clipping divisor, the
 * update's row and column factors; keeps the old int8 scale for passes 3 and 4. What the
 * launch's other blocks wrote (partials, short-side states) is read through L2 (__ldcg). */
GHC_D void am_finish(const am_plan_dev &P, const ghc_automagic_args &a, int ti, float *red)
{
    const am_desc t = P.t[ti];
    const int tid = threadIdx.x;
    const float *part = P.scr + t.part;
    if (tid == 0)
        P.scal[2 * ti + 1] = t.aux[0];
    if (t.n == 0) {
        if (tid == 0) {
            t.aux[1] = 0.0f;
            if (t.m8)
                t.aux[0] = 1.0f;
        }
        return;
    }
    float ss = 0.0f;
    if (!t.s1) {
        float s = 0.0f;
        for (int k = tid; k < t.nf; k += AM_T)
            s = __fadd_rn(s, __ldcg(part + k));
        ss = block_reduce<false>(s, red);
    } else {
        const int R = t.R, C = t.C, K = t.wide ? R : C, cpm = t.cpm;
        for (int b = 0; b < t.B; b++) {
            const float *pb = part + (int64_t)b * cpm * 2 * K;
            float rsum = 0.0f, w = 0.0f;
            if (t.wide) {
                for (int r = tid; r < R; r += AM_T)
                    rsum = __fadd_rn(rsum, am_long(pb, K, cpm, r, t.s0 + (int64_t)b * R + r, (float)C, a, &w));
            } else {
                for (int r = tid; r < R; r += AM_T)
                    rsum = __fadd_rn(rsum, __ldcg(t.s0 + (int64_t)b * R + r));
                for (int c = tid; c < C; c += AM_T)
                    am_long(pb, K, cpm, c, t.s1 + (int64_t)b * C + c, (float)R, a, &w);
            }
            rsum = block_reduce<false>(rsum, red);
            w = block_reduce<false>(w, red);
            float rmean = __fdiv_rn(rsum, (float)R);
            if (tid == 0)
                P.scr[t.rmean + b] = rmean;
            ss = __fadd_rn(ss, __fmul_rn(rmean, w));
            /* the update's factors, as the CPU computes them per element */
            float *rf = P.scr + t.rcf + (int64_t)b * R, *cf = P.scr + t.rcf + (int64_t)t.B * R + (int64_t)b * C;
            for (int r = tid; r < R; r += AM_T)
                rf[r] = __fdiv_rn(1.0f, __fsqrt_rn(__fdiv_rn(__ldcg(t.s0 + (int64_t)b * R + r), rmean)));
            for (int c = tid; c < C; c += AM_T)
                cf[c] = __fdiv_rn(1.0f, __fsqrt_rn(__ldcg(t.s1 + (int64_t)b * C + c)));
        }
    }
    if (tid == 0) {
        float rms = __fdiv_rn(sqrtf(ss), (float)sqrt((double)t.n));
        float div = __fdiv_rn(rms, a.clip);
        if (!(div >= 1.0f))
            div = 1.0f;
        P.scal[2 * ti] = div;
    }
}

/* After a block's stats chunk of tensor ti: counts it; the block that counts the tensor's last
 * chunk resets the count and runs the finish (the classic last-block reduction: every thread's
 * writes fenced before the count, the finish's reads after it). */
GHC_D void am_stats_done(const am_plan_dev &P, const ghc_automagic_args &a, int ti, float *red)
{
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        const int all = P.start1[ti + 1] - P.start1[ti];
        last = atomicAdd(P.done + ti, 1) == all - 1;
        if (last)
            P.done[ti] = 0;   /* for the next call */
    }
    __syncthreads();
    if (last) {
        __threadfence();
        am_finish(P, a, ti, red);
    }
}

static __global__ void __launch_bounds__(AM_T, 5) k_am_stats(const am_plan_dev P, const ghc_automagic_args a,
                                                             int32_t first)
{
    __shared__ am_smem S;
    const int chunk = P.list1[first + (int)blockIdx.x];
    am_stats_chunk(P, a, S, chunk);
    am_stats_done(P, a, P.own1[chunk], S.red);
}

/* The end of a thin chunk's stats: the warps' partials sw[warp][m] summed in warp order into the
 * chunk's m partials in the scratch. */
GHC_D void am_thin_part(const am_plan_dev &P, const am_desc &t, int k, int m, const float *sw)
{
    __syncthreads();
    if ((int)threadIdx.x < m) {
        float sum = 0.0f;
        for (int w = 0; w < AM_T / 32; w++)
            sum = __fadd_rn(sum, sw[w * m + threadIdx.x]);
        P.scr[t.part + (int64_t)k * m + threadIdx.x] = sum;   /* chunk k = b cpm + j */
    }
}

/* Stats of chunk k of a thin wide tensor t ([B][K][C], K <= 32): each thread holds VW
 * consecutive columns of all K rows in registers (all its loads in flight at once), so a
 * column's sum, its new state and 1 / state are the thread's own; the rows' partials (sums of v
 * and of g^2 / new column state) are summed over the warp by shuffles and over the warps in
 * shared memory (fixed order), 2 K floats per chunk. */
template <int K, int VW>
GHC_D void am_thin_wide(const am_plan_dev &P, const ghc_automagic_args &a, const am_desc &t, int k, float *sw)
{
    const int b = k / t.cpm, j = k % t.cpm, tid = threadIdx.x, lane = tid % 32, warp = tid / 32, C = t.C;
    const int c0 = j * t.span + tid * VW;
    const bool in = c0 < C;   /* C % 4 == 0 and VW divides 4: a thread's columns are all in or out */
    const float *g = (const float *)t.g + (int64_t)b * K * C + c0;
    float *s1 = t.s1 + (int64_t)b * C + c0;
    float v[K][VW], old[VW], rc[VW];
#pragma unroll
    for (int c = 0; c < VW; c++)
        old[c] = in ? s1[c] : 0.0f;
#pragma unroll
    for (int r = 0; r < K; r++) {
        if constexpr (VW == 4) {
            float4 y = in ? *(const float4 *)(g + (int64_t)r * C) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            v[r][0] = y.x, v[r][1] = y.y, v[r][2] = y.z, v[r][3] = y.w;
        } else if constexpr (VW == 2) {
            float2 y = in ? *(const float2 *)(g + (int64_t)r * C) : make_float2(0.0f, 0.0f);
            v[r][0] = y.x, v[r][1] = y.y;
        } else {
            v[r][0] = in ? g[(int64_t)r * C] : 0.0f;
        }
    }
#pragma unroll
    for (int c = 0; c < VW; c++) {   /* the columns, complete */
        float sum = 0.0f;
#pragma unroll
        for (int r = 0; r < K; r++)
            sum = __fadd_rn(sum, __fadd_rn(__fmul_rn(v[r][c], v[r][c]), a.eps));
        float nv = am_ema(old[c], __fdiv_rn(sum, (float)K), a);
        if (in)
            s1[c] = nv;
        rc[c] = __frcp_rn(nv);
    }
#pragma unroll
    for (int r = 0; r < K; r++) {   /* the rows' partials */
        float sv = 0.0f, sq = 0.0f;
        if (in)
#pragma unroll
            for (int c = 0; c < VW; c++) {
                float g2 = __fmul_rn(v[r][c], v[r][c]);
                sv = __fadd_rn(sv, __fadd_rn(g2, a.eps));
                sq = __fadd_rn(sq, __fmul_rn(g2, rc[c]));
            }
        sv = ghc_warp_sum(sv);
        sq = ghc_warp_sum(sq);
        if (lane == 0) {
            sw[warp * 2 * K + r] = sv;
            sw[warp * 2 * K + K + r] = sq;
        }
    }
    am_thin_part(P, t, k, 2 * K, sw);
}

/* Stats of chunk k of a thin tall tensor t ([B][R][K], K <= 32): a row is K / 4 lanes' 16-byte
 * loads, AM_TU rows a thread all in flight; a row's sum by shuffles over its lanes (all of them
 * get the same bits), its new state and 1 / state; each thread sums its 4 columns' partials
 * over its rows, then over the lanes and warps that share those columns (fixed order). */
template <int K>
GHC_D void am_thin_tall(const am_plan_dev &P, const ghc_automagic_args &a, const am_desc &t, int k, float *sw)
{
    constexpr int LPR = K / 4, RPS = AM_T / LPR;   /* lanes a row, rows a step */
    const int b = k / t.cpm, j = k % t.cpm, tid = threadIdx.x, lane = tid % 32, warp = tid / 32, R = t.R;
    const int cg = tid % LPR, r1 = min(R, (j + 1) * t.span);
    const float *g = (const float *)t.g + (int64_t)b * R * K;
    float *s0 = t.s0 + (int64_t)b * R;
    float4 v[AM_TU];
    float old[AM_TU];
#pragma unroll
    for (int u = 0; u < AM_TU; u++) {
        const int r = j * t.span + u * RPS + tid / LPR;
        v[u] = r < r1 ? *(const float4 *)(g + (int64_t)r * K + 4 * cg) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        old[u] = r < r1 ? s0[r] : 0.0f;
    }
    float pv[4] = { 0.0f, 0.0f, 0.0f, 0.0f }, pq[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
#pragma unroll
    for (int u = 0; u < AM_TU; u++) {
        const int r = j * t.span + u * RPS + tid / LPR;
        const float e[4] = { v[u].x, v[u].y, v[u].z, v[u].w };
        float sum = 0.0f;
#pragma unroll
        for (int q = 0; q < 4; q++)
            sum = __fadd_rn(sum, __fadd_rn(__fmul_rn(e[q], e[q]), a.eps));
#pragma unroll
        for (int o = 1; o < LPR; o *= 2)
            sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, o));
        if (r < r1) {
            float nv = am_ema(old[u], __fdiv_rn(sum, (float)K), a), rr = __frcp_rn(nv);
            if (cg == 0)
                s0[r] = nv;
#pragma unroll
            for (int q = 0; q < 4; q++) {
                float g2 = __fmul_rn(e[q], e[q]);
                pv[q] = __fadd_rn(pv[q], __fadd_rn(g2, a.eps));
                pq[q] = __fadd_rn(pq[q], __fmul_rn(g2, rr));
            }
        }
    }
#pragma unroll
    for (int q = 0; q < 4; q++)
#pragma unroll
        for (int o = LPR; o < 32; o *= 2) {
            pv[q] = __fadd_rn(pv[q], __shfl_xor_sync(0xffffffffu, pv[q], o));
            pq[q] = __fadd_rn(pq[q], __shfl_xor_sync(0xffffffffu, pq[q], o));
        }
    if (lane < LPR)
#pragma unroll
        for (int q = 0; q < 4; q++) {
            sw[warp * 2 * K + 4 * cg + q] = pv[q];
            sw[warp * 2 * K + K + 4 * cg + q] = pq[q];
        }
    am_thin_part(P, t, k, 2 * K, sw);
}

/* 1'. Stats of the thin tensors' chunks (am_desc::thin), no shared-memory staging; the last
 * block of a tensor runs its finish. */
static __global__ void __launch_bounds__(AM_T, 3) k_am_stats_thin(const am_plan_dev P, const ghc_automagic_args a)
{
    __shared__ float sw[AM_T / 32 * 64];   /* [warp][2 K] */
    __shared__ float red[33];
    const int chunk = P.list1[blockIdx.x], ti = P.own1[chunk];
    const am_desc t = P.t[ti];
    const int k = chunk - P.start1[ti];
    switch (t.thin * (t.wide ? 1 : -1)) {
    case 4: am_thin_wide<4, 4>(P, a, t, k, sw); break;
    case 8: am_thin_wide<8, 4>(P, a, t, k, sw); break;
    case 16: am_thin_wide<16, 2>(P, a, t, k, sw); break;
    case 32: am_thin_wide<32, 1>(P, a, t, k, sw); break;
    case -4: am_thin_tall<4>(P, a, t, k, sw); break;
    case -8: am_thin_tall<8>(P, a, t, k, sw); break;
    case -16: am_thin_tall<16>(P, a, t, k, sw); break;
    default: am_thin_tall<32>(P, a, t, k, sw); break;
    }
    am_stats_done(P, a, ti, red);
}

/* Four consecutive elements i0 .. i0 + 3 of x (f32 or bf16) as one 16- or 8-byte load (the
 * last, partial group element by element). */
GHC_D void am_ld4(const void *x, int bf16, int i0, int n, float v[4])
{
    if (i0 + 4 <= n) {
        if (bf16) {
            uint2 u = *(const uint2 *)((const uint16_t *)x + i0);
            v[0] = __uint_as_float(u.x << 16);
            v[1] = __uint_as_float(u.x & 0xffff0000u);
            v[2] = __uint_as_float(u.y << 16);
            v[3] = __uint_as_float(u.y & 0xffff0000u);
        } else {
            float4 f = *(const float4 *)((const float *)x + i0);
            v[0] = f.x;
            v[1] = f.y;
            v[2] = f.z;
            v[3] = f.w;
        }
        return;
    }
    for (int e = 0; e < 4; e++)
        v[e] = i0 + e < n ? ld_f(x, bf16, i0 + e) : 0.0f;
}

/* The update pass over chunk k of a tensor with t.vec: each lane takes 4 consecutive elements
 * (a warp 128, four polarity words: 8 lanes a word, their nibbles OR-ed by shuffles), AM_U
 * groups loaded before any is computed; the row and column of the first element by one
 * division, the next three by stepping. The arithmetic per element is the scalar path's. */
template <int U>
GHC_D void am_update4(const am_desc &t, const ghc_automagic_args &a, float div, float old_scale, const float *rf,
                      const float *cf, uint64_t off, int k, float *lr_max, float *lr_sum)
{
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = AM_T / 32, n = t.n;
    const int i1 = min(n, (k + 1) * AM_CH), sh = 4 * (lane % 8);
    const uint32_t C = (uint32_t)t.C, R = (uint32_t)t.R, RC = R * C;
    const bool one = t.B == 1;
    const uint8_t *q = (const uint8_t *)t.mask;
    float *mf = (float *)t.mask;
    for (int ib = k * AM_CH + warp * 128; ib < i1; ib += U * nw * 128) {
        float g[U][4], x[U][4], lr[U][4];
        uint32_t old[U];
#pragma unroll
        for (int v = 0; v < U; v++) {
            const int i = ib + v * nw * 128 + 4 * lane;
            old[v] = 0u;
            if (i < i1) {
                old[v] = t.pol[i / 32] >> sh;
                am_ld4(t.g, t.g_bf16, i, n, g[v]);
                am_ld4(t.p, t.p_bf16, i, n, x[v]);
                if (t.m8) {
                    if (i + 4 <= n) {
                        uint32_t c4 = *(const uint32_t *)(q + i);
                        for (int e = 0; e < 4; e++)
                            lr[v][e] = __fmul_rn((float)(int8_t)(uint8_t)(c4 >> (8 * e)), old_scale);
                    } else {
                        for (int e = 0; e < 4; e++)
                            lr[v][e] = i + e < n ? __fmul_rn((float)(int8_t)q[i + e], old_scale) : 0.0f;
                    }
                } else {
                    am_ld4(mf, 0, i, n, lr[v]);
                }
            }
        }
#pragma unroll
        for (int v = 0; v < U; v++) {
            const int i = ib + v * nw * 128 + 4 * lane;
            if (ib + v * nw * 128 >= i1)   /* uniform over the warp */
                break;
            uint32_t nu = 0u, ns = 0u;
            if (i < i1) {
                float u[4], s4[4], xo[4];
                if (t.s1) {
                    uint32_t bb = one ? 0u : am_div((uint32_t)i, t.mRC, t.lRC), rem = (uint32_t)i - bb * RC;
                    uint32_t r = am_div(rem, t.mC, t.lC), c = rem - r * C;
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        u[e] = __fmul_rn(__fmul_rn(rf[(int64_t)bb * R + r], cf[(int64_t)bb * C + c]), g[v][e]);
                        if (++c == C) {
                            c = 0;
                            if (++r == R) {
                                r = 0;
                                bb++;
                            }
                        }
                    }
                } else {
                    am_ld4(t.s0, 0, i, n, s4);
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        u[e] = __fmul_rn(__fdiv_rn(1.0f, __fsqrt_rn(s4[e])), g[v][e]);
                }
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    if (i + e >= n) {
                        xo[e] = 0.0f;
                        continue;
                    }
                    float ue = __fdiv_rn(u[e], div);
                    bool up = ue > 0.0f, same = up == (bool)((old[v] >> e) & 1u);
                    nu |= (uint32_t)up << e;
                    ns |= (uint32_t)same << e;
                    float l = am_lr(lr[v][e], same, a);
                    *lr_max = fmaxf(*lr_max, fabsf(l));
                    *lr_sum = __fadd_rn(*lr_sum, l);
                    float xv = x[v][e], upd = __fmul_rn(ue, l);
                    if (a.weight_decay != 0.0f)
                        xv = __fadd_rn(xv, __fmul_rn(__fmul_rn(xv, -a.weight_decay), l));
                    xo[e] = __fadd_rn(xv, -upd);
                    lr[v][e] = l;
                }
                if (i + 4 <= n && !t.p_bf16) {
                    *(float4 *)((float *)t.p + i) = make_float4(xo[0], xo[1], xo[2], xo[3]);
                } else if (i + 4 <= n) {
                    uint32_t rn[4];
                    ghc_dev_philox_block(t.seed, off, (uint64_t)i / 4, rn);
                    uint2 o;
                    o.x = (uint32_t)sr_bf16(xo[0], rn[0]) | (uint32_t)sr_bf16(xo[1], rn[1]) << 16;
                    o.y = (uint32_t)sr_bf16(xo[2], rn[2]) | (uint32_t)sr_bf16(xo[3], rn[3]) << 16;
                    *(uint2 *)((uint16_t *)t.p + i) = o;
                } else {
                    for (int e = 0; e < 4 && i + e < n; e++)
                        st_param(t.p, t.p_bf16, i + e, xo[e], t.seed, off);
                }
                if (!t.m8) {
                    if (i + 4 <= n)
                        *(float4 *)(mf + i) = make_float4(lr[v][0], lr[v][1], lr[v][2], lr[v][3]);
                    else
                        for (int e = 0; e < 4 && i + e < n; e++)
                            mf[i + e] = lr[v][e];
                }
            }
            nu <<= sh;
            ns <<= sh;
#pragma unroll
            for (int o = 1; o < 8; o *= 2) {
                nu |= __shfl_xor_sync(0xffffffffu, nu, o);
                ns |= __shfl_xor_sync(0xffffffffu, ns, o);
            }
            if (lane % 8 == 0 && i < i1) {
                t.pol[i / 32] = nu;
                t.agree[i / 32] = ns;
            }
        }
    }
}

/* 3. Flat chunks, last first (the stats pass's last chunks are still in L2): polarity,
 * learning rates and the param, a warp per 32-element polarity word (`__ballot_sync`), AM_U
 * words loaded before any is computed; the chunk's lr max and sum. */
template <int U, int MINB>
static __global__ void __launch_bounds__(AM_T, MINB) k_am_update(const am_plan_dev P, const ghc_automagic_args a,
                                                          uint64_t off_delta, int32_t total)
{
    __shared__ float red[33];
    const int32_t blk = total - 1 - (int32_t)blockIdx.x;
    const int ti = P.ownf[blk];
    const am_desc t = P.t[ti];
    const int k = blk - P.startf[ti], lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = AM_T / 32;
    const float div = P.scal[2 * ti], old_scale = P.scal[2 * ti + 1];
    const float *rf = P.scr + t.rcf, *cf = rf + (int64_t)t.B * t.R;
    const uint64_t off = t.offset + off_delta;
    const int n = t.n, w0 = k * (AM_CH / 32), w1 = min((n + 31) / 32, w0 + AM_CH / 32);
    const uint32_t C = (uint32_t)t.C, RC = (uint32_t)t.R * C;
    const bool one = t.B == 1;
    const uint8_t *q = (const uint8_t *)t.mask;
    float *mf = (float *)t.mask;
    float lr_max = 0.0f, lr_sum = 0.0f;
    if (t.vec) {
        am_update4<U>(t, a, div, old_scale, rf, cf, off, k, &lr_max, &lr_sum);
    } else {
        for (int wb = w0 + warp; wb < w1; wb += AM_U * nw) {
            float g[AM_U], x[AM_U], lr[AM_U];
            uint32_t old[AM_U];
#pragma unroll
            for (int v = 0; v < AM_U; v++) {
                const int w = wb + v * nw, i = w * 32 + lane;
                g[v] = x[v] = lr[v] = 0.0f;
                old[v] = w < w1 ? t.pol[w] : 0u;
                if (w < w1 && i < n) {
                    g[v] = ld_f(t.g, t.g_bf16, i);
                    x[v] = ld_f(t.p, t.p_bf16, i);
                    lr[v] = t.m8 ? __fmul_rn((float)(int8_t)q[i], old_scale) : mf[i];
                }
            }
#pragma unroll
            for (int v = 0; v < AM_U; v++) {
                const int w = wb + v * nw, i = w * 32 + lane;
                if (w >= w1)    /* uniform over the warp */
                    continue;
                const bool in = i < n;
                bool up = false, same = false;
                if (in) {
                    float u;
                    if (t.s1) {
                        uint32_t bb = one ? 0u : am_div((uint32_t)i, t.mRC, t.lRC), rem = (uint32_t)i - bb * RC;
                        uint32_t r = am_div(rem, t.mC, t.lC), c = rem - r * C;
                        u = __fmul_rn(__fmul_rn(rf[(int64_t)bb * t.R + r], cf[(int64_t)bb * C + c]), g[v]);
                    } else {
                        u = __fmul_rn(__fdiv_rn(1.0f, __fsqrt_rn(t.s0[i])), g[v]);
                    }
                    u = __fdiv_rn(u, div);
                    up = u > 0.0f;
                    same = up == (bool)((old[v] >> lane) & 1u);
                    float l = am_lr(lr[v], same, a);
                    lr_max = fmaxf(lr_max, fabsf(l));
                    lr_sum = __fadd_rn(lr_sum, l);
                    float xv = x[v], upd = __fmul_rn(u, l);
                    if (a.weight_decay != 0.0f)
                        xv = __fadd_rn(xv, __fmul_rn(__fmul_rn(xv, -a.weight_decay), l));
                    xv = __fadd_rn(xv, -upd);
                    st_param(t.p, t.p_bf16, i, xv, t.seed, off);
                    if (!t.m8)
                        mf[i] = l;
                }
                uint32_t wu = __ballot_sync(0xffffffffu, up), ws = __ballot_sync(0xffffffffu, same);
                if (lane == 0) {
                    t.pol[w] = wu;
                    t.agree[w] = ws;
                }
            }
        }
    }
    lr_max = block_reduce<true>(lr_max, red);
    lr_sum = block_reduce<false>(lr_sum, red);
    if (threadIdx.x == 0) {
        P.scr[t.lrp + 2 * k] = lr_max;
        P.scr[t.lrp + 2 * k + 1] = lr_sum;
    }
}

/* The new int8 code of an element from its old code and agreement bit. */
GHC_D uint32_t am_code(uint8_t q, bool same, float old_scale, float ns, const ghc_automagic_args &a)
{
    float lr = am_lr(__fmul_rn((float)(int8_t)q, old_scale), same, a);
    float c = fminf(fmaxf(rintf(__fdiv_rn(lr, ns)), -127.0f), 127.0f);
    return (uint8_t)(int8_t)c;
}

/* 4. Flat chunks: the int8 mask against the tensor's new absmax (every block takes the max
 * of the chunk maxima: exact in any order); the tensor's first chunk writes the new scale and
 * the mean lr (chunk sums in chunk order). */
static __global__ void __launch_bounds__(AM_T) k_am_mask(const am_plan_dev P, const ghc_automagic_args a)
{
    __shared__ float red[33];
    const int ti = P.ownf[blockIdx.x];
    const am_desc t = P.t[ti];
    const int k = (int)blockIdx.x - P.startf[ti], tid = threadIdx.x;
    const float *lrp = P.scr + t.lrp;
    float mean = 0.0f;
    if (k == 0 && tid == 0) {
        float s = 0.0f;
        for (int j = 0; j < t.nf; j++)
            s = __fadd_rn(s, lrp[2 * j + 1]);
        mean = __fdiv_rn(s, (float)t.n);
    }
    if (!t.m8) {
        if (k == 0 && tid == 0)
            t.aux[1] = mean;
        return;
    }
    float m = 0.0f;
    for (int j = tid; j < t.nf; j += AM_T)
        m = fmaxf(m, lrp[2 * j]);
    m = block_reduce<true>(m, red);
    const float ns = m > 0.0f ? (float)((double)m / 127.0) : 1.0f, old_scale = P.scal[2 * ti + 1];
    __shared__ uint8_t code[512];   /* am_code of (agreement << 8 | old code): one lookup an element */
    for (int e = tid; e < 512; e += AM_T)
        code[e] = (uint8_t)am_code((uint8_t)e, e >> 8, old_scale, ns, a);
    __syncthreads();
    uint8_t *qw = (uint8_t *)t.mask;
    const int i0 = k * AM_CH, i1 = min(t.n, i0 + AM_CH);
    if (((uintptr_t)qw & 15u) == 0) {   /* 16 codes a load, AM_CH / (16 AM_T) = 2 loads per thread */
        uint4 c[2];
        uint32_t ag[2];
#pragma unroll
        for (int v = 0; v < 2; v++) {
            const int i = i0 + 16 * (tid + v * AM_T);
            if (i + 16 <= i1) {
                c[v] = *(const uint4 *)(qw + i);
                ag[v] = t.agree[i / 32] >> (i % 32);
            }
        }
#pragma unroll
        for (int v = 0; v < 2; v++) {
            const int i = i0 + 16 * (tid + v * AM_T);
            if (i + 16 <= i1) {
                uint32_t *w = &c[v].x;
#pragma unroll
                for (int e = 0; e < 16; e++) {
                    uint32_t sh8 = 8 * (e % 4), b = (w[e / 4] >> sh8) & 0xffu;
                    b = code[((ag[v] >> e) & 1u) << 8 | b];
                    w[e / 4] = (w[e / 4] & ~(0xffu << sh8)) | (b << sh8);
                }
                *(uint4 *)(qw + i) = c[v];
            } else {
                for (int e = i; e < i1; e++)
                    qw[e] = code[((t.agree[e / 32] >> (e % 32)) & 1u) << 8 | qw[e]];
            }
        }
    } else {
        for (int i = i0 + tid; i < i1; i += AM_T)
            qw[i] = code[((t.agree[i / 32] >> (i % 32)) & 1u) << 8 | qw[i]];
    }
    if (k == 0 && tid == 0) {
        t.aux[0] = ns;
        t.aux[1] = mean;
    }
}

/* ---- automagic plans: the device table, made once per (device, stream, tensor list) -------- */

struct am_plan {
    int                  dev;
    cudaStream_t         stream;
    std::vector<am_desc> desc;   /* as uploaded (offsets of the first call) */
    void                *buf;
    am_plan_dev          d;
    int32_t              total1, totalf;
    int32_t              thin1;   /* the first thin1 chunks of d.list1 go to k_am_stats_thin */
    uint64_t             used;
};

static std::mutex g_am_lock;
static struct {
    bool        on;
    cudaEvent_t ev[4];
    double      ms[3];
    int64_t     calls;
} g_am_prof;   /* ghc_k_automagic_profile */
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

/* The table of a call (zeroed padding, so that tables compare with memcmp), the chunk starts
 * and the scratch size in floats. */
static cudaError_t am_describe(const ghc_optim_tensor *ts, int32_t n, std::vector<am_desc> &d,
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
    cudaError_t e = am_describe(ts, n, d, s1, sf, &floats);
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
    /* ..., own1, ownf, list1 [n1], done [n] (zero) */
    size_t hdr = tb + 2 * sb + sizeof(int32_t) * (2 * n1 + nf + (size_t)n);
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
                       (int32_t *)(own_d + 2 * n1 + nf) };
    p.total1 = s1[(size_t)n];
    p.thin1 = nthin;
    p.totalf = sf[(size_t)n];
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
    if (p->thin1 > 0)
        k_am_stats_thin<<<p->thin1, AM_T, 0, s>>>(p->d, *args);
    if (p->total1 > p->thin1)
        k_am_stats<<<p->total1 - p->thin1, AM_T, 0, s>>>(p->d, *args, p->thin1);
    if (prof)
        cudaEventRecord(g_am_prof.ev[1], s);
    if (p->totalf > 0)
        k_am_update<AM_U4, AM_UB><<<p->totalf, AM_T, 0, s>>>(p->d, *args, delta, p->totalf);
    if (prof)
        cudaEventRecord(g_am_prof.ev[2], s);
    if (p->totalf > 0)
        k_am_mask<<<p->totalf, AM_T, 0, s>>>(p->d, *args);
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

extern "C" void ghc_k_automagic_profile(int on, double ms[3])
{
    std::lock_guard<std::mutex> lk(g_am_lock);
    for (int k = 0; k < 3 && ms; k++)
        ms[k] = g_am_prof.calls ? g_am_prof.ms[k] / g_am_prof.calls : 0.0;
    memset(g_am_prof.ms, 0, sizeof(g_am_prof.ms));
    g_am_prof.calls = 0;
    g_am_prof.on = on != 0;
}
