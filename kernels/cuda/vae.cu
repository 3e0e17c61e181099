/* vae.cu: the convolution / VAE ops of ops.h on CUDA (the CPU references are in
 * kernels/cpu/conv.c; the contracts in ops.h).
 *
 * conv3d: cuDNN's convolution where it loads and takes the problem (conv_cudnn.c; bf16 only,
 * channels-last), else our implicit GEMM below: output positions (b, t, h, w) x output
 * channels x the reduction (ci, kt, kh, kw) in 64 x 64 x 16 tiles of fp32 products, the input
 * gathered on the fly from [zero frames, cache, x] with the spatial zero padding. Exact fp32
 * (no TF32), so f32 runs match the CPU closely; it is the path for f32 activations.
 * This file also holds the layout kernels cuDNN's path needs (NCDHW <-> NDHWC through shared
 * memory tiles, the weight reorder), which also add conv3d_add's residual.
 *
 * frame_attention: per frame, S = scale Q^T K by cuBLASLt (ghc_k_gemm, fp32 accumulation)
 * over blocks of query rows, a row softmax into P (the inputs' dtype), O = V P^T straight into
 * o's layout. The resampling and patch ops are one thread per output element, with the CPU's
 * arithmetic; channel_rmsnorm (and its fused SiLU) a block of 32 position groups x 8 channel
 * slices (k_channel_rmsnorm). */
#include "common.cuh"

#include <math.h>

/* ---- which convolution runs (tests, benches) ------------------------------------------------- */

static int g_conv_impl = GHC_K_CONV_AUTO;
static const char *g_conv_last = "none";

extern "C" int ghc_k_conv_impl(int impl)
{
    const int prev = g_conv_impl;
    if (impl >= GHC_K_CONV_AUTO && impl <= GHC_K_CONV_CUDNN)
        g_conv_impl = impl;
    return prev;
}

extern "C" const char *ghc_k_conv_last(void) { return g_conv_last; }

/* ---- helpers ------------------------------------------------------------------------------- */

static bool is_bf16(const ghc_tensor_t *t) { return t && ghc_tensor_dtype(t) == GHC_DTYPE_BF16; }

/* x [B, C, S...]: C and S (the product of the dims after the channels). */
static void chan_split(const ghc_tensor_t *x, int64_t *C, int64_t *S)
{
    const int64_t B = ghc_tensor_dim(x, 0);
    *C = ghc_tensor_dim(x, 1);
    *S = B > 0 && *C > 0 ? ghc_tensor_numel(x) / (B * *C) : 0;
}

/* Element i of a row-major [*, d1, d2, d3, d4] as its five indices. */
struct idx5 {
    int64_t n0, n1, n2, n3, n4;
};

GHC_D idx5 unravel(int64_t i, int64_t d1, int64_t d2, int64_t d3, int64_t d4)
{
    idx5 r;
    r.n4 = i % d4;
    i /= d4;
    r.n3 = i % d3;
    i /= d3;
    r.n2 = i % d2;
    i /= d2;
    r.n1 = i % d1;
    r.n0 = i / d1;
    return r;
}

/* Run the launch (which names TY, the output's storage type) for y's dtype; the launch's status. */
#define LAUNCH_Y(y, ...)                                                                             \
    ghc_k_dispatch(ghc_tensor_dtype(y), [&](auto ty_) {                                            \
        using TY = decltype(ty_);                                                                  \
        __VA_ARGS__;                                                                               \
        return (int)cudaGetLastError();                                                            \
    })

/* ---- conv3d: our implicit GEMM ---------------------------------------------------------------- */

struct conv_geo {
    int64_t B, Ci, T, H, W, Co, kT, kH, kW, To, Ho, Wo, cf;
    int st, sh, sw, pad_t, pad_top, pad_left;
};

enum { CBM = 64, CBN = 64, CBK = 16 };

/* y = conv + bias, then + res (y's dtype; NULL: none) after rounding to y's dtype, as
 * conv3d then add store them. */
template <typename TY>
static __global__ void __launch_bounds__(256) k_conv_gemm(TY *y, const void *x, int xbf, const void *cache, int cbf,
                                                          const void *w, int wbf, const void *bias, int bbf,
                                                          const TY *res, conv_geo g)
{
    __shared__ float As[CBK][CBM + 4];
    __shared__ float Bs[CBK][CBN + 4];
    const int t = threadIdx.x;
    const int64_t kvol = g.kT * g.kH * g.kW, K = g.Ci * kvol, Po = g.Ho * g.Wo, Pt = g.To * Po, M = g.B * Pt;
    const int64_t m0 = (int64_t)blockIdx.x * CBM, n0 = (int64_t)blockIdx.y * CBN;
    const int64_t plane = g.H * g.W, zf = g.pad_t - g.cf;
    /* this thread's row of A (an output position) */
    const int am = t & (CBM - 1), ak0 = t >> 6;
    const int64_t m = m0 + am;
    const bool mv = m < M;
    int64_t ab = 0, s0 = 0, hi0 = 0, wi0 = 0;
    if (mv) {
        const idx5 o = unravel(m, 1, g.To, g.Ho, g.Wo);   /* (b, 0, to, ho, wo) */
        ab = o.n0;
        s0 = o.n2 * g.st;
        hi0 = o.n3 * g.sh - g.pad_top;
        wi0 = o.n4 * g.sw - g.pad_left;
    }
    const int bk = t & (CBK - 1), bn0 = t >> 4;
    const int tx = t & 15, ty = t >> 4;
    float acc[4][4] = {};
    for (int64_t k0 = 0; k0 < K; k0 += CBK) {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int kk = ak0 + 4 * j;
            const int64_t k = k0 + kk;
            float v = 0.0f;
            if (mv && k < K) {
                const idx5 q = unravel(k, 1, g.kT, g.kH, g.kW);   /* (ci, 0, kt, kh, kw) */
                const int64_t ci = q.n0, s = s0 + q.n2, hi = hi0 + q.n3, wi = wi0 + q.n4;
                if (s >= zf && hi >= 0 && hi < g.H && wi >= 0 && wi < g.W) {
                    const int64_t off = hi * g.W + wi;
                    if (s < g.pad_t)
                        v = ghc_ld_dt(cache, cbf, ((ab * g.Ci + ci) * g.cf + (s - zf)) * plane + off);
                    else
                        v = ghc_ld_dt(x, xbf, ((ab * g.Ci + ci) * g.T + (s - g.pad_t)) * plane + off);
                }
            }
            As[kk][am] = v;
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int nn = bn0 + 16 * j;
            const int64_t n = n0 + nn, k = k0 + bk;
            Bs[bk][nn] = n < g.Co && k < K ? ghc_ld_dt(w, wbf, n * K + k) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < CBK; kk++) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                a[i] = As[kk][tx + 16 * i];
                b[i] = Bs[kk][ty + 16 * i];
            }
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int64_t mo = m0 + tx + 16 * i;
        if (mo >= M)
            continue;
        const int64_t b = mo / Pt, p = mo % Pt;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int64_t n = n0 + ty + 16 * j, o = (b * g.Co + n) * Pt + p;
            if (n < g.Co) {
                const float v = acc[i][j] + (bias ? ghc_ld_dt(bias, bbf, n) : 0.0f);
                ghc_st(y, o, res ? ghc_round_to(v, (const TY *)NULL) + ghc_ld(res, o) : v);
            }
        }
    }
}

