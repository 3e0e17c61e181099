/* attention.cu: non-causal attention forward and backward with the log-sum-exp
 * (ghc_k_attention_fwd, ghc_k_attention_bwd; contract in ops.h).
 *
 * Layout: q, o, dq [B, Lq, H, Dh]; k, v, dk, dv [B, Lk, H, Dh] (token-major, heads
 * interleaved: one token's rows of all heads are adjacent, so a head's rows are H*Dh apart);
 * lse [B, H, Lq] f32, natural log of sum_j exp(scale q.k_j). o may also be [B, Lq, H*Dh], a
 * column view included: its tokens are ldo elements apart (H*Dh when dense), and every kernel
 * that touches o (the forwards' stores, the backward's D = rowsum(dO o O)) addresses token t
 * at o + t * ldo; the tensor-core paths then also need ldo a multiple of 8 (16-byte rows).
 *
 * Paths, chosen per call:
 *  - Hopper (compute capability 9.0, sm_90a build), bf16, Dh 128, 16-byte aligned rows:
 *    warpgroup MMAs (wgmma.mma_async) with operands in 128-byte-swizzled shared memory.
 *    Forward (attn_fwd_wg): one warpgroup per 64 query rows, keys in tiles of 64 with K and V
 *    double-buffered; S = Q K^T with Q from registers, O += P V with P from registers; two
 *    blocks per SM. Backward (attn_bwd_wg): two warpgroups own 128 keys, walk the queries in
 *    tiles of 64 (Q, dO double-buffered); S^T, dP^T from shared memory, dV += P^T dO and
 *    dK += dS^T Q with A from registers, dQ = dS K through shared memory with fp32 atomics.
 *  - other GPUs (and other head sizes), bf16 with Dh in {16, 32, 64, 128} (backward: {32, 64,
 *    128}) and 16-byte aligned rows: FlashAttention-2 style tiled kernels on mma.sync
 *    m16n8k16 (bf16, fp32 accumulation; ldmatrix from padded shared memory, cp.async loads).
 *    Forward (attn_fwd_tc): a block of 4 warps takes 128 query rows (32 per warp) and walks
 *    the keys in tiles of 64, K and V loads overlapped with the math (FA2's schedule).
 *    Backward at Dh 64 and 128 (attn_bwd2_tc): a block owns 128 keys (64 where shared memory
 *    is small, sm_121's 99 KB) in warps of two roles, 32 keys each: S-warps compute S^T, P^T
 *    and dV, dP-warps dP^T, dS^T (taking P^T through shared memory) and dK; dS^T goes through
 *    shared memory once for dQ, which all warps compute. Backward at Dh 32, or where that
 *    does not fit: attn_bwd_tc, 16 keys per warp.
 *    All backward kernels keep dK and dV in registers, compute S^T = K Q^T (keys as rows) so
 *    that P^T and dS^T feed the dV and dK products from registers, and add dQ in fp32 with
 *    16-byte atomics into a scratch accumulator, converted to dq's dtype at the end; D =
 *    rowsum(dO o O) comes first (attn_bwd_prep_bf16, which also zeroes the accumulator).
 *    Softmax statistics in fp32, P and dS rounded to bf16 for the products as in
 *    FlashAttention; exponentials are ex2.approx on scores pre-scaled by scale log2(e).
 *    Figures against FlashAttention-2 and cuDNN: bench/README.md.
 *  - everything else (f32, other head sizes, unaligned data): a simple fp32 path, one warp per
 *    row, online softmax; the backward computes dq per query row and dk, dv per key row, so
 *    it needs no atomics.
 *
 * Scratch (the fp32 dQ accumulator and D) is kept per (device, stream), allocated at first use
 * and grown when a larger problem comes; never per call. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>

#include "kernels.h"
#include "mma.cuh"   /* defines: smem_addr, ldsm_x4, ldsm_x4_t, mma16816 */

namespace {

typedef __nv_bfloat16 bf16;

constexpr float kLog2e = 1.4426950408889634f;

/* ---- small helpers ------------------------------------------------------------------------ */

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(bf16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 from_f<bf16>(float x) { return __float2bfloat16_rn(x); }

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}


__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

/* 2^x in one MUFU instruction (flush-to-zero; 2^-inf = 0). */
__device__ __forceinline__ float fast_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* Lane offsets (bytes) of ldmatrix.x4 into a tile with rows of `stride` elements:
 *  A operand (16 x 16 at the origin): rows lane % 16, column block lane / 16;
 *  B operand from an [n][k] tile (two n8 tiles x k16, non-transposed);
 *  B operand from a [k][n] tile (k16 x two n8 tiles, transposed). */
__device__ __forceinline__ uint32_t lane_a(int lane, int stride) { return ((lane & 15) * stride + (lane >> 4) * 8) * 2; }
__device__ __forceinline__ uint32_t lane_bn(int lane, int stride)
{
    return (((lane & 7) + ((lane >> 4) << 3)) * stride + ((lane >> 3) & 1) * 8) * 2;
}
__device__ __forceinline__ uint32_t lane_bt(int lane, int stride)
{
    return (((lane & 7) + ((lane >> 3) & 1) * 8) * stride + (lane >> 4) * 8) * 2;
}
/* dS as the A operand from dS^T stored [n][m] (transposed ldmatrix) */
__device__ __forceinline__ uint32_t lane_at(int lane, int stride)
{
    return (((lane & 7) + ((lane >> 4) << 3)) * stride + ((lane >> 3) & 1) * 8) * 2;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

/* ROWS x D bf16 tile from global rows `stride` elements apart into shared rows of D + 8
 * (at shared address `dst`); rows >= valid are zero-filled. Each thread copies one 16-byte
 * column chunk of every (NT / (D / 8))-th row, so its addresses advance by constant steps. */
template <int ROWS, int D, int NT>
__device__ __forceinline__ void load_tile(uint32_t dst, const bf16 *g, int64_t stride, int valid, int tid)
{
    constexpr int C = D / 8;        /* 16-byte chunks per row */
    static_assert(NT % C == 0 && ROWS % (NT / C) == 0, "tile shape");
    constexpr int RS = NT / C;      /* rows per pass */
    const int r0 = tid / C, c = tid % C;
    const bf16 *src = g + r0 * stride + c * 8;
    dst += (r0 * (D + 8) + c * 8) * 2;
    const int64_t step = RS * stride;
#pragma unroll
    for (int k = 0; k < ROWS / RS; k++) {
        const bool ok = r0 + k * RS < valid;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst + k * RS * (D + 8) * 2),
                     "l"(ok ? src : g), "r"(ok ? 16 : 0));
        src += step;
    }
}

/* ---- tensor-core forward ------------------------------------------------------------------ */

struct fwd_params {
    const bf16 *q, *k, *v;
    bf16 *o;
    int64_t ldo;   /* elements between o's tokens */
    float *lse;
    int B, H, Lq, Lk;
    float scale, scale_log2;
};

constexpr int kFwdBM = 128, kFwdBN = 64, kFwdWarps = 4, kFwdThreads = kFwdWarps * 32;

template <int D>
constexpr int fwd_smem_bytes() { return (kFwdBM + 2 * kFwdBN) * (D + 8) * 2; }

