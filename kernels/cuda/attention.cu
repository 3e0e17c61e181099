/* attention.cu: non-causal attention forward and backward with the log-sum-exp
 * (ghc_k_attention_fwd, ghc_k_attention_bwd; contract in ops.h): the checks and the choice
 * of path; the kernels are in one file a path.
 *
 * Layout: q, o, dq [B, Lq, H, Dh]; k, v, dk, dv [B, Lk, H, Dh] (token-major, heads
 * interleaved: one token's rows of all heads are adjacent, so a head's rows are H*Dh apart);
 * lse [B, H, Lq] f32, natural log of sum_j exp(scale q.k_j). o may also be [B, Lq, H*Dh], a
 * column view included: its tokens are ldo elements apart (H*Dh when dense), and every kernel
 * that touches o (the forwards' stores, the backward's D = rowsum(dO o O)) addresses token t
 * at o + t * ldo; the tensor-core paths then also need ldo a multiple of 8 (16-byte rows).
 *
 * Paths, chosen per call:
 *  - Hopper (compute capability 9.0, sm_90a build), bf16, Dh 128, 16-byte aligned rows:
 *    warpgroup MMAs (attention_wgmma.cu).
 *  - other GPUs (and other head sizes), bf16 with Dh in {16, 32, 64, 128} (backward: {32, 64,
 *    128}) and 16-byte aligned rows: FlashAttention-2 style tiled kernels on mma.sync
 *    (attention_fwd.cu, attention_bwd.cu; the backward's largest block that fits in shared
 *    memory).
 *  - everything else (f32, other head sizes, unaligned data): a simple fp32 path
 *    (attention_generic.cu).
 * Before all of these, where cuDNN's library loads (libcudnn.so.9, at run time) and takes the
 * problem (bf16, Dh a multiple of 8 up to 128, aligned): cuDNN's fused flash attention
 * (attention_cudnn.c), faster than ours on Hopper (bench/README.md);
 * ghc_k_attention_impl(GHC_K_ATTN_OWN) keeps to ours.
 * Figures against FlashAttention-2 and cuDNN: bench/README.md.
 *
 * Scratch (the fp32 dQ accumulator and D) is kept per (device, stream), allocated at first use
 * and grown when a larger problem comes; never per call. */
#include "attention_impl.cuh"   /* defines: fwd_params, bwd_params, kLog2e, the paths' launches */

namespace {

struct device_guard {
    int prev = -1;
    bool changed = false;
    cudaError_t err = cudaSuccess;
    explicit device_guard(int dev)
    {
        if ((err = cudaGetDevice(&prev)) != cudaSuccess)
            return;
        if (prev != dev) {
            err = cudaSetDevice(dev);
            changed = err == cudaSuccess;
        }
    }
    ~device_guard()
    {
        if (changed)
            cudaSetDevice(prev);
    }
};

bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* The shared memory a block may opt in to on the current device (cached per device). */
int smem_optin()
{
    static int cache[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess)
        return 0;
    if (dev >= 0 && dev < 64 && cache[dev])
        return cache[dev];
    int v = 0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    if (dev >= 0 && dev < 64)
        cache[dev] = v;
    return v;
}

/* Elements between the starts of o's tokens: H Dh for [B, Lq, H, Dh], the row stride for
 * [B, Lq, H Dh] (a column view's rows are further apart). */
int64_t attn_ldo(const ghc_tensor_t *o)
{
    return ghc_tensor_ndim(o) == 3 ? ghc_tensor_row_stride(o) : ghc_tensor_dim(o, 2) * ghc_tensor_dim(o, 3);
}

/* The sizes and scales every tensor-core kernel's parameters carry. */
template <typename P>
void set_shape(P &p, int B, int H, int Lq, int Lk, float scale)
{
    p.B = B;
    p.H = H;
    p.Lq = Lq;
    p.Lk = Lk;
    p.scale = scale;
    p.scale_log2 = scale * kLog2e;
}

}   /* namespace */

