/* patch.cu: Wan's 2x2 spatial patches (ghc_op_patchify in ops.h), as kernels/cpu/patch.c
 * computes them: patchify (with the I2V channel concatenation), unpatchify and their
 * backwards. Pure permutations: each element is loaded as f32 and stored once in the
 * destination's dtype, so the results are bit-identical to the CPU's. One grid-stride
 * kernel over the latent elements (coalesced on the latent side). */
#include "common.cuh"

/* lat [B, C, T, Hl, Wl] <-> rows [B, L, 4 row_ch]; see permute() in kernels/cpu/patch.c. */
template <typename TL, typename TR>
static __global__ void k_patch(TL *lat, TR *rows, int64_t n, int64_t C, int64_t T, int64_t Hl, int64_t Wl,
                               int64_t row_ch, int64_t c0, bool c_fastest, bool to_rows)
{
    const int64_t h = Hl / 2, w = Wl / 2, L = T * h * w;
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, stride = (int64_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride) {
        int64_t x = i % Wl, r = i / Wl;
        int64_t y = r % Hl;
        r /= Hl;
        int64_t t = r % T;
        r /= T;
        int64_t c = r % C, b = r / C;
        int64_t tok = (t * h + y / 2) * w + x / 2, k = (y % 2) * 2 + x % 2;
        int64_t col = c_fastest ? k * row_ch + c0 + c : (c0 + c) * 4 + k;
        int64_t ri = (b * L + tok) * 4 * row_ch + col;
        if (to_rows)
            ghc_st(rows, ri, ghc_ld((const TL *)lat, i));
        else
            ghc_st(lat, i, ghc_ld((const TR *)rows, ri));
    }
}

/* The written side (rows when to_rows, else lat) is f32 or bf16; the read side any float. */
static int patch_launch(const ghc_tensor_t *lat, const ghc_tensor_t *rows, int64_t c0, bool c_fastest, bool to_rows,
                        void *stream)
{
    ghc_k_device_guard guard(lat);
    cudaStream_t s = (cudaStream_t)stream;
    int64_t n = ghc_tensor_numel(lat);
    if (n == 0)
        return 0;
    int64_t C = ghc_tensor_dim(lat, 1), T = ghc_tensor_dim(lat, 2), Hl = ghc_tensor_dim(lat, 3);
    int64_t Wl = ghc_tensor_dim(lat, 4), row_ch = ghc_tensor_dim(rows, 2) / 4;
    void *lp = (void *)ghc_tensor_cdata(lat), *rp = (void *)ghc_tensor_cdata(rows);
    enum ghc_dtype src = to_rows ? ghc_tensor_dtype(lat) : ghc_tensor_dtype(rows);
    enum ghc_dtype dst = to_rows ? ghc_tensor_dtype(rows) : ghc_tensor_dtype(lat);
    return ghc_k_dispatch_float(src, [&](auto ts) {
        using TS = decltype(ts);
        return ghc_k_dispatch(dst, [&](auto td) {
            using TD = decltype(td);
            if (to_rows)
                k_patch<TS, TD><<<ghc_k_blocks(n, 256), 256, 0, s>>>((TS *)lp, (TD *)rp, n, C, T, Hl, Wl, row_ch, c0,
                                                                     c_fastest, true);
            else
                k_patch<TD, TS><<<ghc_k_blocks(n, 256), 256, 0, s>>>((TD *)lp, (TS *)rp, n, C, T, Hl, Wl, row_ch, c0,
                                                                     c_fastest, false);
            return (int)cudaGetLastError();
        });
    });
}

extern "C" int ghc_k_patchify(ghc_tensor_t *rows, const ghc_tensor_t *lat, const ghc_tensor_t *cond, void *stream)
{
    int err = patch_launch(lat, rows, 0, false, true, stream);
    if (!err && cond)
        err = patch_launch(cond, rows, ghc_tensor_dim(lat, 1), false, true, stream);
    return err;
}

extern "C" int ghc_k_patchify_bwd(ghc_tensor_t *dlat, const ghc_tensor_t *drows, void *stream)
{
    return patch_launch(dlat, drows, 0, false, false, stream);
}

extern "C" int ghc_k_unpatchify(ghc_tensor_t *out, const ghc_tensor_t *rows, void *stream)
{
    return patch_launch(out, rows, 0, true, false, stream);
}

extern "C" int ghc_k_unpatchify_bwd(ghc_tensor_t *drows, const ghc_tensor_t *dout, void *stream)
{
    return patch_launch(dout, drows, 0, true, true, stream);
}
