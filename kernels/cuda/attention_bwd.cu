/* attention_bwd.cu: the backwards on mma.sync for GPUs other than Hopper's sm_90a build (and
 * head sizes other than 128 there): bf16, Dh 32, 64 or 128, 16-byte aligned rows; and what
 * every tensor-core backward (these and attention_wgmma.cu's) needs around it.
 *  - attn_bwd2_tc, Dh 64 and 128 (FlashAttention-2's layout): a block owns 128 keys (64 where
 *    shared memory is small, sm_121's 99 KB) in warps of two roles, 32 keys each: S-warps
 *    compute S^T, P^T and dV, dP-warps dP^T, dS^T (taking P^T through shared memory) and dK;
 *    dS^T goes through shared memory once for dQ, which all warps compute.
 *  - attn_bwd_tc, Dh 32 or where that does not fit: 16 keys a warp.
 * Both keep dK and dV in registers, compute S^T = K Q^T (keys as rows) so that P^T and dS^T
 * feed the dV and dK products from registers, and add dQ in fp32 with 16-byte atomics into a
 * scratch accumulator, converted to dq's dtype at the end (dq_convert_bf16); D = rowsum(dO o O)
 * comes first (attn_bwd_prep_bf16, which also zeroes the accumulator). Softmax statistics in
 * fp32, P and dS rounded to bf16 for the products as in FlashAttention; exponentials are
 * ex2.approx on scores pre-scaled by scale log2(e). */
#include "attention_impl.cuh"   /* defines: bwd_params, load_tile, a_frag, zero, store_dk_dv */

namespace {

/* ---- tensor-core backward, 16 keys a warp ---------------------------------------------------- */

constexpr int kBwdBN = 128, kBwdWarps = 8, kBwdThreads = kBwdWarps * 32;

template <int D, int BM>
constexpr int bwd_smem_bytes()
{
    return (2 * kBwdBN + 4 * BM) * (D + 8) * 2 + kBwdBN * (BM + 8) * 2 + 4 * BM * 4;
}

/* Q and dO of queries m .. m + BM - 1 (rows past Lq zero-filled) into the tiles at shared
 * addresses sq and so, NT threads; q_off: the (batch, head)'s first row. */
template <int BM, int D, int NT>
__device__ __forceinline__ void load_q_do(uint32_t sq, uint32_t so, const bwd_params &p, int64_t q_off, int m, int tid)
{
    const int64_t row_stride = (int64_t)p.H * D;
    load_tile<BM, D, NT>(sq, p.q + q_off + (int64_t)m * row_stride, row_stride, p.Lq - m, tid);
    load_tile<BM, D, NT>(so, p.dout + q_off + (int64_t)m * row_stride, row_stride, p.Lq - m, tid);
}

/* What a lane adds to dQ from its m16n8 fragment d (rows g and g + 8, columns 2t, 2t + 1):
 * lanes t and t ^ 1 swap halves, so that an even lane holds 4 adjacent columns of row g and an
 * odd one 4 of row g + 8 (one 16-byte atomic each). */
__device__ __forceinline__ float4 dq_quad(const float (&d)[4], bool odd)
{
    const float s0 = odd ? d[0] : d[2], s1 = odd ? d[1] : d[3];
    const float r0 = __shfl_xor_sync(0xffffffffu, s0, 1), r1 = __shfl_xor_sync(0xffffffffu, s1, 1);
    return odd ? make_float4(r0, r1, d[2], d[3]) : make_float4(d[0], d[1], r0, r1);
}

/* dst[0 .. 3] += v in fp32: one 16-byte atomic on sm_90 and later, else four. */
__device__ __forceinline__ void atomic_add4(float *dst, float4 v)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    atomicAdd(reinterpret_cast<float4 *>(dst), v);
#else
    atomicAdd(dst, v.x);
    atomicAdd(dst + 1, v.y);
    atomicAdd(dst + 2, v.z);
    atomicAdd(dst + 3, v.w);
#endif
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
    load_q_do<BM, D, kBwdThreads>(base + oQ, base + oO, p, q_off, 0, tid);
    cp_async_commit();
    if (tid < BM) {
        bool ok = tid < p.Lq;
        sLse[tid] = ok ? p.lse[bh * p.Lq + tid] * kLog2e : INFINITY;
        sDs[tid] = ok ? p.dsum[bh * p.Lq + tid] : 0.0f;
    }