template <int D>
__global__ void __launch_bounds__(kFwdThreads, 2) attn_fwd_tc(const fwd_params p)
{
    constexpr int S = D + 8;        /* smem row stride (elements): ldmatrix without conflicts */
    constexpr int NT = kFwdBN / 8;  /* key n-tiles of S */
    constexpr int DT = D / 8;       /* d n-tiles of O */
    extern __shared__ __align__(16) unsigned char smem_raw[];

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const int m0 = blockIdx.x * kFwdBM, h = blockIdx.y, b = blockIdx.z;
    const int64_t row_stride = (int64_t)p.H * D;
    const bf16 *qg = p.q + ((int64_t)b * p.Lq + m0) * row_stride + (int64_t)h * D;
    const bf16 *kg = p.k + (int64_t)b * p.Lk * row_stride + (int64_t)h * D;
    const bf16 *vg = p.v + (int64_t)b * p.Lk * row_stride + (int64_t)h * D;
    const uint32_t base = smem_addr(smem_raw);   /* sQ at 0, sK, sV at constant offsets */
    constexpr uint32_t oK = kFwdBM * S * 2, oV = (kFwdBM + kFwdBN) * S * 2;
    const uint32_t aQ = base + lane_a(lane, S) + warp * 32 * S * 2;
    const uint32_t aK = base + lane_bn(lane, S);
    const uint32_t aV = base + lane_bt(lane, S);
    const float sl = p.scale_log2;   /* > 0 on this path */

    load_tile<kFwdBM, D, kFwdThreads>(base, qg, row_stride, p.Lq - m0, tid);
    load_tile<kFwdBN, D, kFwdThreads>(base + oK, kg, row_stride, p.Lk, tid);
    cp_async_commit();

    float acc[2][DT][4];
    float row_m[2][2], row_l[2][2];   /* running max of the raw scores, partial sums of 2^(sl (s - m)) */
#pragma unroll
    for (int mt = 0; mt < 2; mt++) {
#pragma unroll
        for (int dt = 0; dt < DT; dt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[mt][dt][e] = 0.0f;
        row_m[mt][0] = row_m[mt][1] = -INFINITY;
        row_l[mt][0] = row_l[mt][1] = 0.0f;
    }

    const int nblocks = (p.Lk + kFwdBN - 1) / kFwdBN;
    for (int j = 0; j < nblocks; j++) {
        const int n0 = j * kFwdBN;
        cp_async_wait_all();
        __syncthreads();                   /* K_j here; every warp is done with V_{j-1} */
        load_tile<kFwdBN, D, kFwdThreads>(base + oV, vg + (int64_t)n0 * row_stride, row_stride, p.Lk - n0, tid);
        cp_async_commit();

        float s[2][NT][4];
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    s[mt][nt][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            uint32_t qa[2][4];
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
                ldsm_x4(qa[mt], aQ + (mt * 16 * S + kk * 16) * 2);
#pragma unroll
            for (int np = 0; np < NT / 2; np++) {
                uint32_t kb[4];
                ldsm_x4(kb, aK + oK + (np * 16 * S + kk * 16) * 2);
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    mma16816(s[mt][2 * np], qa[mt], kb[0], kb[1]);
                    mma16816(s[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
                }
            }
        }
        if (n0 + kFwdBN > p.Lk) {          /* the tail: keys past Lk do not count */
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (n0 + nt * 8 + 2 * t + (e & 1) >= p.Lk) {
                        s[0][nt][e] = -INFINITY;
                        s[1][nt][e] = -INFINITY;
                    }
        }

        cp_async_wait_all();
        __syncthreads();                   /* V_j here; every warp is done with K_j */
        if (j + 1 < nblocks) {
            load_tile<kFwdBN, D, kFwdThreads>(base + oK, kg + (int64_t)(n0 + kFwdBN) * row_stride, row_stride,
                                              p.Lk - n0 - kFwdBN, tid);
            cp_async_commit();
        }

        /* online softmax, rows g (r = 0) and g + 8 (r = 1) of each m-tile */
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                float mx = -INFINITY;
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
                    mx = fmaxf(mx, fmaxf(s[mt][nt][2 * r], s[mt][nt][2 * r + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float m_new = fmaxf(row_m[mt][r], mx);
                const float corr = fast_exp2((row_m[mt][r] - m_new) * sl);
                row_m[mt][r] = m_new;
                const float ms = m_new * sl;
                float sum = 0.0f;
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    float p0 = fast_exp2(fmaf(s[mt][nt][2 * r], sl, -ms));
                    float p1 = fast_exp2(fmaf(s[mt][nt][2 * r + 1], sl, -ms));
                    s[mt][nt][2 * r] = p0;
                    s[mt][nt][2 * r + 1] = p1;
                    sum += p0 + p1;
                }
                row_l[mt][r] = row_l[mt][r] * corr + sum;
#pragma unroll
                for (int dt = 0; dt < DT; dt++) {
                    acc[mt][dt][2 * r] *= corr;
                    acc[mt][dt][2 * r + 1] *= corr;
                }
            }

        /* O += P V */
#pragma unroll
        for (int kk = 0; kk < kFwdBN / 16; kk++) {
            uint32_t pa[2][4];
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                pa[mt][0] = pack_bf16(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                pa[mt][1] = pack_bf16(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                pa[mt][2] = pack_bf16(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                pa[mt][3] = pack_bf16(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
            }
#pragma unroll
            for (int dp = 0; dp < D / 16; dp++) {
                uint32_t vb[4];
                ldsm_x4_t(vb, aV + oV + (kk * 16 * S + dp * 16) * 2);
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    mma16816(acc[mt][2 * dp], pa[mt], vb[0], vb[1]);
                    mma16816(acc[mt][2 * dp + 1], pa[mt], vb[2], vb[3]);
                }
            }
        }
    }

    /* O /= l; lse = scale m + ln l */
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float l = row_l[mt][r];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            const float inv = 1.0f / l;
            const int row = m0 + warp * 32 + mt * 16 + g + 8 * r;
            if (row < p.Lq) {
                bf16 *og = p.o + ((int64_t)b * p.Lq + row) * p.ldo + (int64_t)h * D;
#pragma unroll
                for (int dt = 0; dt < DT; dt++)
                    *reinterpret_cast<uint32_t *>(og + dt * 8 + 2 * t) =
                        pack_bf16(acc[mt][dt][2 * r] * inv, acc[mt][dt][2 * r + 1] * inv);
                if (t == 0)
                    p.lse[((int64_t)b * p.H + h) * p.Lq + row] = row_m[mt][r] * p.scale + logf(l);
            }
        }
}

/* ---- tensor-core backward ----------------------------------------------------------------- */

struct bwd_params {
    const bf16 *q, *k, *v, *dout;
    const float *lse, *dsum;
    float *dq_acc;
    bf16 *dk, *dv;
    int B, H, Lq, Lk;
    float scale, scale_log2;
};

constexpr int kBwdBN = 128, kBwdWarps = 8, kBwdThreads = kBwdWarps * 32;

template <int D, int BM>
constexpr int bwd_smem_bytes()
{
    return (2 * kBwdBN + 4 * BM) * (D + 8) * 2 + kBwdBN * (BM + 8) * 2 + 4 * BM * 4;
}

/* One block: 128 keys of one (batch, head), 16 per warp; walks the queries in tiles of BM. */
template <int D, int BM>
__global__ void __launch_bounds__(kBwdThreads, 1) attn_bwd_tc(const bwd_params p)
{
    constexpr int S = D + 8;
    constexpr int SS = BM + 8;           /* dS^T row stride */
    constexpr int MT = BM / 8;           /* query n-tiles of S^T */
    constexpr int DT = D / 8;            /* d n-tiles of dK, dV */
    constexpr int WM = BM / 16;          /* dQ product: warps along m ... */
    constexpr int WD = kBwdWarps / WM;   /* ... and along d */
    constexpr int DQ_WD = D / WD;        /* d columns of a warp's dQ tile */
    constexpr int DQT = DQ_WD / 8;
    static_assert(DQT >= 2 && DQT % 2 == 0, "dQ tile too narrow");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    /* shared memory: K [128][S], V [128][S], Q [2][BM][S], dO [2][BM][S], dS^T [128][SS], lse, D */
    bf16 *sdS = reinterpret_cast<bf16 *>(smem_raw) + (2 * kBwdBN + 4 * BM) * S;   /* keys as rows */
    float *sLse = reinterpret_cast<float *>(sdS + kBwdBN * SS);   /* [2][BM], times log2 e */
    float *sDs = sLse + 2 * BM;                                    /* [2][BM] */

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * kBwdBN, h = blockIdx.y, b = blockIdx.z;
    const int64_t row_stride = (int64_t)p.H * D;
    const int64_t kv_off = ((int64_t)b * p.Lk + n0) * row_stride + (int64_t)h * D;
    const int64_t q_off = (int64_t)b * p.Lq * row_stride + (int64_t)h * D;
    const int64_t bh = (int64_t)b * p.H + h;
    const int mg = warp % WM, dg = warp / WM;   /* dQ tile of this warp: rows mg*16.., cols dg*DQ_WD.. */

    /* ldmatrix addresses (bytes, shared window) */
    /* one base register per ldmatrix lane pattern; the tiles sit at constant offsets from it */
    constexpr uint32_t oV = kBwdBN * S * 2, oQ = 2 * kBwdBN * S * 2, oO = oQ + 2 * BM * S * 2;
    constexpr uint32_t oS = oO + 2 * BM * S * 2;
    const uint32_t base = smem_addr(smem_raw);
    const uint32_t aA = base + lane_a(lane, S) + warp * 16 * S * 2;      /* K_w, V_w as A */
    const uint32_t aN = base + lane_bn(lane, S);                          /* Q, dO as B of S^T, dP^T */
    const uint32_t aT = base + lane_bt(lane, S);                          /* Q, dO as B of dK, dV */
    const uint32_t aSa = base + oS + lane_at(lane, SS) + mg * 16 * 2;    /* dS as A of dQ */
    const uint32_t aKt = aT + dg * DQ_WD * 2;                             /* K as B of dQ */
    const float sl = p.scale_log2;

    load_tile<kBwdBN, D, kBwdThreads>(base, p.k + kv_off, row_stride, p.Lk - n0, tid);
    load_tile<kBwdBN, D, kBwdThreads>(base + oV, p.v + kv_off, row_stride, p.Lk - n0, tid);
    load_tile<BM, D, kBwdThreads>(base + oQ, p.q + q_off, row_stride, p.Lq, tid);
    load_tile<BM, D, kBwdThreads>(base + oO, p.dout + q_off, row_stride, p.Lq, tid);
    cp_async_commit();
    if (tid < BM) {
        bool ok = tid < p.Lq;
        sLse[tid] = ok ? p.lse[bh * p.Lq + tid] * kLog2e : INFINITY;
        sDs[tid] = ok ? p.dsum[bh * p.Lq + tid] : 0.0f;
    }

    float dk[DT][4], dv[DT][4];
#pragma unroll
    for (int dt = 0; dt < DT; dt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            dk[dt][e] = dv[dt][e] = 0.0f;

    const bool key_tail = n0 + kBwdBN > p.Lk;
    const int key_row0 = n0 + warp * 16 + g;   /* this thread's key rows: key_row0 and key_row0 + 8 */
    const int nm = (p.Lq + BM - 1) / BM;
    for (int i = 0; i < nm; i++) {
        const int buf = i & 1, m0 = i * BM;
        const uint32_t boff = buf * BM * S * 2;
        const float *cLse = sLse + buf * BM, *cDs = sDs + buf * BM;
        cp_async_wait_all();
        __syncthreads();                   /* Q_i, dO_i here; every warp is done with step i - 1 */
        if (i + 1 < nm) {
            const int m1 = m0 + BM;
            load_tile<BM, D, kBwdThreads>(base + oQ + (buf ^ 1) * BM * S * 2, p.q + q_off + (int64_t)m1 * row_stride, row_stride,
                                          p.Lq - m1, tid);
            load_tile<BM, D, kBwdThreads>(base + oO + (buf ^ 1) * BM * S * 2, p.dout + q_off + (int64_t)m1 * row_stride,
                                          row_stride, p.Lq - m1, tid);
            cp_async_commit();
            if (tid < BM) {
                bool ok = m1 + tid < p.Lq;
                sLse[(buf ^ 1) * BM + tid] = ok ? p.lse[bh * p.Lq + m1 + tid] * kLog2e : INFINITY;
                sDs[(buf ^ 1) * BM + tid] = ok ? p.dsum[bh * p.Lq + m1 + tid] : 0.0f;
            }
        }

        /* S^T = K_w Q^T and dP^T = V_w dO^T: 16 keys x BM queries per warp */
        float st[MT][4], dpt[MT][4];
#pragma unroll
        for (int nt = 0; nt < MT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                st[nt][e] = dpt[nt][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            uint32_t ka[4], va[4];
            ldsm_x4(ka, aA + kk * 32);
            ldsm_x4(va, aA + oV + kk * 32);
#pragma unroll
            for (int np = 0; np < MT / 2; np++) {
                uint32_t qb[4], ob[4];
                const uint32_t off = boff + (np * 16 * S + kk * 16) * 2;
                ldsm_x4(qb, aN + oQ + off);
                ldsm_x4(ob, aN + oO + off);
                mma16816(st[2 * np], ka, qb[0], qb[1]);
                mma16816(st[2 * np + 1], ka, qb[2], qb[3]);
                mma16816(dpt[2 * np], va, ob[0], ob[1]);
                mma16816(dpt[2 * np + 1], va, ob[2], ob[3]);
            }
        }
        /* P^T = exp(scale S^T - lse), dS^T = P^T (dP^T - D) */
#pragma unroll
        for (int nt = 0; nt < MT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int mc = nt * 8 + 2 * t + (e & 1);
                float pv = fast_exp2(fmaf(st[nt][e], sl, -cLse[mc]));
                if (key_tail && key_row0 + (e >> 1) * 8 >= p.Lk)
                    pv = 0.0f;
                st[nt][e] = pv;
                dpt[nt][e] = pv * (dpt[nt][e] - cDs[mc]);
            }
        /* dV += P^T dO, dK += dS^T Q */
#pragma unroll
        for (int kk = 0; kk < BM / 16; kk++) {
            uint32_t pa[4], da[4];
            pa[0] = pack_bf16(st[2 * kk][0], st[2 * kk][1]);
            pa[1] = pack_bf16(st[2 * kk][2], st[2 * kk][3]);
            pa[2] = pack_bf16(st[2 * kk + 1][0], st[2 * kk + 1][1]);
            pa[3] = pack_bf16(st[2 * kk + 1][2], st[2 * kk + 1][3]);
            da[0] = pack_bf16(dpt[2 * kk][0], dpt[2 * kk][1]);
            da[1] = pack_bf16(dpt[2 * kk][2], dpt[2 * kk][3]);
            da[2] = pack_bf16(dpt[2 * kk + 1][0], dpt[2 * kk + 1][1]);
            da[3] = pack_bf16(dpt[2 * kk + 1][2], dpt[2 * kk + 1][3]);
#pragma unroll
            for (int dp = 0; dp < D / 16; dp++) {
                uint32_t ob[4], qb[4];
                const uint32_t off = boff + (kk * 16 * S + dp * 16) * 2;
                ldsm_x4_t(ob, aT + oO + off);
                ldsm_x4_t(qb, aT + oQ + off);
                mma16816(dv[2 * dp], pa, ob[0], ob[1]);
                mma16816(dv[2 * dp + 1], pa, ob[2], ob[3]);
                mma16816(dk[2 * dp], da, qb[0], qb[1]);
                mma16816(dk[2 * dp + 1], da, qb[2], qb[3]);
            }
        }
        if (!p.dq_acc)
            continue;                      /* no dq wanted (uniform across the block) */
        /* dS^T to shared memory for dQ */
#pragma unroll
        for (int nt = 0; nt < MT; nt++) {
            *reinterpret_cast<uint32_t *>(sdS + (warp * 16 + g) * SS + nt * 8 + 2 * t) = pack_bf16(dpt[nt][0], dpt[nt][1]);
            *reinterpret_cast<uint32_t *>(sdS + (warp * 16 + g + 8) * SS + nt * 8 + 2 * t) =
                pack_bf16(dpt[nt][2], dpt[nt][3]);
        }
        __syncthreads();                   /* dS of all 128 keys here */

        /* dQ_i += dS K over this block's keys: warp tile 16 queries x DQ_WD d */
        float dq[DQT][4];
#pragma unroll
        for (int nt = 0; nt < DQT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                dq[nt][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < kBwdBN / 16; kk++) {
            uint32_t sa[4];
            ldsm_x4_t(sa, aSa + kk * 16 * SS * 2);
#pragma unroll
            for (int dp = 0; dp < DQT / 2; dp++) {
                uint32_t kb[4];
                ldsm_x4_t(kb, aKt + (kk * 16 * S + dp * 16) * 2);
                mma16816(dq[2 * dp], sa, kb[0], kb[1]);
                mma16816(dq[2 * dp + 1], sa, kb[2], kb[3]);
            }
        }
        /* fp32 atomics, 4 columns at a time: lanes t and t^1 swap halves so that an even lane
         * holds 4 adjacent columns of row g and an odd lane 4 of row g + 8 */
        const bool odd = t & 1;
        const int row = m0 + mg * 16 + g + (odd ? 8 : 0);
        float *dqg = p.dq_acc + ((int64_t)b * p.Lq + row) * row_stride + (int64_t)h * D + dg * DQ_WD + 2 * (t & 2);
#pragma unroll
        for (int nt = 0; nt < DQT; nt++) {
            const float s0 = odd ? dq[nt][0] : dq[nt][2], s1 = odd ? dq[nt][1] : dq[nt][3];
            const float r0 = __shfl_xor_sync(0xffffffffu, s0, 1), r1 = __shfl_xor_sync(0xffffffffu, s1, 1);
            const float4 v = odd ? make_float4(r0, r1, dq[nt][2], dq[nt][3]) : make_float4(dq[nt][0], dq[nt][1], r0, r1);
            if (row < p.Lq) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
                atomicAdd(reinterpret_cast<float4 *>(dqg + nt * 8), v);
#else
                atomicAdd(dqg + nt * 8, v.x);
                atomicAdd(dqg + nt * 8 + 1, v.y);
                atomicAdd(dqg + nt * 8 + 2, v.z);
                atomicAdd(dqg + nt * 8 + 3, v.w);
#endif
            }
        }
    }

    /* dK = scale dS^T Q, dV = P^T dO */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = key_row0 + 8 * r;
        if (row < p.Lk) {
            const int64_t off = ((int64_t)b * p.Lk + row) * row_stride + (int64_t)h * D + 2 * t;
#pragma unroll
            for (int dt = 0; dt < DT; dt++) {
                if (p.dk)
                    *reinterpret_cast<uint32_t *>(p.dk + off + dt * 8) =
                        pack_bf16(dk[dt][2 * r] * p.scale, dk[dt][2 * r + 1] * p.scale);
                if (p.dv)
                    *reinterpret_cast<uint32_t *>(p.dv + off + dt * 8) = pack_bf16(dv[dt][2 * r], dv[dt][2 * r + 1]);
            }
        }
    }
}

/* ---- tensor-core backward, FA2-style layout (Dh 64 and 128) -------------------------------- */

/* Named barriers: bar.arrive signals without waiting; bar.sync waits for `n` threads in all
 * (arrivals included). Both order the shared-memory accesses before them. */
__device__ __forceinline__ void named_bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void named_bar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }

__device__ __forceinline__ float2 unpack_bf16(uint32_t v)
{
    return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
}

/* Block of BN keys (128: 8 warps; 64: 4 warps) walking the queries in tiles of 64. DB: Q and dO
 * double-buffered (the next tile loads during this one); without it one buffer, loaded between
 * tiles (the small-shared-memory variant). SPLIT: P^T handed over in two halves of 32 queries,
 * so that the dP-warps start on the first half while the S-warps exponentiate the second. */
template <int D, int BN, bool DB>
struct bwd2_cfg {
    static constexpr int BM = 64, NW = BN / 16, NT = NW * 32, NB = DB ? 2 : 1;
    static constexpr int S = D + 8, SS = BM + 8;   /* row strides (elements) of the D-wide and P^T/dS^T tiles */
    static constexpr int oV = BN * S * 2, oQ = 2 * BN * S * 2, oO = oQ + NB * BM * S * 2;
    static constexpr int oP = oO + NB * BM * S * 2, oS = oP + BN * SS * 2, oL = oS + BN * SS * 2;
    static constexpr int smem = oL + 2 * NB * BM * 4;   /* + lse [NB][BM] and D [NB][BM] in fp32 */
};

template <int D, int BN, bool DB, bool SPLIT>
__global__ void __launch_bounds__(BN / 16 * 32, BN == 128 ? 1 : 2) attn_bwd2_tc(const bwd_params p)
{
    using C = bwd2_cfg<D, BN, DB>;
    constexpr int BM = C::BM, NW = C::NW, NT = C::NT, S = C::S, SS = C::SS;
    constexpr int MT = BM / 8;      /* query n-tiles of S^T (8) */
    constexpr int DT = D / 8;       /* d n-tiles of dK, dV */
    constexpr int HW = NW / 2;      /* warps per role; each takes 32 keys */
    constexpr int DQ_W = D / HW;    /* dQ = dS K: warps as 2 (32 queries) x HW (DQ_W columns) */
    constexpr int DQT = DQ_W / 8;
    static_assert(HW * 32 == BN && DQT >= 2 && DQT % 2 == 0, "bwd2 tile shape");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *sP = reinterpret_cast<bf16 *>(smem_raw + C::oP);    /* P^T [BN][SS] */
    bf16 *sdS = reinterpret_cast<bf16 *>(smem_raw + C::oS);   /* dS^T [BN][SS] */
    float *sLse = reinterpret_cast<float *>(smem_raw + C::oL); /* [NB][BM], times log2 e */
    float *sDs = sLse + C::NB * BM;                            /* [NB][BM] */

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const bool sw = warp < HW;      /* S-warp: S^T, P^T, dV; else dP-warp: dP^T, dS^T, dK */
    const int wr = sw ? warp : warp - HW;   /* both roles: keys wr*32 .. wr*32 + 31 of the block */
    const int n0 = blockIdx.x * BN, h = blockIdx.y, b = blockIdx.z;
    const int64_t row_stride = (int64_t)p.H * D;
    const int64_t kv_off = ((int64_t)b * p.Lk + n0) * row_stride + (int64_t)h * D;
    const int64_t q_off = (int64_t)b * p.Lq * row_stride + (int64_t)h * D;
    const int64_t bh = (int64_t)b * p.H + h;

    const uint32_t base = smem_addr(smem_raw);
    /* phase 1 (S^T = K Q^T or dP^T = V dO^T): A = this warp's 32 rows of K or V, B = Q or dO */
    const uint32_t aA = base + (sw ? 0u : (uint32_t)C::oV) + lane_a(lane, S) + wr * 32 * S * 2;
    const uint32_t aB1 = base + (sw ? (uint32_t)C::oQ : (uint32_t)C::oO) + lane_bn(lane, S);
    /* phase 2 (dV += P^T dO or dK += dS^T Q): A from registers, B = dO or Q transposed */
    const uint32_t aB2 = base + (sw ? (uint32_t)C::oO : (uint32_t)C::oQ) + lane_bt(lane, S);
    /* phase 3 (dQ = dS K): A = dS from dS^T (transposed), B = K transposed */
    const int qg = warp & 1, dg = warp >> 1;
    const uint32_t aSa = base + C::oS + lane_at(lane, SS) + qg * 32 * 2;
    const uint32_t aKt = base + lane_bt(lane, S) + dg * DQ_W * 2;
    /* this thread's slots of P^T and dS^T: rows wr*32 + mt*16 + g (+8), columns nt*8 + 2t */
    bf16 *myP = sP + (wr * 32 + g) * SS + 2 * t;
    bf16 *mydS = sdS + (wr * 32 + g) * SS + 2 * t;
    const float sl = p.scale_log2;

    load_tile<BN, D, NT>(base, p.k + kv_off, row_stride, p.Lk - n0, tid);
    load_tile<BN, D, NT>(base + C::oV, p.v + kv_off, row_stride, p.Lk - n0, tid);
    if (DB) {
        load_tile<BM, D, NT>(base + C::oQ, p.q + q_off, row_stride, p.Lq, tid);
        load_tile<BM, D, NT>(base + C::oO, p.dout + q_off, row_stride, p.Lq, tid);
        if (tid < BM) {
            const bool ok = tid < p.Lq;
            sLse[tid] = ok ? p.lse[bh * p.Lq + tid] * kLog2e : INFINITY;
            sDs[tid] = ok ? p.dsum[bh * p.Lq + tid] : 0.0f;
        }
    }
    cp_async_commit();

    float acc[2][DT][4];            /* S-warps: dV; dP-warps: dK (unscaled); rows wr*32 + mt*16 + g (+8) */
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int dt = 0; dt < DT; dt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[mt][dt][e] = 0.0f;

    const bool want_acc = sw ? p.dv != NULL : p.dk != NULL;   /* uniform per warp */
    const bool want_dq = p.dq_acc != NULL;                     /* uniform per block */
    const bool key_tail = n0 + BN > p.Lk;
    const int key0 = n0 + wr * 32 + g;
    const int nm = (p.Lq + BM - 1) / BM;
    for (int i = 0; i < nm; i++) {
        const int m0 = i * BM;
        const int buf = DB ? (i & 1) : 0;
        const uint32_t boff = buf * BM * S * 2;
        if (!DB) {
            if (i > 0)
                __syncthreads();           /* every warp is done with tile i - 1 */
            load_tile<BM, D, NT>(base + C::oQ, p.q + q_off + (int64_t)m0 * row_stride, row_stride, p.Lq - m0, tid);
            load_tile<BM, D, NT>(base + C::oO, p.dout + q_off + (int64_t)m0 * row_stride, row_stride, p.Lq - m0, tid);
            cp_async_commit();
            if (tid < BM) {
                const bool ok = m0 + tid < p.Lq;
                sLse[tid] = ok ? p.lse[bh * p.Lq + m0 + tid] * kLog2e : INFINITY;
                sDs[tid] = ok ? p.dsum[bh * p.Lq + m0 + tid] : 0.0f;
            }
        }
        cp_async_wait_all();
        __syncthreads();                   /* Q_i, dO_i, lse_i, D_i here; every warp is done with tile i - 1 */
        /* next tile's lse and D: loaded now, stored at the end of this tile */
        const bool pre = DB && i + 1 < nm && tid < BM;
        float nlse = INFINITY, nds = 0.0f;
        if (DB && i + 1 < nm) {
            const int m1 = m0 + BM;
            load_tile<BM, D, NT>(base + C::oQ + (buf ^ 1) * BM * S * 2, p.q + q_off + (int64_t)m1 * row_stride,
                                 row_stride, p.Lq - m1, tid);
            load_tile<BM, D, NT>(base + C::oO + (buf ^ 1) * BM * S * 2, p.dout + q_off + (int64_t)m1 * row_stride,
                                 row_stride, p.Lq - m1, tid);
            cp_async_commit();
            if (pre && m1 + tid < p.Lq) {
                nlse = p.lse[bh * p.Lq + m1 + tid] * kLog2e;
                nds = p.dsum[bh * p.Lq + m1 + tid];
            }
        }

        /* phase 1: S^T (S-warps) or dP^T (dP-warps), 32 keys x 64 queries per warp */
        float st[2][MT][4];
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int nt = 0; nt < MT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    st[mt][nt][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            uint32_t a[2][4];
            ldsm_x4(a[0], aA + kk * 32);
            ldsm_x4(a[1], aA + 16 * S * 2 + kk * 32);
#pragma unroll
            for (int np = 0; np < MT / 2; np++) {
                uint32_t bq[4];
                ldsm_x4(bq, aB1 + boff + (np * 16 * S + kk * 16) * 2);
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    mma16816(st[mt][2 * np], a[mt], bq[0], bq[1]);
                    mma16816(st[mt][2 * np + 1], a[mt], bq[2], bq[3]);
                }
            }
        }

        /* P^T (S-warps) or dS^T (dP-warps) as bf16 pairs: pk[mt][nt][r] holds row g + 8r,
         * columns nt*8 + 2t, +1 -- the A fragments of phase 2 */
        uint32_t pk[2][MT][2];
        const float *cL = sLse + buf * BM + 2 * t, *cD = sDs + buf * BM + 2 * t;
        constexpr int NH = SPLIT ? 2 : 1;  /* hand-over parts */
        constexpr int NTH = MT / NH;       /* query n-tiles per part */
#pragma unroll
        for (int hp = 0; hp < NH; hp++) {
            if (sw) {
#pragma unroll
                for (int nt = hp * NTH; nt < (hp + 1) * NTH; nt++) {
                    const float2 l2 = *reinterpret_cast<const float2 *>(cL + nt * 8);
#pragma unroll
                    for (int mt = 0; mt < 2; mt++) {
                        float pv[4];
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            pv[e] = fast_exp2(fmaf(st[mt][nt][e], sl, -((e & 1) ? l2.y : l2.x)));
                            if (key_tail && key0 + mt * 16 + (e >> 1) * 8 >= p.Lk)
                                pv[e] = 0.0f;
                        }
                        pk[mt][nt][0] = pack_bf16(pv[0], pv[1]);
                        pk[mt][nt][1] = pack_bf16(pv[2], pv[3]);
                        *reinterpret_cast<uint32_t *>(myP + (mt * 16) * SS + nt * 8) = pk[mt][nt][0];
                        *reinterpret_cast<uint32_t *>(myP + (mt * 16 + 8) * SS + nt * 8) = pk[mt][nt][1];
                    }
                }
                named_bar_arrive(1 + hp, NT);
            } else {
                named_bar_sync(1 + hp, NT);
#pragma unroll
                for (int nt = hp * NTH; nt < (hp + 1) * NTH; nt++) {
                    const float2 d2 = *reinterpret_cast<const float2 *>(cD + nt * 8);
#pragma unroll
                    for (int mt = 0; mt < 2; mt++) {
#pragma unroll
                        for (int r = 0; r < 2; r++) {
                            const float2 pv =
                                unpack_bf16(*reinterpret_cast<const uint32_t *>(myP + (mt * 16 + 8 * r) * SS + nt * 8));
                            pk[mt][nt][r] = pack_bf16(pv.x * (st[mt][nt][2 * r] - d2.x), pv.y * (st[mt][nt][2 * r + 1] - d2.y));
                            if (want_dq)
                                *reinterpret_cast<uint32_t *>(mydS + (mt * 16 + 8 * r) * SS + nt * 8) = pk[mt][nt][r];
                        }
                    }
                }
                /* dP-warps with a split hand-over: this part's dK products now */
                if (SPLIT && want_acc) {
#pragma unroll
                    for (int kk = hp * (NTH / 2); kk < (hp + 1) * (NTH / 2); kk++) {
#pragma unroll
                        for (int dp = 0; dp < D / 16; dp++) {
                            uint32_t bb[4];
                            ldsm_x4_t(bb, aB2 + boff + (kk * 16 * S + dp * 16) * 2);
#pragma unroll
                            for (int mt = 0; mt < 2; mt++) {
                                const uint32_t af[4] = { pk[mt][2 * kk][0], pk[mt][2 * kk][1], pk[mt][2 * kk + 1][0],
                                                         pk[mt][2 * kk + 1][1] };
                                mma16816(acc[mt][2 * dp], af, bb[0], bb[1]);
                                mma16816(acc[mt][2 * dp + 1], af, bb[2], bb[3]);
                            }
                        }
                    }
                }
            }
        }

        /* phase 2: dV += P^T dO (S-warps), dK += dS^T Q (dP-warps; done above when split) */
        if (want_acc && (sw || !SPLIT)) {
#pragma unroll
            for (int kk = 0; kk < BM / 16; kk++) {
#pragma unroll
                for (int dp = 0; dp < D / 16; dp++) {
                    uint32_t bb[4];
                    ldsm_x4_t(bb, aB2 + boff + (kk * 16 * S + dp * 16) * 2);
#pragma unroll
                    for (int mt = 0; mt < 2; mt++) {
                        const uint32_t af[4] = { pk[mt][2 * kk][0], pk[mt][2 * kk][1], pk[mt][2 * kk + 1][0],
                                                 pk[mt][2 * kk + 1][1] };
                        mma16816(acc[mt][2 * dp], af, bb[0], bb[1]);
                        mma16816(acc[mt][2 * dp + 1], af, bb[2], bb[3]);
                    }
                }
            }
        }

        if (want_dq) {
            __syncthreads();               /* dS^T of all BN keys here */
            /* phase 3: dQ_i += dS K over this block's keys, 32 queries x DQ_W columns per warp */
            float dq[2][DQT][4];
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int nt = 0; nt < DQT; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        dq[mt][nt][e] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) {
                uint32_t sa[2][4];
                ldsm_x4_t(sa[0], aSa + kk * 16 * SS * 2);
                ldsm_x4_t(sa[1], aSa + kk * 16 * SS * 2 + 32);
#pragma unroll
                for (int dp = 0; dp < DQT / 2; dp++) {
                    uint32_t kb[4];
                    ldsm_x4_t(kb, aKt + (kk * 16 * S + dp * 16) * 2);
#pragma unroll
                    for (int mt = 0; mt < 2; mt++) {
                        mma16816(dq[mt][2 * dp], sa[mt], kb[0], kb[1]);
                        mma16816(dq[mt][2 * dp + 1], sa[mt], kb[2], kb[3]);
                    }
                }
            }
            /* fp32 atomics, 4 columns at a time (lanes t and t^1 swap halves, as in attn_bwd_tc) */
            const bool odd = t & 1;
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                const int row = m0 + qg * 32 + mt * 16 + g + (odd ? 8 : 0);
                float *dqg = p.dq_acc + ((int64_t)b * p.Lq + row) * row_stride + (int64_t)h * D + dg * DQ_W + 2 * (t & 2);
#pragma unroll
                for (int nt = 0; nt < DQT; nt++) {
                    const float s0 = odd ? dq[mt][nt][0] : dq[mt][nt][2], s1 = odd ? dq[mt][nt][1] : dq[mt][nt][3];
                    const float r0 = __shfl_xor_sync(0xffffffffu, s0, 1), r1 = __shfl_xor_sync(0xffffffffu, s1, 1);
                    const float4 v = odd ? make_float4(r0, r1, dq[mt][nt][2], dq[mt][nt][3])
                                         : make_float4(dq[mt][nt][0], dq[mt][nt][1], r0, r1);
                    if (row < p.Lq) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
                        atomicAdd(reinterpret_cast<float4 *>(dqg + nt * 8), v);
#else
                        atomicAdd(dqg + nt * 8, v.x);
                        atomicAdd(dqg + nt * 8 + 1, v.y);
                        atomicAdd(dqg + nt * 8 + 2, v.z);
                        atomicAdd(dqg + nt * 8 + 3, v.w);
#endif
                    }
                }
            }
        }
        if (pre) {                         /* nobody reads buffer buf ^ 1 during this tile */
            sLse[(buf ^ 1) * BM + tid] = nlse;
            sDs[(buf ^ 1) * BM + tid] = nds;
        }
    }

    /* dV = P^T dO (S-warps), dK = scale dS^T Q (dP-warps) */
    bf16 *dst = sw ? p.dv : p.dk;
    const float mul = sw ? 1.0f : p.scale;
    if (dst) {
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int row = key0 + mt * 16 + 8 * r;
                if (row < p.Lk) {
                    bf16 *out = dst + ((int64_t)b * p.Lk + row) * row_stride + (int64_t)h * D + 2 * t;
#pragma unroll
                    for (int dt = 0; dt < DT; dt++)
                        *reinterpret_cast<uint32_t *>(out + dt * 8) =
                            pack_bf16(acc[mt][dt][2 * r] * mul, acc[mt][dt][2 * r + 1] * mul);
                }
            }
    }
}