static int conv_own(ghc_tensor_t *y, const ghc_tensor_t *x, const ghc_tensor_t *cache, const ghc_tensor_t *w,
                    const ghc_tensor_t *bias, const ghc_tensor_t *res, const struct ghc_conv3d *a, void *stream)
{
    conv_geo g;
    g.B = ghc_tensor_dim(x, 0), g.Ci = ghc_tensor_dim(x, 1), g.T = ghc_tensor_dim(x, 2);
    g.H = ghc_tensor_dim(x, 3), g.W = ghc_tensor_dim(x, 4);
    g.Co = ghc_tensor_dim(w, 0), g.kT = ghc_tensor_dim(w, 2), g.kH = ghc_tensor_dim(w, 3), g.kW = ghc_tensor_dim(w, 4);
    g.To = ghc_tensor_dim(y, 2), g.Ho = ghc_tensor_dim(y, 3), g.Wo = ghc_tensor_dim(y, 4);
    g.cf = cache ? ghc_tensor_dim(cache, 2) : 0;
    g.st = a->stride_t, g.sh = a->stride_h, g.sw = a->stride_w;
    g.pad_t = a->pad_t, g.pad_top = a->pad_top, g.pad_left = a->pad_left;
    const int64_t M = g.B * g.To * g.Ho * g.Wo;
    const dim3 grid((unsigned)((M + CBM - 1) / CBM), (unsigned)((g.Co + CBN - 1) / CBN));
    if (grid.y > 65535)
        return (int)cudaErrorInvalidConfiguration;
    cudaStream_t s = (cudaStream_t)stream;
    g_conv_last = "own";
    return LAUNCH_Y(y, k_conv_gemm<TY><<<grid, 256, 0, s>>>(
                              (TY *)ghc_tensor_data(y), ghc_tensor_cdata(x), is_bf16(x),
                              cache ? ghc_tensor_cdata(cache) : NULL, is_bf16(cache), ghc_tensor_cdata(w), is_bf16(w),
                              bias ? ghc_tensor_cdata(bias) : NULL, is_bf16(bias),
                              res ? (const TY *)ghc_tensor_cdata(res) : NULL, g));
}

extern "C" int ghc_k_conv3d(ghc_tensor_t *y, const ghc_tensor_t *x, const ghc_tensor_t *cache, const ghc_tensor_t *w,
                            const ghc_tensor_t *bias, const ghc_tensor_t *residual, const struct ghc_conv3d *a,
                            void *stream)
{
    ghc_k_device_guard guard(y);
    GHC_K_TRY(guard.err);
    if (g_conv_impl != GHC_K_CONV_OWN) {
        const int rc = ghc_k_cudnn_conv3d(y, x, cache, w, bias, residual, a, stream);
        if (rc != -1) {
            g_conv_last = "cudnn";
            return rc;
        }
    }
    return conv_own(y, x, cache, w, bias, residual, a, stream);
}

/* ---- conv3d: the layouts of cuDNN's path ---------------------------------------------------- */

/* dst [B, pad_t + T, Hp, Wp, Cp] bf16 (channels-last) from the sequence [zero frames, cache, x]
 * (NCDHW) with its spatial zero padding written out (Hp = pt + H + pb, Wp likewise) and the
 * channels from Ci on zero: a convolution without padding of this buffer is conv3d. One 32 x 32
 * tile of (channel, padded position) per block, through shared memory: reads along positions,
 * writes along channels. */
struct pack_geo {
    int64_t Ci, T, cf, pad_t, H, W, Hp, Wp, pt, pl, Cp;
};

static __global__ void k_pack_x(uint16_t *dst, const void *x, int xbf, const void *cache, int cbf, pack_geo g)
{
    __shared__ float tile[32][33];
    const int64_t Tin = g.pad_t + g.T, bs = blockIdx.z, b = bs / Tin, s = bs % Tin, zf = g.pad_t - g.cf;
    const int64_t P = g.Hp * g.Wp, p0 = (int64_t)blockIdx.x * 32, c0 = (int64_t)blockIdx.y * 32;
    {   /* this thread's padded position, read for every channel row of the tile */
        const int64_t pp = p0 + threadIdx.x, h = pp / g.Wp - g.pt, w = pp % g.Wp - g.pl;
        const bool in = pp < P && s >= zf && h >= 0 && h < g.H && w >= 0 && w < g.W;
        const int64_t off = h * g.W + w;
        for (int j = threadIdx.y; j < 32; j += blockDim.y) {
            const int64_t c = c0 + j;
            float v = 0.0f;
            if (in && c < g.Ci)
                v = s < g.pad_t ? ghc_ld_dt(cache, cbf, ((b * g.Ci + c) * g.cf + (s - zf)) * g.H * g.W + off)
                                : ghc_ld_dt(x, xbf, ((b * g.Ci + c) * g.T + (s - g.pad_t)) * g.H * g.W + off);
            tile[j][threadIdx.x] = v;
        }
    }
    __syncthreads();
    for (int j = threadIdx.y; j < 32; j += blockDim.y) {
        const int64_t p = p0 + j, c = c0 + threadIdx.x;
        if (p < P && c < g.Cp)
            dst[(bs * P + p) * g.Cp + c] = ghc_dev_f32_to_bf16(tile[threadIdx.x][j]);
    }
}

