/* text.cu: the text-encoder ops of ops.h (umT5) on CUDA, as kernels/cpu/text.c computes them:
 * the embedding lookup and T5's relative-position bias (loads and stores only: bit-identical to
 * the CPU; the buckets come from ghc_rel_pos_bucket on the host, once per bucket setting and
 * device, so they are the CPU's exactly), and attention with an additive bias and a key mask,
 * on one of two paths, chosen in ghc_k_attention_bias_fwd by fused_ok():
 *
 * - fused (bf16 q, k, v and o; Dh 64; the four 16-byte aligned; H and ceil(Lq / 64) at most
 *   65535; Lq, Lk below 2^30): one kernel, k_attn_bias_tc, FlashAttention-2 style on mma.sync
 *   (the tile loads, fragment layouts and products of attention_fwd.cu, from attention_impl.cuh).
 *   A block of 4 warps takes 64 query rows (16 a warp) of one head and batch entry (the grid's
 *   fastest index is the batch entry, so the blocks that read one tile of the shared bias run
 *   together and find it in L2) and reads q, k, v in place (rows of H Dh), K and V by tiles of
 *   64 keys (cp.async into padded shared memory, the next K tile loading during the softmax);
 *   S = Q K^T (bf16, fp32 accumulation), s = scale S + bias (f32, loaded from global ahead of
 *   the products), masked keys and the tail past Lk set to -inf, the online softmax in fp32
 *   (exponentials as ex2.approx on scores times log2(e); a row with no key kept so far stays at
 *   0), O += P V with P rounded to bf16 (as the GEMM path does), O / l written in bf16 (0 where
 *   every key is masked). Key tiles past the last kept key of the batch entry (padding) are not
 *   visited: their probabilities are exactly 0, so the result is the same. No scratch, no
 *   host work beyond the launch.
 * - GEMMs (everything else: f32, other head sizes, unaligned pointers), through ghc_k_gemm
 *   (cuBLASLt): Q, K and V are laid out head-major [B, H, L, Dh] in the stream's scratch (head
 *   dims and keys zero-padded to multiples of 8, so that every operand is 16-byte aligned),
 *   S = Q K^T in f32, one row kernel adds scale and bias, masks, and writes P = softmax(S) in
 *   q's dtype (statistics in f32), O = P V, and O goes back to [B, Lq, H, Dh]. The scores are
 *   made for as many batch entries at once as fit kScoreBytes.
 *
 * No host synchronisation (the GEMM path's scratch may grow, which synchronises the stream, and
 * so may the bucket table, once). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <mutex>

#include "common.cuh"   /* defines: ghc_ld, ghc_st, ghc_k_dispatch*, ghc_k_device_guard, ghc_block_sum */
#include "attention_impl.cuh"   /* defines: bf16, kLog2e, load_tile, lane_a, lane_bn, lane_bt, a_frag, pack_bf16,
                                 * zero, softmax_row, scale_row, cp_async_*; mma.cuh's ldsm_x4, mma16816 */

