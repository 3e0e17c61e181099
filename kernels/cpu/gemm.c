/* kernels/cpu/gemm.c: the reference GEMM of ops.h: C = alpha op(A) op(B) (+ beta C) (+ bias)
 * (then GELU-tanh), strided batches with shared 2-D operands, fp8 e4m3 operands dequantised
 * with scale_a * scale_b. Operands are widened to f32 once; each dot product accumulates in
 * fp32 in k order. */
#include <config.h>

#include <math.h>
#include <stdlib.h>

#include "cpu.h"

static float gelu(float z)
{
    return 0.5f * z * (1.0f + tanhf(0.7978845608028654f * (z + 0.044715f * z * z * z)));
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
    for (int64_t bi = 0; bi < batch; bi++) {
        const float *pa = fa + bi * stride_a, *pb = fb + bi * stride_b;
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) {
                float acc = 0.0f;
                for (int64_t k = 0; k < K; k++) {
                    float av = ta ? pa[k * M + m] : pa[m * K + k];
                    float bv = tb ? pb[n * K + k] : pb[k * N + n];
                    acc += av * bv;
                }
                int64_t ic = (bi * M + m) * N + n;
                float v = alpha * acc;
                if (beta != 0.0f)
                    v += beta * GHC_CPU_GET(c, ic);
                if (bias)
                    v += GHC_CPU_GET(bias, n);
                if (use_gelu) {
                    if (args->pre_gelu)
                        GHC_CPU_SET(args->pre_gelu, ic, v);
                    v = gelu(v);
                }
                GHC_CPU_SET(c, ic, v);
            }
    }
    free(fb);
out_a:
    free(fa);
out:
    return rc;
}