/* dst [Cop, kvol, Cip] bf16 from w [Co, Ci, kvol] (zero rows and columns beyond Co, Ci). */
static __global__ void k_pack_w(uint16_t *dst, const void *w, int wbf, int64_t Co, int64_t Ci, int64_t kvol,
                                int64_t Cop, int64_t Cip)
{
    const int64_t n = Cop * kvol * Cip;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t ci = i % Cip, r = i / Cip, kk = r % kvol, co = r / kvol;
        dst[i] = ghc_dev_f32_to_bf16(co < Co && ci < Ci ? ghc_ld_dt(w, wbf, (co * Ci + ci) * kvol + kk) : 0.0f);
    }
}

/* y [B, Co, To, P] (+ bias, then + res as k_conv_gemm) from src [B To, P, Cp] (bf16 or f32,
 * channels-last). */
template <typename TY>
static __global__ void k_unpack_y(TY *y, const void *src, int sbf, const void *bias, int bbf, const TY *res,
                                  int64_t Co, int64_t To, int64_t P, int64_t Cp)
{
    __shared__ float tile[32][33];
    const int64_t bt = blockIdx.z, b = bt / To, t = bt % To;
    const int64_t p0 = (int64_t)blockIdx.x * 32, c0 = (int64_t)blockIdx.y * 32;
    for (int j = threadIdx.y; j < 32; j += blockDim.y) {
        const int64_t p = p0 + j, c = c0 + threadIdx.x;
        tile[j][threadIdx.x] = p < P && c < Co ? ghc_ld_dt(src, sbf, (bt * P + p) * Cp + c) : 0.0f;
    }
    __syncthreads();
    for (int j = threadIdx.y; j < 32; j += blockDim.y) {
        const int64_t c = c0 + j, p = p0 + threadIdx.x, o = ((b * Co + c) * To + t) * P + p;
        if (c < Co && p < P) {
            const float v = tile[threadIdx.x][j] + (bias ? ghc_ld_dt(bias, bbf, c) : 0.0f);
            ghc_st(y, o, res ? ghc_round_to(v, (const TY *)NULL) + ghc_ld(res, o) : v);
        }
    }
}

/* The fast layouts, for bf16 data whose frames have an even number of positions (every row of
 * a tile starts 4-byte aligned): 64 x 64 tiles of raw bf16 bits through shared memory, two
 * elements per 4-byte access, the index arithmetic once per row. The general kernels above
 * spent tens of integer instructions (64-bit divisions among them) per 2-byte element and were
 * bound by them, not by memory (k_pack_x and k_unpack_y took 0.28 s of a 0.9 s encode). */
enum { LT = 64 };

/* dst [B, Tin, Hp, Wp, Cp] (as k_pack_x) for the frames s >= zf that come from cache (s < pad_t)
 * or x, at the positions of the unpadded frame (H W of them, even); channels Ci..Cp are zeros.
 * The spatial border and the zero frames are written by k_pack_border and a memset. */
struct pack2_geo {
    int64_t Ci, T, cf, zf, Tin, H, W, Hp, Wp, pt, pl, Cp;
};

static __global__ void __launch_bounds__(256) k_pack_x2(uint16_t *dst, const uint16_t *x, const uint16_t *cache,
                                                        pack2_geo g)
{
    __shared__ __align__(4) uint16_t tile[LT][LT + 2];   /* [channel][position] */
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t Tn = g.cf + g.T, b = blockIdx.z / Tn, f = blockIdx.z % Tn, HW = g.H * g.W;
    const int64_t p0 = (int64_t)blockIdx.x * LT, c0 = (int64_t)blockIdx.y * LT;
    const bool from_cache = f < g.cf;
    const int64_t tsrc = from_cache ? g.cf : g.T;   /* frames of the source: channel stride tsrc H W */
    const uint16_t *src = from_cache ? cache + (b * g.Ci * g.cf + f) * HW : x + (b * g.Ci * g.T + f - g.cf) * HW;
    {
        const int64_t p = p0 + 2 * tx;
        for (int i = 0; i < LT / 8; i++) {
            const int cl = ty + 8 * i;
            const int64_t c = c0 + cl;
            uint32_t q = 0;
            if (c < g.Ci && p < HW)
                q = *(const uint32_t *)(src + c * tsrc * HW + p);
            *(uint32_t *)&tile[cl][2 * tx] = q;
        }
    }
    __syncthreads();
    const int64_t c = c0 + 2 * tx;
    if (c >= g.Cp)
        return;
    uint16_t *frame = dst + (b * g.Tin + g.zf + f) * g.Hp * g.Wp * g.Cp;
    int64_t pp = p0 + ty, h = pp / g.W, w = pp - h * g.W;   /* position ty + 8 i of the tile, stepped */
    for (int i = 0; i < LT / 8 && pp < HW; i++) {
        const int pl = ty + 8 * i;
        const uint32_t q = (uint32_t)tile[2 * tx][pl] | ((uint32_t)tile[2 * tx + 1][pl] << 16);
        *(uint32_t *)(frame + ((h + g.pt) * g.Wp + w + g.pl) * g.Cp + c) = q;
        pp += 8;
        for (w += 8; w >= g.W; w -= g.W)
            h++;
    }
}

/* Zeros at the spatial border of the frames s >= zf of dst: block (border position k, frame),
 * its threads over the channel pairs. Border positions: the pt rows on top, then the pl + pr
 * columns beside each of the H rows, then the pb rows below. */
static __global__ void k_pack_border(uint32_t *dst, pack2_geo g)
{
    const int64_t Tn = g.cf + g.T, b = blockIdx.y / Tn, s = g.zf + blockIdx.y % Tn, side = g.Wp - g.W;
    int64_t k = blockIdx.x, h, w;
    if (k < g.pt * g.Wp) {
        h = k / g.Wp, w = k % g.Wp;
    } else if ((k -= g.pt * g.Wp) < g.H * side) {
        const int64_t q = k % side;
        h = g.pt + k / side, w = q < g.pl ? q : g.W + q;
    } else {
        k -= g.H * side;
        h = g.pt + g.H + k / g.Wp, w = k % g.Wp;
    }
    uint32_t *px = dst + (((b * g.Tin + s) * g.Hp + h) * g.Wp + w) * (g.Cp / 2);
    for (int64_t c2 = threadIdx.x; c2 < g.Cp / 2; c2 += blockDim.x)
        px[c2] = 0;
}

