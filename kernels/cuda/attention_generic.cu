/* attention_generic.cu: the simple fp32 path, for everything the tensor-core paths do not
 * take (f32 tensors, other head sizes up to 256, unaligned data): one warp a row, an online
 * softmax; the backward computes dq per query row and dk, dv per key row, so it needs no
 * atomics. bf16 or f32 in memory, fp32 arithmetic. */
#include "attention_impl.cuh"   /* defines: bf16, the launch declarations */

namespace {

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

constexpr int kGenWarps = 4;   /* warps per block; one row per warp */
constexpr int kGenJ = 8;       /* 8 x 32 lanes = 256 = the largest Dh */

/* Both sums over the warp at once (every lane gets them). */
__device__ __forceinline__ void warp_sum2(float &a, float &b)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        a += __shfl_xor_sync(0xffffffffu, a, o);
        b += __shfl_xor_sync(0xffffffffu, b, o);
    }
}

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
        warp_sum2(s, dp);
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
        warp_sum2(s, dp);
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

unsigned gen_blocks(int64_t rows) { return (unsigned)((rows + kGenWarps - 1) / kGenWarps); }

}   /* namespace */

template <typename T>
static void fwd_generic(ghc_tensor_t *o, ghc_tensor_t *lse, const ghc_tensor_t *q, const ghc_tensor_t *k,
                        const ghc_tensor_t *v, int64_t ldo, float scale, cudaStream_t st)
{
    const int B = (int)ghc_tensor_dim(q, 0), Lq = (int)ghc_tensor_dim(q, 1), H = (int)ghc_tensor_dim(q, 2),
              D = (int)ghc_tensor_dim(q, 3), Lk = (int)ghc_tensor_dim(k, 1);
    attn_fwd_generic<T><<<gen_blocks((int64_t)B * Lq * H), kGenWarps * 32, 0, st>>>(
        (const T *)ghc_tensor_cdata(q), (const T *)ghc_tensor_cdata(k), (const T *)ghc_tensor_cdata(v),
        (T *)ghc_tensor_data(o), ldo, (float *)ghc_tensor_data(lse), B, H, Lq, Lk, D, scale);
}

void ghc_attn::fwd_generic_launch(ghc_tensor_t *o, ghc_tensor_t *lse, const ghc_tensor_t *q, const ghc_tensor_t *k,
                                  const ghc_tensor_t *v, int64_t ldo, float scale, cudaStream_t st)
{
    if (ghc_tensor_dtype(q) == GHC_DTYPE_BF16)
        fwd_generic<bf16>(o, lse, q, k, v, ldo, scale, st);
    else
        fwd_generic<float>(o, lse, q, k, v, ldo, scale, st);
}

template <typename T>
static void bwd_dsum_generic(const ghc_tensor_t *dout, const ghc_tensor_t *o, int64_t ldo, const ghc_tensor_t *q,
                             float *dsum, cudaStream_t st)
{
    const int B = (int)ghc_tensor_dim(q, 0), Lq = (int)ghc_tensor_dim(q, 1), H = (int)ghc_tensor_dim(q, 2),
              D = (int)ghc_tensor_dim(q, 3);
    attn_bwd_dsum<T><<<gen_blocks((int64_t)B * Lq * H), kGenWarps * 32, 0, st>>>(
        (const T *)ghc_tensor_cdata(dout), (const T *)ghc_tensor_cdata(o), ldo, dsum, B, H, Lq, D);
}

void ghc_attn::bwd_dsum_generic_launch(const ghc_tensor_t *dout, const ghc_tensor_t *o, int64_t ldo,
                                       const ghc_tensor_t *q, float *dsum, cudaStream_t st)
{
    if (ghc_tensor_dtype(q) == GHC_DTYPE_BF16)
        bwd_dsum_generic<bf16>(dout, o, ldo, q, dsum, st);
    else
        bwd_dsum_generic<float>(dout, o, ldo, q, dsum, st);
}

template <typename T>
static cudaError_t bwd_generic(ghc_tensor_t *dq, ghc_tensor_t *dk, ghc_tensor_t *dv, const ghc_tensor_t *dout,
                               const ghc_tensor_t *q, const ghc_tensor_t *k, const ghc_tensor_t *v,
                               const ghc_tensor_t *lse, const float *dsum, float scale, cudaStream_t st)
{
    const int B = (int)ghc_tensor_dim(q, 0), Lq = (int)ghc_tensor_dim(q, 1), H = (int)ghc_tensor_dim(q, 2),
              D = (int)ghc_tensor_dim(q, 3), Lk = (int)ghc_tensor_dim(k, 1);
    if (dq)
        attn_bwd_dq_generic<T><<<gen_blocks((int64_t)B * Lq * H), kGenWarps * 32, 0, st>>>(
            (T *)ghc_tensor_data(dq), (const T *)ghc_tensor_cdata(dout), (const T *)ghc_tensor_cdata(q),
            (const T *)ghc_tensor_cdata(k), (const T *)ghc_tensor_cdata(v), (const float *)ghc_tensor_cdata(lse), dsum,
            B, H, Lq, Lk, D, scale);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return e;
    if (dk || dv)
        attn_bwd_dkv_generic<T><<<gen_blocks((int64_t)B * Lk * H), kGenWarps * 32, 0, st>>>(
            dk ? (T *)ghc_tensor_data(dk) : NULL, dv ? (T *)ghc_tensor_data(dv) : NULL,
            (const T *)ghc_tensor_cdata(dout), (const T *)ghc_tensor_cdata(q), (const T *)ghc_tensor_cdata(k),
            (const T *)ghc_tensor_cdata(v),
            (const float *)ghc_tensor_cdata(lse), dsum, B, H, Lq, Lk, D, scale);
    return cudaSuccess;
}

cudaError_t ghc_attn::bwd_generic_launch(ghc_tensor_t *dq, ghc_tensor_t *dk, ghc_tensor_t *dv,
                                         const ghc_tensor_t *dout, const ghc_tensor_t *q, const ghc_tensor_t *k,
                                         const ghc_tensor_t *v, const ghc_tensor_t *lse, const float *dsum,
                                         float scale, cudaStream_t st)
{
    if (ghc_tensor_dtype(q) == GHC_DTYPE_BF16)
        return bwd_generic<bf16>(dq, dk, dv, dout, q, k, v, lse, dsum, scale, st);
    return bwd_generic<float>(dq, dk, dv, dout, q, k, v, lse, dsum, scale, st);
}