    float dk[DT][4], dv[DT][4];
    zero(dk);
    zero(dv);

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
            const uint32_t nb = (buf ^ 1) * BM * S * 2;   /* the other buffer */
            load_q_do<BM, D, kBwdThreads>(base + oQ + nb, base + oO + nb, p, q_off, m1, tid);
            cp_async_commit();
            if (tid < BM) {
                bool ok = m1 + tid < p.Lq;
                sLse[(buf ^ 1) * BM + tid] = ok ? p.lse[bh * p.Lq + m1 + tid] * kLog2e : INFINITY;
                sDs[(buf ^ 1) * BM + tid] = ok ? p.dsum[bh * p.Lq + m1 + tid] : 0.0f;
            }
        }

        /* S^T = K_w Q^T and dP^T = V_w dO^T: 16 keys x BM queries per warp */
        float st[MT][4], dpt[MT][4];
        zero(st);
        zero(dpt);
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
            a_frag(pa, st, kk);
            a_frag(da, dpt, kk);
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
        zero(dq);
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
        /* fp32 atomics, 4 columns at a time (dq_quad: an even lane row g, an odd one g + 8) */
        const bool odd = t & 1;
        const int row = m0 + mg * 16 + g + (odd ? 8 : 0);
        float *dqg = p.dq_acc + ((int64_t)b * p.Lq + row) * row_stride + (int64_t)h * D + dg * DQ_WD + 2 * (t & 2);
#pragma unroll
        for (int nt = 0; nt < DQT; nt++) {
            const float4 v = dq_quad(dq[nt], odd);
            if (row < p.Lq)
                atomic_add4(dqg + nt * 8, v);
        }
    }

    /* dK = scale dS^T Q, dV = P^T dO */
    store_dk_dv<D>(p, dk, dv, key_row0, b, h, t);
}

/* ---- tensor-core backward, FA2-style layout (Dh 64 and 128) ---------------------------------- */

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

/* acc (dV or dK, this warp's 32 keys) += k-step kk of P^T or dS^T (pk: this thread's bf16
 * pairs, the A fragments) times dO or Q (B, transposed from the tile at shared address b2). */