/* y [B, Co, To, P] (+ bias, + res as k_unpack_y) from src [B To, P, Cp] bf16, P even. */
template <typename TY>
static __global__ void __launch_bounds__(256) k_unpack_y2(TY *y, const uint16_t *src, const void *bias, int bbf,
                                                          const TY *res, int64_t Co, int64_t To, int64_t P, int64_t Cp)
{
    __shared__ __align__(4) uint16_t tile[LT][LT + 2];   /* [position][channel] */
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t bt = blockIdx.z, b = bt / To, t = bt % To;
    const int64_t p0 = (int64_t)blockIdx.x * LT, c0 = (int64_t)blockIdx.y * LT;
    {
        const int64_t c = c0 + 2 * tx;
        for (int i = 0; i < LT / 8; i++) {
            const int pl = ty + 8 * i;
            const int64_t p = p0 + pl;
            uint32_t q = 0;
            if (p < P && c < Cp)
                q = *(const uint32_t *)(src + (bt * P + p) * Cp + c);
            *(uint32_t *)&tile[pl][2 * tx] = q;
        }
    }
    __syncthreads();
    const int64_t p = p0 + 2 * tx;
    if (p >= P)
        return;
    for (int i = 0; i < LT / 8; i++) {
        const int cl = ty + 8 * i;
        const int64_t c = c0 + cl, o = ((b * Co + c) * To + t) * P + p;
        if (c >= Co)
            break;
        const float bv = bias ? ghc_ld_dt(bias, bbf, c) : 0.0f;
        float v[2] = { ghc_dev_bf16_to_f32(tile[2 * tx][cl]) + bv, ghc_dev_bf16_to_f32(tile[2 * tx + 1][cl]) + bv };
        if (res) {
            float r[2];
            ghc_ld2(res, o, r);
            v[0] = ghc_round_to(v[0], (const TY *)NULL) + r[0];
            v[1] = ghc_round_to(v[1], (const TY *)NULL) + r[1];
        }
        ghc_st2(y, o, v);
    }
}

static bool grid_fits(int64_t P, int64_t C, int64_t z)
{
    return (P + 31) / 32 <= INT32_MAX && (C + 31) / 32 <= 65535 && z >= 1 && z <= 65535;
}

extern "C" int ghc_k_conv_pack_x(void *dst, const ghc_tensor_t *x, const ghc_tensor_t *cache,
                                 const struct ghc_conv3d *a, int64_t Cp, void *stream)
{
    pack_geo g;
    const int64_t B = ghc_tensor_dim(x, 0);
    g.Ci = ghc_tensor_dim(x, 1), g.T = ghc_tensor_dim(x, 2), g.H = ghc_tensor_dim(x, 3), g.W = ghc_tensor_dim(x, 4);
    g.cf = cache ? ghc_tensor_dim(cache, 2) : 0, g.pad_t = a->pad_t;
    g.pt = a->pad_top, g.pl = a->pad_left, g.Hp = g.H + a->pad_top + a->pad_bottom, g.Wp = g.W + a->pad_left + a->pad_right;
    g.Cp = Cp;
    const int64_t P = g.Hp * g.Wp, HW = g.H * g.W;
    cudaStream_t s = (cudaStream_t)stream;
    if (is_bf16(x) && (!cache || is_bf16(cache)) && HW % 2 == 0 && Cp % 2 == 0 &&
        ghc_k_aligned(ghc_tensor_cdata(x), 2, 2) && (!cache || ghc_k_aligned(ghc_tensor_cdata(cache), 2, 2)) &&
        ghc_k_aligned(dst, 2, 2) && (HW + LT - 1) / LT <= INT32_MAX && (Cp + LT - 1) / LT <= 65535 &&
        B * (g.cf + g.T) <= 65535 && P - HW <= INT32_MAX) {
        pack2_geo f;
        f.Ci = g.Ci, f.T = g.T, f.cf = g.cf, f.zf = g.pad_t - g.cf, f.Tin = g.pad_t + g.T, f.H = g.H, f.W = g.W;
        f.Hp = g.Hp, f.Wp = g.Wp, f.pt = g.pt, f.pl = g.pl, f.Cp = Cp;
        const size_t fbytes = (size_t)(P * Cp) * 2;
        for (int64_t b = 0; b < B && f.zf > 0; b++)   /* the causal zero frames */
            GHC_K_TRY(cudaMemsetAsync((char *)dst + (size_t)(b * f.Tin) * fbytes, 0, (size_t)f.zf * fbytes, s));
        const unsigned frames = (unsigned)(B * (g.cf + g.T));
        if (P > HW)
            k_pack_border<<<dim3((unsigned)(P - HW), frames), 64, 0, s>>>((uint32_t *)dst, f);
        const dim3 grid((unsigned)((HW + LT - 1) / LT), (unsigned)((Cp + LT - 1) / LT), frames);
        k_pack_x2<<<grid, dim3(32, 8), 0, s>>>((uint16_t *)dst, (const uint16_t *)ghc_tensor_cdata(x),
                                               cache ? (const uint16_t *)ghc_tensor_cdata(cache) : NULL, f);
        return (int)cudaGetLastError();
    }
    if (!grid_fits(P, Cp, B * (g.pad_t + g.T)))
        return (int)cudaErrorInvalidConfiguration;
    const dim3 grid((unsigned)((P + 31) / 32), (unsigned)((Cp + 31) / 32), (unsigned)(B * (g.pad_t + g.T)));
    k_pack_x<<<grid, dim3(32, 8), 0, s>>>((uint16_t *)dst, ghc_tensor_cdata(x), is_bf16(x),
                                                             cache ? ghc_tensor_cdata(cache) : NULL, is_bf16(cache), g);
    return (int)cudaGetLastError();
}

extern "C" int ghc_k_conv_pack_w(void *dst, const ghc_tensor_t *w, int64_t Cop, int64_t Cip, void *stream)
{
    const int64_t Co = ghc_tensor_dim(w, 0), Ci = ghc_tensor_dim(w, 1);
    const int64_t kvol = ghc_tensor_dim(w, 2) * ghc_tensor_dim(w, 3) * ghc_tensor_dim(w, 4), n = Cop * kvol * Cip;
    k_pack_w<<<ghc_k_blocks(n, 256), 256, 0, (cudaStream_t)stream>>>((uint16_t *)dst, ghc_tensor_cdata(w), is_bf16(w),
                                                                     Co, Ci, kvol, Cop, Cip);
    return (int)cudaGetLastError();
}

