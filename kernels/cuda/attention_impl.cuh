/* attention_impl.cuh: what attention's translation units share (attention.cu, the dispatcher;
 * attention_fwd.cu and attention_bwd.cu, the mma.sync kernels; attention_wgmma.cu, Hopper's;
 * attention_generic.cu, the fp32 path): the kernels' parameters, the host functions the
 * dispatcher calls, and the pieces that the tensor-core kernels of more than one path do
 * alike (tile loads, fragment layouts, the online softmax, the dK and dV stores). Never installed; device code here is in an unnamed namespace or a template (one
 * copy per unit). */
#ifndef GHC_KERNELS_CUDA_ATTENTION_IMPL_CUH
#define GHC_KERNELS_CUDA_ATTENTION_IMPL_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>

#include "kernels.h"
#include "mma.cuh"   /* defines: smem_addr, ldsm_x4, ldsm_x4_t, mma16816 */

/* Functions one of these units defines for another: hidden, so libgh200core_ops exports only
 * the ghc_k_* entries. */
#define GHC_ATTN_LOCAL __attribute__((visibility("hidden")))

namespace ghc_attn {

typedef __nv_bfloat16 bf16;

constexpr float kLog2e = 1.4426950408889634f;

/* ---- the tensor-core kernels' parameters ----------------------------------------------------- */

struct fwd_params {
    const bf16 *q, *k, *v;
    bf16 *o;
    int64_t ldo;   /* elements between o's tokens */
    float *lse;
    int B, H, Lq, Lk;
    float scale, scale_log2;
};

struct bwd_params {
    const bf16 *q, *k, *v, *dout;
    const float *lse, *dsum;
    float *dq_acc;
    bf16 *dk, *dv;
    int B, H, Lq, Lk;
    float scale, scale_log2;
};

/* ---- what each path's unit offers the dispatcher --------------------------------------------- */

/* attention_fwd.cu: the mma.sync forward at Dh 16, 32, 64 or 128 (attn_fwd_tc), and the
 * dynamic shared memory it takes. */
GHC_ATTN_LOCAL int fwd_tc_smem(int D);
GHC_ATTN_LOCAL cudaError_t fwd_tc_launch(const fwd_params &p, int D, cudaStream_t st);

/* attention_bwd.cu: the mma.sync backwards at Dh 32, 64 or 128: 16 keys a warp (attn_bwd_tc)
 * or, Dh 64 and 128, FA2's layout (attn_bwd2_tc; big: 128 keys a block, Q and dO
 * double-buffered; else 64 keys, one buffer), and the shared memory each takes. Also what every
 * tensor-core backward needs around it: D = rowsum(dO o O) with the fp32 dQ accumulator zeroed
 * (acc4, when given; o's tokens ldo apart), and dq from the accumulator (n4 float4s, times
 * scale) at the end. */
GHC_ATTN_LOCAL int bwd_tc_smem(int D);
GHC_ATTN_LOCAL int bwd2_tc_smem(int D, bool big);
GHC_ATTN_LOCAL cudaError_t bwd_tc_launch(const bwd_params &p, int D, cudaStream_t st);
GHC_ATTN_LOCAL cudaError_t bwd2_tc_launch(const bwd_params &p, int D, bool big, cudaStream_t st);
GHC_ATTN_LOCAL void bwd_prep_launch(const bf16 *dout, const bf16 *o, int64_t ldo, float *dsum, float4 *acc4,
                                    int64_t rows, int H, int Lq, int D, cudaStream_t st);
GHC_ATTN_LOCAL void dq_convert_launch(bf16 *dq, const float4 *acc, int64_t n4, float scale, cudaStream_t st);

/* attention_wgmma.cu: whether the current device is compute capability 9.0 with the sm_90a
 * code loaded (cached per device; the first call a device runs a one-thread probe and waits
 * for it); the wgmma forward and backward (Dh 128) and the shared memory each takes. */
GHC_ATTN_LOCAL bool is_sm90();
GHC_ATTN_LOCAL int fwd_wg_smem();
GHC_ATTN_LOCAL int bwd_wg_smem();
GHC_ATTN_LOCAL cudaError_t fwd_wg_launch(const fwd_params &p, cudaStream_t st);
GHC_ATTN_LOCAL cudaError_t bwd_wg_launch(const bwd_params &p, cudaStream_t st);

/* attention_generic.cu: the fp32 path (bf16 or f32 tensors as q is, any Dh <= 256; o's tokens
 * ldo apart): the forward; D = rowsum(dO o O) into dsum, for queries of q's shape; dq, dk, dv
 * from it (each may be NULL). */
GHC_ATTN_LOCAL void fwd_generic_launch(ghc_tensor_t *o, ghc_tensor_t *lse, const ghc_tensor_t *q,
                                       const ghc_tensor_t *k, const ghc_tensor_t *v, int64_t ldo, float scale,
                                       cudaStream_t st);
GHC_ATTN_LOCAL void bwd_dsum_generic_launch(const ghc_tensor_t *dout, const ghc_tensor_t *o, int64_t ldo,
                                            const ghc_tensor_t *q, float *dsum, cudaStream_t st);
GHC_ATTN_LOCAL cudaError_t bwd_generic_launch(ghc_tensor_t *dq, ghc_tensor_t *dk, ghc_tensor_t *dv,
                                              const ghc_tensor_t *dout, const ghc_tensor_t *q,
                                              const ghc_tensor_t *k, const ghc_tensor_t *v,
                                              const ghc_tensor_t *lse, const float *dsum, float scale,
                                              cudaStream_t st);

}   /* namespace ghc_attn */

