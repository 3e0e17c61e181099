/* reduce.cu: sums and means of all elements, column sums (bias gradients) and the MSE loss.
 * fp32 accumulation: each thread sums its grid-stride share, each block sums its threads as a
 * tree, and the block sums meet by atomicAdd in the f32 output (zeroed first on the same
 * stream); a one-thread kernel divides for means. No temporary memory, no host sync; the
 * last bits may vary between runs with the order of the atomics. */
#include <type_traits>

#include "common.cuh"

/* Blocks for a whole-tensor reduction: a few per multiprocessor, so that few atomics meet. */
static unsigned reduce_blocks(int64_t work, int threads)
{
    int64_t need = (work + threads - 1) / threads, cap = (int64_t)ghc_k_sm_count() * 4;
    return (unsigned)(need < 1 ? 1 : need > cap ? cap : need);
}

/* out[0] = out[0] / n in f64 (NaN for n = 0, like the CPU). */
static __global__ void k_divide(float *out, int64_t n)
{
    out[0] = (float)((double)out[0] / (double)n);
}

/* ---- sum and mean ------------------------------------------------------------------------- */

template <typename T>
static __global__ void k_sum(float *out, const T *x, int64_t n, bool vec)
{
    __shared__ float red[32];
    int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, stride = (int64_t)gridDim.x * blockDim.x;
    float s = 0.0f;
    int64_t done = 0;
    if (vec) {
        int64_t n4 = n / 4;
        for (int64_t g = t; g < n4; g += stride) {
            float v[4];
            ghc_ld4(x, 4 * g, v);
            s += (v[0] + v[1]) + (v[2] + v[3]);
        }
        done = 4 * n4;
    }
    for (int64_t i = done + t; i < n; i += stride)
        s += ghc_ld(x, i);
    s = ghc_block_sum(s, red);
    if (threadIdx.x == 0)
        atomicAdd(out, s);
}

extern "C" int ghc_k_sum(ghc_tensor_t *out, const ghc_tensor_t *x, bool mean, void *stream)
{
    ghc_k_device_guard guard(x);
    cudaStream_t s = (cudaStream_t)stream;
    int64_t n = ghc_tensor_numel(x);
    float *o = ghc_k_ptr<float>(out);
    const void *xp = ghc_tensor_cdata(x);
    GHC_K_TRY(cudaMemsetAsync(o, 0, sizeof(float), s));
    if (n > 0) {
        int rc = ghc_k_dispatch(ghc_tensor_dtype(x), [&](auto tx) {
            using T = decltype(tx);
            bool vec = ghc_k_aligned(xp, sizeof(T), 4);
            k_sum<T><<<reduce_blocks(vec ? n / 4 + 1 : n, 256), 256, 0, s>>>(o, (const T *)xp, n, vec);
            return (int)cudaGetLastError();
        });
        if (rc)
            return rc;
    }
    if (mean) {
        k_divide<<<1, 1, 0, s>>>(o, n);
        return (int)cudaGetLastError();
    }
    return 0;
}

/* ---- column sums -------------------------------------------------------------------------- */

/* out[j] = sum over rows of x[r, j]. Block (32, 16): 32 columns by 16 row lanes; gridDim.y
 * splits the rows further, and then (f32 out, zeroed) the blocks meet by atomicAdd. */
template <typename TX, typename TO>
static __global__ void k_sum_rows(TO *out, const TX *x, int64_t rows, int64_t D)
{
    __shared__ float red[16][33];
    int64_t j = blockIdx.x * 32 + threadIdx.x;
    float s = 0.0f;
    if (j < D)
#pragma unroll 4
        for (int64_t r = blockIdx.y * 16 + threadIdx.y; r < rows; r += 16 * (int64_t)gridDim.y)
            s += ghc_ld(x, r * D + j);
    red[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && j < D) {
        float t = 0.0f;
#pragma unroll
        for (int k = 0; k < 16; k++)
            t += red[k][threadIdx.x];
        if constexpr (std::is_same<TO, float>::value) {
            if (gridDim.y > 1) {           /* split rows: out was zeroed */
                atomicAdd(out + j, t);
                return;
            }
        }
        ghc_st(out, j, t);
    }
}

