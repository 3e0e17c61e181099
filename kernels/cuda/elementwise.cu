/* elementwise.cu: activations (GELU-tanh, SiLU and their backwards), add, mul, the gated
 * residual and scale, with the broadcasting of ops.h, as kernels/cpu/elementwise.c computes
 * them: every element in fp32, rounded once to the output dtype. One grid-stride kernel
 * template serves all of them: y[i] = op(a[i], b[i], c[bcast(i)]), 4 elements per step when
 * the pointers and the broadcast allow. y may be a (in place). GELU also writes into a column
 * view y (k_ew_rows). */
#include "common.cuh"

/* ---- broadcasting ------------------------------------------------------------------------- */

/* Index of element i's partner in c: c like a (mode 0), [D] (mode 1), or [B, D] for a of
 * [B, ..., D] (mode 2, per_sample = numel / B elements each). 32-bit division when the
 * indices fit. */
struct bcast {
    int     mode;
    bool    small;
    int64_t D, per_sample;
};

static bcast bcast_of(const ghc_tensor_t *a, const ghc_tensor_t *c)
{
    int64_t n = ghc_tensor_numel(a), D = ghc_tensor_dim(a, -1), B = ghc_tensor_dim(a, 0);
    bcast bc = { 0, n < ((int64_t)1 << 31), D ? D : 1, 1 };
    if (!c || ghc_tensor_same_shape(a, c))
        return bc;
    if (ghc_tensor_ndim(c) == 1) {
        bc.mode = 1;
    } else {
        bc.mode = 2;
        bc.per_sample = B ? n / B : 1;
        if (bc.per_sample < 1)
            bc.per_sample = 1;
    }
    return bc;
}

GHC_D int64_t bcast_index(const bcast &bc, int64_t i)
{
    if (bc.mode == 0)
        return i;
    if (bc.small) {
        uint32_t ui = (uint32_t)i, D = (uint32_t)bc.D;
        return bc.mode == 1 ? ui % D : (ui / (uint32_t)bc.per_sample) * D + ui % D;
    }
    return bc.mode == 1 ? i % bc.D : (i / bc.per_sample) * bc.D + i % bc.D;
}

/* ---- the kernel --------------------------------------------------------------------------- */

/* b is read at i (like a), c at bcast(i); either may be NULL (the op ignores it then). */
template <typename Op, typename TY, typename TA, typename TB, typename TC>
static __global__ void k_ew(TY *y, const TA *a, const TB *b, const TC *c, int64_t n, bcast bc, Op op, bool vec)
{
    int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, stride = (int64_t)gridDim.x * blockDim.x;
    int64_t done = 0;
    if (vec) {
        int64_t n4 = n / 4;
        for (int64_t g = t; g < n4; g += stride) {
            int64_t i = 4 * g;
            float va[4], vb[4] = { 0, 0, 0, 0 }, vc[4] = { 0, 0, 0, 0 }, out[4];
            ghc_ld4(a, i, va);
            if (b)
                ghc_ld4(b, i, vb);
            if (c)
                ghc_ld4(c, bcast_index(bc, i), vc);   /* 4 | D: the 4 stay in one row of c */
#pragma unroll
            for (int u = 0; u < 4; u++)
                out[u] = op(va[u], vb[u], vc[u]);
            ghc_st4(y, i, out);
        }
        done = 4 * n4;
    }
    for (int64_t i = done + t; i < n; i += stride) {
        float vb = b ? ghc_ld(b, i) : 0.0f, vc = c ? ghc_ld(c, bcast_index(bc, i)) : 0.0f;
        ghc_st(y, i, op(ghc_ld(a, i), vb, vc));
    }
}

/* y[r, j] = op(a[r, j]) for y a column view (rows ldy apart) and a dense [rows, D]: a block per
 * row at a time, V elements per step (V = 4: D and ldy multiples of 4, pointers aligned). */
template <int V, typename Op, typename TY, typename TA>
static __global__ void k_ew_rows(TY *y, int64_t ldy, const TA *a, int64_t rows, int64_t D, Op op)
{
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)
        for (int64_t j = V * (int64_t)threadIdx.x; j < D; j += V * (int64_t)blockDim.x) {
            float v[V];
            if constexpr (V == 4)
                ghc_ld4(a, r * D + j, v);
            else
                v[0] = ghc_ld(a, r * D + j);
#pragma unroll
            for (int u = 0; u < V; u++)
                v[u] = op(v[u], 0.0f, 0.0f);
            if constexpr (V == 4)
                ghc_st4(y, r * ldy + j, v);
            else
                ghc_st(y, r * ldy + j, v[0]);
        }
}

