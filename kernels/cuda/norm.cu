/* norm.cu: LayerNorm (optional affine, optional shift/scale modulation) and RMSNorm, forward
 * and input backward, as kernels/cpu/norm.c computes them: fp32 row statistics in two passes
 * (mean, then the centred sum of squares). One block per row; the row's values are kept in
 * shared memory between passes when they fit (else read again, from L2). Loads are 4-wide when
 * D and the pointers allow. */
#include "common.cuh"
#include "rope.cuh"

/* ---- helpers ------------------------------------------------------------------------------ */

/* V consecutive elements (V = 1, 4 or 8) at p + i. */
template <int V, typename T>
GHC_D void ld_v(const T *p, int64_t i, float v[V])
{
    if constexpr (V == 8)
        ghc_ld8(p, i, v);
    else if constexpr (V == 4)
        ghc_ld4(p, i, v);
    else
        v[0] = ghc_ld(p, i);
}

template <int V, typename T>
GHC_D void st_v(T *p, int64_t i, const float v[V])
{
    if constexpr (V == 8)
        ghc_st8(p, i, v);
    else if constexpr (V == 4)
        ghc_st4(p, i, v);
    else
        ghc_st(p, i, v[0]);
}

/* V values to / from the row cache in shared memory at element j (V-aligned when V > 1). */
template <int V>
GHC_D void cache_st(float *c, int64_t j, const float v[V])
{
    if constexpr (V > 1) {
#pragma unroll
        for (int u = 0; u < V; u += 4)
            *(float4 *)(c + j + u) = make_float4(v[u], v[u + 1], v[u + 2], v[u + 3]);
    } else {
        c[j] = v[0];
    }
}

template <int V>
GHC_D void cache_ld(const float *c, int64_t j, float v[V])
{
    if constexpr (V > 1) {
#pragma unroll
        for (int u = 0; u < V; u += 4) {
            float4 q = *(const float4 *)(c + j + u);
            v[u] = q.x; v[u + 1] = q.y; v[u + 2] = q.z; v[u + 3] = q.w;
        }
    } else {
        v[0] = c[j];
    }
}

/* A small operand of runtime dtype (f32 or bf16): weights [D] and modulation rows. */
struct param {
    const void *p;
    int         bf16;
};

static param param_of(const ghc_tensor_t *t)
{
    return param{ t ? ghc_tensor_cdata(t) : NULL, t && ghc_tensor_dtype(t) == GHC_DTYPE_BF16 };
}

/* Where the modulation row of row r of x starts (kernels/cpu's broadcast rule): b like x
 * (mode 0), [D] (mode 1) or [B, D] for x of [B, ..., D] (mode 2, rows_per_sample rows each). */
struct rowmod {
    param   t;
    int     mode;
    int64_t rows_per_sample;
};

static rowmod rowmod_of(const ghc_tensor_t *x, const ghc_tensor_t *b)
{
    rowmod m = { param_of(b), 0, 1 };
    if (!b || ghc_tensor_same_shape(x, b))
        return m;
    if (ghc_tensor_ndim(b) == 1) {
        m.mode = 1;
    } else {
        int64_t D = ghc_tensor_dim(x, -1), B = ghc_tensor_dim(x, 0);
        int64_t rows = D ? ghc_tensor_numel(x) / D : 0;
        m.mode = 2;
        m.rows_per_sample = B ? rows / B : 1;
        if (m.rows_per_sample < 1)
            m.rows_per_sample = 1;
    }
    return m;
}

GHC_D int64_t rowmod_base(const rowmod &m, int64_t row, int64_t D)
{
    return m.mode == 0 ? row * D : m.mode == 1 ? 0 : (row / m.rows_per_sample) * D;
}

/* Threads per row block for `work` items of one row: a multiple of 32 in [32, 256]. */
static int row_threads(int64_t work)
{
    int64_t t = (work + 31) / 32 * 32;
    return (int)(t < 32 ? 32 : t > 256 ? 256 : t);
}

/* Shared memory for `floats` cached values per row, or 0 (no cache) above the default
 * 48 KiB that needs no opt-in. */
