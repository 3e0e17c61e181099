/* common.cuh: device-side helpers shared by the kernels in kernels/cuda/: element types and
 * their loads and stores with exactly the rounding of tensor.h's C conversions, the
 * Philox4x32-10 generator of ops.h, warp and block sums, launch sizes, and error checks.
 * Everything here is static or a template (one copy per translation unit: several .cu files
 * include it into one library, so it must define no external symbol), and
 * the scalar pieces are __host__ __device__ so that they can be checked on the host. */
#ifndef GHC_KERNELS_CUDA_COMMON_CUH
#define GHC_KERNELS_CUDA_COMMON_CUH

#include <stdint.h>
#include <string.h>

#include <cuda_runtime.h>

#include "kernels.h"   /* defines: ghc_k_*, ghc_tensor_t, struct ghc_rng, enum ghc_dtype */

#define GHC_HD static __host__ __device__ __forceinline__
#define GHC_D  static __device__ __forceinline__

/* Return a failed CUDA call's code from an extern "C" entry (0 is cudaSuccess). */
#define GHC_K_TRY(expr)                                                                    \
    do {                                                                                   \
        cudaError_t ghc_k_e_ = (expr);                                                     \
        if (ghc_k_e_ != cudaSuccess)                                                       \
            return (int)ghc_k_e_;                                                          \
    } while (0)

/* ---- element types ------------------------------------------------------------------------- */

/* Storage tags for the narrow float formats: raw bits, converted only through the functions
 * below (never CUDA's own types, whose NaN handling differs from tensor.h's). */
struct ghc_bf16 { uint16_t bits; };
struct ghc_f16  { uint16_t bits; };
struct ghc_e4m3 { uint8_t bits; };
struct ghc_e5m2 { uint8_t bits; };

GHC_HD uint32_t ghc_f2u(float x)
{
#ifdef __CUDA_ARCH__
    return __float_as_uint(x);
#else
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
#endif
}

GHC_HD float ghc_u2f(uint32_t u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float x;
    memcpy(&x, &u, 4);
    return x;
#endif
}

/* f32 -> bf16, round to nearest even; NaN keeps its top bits and is made quiet
 * (= ghc_f32_to_bf16). */