template <int D, int S, int MT>
__device__ __forceinline__ void acc_step(float (&acc)[2][D / 8][4], const uint32_t (&pk)[2][MT][2], uint32_t b2, int kk)
{
#pragma unroll
    for (int dp = 0; dp < D / 16; dp++) {
        uint32_t bb[4];
        ldsm_x4_t(bb, b2 + (kk * 16 * S + dp * 16) * 2);
#pragma unroll
        for (int mt = 0; mt < 2; mt++) {
            const uint32_t af[4] = { pk[mt][2 * kk][0], pk[mt][2 * kk][1], pk[mt][2 * kk + 1][0], pk[mt][2 * kk + 1][1] };
            mma16816(acc[mt][2 * dp], af, bb[0], bb[1]);
            mma16816(acc[mt][2 * dp + 1], af, bb[2], bb[3]);
        }
    }
}

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
        load_q_do<BM, D, NT>(base + C::oQ, base + C::oO, p, q_off, 0, tid);
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
        zero(acc[mt]);

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
            load_q_do<BM, D, NT>(base + C::oQ, base + C::oO, p, q_off, m0, tid);
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
            const uint32_t nb = (buf ^ 1) * BM * S * 2;   /* the other buffer */
            load_q_do<BM, D, NT>(base + C::oQ + nb, base + C::oO + nb, p, q_off, m1, tid);
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
            zero(st[mt]);
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
                    for (int kk = hp * (NTH / 2); kk < (hp + 1) * (NTH / 2); kk++)
                        acc_step<D, S>(acc, pk, aB2 + boff, kk);
                }
            }
        }

        /* phase 2: dV += P^T dO (S-warps), dK += dS^T Q (dP-warps; done above when split) */
        if (want_acc && (sw || !SPLIT)) {
#pragma unroll
            for (int kk = 0; kk < BM / 16; kk++)
                acc_step<D, S>(acc, pk, aB2 + boff, kk);
        }

        if (want_dq) {
            __syncthreads();               /* dS^T of all BN keys here */
            /* phase 3: dQ_i += dS K over this block's keys, 32 queries x DQ_W columns per warp */
            float dq[2][DQT][4];
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
                zero(dq[mt]);
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
            /* fp32 atomics, 4 columns at a time (dq_quad: an even lane row g, an odd one g + 8) */
            const bool odd = t & 1;
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                const int row = m0 + qg * 32 + mt * 16 + g + (odd ? 8 : 0);
                float *dqg = p.dq_acc + ((int64_t)b * p.Lq + row) * row_stride + (int64_t)h * D + dg * DQ_W + 2 * (t & 2);
#pragma unroll
                for (int nt = 0; nt < DQT; nt++) {
                    const float4 v = dq_quad(dq[mt][nt], odd);
                    if (row < p.Lq)
                        atomic_add4(dqg + nt * 8, v);
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

/* ---- around every tensor-core backward: D first, dq last ------------------------------------- */

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

}   /* namespace */

void ghc_attn::bwd_prep_launch(const bf16 *dout, const bf16 *o, int64_t ldo, float *dsum, float4 *acc4, int64_t rows,
                               int H, int Lq, int D, cudaStream_t st)
{
    const int64_t nthr = rows * (D / 8);   /* D / 8 threads a row: 16-byte loads */
    const unsigned pb = (unsigned)((nthr + 255) / 256);
    switch (D) {
    case 32: attn_bwd_prep_bf16<32><<<pb, 256, 0, st>>>(dout, o, ldo, dsum, acc4, rows, H, Lq); break;
    case 64: attn_bwd_prep_bf16<64><<<pb, 256, 0, st>>>(dout, o, ldo, dsum, acc4, rows, H, Lq); break;
    default: attn_bwd_prep_bf16<128><<<pb, 256, 0, st>>>(dout, o, ldo, dsum, acc4, rows, H, Lq); break;
    }
}

/* big: 128 keys a block, Q and dO double-buffered (173 KB of shared memory at Dh 128); else 64
 * keys, one buffer (87 KB: fits the 99 KB of sm_121). */
int ghc_attn::bwd2_tc_smem(int D, bool big)
{
    if (D == 64)
        return big ? bwd2_cfg<64, 128, true>::smem : bwd2_cfg<64, 64, false>::smem;
    return big ? bwd2_cfg<128, 128, true>::smem : bwd2_cfg<128, 64, false>::smem;
}

static constexpr bool kBwd2Split = true;   /* P^T handed over in two halves (attn_bwd2_tc) */

template <int D, int BN, bool DB>
static cudaError_t launch_bwd2_tc(const bwd_params &p, cudaStream_t st)
{
    using C = bwd2_cfg<D, BN, DB>;
    static bool attr_set[64];   /* per device */
    return launch_smem(attn_bwd2_tc<D, BN, DB, kBwd2Split>, attr_set, dim3((p.Lk + BN - 1) / BN, p.H, p.B), C::NT,
                       C::smem, p, st);
}

cudaError_t ghc_attn::bwd2_tc_launch(const bwd_params &p, int D, bool big, cudaStream_t st)
{
    if (big)
        return D == 64 ? launch_bwd2_tc<64, 128, true>(p, st) : launch_bwd2_tc<128, 128, true>(p, st);
    return D == 64 ? launch_bwd2_tc<64, 64, false>(p, st) : launch_bwd2_tc<128, 64, false>(p, st);
}

int ghc_attn::bwd_tc_smem(int D)
{
    switch (D) {
    case 32: return bwd_smem_bytes<32, 64>();
    case 64: return bwd_smem_bytes<64, 64>();
    default: return bwd_smem_bytes<128, 64>();
    }
}

template <int D, int BM>
static cudaError_t launch_bwd_tc(const bwd_params &p, cudaStream_t st)
{
    static bool attr_set[64];   /* per device */
    return launch_smem(attn_bwd_tc<D, BM>, attr_set, dim3((p.Lk + kBwdBN - 1) / kBwdBN, p.H, p.B), kBwdThreads,
                       bwd_smem_bytes<D, BM>(), p, st);
}

cudaError_t ghc_attn::bwd_tc_launch(const bwd_params &p, int D, cudaStream_t st)
{
    switch (D) {
    case 32: return launch_bwd_tc<32, 64>(p, st);
    case 64: return launch_bwd_tc<64, 64>(p, st);
    default: return launch_bwd_tc<128, 64>(p, st);
    }
}

void ghc_attn::dq_convert_launch(bf16 *dq, const float4 *acc, int64_t n4, float scale, cudaStream_t st)
{
    const unsigned cb = (unsigned)((n4 + 255) / 256 < 65536 ? (n4 + 255) / 256 : 65536);
    dq_convert_bf16<<<cb, 256, 0, st>>>(dq, acc, n4, scale);
}
