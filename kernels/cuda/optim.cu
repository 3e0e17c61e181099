/* optim.cu: the fused optimizer updates of ops.h ("optimizer updates") as multi-tensor launches,
 * no host synchronisation in the steady state.
 *   adamw:     element-wise; the list of tensors travels by value in the kernel parameters
 *              (__grid_constant__, AW_MAX tensors, 17 KB, a launch per AW_MAX); the tensors are
 *              cut into chunks of AW_CHUNK elements, one block each (a block finds its tensor by
 *              binary search of the chunk starts). The same roundings as kernels/cpu/optim.c
 *              (explicit _rn intrinsics, fmaf where the CPU has one): bit-identical to the CPU.
 *   automagic: LoRA's A and B (thin, f32, int8 mask) in one launch per kind, a cluster of
 *              blocks a tensor (k_am_fused, below: g read once); every other tensor in three
 *              passes, whatever their number: the tensor
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
#include <stdlib.h>

#include <algorithm>
#include <mutex>
#include <type_traits>
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
    int32_t     fused;       /* blocks of the cluster that steps the tensor in k_am_fused (span: the
                              * long side's lines a block), else 0 (no implicit padding: plans
                              * compare tables with memcmp) */
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
    const int32_t *listf;         /* the flat chunks of the tensors k_am_fused does not take */
    const int32_t *fl;            /* the tensors k_am_fused takes, by launch group */
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

/* A tall thin row's 4 consecutive elements e of a lane, LPR lanes a row: the row's sum of
 * v = g^2 + eps (every one of its lanes gets the same bits). */
template <int LPR>
GHC_D float am_row4(const float e[4], const ghc_automagic_args &a)
{
    float sum = 0.0f;
#pragma unroll
    for (int q = 0; q < 4; q++)
        sum = __fadd_rn(sum, __fadd_rn(__fmul_rn(e[q], e[q]), a.eps));
#pragma unroll
    for (int o = 1; o < LPR; o *= 2)
        sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, o));
    return sum;
}

/* Adds e's column partials: v, and g^2 times rr (1 / the row's new state). */
GHC_D void am_acc4(float pv[4], float pq[4], const float e[4], float rr, const ghc_automagic_args &a)
{
#pragma unroll
    for (int q = 0; q < 4; q++) {
        float g2 = __fmul_rn(e[q], e[q]);
        pv[q] = __fadd_rn(pv[q], __fadd_rn(g2, a.eps));
        pq[q] = __fadd_rn(pq[q], __fmul_rn(g2, rr));
    }
}

/* The column partials summed over the lanes that hold the same columns (fixed order). */
template <int LPR>
GHC_D void am_lanes4(float pv[4], float pq[4])
{
#pragma unroll
    for (int q = 0; q < 4; q++)
#pragma unroll
        for (int o = LPR; o < 32; o *= 2) {
            pv[q] = __fadd_rn(pv[q], __shfl_xor_sync(0xffffffffu, pv[q], o));
            pq[q] = __fadd_rn(pq[q], __shfl_xor_sync(0xffffffffu, pq[q], o));
        }
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
        const float sum = am_row4<LPR>(e, a);
        if (r < r1) {
            float nv = am_ema(old[u], __fdiv_rn(sum, (float)K), a);
            if (cg == 0)
                s0[r] = nv;
            am_acc4(pv, pq, e, __frcp_rn(nv), a);
        }
    }
    am_lanes4<LPR>(pv, pq);
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

/* A lane's 4 polarity and agreement bits (element i0 .. i0 + 3, i0 % 4 == 0, 8 lanes a 32-bit
 * word) OR-ed into their words over the 8 lanes; the word's first lane stores them at pol[w],
 * agree[w] (w = i0 / 32) where `store`. */