/* D = rowsum(dO o O) for bf16 rows of D elements, D / 8 threads a row (16-byte loads); also
 * zeroes the fp32 dQ accumulator (`acc`, rows x D) when given. o's tokens are ldo apart. */
template <int D>
__global__ void attn_bwd_prep_bf16(const bf16 *dout, const bf16 *o, int64_t ldo, float *dsum, float4 *acc,
                                   int64_t rows, int H, int Lq)
{
    constexpr int TPR = D / 8;
    static_assert(TPR <= 32 && (TPR & (TPR - 1)) == 0, "threads per row");
    const int64_t gt = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    const int64_t row = gt / TPR;
    const bool ok = row < rows;
    const int h = (int)(row % H);
    const int64_t bm = row / H;
    float s = 0.0f;
    if (ok) {
        const uint4 x = reinterpret_cast<const uint4 *>(dout)[gt];
        const uint4 y = reinterpret_cast<const uint4 *>(o + bm * ldo + (int64_t)h * D)[gt % TPR];
        const uint32_t xa[4] = { x.x, x.y, x.z, x.w }, ya[4] = { y.x, y.y, y.z, y.w };
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float2 a = unpack_bf16(xa[j]), c = unpack_bf16(ya[j]);
            s = fmaf(a.x, c.x, s);
            s = fmaf(a.y, c.y, s);
        }
        if (acc) {
            acc[2 * gt] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            acc[2 * gt + 1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    }
#pragma unroll
    for (int off = TPR / 2; off > 0; off >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, off);
    if (ok && gt % TPR == 0) {
        const int m = (int)(bm % Lq), b = (int)(bm / Lq);
        dsum[((int64_t)b * H + h) * Lq + m] = s;
    }
}

/* ---- Hopper (sm_90a): wgmma forward and backward, bf16, Dh 128 ----------------------------
 * The tensor-core products run as warpgroup MMAs (wgmma.mma_async) with B, and for S^T and dP^T
 * also A, read from shared memory through matrix descriptors; the tiles sit in shared memory in
 * the 128-byte-swizzled layout that wgmma reads (see load_tile_sw128). Only the sm_90a build has
 * the instructions (GHC_WGMMA); elsewhere these kernels trap, and the host selects them only on
 * a device of compute capability 9.0. */
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define GHC_WGMMA 1
#endif

[[maybe_unused]] __device__ __forceinline__ void wgmma_fence()
{
#ifdef GHC_WGMMA
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
[[maybe_unused]] __device__ __forceinline__ void wgmma_commit()
{
#ifdef GHC_WGMMA
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N> __device__ __forceinline__ void wgmma_wait()
{
#ifdef GHC_WGMMA
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
/* shared memory written by cp.async, read next by wgmma (the async proxy) */
[[maybe_unused]] __device__ __forceinline__ void fence_proxy_async()
{
#ifdef GHC_WGMMA
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
/* keep values in place around asynchronous MMAs */
template <int R, int C> __device__ __forceinline__ void pin(float (&x)[R][C])
{
#pragma unroll
    for (int i = 0; i < R; i++)
#pragma unroll
        for (int j = 0; j < C; j++)
            asm volatile("" : "+f"(x[i][j])::"memory");
}
template <int R, int C> __device__ __forceinline__ void pin(uint32_t (&x)[R][C])
{
#pragma unroll
    for (int i = 0; i < R; i++)
#pragma unroll
        for (int j = 0; j < C; j++)
            asm volatile("" ::"r"(x[i][j]) : "memory");
}

/* Matrix descriptor of a 128-byte-swizzled operand at shared address `addr`. K-major (rows of
 * the tile along M or N, 64 elements of K per 128-byte row): lbo unused, sbo = 1024 (8 rows).
 * M/N-major (rows along K, 64 elements of M or N per row): lbo = the stride of the next 64
 * columns of M or N, sbo = 1024 (8 rows of K). */
[[maybe_unused]] __device__ __forceinline__ uint64_t sw128_desc(uint32_t addr, uint32_t lbo, uint32_t sbo)
{
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)((lbo & 0x3FFFF) >> 4) << 16) |
           ((uint64_t)((sbo & 0x3FFFF) >> 4) << 32) | (1ull << 62);
}

/* ROWS x 128 bf16 tile from global rows `stride` elements apart into the 128-byte-swizzled
 * layout (at a 1024-aligned `dst`): two halves of 64 columns, each [ROWS][128 bytes], the
 * 16-byte chunk c of row r stored at chunk c ^ (r % 8). Rows >= valid are zero-filled. NT threads
 * (a multiple of 128); each copies one chunk column of every (NT / 16)-th row. */
template <int ROWS, int NT>
__device__ __forceinline__ void load_tile_sw128(uint32_t dst, const bf16 *g, int64_t stride, int valid, int tid)
{
    constexpr int RS = NT / 16;
    static_assert(RS % 8 == 0 && ROWS % RS == 0, "tile shape");
    const int c = tid & 15, r0 = tid >> 4;
    const uint32_t col = (c >> 3) * (ROWS * 128) + (((c & 7) ^ (r0 & 7)) << 4);
    const bf16 *src = g + r0 * stride + c * 8;
    dst += r0 * 128 + col;
#pragma unroll
    for (int k = 0; k < ROWS / RS; k++) {
        const bool ok = r0 + k * RS < valid;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst + k * RS * 128), "l"(ok ? src : g),
                     "r"(ok ? 16 : 0));
        src += RS * stride;
    }
}

/* d (m64 x nN fp32; this thread's part: d[j][0..3], n-tile j, rows g and g + 8 of its warp's 16,
 * as mma.sync's m16n8 fragments) += a b; a: 64 x 16 bf16 from registers (mma.sync's A
 * fragments of each warp's 16 rows) or a shared-memory descriptor, b: a descriptor; TA / TB: the
 * operand is M- / N-major. scale_d 0: d = a b. */

template <int TB>
__device__ __forceinline__ void wgmma_m64n64k16_rs(float (&d)[8][4], const uint32_t (&a)[4], uint64_t db,
                                                   int scale_d)
{
#ifdef GHC_WGMMA
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %38, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
                 "}, {%32, %33, %34, %35}, %36, p, 1, 1, %37;\n}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
                   "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
                   "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
                   "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
                   "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
                   "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
                   "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
                   "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(TB), "r"(scale_d));
#endif
}

template <int TA, int TB>
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[8][4], uint64_t da, uint64_t db, int scale_d)
{
#ifdef GHC_WGMMA
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %36, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
                 "}, %32, %33, p, 1, 1, %34, %35;\n}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
                   "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
                   "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
                   "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
                   "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
                   "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
                   "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
                   "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
                 : "l"(da), "l"(db), "n"(TA), "n"(TB), "r"(scale_d));