static size_t cache_bytes(int64_t floats)
{
    size_t b = (size_t)floats * sizeof(float);
    return b <= 48 * 1024 ? b : 0;
}

/* n-wide when D is a multiple of n and every row pointer is n-element aligned. */
static bool rows_vec(int n, int64_t D, const void *a, size_t sa, const void *b, size_t sb, const void *c, size_t sc)
{
    return D % n == 0 && ghc_k_aligned(a, sa, n) && ghc_k_aligned(b, sb, n) && ghc_k_aligned(c, sc, n);
}

static bool rows_vec4(int64_t D, const void *a, size_t sa, const void *b, size_t sb, const void *c, size_t sc)
{
    return rows_vec(4, D, a, sa, b, sb, c, sc);
}

/* V values of a small operand from element i (V = 4: i and the pointer 4-element aligned). */
template <int V>
GHC_D void ld_param(const param &p, int64_t i, float v[V])
{
    if constexpr (V == 4) {
        if (p.bf16)
            ghc_ld4((const ghc_bf16 *)p.p, i, v);
        else
            ghc_ld4((const float *)p.p, i, v);
    } else {
        v[0] = ghc_ld_dt(p.p, p.bf16, i);
    }
}

static bool param_vec4(const param &p)
{
    return ghc_k_aligned(p.p, p.bf16 ? 2 : 4, 4);
}

/* ---- LayerNorm forward -------------------------------------------------------------------- */

/* y's rows are ldy apart (D, or a column view's row stride). */
template <typename TX, typename TY, int V, bool CACHE>
static __global__ void k_ln_fwd(TY *y, int64_t ldy, float *stats, const TX *x, param w, param bias, rowmod shift,
                                rowmod scale, int64_t D, float eps)
{
    extern __shared__ __align__(16) float cache[];
    __shared__ float red[32];
    int64_t row = blockIdx.x, o = row * D, W = D / V;
    float s = 0.0f;
#pragma unroll 4
    for (int64_t k = threadIdx.x; k < W; k += blockDim.x) {
        float v[V];
        ld_v<V>(x, o + k * V, v);
#pragma unroll
        for (int u = 0; u < V; u++)
            s += v[u];
        if (CACHE)
            cache_st<V>(cache, k * V, v);
    }
    float mean = ghc_block_sum(s, red) / (float)D;
    float q = 0.0f;
    for (int64_t k = threadIdx.x; k < W; k += blockDim.x) {
        float v[V];
        if (CACHE)
            cache_ld<V>(cache, k * V, v);
        else
            ld_v<V>(x, o + k * V, v);
#pragma unroll
        for (int u = 0; u < V; u++) {
            float d = v[u] - mean;
            q += d * d;
        }
    }
    float rstd = 1.0f / sqrtf(ghc_block_sum(q, red) / (float)D + eps);
    if (stats && threadIdx.x == 0) {
        stats[2 * row] = mean;
        stats[2 * row + 1] = rstd;
    }
    int64_t sh0 = rowmod_base(shift, row, D), sc0 = rowmod_base(scale, row, D);
#pragma unroll 2
    for (int64_t k = threadIdx.x; k < W; k += blockDim.x) {
        float v[V], pw[V], pb[V], psc[V], psh[V];
        if (CACHE)
            cache_ld<V>(cache, k * V, v);
        else
            ld_v<V>(x, o + k * V, v);
        if (w.p)
            ld_param<V>(w, k * V, pw);
        if (bias.p)
            ld_param<V>(bias, k * V, pb);
        if (scale.t.p)
            ld_param<V>(scale.t, sc0 + k * V, psc);
        if (shift.t.p)
            ld_param<V>(shift.t, sh0 + k * V, psh);
#pragma unroll
        for (int u = 0; u < V; u++) {
            float r = (v[u] - mean) * rstd;
            if (w.p)
                r *= pw[u];
            if (bias.p)
                r += pb[u];
            if (scale.t.p)
                r *= 1.0f + psc[u];
            if (shift.t.p)
                r += psh[u];
            v[u] = r;
        }
        st_v<V>(y, row * ldy + k * V, v);
    }
}

