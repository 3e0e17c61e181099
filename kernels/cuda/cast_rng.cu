/* cast_rng.cu: fills, casts between the float dtypes (optionally with stochastic rounding to
 * bf16) and uniform/normal random tensors. Bit for bit the CPU reference of
 * kernels/cpu/random.c: the same conversions (common.cuh), the same Philox stream layout
 * (element i: lane i % 4 of block offset + i / 4) and the same f64 Box-Muller, whose
 * log/sin/cos may differ from the host's libm in the last f64 ulp (so a normal can, rarely,
 * be one f32 ulp away). */
#include <type_traits>

#include "common.cuh"

/* ---- fill --------------------------------------------------------------------------------- */

/* Bytes [0, nbytes) of p, 16-byte aligned, get the 4-byte pattern `pat` repeated. */
static __global__ void k_fill_aligned(uint8_t *p, size_t nbytes, uint32_t pat)
{
    size_t n16 = nbytes / 16, t = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    uint4 v = make_uint4(pat, pat, pat, pat);
    for (size_t i = t; i < n16; i += stride)
        ((uint4 *)p)[i] = v;
    for (size_t o = n16 * 16 + t; o < nbytes; o += stride)
        p[o] = (uint8_t)(pat >> (8 * (o % 4)));
}

/* Any alignment: element by element. */
template <typename T>
static __global__ void k_fill_elems(T *p, int64_t n, T v)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        p[i] = v;
}

template <typename T>
static int fill_elems(void *p, int64_t n, T v, cudaStream_t s)
{
    k_fill_elems<T><<<ghc_k_blocks(n, 256), 256, 0, s>>>((T *)p, n, v);
    return (int)cudaGetLastError();
}

extern "C" int ghc_k_fill(ghc_tensor_t *t, double value, void *stream)
{
    ghc_k_device_guard guard(t);
    cudaStream_t s = (cudaStream_t)stream;
    int64_t n = ghc_tensor_numel(t);
    void *p = ghc_tensor_data(t);
    if (n == 0)
        return 0;
    /* the element's bits, converted on the host by the very functions the CPU path uses */
    float f = (float)value;
    uint32_t pat;
    size_t es;
    switch (ghc_tensor_dtype(t)) {
    case GHC_DTYPE_F32:     memcpy(&pat, &f, 4); es = 4; break;
    case GHC_DTYPE_BF16:    pat = ghc_f32_to_bf16(f); es = 2; break;
    case GHC_DTYPE_F16:     pat = ghc_f32_to_f16(f); es = 2; break;
    case GHC_DTYPE_F8_E4M3: pat = ghc_f32_to_e4m3(f); es = 1; break;
    case GHC_DTYPE_F8_E5M2: pat = ghc_f32_to_e5m2(f); es = 1; break;
    case GHC_DTYPE_I32:     pat = (uint32_t)(int32_t)value; es = 4; break;
    case GHC_DTYPE_U8:      pat = (uint8_t)value; es = 1; break;
    case GHC_DTYPE_BOOL:    pat = value != 0.0; es = 1; break;
    case GHC_DTYPE_I64:     return fill_elems<int64_t>(p, n, (int64_t)value, s);
    default:                return (int)cudaErrorInvalidValue;
    }
    if (es == 1)
        pat = (pat & 0xffu) * 0x01010101u;
    else if (es == 2)
        pat = (pat & 0xffffu) * 0x00010001u;
    size_t nbytes = (size_t)n * es;
    if ((uintptr_t)p % 16 == 0) {
        k_fill_aligned<<<ghc_k_blocks((int64_t)(nbytes / 16 + 1), 256), 256, 0, s>>>((uint8_t *)p, nbytes, pat);
        return (int)cudaGetLastError();
    }
    switch (es) {
    case 1:  return fill_elems<uint8_t>(p, n, (uint8_t)pat, s);
    case 2:  return fill_elems<uint16_t>(p, n, (uint16_t)pat, s);
    default: return fill_elems<uint32_t>(p, n, pat, s);
    }
}

/* ---- cast --------------------------------------------------------------------------------- */

/* v * scale as the host computes it: a NaN operand comes back quieted with its sign and
 * payload (x86 and Arm both do so), where the GPU's multiply would give its canonical NaN. */
GHC_D float scale_like_host(float v, float scale)
{
    return isnan(v) ? __uint_as_float(__float_as_uint(v) | 0x400000u) : v * scale;
}