extern "C" int ghc_k_attention_fwd(ghc_tensor_t *o, ghc_tensor_t *lse, const ghc_tensor_t *q, const ghc_tensor_t *k,
                                   const ghc_tensor_t *v, float scale, void *stream)
{
    cudaStream_t st = (cudaStream_t)stream;
    const int B = (int)ghc_tensor_dim(q, 0), Lq = (int)ghc_tensor_dim(q, 1), H = (int)ghc_tensor_dim(q, 2),
              D = (int)ghc_tensor_dim(q, 3), Lk = (int)ghc_tensor_dim(k, 1);
    if ((int64_t)B * Lq * H == 0)
        return 0;
    device_guard dg(ghc_tensor_device(q));
    if (dg.err != cudaSuccess)
        return dg.err;
    const bool bf = ghc_tensor_dtype(q) == GHC_DTYPE_BF16;
    const int64_t ldo = attn_ldo(o);
    int rc = ghc_k_cudnn_attention_fwd(o, lse, q, k, v, ldo, scale, stream);
    if (rc >= 0) {
        ghc_k_attention_note("cudnn");
        return rc;
    }
    const bool tc = bf && Lk > 0 && scale > 0.0f && (D == 16 || D == 32 || D == 64 || D == 128) && aligned16(ghc_tensor_cdata(q)) &&
                    aligned16(ghc_tensor_cdata(k)) && aligned16(ghc_tensor_cdata(v)) && aligned16(ghc_tensor_data(o)) &&
                    ldo % 8 == 0 && fwd_tc_smem(D) <= smem_optin();
    if (tc) {
        fwd_params p;
        p.q = (const bf16 *)ghc_tensor_cdata(q);
        p.k = (const bf16 *)ghc_tensor_cdata(k);
        p.v = (const bf16 *)ghc_tensor_cdata(v);
        p.o = (bf16 *)ghc_tensor_data(o);
        p.ldo = ldo;
        p.lse = (float *)ghc_tensor_data(lse);
        set_shape(p, B, H, Lq, Lk, scale);
        if (D == 128 && is_sm90() && fwd_wg_smem() <= smem_optin()) {
            ghc_k_attention_note("wgmma");
            return fwd_wg_launch(p, st);
        }
        ghc_k_attention_note("mma");
        return fwd_tc_launch(p, D, st);
    }
    ghc_k_attention_note("generic");
    fwd_generic_launch(o, lse, q, k, v, ldo, scale, st);
    return (int)cudaGetLastError();
}