extern "C" int ghc_k_layernorm_fwd(ghc_tensor_t *y, ghc_tensor_t *stats, const ghc_tensor_t *x,
                                   const ghc_tensor_t *weight, const ghc_tensor_t *bias, const ghc_tensor_t *shift,
                                   const ghc_tensor_t *scale, float eps, void *stream)
{
    ghc_k_device_guard guard(x);
    cudaStream_t s = (cudaStream_t)stream;
    int64_t D = ghc_tensor_dim(x, -1), rows = D ? ghc_tensor_numel(x) / D : 0;
    if (rows == 0)
        return 0;
    param w = param_of(weight), b = param_of(bias);
    rowmod sh = rowmod_of(x, shift), sc = rowmod_of(x, scale);
    float *st = ghc_k_ptr<float>(stats);
    void *yp = ghc_tensor_data(y);
    const void *xp = ghc_tensor_cdata(x);
    const int64_t ldy = ghc_tensor_row_stride(y);   /* y may be a column view */
    size_t smem = cache_bytes(D);
    return ghc_k_dispatch(ghc_tensor_dtype(x), [&](auto tx) {
        using TX = decltype(tx);
        return ghc_k_dispatch(ghc_tensor_dtype(y), [&](auto ty) {
            using TY = decltype(ty);
            bool v4 = rows_vec4(D, xp, sizeof(TX), yp, sizeof(TY), NULL, 1) && ldy % 4 == 0 && param_vec4(w) &&
                      param_vec4(b) && param_vec4(sh.t) && param_vec4(sc.t);
            int threads = row_threads(v4 ? D / 4 : D);
            auto go = [&](auto kernel) {
                kernel<<<(unsigned)rows, threads, smem, s>>>((TY *)yp, ldy, st, (const TX *)xp, w, b, sh, sc, D, eps);
                return (int)cudaGetLastError();
            };
            if (v4)
                return smem ? go(k_ln_fwd<TX, TY, 4, true>) : go(k_ln_fwd<TX, TY, 4, false>);
            return smem ? go(k_ln_fwd<TX, TY, 1, true>) : go(k_ln_fwd<TX, TY, 1, false>);
        });
    });
}

/* ---- LayerNorm backward ------------------------------------------------------------------- */

/* With da = dy (1 + scale) weight and xhat = (x - mean) rstd:
 * dx (+)= rstd (da - mean(da) - xhat mean(da xhat)). The cache holds da, then xhat. */
template <typename TX, typename TDY, typename TDX, int V, bool CACHE>
static __global__ void k_ln_bwd(TDX *dx, const TDY *dy, const TX *x, const float *stats, param w, rowmod scale,
                                int64_t D, bool accumulate)
{
    extern __shared__ __align__(16) float cache[];
    __shared__ float2 red[32];
    int64_t row = blockIdx.x, o = row * D, W = D / V;
    float mean = stats[2 * row], rstd = stats[2 * row + 1];
    int64_t sc0 = rowmod_base(scale, row, D);
    float s1 = 0.0f, s2 = 0.0f;
    for (int64_t k = threadIdx.x; k < W; k += blockDim.x) {
        float g[V], xv[V];
        ld_v<V>(dy, o + k * V, g);
        ld_v<V>(x, o + k * V, xv);
#pragma unroll
        for (int u = 0; u < V; u++) {
            int64_t j = k * V + u;
            if (scale.t.p)
                g[u] *= 1.0f + ghc_ld_dt(scale.t.p, scale.t.bf16, sc0 + j);
            if (w.p)
                g[u] *= ghc_ld_dt(w.p, w.bf16, j);
            xv[u] = (xv[u] - mean) * rstd;   /* xhat */
            s1 += g[u];
            s2 += g[u] * xv[u];
        }
        if (CACHE) {
            cache_st<V>(cache, k * V, g);
            cache_st<V>(cache, D + k * V, xv);
        }
    }
    float2 sums = ghc_block_sum2(s1, s2, red);
    float m_da = sums.x / (float)D, m_dax = sums.y / (float)D;
    for (int64_t k = threadIdx.x; k < W; k += blockDim.x) {
        float g[V], xh[V];
        if (CACHE) {
            cache_ld<V>(cache, k * V, g);
            cache_ld<V>(cache, D + k * V, xh);
        } else {
            ld_v<V>(dy, o + k * V, g);
            ld_v<V>(x, o + k * V, xh);
#pragma unroll
            for (int u = 0; u < V; u++) {
                int64_t j = k * V + u;
                if (scale.t.p)
                    g[u] *= 1.0f + ghc_ld_dt(scale.t.p, scale.t.bf16, sc0 + j);
                if (w.p)
                    g[u] *= ghc_ld_dt(w.p, w.bf16, j);
                xh[u] = (xh[u] - mean) * rstd;
            }
        }
        float out[V];
        if (accumulate)
            ld_v<V>((const TDX *)dx, o + k * V, out);
#pragma unroll
        for (int u = 0; u < V; u++) {
            float v = rstd * (g[u] - m_da - xh[u] * m_dax);
            out[u] = accumulate ? v + out[u] : v;
        }
        st_v<V>(dx, o + k * V, out);
    }
}

