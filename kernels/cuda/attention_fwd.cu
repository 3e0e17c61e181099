/* attention_fwd.cu: the forward on mma.sync for GPUs other than Hopper's sm_90a build (and
 * head sizes other than 128 there): bf16, Dh 16, 32, 64 or 128, 16-byte aligned rows.
 * FlashAttention-2 style: a block of 4 warps takes 128 query rows (32 per warp) and walks the
 * keys in tiles of 64, K and V loads (cp.async into padded shared memory) overlapped with the
 * math (FA2's schedule); m16n8k16 products (bf16, fp32 accumulation; ldmatrix), the online
 * softmax in fp32 with exponentials as ex2.approx on scores pre-scaled by scale log2(e). */
#include "attention_impl.cuh"   /* defines: fwd_params, load_tile, a_frag, softmax_row, scale_row */

namespace {

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
        zero(acc[mt]);
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
            zero(s[mt]);
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
            for (int r = 0; r < 2; r++)
                scale_row(acc[mt], r, softmax_row(s[mt], r, row_m[mt][r], row_l[mt][r], sl));

        /* O += P V */
#pragma unroll
        for (int kk = 0; kk < kFwdBN / 16; kk++) {
            uint32_t pa[2][4];
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
                a_frag(pa[mt], s[mt], kk);
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

}   /* namespace */

int ghc_attn::fwd_tc_smem(int D)
{
    switch (D) {
    case 16: return fwd_smem_bytes<16>();
    case 32: return fwd_smem_bytes<32>();
    case 64: return fwd_smem_bytes<64>();
    default: return fwd_smem_bytes<128>();
    }
}

template <int D>
static cudaError_t launch_fwd_tc(const fwd_params &p, cudaStream_t st)
{
    static bool attr_set[64];   /* per device */
    return launch_smem(attn_fwd_tc<D>, attr_set, dim3((p.Lq + kFwdBM - 1) / kFwdBM, p.H, p.B), kFwdThreads,
                       fwd_smem_bytes<D>(), p, st);
}

cudaError_t ghc_attn::fwd_tc_launch(const fwd_params &p, int D, cudaStream_t st)
{
    switch (D) {
    case 16: return launch_fwd_tc<16>(p, st);
    case 32: return launch_fwd_tc<32>(p, st);
    case 64: return launch_fwd_tc<64>(p, st);
    default: return launch_fwd_tc<128>(p, st);
    }
}
