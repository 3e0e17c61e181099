/* kernels/cpu/norm.c: LayerNorm (optional affine, optional shift/scale modulation) and
 * RMSNorm, forward and input backward. Row statistics in fp32, two passes (mean, then the
 * centred sum of squares), as ops.h describes. */
#include <config.h>

#include <math.h>
#include <stdlib.h>

#include "cpu.h"

/* ---- LayerNorm ---------------------------------------------------------------------------- */

int ghc_cpu_layernorm_fwd(ghc_tensor_t *y, ghc_tensor_t *stats, const ghc_tensor_t *x, const ghc_tensor_t *weight,
                          const ghc_tensor_t *bias, const ghc_tensor_t *shift, const ghc_tensor_t *scale, float eps)
{
    int64_t D = ghc_tensor_dim(x, -1), rows = ghc_tensor_numel(x) / D;
    const int64_t ldy = ghc_tensor_row_stride(y);   /* y may be a column view */
    struct ghc_cpu_bcast bsh = shift ? ghc_cpu_bcast_init(x, shift) : (struct ghc_cpu_bcast){ 0 };
    struct ghc_cpu_bcast bsc = scale ? ghc_cpu_bcast_init(x, scale) : (struct ghc_cpu_bcast){ 0 };
    float *st = stats ? ghc_tensor_data(stats) : NULL;
    for (int64_t r = 0; r < rows; r++) {
        int64_t o = r * D;
        float sum = 0.0f, sq = 0.0f;
        for (int64_t j = 0; j < D; j++)
            sum += GHC_CPU_GET(x, o + j);
        float mean = sum / (float)D;
        for (int64_t j = 0; j < D; j++) {
            float d = GHC_CPU_GET(x, o + j) - mean;
            sq += d * d;
        }
        float rstd = 1.0f / sqrtf(sq / (float)D + eps);
        if (st) {
            st[2 * r] = mean;
            st[2 * r + 1] = rstd;
        }
        for (int64_t j = 0; j < D; j++) {
            int64_t i = o + j;
            float v = (GHC_CPU_GET(x, i) - mean) * rstd;
            if (weight)
                v *= GHC_CPU_GET(weight, j);
            if (bias)
                v += GHC_CPU_GET(bias, j);
            if (scale)
                v *= 1.0f + GHC_CPU_GET(scale, ghc_cpu_bcast_index(&bsc, i));
            if (shift)
                v += GHC_CPU_GET(shift, ghc_cpu_bcast_index(&bsh, i));
            GHC_CPU_SET(y, r * ldy + j, v);
        }
    }
    return 0;
}

int ghc_cpu_layernorm_bwd(ghc_tensor_t *dx, const ghc_tensor_t *dy, const ghc_tensor_t *x, const ghc_tensor_t *stats,
                          const ghc_tensor_t *weight, const ghc_tensor_t *scale, bool accumulate)
{
    int64_t D = ghc_tensor_dim(x, -1), rows = ghc_tensor_numel(x) / D;
    struct ghc_cpu_bcast bsc = scale ? ghc_cpu_bcast_init(x, scale) : (struct ghc_cpu_bcast){ 0 };
    const float *st = ghc_tensor_cdata(stats);
    float *da = malloc((size_t)D * sizeof(float));
    if (!da)
        return ghc_error_set(ghc_tensor_core(dx), GHC_ENOMEM, "layernorm_bwd: no memory for %lld floats",
                             (long long)D);
    for (int64_t r = 0; r < rows; r++) {
        int64_t o = r * D;
        float mean = st[2 * r], rstd = st[2 * r + 1];
        float m_da = 0.0f, m_dax = 0.0f;
        for (int64_t j = 0; j < D; j++) {
            int64_t i = o + j;
            float g = GHC_CPU_GET(dy, i);
            if (scale)
                g *= 1.0f + GHC_CPU_GET(scale, ghc_cpu_bcast_index(&bsc, i));
            if (weight)
                g *= GHC_CPU_GET(weight, j);
            da[j] = g;
            m_da += g;
            m_dax += g * (GHC_CPU_GET(x, i) - mean) * rstd;
        }
        m_da /= (float)D;
        m_dax /= (float)D;
        for (int64_t j = 0; j < D; j++) {
            int64_t i = o + j;
            float xhat = (GHC_CPU_GET(x, i) - mean) * rstd;
            float v = rstd * (da[j] - m_da - xhat * m_dax);
            if (accumulate)
                v += GHC_CPU_GET(dx, i);
            GHC_CPU_SET(dx, i, v);
        }
    }
    free(da);
    return 0;
}

/* ---- RMSNorm ------------------------------------------------------------------------------ */

int ghc_cpu_rmsnorm_fwd(ghc_tensor_t *y, ghc_tensor_t *rstd, const ghc_tensor_t *x, const ghc_tensor_t *weight,
                        float eps)
{
    int64_t D = ghc_tensor_dim(x, -1), rows = ghc_tensor_numel(x) / D;
    enum ghc_dtype ydt = ghc_tensor_dtype(y);
    float *rs = rstd ? ghc_tensor_data(rstd) : NULL;
    for (int64_t r = 0; r < rows; r++) {
        int64_t o = r * D;
        float sq = 0.0f;
        for (int64_t j = 0; j < D; j++) {
            float v = GHC_CPU_GET(x, o + j);
            sq += v * v;
        }
        float s = 1.0f / sqrtf(sq / (float)D + eps);
        if (rs)
            rs[r] = s;
        for (int64_t j = 0; j < D; j++) {
            float n = ghc_cpu_round(ydt, GHC_CPU_GET(x, o + j) * s);   /* cast to y's dtype first */
            GHC_CPU_SET(y, o + j, n * GHC_CPU_GET(weight, j));
        }
    }
    return 0;
}