namespace {

/* The f32 scores of one round of batched GEMMs at most (a larger batch runs in rounds). */
constexpr size_t kScoreBytes = (size_t)256 << 20;

/* y[i, :] = table[ids[i], :]; one thread per element of y. An id outside [0, V) gives a row of
 * NaN (ops.c checks ids on the CPU only: the host cannot see device ids without a sync). */
template <typename TY, typename TT, typename TI>
__global__ void k_embedding(TY *y, const TT *table, const TI *ids, int64_t n, int64_t D, int64_t V)
{
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, stride = (int64_t)gridDim.x * blockDim.x;
    for (; i < n * D; i += stride) {
        const int64_t row = i / D, d = i % D, id = (int64_t)ids[row];
        ghc_st(y, i, id >= 0 && id < V ? ghc_ld(table, id * D + d) : __int_as_float(0x7fc00000));
    }
}

/* bias[h, i, j] = table[bucket[j - i + Lq - 1], h]; one thread per element. */
template <typename TT>
__global__ void k_rel_pos_bias(float *bias, const TT *table, const int32_t *bucket, int64_t H, int64_t Lq, int64_t Lk)
{
    int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, stride = (int64_t)gridDim.x * blockDim.x;
    for (; e < H * Lq * Lk; e += stride) {
        const int64_t j = e % Lk, i = (e / Lk) % Lq, h = e / (Lk * Lq);
        bias[e] = ghc_ld(table, (int64_t)bucket[j - i + Lq - 1] * H + h);
    }
}

/* The buckets of the relative positions r in [-R, R] on a device for one (num_buckets,
 * max_distance, bidirectional), from ghc_rel_pos_bucket on the host (so exactly the CPU's: the
 * device's logf may differ from the C library's in the last bit, which moves a bucket edge), made
 * once and kept: a layer after the first finds its table here, and no op waits for a copy.
 * R grows (to the next power of two, at least 4096) when a longer sequence comes; the old table
 * is then freed after a device synchronisation (once per growth). */
struct bucket_table {
    int dev;
    int32_t num_buckets, max_distance;
    bool bidirectional;
    int64_t R;
    int32_t *d;   /* 2R + 1 entries, d[R + r] */
};
std::mutex g_bucket_lock;
bucket_table g_buckets[16];
int g_nbuckets;

/* *out points at bucket(r) for r = -(Lq - 1) on the device (so out[j - i + Lq - 1]). Returns 0
 * or a cudaError_t. */
int buckets(int dev, int32_t nb, int32_t maxd, bool bidir, int64_t Lq, int64_t Lk, const int32_t **out)
{
    std::lock_guard<std::mutex> lk(g_bucket_lock);
    const int64_t need = Lq > Lk ? Lq : Lk;
    bucket_table *t = NULL;
    for (int i = 0; i < g_nbuckets && !t; i++) {
        bucket_table &c = g_buckets[i];
        if (c.dev == dev && c.num_buckets == nb && c.max_distance == maxd && c.bidirectional == bidir)
            t = &c;
    }
    if (!t || t->R < need) {
        int64_t R = 4096;
        while (R < need)
            R *= 2;
        int32_t *host = (int32_t *)malloc((size_t)(2 * R + 1) * sizeof(int32_t)), *d = NULL;
        if (!host)
            return (int)cudaErrorMemoryAllocation;
        for (int64_t r = -R; r <= R; r++)
            host[r + R] = ghc_rel_pos_bucket(r, nb, maxd, bidir);
        cudaError_t e = cudaMalloc(&d, (size_t)(2 * R + 1) * sizeof(int32_t));
        if (e == cudaSuccess)
            e = cudaMemcpy(d, host, (size_t)(2 * R + 1) * sizeof(int32_t), cudaMemcpyHostToDevice);
        free(host);
        if (e != cudaSuccess) {
            cudaFree(d);
            return (int)e;
        }
        if (t) {   /* an older, shorter table: work queued on any stream may still read it */
            if ((e = cudaDeviceSynchronize()) != cudaSuccess) {
                cudaFree(d);
                return (int)e;
            }
            cudaFree(t->d);
        } else if (g_nbuckets < (int)(sizeof(g_buckets) / sizeof(g_buckets[0]))) {
            t = &g_buckets[g_nbuckets++];
        } else {   /* full: replace the oldest after the device's work */
            if ((e = cudaDeviceSynchronize()) != cudaSuccess) {
                cudaFree(d);
                return (int)e;
            }
            t = &g_buckets[0];
            cudaFree(t->d);
        }
        *t = bucket_table{ dev, nb, maxd, bidir, R, d };
    }
    *out = t->d + (t->R - (Lq - 1));
    return 0;
}

/* Between the token-major [B, L, H, Dh] of the op and the head-major [B, H, Lp, Dp] of the GEMMs,
 * whose rows (Lp >= L) and head dims (Dp >= Dh) are padded with zeros; raw elements of `T` (4
 * or 2 bytes). to_heads: one thread per element of the padded dst; back: one per element of the
 * token-major dst. */
template <typename T>
__global__ void k_heads(T *dst, const T *src, int64_t B, int64_t L, int64_t H, int64_t Dh, int64_t Lp, int64_t Dp,
                        bool to_heads)
{
    const int64_t n = to_heads ? B * H * Lp * Dp : B * L * H * Dh;
    int64_t x = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, stride = (int64_t)gridDim.x * blockDim.x;
    for (; x < n; x += stride) {
        if (to_heads) {   /* dst [B, H, Lp, Dp] */
            const int64_t e = x % Dp, r = x / Dp, l = r % Lp, h = (r / Lp) % H, b = r / (Lp * H);
            dst[x] = l < L && e < Dh ? src[((b * L + l) * H + h) * Dh + e] : (T)0;
        } else {          /* dst [B, L, H, Dh] */
            const int64_t e = x % Dh, r = x / Dh, h = r % H, l = (r / H) % L, b = r / (H * L);
            dst[x] = src[((b * H + h) * Lp + l) * Dp + e];
        }
    }
}

GHC_D float block_max(float v, float *red)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : -INFINITY;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* One block per row of scores (rows = nb H Lq, the batch entries b0 .. b0 + nb; rows Kp >= Lk
 * apart): s = scale S + bias, masked keys left out, p = exp(s - max) / sum in TP (a row with
 * every key masked: 0), and p = 0 for the padding columns Lk .. Kp. s is written back to S, so
 * the row's second and third reads find it in the cache. */
template <typename TP, typename TM>
__global__ void k_softmax_rows(TP *p, float *S, const float *bias, const TM *mask, int64_t b0, int64_t H, int64_t Lq,
                               int64_t Lk, int64_t Kp, float scale)
{
    __shared__ float red[32];
    const int64_t row = blockIdx.x, i = row % Lq, h = (row / Lq) % H, b = b0 + row / (Lq * H);
    float *s = S + row * Kp;
    const float *bi = bias ? bias + (h * Lq + i) * Lk : NULL;
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < Lk; j += blockDim.x) {
        float v = -INFINITY;
        if (!(mask && ghc_ld(mask, b * Lk + j) == 0.0f))
            v = s[j] * scale + (bi ? bi[j] : 0.0f);
        s[j] = v;
        m = fmaxf(m, v);
    }
    m = block_max(m, red);
    float sum = 0.0f;
    if (m > -INFINITY)
        for (int64_t j = threadIdx.x; j < Lk; j += blockDim.x)
            sum += s[j] == -INFINITY ? 0.0f : expf(s[j] - m);
    sum = ghc_block_sum(sum, red);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    for (int64_t j = threadIdx.x; j < Kp; j += blockDim.x)
        ghc_st(p + row * Kp, j, j >= Lk || s[j] == -INFINITY ? 0.0f : expf(s[j] - m) * inv);
}

