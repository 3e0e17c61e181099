/* kernels/cpu/elementwise.c: activations (GELU-tanh, SiLU and their backwards), the binary
 * ops with the broadcasting of ops.h, and the shared helpers of kernels/cpu/. Every element
 * is computed in fp32 and rounded once to the output dtype. */
#include <config.h>

#include <math.h>
#include <stdlib.h>

#include "cpu.h"

/* ---- helpers ------------------------------------------------------------------------------ */

float *ghc_cpu_f32_copy(const ghc_tensor_t *t, const char *op)
{
    int64_t n = ghc_tensor_numel(t);
    float *p = malloc((size_t)(n ? n : 1) * sizeof(float));
    if (!p) {
        ghc_error_set(ghc_tensor_core(t), GHC_ENOMEM, "%s: no memory for %lld floats", op, (long long)n);
        return NULL;
    }
    const int64_t D = ghc_tensor_dim(t, -1), ld = ghc_tensor_row_stride(t);
    for (int64_t i = 0; i < n; i++)   /* a column view's rows are ld apart */
        p[i] = GHC_CPU_GET(t, ld == D ? i : i / D * ld + i % D);
    return p;
}

struct ghc_cpu_bcast ghc_cpu_bcast_init(const ghc_tensor_t *a, const ghc_tensor_t *b)
{
    struct ghc_cpu_bcast bc = { 0, ghc_tensor_dim(a, -1), 1 };
    if (ghc_tensor_same_shape(a, b))
        bc.mode = 0;
    else if (ghc_tensor_ndim(b) == 1)
        bc.mode = 1;
    else {
        bc.mode = 2;
        int64_t B = ghc_tensor_dim(a, 0);
        bc.per_sample = B ? ghc_tensor_numel(a) / B : 1;
    }
    if (bc.D == 0)
        bc.D = 1;
    if (bc.per_sample == 0)
        bc.per_sample = 1;
    return bc;
}

/* ---- activations -------------------------------------------------------------------------- */

#define GELU_K 0.7978845608028654f   /* sqrt(2 / pi) */
#define GELU_C 0.044715f

static float gelu(float z)
{
    return 0.5f * z * (1.0f + tanhf(GELU_K * (z + GELU_C * z * z * z)));
}

static float gelu_grad(float z)
{
    float t = tanhf(GELU_K * (z + GELU_C * z * z * z));
    return 0.5f * (1.0f + t) + 0.5f * z * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * GELU_C * z * z);
}

static float sigmoid(float z)
{
    return 1.0f / (1.0f + expf(-z));
}

int ghc_cpu_gelu_tanh(ghc_tensor_t *y, const ghc_tensor_t *x)
{
    int64_t n = ghc_tensor_numel(x);
    const int64_t D = ghc_tensor_dim(x, -1), ldy = ghc_tensor_row_stride(y);   /* y may be a column view */
    for (int64_t i = 0; i < n; i++)
        GHC_CPU_SET(y, ldy == D ? i : i / D * ldy + i % D, gelu(GHC_CPU_GET(x, i)));
    return 0;
}

int ghc_cpu_gelu_tanh_bwd(ghc_tensor_t *dx, const ghc_tensor_t *dy, const ghc_tensor_t *x)
{
    int64_t n = ghc_tensor_numel(x);
    for (int64_t i = 0; i < n; i++)
        GHC_CPU_SET(dx, i, GHC_CPU_GET(dy, i) * gelu_grad(GHC_CPU_GET(x, i)));
    return 0;
}

int ghc_cpu_silu(ghc_tensor_t *y, const ghc_tensor_t *x)
{
    int64_t n = ghc_tensor_numel(x);
    for (int64_t i = 0; i < n; i++) {
        float z = GHC_CPU_GET(x, i);
        GHC_CPU_SET(y, i, z * sigmoid(z));
    }
    return 0;
}

int ghc_cpu_silu_bwd(ghc_tensor_t *dx, const ghc_tensor_t *dy, const ghc_tensor_t *x)
{
    int64_t n = ghc_tensor_numel(x);
    for (int64_t i = 0; i < n; i++) {
        float z = GHC_CPU_GET(x, i), s = sigmoid(z);
        GHC_CPU_SET(dx, i, GHC_CPU_GET(dy, i) * s * (1.0f + z * (1.0f - s)));
    }
    return 0;
}

/* ---- binary ops --------------------------------------------------------------------------- */

int ghc_cpu_add(ghc_tensor_t *y, const ghc_tensor_t *a, const ghc_tensor_t *b, float alpha, float beta)
{
    int64_t n = ghc_tensor_numel(a);
    struct ghc_cpu_bcast bc = ghc_cpu_bcast_init(a, b);
    for (int64_t i = 0; i < n; i++)
        GHC_CPU_SET(y, i, alpha * GHC_CPU_GET(a, i) + beta * GHC_CPU_GET(b, ghc_cpu_bcast_index(&bc, i)));
    return 0;
}

int ghc_cpu_mul(ghc_tensor_t *y, const ghc_tensor_t *a, const ghc_tensor_t *b)
{
    int64_t n = ghc_tensor_numel(a);
    struct ghc_cpu_bcast bc = ghc_cpu_bcast_init(a, b);
    for (int64_t i = 0; i < n; i++)
        GHC_CPU_SET(y, i, GHC_CPU_GET(a, i) * GHC_CPU_GET(b, ghc_cpu_bcast_index(&bc, i)));
    return 0;
}

int ghc_cpu_gated_residual(ghc_tensor_t *out, const ghc_tensor_t *x, const ghc_tensor_t *y, const ghc_tensor_t *gate)
{
    int64_t n = ghc_tensor_numel(x);
    float *op = ghc_tensor_data(out);
    const float *xp = ghc_tensor_cdata(x);
    if (!gate) {
        for (int64_t i = 0; i < n; i++)
            op[i] = xp[i] + GHC_CPU_GET(y, i);
        return 0;
    }
    struct ghc_cpu_bcast bc = ghc_cpu_bcast_init(x, gate);
    for (int64_t i = 0; i < n; i++)
        op[i] = xp[i] + GHC_CPU_GET(y, i) * GHC_CPU_GET(gate, ghc_cpu_bcast_index(&bc, i));
    return 0;
}

int ghc_cpu_scale(ghc_tensor_t *y, const ghc_tensor_t *x, float alpha)
{
    int64_t n = ghc_tensor_numel(x);
    for (int64_t i = 0; i < n; i++)
        GHC_CPU_SET(y, i, alpha * GHC_CPU_GET(x, i));
    return 0;
}