extern "C" int ghc_k_layernorm_bwd(ghc_tensor_t *dx, const ghc_tensor_t *dy, const ghc_tensor_t *x,
                                   const ghc_tensor_t *stats, const ghc_tensor_t *weight, const ghc_tensor_t *scale,
                                   bool accumulate, void *stream)
{
    ghc_k_device_guard guard(x);
    cudaStream_t s = (cudaStream_t)stream;
    int64_t D = ghc_tensor_dim(x, -1), rows = D ? ghc_tensor_numel(x) / D : 0;
    if (rows == 0)
        return 0;
    param w = param_of(weight);
    rowmod sc = rowmod_of(x, scale);
    const float *st = ghc_k_cptr<float>(stats);
    void *dxp = ghc_tensor_data(dx);
    const void *dyp = ghc_tensor_cdata(dy), *xp = ghc_tensor_cdata(x);
    size_t smem = cache_bytes(2 * D);
    return ghc_k_dispatch(ghc_tensor_dtype(x), [&](auto tx) {
        using TX = decltype(tx);
        return ghc_k_dispatch(ghc_tensor_dtype(dy), [&](auto tdy) {
            using TDY = decltype(tdy);
            return ghc_k_dispatch(ghc_tensor_dtype(dx), [&](auto tdx) {
                using TDX = decltype(tdx);
                bool v4 = rows_vec4(D, xp, sizeof(TX), dyp, sizeof(TDY), dxp, sizeof(TDX));
                int threads = row_threads(v4 ? D / 4 : D);
                auto go = [&](auto kernel) {
                    kernel<<<(unsigned)rows, threads, smem, s>>>((TDX *)dxp, (const TDY *)dyp, (const TX *)xp, st, w,
                                                                 sc, D, accumulate);
                    return (int)cudaGetLastError();
                };
                if (v4)
                    return smem ? go(k_ln_bwd<TX, TDY, TDX, 4, true>) : go(k_ln_bwd<TX, TDY, TDX, 4, false>);
                return smem ? go(k_ln_bwd<TX, TDY, TDX, 1, true>) : go(k_ln_bwd<TX, TDY, TDX, 1, false>);
            });
        });
    });
}

/* ---- RMSNorm forward ---------------------------------------------------------------------- */

/* RoPE fused into RMSNorm (ghc_op_rmsnorm_rope_*): row r is token r % L, its D values heads of
 * Dh; cs the angles' table [L, Dh] (k_rope_table: cos, sin of each pair), NULL: plain RMSNorm.
 * Only with V = 4 or 8 (Dh a multiple of V), where a thread holds both values of its pairs. */
struct rope_geo {
    const float *cs;
    int64_t      L;
    int          Dh;
};