/* Bytes rounded up to 256 (each scratch region starts aligned for any access). */
size_t round256(size_t n) { return (n + 255) & ~(size_t)255; }

/* A tensor over device memory; NULL on error (the core has the message). */
ghc_tensor_t *wrap3(ghc_core_t *core, enum ghc_dtype dt, int64_t a, int64_t b, int64_t c, int dev, void *p)
{
    const int64_t shape[3] = { a, b, c };
    return ghc_tensor_wrap(core, dt, 3, shape, dev, p);
}

template <typename T>
int launch_heads(void *dst, const void *src, int64_t B, int64_t L, int64_t H, int64_t Dh, int64_t Lp, int64_t Dp,
                 bool to_heads, cudaStream_t st)
{
    const int64_t n = to_heads ? B * H * Lp * Dp : B * L * H * Dh;
    k_heads<T><<<ghc_k_blocks(n, 256), 256, 0, st>>>((T *)dst, (const T *)src, B, L, H, Dh, Lp, Dp, to_heads);
    return (int)cudaGetLastError();
}

int heads(enum ghc_dtype dt, void *dst, const void *src, int64_t B, int64_t L, int64_t H, int64_t Dh, int64_t Lp,
          int64_t Dp, bool to_heads, cudaStream_t st)
{
    if (dt == GHC_DTYPE_F32)
        return launch_heads<uint32_t>(dst, src, B, L, H, Dh, Lp, Dp, to_heads, st);
    return launch_heads<uint16_t>(dst, src, B, L, H, Dh, Lp, Dp, to_heads, st);
}