extern "C" int ghc_k_conv_unpack_y(ghc_tensor_t *y, const void *src, int src_bf16, int64_t Cp,
                                   const ghc_tensor_t *bias, const ghc_tensor_t *residual, void *stream)
{
    const int64_t B = ghc_tensor_dim(y, 0), Co = ghc_tensor_dim(y, 1), To = ghc_tensor_dim(y, 2);
    const int64_t P = ghc_tensor_dim(y, 3) * ghc_tensor_dim(y, 4);
    const size_t ys = ghc_dtype_size(ghc_tensor_dtype(y));
    const void *bp = bias ? ghc_tensor_cdata(bias) : NULL, *rp = residual ? ghc_tensor_cdata(residual) : NULL;
    cudaStream_t s = (cudaStream_t)stream;
    if (src_bf16 && P % 2 == 0 && Cp % 2 == 0 && ghc_k_aligned(src, 2, 2) && ghc_k_aligned(ghc_tensor_cdata(y), ys, 2) &&
        ghc_k_aligned(rp, ys, 2) && (P + LT - 1) / LT <= INT32_MAX && (Co + LT - 1) / LT <= 65535 && B * To >= 1 &&
        B * To <= 65535) {
        const dim3 grid((unsigned)((P + LT - 1) / LT), (unsigned)((Co + LT - 1) / LT), (unsigned)(B * To));
        return LAUNCH_Y(y, k_unpack_y2<TY><<<grid, dim3(32, 8), 0, s>>>((TY *)ghc_tensor_data(y), (const uint16_t *)src,
                                                                            bp, is_bf16(bias), (const TY *)rp, Co, To,
                                                                            P, Cp));
    }
    if (!grid_fits(P, Co, B * To))
        return (int)cudaErrorInvalidConfiguration;
    const dim3 grid((unsigned)((P + 31) / 32), (unsigned)((Co + 31) / 32), (unsigned)(B * To));
    return LAUNCH_Y(y, k_unpack_y<TY><<<grid, dim3(32, 8), 0, s>>>((TY *)ghc_tensor_data(y), src, src_bf16, bp,
                                                                       is_bf16(bias), (const TY *)rp, Co, To, P, Cp));
}

/* ---- per-channel ops ---------------------------------------------------------------------------- */

/* V consecutive elements at p + i (V 1, or 4 with i a multiple of 4 and p aligned for 4). */
template <int V, typename T>
GHC_D void ldv(const T *p, int64_t i, float *v)
{
    if constexpr (V == 4)
        ghc_ld4(p, i, v);
    else
        v[0] = ghc_ld(p, i);
}

template <int V, typename T>
GHC_D void stv(T *p, int64_t i, const float *v)
{
    if constexpr (V == 4)
        ghc_st4(p, i, v);
    else
        ghc_st(p, i, v[0]);
}

/* channel_rmsnorm (and with SILU its fused SiLU): a block is 32 groups of V consecutive
 * positions (threadIdx.x) times RMS_SLICES slices of the channels (threadIdx.y: channels ty, ty +
 * RMS_SLICES, ...). Each thread sums the squares of its slice, the block adds the slices in a
 * fixed order (shared memory), then each thread writes its slice; the second read of x mostly
 * hits the caches. A warp reads 32 V consecutive elements of one channel per load, with several
 * loads in flight (the loop unrolled): one pass over x at close to the memory's bandwidth, where
 * one thread per position looping over every channel kept too few loads in flight. */
enum { RMS_SLICES = 8 };

template <typename TY, typename TX, int V, bool SILU>
static __global__ void __launch_bounds__(32 * RMS_SLICES) k_channel_rmsnorm(TY *y, const TX *x, const void *gamma,
                                                                            int gbf, int64_t C, int64_t S,
                                                                            int64_t nvec, float rc)
{
    __shared__ float red[RMS_SLICES][32 * V];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t iv = (int64_t)blockIdx.x * 32 + tx, q = iv * V;   /* V divides S */
    const bool in = iv < nvec;
    const int64_t base = in ? q / S * C * S + q % S : 0;
    float ss[V];
#pragma unroll
    for (int k = 0; k < V; k++)
        ss[k] = 0.0f;
    if (in) {
#pragma unroll 4
        for (int64_t c = ty; c < C; c += RMS_SLICES) {
            float v[V];
            ldv<V>(x, base + c * S, v);
#pragma unroll
            for (int k = 0; k < V; k++)
                ss[k] += v[k] * v[k];
        }
    }
#pragma unroll
    for (int k = 0; k < V; k++)
        red[ty][tx * V + k] = ss[k];
    __syncthreads();
    if (!in)
        return;
    float nrm[V];
#pragma unroll
    for (int k = 0; k < V; k++) {
        float t = 0.0f;
        for (int sl = 0; sl < RMS_SLICES; sl++)
            t += red[sl][tx * V + k];
        nrm[k] = fmaxf(sqrtf(t), 1e-12f);
    }
#pragma unroll 4
    for (int64_t c = ty; c < C; c += RMS_SLICES) {
        float v[V];
        const float g = ghc_ld_dt(gamma, gbf, c);
        ldv<V>(x, base + c * S, v);
#pragma unroll
        for (int k = 0; k < V; k++) {
            v[k] = v[k] / nrm[k] * rc * g;
            if constexpr (SILU) {   /* channel_rmsnorm into y, then silu of y: rounded to y's dtype first */
                v[k] = ghc_round_to(v[k], (const TY *)NULL);
                v[k] = v[k] * (1.0f / (1.0f + expf(-v[k])));
            }
        }
        stv<V>(y, base + c * S, v);
    }
}

