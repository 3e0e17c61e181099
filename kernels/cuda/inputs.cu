/* inputs.cu: the model-input ops of ops.h (since API 14), as kernels/cpu/rope.c and
 * kernels/cpu/patch.c compute them: the sinusoidal timestep embedding (f64 angles, cos and
 * sin with CUDA's f64 functions: within a bit of f64 of the C library, so an f32 element
 * differs from the CPU's by at most 1 ulp, rarely) and the zero-padded, masked rows of a text
 * embedding (bit-identical to the CPU: loads and stores only). Small grid-stride kernels on the
 * caller's stream; no host synchronisation. */
#include "common.cuh"

/* out [B, dim] f32; one thread per (b, k < half). */
template <typename TT>
static __global__ void k_timestep_embedding(float *out, const TT *t, int64_t B, int64_t dim, bool cos_first,
                                            double max_period)
{
    const int64_t half = dim / 2, n = B * (half + dim % 2);
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, stride = (int64_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride) {
        const int64_t per = half + dim % 2, b = i / per, k = i % per;
        if (k == half) {   /* an odd dim's last column */
            out[b * dim + dim - 1] = 0.0f;
            continue;
        }
        double a = (double)ghc_ld(t, b) * pow(max_period, -(double)k / (double)half), s, c;
        sincos(a, &s, &c);
        out[b * dim + k] = (float)(cos_first ? c : s);
        out[b * dim + half + k] = (float)(cos_first ? s : c);
    }
}

extern "C" int ghc_k_timestep_embedding(ghc_tensor_t *out, const ghc_tensor_t *t, bool cos_first, double max_period,
                                        void *stream)
{
    ghc_k_device_guard guard(out);
    GHC_K_TRY(guard.err);
    cudaStream_t s = (cudaStream_t)stream;
    const int64_t B = ghc_tensor_dim(out, 0), dim = ghc_tensor_dim(out, 1), n = B * (dim / 2 + dim % 2);
    if (n == 0)
        return 0;
    float *o = (float *)ghc_tensor_data(out);
    const void *tp = ghc_tensor_cdata(t);
    return ghc_k_dispatch_float(ghc_tensor_dtype(t), [&](auto tt) {
        using TT = decltype(tt);
        k_timestep_embedding<TT><<<ghc_k_blocks(n, 128), 128, 0, s>>>(o, (const TT *)tp, B, dim, cos_first,
                                                                      max_period);
        return (int)cudaGetLastError();
    });
}

/* y [B, Ly, D] from x [B, Lx, D] and mask (B Lx elements or NULL); one thread per element of y. */
template <typename TY, typename TX, typename TM>
static __global__ void k_pad_rows(TY *y, const TX *x, const TM *mask, int64_t n, int64_t Ly, int64_t Lx, int64_t D)
{
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, stride = (int64_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride) {
        const int64_t d = i % D, row = i / D, r = row % Ly, b = row / Ly;
        bool keep = r < Lx && !(mask && ghc_ld(mask, b * Lx + r) == 0.0f);
        ghc_st(y, i, keep ? ghc_ld(x, (b * Lx + r) * D + d) : 0.0f);
    }
}

extern "C" int ghc_k_pad_rows(ghc_tensor_t *y, const ghc_tensor_t *x, const ghc_tensor_t *mask, void *stream)
{
    ghc_k_device_guard guard(y);
    GHC_K_TRY(guard.err);
    cudaStream_t s = (cudaStream_t)stream;
    const int64_t n = ghc_tensor_numel(y), Ly = ghc_tensor_dim(y, 1), D = ghc_tensor_dim(y, 2);
    const int64_t Lx = ghc_tensor_dim(x, 1);
    if (n == 0)
        return 0;
    void *yp = ghc_tensor_data(y);
    const void *xp = ghc_tensor_cdata(x), *mp = mask ? ghc_tensor_cdata(mask) : NULL;
    /* no mask: typed as f32 and NULL */
    enum ghc_dtype mdt = mask ? ghc_tensor_dtype(mask) : GHC_DTYPE_F32;
    return ghc_k_dispatch(ghc_tensor_dtype(y), [&](auto ty) {
        using TY = decltype(ty);
        return ghc_k_dispatch_float(ghc_tensor_dtype(x), [&](auto tx) {
            using TX = decltype(tx);
            return ghc_k_dispatch_float(mdt, [&](auto tm) {
                using TM = decltype(tm);
                k_pad_rows<TY, TX, TM><<<ghc_k_blocks(n, 256), 256, 0, s>>>((TY *)yp, (const TX *)xp,
                                                                            (const TM *)mp, n, Ly, Lx, D);
                return (int)cudaGetLastError();
            });
        });
    });
}
