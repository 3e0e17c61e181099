/* kernels/cpu/patch.c: Wan's 2x2 spatial patches (ghc_op_patchify in ops.h): patchify, the I2V
 * channel concatenation and unpatchify, and their backwards. Pure permutations: every element
 * is loaded as f32 and stored once in the destination's dtype (exact for an f32 destination). */
#include <config.h>

#include "cpu.h"

/* Latent lat [B, lat_ch, T, Hl, Wl] <-> rows [B, L, 4 row_ch] with L = T (Hl/2) (Wl/2): channel
 * c of lat is channel c0 + c of the rows; column (c0 + c) * 4 + k (c_fastest false: the patch
 * embedding's Conv3d layout) or k * row_ch + c0 + c (c_fastest true: the head's layout), with
 * k = kh * 2 + kw. to_rows: rows from lat; else lat from rows (the written one is not const
 * to the caller). */
static void permute(const ghc_tensor_t *lat, const ghc_tensor_t *rows, int64_t c0, bool c_fastest, bool to_rows)
{
    const int64_t B = ghc_tensor_dim(lat, 0), lat_ch = ghc_tensor_dim(lat, 1), T = ghc_tensor_dim(lat, 2);
    const int64_t Hl = ghc_tensor_dim(lat, 3), Wl = ghc_tensor_dim(lat, 4), h = Hl / 2, w = Wl / 2, L = T * h * w;
    const int64_t P = 4, row_ch = ghc_tensor_dim(rows, 2) / P;
    for (int64_t b = 0; b < B; b++)
        for (int64_t c = 0; c < lat_ch; c++)
            for (int64_t t = 0; t < T; t++)
                for (int64_t y = 0; y < Hl; y++)
                    for (int64_t x = 0; x < Wl; x++) {
                        int64_t li = (((b * lat_ch + c) * T + t) * Hl + y) * Wl + x;
                        int64_t tok = (t * h + y / 2) * w + x / 2, k = (y % 2) * 2 + x % 2;
                        int64_t col = c_fastest ? k * row_ch + c0 + c : (c0 + c) * P + k;
                        int64_t ri = (b * L + tok) * P * row_ch + col;
                        if (to_rows)
                            GHC_CPU_SET((ghc_tensor_t *)rows, ri, GHC_CPU_GET(lat, li));
                        else
                            GHC_CPU_SET((ghc_tensor_t *)lat, li, GHC_CPU_GET(rows, ri));
                    }
}

int ghc_cpu_patchify(ghc_tensor_t *rows, const ghc_tensor_t *lat, const ghc_tensor_t *cond)
{
    permute(lat, rows, 0, false, true);
    if (cond)
        permute(cond, rows, ghc_tensor_dim(lat, 1), false, true);
    return 0;
}

int ghc_cpu_patchify_bwd(ghc_tensor_t *dlat, const ghc_tensor_t *drows)
{
    permute(dlat, drows, 0, false, false);
    return 0;
}

int ghc_cpu_unpatchify(ghc_tensor_t *out, const ghc_tensor_t *rows)
{
    permute(out, rows, 0, true, false);
    return 0;
}

int ghc_cpu_unpatchify_bwd(ghc_tensor_t *drows, const ghc_tensor_t *dout)
{
    permute(dout, drows, 0, true, true);
    return 0;
}

/* Rows of x, zero-padded and masked (ghc_op_pad_rows): each row of y is written once. */
int ghc_cpu_pad_rows(ghc_tensor_t *y, const ghc_tensor_t *x, const ghc_tensor_t *mask)
{
    const int64_t B = ghc_tensor_dim(y, 0), Ly = ghc_tensor_dim(y, 1), D = ghc_tensor_dim(y, 2);
    const int64_t Lx = ghc_tensor_dim(x, 1);
    for (int64_t b = 0; b < B; b++)
        for (int64_t r = 0; r < Ly; r++) {
            bool keep = r < Lx && !(mask && GHC_CPU_GET(mask, b * Lx + r) == 0.0f);
            for (int64_t d = 0; d < D; d++)
                GHC_CPU_SET(y, (b * Ly + r) * D + d, keep ? GHC_CPU_GET(x, (b * Lx + r) * D + d) : 0.0f);
        }
    return 0;
}