GHC_D void am_bits4(uint32_t nu, uint32_t ns, int i0, uint32_t *pol, uint32_t *agree, bool store)
{
    const uint32_t sh = (uint32_t)i0 % 32u;
    nu <<= sh;
    ns <<= sh;
#pragma unroll
    for (int o = 1; o < 8; o *= 2) {
        nu |= __shfl_xor_sync(0xffffffffu, nu, o);
        ns |= __shfl_xor_sync(0xffffffffu, ns, o);
    }
    if (threadIdx.x % 8 == 0 && store) {
        pol[i0 / 32] = nu;
        agree[i0 / 32] = ns;
    }
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
            am_bits4(nu, ns, i, t.pol, t.agree, i < i1);
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
    const int32_t blk = P.listf[total - 1 - (int32_t)blockIdx.x];
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

/* The int8 scale of a mask whose largest |lr| is m (upstream's Auto8bitTensor: absmax / 127). */
GHC_D float am_scale(float m) { return m > 0.0f ? (float)((double)m / 127.0) : 1.0f; }

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
    const int32_t chunk = P.listf[blockIdx.x];
    const int ti = P.ownf[chunk];
    const am_desc t = P.t[ti];
    const int k = chunk - P.startf[ti], tid = threadIdx.x;
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
    const float ns = am_scale(m), old_scale = P.scal[2 * ti + 1];
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

/* ---- automagic: thin tensors, a cluster of blocks a tensor, g read once --------------------- */

/* A thin tensor (LoRA's A [K][C] or B [R][K], K = 4, 8, 16 or 32; f32 params and g, the int8
 * mask, one matrix, the long side in whole groups of 128 elements, 16-byte aligned arrays) is
 * stepped whole by one cluster of `fused` blocks (am_desc::fused), each holding `span` lines of
 * the long side in shared memory. Each block has AF_MAXW compute warps and one mover warp. The
 * mover brings a tensor's g, codes, polarity words and long-side state in by bulk copies (the
 * tensor memory accelerator: every byte in flight at once, no registers held) into one of two
 * stages while the compute warps work on the other, and sends the finished stage's results back
 * the same way; the params come in by bulk copies too, into one buffer of their own, where it
 * fits in shared memory (pbuf), else through registers (prefetched into L2). The compute warps: the
 * long side's state (complete in the block) and the short side's partials, pushed to every
 * block of the cluster (st.async into their shared memory; summed in rank order:
 * deterministic); then every block alike the short side's state and the clipping divisor; the
 * update; the new int8 scale and the codes. The new scale (the max new lr) is known before the
 * update: the sign of u is the sign of g unless u underflows to zero, so each element's new lr
 * is known from g, its old code and polarity (a 512-entry table of (agreement, old code) made
 * once a tensor), and the block's max |new lr|, pushed with the partials, gives it; the update
 * then takes each lr and new code from the tables and writes the codes. Where a u could
 * underflow (a bound from the smallest |g| and factors says so), the cluster takes the scale
 * from the lr max the update pushes and writes the codes after it (the fallback). So g is read
 * once from HBM and every byte of state moves once: 14.25 B a param and the long side's state
 * (the agreement bits, scratch, stay in shared memory: state[5] is left as it was). The
 * clusters are persistent: cluster c steps tensors c, c + ncl, ... of its launch (ncl
 * resident). Per element the arithmetic is the flat passes' (the same bits for masks and
 * polarity; the sums in another fixed order). */
#define AF_MAXW  23    /* compute warps a block (H100, bench_optim, once: 16 warps 0.62 ms, 20 0.605, 23 0.600; later, 24: 0.571 against 0.532) */
#define AF_T     (32 * AF_MAXW + 32)   /* with the mover warp: one block an SM (at most 85 registers) */
#define AF_NS    2     /* stages (one tensor each; the exchange's prologue takes the next tensor's, the other one) */
#define AF_MAXNC 16    /* blocks a cluster (more than 8: a non-portable size) */
#define AF_NEX   3     /* the extremes a block sends with its partials (k_am_fused, 1.) */

/* floats a block's partials take in a receiver's slot: 2 K + 1 + AF_NEX, in 16-byte stores */
static constexpr int af_xw(int K) { return (2 * K + 1 + AF_NEX + 3) / 4 * 4; }

/* What a block keeps besides the tensor's slices (sized for the short side K: B [13824, 16]
 * takes its params through shared memory only so). */
template <int K>
struct af_small {
    __align__(16) float sfac[32];       /* the short side's update factors (read as float4) */
    float sold[2][32];                  /* [stage] the short side's old state (by bulk copy) */
    __align__(16) float rx[2][AF_MAXNC][af_xw(K)];   /* [k % 2][block] the blocks' partials, pushed */
    float rl[2][AF_MAXNC][2];           /* [k % 2][block] the blocks' lr max and sum, pushed */
    am_desc desc[2];                    /* [stage] the tensor's table entry (the mover's copy) */
    float oscale[2];                    /* [stage] its old int8 scale */
    float misc[3];                      /* div, exact (1) or not (0), new scale */
    float part[AF_MAXW][2 * K];         /* tall: the warps' column partials */
    uint32_t pex[AF_MAXW][AF_NEX];      /* the warps' extremes */
    float prs[AF_MAXW];                 /* tall: the warps' sums of their rows' states */
    float plr[AF_MAXW][2];              /* the warps' lr max and sum (the update) */
    __align__(16) float xch[af_xw(K)];  /* this block's partials: [2 K] sums of v and of g^2 / state, [2 K] its rows' sum (tall), then the AF_NEX extremes */
    float2 lc[2][512];                  /* [k % 2] the new lr (x) and new code (y, its bits) of (agreement, old code) */
    int32_t pre[2];                     /* [k % 2] k: tensor k's lr table and columns were made during k - 1's exchange */
    int32_t pf;                         /* the next tensor is in (the prologue's test) */
    unsigned long long full[2], done[2];   /* [stage] loaded (mover -> compute), finished (compute -> mover) */
    unsigned long long xb[2][2];        /* [k % 2][partials, lr] the cluster's pushes have arrived */
    unsigned long long pfull;           /* the params of the tensor next to update are in (af_layout::par) */
};

static_assert(AF_NS == 2, "af_small's [stage] slots; the exchange's prologue finds the next tensor in the other stage");

/* Byte offsets in a block's dynamic shared memory: two stages, each one tensor's slices (g,
 * codes, polarity and agreement words, the long side's state at g + the offsets), then the rest. */
struct af_layout {
    uint32_t g, stage, mask, pol, agree, lst, lrc, lfac, par, small, bytes;
};

static __host__ __device__ inline uint32_t af_small_bytes(int K)
{
    return K == 4 ? sizeof(af_small<4>) : K == 8 ? sizeof(af_small<8>) : K == 16 ? sizeof(af_small<16>)
                                                                             : sizeof(af_small<32>);
}

/* Where a block's pieces lie in its dynamic shared memory (at most span long-side lines of K;
 * the columns' reciprocals only for a wide tensor). */
static __host__ __device__ inline af_layout af_layout_of(int K, int span, bool pbuf, bool wide)
{
    const uint32_t E = (uint32_t)K * (uint32_t)span;
    af_layout l;
    uint32_t o = 0;
    auto take = [&o](uint32_t b) {
        uint32_t r = o;
        o += (b + 15u) & ~15u;
        return r;
    };
    l.small = take(af_small_bytes(K));
    l.g = take(4 * E);
    l.mask = take(E) - l.g;
    l.pol = take(E / 8) - l.g;
    l.agree = take(E / 8) - l.g;
    l.lst = take(4 * (uint32_t)span) - l.g;
    l.stage = o - l.g;
    o += l.stage * (uint32_t)(AF_NS - 1);
    l.lrc = wide ? take(8 * (uint32_t)span) : 0u;   /* [k % 2][span] */
    l.lfac = take(8 * (uint32_t)span);
    l.par = pbuf ? take(4 * E) : 0u;   /* the params of the tensor next to update (one buffer) */
    l.bytes = o;
    return l;
}

GHC_D uint32_t af_sa(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

GHC_D void af_bar_init(unsigned long long *b)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(af_sa(b)));
}

GHC_D void af_bar_expect(unsigned long long *b, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(af_sa(b)), "r"(bytes) : "memory");
}

GHC_D void af_bar_arrive(unsigned long long *b)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(af_sa(b)) : "memory");
}

/* Waits for the phase of `parity` to complete (acquire at CTA scope). The barriers count bytes
 * that arrive in this block's shared memory through the async proxy (bulk copies, and other
 * blocks' st.async pushes) and this block's own arrivals: once the phase completes the bytes are
 * in, as for the TMA pipelines of CUTLASS; a cluster-scope acquire would also invalidate the L1
 * (CCTL.IVALL, measured in the partials' wait) for nothing read from it. */
GHC_D void af_bar_wait(unsigned long long *b, uint32_t parity)
{
    asm volatile("{\n"
                 ".reg .pred p;\n"
                 "AF_WAIT:\n"
                 "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra AF_WAIT;\n"
                 "}" ::"r"(af_sa(b)),
                 "r"(parity)
                 : "memory");
}

/* Whether the phase of `parity` has completed (not waiting; acquire at CTA scope). */
GHC_D bool af_bar_test(unsigned long long *b, uint32_t parity)
{
    uint32_t r;
    asm volatile("{\n"
                 ".reg .pred p;\n"
                 "mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 "selp.u32 %0, 1, 0, p;\n"
                 "}"
                 : "=r"(r)
                 : "r"(af_sa(b)), "r"(parity)
                 : "memory");
    return r != 0u;
}

/* bytes (a multiple of 16, both ends 16-byte aligned) from global src to shared dst */
GHC_D void af_load(void *dst, const void *src, uint32_t bytes, unsigned long long *b)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     af_sa(dst)),
                 "l"(src), "r"(bytes), "r"(af_sa(b))
                 : "memory");
}

GHC_D void af_store(void *dst, const void *src, uint32_t bytes)
{
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(af_sa(src)), "r"(bytes)
                 : "memory");
}

GHC_D uint32_t af_rank()
{
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

GHC_D uint32_t af_nrank()
{
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(r));
    return r;
}