int64_t round8(int64_t n) { return (n + 7) / 8 * 8; }

/* ---- the fused path: bf16, Dh 64 -------------------------------------------------------------- */

constexpr int kFusedBM = 64, kFusedBN = 64, kFusedD = 64, kFusedWarps = 4, kFusedThreads = kFusedWarps * 32;

struct bias_attn_params {
    const bf16 *q, *k, *v;
    bf16 *o;                  /* [B, Lq, H, Dh] */
    const float *bias;        /* [H, Lq, Lk] or NULL */
    const void *mask;         /* B Lk elements of mask_dt, or NULL */
    enum ghc_dtype mask_dt;
    int H, Lq, Lk;
    float scale;
};

/* Whether key i of a mask of any float dtype is kept: not exactly 0 (NaN is kept, as the CPU's
 * `== 0` test says). */
GHC_D bool key_kept(const void *m, enum ghc_dtype dt, int64_t i)
{
    float x;
    switch (dt) {
    case GHC_DTYPE_BF16:    x = ghc_ld((const ghc_bf16 *)m, i); break;
    case GHC_DTYPE_F16:     x = ghc_ld((const ghc_f16 *)m, i); break;
    case GHC_DTYPE_F8_E4M3: x = ghc_ld((const ghc_e4m3 *)m, i); break;
    case GHC_DTYPE_F8_E5M2: x = ghc_ld((const ghc_e5m2 *)m, i); break;
    default:                x = ((const float *)m)[i]; break;
    }
    return !(x == 0.0f);
}

/* One block per (batch entry b = blockIdx.x, 64 query rows from m0 = 64 blockIdx.y, head h =
 * blockIdx.z); warp w takes rows m0 + 16 w .. + 15, each thread rows r0 = m0 + 16 w + g and
 * r0 + 8 (g = lane / 4) at the columns 2 t, 2 t + 1 of each 8-key slice (t = lane % 4). */
