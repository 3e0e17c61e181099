/* optim_am_cluster.cuh: the PTX that automagic's cluster kernel (optim_am_fused.cu) is made
 * of: mbarriers, bulk copies between global and shared memory (the tensor memory
 * accelerator), the cluster's ranks and barrier, and stores into another block's shared
 * memory. sm_90 and later; static, one copy per unit. */
#ifndef GHC_KERNELS_CUDA_OPTIM_AM_CLUSTER_CUH
#define GHC_KERNELS_CUDA_OPTIM_AM_CLUSTER_CUH

#include "optim_impl.cuh"   /* defines: GHC_D, AF_MAXW */

GHC_D uint32_t af_sa(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

GHC_D void af_bar_init(unsigned long long *b)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(af_sa(b)));
}

GHC_D void af_bar_expect(unsigned long long *b, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(af_sa(b)), "r"(bytes) : "memory");
}

GHC_D void af_bar_arrive(unsigned long long *b)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(af_sa(b)) : "memory");
}

/* Waits for the phase of `parity` to complete (acquire at CTA scope). The barriers count bytes
 * that arrive in this block's shared memory through the async proxy (bulk copies, and other
 * blocks' st.async pushes) and this block's own arrivals: once the phase completes the bytes are
 * in, as for the TMA pipelines of CUTLASS; a cluster-scope acquire would also invalidate the L1
 * (CCTL.IVALL, measured in the partials' wait) for nothing read from it. */
GHC_D void af_bar_wait(unsigned long long *b, uint32_t parity)
{
    asm volatile("{\n"
                 ".reg .pred p;\n"
                 "AF_WAIT:\n"
                 "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra AF_WAIT;\n"
                 "}" ::"r"(af_sa(b)),
                 "r"(parity)
                 : "memory");
}

/* Whether the phase of `parity` has completed (not waiting; acquire at CTA scope). */
GHC_D bool af_bar_test(unsigned long long *b, uint32_t parity)
{
    uint32_t r;
    asm volatile("{\n"
                 ".reg .pred p;\n"
                 "mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 "selp.u32 %0, 1, 0, p;\n"
                 "}"
                 : "=r"(r)
                 : "r"(af_sa(b)), "r"(parity)
                 : "memory");
    return r != 0u;
}

/* bytes (a multiple of 16, both ends 16-byte aligned) from global src to shared dst */
GHC_D void af_load(void *dst, const void *src, uint32_t bytes, unsigned long long *b)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     af_sa(dst)),
                 "l"(src), "r"(bytes), "r"(af_sa(b))
                 : "memory");
}

GHC_D void af_store(void *dst, const void *src, uint32_t bytes)
{
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(af_sa(src)), "r"(bytes)
                 : "memory");
}

GHC_D uint32_t af_rank()
{
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

GHC_D uint32_t af_nrank()
{
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(r));
    return r;
}

GHC_D void af_cluster_sync()
{
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

/* The compute warps' barrier (named barrier 1: the mover warp goes its own way). */
GHC_D void af_csync() { asm volatile("bar.sync 1, %0;" ::"n"(32 * AF_MAXW) : "memory"); }

/* x (in this block's shared memory) as cluster block `rank` has it: its address there */
GHC_D uint32_t af_map(const void *x, uint32_t rank)
{
    uint32_t a;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(a) : "r"(af_sa(x)), "r"(rank));
    return a;
}

/* 16 bytes into another block's shared memory at dst, completing bytes on its barrier at bar
 * (both addresses in the cluster's shared memory window: af_map's) */
GHC_D void af_push4a(uint32_t dst, float4 v, uint32_t bar)
{
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(dst),
                 "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(bar)
                 : "memory");
}

GHC_D void af_push2(float *dst, float x, float y, unsigned long long *bar, uint32_t rank)
{
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];" ::"r"(
                     af_map(dst, rank)),
                 "f"(x), "f"(y), "r"(af_map(bar, rank))
                 : "memory");
}

/* bytes (a multiple of 16, 16-byte aligned) at global p into L2 */
GHC_D void af_l2(const void *p, uint32_t bytes)
{
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}

#endif