#endif
}

template <int TB>
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[16][4], const uint32_t (&a)[4], uint64_t db,
                                                    int scale_d)
{
#ifdef GHC_WGMMA
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %70, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
                 "}, {%64, %65, %66, %67}, %68, p, 1, 1, %69;\n}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
                   "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
                   "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
                   "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
                   "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
                   "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
                   "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
                   "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
                   "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
                   "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
                   "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]),
                   "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
                   "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
                   "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
                   "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
                   "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(TB), "r"(scale_d));
#endif
}

/* Forward: one warpgroup takes 64 query rows (16 per warp; Q in registers as A fragments) and
 * walks the keys in tiles of 64, K and V double-buffered: S = Q K^T (B = K, K-major), online
 * softmax in registers, O += P V (A = P from registers, B = V, N-major). Two blocks per SM, so
 * one block's softmax overlaps the other's products. */
constexpr int kFwgBM = 64, kFwgBN = 64, kFwgThreads = 128;
constexpr int kFwgTile = kFwgBN * 256;                                   /* one K or V tile, 16 KB */
constexpr int kFwgSmem = 4 * kFwgTile + kFwgBM * (128 + 8) * 2 + 1024;  /* K[2], V[2], Q, alignment */

__global__ void __launch_bounds__(kFwgThreads, 2) attn_fwd_wg(const fwd_params p)
{
#ifdef GHC_WGMMA
    constexpr int D = 128, S = D + 8, BM = kFwgBM, BN = kFwgBN;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
    constexpr uint32_t oK = 0, oV = 2 * kFwgTile, oQ = 4 * kFwgTile;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const int m0 = blockIdx.x * BM, h = blockIdx.y, b = blockIdx.z;
    const int64_t row_stride = (int64_t)p.H * D;
    const bf16 *qg = p.q + ((int64_t)b * p.Lq + m0) * row_stride + (int64_t)h * D;
    const bf16 *kg = p.k + (int64_t)b * p.Lk * row_stride + (int64_t)h * D;
    const bf16 *vg = p.v + (int64_t)b * p.Lk * row_stride + (int64_t)h * D;
    const float sl = p.scale_log2;

    /* cp.async groups, in order: {Q, K_0}, {V_0}, then per tile j: {K_j+1}, {V_j+1} (maybe empty) */
    load_tile<BM, D, kFwgThreads>(base + oQ, qg, row_stride, p.Lq - m0, tid);
    load_tile_sw128<BN, kFwgThreads>(base + oK, kg, row_stride, p.Lk, tid);
    cp_async_commit();
    load_tile_sw128<BN, kFwgThreads>(base + oV, vg, row_stride, p.Lk, tid);
    cp_async_commit();

    float o[D / 8][4];                     /* written by the first P V product (scale-d 0) */
    float row_m[2] = { -INFINITY, -INFINITY }, row_l[2] = { 0.0f, 0.0f };
    uint32_t qa[D / 16][4];

    const int nb = (p.Lk + BN - 1) / BN;
    for (int j = 0; j < nb; j++) {
        const int cur = j & 1, n0 = j * BN;
        asm volatile("cp.async.wait_group 1;\n" ::: "memory");   /* K_j (and Q) here; V_j may be in flight */
        fence_proxy_async();
        __syncthreads();                   /* ... for all; and S_{j-1} is done everywhere */
        if (j == 0) {
            const uint32_t aQ = base + oQ + lane_a(lane, S) + warp * 16 * S * 2;
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++)
                ldsm_x4(qa[kk], aQ + kk * 32);
        }
        if (j + 1 < nb)
            load_tile_sw128<BN, kFwgThreads>(base + oK + (cur ^ 1) * kFwgTile, kg + (int64_t)(n0 + BN) * row_stride,
                                             row_stride, p.Lk - n0 - BN, tid);
        cp_async_commit();

        float s[BN / 8][4];                /* written by the first product (scale-d 0) */
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++)
            wgmma_m64n64k16_rs<0>(s, qa[kk],
                                  sw128_desc(base + oK + cur * kFwgTile + (kk >> 2) * (BN * 128) + (kk & 3) * 32, 16, 1024),
                                  kk > 0);
        wgmma_commit();
        wgmma_wait<0>();                   /* S_j, and O += P_{j-1} V_{j-1} */
        pin(s);
        pin(o);

        if (n0 + BN > p.Lk) {
#pragma unroll
            for (int nt = 0; nt < BN / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (n0 + nt * 8 + 2 * t + (e & 1) >= p.Lk)
                        s[nt][e] = -INFINITY;
        }
        /* online softmax, rows g (r = 0) and g + 8 (r = 1) of this warp's 16 */
        uint32_t pa[BN / 16][4];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < BN / 8; nt++)
                mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float m_new = fmaxf(row_m[r], mx);
            const float corr = fast_exp2((row_m[r] - m_new) * sl);
            row_m[r] = m_new;
            const float ms = m_new * sl;
            float sum = 0.0f;