__global__ void __launch_bounds__(kFusedThreads) k_attn_bias_tc(const bias_attn_params p)
{
    constexpr int D = kFusedD, S = D + 8;   /* shared rows of D + 8: ldmatrix without conflicts */
    constexpr int NT = kFusedBN / 8, DT = D / 8;
    __shared__ __align__(16) unsigned char smem[(kFusedBM + 2 * kFusedBN) * S * 2];
    __shared__ bool keep[kFusedBN];        /* the current tile's keys: kept and before Lk */
    __shared__ int last_of[kFusedWarps];

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int b = blockIdx.x, m0 = blockIdx.y * kFusedBM, h = blockIdx.z;
    const int64_t rs = (int64_t)p.H * D;   /* elements between tokens */
    const bf16 *kg = p.k + (int64_t)b * p.Lk * rs + (int64_t)h * D;
    const bf16 *vg = p.v + (int64_t)b * p.Lk * rs + (int64_t)h * D;
    const uint32_t base = smem_addr(smem);   /* Q at 0, K and V at constant offsets */
    constexpr uint32_t oK = kFusedBM * S * 2, oV = (kFusedBM + kFusedBN) * S * 2;
    const uint32_t aQ = base + lane_a(lane, S) + warp * 16 * S * 2;
    const uint32_t aK = base + oK + lane_bn(lane, S);
    const uint32_t aV = base + oV + lane_bt(lane, S);

    load_tile<kFusedBM, D, kFusedThreads>(base, p.q + ((int64_t)b * p.Lq + m0) * rs + (int64_t)h * D, rs,
                                          p.Lq - m0, tid);
    load_tile<kFusedBN, D, kFusedThreads>(base + oK, kg, rs, p.Lk, tid);
    cp_async_commit();

    /* the keys to visit: up to the last kept one (the rest, padding, would add exact zeros) */
    const int64_t mb = (int64_t)b * p.Lk;
    int kend = p.Lk;
    if (p.mask) {
        int last = -1;
        for (int j = tid; j < p.Lk; j += kFusedThreads)
            if (key_kept(p.mask, p.mask_dt, mb + j))
                last = j;
        last = __reduce_max_sync(0xffffffffu, last);
        if (lane == 0)
            last_of[warp] = last;
        __syncthreads();
        for (int w = 0; w < kFusedWarps; w++)
            last = max(last, last_of[w]);
        kend = last + 1;
    }
    const int nblocks = (kend + kFusedBN - 1) / kFusedBN;

    const int r0 = m0 + warp * 16 + g;
    const float *brow[2];                  /* this thread's two rows of the bias (NULL: none) */
#pragma unroll
    for (int r = 0; r < 2; r++)
        brow[r] = p.bias && r0 + 8 * r < p.Lq ? p.bias + ((int64_t)h * p.Lq + r0 + 8 * r) * p.Lk : NULL;
    float acc[DT][4];
    float row_m[2] = { -INFINITY, -INFINITY }, row_l[2] = { 0.0f, 0.0f };
    uint32_t qa[D / 16][4];                /* this warp's Q rows as A fragments, loaded once */
    zero(acc);

    for (int j = 0; j < nblocks; j++) {
        const int n0 = j * kFusedBN;
        cp_async_wait_all();
        __syncthreads();                   /* K_j (and Q) here; every warp is done with V_{j-1}, keep */
        load_tile<kFusedBN, D, kFusedThreads>(base + oV, vg + (int64_t)n0 * rs, rs, p.Lk - n0, tid);
        cp_async_commit();
        if (j == 0) {
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++)
                ldsm_x4(qa[kk], aQ + kk * 16 * 2);
        }
        if (tid < kFusedBN)
            keep[tid] = n0 + tid < kend && (!p.mask || key_kept(p.mask, p.mask_dt, mb + n0 + tid));
        /* the bias of this thread's scores, loaded ahead of the products */
        float bv[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int col = n0 + nt * 8 + 2 * t + (e & 1);
                bv[nt][e] = brow[e >> 1] && col < p.Lk ? brow[e >> 1][col] : 0.0f;
            }

        float s[NT][4];
        zero(s);
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++)
#pragma unroll
            for (int np = 0; np < NT / 2; np++) {
                uint32_t kb[4];
                ldsm_x4(kb, aK + (np * 16 * S + kk * 16) * 2);
                mma16816(s[2 * np], qa[kk], kb[0], kb[1]);
                mma16816(s[2 * np + 1], qa[kk], kb[2], kb[3]);
            }

        cp_async_wait_all();
        __syncthreads();                   /* V_j and keep here; every warp is done with K_j */
        if (j + 1 < nblocks) {
            load_tile<kFusedBN, D, kFusedThreads>(base + oK, kg + (int64_t)(n0 + kFusedBN) * rs, rs,
                                                  p.Lk - n0 - kFusedBN, tid);
            cp_async_commit();
        }

        /* s = scale S + bias as the CPU rounds it (product, then sum); masked and past Lk: -inf */
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                s[nt][e] = keep[nt * 8 + 2 * t + (e & 1)] ? __fadd_rn(__fmul_rn(s[nt][e], p.scale), bv[nt][e])
                                                          : -INFINITY;
        /* the online softmax (exponentials in base 2 of the scores times log2 e); a row with no
         * key kept so far (its max still -inf) gets p = 0, not softmax_row's NaN */
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float corr = softmax_row(s, r, row_m[r], row_l[r], kLog2e);
            if (row_m[r] == -INFINITY) {
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
                    s[nt][2 * r] = s[nt][2 * r + 1] = 0.0f;
                corr = 1.0f;
                row_l[r] = 0.0f;
            }
            scale_row(acc, r, corr);
        }

        /* O += P V, P in bf16 */