int ghc_cpu_rmsnorm_bwd(ghc_tensor_t *dx, const ghc_tensor_t *dy, const ghc_tensor_t *x, const ghc_tensor_t *rstd,
                        const ghc_tensor_t *weight)
{
    int64_t D = ghc_tensor_dim(x, -1), rows = ghc_tensor_numel(x) / D;
    const float *rs = ghc_tensor_cdata(rstd);
    for (int64_t r = 0; r < rows; r++) {
        int64_t o = r * D;
        float s = rs[r], m = 0.0f;
        for (int64_t j = 0; j < D; j++)
            m += GHC_CPU_GET(x, o + j) * GHC_CPU_GET(weight, j) * GHC_CPU_GET(dy, o + j);
        m /= (float)D;
        float s3 = s * s * s;
        for (int64_t j = 0; j < D; j++) {
            int64_t i = o + j;
            float g = GHC_CPU_GET(weight, j) * GHC_CPU_GET(dy, i);
            GHC_CPU_SET(dx, i, s * g - GHC_CPU_GET(x, i) * s3 * m);
        }
    }
    return 0;
}

/* ---- RMSNorm with RoPE (ghc_op_rmsnorm_rope_fwd / _bwd) -------------------------------------- */

/* Row r's pairs rotated in place: v holds the row's D values already rounded to the dtype dt
 * of the tensor the unfused ops pass them through; each pair's result is rounded likewise. */
static void rotate_row(float *v, const float *cs, int64_t D, int64_t Dh, enum ghc_dtype dt)
{
    for (int64_t i = 0; i < D; i += 2) {
        const int64_t p = (i % Dh) / 2;
        const float a = v[i], b = v[i + 1], c = cs[2 * p], s = cs[2 * p + 1];
        v[i] = ghc_cpu_round(dt, a * c - b * s);
        v[i + 1] = ghc_cpu_round(dt, a * s + b * c);
    }
}

int ghc_cpu_rmsnorm_rope_fwd(ghc_tensor_t *y, ghc_tensor_t *rstd, const ghc_tensor_t *x, const ghc_tensor_t *weight,
                             float eps, int64_t heads, int64_t h, int64_t w)
{
    const int64_t L = ghc_tensor_dim(x, 1), D = ghc_tensor_dim(x, -1), rows = ghc_tensor_numel(x) / D, Dh = D / heads;
    const enum ghc_dtype ydt = ghc_tensor_dtype(y);
    float *v = malloc((size_t)(D + Dh) * sizeof(float)), *cs = v ? v + D : NULL;
    if (!v)
        return ghc_error_set(ghc_tensor_core(y), GHC_ENOMEM, "rmsnorm_rope_fwd: no memory for %lld floats",
                             (long long)(D + Dh));
    int rc = ghc_cpu_rmsnorm_fwd(y, rstd, x, weight, eps);
    for (int64_t r = 0; r < rows && rc == 0; r++) {
        for (int64_t j = 0; j < D; j++)
            v[j] = GHC_CPU_GET(y, r * D + j);
        ghc_cpu_rope_angles(cs, Dh, r % L, h, w, false);
        rotate_row(v, cs, D, Dh, ydt);
        for (int64_t j = 0; j < D; j++)
            GHC_CPU_SET(y, r * D + j, v[j]);
    }
    free(v);
    return rc;
}

int ghc_cpu_rmsnorm_rope_bwd(ghc_tensor_t *dx, const ghc_tensor_t *dy, const ghc_tensor_t *x, const ghc_tensor_t *rstd,
                             const ghc_tensor_t *weight, int64_t heads, int64_t h, int64_t w)
{
    const int64_t L = ghc_tensor_dim(x, 1), D = ghc_tensor_dim(x, -1), rows = ghc_tensor_numel(x) / D, Dh = D / heads;
    ghc_tensor_t *t = ghc_tensor_init(ghc_tensor_core(dx), ghc_tensor_dtype(dy), ghc_tensor_ndim(dy),
                                      ghc_tensor_shape(dy), GHC_DEVICE_CPU, GHC_ROLE_WORKSPACE);
    float *v = malloc((size_t)(D + Dh) * sizeof(float)), *cs = v ? v + D : NULL;
    int rc = 0;
    if (!t || !v) {
        rc = t ? ghc_error_set(ghc_tensor_core(dx), GHC_ENOMEM, "rmsnorm_rope_bwd: no memory for %lld floats",
                               (long long)(D + Dh))
               : ghc_error_code(ghc_tensor_core(dx));
        goto out;
    }
    for (int64_t r = 0; r < rows; r++) {   /* dy rotated back, in dy's dtype (what ghc_op_rope writes) */
        for (int64_t j = 0; j < D; j++)
            v[j] = GHC_CPU_GET(dy, r * D + j);
        ghc_cpu_rope_angles(cs, Dh, r % L, h, w, true);
        rotate_row(v, cs, D, Dh, ghc_tensor_dtype(dy));
        for (int64_t j = 0; j < D; j++)
            GHC_CPU_SET(t, r * D + j, v[j]);
    }
    rc = ghc_cpu_rmsnorm_bwd(dx, t, x, rstd, weight);
out:
    free(v);
    ghc_tensor_free(t);
    return rc < 0 ? rc : 0;
}
