/* kernels/cpu/reduce.c: sums, means, column sums (bias gradients) and the MSE loss.
 * Reductions accumulate in f64 (ops.h) so that they serve as the reference for the GPU's
 * fp32 tree sums; the result is rounded once. */
#include <config.h>

#include <math.h>
#include <stdlib.h>

#include "cpu.h"

int ghc_cpu_sum(ghc_tensor_t *out, const ghc_tensor_t *x, bool mean)
{
    int64_t n = ghc_tensor_numel(x);
    double s = 0.0;
    for (int64_t i = 0; i < n; i++)
        s += GHC_CPU_GET(x, i);
    if (mean)
        s = n ? s / (double)n : NAN;
    *(float *)ghc_tensor_data(out) = (float)s;
    return 0;
}

int ghc_cpu_sum_rows(ghc_tensor_t *out, const ghc_tensor_t *x)
{
    int64_t D = ghc_tensor_dim(x, -1), rows = D ? ghc_tensor_numel(x) / D : 0;
    double *acc = calloc((size_t)D, sizeof(double));
    if (!acc)
        return ghc_error_set(ghc_tensor_core(out), GHC_ENOMEM, "sum_rows: no memory for %lld doubles",
                             (long long)D);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < D; j++)
            acc[j] += GHC_CPU_GET(x, r * D + j);
    for (int64_t j = 0; j < D; j++)
        GHC_CPU_SET(out, j, (float)acc[j]);
    free(acc);
    return 0;
}

int ghc_cpu_mse_loss(ghc_tensor_t *loss, ghc_tensor_t *grad, const ghc_tensor_t *pred, const ghc_tensor_t *target)
{
    int64_t n = ghc_tensor_numel(pred);
    double s = 0.0;
    float g = n ? 2.0f / (float)n : NAN;
    for (int64_t i = 0; i < n; i++) {
        float d = GHC_CPU_GET(pred, i) - GHC_CPU_GET(target, i);
        s += (double)d * d;
        if (grad)
            GHC_CPU_SET(grad, i, g * d);
    }
    *(float *)ghc_tensor_data(loss) = (float)(n ? s / (double)n : NAN);
    return 0;
}
