/* rope.cu: Wan's 3-D rotary position embedding (ghc_op_rope in ops.h), as kernels/cpu/rope.c
 * computes it: adjacent pairs of each head rotate by pos * 10000^(-2j/d_axis) (angles, cos
 * and sin in f64, rounded to f32; the rotation in fp32). One block per token: its Dh/2
 * cos/sin pairs go to shared memory once and serve all H heads; 16-byte accesses of 4 pairs
 * where Dh is a multiple of 8 and the pointers allow (Wan's Dh 128), else of 1 pair. */
#include "common.cuh"
#include "rope.cuh"

template <typename TX, typename TY>
static __global__ void k_rope(TY *y, const TX *x, int64_t L, int64_t H, int Dh, int64_t hh, int64_t ww,
                              bool inverse, int vec)
{
    extern __shared__ float cs[];   /* [P][2]: cos, +-sin */
    int64_t tok = blockIdx.x;       /* b * L + l */
    int P = Dh / 2;
    ghc_rope_angles(cs, Dh, tok % L, hh, ww, inverse);
    __syncthreads();
    /* pair k of the token (head k / P, pair k % P) holds elements 2k, 2k + 1 */
    int64_t base = tok * H * Dh;
    int npairs = (int)H * P;
    if (vec == 8) {   /* Dh % 8 == 0: the 4 pairs of 8 elements share a head; 16-byte accesses */
        const int nv = npairs / 4;
#pragma unroll 2
        for (int k = threadIdx.x; k < nv; k += blockDim.x) {
            const int64_t i = base + 8 * (int64_t)k;
            const int p0 = (4 * k) % P;
            float v[8], out[8];
            ghc_ld8(x, i, v);
#pragma unroll
            for (int u = 0; u < 4; u++) {
                out[2 * u] = v[2 * u];
                out[2 * u + 1] = v[2 * u + 1];
                ghc_rope_rotate(out[2 * u], out[2 * u + 1], cs[2 * (p0 + u)], cs[2 * (p0 + u) + 1]);
            }
            ghc_st8(y, i, out);
        }
        return;
    }
    for (int k = threadIdx.x; k < npairs; k += blockDim.x) {
        int p = k % P;
        int64_t i = base + 2 * (int64_t)k;
        float v[2];
        if (vec == 2) {
            ghc_ld2(x, i, v);
        } else {
            v[0] = ghc_ld(x, i);
            v[1] = ghc_ld(x, i + 1);
        }
        float out[2] = { v[0], v[1] };
        ghc_rope_rotate(out[0], out[1], cs[2 * p], cs[2 * p + 1]);
        if (vec == 2) {
            ghc_st2(y, i, out);
        } else {
            ghc_st(y, i, out[0]);
            ghc_st(y, i + 1, out[1]);
        }
    }
}

extern "C" int ghc_k_rope(ghc_tensor_t *y, const ghc_tensor_t *x, int64_t f, int64_t h, int64_t w, bool inverse,
                          void *stream)
{
    ghc_k_device_guard guard(x);
    cudaStream_t s = (cudaStream_t)stream;
    int64_t B = ghc_tensor_dim(x, 0), L = ghc_tensor_dim(x, 1), H = ghc_tensor_dim(x, 2);
    int64_t Dh = ghc_tensor_dim(x, 3);
    (void)f;
    if (B * L == 0 || H * Dh == 0)
        return 0;
    void *yp = ghc_tensor_data(y);
    const void *xp = ghc_tensor_cdata(x);
    int64_t npairs = H * (Dh / 2);
    int threads = npairs >= 256 ? 256 : (int)((npairs + 31) / 32 * 32);
    size_t smem = (size_t)Dh * sizeof(float);
    return ghc_k_dispatch(ghc_tensor_dtype(x), [&](auto tx) {
        using TX = decltype(tx);
        return ghc_k_dispatch(ghc_tensor_dtype(y), [&](auto ty) {
            using TY = decltype(ty);
            int vec = ghc_k_aligned(xp, sizeof(TX), 2) && ghc_k_aligned(yp, sizeof(TY), 2) ? 2 : 0;
            if (Dh % 8 == 0 && ghc_k_aligned(xp, sizeof(TX), 8) && ghc_k_aligned(yp, sizeof(TY), 8))
                vec = 8;
            k_rope<TX, TY><<<(unsigned)(B * L), threads, smem, s>>>((TY *)yp, (const TX *)xp, L, H, (int)Dh, h, w,
                                                                    inverse, vec);
            return (int)cudaGetLastError();
        });
    });
}