#pragma unroll
            for (int nt = 0; nt < BN / 8; nt++) {
                const float p0 = fast_exp2(fmaf(s[nt][2 * r], sl, -ms));
                const float p1 = fast_exp2(fmaf(s[nt][2 * r + 1], sl, -ms));
                s[nt][2 * r] = p0;
                s[nt][2 * r + 1] = p1;
                sum += p0 + p1;
            }
            row_l[r] = row_l[r] * corr + sum;
            if (j > 0) {
#pragma unroll
                for (int dt = 0; dt < D / 8; dt++) {
                    o[dt][2 * r] *= corr;
                    o[dt][2 * r + 1] *= corr;
                }
            }
        }
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            pa[kk][0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
            pa[kk][1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
            pa[kk][2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            pa[kk][3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
        }

        asm volatile("cp.async.wait_group 1;\n" ::: "memory");   /* V_j here; K_{j+1} may be in flight */
        fence_proxy_async();
        __syncthreads();                   /* ... for all; and O += P_{j-1} V_{j-1} is done everywhere */
        if (j + 1 < nb)
            load_tile_sw128<BN, kFwgThreads>(base + oV + (cur ^ 1) * kFwgTile, vg + (int64_t)(n0 + BN) * row_stride,
                                             row_stride, p.Lk - n0 - BN, tid);
        cp_async_commit();

        pin(o);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++)
            wgmma_m64n128k16_rs<1>(o, pa[kk], sw128_desc(base + oV + cur * kFwgTile + kk * 2048, BN * 128, 1024),
                                   j > 0 || kk > 0);
        wgmma_commit();
    }
    wgmma_wait<0>();
    pin(o);

#pragma unroll
    for (int r = 0; r < 2; r++) {
        float l = row_l[r];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const float inv = 1.0f / l;
        const int row = m0 + warp * 16 + g + 8 * r;
        if (row < p.Lq) {
            bf16 *og = p.o + ((int64_t)b * p.Lq + row) * p.ldo + (int64_t)h * D;
#pragma unroll
            for (int dt = 0; dt < D / 8; dt++)
                *reinterpret_cast<uint32_t *>(og + dt * 8 + 2 * t) = pack_bf16(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
            if (t == 0)
                p.lse[((int64_t)b * p.H + h) * p.Lq + row] = row_m[r] * p.scale + logf(l);
        }
    }
#else
    __trap();
#endif
}

/* Backward: a block of two warpgroups owns 128 keys (64 each; per warp 16, keys as rows) and
 * walks the queries in tiles of 64, Q and dO double-buffered. Per tile and warpgroup:
 * S^T = K Q^T and dP^T = V dO^T (both operands from shared memory), P^T and dS^T in registers,
 * dV += P^T dO and dK += dS^T Q (A from registers, B = dO, Q N-major); then dS^T of all 128 keys
 * through shared memory for dQ = dS K, each warpgroup 64 of the 128 columns (A = dS by
 * transposed ldmatrix), added in fp32 with 16-byte atomics. */
constexpr int kBwgBN = 128, kBwgBM = 64, kBwgThreads = 256, kBwgSS = kBwgBM + 8;
constexpr int kBwgKV = kBwgBN * 256, kBwgQO = kBwgBM * 256;   /* K or V tile, Q or dO tile (bytes) */
[[maybe_unused]] constexpr int kBwgOK = 0, kBwgOV = kBwgKV, kBwgOQ = 2 * kBwgKV, kBwgOO = kBwgOQ + 2 * kBwgQO,
              kBwgOS = kBwgOO + 2 * kBwgQO, kBwgOL = kBwgOS + kBwgBN * kBwgSS * 2;
constexpr int kBwgSmem = kBwgOL + 4 * kBwgBM * 4 + 1024;      /* + lse, D [2][64] each; alignment */

/* PIPE: a tile's dQ atomics wait until the next tile's S^T and dP^T products are issued, so
 * that the tensor cores work while the atomics drain. */
template <bool PIPE, bool DQ>
__global__ void __launch_bounds__(kBwgThreads, 1) attn_bwd_wg(const bwd_params p)
{
#ifdef GHC_WGMMA
    constexpr int D = 128, BN = kBwgBN, BM = kBwgBM, SS = kBwgSS;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const uint32_t raw = smem_addr(smem_raw), base = (raw + 1023u) & ~1023u;
    unsigned char *sb = smem_raw + (base - raw);
    bf16 *sdS = reinterpret_cast<bf16 *>(sb + kBwgOS);     /* dS^T [BN][SS] */
    float *sLse = reinterpret_cast<float *>(sb + kBwgOL);  /* [2][BM], times log2 e */
    float *sDs = sLse + 2 * BM;                             /* [2][BM] */

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const int wg = warp >> 2, ww = warp & 3;   /* warpgroup: keys wg*64 ..; warp: 16 of them */
    const int n0 = blockIdx.x * BN, h = blockIdx.y, b = blockIdx.z;
    const int64_t row_stride = (int64_t)p.H * D;
    const int64_t kv_off = ((int64_t)b * p.Lk + n0) * row_stride + (int64_t)h * D;
    const int64_t q_off = (int64_t)b * p.Lq * row_stride + (int64_t)h * D;
    const int64_t bh = (int64_t)b * p.H + h;
    const float sl = p.scale_log2;
    const int nm = (p.Lq + BM - 1) / BM;

    load_tile_sw128<BN, kBwgThreads>(base + kBwgOK, p.k + kv_off, row_stride, p.Lk - n0, tid);
    load_tile_sw128<BN, kBwgThreads>(base + kBwgOV, p.v + kv_off, row_stride, p.Lk - n0, tid);
    load_tile_sw128<BM, kBwgThreads>(base + kBwgOQ, p.q + q_off, row_stride, p.Lq, tid);
    load_tile_sw128<BM, kBwgThreads>(base + kBwgOO, p.dout + q_off, row_stride, p.Lq, tid);
    cp_async_commit();
    if (tid < BM) {
        const bool ok = tid < p.Lq;
        sLse[tid] = ok ? p.lse[bh * p.Lq + tid] * kLog2e : INFINITY;
        sDs[tid] = ok ? p.dsum[bh * p.Lq + tid] : 0.0f;
    }

    /* dV, dK of keys key0 (+8), columns 8j + 2t (+1): written by the first products (scale-d 0) */
    float dv[D / 8][4], dk[D / 8][4];
    float s[BM / 8][4], dp[BM / 8][4];   /* S^T, dP^T of the tile in flight */
    const bool key_tail = n0 + BN > p.Lk;
    const int key0 = n0 + wg * 64 + ww * 16 + g;
    constexpr bool want_dq = DQ;      /* p.dq_acc != NULL */
    const uint32_t aK = base + kBwgOK + wg * 64 * 128, aV = base + kBwgOV + wg * 64 * 128;   /* this warpgroup's rows */
    const uint32_t aSa = smem_addr(sdS) + lane_at(lane, SS) + ww * 16 * 2;                   /* dS: this warp's queries */
    bf16 *mydS = sdS + (wg * 64 + ww * 16 + g) * SS + 2 * t;
    float nlse = INFINITY, nds = 0.0f;   /* lse, D of the tile after the one in hand */

    /* tile j's data in shared memory for all (and tile j - 1 done everywhere); tile j + 1's loads issued */
    auto tile_top = [&](int j) {
        cp_async_wait_all();
        fence_proxy_async();
        __syncthreads();
        if (j + 1 < nm) {
            const int m1 = (j + 1) * BM, nb = (j + 1) & 1;
            load_tile_sw128<BM, kBwgThreads>(base + kBwgOQ + nb * kBwgQO, p.q + q_off + (int64_t)m1 * row_stride,
                                             row_stride, p.Lq - m1, tid);
            load_tile_sw128<BM, kBwgThreads>(base + kBwgOO + nb * kBwgQO, p.dout + q_off + (int64_t)m1 * row_stride,
                                             row_stride, p.Lq - m1, tid);
            cp_async_commit();
            if (tid < BM) {
                nlse = m1 + tid < p.Lq ? p.lse[bh * p.Lq + m1 + tid] * kLog2e : INFINITY;
                nds = m1 + tid < p.Lq ? p.dsum[bh * p.Lq + m1 + tid] : 0.0f;
            }
        }
    };
    /* S^T = K Q^T and dP^T = V dO^T of tile j (64 keys x 64 queries per warpgroup), one group each */
    auto issue_s = [&](int j) {
        const uint32_t aQ = base + kBwgOQ + (j & 1) * kBwgQO;
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++)
            wgmma_m64n64k16_ss<0, 0>(s, sw128_desc(aK + (kk >> 2) * (BN * 128) + (kk & 3) * 32, 16, 1024),
                                     sw128_desc(aQ + (kk >> 2) * (BM * 128) + (kk & 3) * 32, 16, 1024), kk > 0);
        wgmma_commit();
    };
    auto issue_dp = [&](int j) {
        const uint32_t aO = base + kBwgOO + (j & 1) * kBwgQO;
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++)
            wgmma_m64n64k16_ss<0, 0>(dp, sw128_desc(aV + (kk >> 2) * (BN * 128) + (kk & 3) * 32, 16, 1024),
                                     sw128_desc(aO + (kk >> 2) * (BM * 128) + (kk & 3) * 32, 16, 1024), kk > 0);
        wgmma_commit();
    };
    /* the next tile's lse and D into their buffer (nobody reads it during tile j) */
    auto store_next = [&](int j) {
        if (j + 1 < nm && tid < BM) {
            sLse[((j + 1) & 1) * BM + tid] = nlse;
            sDs[((j + 1) & 1) * BM + tid] = nds;
        }
    };

    /* dQ of the previous tile, ready for the atomics (PIPE: they run after this tile's products
     * are issued); rows and columns as in the atomics below */
    float av[8][4];
    float *dqg = NULL;
    bool dq_row_ok = false;
    for (int i = 0; i < nm; i++) {
        const int buf = i & 1, m0 = i * BM;
        const uint32_t aQ = base + kBwgOQ + buf * kBwgQO, aO = base + kBwgOO + buf * kBwgQO;
        tile_top(i);
        issue_s(i);
        issue_dp(i);
        if (PIPE && i > 0 && want_dq && dq_row_ok) {
#pragma unroll
            for (int nt = 0; nt < 8; nt++)
                atomicAdd(reinterpret_cast<float4 *>(dqg + nt * 8), make_float4(av[nt][0], av[nt][1], av[nt][2], av[nt][3]));
        }
        wgmma_wait<1>();                   /* S^T */
        pin(s);

        /* P^T = exp(scale S^T - lse); pk: A fragments of dV (k-steps of 16 queries) */
        const float *cL = sLse + buf * BM + 2 * t, *cD = sDs + buf * BM + 2 * t;
        float pf[BM / 8][4];
#pragma unroll
        for (int nt = 0; nt < BM / 8; nt++) {
            const float2 l2 = *reinterpret_cast<const float2 *>(cL + nt * 8);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float pv = fast_exp2(fmaf(s[nt][e], sl, -((e & 1) ? l2.y : l2.x)));
                if (key_tail && key0 + (e >> 1) * 8 >= p.Lk)
                    pv = 0.0f;
                pf[nt][e] = pv;
            }
        }
        uint32_t pk[BM / 16][4], dsk[BM / 16][4];
