/* optim_automagic.cu: automagic's update of ops.h in separate passes, for every tensor that
 * the cluster kernel (optim_am_fused.cu) does not take, whatever their number. The tensor
 * table lives in device memory (a plan, optim_plan.cu, cached per device, stream and list, so
 * later steps copy nothing). (1) stats over chunks of every tensor (two launches: the thin
 * tensors, LoRA's A and B, with g held in registers; the others staged in shared memory): the
 * short side of the factored second moment complete per chunk, the long side and the update's
 * sum of squares as per-chunk partials; (2) the block that completes a tensor's last chunk
 * sums its partials in chunk order (the long side, the mean row, the clipping divisor); (3)
 * the element-wise update (polarity, lr, param) over flat chunks; (4) the int8 mask against
 * the new absmax. Reductions in f32 in a fixed order (deterministic; within float rounding of
 * the CPU's f64 sums). A block finds its chunk's tensor in a table of the plan (one load). */
#include "optim_impl.cuh"   /* defines: am_desc, am_plan_dev, am_ema, am_lr, am_row4, am_bits4, am_code */

#define AM_U     4      /* loads in flight per thread in the latency-bound loops */
#define AM_U4    1      /* groups of 4 elements in flight per thread in the update pass, with */
#define AM_UB    6      /* blocks an SM: more warps beat more loads per thread (H100, update pass:
                        * 1 group at 6 blocks, 40 registers, 0.408 ms; at 5: 0.427; at 4: 0.442;
                        * at 8, 32 registers and 264 bytes spilled: 0.525; 2 groups at 3 blocks, 78
                        * registers: 0.529; at 5: 0.448; 4 groups: 145 registers, 1.34x slower) */

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

/* ---- launches -------------------------------------------------------------------------------- */

void am_launch_stats(const am_plan_dev &d, const ghc_automagic_args &a, int32_t thin1, int32_t total1,
                     cudaStream_t s)
{
    if (thin1 > 0)
        k_am_stats_thin<<<thin1, AM_T, 0, s>>>(d, a);
    if (total1 > thin1)
        k_am_stats<<<total1 - thin1, AM_T, 0, s>>>(d, a, thin1);
}

void am_launch_update(const am_plan_dev &d, const ghc_automagic_args &a, uint64_t delta, int32_t totalf,
                      cudaStream_t s)
{
    if (totalf > 0)
        k_am_update<AM_U4, AM_UB><<<totalf, AM_T, 0, s>>>(d, a, delta, totalf);
}

void am_launch_mask(const am_plan_dev &d, const ghc_automagic_args &a, int32_t totalf, cudaStream_t s)
{
    if (totalf > 0)
        k_am_mask<<<totalf, AM_T, 0, s>>>(d, a);
}