/* f32 -> bf16 by stochastic rounding with 32 random bits (kernels/cpu/random.c). */
GHC_D uint16_t bf16_stochastic(float x, uint32_t r)
{
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return ghc_dev_f32_to_bf16(x);
    if ((u & 0x7fffffffu) == 0x7f800000u)
        return (uint16_t)(u >> 16);
    return (uint16_t)((u + (r >> 16)) >> 16);
}

template <typename TI, typename TO>
static __global__ void k_cast(TO *dst, const TI *src, int64_t n, float scale)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        ghc_st(dst, i, scale_like_host(ghc_ld(src, i), scale));
}

/* Column views (dst, src or both; round to nearest only): rows of D elements, ldd and lds
 * apart, in groups of V consecutive elements of a row (V = 4: one 16- or 8-byte access each
 * side, f32 and bf16 only), a thread per group, the groups numbered over all rows. */
template <typename TI, typename TO>
constexpr bool cast_vec4 = (std::is_same<TI, float>::value || std::is_same<TI, ghc_bf16>::value) &&
                           (std::is_same<TO, float>::value || std::is_same<TO, ghc_bf16>::value);

template <typename TI, typename TO, int V>
static __global__ void k_cast_rows(TO *dst, int64_t ldd, const TI *src, int64_t lds, int64_t rows, int64_t D,
                                   float scale)
{
    const int64_t gpr = D / V, total = rows * gpr;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r, c;
        if (total <= (int64_t)UINT32_MAX) {   /* the common case: a 32-bit division */
            const uint32_t q = (uint32_t)i / (uint32_t)gpr;
            r = q;
            c = ((int64_t)(uint32_t)i - (int64_t)q * gpr) * V;
        } else {
            r = i / gpr;
            c = (i - r * gpr) * V;
        }
        if constexpr (V == 4 && cast_vec4<TI, TO>) {
            float v[4];
            ghc_ld4(src, r * lds + c, v);
#pragma unroll
            for (int k = 0; k < 4; k++)
                v[k] = scale_like_host(v[k], scale);
            ghc_st4(dst, r * ldd + c, v);
        } else {
            ghc_st(dst, r * ldd + c, scale_like_host(ghc_ld(src, r * lds + c), scale));
        }
    }
}

/* One thread per Philox block: elements 4b .. 4b+3. */
template <typename TI>
static __global__ void k_cast_sr(ghc_bf16 *dst, const TI *src, int64_t n, float scale, uint64_t seed, uint64_t offset)
{
    int64_t nb = (n + 3) / 4;
    for (int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; b < nb; b += (int64_t)gridDim.x * blockDim.x) {
        uint32_t r[4];
        ghc_dev_philox_block(seed, offset, (uint64_t)b, r);
#pragma unroll
        for (int l = 0; l < 4; l++) {
            int64_t i = 4 * b + l;
            if (i < n)
                dst[i].bits = bf16_stochastic(scale_like_host(ghc_ld(src, i), scale), r[l]);
        }
    }
}

extern "C" int ghc_k_cast(ghc_tensor_t *dst, const ghc_tensor_t *src, float scale, const struct ghc_rng *rng,
                          void *stream)
{
    ghc_k_device_guard guard(dst);
    cudaStream_t s = (cudaStream_t)stream;
    int64_t n = ghc_tensor_numel(src);
    if (n == 0)
        return 0;
    void *d = ghc_tensor_data(dst);
    const void *p = ghc_tensor_cdata(src);
    if (rng) {
        if (ghc_tensor_dtype(dst) != GHC_DTYPE_BF16)
            return (int)cudaErrorInvalidValue;
        uint64_t seed = rng->seed, offset = rng->offset;
        return ghc_k_dispatch_float(ghc_tensor_dtype(src), [&](auto ti) {
            using TI = decltype(ti);
            k_cast_sr<TI><<<ghc_k_blocks((n + 3) / 4, 256), 256, 0, s>>>((ghc_bf16 *)d, (const TI *)p, n, scale,
                                                                        seed, offset);
            return (int)cudaGetLastError();
        });
    }
    const int64_t D = ghc_tensor_dim(src, -1), ldd = ghc_tensor_row_stride(dst), lds = ghc_tensor_row_stride(src);
    const bool views = ldd != ghc_tensor_dim(dst, -1) || lds != D;   /* ops.c: then both last dims are D */
    return ghc_k_dispatch_float(ghc_tensor_dtype(src), [&](auto ti) {
        using TI = decltype(ti);
        return ghc_k_dispatch_float(ghc_tensor_dtype(dst), [&](auto to) {
            using TO = decltype(to);
            if (views) {
                const int64_t rows = n / D;
                const bool v4 = cast_vec4<TI, TO> && D % 4 == 0 && ldd % 4 == 0 && lds % 4 == 0 &&
                                (uintptr_t)d % (4 * sizeof(TO)) == 0 && (uintptr_t)p % (4 * sizeof(TI)) == 0;
                if (v4)
                    k_cast_rows<TI, TO, 4><<<ghc_k_blocks(n / 4, 256), 256, 0, s>>>((TO *)d, ldd, (const TI *)p, lds,
                                                                                    rows, D, scale);
                else
                    k_cast_rows<TI, TO, 1><<<ghc_k_blocks(n, 256), 256, 0, s>>>((TO *)d, ldd, (const TI *)p, lds,
                                                                                rows, D, scale);
            } else {
                k_cast<TI, TO><<<ghc_k_blocks(n, 256), 256, 0, s>>>((TO *)d, (const TI *)p, n, scale);
            }
            return (int)cudaGetLastError();
        });
    });
}

