/* kernels/cpu/gemm.c: the reference GEMM of ops.h: C = alpha op(A) op(B) (+ beta C) (+ bias)
 * (then GELU-tanh), strided batches with shared 2-D operands, fp8 e4m3 operands dequantised
 * with scale_a * scale_b. Operands are widened to f32 once, A as [M, K] rows and B as [N, K]
 * rows (transposed where needed) so every dot product reads two contiguous rows; each
 * accumulates in fp32 in k order (four columns at a time, each its own sequential sum, so the
 * result is the same as one column at a time). */
#include <config.h>

#include <math.h>
#include <stdlib.h>

#include "cpu.h"

static float gelu(float z)
{
    return 0.5f * z * (1.0f + tanhf(0.7978845608028654f * (z + 0.044715f * z * z * z)));
}

/* Each of n [rows, cols] matrices in *p becomes [cols, rows]. */
static int transpose_batches(float **p, int64_t n, int64_t rows, int64_t cols)
{
    float *t = malloc((size_t)(n * rows * cols) * sizeof(float) + 1);
    if (!t)
        return GHC_ENOMEM;
    for (int64_t b = 0; b < n; b++) {
        const float *src = *p + b * rows * cols;
        float *dst = t + b * rows * cols;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++)
                dst[c * rows + r] = src[r * cols + c];
    }
    free(*p);
    *p = t;
    return 0;
}

int ghc_cpu_gemm(ghc_tensor_t *c, const ghc_tensor_t *a, const ghc_tensor_t *b, const struct ghc_gemm *args)
{
    int rc = 0;
    bool ta = args->trans_a, tb = args->trans_b;
    int64_t M = ghc_tensor_dim(a, ta ? -1 : -2), K = ghc_tensor_dim(a, ta ? -2 : -1);
    int64_t N = ghc_tensor_dim(b, tb ? -2 : -1);
    int64_t batch = ghc_tensor_ndim(c) == 3 ? ghc_tensor_dim(c, 0) : 1;
    int64_t stride_a = ghc_tensor_ndim(a) == 3 ? M * K : 0, stride_b = ghc_tensor_ndim(b) == 3 ? K * N : 0;
    float alpha = args->alpha != 0.0f ? args->alpha : 1.0f;
    if (ghc_tensor_dtype(a) == GHC_DTYPE_F8_E4M3)
        alpha *= (args->scale_a != 0.0f ? args->scale_a : 1.0f) * (args->scale_b != 0.0f ? args->scale_b : 1.0f);
    float beta = args->beta;
    const int64_t ldc = ghc_tensor_row_stride(c);   /* C's rows (a column view's are further apart) */
    const ghc_tensor_t *bias = args->epilogue != GHC_EPI_NONE ? args->bias : NULL;
    bool use_gelu = args->epilogue == GHC_EPI_BIAS_GELU;

    float *fa = ghc_cpu_f32_copy(a, "gemm"), *fb = NULL;
    if (!fa) {
        rc = GHC_ENOMEM;
        goto out;
    }
    if (!(fb = ghc_cpu_f32_copy(b, "gemm"))) {
        rc = GHC_ENOMEM;
        goto out_a;
    }
    /* rows of op(A) and columns of op(B), contiguous in k */
    int64_t na = ghc_tensor_ndim(a) == 3 ? batch : 1, nb = ghc_tensor_ndim(b) == 3 ? batch : 1;
    if (ta && (rc = transpose_batches(&fa, na, K, M)) < 0)
        goto out_b;
    if (!tb && (rc = transpose_batches(&fb, nb, K, N)) < 0)
        goto out_b;
    for (int64_t bi = 0; bi < batch; bi++) {
        const float *pa = fa + bi * stride_a, *pb = fb + bi * stride_b;
        for (int64_t m = 0; m < M; m++) {
            const float *ra = pa + m * K;
            int64_t n = 0;
            float acc[4];
            for (; n < N; n += 4) {
                int64_t w = N - n < 4 ? N - n : 4;
                if (w == 4) {
                    const float *r0 = pb + n * K, *r1 = r0 + K, *r2 = r1 + K, *r3 = r2 + K;
                    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
                    for (int64_t k = 0; k < K; k++) {
                        float av = ra[k];
                        s0 += av * r0[k];
                        s1 += av * r1[k];
                        s2 += av * r2[k];
                        s3 += av * r3[k];
                    }
                    acc[0] = s0, acc[1] = s1, acc[2] = s2, acc[3] = s3;
                } else {
                    for (int64_t j = 0; j < w; j++) {
                        const float *rb = pb + (n + j) * K;
                        float sj = 0.0f;
                        for (int64_t k = 0; k < K; k++)
                            sj += ra[k] * rb[k];
                        acc[j] = sj;
                    }
                }
                for (int64_t j = 0; j < w; j++) {
                    int64_t ic = (bi * M + m) * ldc + n + j;
                    float v = alpha * acc[j];
                    if (beta != 0.0f)
                        v += beta * GHC_CPU_GET(c, ic);
                    if (bias)
                        v += GHC_CPU_GET(bias, n + j);
                    if (use_gelu) {
                        if (args->pre_gelu)   /* dense, C a column view or not */
                            GHC_CPU_SET(args->pre_gelu, (bi * M + m) * N + n + j, v);
                        v = gelu(v);
                    }
                    GHC_CPU_SET(c, ic, v);
                }
            }
        }
    }
out_b:
    free(fb);
out_a:
    free(fa);
out:
    return rc;
}

