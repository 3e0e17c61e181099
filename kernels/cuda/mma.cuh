/* mma.cuh: the tensor-core building blocks the bf16 kernels share (attention_fwd.cu, attention_bwd.cu, attention_wgmma.cu, lora.cu):
 * shared-memory addresses, ldmatrix and mma.sync m16n8k16 with fp32 accumulation. Static
 * inline device functions (one copy per translation unit: no external symbol to clash). */
#ifndef GHC_KERNELS_CUDA_MMA_CUH
#define GHC_KERNELS_CUDA_MMA_CUH

#include <stdint.h>

#include <cuda_runtime.h>

static __device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* ldmatrix from a 32-bit shared-memory address (bytes); constant offsets fold into the
 * instruction, which keeps the address registers few. */
static __device__ __forceinline__ void ldsm_x4(uint32_t r[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
static __device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* The same for two 8 x 8 matrices (lanes 0-15 give the row addresses). */
static __device__ __forceinline__ void ldsm_x2(uint32_t r[2], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}
static __device__ __forceinline__ void ldsm_x2_t(uint32_t r[2], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}

/* d (16x8 f32) += a (16x16 bf16, row) b (16x8 bf16, col). */
static __device__ __forceinline__ void mma16816(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

#endif /* GHC_KERNELS_CUDA_MMA_CUH */