/* cs [L, Dh]: token l's pair p at cs[l Dh + 2p] (cos, sin), computed once per op (f64, as
 * ghc_op_rope does) instead of in every row's block. */
static __global__ void k_rope_table(float *cs, int64_t L, int64_t hh, int64_t ww, int Dh)
{
    const int P = Dh / 2;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < L * P; i += (int64_t)gridDim.x * blockDim.x)
        ghc_rope_angle(cs + 2 * i, (int)(i % P), Dh, i / P, hh, ww, false);
}

/* The pairs of v (V = 4 or 8 values from element j0, rounded to T's precision as the unfused
 * ops pass them through memory) rotated by token row % L's angles (sgn -1: backwards), each
 * result rounded likewise. */
template <typename T, int V>
GHC_D void rope_pairs(float v[V], const rope_geo &g, int64_t row, int64_t j0, float sgn)
{
    if constexpr (V > 1) {
        const float *cs = g.cs + (row % g.L) * g.Dh + j0 % g.Dh;   /* 2 p of the first pair: a multiple of V */
#pragma unroll
        for (int u4 = 0; u4 < V; u4 += 4) {
            const float4 c = *(const float4 *)(cs + u4);
            const float cv[4] = { c.x, sgn * c.y, c.z, sgn * c.w };
#pragma unroll
            for (int u = 0; u < 4; u += 2) {
                float a = ghc_round_to(v[u4 + u], (const T *)0), b = ghc_round_to(v[u4 + u + 1], (const T *)0);
                ghc_rope_rotate(a, b, cv[u], cv[u + 1]);
                v[u4 + u] = ghc_round_to(a, (const T *)0);
                v[u4 + u + 1] = ghc_round_to(b, (const T *)0);
            }
        }
    }
}

/* The width of a norm's accesses: 8 where x has 2-byte elements (one 16-byte load of it) and
 * D, the pointers and the RoPE's head (Dh, 0: none) allow, else 4 where they allow, else 1. */
static int rows_width(size_t x_size, int64_t D, int Dh, const void *a, size_t sa, const void *b, size_t sb,
                      const void *c, size_t sc)
{
    if (x_size == 2 && rows_vec(8, D, a, sa, b, sb, c, sc) && Dh % 8 == 0)
        return 8;
    return rows_vec4(D, a, sa, b, sb, c, sc) && Dh % 4 == 0 ? 4 : 1;
}

/* y = cast_y(x rstd) * weight, rstd = (mean(x^2) + eps)^-1/2; with g.cs the RoPE of y. */
template <typename TX, typename TY, int V, bool CACHE>
static __global__ void k_rms_fwd(TY *y, float *rstd, const TX *x, param w, int64_t D, float eps, rope_geo g)
{
    extern __shared__ __align__(16) float cache[];
    __shared__ float red[32];
    int64_t row = blockIdx.x, o = row * D, W = D / V;
    float q = 0.0f;
    for (int64_t k = threadIdx.x; k < W; k += blockDim.x) {
        float v[V];
        ld_v<V>(x, o + k * V, v);
#pragma unroll
        for (int u = 0; u < V; u++)
            q += v[u] * v[u];
        if (CACHE)
            cache_st<V>(cache, k * V, v);
    }
    float r = 1.0f / sqrtf(ghc_block_sum(q, red) / (float)D + eps);
    if (rstd && threadIdx.x == 0)
        rstd[row] = r;
    for (int64_t k = threadIdx.x; k < W; k += blockDim.x) {
        float v[V];
        if (CACHE)
            cache_ld<V>(cache, k * V, v);
        else
            ld_v<V>(x, o + k * V, v);
#pragma unroll
        for (int u = 0; u < V; u++)
            v[u] = ghc_round_to(v[u] * r, (const TY *)0) * ghc_ld_dt(w.p, w.bf16, k * V + u);
        if (g.cs)
            rope_pairs<TY, V>(v, g, row, k * V, 1.0f);
        st_v<V>(y, o + k * V, v);
    }
}