/* ghc_op_lora_cast_bwd: each row of dy cast into g, then dh's row from the rounded g and b
 * (fp32 sums in m order) and db's sums (fp32, in row order, added to db at the end like a GEMM with
 * beta 1); then the copy of a. */
int ghc_cpu_lora_cast_bwd(ghc_tensor_t *g, ghc_tensor_t *dh, ghc_tensor_t *db, const ghc_tensor_t *dy,
                          const ghc_tensor_t *h, const ghc_tensor_t *b, float scale, ghc_tensor_t *wrows,
                          const ghc_tensor_t *a)
{
    const int64_t M = ghc_tensor_dim(g, -1), r = ghc_tensor_dim(b, 1), N = ghc_tensor_numel(g) / M;
    const int64_t ldg = ghc_tensor_row_stride(g), ldy = ghc_tensor_row_stride(dy);
    const int64_t ldh = ghc_tensor_row_stride(h), ldd = ghc_tensor_row_stride(dh);
    const enum ghc_dtype gdt = ghc_tensor_dtype(g), ydt = ghc_tensor_dtype(dy);
    float *row = malloc((size_t)M * sizeof(float) + 1), *acc = calloc((size_t)(M * r) + 1, sizeof(float));
    float *bf = ghc_cpu_f32_copy(b, "lora_cast_bwd");
    if (!row || !acc || !bf) {
        free(row);
        free(acc);
        free(bf);
        return bf ? ghc_error_set(ghc_tensor_core(g), GHC_ENOMEM, "lora_cast_bwd: out of memory") : GHC_ENOMEM;
    }
    for (int64_t i = 0; i < M * r; i++)   /* b as g's dtype holds it */
        bf[i] = ghc_cpu_round(gdt, bf[i]);
    for (int64_t n = 0; n < N; n++) {
        for (int64_t m = 0; m < M; m++) {
            float v = ghc_cpu_load(ghc_tensor_cdata(dy), ydt, n * ldy + m);
            ghc_cpu_store(ghc_tensor_data(g), gdt, n * ldg + m, v);
            row[m] = ghc_cpu_load(ghc_tensor_cdata(g), gdt, n * ldg + m);
        }
        for (int64_t j = 0; j < r; j++) {
            float s = 0.0f, hv = ghc_cpu_load(ghc_tensor_cdata(h), gdt, n * ldh + j);
            for (int64_t m = 0; m < M; m++) {
                s += row[m] * bf[m * r + j];
                acc[m * r + j] += row[m] * hv;
            }
            ghc_cpu_store(ghc_tensor_data(dh), gdt, n * ldd + j, scale * s);
        }
    }
    float *d = ghc_tensor_data(db);
    for (int64_t i = 0; i < M * r; i++)
        d[i] += acc[i];
    free(row);
    free(acc);
    free(bf);
    return wrows ? ghc_cpu_cast(wrows, a, 1.0f, NULL) : 0;
}

/* ghc_op_lora_fwd: each h[n, j] an fp32 sum in k order over x's row and a's row j (rounded to
 * x's dtype), scaled and rounded; then the copies. */
int ghc_cpu_lora_fwd(ghc_tensor_t *h, ghc_tensor_t *keep, const ghc_tensor_t *x, const ghc_tensor_t *a, float scale,
                     ghc_tensor_t *wcols, const ghc_tensor_t *b)
{
    const int64_t r = ghc_tensor_dim(h, -1), N = ghc_tensor_numel(h) / r, ldh = ghc_tensor_row_stride(h);
    const enum ghc_dtype dt = ghc_tensor_dtype(h);
    int rc = 0;
    if (!x) {
        rc = ghc_cpu_cast(h, keep, 1.0f, NULL);
    } else {
        const int64_t K = ghc_tensor_dim(a, 1), ldx = ghc_tensor_row_stride(x);
        float *af = ghc_cpu_f32_copy(a, "lora_fwd");
        if (!af)
            return GHC_ENOMEM;
        for (int64_t i = 0; i < r * K; i++)
            af[i] = ghc_cpu_round(dt, af[i]);
        for (int64_t n = 0; n < N; n++)
            for (int64_t j = 0; j < r; j++) {
                float s = 0.0f;
                for (int64_t k = 0; k < K; k++)
                    s += ghc_cpu_load(ghc_tensor_cdata(x), dt, n * ldx + k) * af[j * K + k];
                ghc_cpu_store(ghc_tensor_data(h), dt, n * ldh + j, scale * s);
            }
        free(af);
        if (keep)
            rc = ghc_cpu_cast(keep, h, 1.0f, NULL);
    }
    return rc == 0 && wcols ? ghc_cpu_cast(wcols, b, 1.0f, NULL) : rc;
}