/* ghc_k_dispatch for an operand slot that the op uses (USED), else f32 only: no kernels are
 * instantiated for dtypes of absent operands. */
template <bool USED, typename F>
static int dispatch_slot(enum ghc_dtype dt, F f)
{
    if constexpr (USED)
        return ghc_k_dispatch(dt, f);
    else
        return f(float{});
}

/* Launch op over y, a (full), b (full or NULL) and c (broadcast or NULL), f32 or bf16 each.
 * HAS_B, HAS_C: whether the op has those operands at all. */
template <bool HAS_B, bool HAS_C, typename Op>
static int ew_launch(ghc_tensor_t *y, const ghc_tensor_t *a, const ghc_tensor_t *b, const ghc_tensor_t *c, Op op,
                     void *stream)
{
    ghc_k_device_guard guard(a);
    cudaStream_t s = (cudaStream_t)stream;
    int64_t n = ghc_tensor_numel(a);
    if (n == 0)
        return 0;
    bcast bc = bcast_of(a, c);
    void *yp = ghc_tensor_data(y);
    const void *ap = ghc_tensor_cdata(a), *bp = b ? ghc_tensor_cdata(b) : NULL, *cp = c ? ghc_tensor_cdata(c) : NULL;
    enum ghc_dtype db = b ? ghc_tensor_dtype(b) : GHC_DTYPE_F32, dc = c ? ghc_tensor_dtype(c) : GHC_DTYPE_F32;
    return ghc_k_dispatch(ghc_tensor_dtype(y), [&](auto ty) {
        using TY = decltype(ty);
        return ghc_k_dispatch(ghc_tensor_dtype(a), [&](auto ta) {
            using TA = decltype(ta);
            return dispatch_slot<HAS_B>(db, [&](auto tb) {
                using TB = decltype(tb);
                return dispatch_slot<HAS_C>(dc, [&](auto tc) {
                    using TC = decltype(tc);
                    bool vec = ghc_k_aligned(yp, sizeof(TY), 4) && ghc_k_aligned(ap, sizeof(TA), 4) &&
                               ghc_k_aligned(bp, sizeof(TB), 4) && ghc_k_aligned(cp, sizeof(TC), 4) &&
                               (bc.mode == 0 || bc.D % 4 == 0);
                    k_ew<Op, TY, TA, TB, TC><<<ghc_k_blocks(vec ? n / 4 + 1 : n, 256), 256, 0, s>>>(
                        (TY *)yp, (const TA *)ap, (const TB *)bp, (const TC *)cp, n, bc, op, vec);
                    return (int)cudaGetLastError();
                });
            });
        });
    });
}

/* Launch a unary op into a column view y from a dense a (k_ew_rows). */
template <typename Op>
static int ew_rows_launch(ghc_tensor_t *y, const ghc_tensor_t *a, Op op, void *stream)
{
    ghc_k_device_guard guard(a);
    cudaStream_t s = (cudaStream_t)stream;
    const int64_t n = ghc_tensor_numel(a), D = ghc_tensor_dim(a, -1), ldy = ghc_tensor_row_stride(y);
    if (n == 0)
        return 0;
    const int64_t rows = n / D;
    void *yp = ghc_tensor_data(y);
    const void *ap = ghc_tensor_cdata(a);
    return ghc_k_dispatch(ghc_tensor_dtype(y), [&](auto ty) {
        using TY = decltype(ty);
        return ghc_k_dispatch(ghc_tensor_dtype(a), [&](auto ta) {
            using TA = decltype(ta);
            const bool vec = D % 4 == 0 && ldy % 4 == 0 && ghc_k_aligned(yp, sizeof(TY), 4) &&
                             ghc_k_aligned(ap, sizeof(TA), 4);
            const int64_t cap = ghc_k_blocks(vec ? n / 4 : n, 256);
            const unsigned blocks = (unsigned)(rows < cap ? rows : cap);
            if (vec)
                k_ew_rows<4, Op, TY, TA><<<blocks, 256, 0, s>>>((TY *)yp, ldy, (const TA *)ap, rows, D, op);
            else
                k_ew_rows<1, Op, TY, TA><<<blocks, 256, 0, s>>>((TY *)yp, ldy, (const TA *)ap, rows, D, op);
            return (int)cudaGetLastError();
        });
    });
}