/* RMSNorm, with g.cs its RoPE too (then only where 4-wide: else returns -1, nothing launched). */
static int rms_fwd(ghc_tensor_t *y, ghc_tensor_t *rstd, const ghc_tensor_t *x, const ghc_tensor_t *weight, float eps,
                   rope_geo g, void *stream)
{
    ghc_k_device_guard guard(x);
    cudaStream_t s = (cudaStream_t)stream;
    int64_t D = ghc_tensor_dim(x, -1), rows = D ? ghc_tensor_numel(x) / D : 0;
    if (rows == 0)
        return 0;
    param w = param_of(weight);
    float *rs = ghc_k_ptr<float>(rstd);
    void *yp = ghc_tensor_data(y);
    const void *xp = ghc_tensor_cdata(x);
    size_t smem = cache_bytes(D);
    return ghc_k_dispatch(ghc_tensor_dtype(x), [&](auto tx) {
        using TX = decltype(tx);
        return ghc_k_dispatch(ghc_tensor_dtype(y), [&](auto ty) {
            using TY = decltype(ty);
            const int vw = rows_width(sizeof(TX), D, g.cs ? g.Dh : 0, xp, sizeof(TX), yp, sizeof(TY), NULL, 1);
            if (g.cs && vw == 1)
                return -1;
            int threads = row_threads(D / vw);
            auto go = [&](auto kernel) {
                kernel<<<(unsigned)rows, threads, smem, s>>>((TY *)yp, rs, (const TX *)xp, w, D, eps, g);
                return (int)cudaGetLastError();
            };
            if (vw == 8)
                return smem ? go(k_rms_fwd<TX, TY, 8, true>) : go(k_rms_fwd<TX, TY, 8, false>);
            if (vw == 4)
                return smem ? go(k_rms_fwd<TX, TY, 4, true>) : go(k_rms_fwd<TX, TY, 4, false>);
            return smem ? go(k_rms_fwd<TX, TY, 1, true>) : go(k_rms_fwd<TX, TY, 1, false>);
        });
    });
}

extern "C" int ghc_k_rmsnorm_fwd(ghc_tensor_t *y, ghc_tensor_t *rstd, const ghc_tensor_t *x, const ghc_tensor_t *weight,
                                 float eps, void *stream)
{
    return rms_fwd(y, rstd, x, weight, eps, rope_geo{ NULL, 1, 2 }, stream);
}

/* The angles' table of x's tokens (k_rope_table) in the stream's scratch, into g (a positive
 * CUDA error on failure; -1 where Dh is not a multiple of 4: the fused kernels decline). */
static int rope_table(const ghc_tensor_t *x, int64_t heads, int64_t h, int64_t w, void *stream, rope_geo *g)
{
    ghc_k_device_guard guard(x);
    const int64_t L = ghc_tensor_dim(x, 1), Dh = ghc_tensor_dim(x, 2) / heads, n = L * (Dh / 2);
    if (Dh % 4 != 0)
        return -1;   /* a thread's 4 values would not be 2 pairs of one head */
    void *p = NULL;
    int rc = (int)ghc_k_scratch(ghc_tensor_device(x), stream, (size_t)(L * Dh) * sizeof(float), &p);
    if (rc)
        return rc;
    const unsigned blocks = (unsigned)((n + 255) / 256 < 8192 ? (n + 255) / 256 : 8192);
    k_rope_table<<<blocks ? blocks : 1, 256, 0, (cudaStream_t)stream>>>((float *)p, L, h, w, (int)Dh);
    *g = rope_geo{ (const float *)p, L, (int)Dh };
    return (int)cudaGetLastError();
}

/* t's data as [B, L, heads, D / heads] (ghc_k_rope's operand); NULL: out of memory. */
static ghc_tensor_t *heads_view(const ghc_tensor_t *t, void *data, int64_t heads)
{
    const int64_t shape[4] = { ghc_tensor_dim(t, 0), ghc_tensor_dim(t, 1), heads, ghc_tensor_dim(t, 2) / heads };
    return ghc_tensor_wrap(ghc_tensor_core(t), ghc_tensor_dtype(t), 4, shape, ghc_tensor_device(t), data);
}