GHC_HD uint16_t ghc_dev_f32_to_bf16(float x)
{
    uint32_t u = ghc_f2u(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

GHC_HD float ghc_dev_bf16_to_f32(uint16_t b) { return ghc_u2f((uint32_t)b << 16); }

/* Magnitude bits of |x| (finite, not NaN, bits `a` of the f32) in a small IEEE-like format
 * with EB exponent and MB mantissa bits, round to nearest even, in integers. Overflow gives
 * the encoding past the largest finite one (the caller saturates or makes it inf). Equal to
 * core/tensor.c's encode_small for every finite input. */
template <int EB, int MB>
GHC_HD uint32_t ghc_encode_small(uint32_t a)
{
    const int bias = (1 << (EB - 1)) - 1;
    int e = (int)(a >> 23);                  /* biased f32 exponent */
    uint32_t m = a & 0x7fffffu;
    if (e == 0) {                            /* f32 subnormal: far below any target's range */
        if (m == 0)
            return 0;
        e = 1;
    } else {
        m |= 0x800000u;
    }
    /* value = m 2^(e - 150); the result counts units of 2^k, k = max(exp, 1 - bias) - MB */
    int exp = e - 127;
    int k = (exp > 1 - bias ? exp : 1 - bias) - MB;
    int s = k - (e - 150);                   /* right shift of m, >= 23 - MB */
    uint32_t q;
    if (s > 25) {
        q = 0;                               /* below half a unit: m < 2^24 <= 2^(s-1) */
    } else {
        q = m >> s;
        uint32_t rem = m & ((1u << s) - 1u), half = 1u << (s - 1);
        if (rem > half || (rem == half && (q & 1u)))
            q++;
    }
    if (exp < 1 - bias)                      /* subnormal target: q == 2^MB is the first normal */
        return q;
    /* normal: q in [2^MB, 2^(MB+1)]; the carry of q == 2^(MB+1) moves into the exponent */
    return ((uint32_t)(exp + bias) << MB) + q - (1u << MB);
}

/* f32 -> f16 (= ghc_f32_to_f16): RNE, overflow to inf, NaN -> sign | 0x7e00. */
GHC_HD uint16_t ghc_dev_f32_to_f16(float x)
{
    uint32_t u = ghc_f2u(x), a = u & 0x7fffffffu;
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    if (a > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u);
    if (a == 0x7f800000u)
        return (uint16_t)(sign | 0x7c00u);
    uint32_t b = ghc_encode_small<5, 10>(a);
    return (uint16_t)(sign | (b > 0x7bffu ? 0x7c00u : b));
}

/* f32 -> e4m3fn (= ghc_f32_to_e4m3): RNE, saturating to +-448, NaN -> sign | 0x7f. */
GHC_HD uint8_t ghc_dev_f32_to_e4m3(float x)
{
    uint32_t u = ghc_f2u(x), a = u & 0x7fffffffu;
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    if (a > 0x7f800000u)
        return (uint8_t)(sign | 0x7fu);
    if (a >= 0x43e00000u)                    /* |x| >= 448, inf included */
        return (uint8_t)(sign | 0x7eu);
    return (uint8_t)(sign | ghc_encode_small<4, 3>(a));
}

/* f32 -> e5m2 (= ghc_f32_to_e5m2): RNE, overflow to inf, NaN -> sign | 0x7e. */
GHC_HD uint8_t ghc_dev_f32_to_e5m2(float x)
{
    uint32_t u = ghc_f2u(x), a = u & 0x7fffffffu;
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    if (a > 0x7f800000u)
        return (uint8_t)(sign | 0x7eu);
    if (a == 0x7f800000u)
        return (uint8_t)(sign | 0x7cu);
    uint32_t b = ghc_encode_small<5, 2>(a);
    return (uint8_t)(sign | (b > 0x7bu ? 0x7cu : b));
}

/* m 2^e for small exact m and e in the normal f32 range. */
GHC_HD float ghc_ldexp_small(uint32_t m, int e) { return (float)m * ghc_u2f((uint32_t)(e + 127) << 23); }

/* f16 -> f32 (= ghc_f16_to_f32; NaN is the default NaN with the sign). */
GHC_HD float ghc_dev_f16_to_f32(uint16_t x)
{
    uint32_t sign = (uint32_t)(x & 0x8000u) << 16;
    int e = (x >> 10) & 0x1f;
    uint32_t m = x & 0x3ffu;
    if (e == 31)
        return ghc_u2f(sign | (m ? 0x7fc00000u : 0x7f800000u));
    float v = e == 0 ? ghc_ldexp_small(m, -24) : ghc_ldexp_small(m | 0x400u, e - 25);
    return ghc_u2f(ghc_f2u(v) | sign);
}

/* e4m3fn -> f32 (= ghc_e4m3_to_f32). */
GHC_HD float ghc_dev_e4m3_to_f32(uint8_t x)
{
    uint32_t sign = (uint32_t)(x & 0x80u) << 24;
    int e = (x >> 3) & 0xf;
    uint32_t m = x & 0x7u;
    if (e == 15 && m == 7)
        return ghc_u2f(sign | 0x7fc00000u);
    float v = e == 0 ? ghc_ldexp_small(m, -9) : ghc_ldexp_small(m | 0x8u, e - 10);
    return ghc_u2f(ghc_f2u(v) | sign);
}

/* e5m2 -> f32 (= ghc_e5m2_to_f32: the top byte of an f16). */
GHC_HD float ghc_dev_e5m2_to_f32(uint8_t x) { return ghc_dev_f16_to_f32((uint16_t)((uint16_t)x << 8)); }

/* Loads and stores by element type; stores round as above. */
GHC_HD float ghc_ld(const float *p, int64_t i) { return p[i]; }
GHC_HD float ghc_ld(const ghc_bf16 *p, int64_t i) { return ghc_dev_bf16_to_f32(p[i].bits); }
GHC_HD float ghc_ld(const ghc_f16 *p, int64_t i) { return ghc_dev_f16_to_f32(p[i].bits); }
GHC_HD float ghc_ld(const ghc_e4m3 *p, int64_t i) { return ghc_dev_e4m3_to_f32(p[i].bits); }
GHC_HD float ghc_ld(const ghc_e5m2 *p, int64_t i) { return ghc_dev_e5m2_to_f32(p[i].bits); }

GHC_HD void ghc_st(float *p, int64_t i, float v) { p[i] = v; }
GHC_HD void ghc_st(ghc_bf16 *p, int64_t i, float v) { p[i].bits = ghc_dev_f32_to_bf16(v); }
GHC_HD void ghc_st(ghc_f16 *p, int64_t i, float v) { p[i].bits = ghc_dev_f32_to_f16(v); }
GHC_HD void ghc_st(ghc_e4m3 *p, int64_t i, float v) { p[i].bits = ghc_dev_f32_to_e4m3(v); }
GHC_HD void ghc_st(ghc_e5m2 *p, int64_t i, float v) { p[i].bits = ghc_dev_f32_to_e5m2(v); }

/* Round v to T's precision and back (the "cast to y's dtype" of RMSNorm). */
GHC_HD float ghc_round_to(float v, const float *) { return v; }
GHC_HD float ghc_round_to(float v, const ghc_bf16 *) { return ghc_dev_bf16_to_f32(ghc_dev_f32_to_bf16(v)); }

/* A runtime-typed load for small operands (weights, modulation rows): f32 or bf16. */
GHC_HD float ghc_ld_dt(const void *p, int is_bf16, int64_t i)
{
    return is_bf16 ? ghc_dev_bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* Four consecutive elements at p + i (i a multiple of 4, p 4-element aligned): one 16-byte
 * (f32) or 8-byte (bf16) access. */
GHC_D void ghc_ld4(const float *p, int64_t i, float v[4])
{
    float4 q = *(const float4 *)(p + i);
    v[0] = q.x; v[1] = q.y; v[2] = q.z; v[3] = q.w;
}
GHC_D void ghc_ld4(const ghc_bf16 *p, int64_t i, float v[4])
{
    uint2 q = *(const uint2 *)(p + i);
    v[0] = __uint_as_float(q.x << 16); v[1] = __uint_as_float(q.x & 0xffff0000u);
    v[2] = __uint_as_float(q.y << 16); v[3] = __uint_as_float(q.y & 0xffff0000u);
}
GHC_D void ghc_st4(float *p, int64_t i, const float v[4])
{
    *(float4 *)(p + i) = make_float4(v[0], v[1], v[2], v[3]);
}
GHC_D void ghc_st4(ghc_bf16 *p, int64_t i, const float v[4])
{
    uint2 q;
    q.x = (uint32_t)ghc_dev_f32_to_bf16(v[0]) | ((uint32_t)ghc_dev_f32_to_bf16(v[1]) << 16);
    q.y = (uint32_t)ghc_dev_f32_to_bf16(v[2]) | ((uint32_t)ghc_dev_f32_to_bf16(v[3]) << 16);
    *(uint2 *)(p + i) = q;
}

/* Eight consecutive elements at p + i (i a multiple of 8, p 8-element aligned): one 16-byte
 * (bf16) or two 16-byte (f32) accesses. */
GHC_D void ghc_ld8(const float *p, int64_t i, float v[8])
{
    ghc_ld4(p, i, v);
    ghc_ld4(p, i + 4, v + 4);
}
GHC_D void ghc_ld8(const ghc_bf16 *p, int64_t i, float v[8])
{
    uint4 q = *(const uint4 *)(p + i);
    const uint32_t w[4] = { q.x, q.y, q.z, q.w };
#pragma unroll
    for (int u = 0; u < 4; u++) {
        v[2 * u] = __uint_as_float(w[u] << 16);
        v[2 * u + 1] = __uint_as_float(w[u] & 0xffff0000u);
    }
}
GHC_D void ghc_st8(float *p, int64_t i, const float v[8])
{
    ghc_st4(p, i, v);
    ghc_st4(p, i + 4, v + 4);
}
GHC_D void ghc_st8(ghc_bf16 *p, int64_t i, const float v[8])
{
    uint32_t w[4];
#pragma unroll
    for (int u = 0; u < 4; u++)
        w[u] = (uint32_t)ghc_dev_f32_to_bf16(v[2 * u]) | ((uint32_t)ghc_dev_f32_to_bf16(v[2 * u + 1]) << 16);
    *(uint4 *)(p + i) = make_uint4(w[0], w[1], w[2], w[3]);
}

/* Two consecutive elements at p + i (i even, p 2-element aligned). */
GHC_D void ghc_ld2(const float *p, int64_t i, float v[2])
{
    float2 q = *(const float2 *)(p + i);
    v[0] = q.x; v[1] = q.y;
}
GHC_D void ghc_ld2(const ghc_bf16 *p, int64_t i, float v[2])
{
    uint32_t q = *(const uint32_t *)(p + i);
    v[0] = __uint_as_float(q << 16); v[1] = __uint_as_float(q & 0xffff0000u);
}
GHC_D void ghc_st2(float *p, int64_t i, const float v[2]) { *(float2 *)(p + i) = make_float2(v[0], v[1]); }
GHC_D void ghc_st2(ghc_bf16 *p, int64_t i, const float v[2])
{
    *(uint32_t *)(p + i) = (uint32_t)ghc_dev_f32_to_bf16(v[0]) | ((uint32_t)ghc_dev_f32_to_bf16(v[1]) << 16);
}

/* True when p is aligned for `elems` elements of `size` bytes. */
static inline bool ghc_k_aligned(const void *p, size_t size, size_t elems)
{
    return p == NULL || ((uintptr_t)p % (size * elems)) == 0;
}

/* Call f(T{}) with T the storage type of dt (f32 or bf16; f16 and fp8 with WIDE). Returns
 * cudaErrorInvalidValue for any other dtype (ops.c validated them already). */
template <typename F>
static int ghc_k_dispatch(enum ghc_dtype dt, F f)
{
    switch (dt) {
    case GHC_DTYPE_F32:  return f(float{});
    case GHC_DTYPE_BF16: return f(ghc_bf16{});
    default:             return (int)cudaErrorInvalidValue;
    }
}

template <typename F>
static int ghc_k_dispatch_float(enum ghc_dtype dt, F f)
{
    switch (dt) {
    case GHC_DTYPE_F32:     return f(float{});
    case GHC_DTYPE_BF16:    return f(ghc_bf16{});
    case GHC_DTYPE_F16:     return f(ghc_f16{});
    case GHC_DTYPE_F8_E4M3: return f(ghc_e4m3{});
    case GHC_DTYPE_F8_E5M2: return f(ghc_e5m2{});
    default:                return (int)cudaErrorInvalidValue;
    }
}

/* ---- Philox4x32-10 ------------------------------------------------------------------------- */

/* The Random123 Philox4x32 with 10 rounds: out = philox(counter, key). The same function as
 * ghc_philox4x32 (kernels/cpu/random.c). */
GHC_HD void ghc_dev_philox(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1,
                           uint32_t out[4])
{
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        uint64_t p0 = (uint64_t)0xD2511F53u * c0;
        uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

/* Block `b` of a call (elements 4b .. 4b+3): counter (offset + b) as a 64-bit value in the
 * first two words, key (seed low, seed high). */
GHC_HD void ghc_dev_philox_block(uint64_t seed, uint64_t offset, uint64_t b, uint32_t out[4])
{
    uint64_t c = offset + b;
    ghc_dev_philox((uint32_t)c, (uint32_t)(c >> 32), 0u, 0u, (uint32_t)seed, (uint32_t)(seed >> 32), out);
}

/* Uniform in [0, 1): 24 random bits. */
GHC_HD float ghc_dev_uniform(uint32_t u) { return (float)(u >> 8) * 0x1p-24f; }

/* The Box-Muller pair of two lanes in f64, rounded to f32. */
GHC_HD void ghc_dev_box_muller(uint32_t a, uint32_t b, float *z0, float *z1)
{
    const double two_pi = 6.283185307179586476925286766559;
    double u1 = (double)a * 0x1p-32, u2 = (double)b * 0x1p-32;
    double r = sqrt(-2.0 * log(1.0 - u1));
    double t = two_pi * u2;
    *z0 = (float)(r * cos(t));
    *z1 = (float)(r * sin(t));
}

/* ---- reductions ------------------------------------------------------------------------- */

GHC_D float ghc_warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Sum of v over the block (blockDim.x a multiple of 32, at most 1024), returned to every
 * thread. `red` is __shared__ float[32]. Ends with a barrier, so `red` can be reused. */
GHC_D float ghc_block_sum(float v, float *red)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = ghc_warp_sum(v);
    __syncthreads();                 /* an earlier call may still read red */
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : 0.0f;
    return ghc_warp_sum(v);
}

/* Two sums at once (one round of barriers). */
GHC_D float2 ghc_block_sum2(float a, float b, float2 *red)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    a = ghc_warp_sum(a);
    b = ghc_warp_sum(b);
    __syncthreads();
    if (lane == 0)
        red[warp] = make_float2(a, b);
    __syncthreads();
    float2 r = lane < nw ? red[lane] : make_float2(0.0f, 0.0f);
    return make_float2(ghc_warp_sum(r.x), ghc_warp_sum(r.y));
}

/* ---- launch helpers ------------------------------------------------------------------------ */

/* Multiprocessors of the current device (a cheap attribute query, no synchronisation). */
static inline int ghc_k_sm_count(void)
{
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n < 1) {
        cudaGetLastError();
        n = 132;
    }
    return n;
}

/* Blocks of `threads` for a grid-stride loop over `work` items: enough to fill the device
 * a few times over, never more than the work needs. */
static inline unsigned ghc_k_blocks(int64_t work, int threads)
{
    int64_t need = (work + threads - 1) / threads;
    int64_t cap = (int64_t)ghc_k_sm_count() * 16;
    if (need > cap)
        need = cap;
    return (unsigned)(need < 1 ? 1 : need);
}

/* Make a device (or a tensor's device) current for the launches of one entry, and restore the
 * previous one on exit. `err` holds the failure of switching, if any. */
struct ghc_k_device_guard {
    int prev = -1;
    cudaError_t err = cudaSuccess;
    explicit ghc_k_device_guard(int dev)
    {
        if (dev < 0 || (err = cudaGetDevice(&prev)) != cudaSuccess) {
            prev = -1;
            return;
        }
        if (prev == dev || (err = cudaSetDevice(dev)) != cudaSuccess)
            prev = -1;
    }
    explicit ghc_k_device_guard(const ghc_tensor_t *t) : ghc_k_device_guard(ghc_tensor_device(t)) {}
    ~ghc_k_device_guard()
    {
        if (prev >= 0)
            cudaSetDevice(prev);
    }
};

/* Typed borrowed pointers from tensors (NULL stays NULL). */
template <typename T>
static inline T *ghc_k_ptr(ghc_tensor_t *t) { return t ? (T *)ghc_tensor_data(t) : (T *)0; }
template <typename T>
static inline const T *ghc_k_cptr(const ghc_tensor_t *t) { return t ? (const T *)ghc_tensor_cdata(t) : (const T *)0; }

#endif /* GHC_KERNELS_CUDA_COMMON_CUH */