GHC_D void af_cluster_sync()
{
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

/* The compute warps' barrier (named barrier 1: the mover warp goes its own way). */
GHC_D void af_csync() { asm volatile("bar.sync 1, %0;" ::"n"(32 * AF_MAXW) : "memory"); }

/* x (in this block's shared memory) as cluster block `rank` has it: its address there */
GHC_D uint32_t af_map(const void *x, uint32_t rank)
{
    uint32_t a;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(a) : "r"(af_sa(x)), "r"(rank));
    return a;
}

/* 16 bytes into another block's shared memory at dst, completing bytes on its barrier at bar
 * (both addresses in the cluster's shared memory window: af_map's) */
GHC_D void af_push4a(uint32_t dst, float4 v, uint32_t bar)
{
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(dst),
                 "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(bar)
                 : "memory");
}

GHC_D void af_push2(float *dst, float x, float y, unsigned long long *bar, uint32_t rank)
{
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];" ::"r"(
                     af_map(dst, rank)),
                 "f"(x), "f"(y), "r"(af_map(bar, rank))
                 : "memory");
}

/* bytes (a multiple of 16, 16-byte aligned) at global p into L2 */
GHC_D void af_l2(const void *p, uint32_t bytes)
{
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}

/* Stage s's slices of a block: g, the long side's state, the codes, polarity and agreement. */
struct af_stage {
    float    *g, *lst;
    uint8_t  *mq;
    uint32_t *pol, *agr;
};

GHC_D af_stage af_stage_at(unsigned char *sm, const af_layout &lo, int s)
{
    unsigned char *st = sm + lo.g + s * lo.stage;
    return af_stage{ (float *)st, (float *)(st + lo.lst), st + lo.mask, (uint32_t *)(st + lo.pol),
                     (uint32_t *)(st + lo.agree) };
}

/* Block q's slice of tensor t: its first line and its lines. */
GHC_D void af_slice(const am_desc &t, bool wide, uint32_t q, int *l0, int *nl)
{
    const int L = wide ? t.C : t.R;
    *l0 = (int)q * t.span;
    *nl = max(0, min(t.span, L - *l0));
}

/* The mover's lanes: tensor ti's table entry and old int8 scale into stage s's slots, then the
 * bulk loads of block q's slice into stage s (for a wide tensor a lane a row): g, codes,
 * polarity, the long side's state and the short side's old state, on barrier full[s]; and,
 * without the params' buffer (pb false), the slice's params into L2 (the update reads them into
 * registers). */
template <int K, bool WIDE>
GHC_D void af_fetch(const am_plan_dev &P, int32_t ti, uint32_t q, unsigned char *sm, const af_layout &lo, int s,
                    bool pb)
{
    const int lane = threadIdx.x % 32;
    af_small<K> &S = *(af_small<K> *)(sm + lo.small);
    {
        const uint32_t *src = (const uint32_t *)(P.t + ti);
        uint32_t *dst = (uint32_t *)&S.desc[s];
        for (int w = lane; w < (int)(sizeof(am_desc) / 4); w += 32)
            dst[w] = src[w];
        __syncwarp();
    }
    const am_desc &t = S.desc[s];
    int l0, nl;
    af_slice(t, WIDE, q, &l0, &nl);
    const int E = nl * K;
    unsigned long long *bar = &S.full[s];
    if (lane == 0) {   /* the entry, then the bytes (an empty slice completes the phase with none) */
        S.oscale[s] = t.aux[0];
        af_bar_expect(bar, nl > 0 ? (uint32_t)(4 * E + E + E / 8 + 4 * nl + 4 * K) : 0u);
    }
    if (nl == 0)
        return;
    const int64_t C = t.C;
    const af_stage sl = af_stage_at(sm, lo, s);
    float *g = sl.g, *lst = sl.lst;
    uint8_t *mq = sl.mq;
    uint32_t *pol = sl.pol;
    if (WIDE) {
        if (lane < K) {
            const int r = lane;
            af_load(g + r * nl, (const float *)t.g + r * C + l0, 4 * nl, bar);
            af_load(mq + r * nl, (const uint8_t *)t.mask + r * C + l0, nl, bar);
            af_load(pol + r * nl / 32, t.pol + (r * C + l0) / 32, nl / 8, bar);
            if (!pb)
                af_l2((const float *)t.p + r * C + l0, 4 * nl);
        }
        if (lane == K % 32) {
            af_load(lst, t.s1 + l0, 4 * nl, bar);
            af_load(S.sold[s], t.s0, 4 * K, bar);
        }
    } else {
        const int64_t e0 = (int64_t)l0 * K;
        if (lane == 0)
            af_load(g, (const float *)t.g + e0, 4 * E, bar);
        else if (lane == 1)
            af_load(mq, (const uint8_t *)t.mask + e0, E, bar);
        else if (lane == 2)
            af_load(pol, t.pol + e0 / 32, E / 8, bar);
        else if (lane == 3)
            af_load(lst, t.s0 + l0, 4 * nl, bar);
        else if (lane == 4)
            af_load(S.sold[s], t.s1, 4 * K, bar);
        else if (lane == 5 && !pb)
            af_l2((const float *)t.p + e0, 4 * E);
    }
}

/* What the mover works on for the tensor in stage s: the block's small part, the tensor's
 * table entry and block q's slice of it. */
template <int K>
struct af_mslice {
    af_small<K>   *S;
    const am_desc *t;
    int            l0, nl;
};

template <int K>
GHC_D af_mslice<K> af_mover_slice(uint32_t q, unsigned char *sm, const af_layout &lo, int s, bool wide)
{
    af_mslice<K> m;
    m.S = (af_small<K> *)(sm + lo.small);
    m.t = &m.S->desc[s];
    af_slice(*m.t, wide, q, &m.l0, &m.nl);
    return m;
}

/* The mover's lanes: the params of block q's slice of the tensor in stage s into the params'
 * buffer (for a wide tensor a lane a row), on barrier pfull. */
template <int K, bool WIDE>
GHC_D void af_fetch_par(uint32_t q, unsigned char *sm, const af_layout &lo, int s)
{
    const int lane = threadIdx.x % 32;
    const af_mslice<K> m = af_mover_slice<K>(q, sm, lo, s, WIDE);
    af_small<K> &S = *m.S;
    const am_desc &t = *m.t;
    const int l0 = m.l0, nl = m.nl, E = nl * K;
    float *par = (float *)(sm + lo.par);
    if (lane == 0)
        af_bar_expect(&S.pfull, (uint32_t)(4 * E));
    if (nl == 0)
        return;
    if (WIDE) {
        if (lane < K)
            af_load(par + lane * nl, (const float *)t.p + (int64_t)lane * t.C + l0, 4 * nl, &S.pfull);
    } else if (lane == 0) {
        af_load(par, (const float *)t.p + (int64_t)l0 * K, 4 * E, &S.pfull);
    }
}

/* The mover's lanes: stage s's results out (codes, polarity, the long side's state; the
 * agreement bits are scratch, used in the stage only: they stay there). */