#pragma unroll
        for (int kk = 0; kk < kFusedBN / 16; kk++) {
            uint32_t pa[4];
            a_frag(pa, s, kk);
#pragma unroll
            for (int dp = 0; dp < D / 16; dp++) {
                uint32_t vb[4];
                ldsm_x4_t(vb, aV + (kk * 16 * S + dp * 16) * 2);
                mma16816(acc[2 * dp], pa, vb[0], vb[1]);
                mma16816(acc[2 * dp + 1], pa, vb[2], vb[3]);
            }
        }
    }
    cp_async_wait_all();                   /* no copy outstanding at exit (nblocks 0) */

    /* O = acc / l (0 where no key is kept) */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float l = row_l[r];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        const int row = r0 + 8 * r;
        if (row < p.Lq) {
            bf16 *og = p.o + ((int64_t)b * p.Lq + row) * rs + (int64_t)h * D;
#pragma unroll
            for (int dt = 0; dt < DT; dt++)
                *reinterpret_cast<uint32_t *>(og + dt * 8 + 2 * t) =
                    pack_bf16(acc[dt][2 * r] * inv, acc[dt][2 * r + 1] * inv);
        }
    }
}

/* Whether the fused kernel takes the op (the header says when). */
bool fused_ok(const ghc_tensor_t *o, const ghc_tensor_t *q, const ghc_tensor_t *k, const ghc_tensor_t *v,
              int64_t B, int64_t Lq, int64_t H, int64_t Dh, int64_t Lk)
{
    return ghc_tensor_dtype(q) == GHC_DTYPE_BF16 && Dh == kFusedD && ghc_k_aligned(ghc_tensor_cdata(q), 16, 1) &&
           ghc_k_aligned(ghc_tensor_cdata(k), 16, 1) && ghc_k_aligned(ghc_tensor_cdata(v), 16, 1) &&
           ghc_k_aligned(ghc_tensor_cdata(o), 16, 1) && H <= 65535 && (Lq + kFusedBM - 1) / kFusedBM <= 65535 &&
           B <= INT32_MAX && Lq < ((int64_t)1 << 30) && Lk < ((int64_t)1 << 30);
}

int launch_fused(ghc_tensor_t *o, const ghc_tensor_t *q, const ghc_tensor_t *k, const ghc_tensor_t *v,
                 const ghc_tensor_t *bias, const ghc_tensor_t *key_mask, float scale, int64_t B, int64_t Lq,
                 int64_t H, int64_t Lk, cudaStream_t st)
{
    bias_attn_params p;
    p.q = (const bf16 *)ghc_tensor_cdata(q);
    p.k = (const bf16 *)ghc_tensor_cdata(k);
    p.v = (const bf16 *)ghc_tensor_cdata(v);
    p.o = (bf16 *)ghc_tensor_data(o);
    p.bias = bias ? (const float *)ghc_tensor_cdata(bias) : NULL;
    p.mask = key_mask ? ghc_tensor_cdata(key_mask) : NULL;
    p.mask_dt = key_mask ? ghc_tensor_dtype(key_mask) : GHC_DTYPE_F32;
    p.H = (int)H;
    p.Lq = (int)Lq;
    p.Lk = (int)Lk;
    p.scale = scale;
    const dim3 grid((unsigned)B, (unsigned)((Lq + kFusedBM - 1) / kFusedBM), (unsigned)H);
    k_attn_bias_tc<<<grid, kFusedThreads, 0, st>>>(p);
    return (int)cudaGetLastError();
}

}   /* namespace */