#pragma unroll
        for (int kk = 0; kk < BM / 16; kk++) {
            pk[kk][0] = pack_bf16(pf[2 * kk][0], pf[2 * kk][1]);
            pk[kk][1] = pack_bf16(pf[2 * kk][2], pf[2 * kk][3]);
            pk[kk][2] = pack_bf16(pf[2 * kk + 1][0], pf[2 * kk + 1][1]);
            pk[kk][3] = pack_bf16(pf[2 * kk + 1][2], pf[2 * kk + 1][3]);
        }
        wgmma_wait<0>();                   /* dP^T */
        pin(dp);
        /* dS^T = P^T o (dP^T - D), to registers (A fragments of dK) and to shared memory (for dQ) */
#pragma unroll
        for (int nt = 0; nt < BM / 8; nt++) {
            const float2 d2 = *reinterpret_cast<const float2 *>(cD + nt * 8);
            const uint32_t lo = pack_bf16(pf[nt][0] * (dp[nt][0] - d2.x), pf[nt][1] * (dp[nt][1] - d2.y));
            const uint32_t hi = pack_bf16(pf[nt][2] * (dp[nt][2] - d2.x), pf[nt][3] * (dp[nt][3] - d2.y));
            dsk[nt >> 1][(nt & 1) * 2] = lo;
            dsk[nt >> 1][(nt & 1) * 2 + 1] = hi;
            if (want_dq) {
                *reinterpret_cast<uint32_t *>(mydS + nt * 8) = lo;
                *reinterpret_cast<uint32_t *>(mydS + 8 * SS + nt * 8) = hi;
            }
        }

        /* dV += P^T dO, dK += dS^T Q */
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BM / 16; kk++)
            wgmma_m64n128k16_rs<1>(dv, pk[kk], sw128_desc(aO + kk * 2048, BM * 128, 1024), i > 0 || kk > 0);
#pragma unroll
        for (int kk = 0; kk < BM / 16; kk++)
            wgmma_m64n128k16_rs<1>(dk, dsk[kk], sw128_desc(aQ + kk * 2048, BM * 128, 1024), i > 0 || kk > 0);
        wgmma_commit();

        if (want_dq) {
            __syncthreads();               /* dS^T of all 128 keys here */
            /* dQ_i += dS K: 64 queries x 64 columns (wg * 64 ..) per warpgroup, over the 128 keys */
            uint32_t sa[BN / 16][4];
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++)
                ldsm_x4_t(sa[kk], aSa + kk * 16 * SS * 2);
            float dq[8][4];
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++)
                wgmma_m64n64k16_rs<1>(dq, sa[kk], sw128_desc(base + kBwgOK + wg * (BN * 128) + kk * 2048, BN * 128, 1024),
                                      kk > 0);
            wgmma_commit();
            wgmma_wait<0>();
            pin(dq);
            pin(sa);
            pin(pk);
            pin(dsk);
            pin(dv);
            pin(dk);
            /* fp32 atomics, 4 columns at a time (lanes t and t^1 swap halves, as in attn_bwd_tc);
             * the values leave the accumulators first */
            const bool odd = t & 1;
            const int row = m0 + ww * 16 + g + (odd ? 8 : 0);
            dq_row_ok = row < p.Lq;
            dqg = p.dq_acc + ((int64_t)b * p.Lq + row) * row_stride + (int64_t)h * D + wg * 64 + 2 * (t & 2);
#pragma unroll
            for (int nt = 0; nt < 8; nt++) {
                const float s0 = odd ? dq[nt][0] : dq[nt][2], s1 = odd ? dq[nt][1] : dq[nt][3];
                const float r0 = __shfl_xor_sync(0xffffffffu, s0, 1), r1 = __shfl_xor_sync(0xffffffffu, s1, 1);
                av[nt][0] = odd ? r0 : dq[nt][0];
                av[nt][1] = odd ? r1 : dq[nt][1];
                av[nt][2] = odd ? dq[nt][2] : r0;
                av[nt][3] = odd ? dq[nt][3] : r1;
            }
            pin(av);
            if (!PIPE && dq_row_ok) {
#pragma unroll
                for (int nt = 0; nt < 8; nt++)
                    atomicAdd(reinterpret_cast<float4 *>(dqg + nt * 8), make_float4(av[nt][0], av[nt][1], av[nt][2], av[nt][3]));
            }
        } else {
            wgmma_wait<0>();
            pin(pk);
            pin(dsk);
        }
        pin(dv);
        pin(dk);
        store_next(i);
    }

    wgmma_wait<0>();                       /* nothing in flight (the compiler cannot tell) */
    pin(dv);
    pin(dk);
    if (PIPE && want_dq && dq_row_ok) {    /* the last tile's dQ */
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
            atomicAdd(reinterpret_cast<float4 *>(dqg + nt * 8), make_float4(av[nt][0], av[nt][1], av[nt][2], av[nt][3]));
    }

    /* dV = P^T dO, dK = scale dS^T Q */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = key0 + 8 * r;
        if (row < p.Lk) {
            const int64_t off = ((int64_t)b * p.Lk + row) * row_stride + (int64_t)h * D + 2 * t;
#pragma unroll
            for (int dt = 0; dt < D / 8; dt++) {
                if (p.dk)
                    *reinterpret_cast<uint32_t *>(p.dk + off + dt * 8) =
                        pack_bf16(dk[dt][2 * r] * p.scale, dk[dt][2 * r + 1] * p.scale);
                if (p.dv)
                    *reinterpret_cast<uint32_t *>(p.dv + off + dt * 8) = pack_bf16(dv[dt][2 * r], dv[dt][2 * r + 1]);
            }
        }
    }
#else
    __trap();
#endif
}

/* ---- simple fp32 path (any dtype here, any Dh <= 256) -------------------------------------- */

constexpr int kGenWarps = 4;   /* warps per block; one row per warp */
constexpr int kGenJ = 8;       /* 8 x 32 lanes = 256 = the largest Dh */

template <typename T>
__device__ __forceinline__ void load_row(float out[kGenJ], const T *row, int D, int lane)
{
#pragma unroll
    for (int j = 0; j < kGenJ; j++) {
        int d = lane + 32 * j;
        out[j] = d < D ? to_f(row[d]) : 0.0f;
    }
}

template <typename T>
__device__ __forceinline__ float dot_row(const float x[kGenJ], const T *row, int D, int lane)
{
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < kGenJ; j++) {
        int d = lane + 32 * j;
        if (d < D)
            s = fmaf(x[j], to_f(row[d]), s);
    }
    return s;
}

template <typename T>
__global__ void attn_fwd_generic(const T *q, const T *k, const T *v, T *o, int64_t ldo, float *lse, int B, int H,
                                 int Lq, int Lk, int D, float scale)
{
    const int64_t row = (int64_t)blockIdx.x * kGenWarps + (threadIdx.x >> 5);   /* (b, m, h) */
    const int lane = threadIdx.x & 31;
    if (row >= (int64_t)B * Lq * H)
        return;
    const int h = (int)(row % H);
    const int64_t bm = row / H;
    const int m = (int)(bm % Lq), b = (int)(bm / Lq);
    float qv[kGenJ], ov[kGenJ];
    load_row(qv, q + row * D, D, lane);
#pragma unroll
    for (int j = 0; j < kGenJ; j++)
        ov[j] = 0.0f;
    float mx = -INFINITY, l = 0.0f;
    for (int n = 0; n < Lk; n++) {
        const int64_t kr = (((int64_t)b * Lk + n) * H + h) * D;
        const float s = warp_sum(dot_row(qv, k + kr, D, lane)) * scale;
        const float m_new = fmaxf(mx, s);
        const float corr = expf(mx - m_new), pv = expf(s - m_new);
        l = l * corr + pv;
#pragma unroll
        for (int j = 0; j < kGenJ; j++) {
            int d = lane + 32 * j;
            ov[j] = ov[j] * corr + (d < D ? pv * to_f(v[kr + d]) : 0.0f);
        }
        mx = m_new;
    }
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    T *orow = o + bm * ldo + (int64_t)h * D;
#pragma unroll
    for (int j = 0; j < kGenJ; j++) {
        int d = lane + 32 * j;
        if (d < D)
            orow[d] = from_f<T>(ov[j] * inv);
    }
    if (lane == 0)
        lse[((int64_t)b * H + h) * Lq + m] = l > 0.0f ? mx + logf(l) : -INFINITY;
}

/* D[b, h, m] = sum_d dO o O, one warp per row (o's tokens ldo apart) */
template <typename T>
__global__ void attn_bwd_dsum(const T *dout, const T *o, int64_t ldo, float *dsum, int B, int H, int Lq, int D)
{
    const int64_t row = (int64_t)blockIdx.x * kGenWarps + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= (int64_t)B * Lq * H)
        return;
    const int h = (int)(row % H);
    const int64_t bm = row / H;
    const int m = (int)(bm % Lq), b = (int)(bm / Lq);
    const T *orow = o + bm * ldo + (int64_t)h * D;
    float s = 0.0f;
    for (int d = lane; d < D; d += 32)
        s = fmaf(to_f(dout[row * D + d]), to_f(orow[d]), s);
    s = warp_sum(s);
    if (lane == 0)
        dsum[((int64_t)b * H + h) * Lq + m] = s;
}