extern "C" int ghc_k_channel_rmsnorm(ghc_tensor_t *y, const ghc_tensor_t *x, const ghc_tensor_t *gamma, bool silu,
                                     void *stream)
{
    ghc_k_device_guard guard(y);
    GHC_K_TRY(guard.err);
    int64_t C, S;
    chan_split(x, &C, &S);
    const int64_t B = ghc_tensor_dim(x, 0);
    const float rc = (float)sqrt((double)C);
    cudaStream_t s = (cudaStream_t)stream;
    const size_t xs = ghc_dtype_size(ghc_tensor_dtype(x)), ys = ghc_dtype_size(ghc_tensor_dtype(y));
    /* 4 positions a thread where they line up and there are enough of them to fill the GPU */
    const bool v4 = S % 4 == 0 && B * S >= ((int64_t)1 << 18) && ghc_k_aligned(ghc_tensor_cdata(x), xs, 4) &&
                    ghc_k_aligned(ghc_tensor_cdata(y), ys, 4);
    const int64_t nvec = B * S / (v4 ? 4 : 1), blocks = (nvec + 31) / 32;
    if (blocks > INT32_MAX)
        return (int)cudaErrorInvalidConfiguration;
    const dim3 block(32, RMS_SLICES);
    return ghc_k_dispatch(ghc_tensor_dtype(x), [&](auto tx_) {
        using TX = decltype(tx_);
        return LAUNCH_Y(y, {
            TY *yp = (TY *)ghc_tensor_data(y);
            const TX *xp = (const TX *)ghc_tensor_cdata(x);
            const void *gp = ghc_tensor_cdata(gamma);
            const int gbf = is_bf16(gamma);
            if (v4 && silu)
                k_channel_rmsnorm<TY, TX, 4, true><<<(unsigned)blocks, block, 0, s>>>(yp, xp, gp, gbf, C, S, nvec, rc);
            else if (v4)
                k_channel_rmsnorm<TY, TX, 4, false><<<(unsigned)blocks, block, 0, s>>>(yp, xp, gp, gbf, C, S, nvec, rc);
            else if (silu)
                k_channel_rmsnorm<TY, TX, 1, true><<<(unsigned)blocks, block, 0, s>>>(yp, xp, gp, gbf, C, S, nvec, rc);
            else
                k_channel_rmsnorm<TY, TX, 1, false><<<(unsigned)blocks, block, 0, s>>>(yp, xp, gp, gbf, C, S, nvec, rc);
        });
    });
}

template <typename TY, typename TX>
static __global__ void k_channel_affine(TY *y, const TX *x, const void *scale, int sbf, const void *shift, int hbf,
                                        int64_t n, int64_t C, int64_t S)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t c = (i / S) % C;
        const float m = ghc_ld_dt(scale, sbf, c), sh = shift ? ghc_ld_dt(shift, hbf, c) : 0.0f;
        ghc_st(y, i, __fadd_rn(__fmul_rn(ghc_ld(x, i), m), sh));   /* as the CPU: no fused multiply-add */
    }
}

extern "C" int ghc_k_channel_affine(ghc_tensor_t *y, const ghc_tensor_t *x, const ghc_tensor_t *scale,
                                    const ghc_tensor_t *shift, void *stream)
{
    ghc_k_device_guard guard(y);
    GHC_K_TRY(guard.err);
    int64_t C, S;
    chan_split(x, &C, &S);
    const int64_t n = ghc_tensor_numel(x);
    cudaStream_t s = (cudaStream_t)stream;
    return ghc_k_dispatch(ghc_tensor_dtype(x), [&](auto tx_) {
        using TX = decltype(tx_);
        return LAUNCH_Y(y, k_channel_affine<TY, TX><<<ghc_k_blocks(n, 256), 256, 0, s>>>(
                                  (TY *)ghc_tensor_data(y), (const TX *)ghc_tensor_cdata(x), ghc_tensor_cdata(scale),
                                  is_bf16(scale), shift ? ghc_tensor_cdata(shift) : NULL, is_bf16(shift), n, C, S));
    });
}

/* ---- elementwise maps over the output ----------------------------------------------------------- */

/* The source index of output element i of each op (x read as f32, y written in its dtype). */
struct map_upsample {
    int64_t H, W;
    __device__ int64_t operator()(int64_t i) const
    {
        const int64_t w = i % (2 * W), r = i / (2 * W), h = r % (2 * H), p = r / (2 * H);
        return (p * H + h / 2) * W + w / 2;
    }
};

struct map_dup {
    int64_t Co, To, Ho, Wo, Ci, T, H, W, r;
    int ft, fs, drop;
    __device__ int64_t operator()(int64_t i) const
    {
        const idx5 q = unravel(i, Co, To, Ho, Wo);
        const int64_t b = q.n0, o = q.n1, t = q.n2, h = q.n3, w = q.n4;
        const int64_t tt = t + drop, e = ((o * ft + tt % ft) * fs + h % fs) * fs + w % fs;
        return (((b * Ci + e / r) * T + tt / ft) * H + h / fs) * W + w / fs;
    }
};

/* vae_patchify (un false: y patched, x pixels) or unpatchify: the pixel-side index of the
 * patched-side element i, patched side [B, C p p, F, h, w]. */
struct map_patch {
    int64_t C, F, h, w;
    int p;
    __device__ int64_t operator()(int64_t i) const
    {
        const idx5 q = unravel(i, C * p * p, F, h, w);
        const int64_t b = q.n0, cq = q.n1, f = q.n2, ii = q.n3, j = q.n4;
        const int64_t qq = cq % p, rr = (cq / p) % p, c = cq / ((int64_t)p * p);
        return (((b * C + c) * F + f) * h * p + ii * p + qq) * w * p + j * p + rr;
    }
};

/* y[i] = x[map(i)] (gather) or y[map(i)] = x[i] (scatter, a permutation). */
template <typename TY, typename TX, typename MAP>
static __global__ void k_gather(TY *y, const TX *x, int64_t n, MAP map, bool scatter)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        if (scatter)
            ghc_st(y, map(i), ghc_ld(x, i));
        else
            ghc_st(y, i, ghc_ld(x, map(i)));
    }
}

template <typename MAP>
static int gather(ghc_tensor_t *y, const ghc_tensor_t *x, int64_t n, MAP map, bool scatter, void *stream)
{
    ghc_k_device_guard guard(y);
    GHC_K_TRY(guard.err);
    cudaStream_t s = (cudaStream_t)stream;
    return ghc_k_dispatch(ghc_tensor_dtype(x), [&](auto tx_) {
        using TX = decltype(tx_);
        return LAUNCH_Y(y, k_gather<TY, TX, MAP><<<ghc_k_blocks(n, 256), 256, 0, s>>>(
                                  (TY *)ghc_tensor_data(y), (const TX *)ghc_tensor_cdata(x), n, map, scatter));
    });
}

extern "C" int ghc_k_upsample2x(ghc_tensor_t *y, const ghc_tensor_t *x, void *stream)
{
    return gather(y, x, ghc_tensor_numel(y), map_upsample{ ghc_tensor_dim(x, 3), ghc_tensor_dim(x, 4) }, false,
                  stream);
}