extern "C" int ghc_k_rmsnorm_rope_fwd(ghc_tensor_t *y, ghc_tensor_t *rstd, const ghc_tensor_t *x,
                                      const ghc_tensor_t *weight, float eps, int64_t heads, int64_t h, int64_t w,
                                      void *stream)
{
    rope_geo g;
    int rc = rope_table(x, heads, h, w, stream, &g);
    if (!rc && (rc = rms_fwd(y, rstd, x, weight, eps, g, stream)) >= 0)
        return rc;
    if (rc > 0)
        return rc;
    /* not 4-wide: the two ops */
    rc = ghc_k_rmsnorm_fwd(y, rstd, x, weight, eps, stream);
    ghc_tensor_t *y4 = rc ? NULL : heads_view(y, ghc_tensor_data(y), heads);
    if (!rc && !y4)
        rc = (int)cudaErrorMemoryAllocation;
    if (!rc)
        rc = ghc_k_rope(y4, y4, 1, h, w, false, stream);
    ghc_tensor_free(y4);
    return rc;
}

/* ---- RMSNorm backward --------------------------------------------------------------------- */

/* With G = weight dy: dx = rstd G - x rstd^3 mean(x G). The cache holds G, then x. */
template <typename TX, typename TDY, typename TDX, int V, bool CACHE>
static __global__ void k_rms_bwd(TDX *dx, const TDY *dy, const TX *x, const float *rstd, param w, int64_t D, rope_geo rg)
{
    extern __shared__ __align__(16) float cache[];
    __shared__ float red[32];
    int64_t row = blockIdx.x, o = row * D, W = D / V;
    float r = rstd[row], m = 0.0f;   /* with rg.cs dy is rotated back first */
    for (int64_t k = threadIdx.x; k < W; k += blockDim.x) {
        float g[V], xv[V];
        ld_v<V>(dy, o + k * V, g);
        if (rg.cs)
            rope_pairs<TDY, V>(g, rg, row, k * V, -1.0f);
        ld_v<V>(x, o + k * V, xv);
#pragma unroll
        for (int u = 0; u < V; u++) {
            int64_t j = k * V + u;
            g[u] *= ghc_ld_dt(w.p, w.bf16, j);
            m += xv[u] * g[u];
        }
        if (CACHE) {
            cache_st<V>(cache, k * V, g);
            cache_st<V>(cache, D + k * V, xv);
        }
    }
    m = ghc_block_sum(m, red) / (float)D;
    float r3 = r * r * r;
    for (int64_t k = threadIdx.x; k < W; k += blockDim.x) {
        float g[V], xv[V];
        if (CACHE) {
            cache_ld<V>(cache, k * V, g);
            cache_ld<V>(cache, D + k * V, xv);
        } else {
            ld_v<V>(dy, o + k * V, g);
            if (rg.cs)
                rope_pairs<TDY, V>(g, rg, row, k * V, -1.0f);
            ld_v<V>(x, o + k * V, xv);
#pragma unroll
            for (int u = 0; u < V; u++)
                g[u] *= ghc_ld_dt(w.p, w.bf16, k * V + u);
        }
        float out[V];
#pragma unroll
        for (int u = 0; u < V; u++)
            out[u] = r * g[u] - xv[u] * r3 * m;
        st_v<V>(dx, o + k * V, out);
    }
}

/* RMSNorm's backward, with rg.cs through the inverse RoPE of dy (then only where 4-wide: else
 * returns -1, nothing launched). */
