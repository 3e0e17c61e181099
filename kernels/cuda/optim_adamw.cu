/* optim_adamw.cu: adamw's update of ops.h ("optimizer updates") as multi-tensor launches,
 * element-wise, no host synchronisation. The list of tensors travels by value in the kernel
 * parameters (__grid_constant__, AW_MAX tensors, 17 KB, a launch per AW_MAX); the tensors are
 * cut into chunks of AW_CHUNK elements, one block each (a block finds its tensor by binary
 * search of the chunk starts). The same roundings as kernels/cpu/optim.c (explicit _rn
 * intrinsics, fmaf where the CPU has one): bit-identical to the CPU. */
#include "optim_impl.cuh"   /* defines: ld_f, st_param */

#define AW_MAX     256
#define AW_THREADS 256
#define AW_CHUNK   (AW_THREADS * 4 * 8)

struct aw_tensor {
    void       *p;
    const void *g;
    float      *m, *v;
    int64_t     n;
    uint64_t    seed, offset;
    int32_t     p_bf16, g_bf16;
};

struct aw_list {
    aw_tensor t[AW_MAX];
    int32_t   start[AW_MAX + 1];   /* first chunk of each tensor; start[count] = all chunks */
    int32_t   count;
};

GHC_D float aw_elem(float x, float g, float *m, float *v, const ghc_adamw_args &a)
{
    x = __fmul_rn(x, a.decay);
    float mi = __fmaf_rn(a.beta1_comp, __fsub_rn(g, *m), *m);
    float vi = __fmaf_rn(__fmul_rn(a.beta2_comp, g), g, __fmul_rn(*v, a.beta2));
    *m = mi;
    *v = vi;
    float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), a.bc2_sqrt), a.eps);
    return __fadd_rn(x, __fdiv_rn(__fmul_rn(-a.step_size, mi), denom));
}

static __global__ void __launch_bounds__(AW_THREADS) k_adamw(const __grid_constant__ aw_list L, const ghc_adamw_args a)
{
    int lo = 0, hi = L.count - 1;
    while (lo < hi) {                       /* the last tensor whose start <= blockIdx.x */
        int mid = (lo + hi + 1) / 2;
        if (L.start[mid] <= (int32_t)blockIdx.x)
            lo = mid;
        else
            hi = mid - 1;
    }
    const aw_tensor &t = L.t[lo];
    int64_t c0 = (int64_t)(blockIdx.x - L.start[lo]) * AW_CHUNK, c1 = c0 + AW_CHUNK;
    if (c1 > t.n)
        c1 = t.n;
    bool vec = !t.p_bf16 && !t.g_bf16;
    for (int64_t i = c0 + 4 * (int64_t)threadIdx.x; i < c1; i += 4 * AW_THREADS) {
        if (vec && i + 4 <= c1) {
            float4 x = *(const float4 *)((const float *)t.p + i), g = *(const float4 *)((const float *)t.g + i);
            float4 m = *(const float4 *)(t.m + i), v = *(const float4 *)(t.v + i);
            x.x = aw_elem(x.x, g.x, &m.x, &v.x, a);
            x.y = aw_elem(x.y, g.y, &m.y, &v.y, a);
            x.z = aw_elem(x.z, g.z, &m.z, &v.z, a);
            x.w = aw_elem(x.w, g.w, &m.w, &v.w, a);
            *(float4 *)((float *)t.p + i) = x;
            *(float4 *)(t.m + i) = m;
            *(float4 *)(t.v + i) = v;
            continue;
        }
        for (int64_t j = i; j < i + 4 && j < c1; j++) {
            float x = aw_elem(ld_f(t.p, t.p_bf16, j), ld_f(t.g, t.g_bf16, j), &t.m[j], &t.v[j], a);
            st_param(t.p, t.p_bf16, j, x, t.seed, t.offset);
        }
    }
}

extern "C" int ghc_k_adamw(struct ghc_optim_tensor *ts, int32_t n, const struct ghc_adamw_args *args, void *stream)
{
    ghc_k_device_guard dg(ts[0].param);
    GHC_K_TRY(dg.err);
    cudaStream_t s = (cudaStream_t)stream;
    static aw_list L;   /* 17 KB: not on the stack; launches copy it */
    for (int32_t base = 0; base < n;) {
        int32_t k = 0, chunks = 0;
        for (; base + k < n && k < AW_MAX; k++) {
            const ghc_optim_tensor &o = ts[base + k];
            int64_t numel = ghc_tensor_numel(o.param);
            int64_t nc = (numel + AW_CHUNK - 1) / AW_CHUNK;
            if (k > 0 && (int64_t)chunks + nc > INT32_MAX / 2)
                break;
            L.t[k] = aw_tensor{ ghc_tensor_data(o.param), ghc_tensor_cdata(o.grad), ghc_k_ptr<float>(o.state[0]),
                                ghc_k_ptr<float>(o.state[1]), numel, o.rng.seed, o.rng.offset,
                                ghc_tensor_dtype(o.param) == GHC_DTYPE_BF16, ghc_tensor_dtype(o.grad) == GHC_DTYPE_BF16 };
            L.start[k] = chunks;
            chunks += (int32_t)nc;
        }
        L.start[k] = chunks;
        L.count = k;
        if (chunks > 0)
            k_adamw<<<chunks, AW_THREADS, 0, s>>>(L, *args);
        GHC_K_TRY(cudaGetLastError());
        base += k;
    }
    return 0;
}