extern "C" int ghc_k_embedding(ghc_tensor_t *y, const ghc_tensor_t *table, const ghc_tensor_t *ids, void *stream)
{
    ghc_k_device_guard guard(y);
    GHC_K_TRY(guard.err);
    cudaStream_t s = (cudaStream_t)stream;
    const int64_t n = ghc_tensor_numel(ids), D = ghc_tensor_dim(table, 1), V = ghc_tensor_dim(table, 0);
    if (n == 0 || D == 0)
        return 0;
    void *yp = ghc_tensor_data(y);
    const void *tp = ghc_tensor_cdata(table), *ip = ghc_tensor_cdata(ids);
    const bool i32 = ghc_tensor_dtype(ids) == GHC_DTYPE_I32;
    return ghc_k_dispatch(ghc_tensor_dtype(y), [&](auto ty) {
        using TY = decltype(ty);
        return ghc_k_dispatch_float(ghc_tensor_dtype(table), [&](auto tt) {
            using TT = decltype(tt);
            const unsigned blocks = ghc_k_blocks(n * D, 256);
            if (i32)
                k_embedding<TY, TT, int32_t><<<blocks, 256, 0, s>>>((TY *)yp, (const TT *)tp, (const int32_t *)ip,
                                                                   n, D, V);
            else
                k_embedding<TY, TT, int64_t><<<blocks, 256, 0, s>>>((TY *)yp, (const TT *)tp, (const int64_t *)ip,
                                                                   n, D, V);
            return (int)cudaGetLastError();
        });
    });
}

extern "C" int ghc_k_rel_pos_bias(ghc_tensor_t *bias, const ghc_tensor_t *table, int32_t num_buckets,
                                  int32_t max_distance, bool bidirectional, void *stream)
{
    ghc_k_device_guard guard(bias);
    GHC_K_TRY(guard.err);
    cudaStream_t s = (cudaStream_t)stream;
    const int64_t H = ghc_tensor_dim(bias, 0), Lq = ghc_tensor_dim(bias, 1), Lk = ghc_tensor_dim(bias, 2);
    const int64_t n = H * Lq * Lk;
    if (n == 0)
        return 0;
    const int32_t *bucket = NULL;
    GHC_K_TRY((cudaError_t)buckets(ghc_tensor_device(bias), num_buckets, max_distance, bidirectional, Lq, Lk,
                                   &bucket));
    float *bp = (float *)ghc_tensor_data(bias);
    const void *tp = ghc_tensor_cdata(table);
    return ghc_k_dispatch_float(ghc_tensor_dtype(table), [&](auto tt) {
        using TT = decltype(tt);
        k_rel_pos_bias<TT><<<ghc_k_blocks(n, 256), 256, 0, s>>>(bp, (const TT *)tp, bucket, H, Lq, Lk);
        return (int)cudaGetLastError();
    });
}