static int rms_bwd(ghc_tensor_t *dx, const ghc_tensor_t *dy, const ghc_tensor_t *x, const ghc_tensor_t *rstd,
                   const ghc_tensor_t *weight, rope_geo rg, void *stream)
{
    ghc_k_device_guard guard(x);
    cudaStream_t s = (cudaStream_t)stream;
    int64_t D = ghc_tensor_dim(x, -1), rows = D ? ghc_tensor_numel(x) / D : 0;
    if (rows == 0)
        return 0;
    param w = param_of(weight);
    const float *rs = ghc_k_cptr<float>(rstd);
    void *dxp = ghc_tensor_data(dx);
    const void *dyp = ghc_tensor_cdata(dy), *xp = ghc_tensor_cdata(x);
    size_t smem = cache_bytes(2 * D);
    return ghc_k_dispatch(ghc_tensor_dtype(x), [&](auto tx) {
        using TX = decltype(tx);
        return ghc_k_dispatch(ghc_tensor_dtype(dy), [&](auto tdy) {
            using TDY = decltype(tdy);
            return ghc_k_dispatch(ghc_tensor_dtype(dx), [&](auto tdx) {
                using TDX = decltype(tdx);
                const int vw = rows_width(sizeof(TX), D, rg.cs ? rg.Dh : 0, xp, sizeof(TX), dyp, sizeof(TDY), dxp,
                                          sizeof(TDX));
                if (rg.cs && vw == 1)
                    return -1;
                int threads = row_threads(D / vw);
                auto go = [&](auto kernel) {
                    kernel<<<(unsigned)rows, threads, smem, s>>>((TDX *)dxp, (const TDY *)dyp, (const TX *)xp, rs, w, D,
                                                                 rg);
                    return (int)cudaGetLastError();
                };
                if (vw == 8)
                    return smem ? go(k_rms_bwd<TX, TDY, TDX, 8, true>) : go(k_rms_bwd<TX, TDY, TDX, 8, false>);
                if (vw == 4)
                    return smem ? go(k_rms_bwd<TX, TDY, TDX, 4, true>) : go(k_rms_bwd<TX, TDY, TDX, 4, false>);
                return smem ? go(k_rms_bwd<TX, TDY, TDX, 1, true>) : go(k_rms_bwd<TX, TDY, TDX, 1, false>);
            });
        });
    });
}

extern "C" int ghc_k_rmsnorm_bwd(ghc_tensor_t *dx, const ghc_tensor_t *dy, const ghc_tensor_t *x,
                                 const ghc_tensor_t *rstd, const ghc_tensor_t *weight, void *stream)
{
    return rms_bwd(dx, dy, x, rstd, weight, rope_geo{ NULL, 1, 2 }, stream);
}

extern "C" int ghc_k_rmsnorm_rope_bwd(ghc_tensor_t *dx, const ghc_tensor_t *dy, const ghc_tensor_t *x,
                                      const ghc_tensor_t *rstd, const ghc_tensor_t *weight, int64_t heads, int64_t h,
                                      int64_t w, void *stream)
{
    rope_geo g;
    int rc = rope_table(x, heads, h, w, stream, &g);
    if (!rc && (rc = rms_bwd(dx, dy, x, rstd, weight, g, stream)) >= 0)
        return rc;
    if (rc > 0)
        return rc;
    /* not 4-wide: dy rotated back into the stream's scratch, then the norm's backward */
    ghc_k_device_guard guard(x);
    void *t = NULL;
    rc = (int)ghc_k_scratch(ghc_tensor_device(dy), stream, ghc_tensor_nbytes(dy), &t);
    ghc_tensor_t *dy4 = rc ? NULL : heads_view(dy, (void *)ghc_tensor_cdata(dy), heads);
    ghc_tensor_t *t4 = rc ? NULL : heads_view(dy, t, heads);
    ghc_tensor_t *t3 = rc ? NULL : ghc_tensor_wrap(ghc_tensor_core(dy), ghc_tensor_dtype(dy), 3, ghc_tensor_shape(dy),
                                                   ghc_tensor_device(dy), t);
    if (!rc && (!dy4 || !t4 || !t3))
        rc = (int)cudaErrorMemoryAllocation;
    if (!rc)
        rc = ghc_k_rope(t4, dy4, 1, h, w, true, stream);
    if (!rc)
        rc = ghc_k_rmsnorm_bwd(dx, t3, x, rstd, weight, stream);
    ghc_tensor_free(dy4);
    ghc_tensor_free(t4);
    ghc_tensor_free(t3);
    return rc;
}
