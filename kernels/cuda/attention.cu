/* attention.cu: non-causal attention forward and backward with the log-sum-exp
 * (ghc_k_attention_fwd, ghc_k_attention_bwd; contract in ops.h).
 *
 * Layout: q, o, dq [B, Lq, H, Dh]; k, v, dk, dv [B, Lk, H, Dh] (token-major, heads
 * interleaved: one token's rows of all heads are adjacent, so a head's rows are H*Dh apart);
 * lse [B, H, Lq] f32, natural log of sum_j exp(scale q.k_j).
 *
 * Two paths:
 *  - bf16 with Dh in {16, 32, 64, 128} (backward: {32, 64, 128}) and 16-byte aligned rows:
 *    FlashAttention-2 style tiled kernels on the tensor cores (mma.sync m16n8k16 bf16 with
 *    fp32 accumulation, ldmatrix from padded shared memory, cp.async loads). Softmax
 *    statistics in fp32, P rounded to bf16 for the P V product as in FlashAttention.
 *    Forward: a block of 4 warps takes 128 query rows (32 per warp) and walks the keys in
 *    tiles of 64, K and V loads overlapped with the math (FA2's schedule).
 *    Backward: D = rowsum(dO o O) first; then a block of 8 warps owns 128 keys (16 per warp),
 *    keeps dK and dV in registers, walks the queries in tiles of 64 (Q, dO double-buffered)
 *    and adds dQ in fp32 with 16-byte atomics into a scratch accumulator, converted to dq's
 *    dtype at the end. S^T = K Q^T is computed (keys as rows) so that P^T and dS^T feed the dV
 *    and dK products straight from registers; dS goes through shared memory once for dQ.
 *    Exponentials are ex2.approx on scores pre-scaled by scale log2(e). Figures against
 *    FlashAttention-2 and cuDNN: bench/README.md.
 *  - everything else (f32, other head sizes, unaligned data): a simple fp32 path, one warp per
 *    row, online softmax; the backward computes dq per query row and dk, dv per key row, so
 *    it needs no atomics.
 *
 * Scratch (the fp32 dQ accumulator and D) is kept per (device, stream), allocated at first use
 * and grown when a larger problem comes; never per call. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <mutex>
#include <stdint.h>

#include "kernels.h"

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

__device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

/* ldmatrix from a 32-bit shared-memory address (bytes); constant offsets fold into the
 * instruction, which keeps the address registers few. */