extern "C" int ghc_k_attention_bias_fwd(ghc_tensor_t *o, const ghc_tensor_t *q, const ghc_tensor_t *k,
                                        const ghc_tensor_t *v, const ghc_tensor_t *bias,
                                        const ghc_tensor_t *key_mask, float scale, void *stream)
{
    ghc_k_device_guard guard(o);
    GHC_K_TRY(guard.err);
    cudaStream_t st = (cudaStream_t)stream;
    ghc_core_t *core = ghc_tensor_core(o);
    const int dev = ghc_tensor_device(o);
    const enum ghc_dtype dt = ghc_tensor_dtype(q);
    const size_t es = ghc_dtype_size(dt);
    const int64_t B = ghc_tensor_dim(q, 0), Lq = ghc_tensor_dim(q, 1), H = ghc_tensor_dim(q, 2),
                  Dh = ghc_tensor_dim(q, 3), Lk = ghc_tensor_dim(k, 1);
    if (B * Lq * H == 0)
        return 0;
    if (Lk == 0)   /* no keys: every query's O is 0 */
        return (int)cudaMemsetAsync(ghc_tensor_data(o), 0, ghc_tensor_nbytes(o), st);
    if (fused_ok(o, q, k, v, B, Lq, H, Dh, Lk))
        return launch_fused(o, q, k, v, bias, key_mask, scale, B, Lq, H, Lk, st);
    /* head dims and keys padded to multiples of 8 (zeros): every GEMM operand's rows and batch
     * strides 16-byte aligned, whatever Dh and Lk are */
    const int64_t Dp = round8(Dh), Kp = round8(Lk);
    /* batch entries per round of scores */
    const size_t row_bytes = (size_t)(H * Lq * Kp) * (sizeof(float) + es);
    int64_t nb = (int64_t)(kScoreBytes / row_bytes);
    nb = nb < 1 ? 1 : nb > B ? B : nb;
    const size_t bq = round256((size_t)(B * H * Lq * Dp) * es), bk = round256((size_t)(B * H * Kp * Dp) * es);
    const size_t bs = round256((size_t)(nb * H * Lq * Kp) * sizeof(float)), bp = round256((size_t)(nb * H * Lq * Kp) * es);
    char *scr = NULL;
    GHC_K_TRY((cudaError_t)ghc_k_scratch(dev, stream, 2 * bq + 2 * bk + bs + bp, (void **)&scr));
    char *qh = scr, *oh = scr + bq, *kh = scr + 2 * bq, *vh = scr + 2 * bq + bk, *sp = vh + bk, *pp = sp + bs;
    int rc;
    if ((rc = heads(dt, qh, ghc_tensor_cdata(q), B, Lq, H, Dh, Lq, Dp, true, st)) ||
        (rc = heads(dt, kh, ghc_tensor_cdata(k), B, Lk, H, Dh, Kp, Dp, true, st)) ||
        (rc = heads(dt, vh, ghc_tensor_cdata(v), B, Lk, H, Dh, Kp, Dp, true, st)))
        return rc;
    const enum ghc_dtype mdt = key_mask ? ghc_tensor_dtype(key_mask) : GHC_DTYPE_F32;
    const void *mp = key_mask ? ghc_tensor_cdata(key_mask) : NULL;
    const float *bias_p = bias ? (const float *)ghc_tensor_cdata(bias) : NULL;
    for (int64_t b0 = 0; b0 < B && rc == 0; b0 += nb) {
        const int64_t n = B - b0 < nb ? B - b0 : nb, rows = n * H * Lq;
        ghc_tensor_t *tq = wrap3(core, dt, n * H, Lq, Dp, dev, qh + (size_t)(b0 * H * Lq * Dp) * es);
        ghc_tensor_t *tk = wrap3(core, dt, n * H, Kp, Dp, dev, kh + (size_t)(b0 * H * Kp * Dp) * es);
        ghc_tensor_t *tv = wrap3(core, dt, n * H, Kp, Dp, dev, vh + (size_t)(b0 * H * Kp * Dp) * es);
        ghc_tensor_t *to = wrap3(core, dt, n * H, Lq, Dp, dev, oh + (size_t)(b0 * H * Lq * Dp) * es);
        ghc_tensor_t *ts = wrap3(core, GHC_DTYPE_F32, n * H, Lq, Kp, dev, sp);
        ghc_tensor_t *tp = wrap3(core, dt, n * H, Lq, Kp, dev, pp);
        if (!tq || !tk || !tv || !to || !ts || !tp) {
            rc = (int)cudaErrorMemoryAllocation;
        } else {
            struct ghc_gemm qk, pv;   /* S = Q K^T, O = P V */
            memset(&qk, 0, sizeof(qk));
            memset(&pv, 0, sizeof(pv));
            qk.trans_b = true;
            if ((rc = ghc_k_gemm(ts, tq, tk, &qk, stream)) == 0)
                rc = ghc_k_dispatch(dt, [&](auto tpp) {
                    using TP = decltype(tpp);
                    return ghc_k_dispatch_float(mdt, [&](auto tm) {
                        using TM = decltype(tm);
                        k_softmax_rows<TP, TM><<<(unsigned)rows, 256, 0, st>>>((TP *)pp, (float *)sp, bias_p,
                                                                              (const TM *)mp, b0, H, Lq, Lk, Kp, scale);
                        return (int)cudaGetLastError();
                    });
                });
            if (rc == 0)
                rc = ghc_k_gemm(to, tp, tv, &pv, stream);
        }
        ghc_tensor_free(tq);
        ghc_tensor_free(tk);
        ghc_tensor_free(tv);
        ghc_tensor_free(to);
        ghc_tensor_free(ts);
        ghc_tensor_free(tp);
    }
    if (rc)
        return rc;
    return heads(dt, ghc_tensor_data(o), oh, B, Lq, H, Dh, Lq, Dp, false, st);
}