/* dq, one warp per query row */
template <typename T>
__global__ void attn_bwd_dq_generic(T *dq, const T *dout, const T *q, const T *k, const T *v, const float *lse,
                                    const float *dsum, int B, int H, int Lq, int Lk, int D, float scale)
{
    const int64_t row = (int64_t)blockIdx.x * kGenWarps + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= (int64_t)B * Lq * H)
        return;
    const int h = (int)(row % H);
    const int64_t bm = row / H;
    const int m = (int)(bm % Lq), b = (int)(bm / Lq);
    float qv[kGenJ], dov[kGenJ], acc[kGenJ];
    load_row(qv, q + row * D, D, lane);
    load_row(dov, dout + row * D, D, lane);
#pragma unroll
    for (int j = 0; j < kGenJ; j++)
        acc[j] = 0.0f;
    const float L = lse[((int64_t)b * H + h) * Lq + m], Dm = dsum[((int64_t)b * H + h) * Lq + m];
    for (int n = 0; n < Lk; n++) {
        const int64_t kr = (((int64_t)b * Lk + n) * H + h) * D;
        float s = dot_row(qv, k + kr, D, lane), dp = dot_row(dov, v + kr, D, lane);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            s += __shfl_xor_sync(0xffffffffu, s, o);
            dp += __shfl_xor_sync(0xffffffffu, dp, o);
        }
        const float pv = expf(s * scale - L);
        const float ds = pv * (dp - Dm);
#pragma unroll
        for (int j = 0; j < kGenJ; j++) {
            int d = lane + 32 * j;
            if (d < D)
                acc[j] = fmaf(ds, to_f(k[kr + d]), acc[j]);
        }
    }
#pragma unroll
    for (int j = 0; j < kGenJ; j++) {
        int d = lane + 32 * j;
        if (d < D)
            dq[row * D + d] = from_f<T>(acc[j] * scale);
    }
}

/* dk, dv, one warp per key row */
template <typename T>
__global__ void attn_bwd_dkv_generic(T *dk, T *dv, const T *dout, const T *q, const T *k, const T *v,
                                     const float *lse, const float *dsum, int B, int H, int Lq, int Lk, int D,
                                     float scale)
{
    const int64_t row = (int64_t)blockIdx.x * kGenWarps + (threadIdx.x >> 5);   /* (b, n, h) */
    const int lane = threadIdx.x & 31;
    if (row >= (int64_t)B * Lk * H)
        return;
    const int h = (int)(row % H);
    const int b = (int)(row / H / Lk);
    float kv[kGenJ], vv[kGenJ], adk[kGenJ], adv[kGenJ];
    load_row(kv, k + row * D, D, lane);
    load_row(vv, v + row * D, D, lane);
#pragma unroll
    for (int j = 0; j < kGenJ; j++)
        adk[j] = adv[j] = 0.0f;
    const float *lse_bh = lse + ((int64_t)b * H + h) * Lq, *ds_bh = dsum + ((int64_t)b * H + h) * Lq;
    for (int m = 0; m < Lq; m++) {
        const int64_t qr = (((int64_t)b * Lq + m) * H + h) * D;
        float s = dot_row(kv, q + qr, D, lane), dp = dot_row(vv, dout + qr, D, lane);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            s += __shfl_xor_sync(0xffffffffu, s, o);
            dp += __shfl_xor_sync(0xffffffffu, dp, o);
        }
        const float pv = expf(s * scale - lse_bh[m]);
        const float ds = pv * (dp - ds_bh[m]);
#pragma unroll
        for (int j = 0; j < kGenJ; j++) {
            int d = lane + 32 * j;
            if (d < D) {
                adv[j] = fmaf(pv, to_f(dout[qr + d]), adv[j]);
                adk[j] = fmaf(ds, to_f(q[qr + d]), adk[j]);
            }
        }
    }
#pragma unroll
    for (int j = 0; j < kGenJ; j++) {
        int d = lane + 32 * j;
        if (d < D) {
            if (dk)
                dk[row * D + d] = from_f<T>(adk[j] * scale);
            if (dv)
                dv[row * D + d] = from_f<T>(adv[j]);
        }
    }
}

__global__ void dq_convert_bf16(bf16 *dq, const float4 *acc, int64_t n4, float scale)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x) {
        float4 a = acc[i];
        uint2 w;
        w.x = pack_bf16(a.x * scale, a.y * scale);
        w.y = pack_bf16(a.z * scale, a.w * scale);
        reinterpret_cast<uint2 *>(dq)[i] = w;
    }
}


struct device_guard {
    int prev = -1;
    bool changed = false;
    cudaError_t err = cudaSuccess;
    explicit device_guard(int dev)
    {
        if ((err = cudaGetDevice(&prev)) != cudaSuccess)
            return;
        if (prev != dev) {
            err = cudaSetDevice(dev);
            changed = err == cudaSuccess;
        }
    }
    ~device_guard()
    {
        if (changed)
            cudaSetDevice(prev);
    }
};

bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* The shared memory a block may opt in to on the current device (cached per device). */
int smem_optin()
{
    static int cache[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess)
        return 0;
    if (dev >= 0 && dev < 64 && cache[dev])
        return cache[dev];
    int v = 0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    if (dev >= 0 && dev < 64)
        cache[dev] = v;
    return v;
}

int fwd_smem_for(int D)
{
    switch (D) {
    case 16: return fwd_smem_bytes<16>();
    case 32: return fwd_smem_bytes<32>();
    case 64: return fwd_smem_bytes<64>();
    default: return fwd_smem_bytes<128>();
    }
}


int bwd_smem_for(int D)
{
    switch (D) {
    case 32: return bwd_smem_bytes<32, 64>();
    case 64: return bwd_smem_bytes<64, 64>();
    default: return bwd_smem_bytes<128, 64>();
    }
}