/* ---- random tensors ----------------------------------------------------------------------- */

/* Store the four values of block b (elements 4b ..), one vector store when whole and
 * aligned. */
template <typename T>
GHC_D void store_block(T *t, int64_t n, int64_t b, const float v[4], bool vec)
{
    int64_t i = 4 * b;
    if (vec && i + 4 <= n) {
        ghc_st4(t, i, v);
        return;
    }
#pragma unroll
    for (int l = 0; l < 4; l++)
        if (i + l < n)
            ghc_st(t, i + l, v[l]);
}

template <typename T>
static __global__ void k_uniform(T *t, int64_t n, uint64_t seed, uint64_t offset, bool vec)
{
    int64_t nb = (n + 3) / 4;
    for (int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; b < nb; b += (int64_t)gridDim.x * blockDim.x) {
        uint32_t r[4];
        ghc_dev_philox_block(seed, offset, (uint64_t)b, r);
        float v[4] = { ghc_dev_uniform(r[0]), ghc_dev_uniform(r[1]), ghc_dev_uniform(r[2]), ghc_dev_uniform(r[3]) };
        store_block(t, n, b, v, vec);
    }
}

template <typename T>
static __global__ void k_normal(T *t, int64_t n, uint64_t seed, uint64_t offset, bool vec)
{
    int64_t nb = (n + 3) / 4;
    for (int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; b < nb; b += (int64_t)gridDim.x * blockDim.x) {
        uint32_t r[4];
        ghc_dev_philox_block(seed, offset, (uint64_t)b, r);
        float v[4];
        ghc_dev_box_muller(r[0], r[1], &v[0], &v[1]);
        if (4 * b + 2 < n)
            ghc_dev_box_muller(r[2], r[3], &v[2], &v[3]);
        else
            v[2] = v[3] = 0.0f;
        store_block(t, n, b, v, vec);
    }
}

template <bool NORMAL>
static int rand_launch(ghc_tensor_t *t, const struct ghc_rng *rng, void *stream)
{
    ghc_k_device_guard guard(t);
    cudaStream_t s = (cudaStream_t)stream;
    int64_t n = ghc_tensor_numel(t);
    if (n == 0)
        return 0;
    void *p = ghc_tensor_data(t);
    unsigned blocks = ghc_k_blocks((n + 3) / 4, 256);
    return ghc_k_dispatch(ghc_tensor_dtype(t), [&](auto tag) {
        using T = decltype(tag);
        bool vec = ghc_k_aligned(p, sizeof(T), 4);
        if (NORMAL)
            k_normal<T><<<blocks, 256, 0, s>>>((T *)p, n, rng->seed, rng->offset, vec);
        else
            k_uniform<T><<<blocks, 256, 0, s>>>((T *)p, n, rng->seed, rng->offset, vec);
        return (int)cudaGetLastError();
    });
}

extern "C" int ghc_k_rand_uniform(ghc_tensor_t *t, const struct ghc_rng *rng, void *stream)
{
    return rand_launch<false>(t, rng, stream);
}

extern "C" int ghc_k_rand_normal(ghc_tensor_t *t, const struct ghc_rng *rng, void *stream)
{
    return rand_launch<true>(t, rng, stream);
}