namespace {

using namespace ghc_attn;

/* ---- small helpers --------------------------------------------------------------------------- */

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

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

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

/* Zeroes an accumulator. */
template <int N>
__device__ __forceinline__ void zero(float (&x)[N][4])
{
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            x[i][e] = 0.0f;
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

/* The A fragment (16 x 16 bf16) of k-step kk from m16n8 accumulator tiles 2 kk and 2 kk + 1
 * (P or dS, kept in registers as the product that made them left them). */
template <int N>
__device__ __forceinline__ void a_frag(uint32_t (&a)[4], const float (&x)[N][4], int kk)
{
    a[0] = pack_bf16(x[2 * kk][0], x[2 * kk][1]);
    a[1] = pack_bf16(x[2 * kk][2], x[2 * kk][3]);
    a[2] = pack_bf16(x[2 * kk + 1][0], x[2 * kk + 1][1]);
    a[3] = pack_bf16(x[2 * kk + 1][2], x[2 * kk + 1][3]);
}

/* ---- forward: the online softmax ------------------------------------------------------------- */

/* The online softmax of row g (r = 0) or g + 8 (r = 1) of this thread's m16n8 fragments of
 * raw scores s (the row's four lanes agree through shuffles): s becomes 2^(sl (s - m)) for the
 * new running max m; l, the partial sum of those, takes the new ones. Returns the factor
 * 2^(sl (old m - new m)) by which what was accumulated before must be scaled. */
template <int N>
__device__ __forceinline__ float softmax_row(float (&s)[N][4], int r, float &row_m, float &row_l, float sl)
{
    float mx = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < N; nt++)
        mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(row_m, mx);
    const float corr = fast_exp2((row_m - m_new) * sl);
    row_m = m_new;
    const float ms = m_new * sl;
    float sum = 0.0f;
#pragma unroll
    for (int nt = 0; nt < N; nt++) {
        const float p0 = fast_exp2(fmaf(s[nt][2 * r], sl, -ms));
        const float p1 = fast_exp2(fmaf(s[nt][2 * r + 1], sl, -ms));
        s[nt][2 * r] = p0;
        s[nt][2 * r + 1] = p1;
        sum += p0 + p1;
    }
    row_l = row_l * corr + sum;
    return corr;
}

/* Row r (as in softmax_row) of the output accumulator scaled by corr. */
template <int N>
__device__ __forceinline__ void scale_row(float (&acc)[N][4], int r, float corr)
{
#pragma unroll
    for (int dt = 0; dt < N; dt++) {
        acc[dt][2 * r] *= corr;
        acc[dt][2 * r + 1] *= corr;
    }
}

/* ---- backward: dK and dV --------------------------------------------------------------------- */

/* dK = scale dS^T Q and dV = P^T dO (each where wanted) of keys key0 and key0 + 8 (past Lk
 * nothing), from this thread's fragments of the D-wide accumulators. */
template <int D>
__device__ __forceinline__ void store_dk_dv(const bwd_params &p, const float (&dk)[D / 8][4],
                                            const float (&dv)[D / 8][4], int key0, int b, int h, int t)
{
    const int64_t row_stride = (int64_t)p.H * D;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = key0 + 8 * r;
        if (row < p.Lk) {
            const int64_t off = ((int64_t)b * p.Lk + row) * row_stride + (int64_t)h * D + 2 * t;
#pragma unroll
            for (int dt = 0; dt < D / 8; dt++) {
                if (p.dk)
                    *reinterpret_cast<uint32_t *>(p.dk + off + dt * 8) =
                        pack_bf16(dk[dt][2 * r] * p.scale, dk[dt][2 * r + 1] * p.scale);
                if (p.dv)
                    *reinterpret_cast<uint32_t *>(p.dv + off + dt * 8) = pack_bf16(dv[dt][2 * r], dv[dt][2 * r + 1]);
            }
        }
    }
}

/* ---- launches -------------------------------------------------------------------------------- */

/* Launches kernel k (taking p by value) on grid x threads with smem bytes of dynamic shared
 * memory, having raised its limit first on each device (set: the kernel's own flags, one a
 * device; setting it twice is harmless). */
template <typename P>
cudaError_t launch_smem(void (*k)(P), bool (&set)[64], dim3 grid, int threads, int smem, const P &p,
                        cudaStream_t st)
{
    int dev = 0;
    cudaGetDevice(&dev);
    if (!set[dev & 63]) {
        cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        if (e != cudaSuccess)
            return e;
        set[dev & 63] = true;
    }
    k<<<grid, threads, smem, st>>>(p);
    return cudaGetLastError();
}

}   /* namespace */

#endif