extern "C" int ghc_k_attention_bwd(ghc_tensor_t *dq, ghc_tensor_t *dk, ghc_tensor_t *dv, const ghc_tensor_t *dout,
                                   const ghc_tensor_t *q, const ghc_tensor_t *k, const ghc_tensor_t *v,
                                   const ghc_tensor_t *o, const ghc_tensor_t *lse, float scale, void *stream)
{
    cudaStream_t st = (cudaStream_t)stream;
    const int B = (int)ghc_tensor_dim(q, 0), Lq = (int)ghc_tensor_dim(q, 1), H = (int)ghc_tensor_dim(q, 2),
              D = (int)ghc_tensor_dim(q, 3), Lk = (int)ghc_tensor_dim(k, 1);
    const int dev = ghc_tensor_device(q);
    device_guard dg(dev);
    if (dg.err != cudaSuccess)
        return dg.err;
    const bool bf = ghc_tensor_dtype(q) == GHC_DTYPE_BF16;
    cudaError_t e;
    if ((int64_t)B * H * Lq == 0 || Lk == 0) {
        /* no queries, or no keys: every gradient is zero */
        if (dq && ghc_tensor_nbytes(dq) && (e = cudaMemsetAsync(ghc_tensor_data(dq), 0, ghc_tensor_nbytes(dq), st)))
            return e;
        if (dk && ghc_tensor_nbytes(dk) && (e = cudaMemsetAsync(ghc_tensor_data(dk), 0, ghc_tensor_nbytes(dk), st)))
            return e;
        if (dv && ghc_tensor_nbytes(dv) && (e = cudaMemsetAsync(ghc_tensor_data(dv), 0, ghc_tensor_nbytes(dv), st)))
            return e;
        return 0;
    }
    const int64_t ldo = attn_ldo(o);
    int rc = ghc_k_cudnn_attention_bwd(dq, dk, dv, dout, q, k, v, o, ldo, lse, scale, stream);
    if (rc >= 0) {
        ghc_k_attention_note("cudnn");
        return rc;
    }
    /* tensor-core path: 4 = wgmma (Hopper, Dh 128); 2 = FA2-style, big block; 1 = the older
     * 16-keys-a-warp kernel (Dh 32, or where the big block does not fit); 3 = FA2-style, small
     * block (sm_121's 99 KB); 0 = the fp32 path */
    int tc = 0;
    if (bf && (D == 32 || D == 64 || D == 128) && aligned16(ghc_tensor_cdata(q)) && aligned16(ghc_tensor_cdata(k)) &&
        aligned16(ghc_tensor_cdata(v)) && aligned16(ghc_tensor_cdata(dout)) && (!dq || aligned16(ghc_tensor_data(dq))) &&
        (!dk || aligned16(ghc_tensor_data(dk))) && (!dv || aligned16(ghc_tensor_data(dv)))) {
        const int optin = smem_optin();
        if (D == 128 && is_sm90() && bwd_wg_smem() <= optin)
            tc = 4;
        else if (D != 32 && bwd2_tc_smem(D, true) <= optin)
            tc = 2;
        else if (bwd_tc_smem(D) <= optin)
            tc = 1;
        else if (D != 32 && bwd2_tc_smem(D, false) <= optin)
            tc = 3;
    }
    const int64_t rows = (int64_t)B * Lq * H;
    const size_t dsum_bytes = ((size_t)rows * sizeof(float) + 255) & ~(size_t)255;
    const size_t acc_bytes = tc && dq ? (size_t)rows * D * sizeof(float) : 0;
    void *scr;
    if ((e = (cudaError_t)ghc_k_scratch(dev, st, dsum_bytes + acc_bytes, &scr)) != cudaSuccess)
        return e;
    float *dsum = (float *)scr;
    float *acc = (float *)((char *)scr + dsum_bytes);
    ghc_k_attention_note(tc == 4 ? "wgmma" : tc ? "mma" : "generic");
    if (tc && aligned16(ghc_tensor_cdata(o)) && ldo % 8 == 0) {
        /* D and the zeroed dQ accumulator in one pass, 16-byte loads */
        bwd_prep_launch((const bf16 *)ghc_tensor_cdata(dout), (const bf16 *)ghc_tensor_cdata(o), ldo, dsum,
                        dq ? (float4 *)acc : NULL, rows, H, Lq, D, st);
        if ((e = cudaGetLastError()) != cudaSuccess)
            return e;
    } else {
        bwd_dsum_generic_launch(dout, o, ldo, q, dsum, st);
        if ((e = cudaGetLastError()) != cudaSuccess)
            return e;
        if (tc && dq && (e = cudaMemsetAsync(acc, 0, acc_bytes, st)) != cudaSuccess)
            return e;
    }

    if (tc) {
        bwd_params p;
        p.q = (const bf16 *)ghc_tensor_cdata(q);
        p.k = (const bf16 *)ghc_tensor_cdata(k);
        p.v = (const bf16 *)ghc_tensor_cdata(v);
        p.dout = (const bf16 *)ghc_tensor_cdata(dout);
        p.lse = (const float *)ghc_tensor_cdata(lse);
        p.dsum = dsum;
        p.dq_acc = dq ? acc : NULL;
        p.dk = dk ? (bf16 *)ghc_tensor_data(dk) : NULL;
        p.dv = dv ? (bf16 *)ghc_tensor_data(dv) : NULL;
        set_shape(p, B, H, Lq, Lk, scale);
        if (tc == 4)
            e = bwd_wg_launch(p, st);
        else if (tc == 2 || tc == 3)
            e = bwd2_tc_launch(p, D, tc == 2, st);
        else
            e = bwd_tc_launch(p, D, st);
        if (e != cudaSuccess || !dq)
            return e;
        dq_convert_launch((bf16 *)ghc_tensor_data(dq), (const float4 *)acc, rows * D / 4, scale, st);
        return (int)cudaGetLastError();
    }

    if ((e = bwd_generic_launch(dq, dk, dv, dout, q, k, v, lse, dsum, scale, st)) != cudaSuccess)
        return e;
    return (int)cudaGetLastError();
}