extern "C" int ghc_k_dup_up3d(ghc_tensor_t *y, const ghc_tensor_t *x, int32_t ft, int32_t fs, int32_t drop,
                              void *stream)
{
    map_dup m;
    m.Co = ghc_tensor_dim(y, 1), m.To = ghc_tensor_dim(y, 2), m.Ho = ghc_tensor_dim(y, 3), m.Wo = ghc_tensor_dim(y, 4);
    m.Ci = ghc_tensor_dim(x, 1), m.T = ghc_tensor_dim(x, 2), m.H = ghc_tensor_dim(x, 3), m.W = ghc_tensor_dim(x, 4);
    m.r = m.Co * ft * fs * fs / m.Ci;
    m.ft = ft, m.fs = fs, m.drop = drop;
    return gather(y, x, ghc_tensor_numel(y), m, false, stream);
}

extern "C" int ghc_k_vae_patch(ghc_tensor_t *y, const ghc_tensor_t *x, int32_t p, bool un, void *stream)
{
    const ghc_tensor_t *pix = un ? y : x, *pat = un ? x : y;
    map_patch m;
    m.C = ghc_tensor_dim(pix, 1), m.F = ghc_tensor_dim(pix, 2);
    m.h = ghc_tensor_dim(pix, 3) / p, m.w = ghc_tensor_dim(pix, 4) / p, m.p = p;
    /* patchify gathers from the pixels; unpatchify scatters the patched elements to them */
    return gather(y, x, ghc_tensor_numel(pat), m, un, stream);
}

template <typename TY, typename TX>
static __global__ void k_avg_down(TY *y, const TX *x, int64_t n, int64_t Co, int64_t To, int64_t Ho, int64_t Wo,
                                  int64_t Ci, int64_t T, int64_t H, int64_t W, int ft, int fs, int64_t g, int64_t pad)
{
    const int64_t phi = (int64_t)ft * fs * fs;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const idx5 q = unravel(i, Co, To, Ho, Wo);
        const int64_t b = q.n0, o = q.n1, t = q.n2, ii = q.n3, j = q.n4;
        float acc = 0.0f;
        for (int64_t k = 0; k < g; k++) {
            const int64_t e = o * g + k, c = e / phi, r = e % phi;
            const int64_t f = t * ft + r / (fs * fs) - pad;
            if (f >= 0)
                acc += ghc_ld(x, (((b * Ci + c) * T + f) * H + ii * fs + (r / fs) % fs) * W + j * fs + r % fs);
        }
        ghc_st(y, i, acc / (float)g);
    }
}

extern "C" int ghc_k_avg_down3d(ghc_tensor_t *y, const ghc_tensor_t *x, int32_t ft, int32_t fs, void *stream)
{
    ghc_k_device_guard guard(y);
    GHC_K_TRY(guard.err);
    const int64_t Co = ghc_tensor_dim(y, 1), To = ghc_tensor_dim(y, 2), Ho = ghc_tensor_dim(y, 3), Wo = ghc_tensor_dim(y, 4);
    const int64_t Ci = ghc_tensor_dim(x, 1), T = ghc_tensor_dim(x, 2), H = ghc_tensor_dim(x, 3), W = ghc_tensor_dim(x, 4);
    const int64_t g = Ci * ft * fs * fs / Co, pad = (ft - T % ft) % ft, n = ghc_tensor_numel(y);
    cudaStream_t s = (cudaStream_t)stream;
    return ghc_k_dispatch(ghc_tensor_dtype(x), [&](auto tx_) {
        using TX = decltype(tx_);
        return LAUNCH_Y(y, k_avg_down<TY, TX><<<ghc_k_blocks(n, 256), 256, 0, s>>>(
                                  (TY *)ghc_tensor_data(y), (const TX *)ghc_tensor_cdata(x), n, Co, To, Ho, Wo, Ci, T, H,
                                  W, ft, fs, g, pad));
    });
}

template <typename TY, typename TX>
static __global__ void k_clamp(TY *y, const TX *x, int64_t n, float lo, float hi)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float v = ghc_ld(x, i);
        ghc_st(y, i, v < lo ? lo : v > hi ? hi : v);   /* NaN compares false: stays NaN */
    }
}

extern "C" int ghc_k_clamp(ghc_tensor_t *y, const ghc_tensor_t *x, float lo, float hi, void *stream)
{
    ghc_k_device_guard guard(y);
    GHC_K_TRY(guard.err);
    const int64_t n = ghc_tensor_numel(x);
    cudaStream_t s = (cudaStream_t)stream;
    return ghc_k_dispatch(ghc_tensor_dtype(x), [&](auto tx_) {
        using TX = decltype(tx_);
        return LAUNCH_Y(y, k_clamp<TY, TX><<<ghc_k_blocks(n, 256), 256, 0, s>>>(
                                  (TY *)ghc_tensor_data(y), (const TX *)ghc_tensor_cdata(x), n, lo, hi));
    });
}

/* ---- frames ------------------------------------------------------------------------------------ */

extern "C" int ghc_k_copy_frames(ghc_tensor_t *dst, int64_t dst_t, const ghc_tensor_t *src, int64_t src_t, int64_t n,
                                 void *stream)
{
    ghc_k_device_guard guard(dst);
    GHC_K_TRY(guard.err);
    const size_t rows = (size_t)(ghc_tensor_dim(dst, 0) * ghc_tensor_dim(dst, 1));
    const size_t fb = (size_t)(ghc_tensor_dim(dst, 3) * ghc_tensor_dim(dst, 4)) * ghc_dtype_size(ghc_tensor_dtype(dst));
    const size_t Td = (size_t)ghc_tensor_dim(dst, 2), Ts = (size_t)ghc_tensor_dim(src, 2), width = (size_t)n * fb;
    char *d = (char *)ghc_tensor_data(dst) + (size_t)dst_t * fb;
    const char *s = (const char *)ghc_tensor_cdata(src) + (size_t)src_t * fb;
    cudaStream_t st = (cudaStream_t)stream;
    if (rows == 0 || width == 0 || d == s)
        return 0;
    /* one memory, overlapping frames (dst may be src): through the scratch, as memmove */
    const char *d0 = (const char *)ghc_tensor_data(dst), *s0 = (const char *)ghc_tensor_cdata(src);
    if (d0 == s0 && (dst_t < src_t + n && src_t < dst_t + n)) {
        void *tmp = NULL;
        GHC_K_TRY((cudaError_t)ghc_k_scratch(ghc_tensor_device(dst), stream, rows * width, &tmp));
        GHC_K_TRY(cudaMemcpy2DAsync(tmp, width, s, Ts * fb, width, rows, cudaMemcpyDeviceToDevice, st));
        return (int)cudaMemcpy2DAsync(d, Td * fb, tmp, width, width, rows, cudaMemcpyDeviceToDevice, st);
    }
    return (int)cudaMemcpy2DAsync(d, Td * fb, s, Ts * fb, width, rows, cudaMemcpyDeviceToDevice, st);
}