/* ---- ops ---------------------------------------------------------------------------------- */

#define GELU_K 0.7978845608028654f   /* sqrt(2 / pi) */
#define GELU_C 0.044715f

struct op_gelu {
    __device__ float operator()(float z, float, float) const
    {
        return 0.5f * z * (1.0f + tanhf(GELU_K * (z + GELU_C * z * z * z)));
    }
};

struct op_gelu_bwd {   /* a = dy, b = x */
    __device__ float operator()(float dy, float z, float) const
    {
        float t = tanhf(GELU_K * (z + GELU_C * z * z * z));
        return dy * (0.5f * (1.0f + t) + 0.5f * z * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * GELU_C * z * z));
    }
};

struct op_silu {
    __device__ float operator()(float z, float, float) const { return z * (1.0f / (1.0f + expf(-z))); }
};

struct op_silu_bwd {   /* a = dy, b = x */
    __device__ float operator()(float dy, float z, float) const
    {
        float s = 1.0f / (1.0f + expf(-z));
        return dy * s * (1.0f + z * (1.0f - s));
    }
};

struct op_add {        /* a, c = b broadcast */
    float alpha, beta;
    __device__ float operator()(float a, float, float b) const { return alpha * a + beta * b; }
};

struct op_mul {
    __device__ float operator()(float a, float, float b) const { return a * b; }
};

struct op_residual {   /* a = x, b = y */
    __device__ float operator()(float x, float y, float) const { return x + y; }
};

struct op_gated {      /* a = x, b = y, c = gate */
    __device__ float operator()(float x, float y, float g) const { return x + y * g; }
};

struct op_scale {
    float alpha;
    __device__ float operator()(float x, float, float) const { return alpha * x; }
};

extern "C" int ghc_k_gelu_tanh(ghc_tensor_t *y, const ghc_tensor_t *x, void *stream)
{
    if (ghc_tensor_row_stride(y) != ghc_tensor_dim(y, -1))   /* a column view y (ops.c: x dense) */
        return ew_rows_launch(y, x, op_gelu{}, stream);
    return ew_launch<false, false>(y, x, NULL, NULL, op_gelu{}, stream);
}

extern "C" int ghc_k_gelu_tanh_bwd(ghc_tensor_t *dx, const ghc_tensor_t *dy, const ghc_tensor_t *x, void *stream)
{
    return ew_launch<true, false>(dx, dy, x, NULL, op_gelu_bwd{}, stream);
}

extern "C" int ghc_k_silu(ghc_tensor_t *y, const ghc_tensor_t *x, void *stream)
{
    return ew_launch<false, false>(y, x, NULL, NULL, op_silu{}, stream);
}

extern "C" int ghc_k_silu_bwd(ghc_tensor_t *dx, const ghc_tensor_t *dy, const ghc_tensor_t *x, void *stream)
{
    return ew_launch<true, false>(dx, dy, x, NULL, op_silu_bwd{}, stream);
}

extern "C" int ghc_k_add(ghc_tensor_t *y, const ghc_tensor_t *a, const ghc_tensor_t *b, float alpha, float beta,
                         void *stream)
{
    return ew_launch<false, true>(y, a, NULL, b, op_add{ alpha, beta }, stream);
}

extern "C" int ghc_k_mul(ghc_tensor_t *y, const ghc_tensor_t *a, const ghc_tensor_t *b, void *stream)
{
    return ew_launch<false, true>(y, a, NULL, b, op_mul{}, stream);
}

extern "C" int ghc_k_gated_residual(ghc_tensor_t *out, const ghc_tensor_t *x, const ghc_tensor_t *y,
                                    const ghc_tensor_t *gate, void *stream)
{
    if (!gate)
        return ew_launch<true, false>(out, x, y, NULL, op_residual{}, stream);
    return ew_launch<true, true>(out, x, y, gate, op_gated{}, stream);
}

extern "C" int ghc_k_scale(ghc_tensor_t *y, const ghc_tensor_t *x, float alpha, void *stream)
{
    return ew_launch<false, false>(y, x, NULL, NULL, op_scale{ alpha }, stream);
}