extern "C" int ghc_k_sum_rows(ghc_tensor_t *out, const ghc_tensor_t *x, void *stream)
{
    ghc_k_device_guard guard(x);
    cudaStream_t s = (cudaStream_t)stream;
    int64_t D = ghc_tensor_dim(x, -1), rows = D ? ghc_tensor_numel(x) / D : 0;
    if (D == 0)
        return 0;
    void *op = ghc_tensor_data(out);
    const void *xp = ghc_tensor_cdata(x);
    unsigned gx = (unsigned)((D + 31) / 32), gy = 1;
    if (ghc_tensor_dtype(out) == GHC_DTYPE_F32) {
        /* enough blocks to fill the device, each with at least 8 rows per thread */
        int64_t want = (4 * (int64_t)ghc_k_sm_count() + gx - 1) / gx, most = rows / (16 * 8);
        int64_t y = want < most ? want : most;
        gy = (unsigned)(y < 1 ? 1 : y > 65535 ? 65535 : y);
        if (gy > 1)
            GHC_K_TRY(cudaMemsetAsync(op, 0, (size_t)D * sizeof(float), s));
    }
    return ghc_k_dispatch(ghc_tensor_dtype(x), [&](auto tx) {
        using TX = decltype(tx);
        return ghc_k_dispatch(ghc_tensor_dtype(out), [&](auto to) {
            using TO = decltype(to);
            k_sum_rows<TX, TO><<<dim3(gx, gy), dim3(32, 16), 0, s>>>((TO *)op, (const TX *)xp, rows, D);
            return (int)cudaGetLastError();
        });
    });
}

/* ---- MSE loss ----------------------------------------------------------------------------- */

/* loss += block sums of (p - t)^2; grad = g (p - t) with g = 2 / numel (as the CPU rounds it). */
template <typename TP, typename TT, typename TG>
static __global__ void k_mse(float *loss, TG *grad, const TP *p, const TT *t, int64_t n, float g, bool vec)
{
    __shared__ float red[32];
    int64_t tid = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, stride = (int64_t)gridDim.x * blockDim.x;
    float s = 0.0f;
    int64_t done = 0;
    if (vec) {
        int64_t n4 = n / 4;
        for (int64_t k = tid; k < n4; k += stride) {
            float a[4], b[4], d[4];
            ghc_ld4(p, 4 * k, a);
            ghc_ld4(t, 4 * k, b);
#pragma unroll
            for (int u = 0; u < 4; u++)
                d[u] = a[u] - b[u];
            s += (d[0] * d[0] + d[1] * d[1]) + (d[2] * d[2] + d[3] * d[3]);
            if (grad) {
#pragma unroll
                for (int u = 0; u < 4; u++)
                    d[u] *= g;
                ghc_st4(grad, 4 * k, d);
            }
        }
        done = 4 * n4;
    }
    for (int64_t i = done + tid; i < n; i += stride) {
        float d = ghc_ld(p, i) - ghc_ld(t, i);
        s += d * d;
        if (grad)
            ghc_st(grad, i, g * d);
    }
    s = ghc_block_sum(s, red);
    if (threadIdx.x == 0)
        atomicAdd(loss, s);
}

extern "C" int ghc_k_mse_loss(ghc_tensor_t *loss, ghc_tensor_t *grad, const ghc_tensor_t *pred,
                              const ghc_tensor_t *target, void *stream)
{
    ghc_k_device_guard guard(pred);
    cudaStream_t s = (cudaStream_t)stream;
    int64_t n = ghc_tensor_numel(pred);
    float *lp = ghc_k_ptr<float>(loss);
    void *gp = grad ? ghc_tensor_data(grad) : NULL;
    const void *pp = ghc_tensor_cdata(pred), *tp = ghc_tensor_cdata(target);
    float g = n ? 2.0f / (float)n : 0.0f;
    GHC_K_TRY(cudaMemsetAsync(lp, 0, sizeof(float), s));
    if (n > 0) {
        enum ghc_dtype dg = grad ? ghc_tensor_dtype(grad) : GHC_DTYPE_F32;
        int rc = ghc_k_dispatch(ghc_tensor_dtype(pred), [&](auto tp_) {
            using TP = decltype(tp_);
            return ghc_k_dispatch(ghc_tensor_dtype(target), [&](auto tt_) {
                using TT = decltype(tt_);
                return ghc_k_dispatch(dg, [&](auto tg_) {
                    using TG = decltype(tg_);
                    bool vec = ghc_k_aligned(pp, sizeof(TP), 4) && ghc_k_aligned(tp, sizeof(TT), 4) &&
                               ghc_k_aligned(gp, sizeof(TG), 4);
                    k_mse<TP, TT, TG><<<reduce_blocks(vec ? n / 4 + 1 : n, 256), 256, 0, s>>>(
                        lp, (TG *)gp, (const TP *)pp, (const TT *)tp, n, g, vec);
                    return (int)cudaGetLastError();
                });
            });
        });
        if (rc)
            return rc;
    }
    k_divide<<<1, 1, 0, s>>>(lp, n);
    return (int)cudaGetLastError();
}