template <int D>
cudaError_t launch_fwd_tc(const fwd_params &p, cudaStream_t st)
{
    constexpr int smem = fwd_smem_bytes<D>();
    static bool attr_set[64];   /* per device; setting it twice is harmless */
    int dev = 0;
    cudaGetDevice(&dev);
    if (!attr_set[dev & 63]) {
        cudaError_t e = cudaFuncSetAttribute(attn_fwd_tc<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        if (e != cudaSuccess)
            return e;
        attr_set[dev & 63] = true;
    }
    dim3 grid((p.Lq + kFwdBM - 1) / kFwdBM, p.H, p.B);
    attn_fwd_tc<D><<<grid, kFwdThreads, smem, st>>>(p);
    return cudaGetLastError();
}

template <int D, int BM>
cudaError_t launch_bwd_tc(const bwd_params &p, cudaStream_t st)
{
    constexpr int smem = bwd_smem_bytes<D, BM>();
    static bool attr_set[64];
    int dev = 0;
    cudaGetDevice(&dev);
    if (!attr_set[dev & 63]) {
        cudaError_t e = cudaFuncSetAttribute(attn_bwd_tc<D, BM>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        if (e != cudaSuccess)
            return e;
        attr_set[dev & 63] = true;
    }
    dim3 grid((p.Lk + kBwdBN - 1) / kBwdBN, p.H, p.B);
    attn_bwd_tc<D, BM><<<grid, kBwdThreads, smem, st>>>(p);
    return cudaGetLastError();
}

/* The FA2-style backward: big = 128 keys a block, Q and dO double-buffered (173 KB of shared
 * memory at Dh 128); small = 64 keys, one buffer (87 KB: fits the 99 KB of sm_121). */
int bwd2_smem_for(int D, bool big)
{
    if (D == 64)
        return big ? bwd2_cfg<64, 128, true>::smem : bwd2_cfg<64, 64, false>::smem;
    return big ? bwd2_cfg<128, 128, true>::smem : bwd2_cfg<128, 64, false>::smem;
}

template <int D, int BN, bool DB, bool SPLIT>
cudaError_t launch_bwd2_tc(const bwd_params &p, cudaStream_t st)
{
    constexpr int smem = bwd2_cfg<D, BN, DB>::smem;
    static bool attr_set[64];
    int dev = 0;
    cudaGetDevice(&dev);
    if (!attr_set[dev & 63]) {
        cudaError_t e =
            cudaFuncSetAttribute(attn_bwd2_tc<D, BN, DB, SPLIT>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        if (e != cudaSuccess)
            return e;
        attr_set[dev & 63] = true;
    }
    dim3 grid((p.Lk + BN - 1) / BN, p.H, p.B);
    attn_bwd2_tc<D, BN, DB, SPLIT><<<grid, bwd2_cfg<D, BN, DB>::NT, smem, st>>>(p);
    return cudaGetLastError();
}

constexpr bool kBwd2Split = true;

/* Whether the code loaded for this device was built with the sm_90a features (wgmma): a
 * build for plain sm_90 or from compute_90 PTX gets the trapping stubs instead. */
__device__ int g_wg_feature;

__global__ void wg_feature_probe()
{
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    g_wg_feature = 1;
#else
    g_wg_feature = 0;
#endif
}

/* compute capability 9.0 (H100, H200) and sm_90a code loaded: the wgmma kernels (cached per
 * device; the first call per device runs a one-thread probe and waits for it) */
bool is_sm90()
{
    static int cache[64];   /* 0 unknown, 1 yes, 2 no */
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess)
        return false;
    if (dev >= 0 && dev < 64 && cache[dev])
        return cache[dev] == 1;
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    bool yes = major == 9 && minor == 0;
    if (yes) {
        int feature = 0;
        wg_feature_probe<<<1, 1>>>();
        if (cudaGetLastError() != cudaSuccess ||
            cudaMemcpyFromSymbol(&feature, g_wg_feature, sizeof(feature)) != cudaSuccess) {
            cudaGetLastError();
            feature = 0;
        }
        yes = feature == 1;
    }
    if (dev >= 0 && dev < 64)
        cache[dev] = yes ? 1 : 2;
    return yes;
}

cudaError_t launch_fwd_wg(const fwd_params &p, cudaStream_t st)
{
    static bool attr_set[64];
    int dev = 0;
    cudaGetDevice(&dev);
    if (!attr_set[dev & 63]) {
        cudaError_t e = cudaFuncSetAttribute(attn_fwd_wg, cudaFuncAttributeMaxDynamicSharedMemorySize, kFwgSmem);
        if (e != cudaSuccess)
            return e;
        attr_set[dev & 63] = true;
    }
    dim3 grid((p.Lq + kFwgBM - 1) / kFwgBM, p.H, p.B);
    attn_fwd_wg<<<grid, kFwgThreads, kFwgSmem, st>>>(p);
    return cudaGetLastError();
}

template <bool PIPE, bool DQ>
cudaError_t launch_bwd_wg_dq(const bwd_params &p, cudaStream_t st)
{
    static bool attr_set[64];
    int dev = 0;
    cudaGetDevice(&dev);
    if (!attr_set[dev & 63]) {
        cudaError_t e = cudaFuncSetAttribute(attn_bwd_wg<PIPE, DQ>, cudaFuncAttributeMaxDynamicSharedMemorySize, kBwgSmem);
        if (e != cudaSuccess)
            return e;
        attr_set[dev & 63] = true;
    }
    dim3 grid((p.Lk + kBwgBN - 1) / kBwgBN, p.H, p.B);
    attn_bwd_wg<PIPE, DQ><<<grid, kBwgThreads, kBwgSmem, st>>>(p);
    return cudaGetLastError();
}

template <bool PIPE>
cudaError_t launch_bwd_wg(const bwd_params &p, cudaStream_t st)
{
    return p.dq_acc ? launch_bwd_wg_dq<PIPE, true>(p, st) : launch_bwd_wg_dq<PIPE, false>(p, st);
}

constexpr bool kBwgPipe = true;


unsigned gen_blocks(int64_t rows) { return (unsigned)((rows + kGenWarps - 1) / kGenWarps); }

/* Elements between the starts of o's tokens: H Dh for [B, Lq, H, Dh], the row stride for
 * [B, Lq, H Dh] (a column view's rows are further apart). */
int64_t attn_ldo(const ghc_tensor_t *o)
{
    return ghc_tensor_ndim(o) == 3 ? ghc_tensor_row_stride(o) : ghc_tensor_dim(o, 2) * ghc_tensor_dim(o, 3);
}

}   /* namespace */

extern "C" int ghc_k_attention_fwd(ghc_tensor_t *o, ghc_tensor_t *lse, const ghc_tensor_t *q, const ghc_tensor_t *k,
                                   const ghc_tensor_t *v, float scale, void *stream)
{
    cudaStream_t st = (cudaStream_t)stream;
    const int B = (int)ghc_tensor_dim(q, 0), Lq = (int)ghc_tensor_dim(q, 1), H = (int)ghc_tensor_dim(q, 2),
              D = (int)ghc_tensor_dim(q, 3), Lk = (int)ghc_tensor_dim(k, 1);
    if ((int64_t)B * Lq * H == 0)
        return 0;
    device_guard dg(ghc_tensor_device(q));
    if (dg.err != cudaSuccess)
        return dg.err;
    const bool bf = ghc_tensor_dtype(q) == GHC_DTYPE_BF16;
    const int64_t ldo = attn_ldo(o);
    const bool tc = bf && Lk > 0 && scale > 0.0f && (D == 16 || D == 32 || D == 64 || D == 128) && aligned16(ghc_tensor_cdata(q)) &&
                    aligned16(ghc_tensor_cdata(k)) && aligned16(ghc_tensor_cdata(v)) && aligned16(ghc_tensor_data(o)) &&
                    ldo % 8 == 0 && fwd_smem_for(D) <= smem_optin();
    if (tc) {
        fwd_params p;
        p.q = (const bf16 *)ghc_tensor_cdata(q);
        p.k = (const bf16 *)ghc_tensor_cdata(k);
        p.v = (const bf16 *)ghc_tensor_cdata(v);
        p.o = (bf16 *)ghc_tensor_data(o);
        p.ldo = ldo;
        p.lse = (float *)ghc_tensor_data(lse);
        p.B = B;
        p.H = H;
        p.Lq = Lq;
        p.Lk = Lk;
        p.scale = scale;
        p.scale_log2 = scale * kLog2e;
        if (D == 128 && is_sm90() && kFwgSmem <= smem_optin())
            return launch_fwd_wg(p, st);
        switch (D) {
        case 16: return launch_fwd_tc<16>(p, st);
        case 32: return launch_fwd_tc<32>(p, st);
        case 64: return launch_fwd_tc<64>(p, st);
        default: return launch_fwd_tc<128>(p, st);
        }
    }
    const unsigned blocks = gen_blocks((int64_t)B * Lq * H);
    if (bf)
        attn_fwd_generic<bf16><<<blocks, kGenWarps * 32, 0, st>>>(
            (const bf16 *)ghc_tensor_cdata(q), (const bf16 *)ghc_tensor_cdata(k), (const bf16 *)ghc_tensor_cdata(v),
            (bf16 *)ghc_tensor_data(o), ldo, (float *)ghc_tensor_data(lse), B, H, Lq, Lk, D, scale);
    else
        attn_fwd_generic<float><<<blocks, kGenWarps * 32, 0, st>>>(
            (const float *)ghc_tensor_cdata(q), (const float *)ghc_tensor_cdata(k), (const float *)ghc_tensor_cdata(v),
            (float *)ghc_tensor_data(o), ldo, (float *)ghc_tensor_data(lse), B, H, Lq, Lk, D, scale);
    return (int)cudaGetLastError();
}

extern "C" int ghc_k_attention_bwd(ghc_tensor_t *dq, ghc_tensor_t *dk, ghc_tensor_t *dv, const ghc_tensor_t *dout,
                                   const ghc_tensor_t *q, const ghc_tensor_t *k, const ghc_tensor_t *v,
                                   const ghc_tensor_t *o, const ghc_tensor_t *lse, float scale, void *stream)
{
    cudaStream_t st = (cudaStream_t)stream;
    const int B = (int)ghc_tensor_dim(q, 0), Lq = (int)ghc_tensor_dim(q, 1), H = (int)ghc_tensor_dim(q, 2),
              D = (int)ghc_tensor_dim(q, 3), Lk = (int)ghc_tensor_dim(k, 1);
    const int dev = ghc_tensor_device(q);
    device_guard dg(dev);
    if (dg.err != cudaSuccess)
        return dg.err;
    const bool bf = ghc_tensor_dtype(q) == GHC_DTYPE_BF16;
    cudaError_t e;
    if ((int64_t)B * H * Lq == 0 || Lk == 0) {
        /* no queries, or no keys: every gradient is zero */
        if (dq && ghc_tensor_nbytes(dq) && (e = cudaMemsetAsync(ghc_tensor_data(dq), 0, ghc_tensor_nbytes(dq), st)))
            return e;
        if (dk && ghc_tensor_nbytes(dk) && (e = cudaMemsetAsync(ghc_tensor_data(dk), 0, ghc_tensor_nbytes(dk), st)))
            return e;
        if (dv && ghc_tensor_nbytes(dv) && (e = cudaMemsetAsync(ghc_tensor_data(dv), 0, ghc_tensor_nbytes(dv), st)))
            return e;
        return 0;
    }
    /* tensor-core path: 4 = wgmma (Hopper, Dh 128); 2 = FA2-style, big block; 1 = the older
     * 16-keys-a-warp kernel (Dh 32, or where the big block does not fit); 3 = FA2-style, small
     * block (sm_121's 99 KB); 0 = the fp32 path */
    int tc = 0;
    if (bf && (D == 32 || D == 64 || D == 128) && aligned16(ghc_tensor_cdata(q)) && aligned16(ghc_tensor_cdata(k)) &&
        aligned16(ghc_tensor_cdata(v)) && aligned16(ghc_tensor_cdata(dout)) && (!dq || aligned16(ghc_tensor_data(dq))) &&
        (!dk || aligned16(ghc_tensor_data(dk))) && (!dv || aligned16(ghc_tensor_data(dv)))) {
        const int optin = smem_optin();
        if (D == 128 && is_sm90() && kBwgSmem <= optin)
            tc = 4;
        else if (D != 32 && bwd2_smem_for(D, true) <= optin)
            tc = 2;
        else if (bwd_smem_for(D) <= optin)
            tc = 1;
        else if (D != 32 && bwd2_smem_for(D, false) <= optin)
            tc = 3;
    }
    const int64_t rows = (int64_t)B * Lq * H;
    const size_t dsum_bytes = ((size_t)rows * sizeof(float) + 255) & ~(size_t)255;
    const size_t acc_bytes = tc && dq ? (size_t)rows * D * sizeof(float) : 0;
    void *scr;
    if ((e = (cudaError_t)ghc_k_scratch(dev, st, dsum_bytes + acc_bytes, &scr)) != cudaSuccess)
        return e;
    float *dsum = (float *)scr;
    float *acc = (float *)((char *)scr + dsum_bytes);
    const unsigned blocks = gen_blocks(rows);
    const int64_t ldo = attn_ldo(o);
    if (tc && aligned16(ghc_tensor_cdata(o)) && ldo % 8 == 0) {
        /* D and the zeroed dQ accumulator in one pass, 16-byte loads */
        const int64_t nthr = rows * (D / 8);
        const unsigned pb = (unsigned)((nthr + 255) / 256);
        float4 *acc4 = dq ? (float4 *)acc : NULL;
        const bf16 *dob = (const bf16 *)ghc_tensor_cdata(dout), *ob = (const bf16 *)ghc_tensor_cdata(o);
        switch (D) {
        case 32: attn_bwd_prep_bf16<32><<<pb, 256, 0, st>>>(dob, ob, ldo, dsum, acc4, rows, H, Lq); break;
        case 64: attn_bwd_prep_bf16<64><<<pb, 256, 0, st>>>(dob, ob, ldo, dsum, acc4, rows, H, Lq); break;
        default: attn_bwd_prep_bf16<128><<<pb, 256, 0, st>>>(dob, ob, ldo, dsum, acc4, rows, H, Lq); break;
        }
        if ((e = cudaGetLastError()) != cudaSuccess)
            return e;
    } else {
        if (bf)
            attn_bwd_dsum<bf16><<<blocks, kGenWarps * 32, 0, st>>>((const bf16 *)ghc_tensor_cdata(dout),
                                                                   (const bf16 *)ghc_tensor_cdata(o), ldo, dsum, B, H, Lq,
                                                                   D);
        else
            attn_bwd_dsum<float><<<blocks, kGenWarps * 32, 0, st>>>((const float *)ghc_tensor_cdata(dout),
                                                                    (const float *)ghc_tensor_cdata(o), ldo, dsum, B, H,
                                                                    Lq, D);
        if ((e = cudaGetLastError()) != cudaSuccess)
            return e;
        if (tc && dq && (e = cudaMemsetAsync(acc, 0, acc_bytes, st)) != cudaSuccess)
            return e;
    }

    if (tc) {
        bwd_params p;
        p.q = (const bf16 *)ghc_tensor_cdata(q);
        p.k = (const bf16 *)ghc_tensor_cdata(k);
        p.v = (const bf16 *)ghc_tensor_cdata(v);
        p.dout = (const bf16 *)ghc_tensor_cdata(dout);
        p.lse = (const float *)ghc_tensor_cdata(lse);
        p.dsum = dsum;
        p.dq_acc = dq ? acc : NULL;
        p.dk = dk ? (bf16 *)ghc_tensor_data(dk) : NULL;
        p.dv = dv ? (bf16 *)ghc_tensor_data(dv) : NULL;
        p.B = B;
        p.H = H;
        p.Lq = Lq;
        p.Lk = Lk;
        p.scale = scale;
        p.scale_log2 = scale * kLog2e;
        if (tc == 4)
            e = launch_bwd_wg<kBwgPipe>(p, st);
        else if (tc == 2)
            e = D == 64 ? launch_bwd2_tc<64, 128, true, kBwd2Split>(p, st) : launch_bwd2_tc<128, 128, true, kBwd2Split>(p, st);
        else if (tc == 3)
            e = D == 64 ? launch_bwd2_tc<64, 64, false, kBwd2Split>(p, st) : launch_bwd2_tc<128, 64, false, kBwd2Split>(p, st);
        else
            switch (D) {
            case 32: e = launch_bwd_tc<32, 64>(p, st); break;
            case 64: e = launch_bwd_tc<64, 64>(p, st); break;
            default: e = launch_bwd_tc<128, 64>(p, st); break;
            }
        if (e != cudaSuccess || !dq)
            return e;
        const int64_t n4 = rows * D / 4;
        unsigned cb = (unsigned)((n4 + 255) / 256 < 65536 ? (n4 + 255) / 256 : 65536);
        dq_convert_bf16<<<cb, 256, 0, st>>>((bf16 *)ghc_tensor_data(dq), (const float4 *)acc, n4, scale);
        return (int)cudaGetLastError();
    }

    if (bf) {
        if (dq)
            attn_bwd_dq_generic<bf16><<<blocks, kGenWarps * 32, 0, st>>>(
            (bf16 *)ghc_tensor_data(dq), (const bf16 *)ghc_tensor_cdata(dout), (const bf16 *)ghc_tensor_cdata(q),
            (const bf16 *)ghc_tensor_cdata(k), (const bf16 *)ghc_tensor_cdata(v), (const float *)ghc_tensor_cdata(lse),
            dsum, B, H, Lq, Lk, D, scale);
        if ((e = cudaGetLastError()) != cudaSuccess)
            return e;
        if (dk || dv)
            attn_bwd_dkv_generic<bf16><<<gen_blocks((int64_t)B * Lk * H), kGenWarps * 32, 0, st>>>(
                dk ? (bf16 *)ghc_tensor_data(dk) : NULL, dv ? (bf16 *)ghc_tensor_data(dv) : NULL,
                (const bf16 *)ghc_tensor_cdata(dout), (const bf16 *)ghc_tensor_cdata(q),
                (const bf16 *)ghc_tensor_cdata(k), (const bf16 *)ghc_tensor_cdata(v),
                (const float *)ghc_tensor_cdata(lse), dsum, B, H, Lq, Lk, D, scale);
    } else {
        if (dq)
            attn_bwd_dq_generic<float><<<blocks, kGenWarps * 32, 0, st>>>(
            (float *)ghc_tensor_data(dq), (const float *)ghc_tensor_cdata(dout), (const float *)ghc_tensor_cdata(q),
            (const float *)ghc_tensor_cdata(k), (const float *)ghc_tensor_cdata(v),
            (const float *)ghc_tensor_cdata(lse), dsum, B, H, Lq, Lk, D, scale);
        if ((e = cudaGetLastError()) != cudaSuccess)
            return e;
        if (dk || dv)
            attn_bwd_dkv_generic<float><<<gen_blocks((int64_t)B * Lk * H), kGenWarps * 32, 0, st>>>(
                dk ? (float *)ghc_tensor_data(dk) : NULL, dv ? (float *)ghc_tensor_data(dv) : NULL,
                (const float *)ghc_tensor_cdata(dout), (const float *)ghc_tensor_cdata(q),
                (const float *)ghc_tensor_cdata(k), (const float *)ghc_tensor_cdata(v),
                (const float *)ghc_tensor_cdata(lse), dsum, B, H, Lq, Lk, D, scale);
    }
    return (int)cudaGetLastError();
}