template <int K, bool WIDE>
GHC_D void af_flush(uint32_t q, unsigned char *sm, const af_layout &lo, int s)
{
    const int lane = threadIdx.x % 32;
    const af_mslice<K> m = af_mover_slice<K>(q, sm, lo, s, WIDE);
    const am_desc &t = *m.t;
    const int l0 = m.l0, nl = m.nl;
    if (nl == 0)
        return;
    const int E = nl * K;
    const int64_t C = t.C;
    const af_stage sl = af_stage_at(sm, lo, s);
    const float *lst = sl.lst;
    const uint8_t *mq = sl.mq;
    const uint32_t *pol = sl.pol;
    if (WIDE) {
        if (lane < K) {
            const int r = lane;
            af_store((uint8_t *)t.mask + r * C + l0, mq + r * nl, nl);
            af_store(t.pol + (r * C + l0) / 32, pol + r * nl / 32, nl / 8);
        }
        if (lane == K % 32)
            af_store(t.s1 + l0, lst, 4 * nl);
    } else {
        const int64_t e0 = (int64_t)l0 * K;
        if (lane == 0)
            af_store((uint8_t *)t.mask + e0, mq, E);
        else if (lane == 1)
            af_store(t.pol + e0 / 32, pol, E / 8);
        else if (lane == 2)
            af_store(t.s0 + l0, lst, 4 * nl);
    }
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

#ifdef AF_TRACE
/* A timing aid (build with -DAF_TRACE; bench_optim prints the phases): thread 0 of the first
 * 8 blocks records clock64() per tensor k < 32 (wide, K = 16) at 0 the loop's top, 1 the stage
 * in, 2 the stats done, 6 the partials in (warp 0), 7 their sums, 8 the trees, 9 lane 0's
 * scalars, 3 after the exchange's barrier, 4 its update done, 5 the stage handed back, 12 its
 * partials gathered (warp 0), 13 pushed; thread 32 at 11 its prologue done and 10 the partials
 * in. (The compiler may move the clock reads among nearby instructions.) */
__device__ long long af_trace[8][32][14];
#define AF_TR(j)                                                                                        \
    do {                                                                                                \
        if (WIDE && K == 16 && blockIdx.x < 8 && (tid == 0 || (tid == 32 && (j) >= 10)) && k < 32)      \
            af_trace[blockIdx.x][k][j] = clock64();                                                     \
    } while (0)
extern "C" void ghc_k_automagic_trace(long long *out)
{
    cudaMemcpyFromSymbol(out, af_trace, sizeof(af_trace));
}
#else
#define AF_TR(j) (void)0
#endif

/* The tensors P.fl[first .. first + count) (thin: K, wide or tall), cluster c of the launch's ncl
 * taking c, c + ncl, ...; span: the largest of theirs (the shared-memory layout). */
template <int K, bool WIDE>
static __global__ void __launch_bounds__(AF_T, 1) k_am_fused(const am_plan_dev P, const ghc_automagic_args a,
                                                             int32_t first, int32_t count, int32_t span,
                                                             int32_t late, int32_t pbuf)
{
    extern __shared__ __align__(16) unsigned char sm[];
    const uint32_t q = af_rank(), nc = af_nrank();
    const int cid = (int)(blockIdx.x / nc), ncl = (int)(gridDim.x / nc);
    const int nk = cid < count ? (count - cid + ncl - 1) / ncl : 0;   /* this cluster's tensors */
    constexpr int FC = AF_MAXW * 32, NS = AF_NS;
    const af_layout lo = af_layout_of(K, span, pbuf != 0, WIDE);
    af_small<K> &S = *(af_small<K> *)(sm + lo.small);
    /* (lrcb: wide tensors only; a tall one's layout has none, and its code never reads it) */
    float *const lrcb = (float *)(sm + lo.lrc), *const lfacb = (float *)(sm + lo.lfac);
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, NW = AF_MAXW;
    if (tid == 0) {
        for (int b = 0; b < 2; b++) {
            S.pre[b] = -1;
            af_bar_init(&S.full[b]);
            af_bar_init(&S.done[b]);
            af_bar_init(&S.xb[b][0]);
            af_bar_init(&S.xb[b][1]);
            if (b == 0)
                af_bar_init(&S.pfull);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    af_cluster_sync();   /* every block's barriers are set before any push */

    if (warp == NW) {   /* the mover */
        for (int k = 0; k < nk + NS; k++) {
            const int s = k % NS;
            if (k >= NS) {   /* tensor k - NS's results out, once computed; its stage then free */
                af_bar_wait(&S.done[s], (uint32_t)((k - NS) / NS) & 1u);
                /* first tensor k - 1's params (the buffer is free with k - 2 done): its update
                 * comes before tensor k's stats */
                if (pbuf && k - 1 < nk)
                    af_fetch_par<K, WIDE>(q, sm, lo, (k - 1) % NS);
                af_flush<K, WIDE>(q, sm, lo, s);
                asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
            }
            if (k < nk)
                af_fetch<K, WIDE>(P, P.fl[first + cid + k * ncl], q, sm, lo, s, pbuf != 0);
            if (pbuf && k == 0 && nk > 0)
                af_fetch_par<K, WIDE>(q, sm, lo, 0);
        }
    } else {
        float *prev_aux = NULL;   /* exact mode: the previous tensor's aux and size, its lr sums pending */
        int32_t prev_n = 0;
        /* a warp (0 for the fallback, else 1, off warp 0's path): waits for tensor kk's lr pushes;
         * rank 0 writes its mean lr (the sums in rank order) */
        auto mean_lr = [&](int kk, float *aux, int32_t n) {
            af_bar_wait(&S.xb[kk & 1][1], (uint32_t)(kk >> 1) & 1u);
            if (q == 0 && lane == 0) {
                float sum = 0.0f;
                for (int b = 0; b < (int)nc; b++)
                    sum = __fadd_rn(sum, S.rl[kk & 1][b][1]);
                aux[1] = __fdiv_rn(sum, (float)n);
            }
        };
        /* the new code of every (agreement, old code) against the new scale nsc (into lc[].y), the threads
         * from i0 in steps of n */
        auto code_table = [&](float2 *lc, int s, float nsc, int i0, int n) {
            for (int e = i0; e < 512; e += n)
                lc[e].y = __uint_as_float(am_code((uint8_t)e, e >> 8, S.oscale[s], nsc, a) & 0xffu);
        };
        /* the new lr of (agreement, old code) against the old scale os (exact, a lookup), the
         * threads from i0 in steps of n */
        auto lr_table = [&](float2 *lc, float os, int i0, int n) {
            for (int e = i0; e < 512; e += n)
                lc[e].x = am_lr(__fmul_rn((float)(int8_t)(uint8_t)e, os), e >> 8, a);
        };
        /* wide: the nl columns' new state (in lst), 1 / state and factor, the threads from i0
         * in steps of n; returns the largest state (bits) */
        auto columns = [&](const float *g, float *lst, int nl, float *lrc, float *lfac, int i0, int n) {
            uint32_t mx = 0u;
            for (int c = i0; c < nl; c += n) {
                float sum = 0.0f;
#pragma unroll
                for (int r = 0; r < K; r++) {
                    const float v = g[r * nl + c];
                    sum = __fadd_rn(sum, __fadd_rn(__fmul_rn(v, v), a.eps));
                }
                const float nv = am_ema(lst[c], __fdiv_rn(sum, (float)K), a);
                lst[c] = nv;
                lrc[c] = __frcp_rn(nv);
                lfac[c] = __fdiv_rn(1.0f, __fsqrt_rn(nv));
                mx = max(mx, __float_as_uint(nv));
            }
            return mx;
        };
        uint32_t ex2n = 0u;   /* the prologue's largest column state (for the next tensor) */
        for (int k = 0; k < nk; k++) {
            const int s = k % NS, x = k & 1;
            AF_TR(0);
            af_bar_wait(&S.full[s], (uint32_t)(k / NS) & 1u);
            AF_TR(1);
            const am_desc t = S.desc[s];
            int l0, nl;
            af_slice(t, WIDE, q, &l0, &nl);
            const int E = nl * K;
            const af_stage sl = af_stage_at(sm, lo, s);
            float *g = sl.g, *lst = sl.lst;
            uint8_t *mq = sl.mq;
            uint32_t *pol = sl.pol, *agr = sl.agr;
            float *lrc = lrcb + (k & 1) * span, *lfac = lfacb + (k & 1) * span;
            float2 *lc = S.lc[k & 1];
            const bool pre = S.pre[k & 1] == k;   /* made in the previous tensor's exchange */
            if (!pre)
                lr_table(lc, S.oscale[s], tid, FC);

            /* 1. the long side's lines (complete here) and this block's partials of the short
             * side; and for the new int8 scale, known before the update: the max |new lr|
             * (the sign of u is the sign of g unless u underflows: checked in 2), the smallest
             * nonzero |g| and the largest long-side state. ex[]: maxima of order-preserving u32 */
            uint32_t ex[AF_NEX] = { 0u, 0u, pre ? ex2n : 0u }, gmn = 0xffffffffu;   /* gmn: min of 2 |g| - 1 (bits) */
            if (WIDE && !pre)   /* a column: its new state, 1 / state, the factor */
                ex[2] = columns(g, lst, nl, lrc, lfac, tid, FC);
            af_csync();
            float lm = 0.0f;   /* the max |new lr| */
            /* 4 consecutive elements e, their codes c4 and old polarity bits (low 4 of old) */
            auto track4 = [&](const float e[4], uint32_t c4, uint32_t old) {
                uint32_t gp = 0u;
#pragma unroll
                for (int u = 0; u < 4; u++)
                    gp |= (uint32_t)(e[u] > 0.0f) << u;
                const uint32_t sb = ~(gp ^ old);   /* bit u: its sign agrees (the sign of u is g's) */
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    lm = fmaxf(lm, fabsf(lc[__byte_perm(c4, 0u, 0x4440u + (uint32_t)u) | ((sb << (8 - u)) & 0x100u)].x));
                    gmn = min(gmn, (__float_as_uint(e[u]) << 1) - 1u);   /* zeros wrap to the max */
                }
            };
            if (WIDE) {
                for (int r = warp; r < K; r += NW) {   /* a row's partials: a warp over the columns, 4 a lane */
                    float sv = 0.0f, sq = 0.0f;
                    for (int c = 4 * lane; c < nl; c += 128) {
                        const int i = r * nl + c;
                        const float4 v = *(const float4 *)(g + i), rc = *(const float4 *)(lrc + c);
                        const float e[4] = { v.x, v.y, v.z, v.w }, f[4] = { rc.x, rc.y, rc.z, rc.w };
                        const uint32_t c4 = *(const uint32_t *)(mq + i), old = pol[i / 32] >> (i % 32);
#pragma unroll
                        for (int u = 0; u < 4; u++) {
                            const float g2 = __fmul_rn(e[u], e[u]);
                            sv = __fadd_rn(sv, __fadd_rn(g2, a.eps));
                            sq = __fadd_rn(sq, __fmul_rn(g2, f[u]));
                        }
                        track4(e, c4, old);
                    }
                    sv = ghc_warp_sum(sv);
                    sq = ghc_warp_sum(sq);
                    if (lane == 0) {
                        S.xch[r] = sv;
                        S.xch[K + r] = sq;
                    }
                }
            } else {
                constexpr int LPR = K / 4, RPS = FC / LPR;   /* lanes a row, rows a step */
                const int cg = tid % LPR;
                float pv[4] = { 0.0f, 0.0f, 0.0f, 0.0f }, pq[4] = { 0.0f, 0.0f, 0.0f, 0.0f }, rs = 0.0f;
                /* a warp's rows are all in or all out: nl is a multiple of 128 / K = 32 / LPR */
                for (int r = tid / LPR; r < nl; r += RPS) {
                    const int i = r * K + 4 * cg;
                    const float4 v = *(const float4 *)(g + i);
                    const float e[4] = { v.x, v.y, v.z, v.w };
                    const uint32_t c4 = *(const uint32_t *)(mq + i), old = pol[i / 32] >> (i % 32);
                    track4(e, c4, old);
                    const float nv = am_ema(lst[r], __fdiv_rn(am_row4<LPR>(e, a), (float)K), a);
                    __syncwarp();
                    if (cg == 0) {
                        lst[r] = nv;
                        rs = __fadd_rn(rs, nv);
                    }
                    ex[2] = max(ex[2], __float_as_uint(nv));
                    am_acc4(pv, pq, e, __frcp_rn(nv), a);
                }
                am_lanes4<LPR>(pv, pq);
                if (lane < LPR)
#pragma unroll
                    for (int u = 0; u < 4; u++) {
                        S.part[warp][4 * cg + u] = pv[u];
                        S.part[warp][K + 4 * cg + u] = pq[u];
                    }
                rs = ghc_warp_sum(rs);
                if (lane == 0)
                    S.prs[warp] = rs;
            }
            ex[0] = __float_as_uint(lm);   /* >= 0: ordered as its bits */
            ex[1] = ~gmn;                  /* all zeros: 0 */
#pragma unroll
            for (int v = 0; v < AF_NEX; v++)   /* the extremes over the warp, then the block */
                for (int o = 16; o > 0; o /= 2)
                    ex[v] = max(ex[v], __shfl_xor_sync(0xffffffffu, ex[v], o));
            if (lane == 0)
#pragma unroll
                for (int v = 0; v < AF_NEX; v++)
                    S.pex[warp][v] = ex[v];
            af_csync();

            /* this thread's first group of the update: row r0, column c0 of the slice (wide) and,
             * without the params' buffer, its params (the mover prefetched them into L2) loaded
             * now, in flight while the partials cross the cluster (warp 0: after its pushes) */
            AF_TR(2);
            int r0 = 0, c0 = 0;
            float *p0 = NULL;
            float4 xfirst = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            auto first_group = [&]() {   /* (warp 0: once its partials are pushed) */
                r0 = WIDE && nl > 0 ? 4 * tid / nl : 0;
                c0 = WIDE && nl > 0 ? 4 * tid % nl : 0;
                p0 = (float *)t.p + (WIDE ? (int64_t)l0 + (int64_t)r0 * t.C + c0 : (int64_t)l0 * K + 4 * tid);
                if (!pbuf && 4 * tid < E)
                    xfirst = __ldcg((const float4 *)p0);
            };
            if (warp != 0)
                first_group();

            /* 2. the partials to every block of the cluster, then from all of
             * them in rank order: the short side's state and factors, the clipping divisor, and
             * (exact: no u can underflow to zero, so its sign is g's) the new int8 scale */
            constexpr int NX = (2 * K + 1 + AF_NEX + 3) / 4;   /* 16-byte pushes a block */
            if (warp == 0) {
                /* the block's partials from the warps' (tall: the columns' in warp order, the
                 * rows' states by a tree) and its extremes (lane w takes warp w's) */
                if (!WIDE) {
                    for (int i = lane; i < 2 * K; i += 32) {
                        float sum = 0.0f;
#pragma unroll
                        for (int w = 0; w < NW; w++)
                            sum = __fadd_rn(sum, S.part[w][i]);
                        S.xch[i] = sum;
                    }
                    const float rs = ghc_warp_sum(lane < NW ? S.prs[lane] : 0.0f);
                    if (lane == 0)
                        S.xch[2 * K] = rs;
                }
                {
                    uint32_t m[AF_NEX];
#pragma unroll
                    for (int v = 0; v < AF_NEX; v++) {
                        m[v] = lane < NW ? S.pex[lane][v] : 0u;
#pragma unroll
                        for (int o = 16; o > 0; o /= 2)
                            m[v] = max(m[v], __shfl_xor_sync(0xffffffffu, m[v], o));
                    }
#pragma unroll
                    for (int v = 0; v < AF_NEX; v++)
                        if (lane == v)
                            S.xch[2 * K + 1 + v] = __uint_as_float(m[v]);
                }
                __syncwarp();
                AF_TR(12);
                if (lane == 0)
                    af_bar_expect(&S.xb[x][0], (uint32_t)(16 * NX) * nc);
                {   /* piece i / nc to block i % nc: nc is a power of two up to 16 (af_fit), so a
                     * lane's block is the same in each of its steps */
                    const uint32_t lg = (uint32_t)__ffs((int)nc) - 1u, rk = (uint32_t)lane & (nc - 1u);
                    const uint32_t dst = af_map(&S.rx[x][q][0], rk), bar = af_map(&S.xb[x][0], rk);
                    for (int i = lane; i < NX * (int)nc; i += 32) {
                        const uint32_t pc = (uint32_t)i >> lg;
                        af_push4a(dst + 16u * pc, *(const float4 *)&S.xch[4 * pc], bar);
                    }
                }
                AF_TR(13);
                first_group();
                const float sqn = (float)sqrt((double)t.n);
                af_bar_wait(&S.xb[x][0], (uint32_t)(k >> 1) & 1u);
                AF_TR(6);
                float sv = 0.0f, sq = 0.0f, rsum = 0.0f;
                uint32_t exv = 0u;
#pragma unroll 4
                for (int b = 0; b < (int)nc; b++) {
                    if (lane < K) {
                        sv = __fadd_rn(sv, S.rx[x][b][lane]);
                        sq = __fadd_rn(sq, S.rx[x][b][K + lane]);
                    }
                    if (!WIDE)
                        rsum = __fadd_rn(rsum, S.rx[x][b][2 * K]);
                    if (lane < AF_NEX)
                        exv = max(exv, __float_as_uint(S.rx[x][b][2 * K + 1 + lane]));
                }
                AF_TR(7);
                float nv = 0.0f, w = 0.0f;
                if (lane < K) {
                    nv = am_ema(S.sold[s][lane], __fdiv_rn(sv, (float)(WIDE ? t.C : t.R)), a);
                    w = __fdiv_rn(sq, nv);
                }
                /* over the lines: fixed trees (every block the same bits); the largest state
                 * gives the smallest factor (each step of the factor is monotone) */
                float wsum = w, nsum = nv, nmax = nv;
#pragma unroll
                for (int o = 16; o > 0; o /= 2) {
                    wsum = __fadd_rn(wsum, __shfl_xor_sync(0xffffffffu, wsum, o));
                    nsum = __fadd_rn(nsum, __shfl_xor_sync(0xffffffffu, nsum, o));
                    nmax = fmaxf(nmax, __shfl_xor_sync(0xffffffffu, nmax, o));
                }
                AF_TR(8);
                /* (wide: K is a power of two, so the division is this product, exactly) */
                const float rmean = WIDE ? __fmul_rn(nsum, 1.0f / K) : __fdiv_rn(rsum, (float)t.R);
                /* the factors 1 / sqrt(nv / rmean) (tall: 1 / sqrt(nv)) in the lanes < K, the
                 * smallest (of nmax) in lane 30 and the divisor sqrt(rmean wsum) / sqrt(n) / clip
                 * in lane 31: the same steps in every lane (a division by 1 is exact) */
                float fac, smin, div;
                if constexpr (K <= 16) {
                    const bool dl = lane == 31;
                    const float xin = dl ? __fmul_rn(rmean, wsum) : lane < K ? nv : nmax;
                    const float y1 = __fsqrt_rn(WIDE ? __fdiv_rn(xin, dl ? 1.0f : rmean) : xin);
                    const float z1 = __fdiv_rn(dl ? y1 : 1.0f, dl ? sqn : y1);
                    fac = __fdiv_rn(z1, dl ? a.clip : 1.0f);
                    smin = __shfl_sync(0xffffffffu, fac, 30);
                    div = __shfl_sync(0xffffffffu, fac, 31);
                } else {   /* K = 32: every lane a factor, the divisor alike in all */
                    fac = WIDE ? __fdiv_rn(1.0f, __fsqrt_rn(__fdiv_rn(nv, rmean))) : __fdiv_rn(1.0f, __fsqrt_rn(nv));
                    smin = fac;
#pragma unroll
                    for (int o = 16; o > 0; o /= 2)
                        smin = fminf(smin, __shfl_xor_sync(0xffffffffu, smin, o));
                    div = __fdiv_rn(__fdiv_rn(__fsqrt_rn(__fmul_rn(rmean, wsum)), sqn), a.clip);
                }
                if (lane < K) {
                    S.sfac[lane] = fac;
                    if (q == 0)
                        (WIDE ? t.s0 : t.s1)[lane] = nv;
                }
                uint32_t ev[AF_NEX];
#pragma unroll
                for (int v = 0; v < AF_NEX; v++)
                    ev[v] = __shfl_sync(0xffffffffu, exv, v);
                if (lane == 0) {
                    if (!(div >= 1.0f))
                        div = 1.0f;
                    S.misc[0] = div;
                    /* the smallest |u| of a nonzero g, from below (a quarter for the roundings and the fast
                     * reciprocal): the smallest |g| times the smallest factors of the short side and (from the
                     * largest state) of the long side, over div */
                    const float gmin = __uint_as_float((~ev[1] + 1u) >> 1), lmax = __uint_as_float(ev[2]);
                    const float lfmin = WIDE ? rsqrtf(lmax) : rsqrtf(lmax / rmean);
                    /* (f32: an underflow or a NaN here only sends the cluster to the fallback) */
                    const float bound = 0.25f * gmin * smin * lfmin * __fdividef(1.0f, div);   /* (within 2 ulp) */
                    const bool exact = !late && (ev[1] == 0u || bound >= 0x1p-100f);
                    S.misc[1] = exact ? 1.0f : 0.0f;   /* (the new scale: the other warps) */
                    AF_TR(9);
                }
            } else if (warp % 4 != 0) {
                /* the compute warps off warp 0's scheduler (warp w issues on sub-partition
                 * w % 4: warp 0's chain keeps its own) meanwhile: the next tensor's lr table
                 * and (wide) its columns if its stage is in, then the new codes against the
                 * scale the partials give (the update writes them if exact) */
                constexpr int NP = 32 * ((FC / 32 - 1) - (FC / 32 - 1) / 4);
                const int pt = 32 * (warp - 1 - (warp - 1) / 4) + lane;
                if (warp == 1 && prev_aux)   /* the previous tensor's lr sums, if its scale was known early */
                    mean_lr(k - 1, prev_aux, prev_n);
                if (k + 1 < nk) {
                    const int s1 = (k + 1) % NS, k1 = (k + 1) & 1;
                    const uint32_t par = (uint32_t)((k + 1) / NS) & 1u;
                    if (pt == 0)
                        S.pf = af_bar_test(&S.full[s1], par);
                    asm volatile("bar.sync 2, %0;" ::"n"(NP) : "memory");
                    if (S.pf) {
                        af_bar_wait(&S.full[s1], par);   /* complete: each thread's acquire */
                        lr_table(S.lc[k1], S.oscale[s1], pt, NP);
                        if (WIDE) {
                            int l1, nl1;
                            af_slice(S.desc[s1], WIDE, q, &l1, &nl1);
                            const af_stage sn = af_stage_at(sm, lo, s1);
                            ex2n = columns(sn.g, sn.lst, nl1, lrcb + k1 * span, lfacb + k1 * span, pt, NP);
                        }
                        if (pt == 0)
                            S.pre[k1] = k + 1;
                    }
                }
                AF_TR(11);
                af_bar_wait(&S.xb[x][0], (uint32_t)(k >> 1) & 1u);
                AF_TR(10);
                uint32_t m = 0u;   /* the max |new lr| as warp 0 takes it */
                for (int b = 0; b < (int)nc; b++)
                    m = max(m, __float_as_uint(S.rx[x][b][2 * K + 1]));
                const float nsc = am_scale(__uint_as_float(m));
                if (pt == 0)
                    S.misc[2] = nsc;
                code_table(lc, s, nsc, pt, NP);
                if (!WIDE) {   /* the rows' factors: the mean row as warp 0 takes it */
                    float rsum = 0.0f;
                    for (int b = 0; b < (int)nc; b++)
                        rsum = __fadd_rn(rsum, S.rx[x][b][2 * K]);
                    const float rmean = __fdiv_rn(rsum, (float)t.R);
                    for (int r = pt; r < nl; r += NP)
                        lfac[r] = __fdiv_rn(1.0f, __fsqrt_rn(__fdiv_rn(lst[r], rmean)));
                }
            }
            af_csync();
            prev_aux = NULL;
            const bool exact = S.misc[1] != 0.0f;
            if (exact && q == 0 && tid == 32)
                t.aux[0] = S.misc[2];
            AF_TR(3);
            if (pbuf)   /* its params in */
                af_bar_wait(&S.pfull, (uint32_t)k & 1u);

            /* 3. the update, 4 elements a lane (8 lanes a polarity word) */
            const float div = S.misc[0];
            float lr_max = 0.0f, lr_sum = 0.0f;
            /* u / div as __fdiv_rn computes it: the reciprocal refined once here, the quotient and
             * its correction per element (the fast path's bits; exact where nothing over- or
             * underflows: div in (1, 2^60], |u| in [2^-60, 2^60)); otherwise __fdiv_rn (a zero is
             * itself) */
            const bool dfast = div != 1.0f && div <= 0x1p60f;
            float rdiv;
            asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(rdiv) : "f"(div));   /* what the fast path starts from */
            rdiv = __fmaf_rn(rdiv, __fmaf_rn(-div, rdiv, 1.0f), rdiv);
            /* wd: weight decay; one: div == 1 (uniform branches, not template arguments: one
             * update loop a kind of codes, 83 KB of code a kernel rather than 105) */
            const bool wd = a.weight_decay != 0.0f, one = div == 1.0f;
            auto update = [&](auto codesc) {
                /* CODES: the new codes written here (exact) */
                constexpr bool CODES = decltype(codesc)::value;
                /* the group's row r and column c of the slice (wide) and params pp, from the
                 * first (r0, c0, p0); per step of 4 FC elements dr rows and dc columns further
                 * (one row more where the columns wrap) */
                int r = r0, c = c0, dr = 0, dc = 0;
                if (WIDE && nl > 0) {
                    dr = 4 * FC / nl, dc = 4 * FC % nl;
                }
                float *pp = p0;
                const int64_t d1 = WIDE ? (int64_t)dr * t.C + dc : 4 * FC, d2 = d1 + t.C - nl;
                float4 xn = xfirst;
                const float *par = (const float *)(sm + lo.par);
                for (int i0 = 4 * tid; i0 < E; i0 += 4 * FC) {   /* E is a multiple of 128: whole warps */
                    /* the params from shared memory (pbuf) or L2, one group ahead */
                    float4 *pg = (float4 *)pp, xv = pbuf ? *(const float4 *)(par + i0) : xn;
                    float rf, cf[4];
                    if (WIDE) {
                        rf = S.sfac[r];
                        const float4 f = *(const float4 *)(lfac + c);
                        cf[0] = f.x, cf[1] = f.y, cf[2] = f.z, cf[3] = f.w;
                        c += dc;
                        r += dr;
                        const bool wrap = c >= nl;
                        if (wrap) {
                            c -= nl;
                            r++;
                        }
                        pp += wrap ? d2 : d1;
                    } else {
                        rf = lfac[i0 / K];
                        const float4 f = *(const float4 *)(S.sfac + i0 % K);
                        cf[0] = f.x, cf[1] = f.y, cf[2] = f.z, cf[3] = f.w;
                        pp += d1;
                    }
                    if (!pbuf && i0 + 4 * FC < E)
                        xn = __ldcg((const float4 *)pp);
                    const float4 gv = *(const float4 *)(g + i0);
                    const float ge[4] = { gv.x, gv.y, gv.z, gv.w };
                    float xe[4] = { xv.x, xv.y, xv.z, xv.w }, v[4], u[4];   /* v: u before the division */
                    bool slow = false;
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        u[e] = v[e] = __fmul_rn(__fmul_rn(rf, cf[e]), ge[e]);
                        if (!one) {
                            slow = slow || (__float_as_uint(v[e]) & 0x7fffffffu) - 0x21800000u >= 0x3c000000u;
                            const float q0 = __fmaf_rn(v[e], rdiv, 0.0f);
                            u[e] = __fmaf_rn(rdiv, __fmaf_rn(-div, q0, v[e]), q0);
                        }
                    }
                    if (!one && (slow || !dfast))
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            u[e] = v[e] == 0.0f ? v[e] : __fdiv_rn(v[e], div);
                    const uint32_t c4 = *(const uint32_t *)(mq + i0), sh = (uint32_t)i0 % 32u;
                    const uint32_t old = pol[i0 / 32] >> sh;
                    uint32_t nu = 0u, nc[4];
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        nu |= (uint32_t)(u[e] > 0.0f) << e;
                    const uint32_t sb = ~(nu ^ old);   /* bit e: element e's sign agrees */
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        /* (agreement, old code): the tables' index */
                        const uint32_t b = __byte_perm(c4, 0u, 0x4440u + (uint32_t)e) | ((sb << (8 - e)) & 0x100u);
                        const float2 lv = lc[b];   /* am_lr(old lr, same) and the new code: one load */
                        const float l = lv.x;
                        if (CODES)
                            nc[e] = __float_as_uint(lv.y);
                        else
                            lr_max = fmaxf(lr_max, fabsf(l));
                        lr_sum = __fadd_rn(lr_sum, l);
                        float xx = xe[e];
                        if (wd)
                            xx = __fadd_rn(xx, __fmul_rn(__fmul_rn(xx, -a.weight_decay), l));
                        xe[e] = __fadd_rn(xx, -__fmul_rn(u[e], l));
                    }
                    __stcg(pg, make_float4(xe[0], xe[1], xe[2], xe[3]));
                    if (CODES)
                        *(uint32_t *)(mq + i0) =
                            __byte_perm(__byte_perm(nc[0], nc[1], 0x0040u), __byte_perm(nc[2], nc[3], 0x0040u), 0x5410u);
                    am_bits4(nu, sb & 0xfu, i0, pol, agr, true);   /* polarity, agreement */
                }
            };
            if (exact)
                update(std::true_type());
            else
                update(std::false_type());
            AF_TR(4);
            lr_sum = ghc_warp_sum(lr_sum);   /* the warps' lr max and sum */
            for (int o = 16; o > 0; o /= 2)
                lr_max = fmaxf(lr_max, __shfl_xor_sync(0xffffffffu, lr_max, o));
            if (lane == 0) {
                S.plr[warp][0] = lr_max;
                S.plr[warp][1] = lr_sum;
            }

            /* 4. the block's lr max and sum (warp 0, once a barrier completed plr) to every
             * block. Exact: only rank 0 needs them (the mean lr, with the next tensor's
             * partials), so they go after the stage is handed back; else now: the new scale
             * (the cluster's max lr: exact in any order), the mean lr (rank order), then the
             * codes */
            auto push_lr = [&]() {   /* (lane w takes warp w's; the sum by a tree) */
                float mx = lane < NW ? S.plr[lane][0] : 0.0f;
                const float sum = ghc_warp_sum(lane < NW ? S.plr[lane][1] : 0.0f);
                for (int o = 16; o > 0; o /= 2)
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
                if (lane == 0)
                    af_bar_expect(&S.xb[x][1], 8u * nc);
                if (lane < (int)nc)
                    af_push2(&S.rl[x][q][0], mx, sum, &S.xb[x][1], (uint32_t)lane);
            };
            if (!exact) {
                af_csync();
                if (warp == 0) {
                    push_lr();
                    mean_lr(k, t.aux, t.n);
                    float m = lane < (int)nc ? S.rl[x][lane][0] : 0.0f;
                    for (int o = 16; o > 0; o /= 2)
                        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
                    if (lane == 0) {
                        S.misc[2] = am_scale(m);
                        if (q == 0)
                            t.aux[0] = S.misc[2];
                    }
                }
                af_csync();
                code_table(lc, s, S.misc[2], tid, FC);
                af_csync();
                for (int i = 4 * tid; i < E; i += 4 * FC) {
                    const uint32_t c4 = *(const uint32_t *)(mq + i), ag = agr[i / 32] >> (i % 32);
                    uint32_t o = 0;
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        o |= __float_as_uint(lc[((ag >> e) & 1u) << 8 | ((c4 >> (8 * e)) & 0xffu)].y) << (8 * e);
                    *(uint32_t *)(mq + i) = o;
                }
            }
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");   /* for the mover's bulk stores */
            af_csync();
            if (tid == 0)
                af_bar_arrive(&S.done[s]);
            AF_TR(5);
            if (exact) {
                if (warp == 0)
                    push_lr();
                prev_aux = t.aux;
                prev_n = t.n;
            }
        }
        if (warp == 1 && prev_aux)   /* the last tensor's lr sums */
            mean_lr(nk - 1, prev_aux, prev_n);
    }
    __syncwarp();
    af_cluster_sync();   /* no block leaves while its stores or another's pushes may be in flight */
}

