/* attention_wgmma.cu: the forward and backward for Hopper (compute capability 9.0, sm_90a
 * build): bf16, Dh 128, 16-byte aligned rows. The tensor-core products run as warpgroup MMAs
 * (wgmma.mma_async) with B, and for S^T and dP^T also A, read from shared memory through matrix
 * descriptors; the tiles sit in shared memory in the 128-byte-swizzled layout that wgmma reads
 * (load_tile_sw128).
 *  - Forward (attn_fwd_wg): one warpgroup per 64 query rows, keys in tiles of 64 with K and V
 *    double-buffered; S = Q K^T with Q from registers, O += P V with P from registers; two
 *    blocks per SM.
 *  - Backward (attn_bwd_wg): two warpgroups own 128 keys, walk the queries in tiles of 64 (Q,
 *    dO double-buffered); S^T, dP^T from shared memory, dV += P^T dO and dK += dS^T Q with A
 *    from registers, dQ = dS K through shared memory with fp32 atomics (attention_bwd.cu makes
 *    D and converts dQ, as for the mma.sync backwards).
 * Only the sm_90a build has the instructions (GHC_WGMMA); elsewhere these kernels trap, and the
 * dispatcher selects them only where is_sm90() says the sm_90a code is loaded. */
#include "attention_impl.cuh"   /* defines: fwd_params, bwd_params, load_tile, softmax_row, store_dk_dv */

namespace {

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

/* The accumulator's operands d[i .. i + 7] (32 registers, in the order of wgmma's accumulator
 * fragments) and the names of 32 or 64 of them in the instruction. */
#define WG_ACC4(i) "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])
#define WG_ACC(i)                                                                                       \
    WG_ACC4((i) + 0), WG_ACC4((i) + 1), WG_ACC4((i) + 2), WG_ACC4((i) + 3), WG_ACC4((i) + 4),         \
        WG_ACC4((i) + 5), WG_ACC4((i) + 6), WG_ACC4((i) + 7)
#define WG_REGS0_31                                                                                     \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                              \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define WG_REGS32_63                                                                                    \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                    \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"

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
                 WG_REGS0_31 "}, {%32, %33, %34, %35}, %36, p, 1, 1, %37;\n}\n"
                 : WG_ACC(0)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(TB), "r"(scale_d));
#endif
}

template <int TA, int TB>
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[8][4], uint64_t da, uint64_t db, int scale_d)
{
#ifdef GHC_WGMMA
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %36, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
                 WG_REGS0_31 "}, %32, %33, p, 1, 1, %34, %35;\n}\n"
                 : WG_ACC(0)
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
                 WG_REGS0_31 ", " WG_REGS32_63
                 "}, {%64, %65, %66, %67}, %68, p, 1, 1, %69;\n}\n"
                 : WG_ACC(0), WG_ACC(8)
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
            const float corr = softmax_row(s, r, row_m[r], row_l[r], sl);
            if (j > 0)
                scale_row(o, r, corr);
        }
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++)
            a_frag(pa[kk], s, kk);

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
    /* S^T = K Q^T (d = s, a = aK, b0 = kBwgOQ) or dP^T = V dO^T (dp, aV, kBwgOO) of tile j (64 keys
     * x 64 queries per warpgroup), one group */
    auto issue = [&](float (&d)[BM / 8][4], uint32_t a, uint32_t b0, int j) {
        const uint32_t bj = base + b0 + (j & 1) * kBwgQO;
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++)
            wgmma_m64n64k16_ss<0, 0>(d, sw128_desc(a + (kk >> 2) * (BN * 128) + (kk & 3) * 32, 16, 1024),
                                     sw128_desc(bj + (kk >> 2) * (BM * 128) + (kk & 3) * 32, 16, 1024), kk > 0);
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
        issue(s, aK, kBwgOQ, i);
        issue(dp, aV, kBwgOO, i);
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
        for (int kk = 0; kk < BM / 16; kk++)
            a_frag(pk[kk], pf, kk);
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
    store_dk_dv<D>(p, dk, dv, key0, b, h, t);
#else
    __trap();
#endif
}

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

}   /* namespace */

bool ghc_attn::is_sm90()
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

int ghc_attn::fwd_wg_smem() { return kFwgSmem; }

int ghc_attn::bwd_wg_smem() { return kBwgSmem; }

cudaError_t ghc_attn::fwd_wg_launch(const fwd_params &p, cudaStream_t st)
{
    static bool attr_set[64];   /* per device */
    return launch_smem(attn_fwd_wg, attr_set, dim3((p.Lq + kFwgBM - 1) / kFwgBM, p.H, p.B), kFwgThreads, kFwgSmem, p,
                       st);
}

template <bool PIPE, bool DQ>
static cudaError_t launch_bwd_wg(const bwd_params &p, cudaStream_t st)
{
    static bool attr_set[64];   /* per device */
    return launch_smem(attn_bwd_wg<PIPE, DQ>, attr_set, dim3((p.Lk + kBwgBN - 1) / kBwgBN, p.H, p.B), kBwgThreads,
                       kBwgSmem, p, st);
}

static constexpr bool kBwgPipe = true;   /* dQ's atomics after the next tile's products (attn_bwd_wg) */

cudaError_t ghc_attn::bwd_wg_launch(const bwd_params &p, cudaStream_t st)
{
    return p.dq_acc ? launch_bwd_wg<kBwgPipe, true>(p, st) : launch_bwd_wg<kBwgPipe, false>(p, st);
}