__device__ __forceinline__ void ldsm_x4(uint32_t r[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

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

/* d (16x8 f32) += a (16x16 bf16, row) b (16x8 bf16, col). */
__device__ __forceinline__ void mma16816(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
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
                bf16 *og = p.o + ((int64_t)b * p.Lq + row) * row_stride + (int64_t)h * D;
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
__global__ void attn_fwd_generic(const T *q, const T *k, const T *v, T *o, float *lse, int B, int H, int Lq, int Lk,
                                 int D, float scale)
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
#pragma unroll
    for (int j = 0; j < kGenJ; j++) {
        int d = lane + 32 * j;
        if (d < D)
            o[row * D + d] = from_f<T>(ov[j] * inv);
    }
    if (lane == 0)
        lse[((int64_t)b * H + h) * Lq + m] = l > 0.0f ? mx + logf(l) : -INFINITY;
}

/* D[b, h, m] = sum_d dO o O, one warp per row */
template <typename T>
__global__ void attn_bwd_dsum(const T *dout, const T *o, float *dsum, int B, int H, int Lq, int D)
{
    const int64_t row = (int64_t)blockIdx.x * kGenWarps + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= (int64_t)B * Lq * H)
        return;
    const int h = (int)(row % H);
    const int64_t bm = row / H;
    const int m = (int)(bm % Lq), b = (int)(bm / Lq);
    float s = 0.0f;
    for (int d = lane; d < D; d += 32)
        s = fmaf(to_f(dout[row * D + d]), to_f(o[row * D + d]), s);
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

/* ---- scratch ------------------------------------------------------------------------------ */

struct scratch {
    int device;
    cudaStream_t stream;
    void *ptr;
    size_t bytes;
};
std::mutex g_scratch_lock;
scratch g_scratch[32];
int g_nscratch;

/* At least `bytes` of device memory for (device, stream), reused across calls. */
cudaError_t get_scratch(int dev, cudaStream_t st, size_t bytes, void **out)
{
    std::lock_guard<std::mutex> lk(g_scratch_lock);
    scratch *s = NULL;
    for (int i = 0; i < g_nscratch; i++)
        if (g_scratch[i].device == dev && g_scratch[i].stream == st)
            s = &g_scratch[i];
    if (!s) {
        if (g_nscratch == 32)
            return cudaErrorMemoryAllocation;
        s = &g_scratch[g_nscratch++];
        *s = scratch{ dev, st, NULL, 0 };
    }
    if (s->bytes < bytes) {
        cudaError_t e;
        if (s->ptr) {
            /* the old buffer may still be in use by work queued on this stream */
            if ((e = cudaStreamSynchronize(st)) != cudaSuccess)
                return e;
            cudaFree(s->ptr);
            s->ptr = NULL;
            s->bytes = 0;
        }
        size_t grow = bytes + bytes / 8;
        if ((e = cudaMalloc(&s->ptr, grow)) != cudaSuccess) {
            cudaGetLastError();
            if ((e = cudaMalloc(&s->ptr, bytes)) != cudaSuccess)
                return e;
            grow = bytes;
        }
        s->bytes = grow;
    }
    *out = s->ptr;
    return cudaSuccess;
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


unsigned gen_blocks(int64_t rows) { return (unsigned)((rows + kGenWarps - 1) / kGenWarps); }

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
    const bool tc = bf && Lk > 0 && scale > 0.0f && (D == 16 || D == 32 || D == 64 || D == 128) && aligned16(ghc_tensor_cdata(q)) &&
                    aligned16(ghc_tensor_cdata(k)) && aligned16(ghc_tensor_cdata(v)) && aligned16(ghc_tensor_data(o)) &&
                    fwd_smem_for(D) <= smem_optin();
    if (tc) {
        fwd_params p;
        p.q = (const bf16 *)ghc_tensor_cdata(q);
        p.k = (const bf16 *)ghc_tensor_cdata(k);
        p.v = (const bf16 *)ghc_tensor_cdata(v);
        p.o = (bf16 *)ghc_tensor_data(o);
        p.lse = (float *)ghc_tensor_data(lse);
        p.B = B;
        p.H = H;
        p.Lq = Lq;
        p.Lk = Lk;
        p.scale = scale;
        p.scale_log2 = scale * kLog2e;
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
            (bf16 *)ghc_tensor_data(o), (float *)ghc_tensor_data(lse), B, H, Lq, Lk, D, scale);
    else
        attn_fwd_generic<float><<<blocks, kGenWarps * 32, 0, st>>>(
            (const float *)ghc_tensor_cdata(q), (const float *)ghc_tensor_cdata(k), (const float *)ghc_tensor_cdata(v),
            (float *)ghc_tensor_data(o), (float *)ghc_tensor_data(lse), B, H, Lq, Lk, D, scale);
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
    const bool tc = bf && (D == 32 || D == 64 || D == 128) && aligned16(ghc_tensor_cdata(q)) &&
                    aligned16(ghc_tensor_cdata(k)) && aligned16(ghc_tensor_cdata(v)) &&
                    aligned16(ghc_tensor_cdata(dout)) && (!dq || aligned16(ghc_tensor_data(dq))) &&
                    (!dk || aligned16(ghc_tensor_data(dk))) && (!dv || aligned16(ghc_tensor_data(dv))) &&
                    bwd_smem_for(D) <= smem_optin();
    const int64_t rows = (int64_t)B * Lq * H;
    const size_t dsum_bytes = ((size_t)rows * sizeof(float) + 255) & ~(size_t)255;
    const size_t acc_bytes = tc && dq ? (size_t)rows * D * sizeof(float) : 0;
    void *scr;
    if ((e = get_scratch(dev, st, dsum_bytes + acc_bytes, &scr)) != cudaSuccess)
        return e;
    float *dsum = (float *)scr;
    float *acc = (float *)((char *)scr + dsum_bytes);
    const unsigned blocks = gen_blocks(rows);
    if (bf)
        attn_bwd_dsum<bf16><<<blocks, kGenWarps * 32, 0, st>>>((const bf16 *)ghc_tensor_cdata(dout),
                                                               (const bf16 *)ghc_tensor_cdata(o), dsum, B, H, Lq, D);
    else
        attn_bwd_dsum<float><<<blocks, kGenWarps * 32, 0, st>>>((const float *)ghc_tensor_cdata(dout),
                                                                (const float *)ghc_tensor_cdata(o), dsum, B, H, Lq, D);
    if ((e = cudaGetLastError()) != cudaSuccess)
        return e;

    if (tc) {
        if (dq && (e = cudaMemsetAsync(acc, 0, acc_bytes, st)) != cudaSuccess)
            return e;
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