/* ---- automagic plans: the device table, made once per (device, stream, tensor list) -------- */

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

static std::mutex g_am_lock;
static struct {
    bool        on;
    cudaEvent_t ev[4];
    double      ms[3];
    int64_t     calls;
} g_am_prof;   /* ghc_k_automagic_profile */
/* k_am_fused's groups after the first run on streams of their own, per device (made once) */
#define AF_STREAMS 7
static struct {
    cudaStream_t s[AF_STREAMS];
    cudaEvent_t  fork, join[AF_STREAMS];
    bool         made;
} g_af_st[64];
static bool g_af_serial = getenv("GHC_AUTOMAGIC_SERIAL") != NULL;   /* (measurement) */

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

typedef void (*af_fn)(const am_plan_dev, const ghc_automagic_args, int32_t, int32_t, int32_t, int32_t, int32_t);

static af_fn af_kernel(int K, bool wide)
{
    switch (K * (wide ? 1 : -1)) {
    case 4: return k_am_fused<4, true>;
    case 8: return k_am_fused<8, true>;
    case 16: return k_am_fused<16, true>;
    case 32: return k_am_fused<32, true>;
    case -4: return k_am_fused<4, false>;
    case -8: return k_am_fused<8, false>;
    case -16: return k_am_fused<16, false>;
    default: return k_am_fused<32, false>;
    }
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
static bool g_af_off;   /* ghc_k_automagic_fused(0) or GHC_AUTOMAGIC_FUSED=0 */
static int  g_af_late;  /* ghc_k_automagic_fused(2): the new scale always after the update */

static void af_device(int dev)
{
    if (dev < 0 || dev >= AF_DEVS || g_af_dev[dev].max_nc)
        return;
    int cl = 0, optin = 0;
    const char *env = getenv("GHC_AUTOMAGIC_FUSED");
    g_af_dev[dev].max_nc = -1;
    if ((env && strcmp(env, "0") == 0) || cudaDeviceGetAttribute(&cl, cudaDevAttrClusterLaunch, dev) != cudaSuccess ||
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
    bool big = cudaOccupancyMaxActiveClusters(&num, k_am_fused<16, true>, &cfg) == cudaSuccess && num > 0;
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

extern "C" void ghc_k_automagic_fused(int on)
{
    std::lock_guard<std::mutex> lk(g_am_lock);
    g_af_off = on == 0;
    g_af_late = on == 2;
}