/* ---- frame attention ---------------------------------------------------------------------------- */

/* P[r, :] = softmax(S[r, :]) in P's dtype; one block per row. */
template <typename TP>
static __global__ void k_softmax_rows(TP *P, const float *S, int64_t N)
{
    __shared__ float red[32];
    const float *s = S + (int64_t)blockIdx.x * N;
    TP *p = P + (int64_t)blockIdx.x * N;
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < N; j += blockDim.x)
        mx = fmaxf(mx, s[j]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if ((threadIdx.x & 31) == 0)
        red[threadIdx.x >> 5] = mx;
    __syncthreads();
    mx = -INFINITY;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++)
        mx = fmaxf(mx, red[i]);
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < N; j += blockDim.x)
        sum += expf(s[j] - mx);
    sum = ghc_block_sum(sum, red);
    const float inv = 1.0f / sum;
    for (int64_t j = threadIdx.x; j < N; j += blockDim.x)
        ghc_st(p, j, expf(s[j] - mx) * inv);
}

/* A [rows, cols] tensor over device memory at p (a wrap; freed by the caller). */
static ghc_tensor_t *wrap2(ghc_core_t *core, enum ghc_dtype dt, int dev, const void *p, int64_t rows, int64_t cols)
{
    const int64_t shape[2] = { rows, cols };
    return ghc_tensor_wrap(core, dt, 2, shape, dev, (void *)p);
}

extern "C" int ghc_k_frame_attention(ghc_tensor_t *o, const ghc_tensor_t *qkv, float scale, void *stream)
{
    ghc_k_device_guard guard(o);
    GHC_K_TRY(guard.err);
    ghc_core_t *core = ghc_tensor_core(o);
    const int dev = ghc_tensor_device(o);
    const enum ghc_dtype dt = ghc_tensor_dtype(qkv), ot = ghc_tensor_dtype(o);
    const size_t es = ghc_dtype_size(dt), eo = ghc_dtype_size(ot);
    const int64_t B = ghc_tensor_dim(o, 0), C = ghc_tensor_dim(o, 1), T = ghc_tensor_dim(o, 2);
    const int64_t N = ghc_tensor_dim(o, 3) * ghc_tensor_dim(o, 4);
    /* query rows per block: S [R, N] f32 and P [R, N] of at most 2^25 elements */
    const int64_t R = N < ((int64_t)1 << 25) / N ? N : (((int64_t)1 << 25) / N > 0 ? ((int64_t)1 << 25) / N : 1);
    char *scr = NULL;
    const size_t s_bytes = ((size_t)(R * N) * 4 + 255) & ~(size_t)255;
    GHC_K_TRY((cudaError_t)ghc_k_scratch(dev, stream, s_bytes + (size_t)(R * N) * es, (void **)&scr));
    const char *qb = (const char *)ghc_tensor_cdata(qkv);
    char *ob = (char *)ghc_tensor_data(o);
    int rc = 0;
    for (int64_t b = 0; b < B && !rc; b++) {
        /* the q, k, v channel blocks and o of batch b as [C, T N] matrices */
        ghc_tensor_t *qm = wrap2(core, dt, dev, qb + (size_t)(b * 3 * C * T * N) * es, C, T * N);
        ghc_tensor_t *km = wrap2(core, dt, dev, qb + (size_t)((b * 3 + 1) * C * T * N) * es, C, T * N);
        ghc_tensor_t *vm = wrap2(core, dt, dev, qb + (size_t)((b * 3 + 2) * C * T * N) * es, C, T * N);
        ghc_tensor_t *om = wrap2(core, ot, dev, ob + (size_t)(b * C * T * N) * eo, C, T * N);
        for (int64_t t = 0; t < T && !rc && qm && km && vm && om; t++) {
            ghc_tensor_t *kv = ghc_tensor_view_cols(km, t * N, N), *vv = ghc_tensor_view_cols(vm, t * N, N);
            for (int64_t i0 = 0; i0 < N && !rc && kv && vv; i0 += R) {
                const int64_t r = N - i0 < R ? N - i0 : R;
                ghc_tensor_t *qv = ghc_tensor_view_cols(qm, t * N + i0, r), *ov = ghc_tensor_view_cols(om, t * N + i0, r);
                ghc_tensor_t *S = wrap2(core, GHC_DTYPE_F32, dev, scr, r, N), *P = wrap2(core, dt, dev, scr + s_bytes, r, N);
                if (!qv || !ov || !S || !P) {
                    rc = (int)cudaErrorMemoryAllocation;
                } else {
                    struct ghc_gemm g1 = {};
                    g1.trans_a = true;   /* Q stored [C, r]: S = scale Q^T K */
                    g1.alpha = scale;
                    rc = ghc_k_gemm(S, qv, kv, &g1, stream);
                    if (!rc) {
                        rc = ghc_k_dispatch(dt, [&](auto tp_) {
                            using TP = decltype(tp_);
                            k_softmax_rows<TP><<<(unsigned)r, 256, 0, (cudaStream_t)stream>>>(
                                (TP *)ghc_tensor_data(P), (const float *)ghc_tensor_cdata(S), N);
                            return (int)cudaGetLastError();
                        });
                    }
                    if (!rc) {
                        struct ghc_gemm g2 = {};
                        g2.trans_b = true;   /* O [C, r] = V [C, N] P^T */
                        rc = ghc_k_gemm(ov, vv, P, &g2, stream);
                    }
                }
                ghc_tensor_free(qv);
                ghc_tensor_free(ov);
                ghc_tensor_free(S);
                ghc_tensor_free(P);
            }
            if (!kv || !vv)
                rc = rc ? rc : (int)cudaErrorMemoryAllocation;
            ghc_tensor_free(kv);
            ghc_tensor_free(vv);
        }
        if (!qm || !km || !vm || !om)
            rc = rc ? rc : (int)cudaErrorMemoryAllocation;
        ghc_tensor_free(qm);
        ghc_tensor_free(km);
        ghc_tensor_free(vm);
        ghc_tensor_free(om);
    }
    return rc;
}
