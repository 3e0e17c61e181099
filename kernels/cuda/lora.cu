/* lora.cu: the LoRA ops of K-concatenation (ops.h, since API 8).
 *
 * ghc_op_lora_cast_bwd, the output side of a rank-r LoRA's backward from one read of dy:
 * g = bf16(dy) for the model's input-gradient GEMM, dh = s g B and dB += g^T H, and A's copy.
 * The fast kernel (bf16 g, r <= 16, M a multiple of 4, 16-byte aligned rows) streams dy once.
 * A block owns a tile of rows x 512 columns and walks it in 64 x 64 subtiles: each subtile of
 * dy is loaded into registers one subtile ahead (16-byte streaming loads), rounded to bf16,
 * stored to g and to shared memory, and then multiplied on the tensor cores (mma.sync
 * m16n8k16, fp32 accumulation; ldmatrix from padded shared rows): the rows' g B accumulate
 * in registers over the block's columns, the columns' g^T H over the block's rows. Each
 * block writes its two partial sums to scratch (rows x 16 and columns x 16 floats); a second
 * kernel adds the partials in a fixed order (so the result does not depend on scheduling),
 * scales dh and rounds it, adds to dB and copies A. Blocks: about two per multiprocessor, rows
 * per block chosen for that (a multiple of 64). Scratch: (M / 512 N + N / rows M) 64 bytes
 * (7 MB at N = 4096, M = 13824).
 *
 * ghc_op_lora_fwd: h = s x A^T, its kept copy and B's copy in one pass over x (k_lora_fwd,
 * below: cp.async stages of 32 rows x 256 columns, K split over a cluster where there are few
 * rows), or h from the kept copy (the recomputation) with B's copy in one small kernel.
 *
 * Otherwise (f32, r > 16, other alignments): plain kernels, one thread per output element
 * (sums over m, n or K). Correct everywhere, fast nowhere; the LoRA network takes these ops
 * on the GPU only up to r = 16. */
#include <cuda_runtime.h>

#include <stdint.h>

#include <cooperative_groups.h>

#include "common.cuh"
#include "mma.cuh"   /* defines: smem_addr, ldsm_x2, ldsm_x2_t, ldsm_x4, ldsm_x4_t, mma16816 */

namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 256;
constexpr int kSub = 64;                   /* subtile rows and columns */
constexpr int kCols = 8;                   /* column subtiles a block: 512 columns */
constexpr int kGS = kSub + 8;              /* shared row strides (elements), 16-byte rows, no */
constexpr int kBS = kCols * kSub + 8;      /* bank conflicts for ldmatrix */
constexpr int kHS = 24;

struct fast_args {
    const float *dy;
    int64_t ldy;
    uint16_t *g;
    int64_t ldg;
    const uint16_t *h;
    int64_t ldh;
    const void *b;       /* [M, r] dense, bf16 or f32 (rounded to bf16 here) */
    int b_f32;
    float *ph;           /* [column strips][np][16]: partial g B */
    float *pb;           /* [row strips][mp][16]: partial g^T H */
    int64_t N, M, np, mp, rows;
    int r;
};

__device__ __forceinline__ uint32_t pack2(float lo, float hi)
{
    return (uint32_t)ghc_dev_f32_to_bf16(lo) | ((uint32_t)ghc_dev_f32_to_bf16(hi) << 16);
}

/* One copy between f32 / bf16 matrices with rows ld apart (a factor into the weight's spare
 * room, or a kept H): element i of rows x cols. */
struct copy_job {
    void *dst;
    int64_t ldd;
    int dst_bf16;
    const void *src;
    int64_t lds;
    int src_bf16;
    int64_t rows, cols;
};

__device__ __forceinline__ void copy_one(const copy_job &c, int64_t row, int64_t col)
{
    const float v = ghc_ld_dt(c.src, c.src_bf16, row * c.lds + col);
    if (c.dst_bf16)
        ((uint16_t *)c.dst)[row * c.ldd + col] = ghc_dev_f32_to_bf16(v);
    else
        ((float *)c.dst)[row * c.ldd + col] = v;
}

/* A grid-stride loop over the job's elements (nothing where the job is empty), all blocks of
 * the grid (x and y) taking part; 32-bit index arithmetic where the job is below 2^31 elements
 * (every factor and H is). */
__device__ __forceinline__ void copy_all(const copy_job &c)
{
    const int64_t n = c.rows * c.cols;
    const uint32_t first = (blockIdx.y * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x;
    const uint32_t step = gridDim.x * gridDim.y * blockDim.x;
    if (n < ((int64_t)1 << 31)) {
        const uint32_t cols = (uint32_t)c.cols;
#pragma unroll 4
        for (uint32_t i = first; i < (uint32_t)n; i += step)
            copy_one(c, i / cols, i % cols);
        return;
    }
    for (int64_t i = first; i < n; i += step)
        copy_one(c, i / c.cols, i % c.cols);
}

__global__ void k_lora_copies(copy_job c0, copy_job c1)
{
    copy_all(c0);
    copy_all(c1);
}

/* Subtile (rs, cs) of the block's dy into v: thread t holds rows t / 16 + 16 q (q < 4),
 * columns 4 (t % 16) .. + 3; zeros outside [r0, rend) x [0, M). */
__device__ __forceinline__ void load_sub(const fast_args &a, int64_t r0, int64_t rend, int64_t c0, int rs, int cs,
                                         float v[16])
{
    const int tid = threadIdx.x;
    const int64_t col = c0 + (int64_t)cs * kSub + (tid & 15) * 4;
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const int64_t row = r0 + (int64_t)rs * kSub + (tid >> 4) + 16 * q;
        float4 t = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (row < rend && col < a.M)
            t = __ldcs((const float4 *)(a.dy + row * a.ldy + col));
        v[4 * q] = t.x;
        v[4 * q + 1] = t.y;
        v[4 * q + 2] = t.z;
        v[4 * q + 3] = t.w;
    }
}

__global__ void __launch_bounds__(kThreads, 2) k_lora_cast_bwd(fast_args a)
{
    __shared__ __align__(16) uint16_t Gs[2][kSub * kGS];   /* the rounded subtile, [n][m] */
    __shared__ __align__(16) uint16_t Bs[16 * kBS];        /* B^T of the block's columns, [r][m] */
    __shared__ __align__(16) uint16_t Hs[2][kSub * kHS];   /* H of the row subtile, [n][r] */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wb = warp & 3, nb = warp >> 2;   /* the warp's 16 rows (or columns) and 8 of r */
    const int64_t c0 = (int64_t)blockIdx.x * (kCols * kSub), r0 = (int64_t)blockIdx.y * a.rows;
    const int64_t rend = min(a.N, r0 + a.rows);
    const int ncs = (int)min((int64_t)kCols, (a.M - c0 + kSub - 1) / kSub);
    const int nrs = (int)((rend - r0 + kSub - 1) / kSub);

    for (int i = tid; i < 16 * kCols * kSub; i += kThreads) {   /* B^T in bf16, zeros past M and r */
        const int m = i >> 4, j = i & 15;
        uint16_t v = 0;
        if (c0 + m < a.M && j < a.r) {
            const int64_t k = (c0 + m) * a.r + j;
            v = a.b_f32 ? ghc_dev_f32_to_bf16(((const float *)a.b)[k]) : ((const uint16_t *)a.b)[k];
        }
        Bs[j * kBS + m] = v;
    }

    float accb[kCols][4];
#pragma unroll
    for (int c = 0; c < kCols; c++)
        accb[c][0] = accb[c][1] = accb[c][2] = accb[c][3] = 0.0f;
    float cur[16], nxt[16];
#pragma unroll
    for (int i = 0; i < 16; i++)
        nxt[i] = 0.0f;
    load_sub(a, r0, rend, c0, 0, 0, cur);

    const uint32_t bs_lane = smem_addr(Bs) + ((nb * 8 + (lane & 7)) * kBS + ((lane >> 3) & 1) * 8) * 2;
    const uint32_t ga_lane = ((wb * 16 + (lane & 15)) * kGS + (lane >> 4) * 8) * 2;                 /* A = g */
    const uint32_t gt_lane = (((lane & 7) + (lane >> 4) * 8) * kGS + wb * 16 + ((lane >> 3) & 1) * 8) * 2;  /* A = g^T */
    const uint32_t hs_lane = ((lane & 15) * kHS + nb * 8) * 2;
    int it = 0;
    for (int rs = 0; rs < nrs; rs++) {
        float acch[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
        uint16_t *hs = Hs[rs & 1];
        const int64_t rbase = r0 + (int64_t)rs * kSub;
#pragma unroll
        for (int cs = 0; cs < kCols; cs++) {
            if (cs >= ncs)
                continue;
            const int nrs2 = cs + 1 < ncs ? rs : rs + 1, ncs2 = cs + 1 < ncs ? cs + 1 : 0;
            if (nrs2 < nrs)
                load_sub(a, r0, rend, c0, nrs2, ncs2, nxt);
            uint16_t *gs = Gs[it & 1];
            const int64_t col = c0 + (int64_t)cs * kSub + (tid & 15) * 4;
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int rl = (tid >> 4) + 16 * q;
                uint2 p = make_uint2(pack2(cur[4 * q], cur[4 * q + 1]), pack2(cur[4 * q + 2], cur[4 * q + 3]));
                *(uint2 *)(gs + rl * kGS + (tid & 15) * 4) = p;
                if (rbase + rl < rend && col < a.M)
                    *(uint2 *)(a.g + (rbase + rl) * a.ldg + col) = p;
            }
            if (cs == 0) {   /* H of these 64 rows, zeros past N and r */
                const int rl = tid >> 2, j0 = (tid & 3) * 4;
#pragma unroll
                for (int j = 0; j < 4; j++)
                    hs[rl * kHS + j0 + j] = (rbase + rl < rend && j0 + j < a.r) ? a.h[(rbase + rl) * a.ldh + j0 + j]
                                                                               : (uint16_t)0;
            }
            __syncthreads();
            const uint32_t gsa = smem_addr(gs), hsa = smem_addr(hs);
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                uint32_t af[4], bf[2];
                ldsm_x4(af, gsa + ga_lane + kk * 32);                       /* g rows, m kk*16.. */
                ldsm_x2(bf, bs_lane + (cs * kSub + kk * 16) * 2);           /* B rows m, r nb*8.. */
                mma16816(acch, af, bf[0], bf[1]);
                ldsm_x4_t(af, gsa + gt_lane + kk * 16 * kGS * 2);           /* g^T: m rows, n kk*16.. */
                ldsm_x2_t(bf, hsa + hs_lane + kk * 16 * kHS * 2);           /* H rows n, r nb*8.. */
                mma16816(accb[cs], af, bf[0], bf[1]);
            }
#pragma unroll
            for (int i = 0; i < 16; i++)
                cur[i] = nxt[i];
            it++;
        }
        float *ph = a.ph + ((int64_t)blockIdx.x * a.np + rbase + wb * 16 + (lane >> 2)) * 16 + nb * 8 + (lane & 3) * 2;
        *(float2 *)ph = make_float2(acch[0], acch[1]);
        *(float2 *)(ph + 8 * 16) = make_float2(acch[2], acch[3]);
    }
#pragma unroll
    for (int cs = 0; cs < kCols; cs++) {
        if (cs >= ncs)
            continue;
        float *pb = a.pb + ((int64_t)blockIdx.y * a.mp + c0 + cs * kSub + wb * 16 + (lane >> 2)) * 16 + nb * 8 +
                    (lane & 3) * 2;
        *(float2 *)pb = make_float2(accb[cs][0], accb[cs][1]);
        *(float2 *)(pb + 8 * 16) = make_float2(accb[cs][2], accb[cs][3]);
    }
}

/* dh = bf16(scale sum of the column strips' partials), db += sum of the row strips'; and the
 * side copy (A into the weight's spare rows). */
__global__ void k_lora_finish(const float *ph, int nph, int64_t np, const float *pb, int npb, int64_t mp,
                              uint16_t *dh, int64_t ldd, float *db, int64_t N, int64_t M, int r, float scale,
                              copy_job side)
{
    copy_all(side);
    const int64_t total = (N + M) * 16;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int j = (int)(i & 15);
        if (j >= r)
            continue;
        float s = 0.0f;
        if (i < N * 16) {
            const int64_t n = i >> 4;
#pragma unroll 4
            for (int k = 0; k < nph; k++)
                s += ph[(k * np + n) * 16 + j];
            dh[n * ldd + j] = ghc_dev_f32_to_bf16(scale * s);
        } else {
            const int64_t m = (i >> 4) - N;
#pragma unroll 4
            for (int k = 0; k < npb; k++)
                s += pb[(k * mp + m) * 16 + j];
            db[m * r + j] += s;
        }
    }
}

/* The plain path: one thread per element of dh (sum over m) or of db (sum over n). */
template <typename T>
__global__ void k_lora_plain(const T *g, int64_t ldg, const T *h, int64_t ldh, const void *b, int b_bf16, T *dh,
                             int64_t ldd, float *db, int64_t N, int64_t M, int64_t r, float scale)
{
    const int64_t total = (N + M) * r;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t j = i % r;
        float s = 0.0f;
        if (i < N * r) {
            const int64_t n = i / r;
            for (int64_t m = 0; m < M; m++)
                s += ghc_ld(g, n * ldg + m) * ghc_round_to(ghc_ld_dt(b, b_bf16, m * r + j), (const T *)0);
            ghc_st(dh, n * ldd + j, scale * s);
        } else {
            const int64_t m = i / r - N;
            for (int64_t n = 0; n < N; n++)
                s += ghc_ld(g, n * ldg + m) * ghc_ld(h, n * ldh + j);
            db[m * r + j] += s;
        }
    }
}

/* The forward: a block of 256 threads takes 32 rows of x and walks K in stages of 256 columns:
 * the block copies the stage's x tile (32 rows x 512 bytes, each row one coalesced run) and
 * a's columns (16 rows, f32 or bf16) into a ring of `S` stages in shared memory by cp.async,
 * and warp w multiplies columns 32w .. 32w + 31 of each stage (blocks start at different stages). A sum over K may take its terms
 * in any order, so each lane reads 16 bytes (8 consecutive columns) of a row as the k slots of
 * two mma steps that it holds anyway (columns 8c + 4s + {0, 1} as slots 2c + {0, 1} and
 * 8c + 4s + {2, 3} as 8 + 2c + {0, 1} of step s, c = lane % 4), and a's fragment the same 8
 * columns of its row (rounded to bf16 as it multiplies). The warps' fp32 partials are added in
 * warp order through shared memory: h = bf16(scale sum), and keep. The side copy (B into the
 * weight's spare columns) over all blocks. */
constexpr int kFwdThreads = 256, kFwdRows = 32, kFwdWarps = kFwdThreads / 32, kFwdCols = 256;
constexpr int kFwdXS = kFwdCols * 2 + 64;                  /* x tile row stride (bytes): no bank conflicts */
constexpr int kFwdXBytes = kFwdRows * kFwdXS, kFwdABytes = 16 * kFwdCols * 4 + 16 * 16;
constexpr int kFwdAS = kFwdCols * 4 + 16;                  /* a tile row stride (bytes; f32 or bf16) */
constexpr int kFwdStage = kFwdXBytes + kFwdABytes;

struct fwd_args {
    const uint16_t *x;
    int64_t ldx;
    const void *a;       /* [r, K], f32 or bf16 */
    int a_f32;
    uint16_t *h;
    int64_t ldh;
    uint16_t *keep;      /* dense [N, r] or NULL */
    int64_t N, K;
    int r;
    float scale;
};

/* Shared bytes of the forward with S stages (the partials reuse the ring). */
static size_t fwd_smem(int S)
{
    size_t ring = (size_t)S * kFwdStage, red = (size_t)kFwdWarps * kFwdRows * 16 * sizeof(float);
    return ring > red ? ring : red;
}

/* Whether S stages fit a block's shared memory of `avail` bytes (with the static partial sums). */
static bool fwd_fits(int S, int avail) { return fwd_smem(S) + kFwdRows * 16 * sizeof(float) <= (size_t)avail; }

/* 16 bytes from global to shared, zeros where !ok (src-size 0). */
__device__ __forceinline__ void cp16(uint32_t dst, const void *src, bool ok)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

/* Stage at column k into ring slot `slot`: x's 32 x 32 16-byte pieces and a's 16 rows (64 f32
 * pieces or 32 bf16 pieces a row), 8 copies a thread. */
__device__ __forceinline__ void fwd_issue(const fwd_args &p, uint32_t slot, int64_t r0, int64_t k)
{
    const int tid = threadIdx.x;
#pragma unroll
    for (int i = 0; i < 4; i++) {   /* x: piece tid + 256 i: row / 32, 16-byte column % 32 */
        const int q = tid + kFwdThreads * i, row = q >> 5, pc = q & 31;
        const int64_t col = k + pc * 8;
        const bool ok = r0 + row < p.N && col < p.K;
        cp16(slot + row * kFwdXS + pc * 16, ok ? (const void *)(p.x + (r0 + row) * p.ldx + col) : (const void *)p.x, ok);
    }
    /* a: 16 rows of kFwdCols columns in 16-byte pieces of `per` elements (4 f32 or 8 bf16) */
    const uint32_t as = slot + kFwdXBytes;
    const int per = p.a_f32 ? 4 : 8, npc = kFwdCols / per, es = p.a_f32 ? 4 : 2, sh = p.a_f32 ? 6 : 5;
#pragma unroll 4
    for (int q = tid; q < 16 * npc; q += kFwdThreads) {
        const int n = q >> sh, pc = q & (npc - 1);   /* (npc: 64 or 32) */
        const int64_t col = k + pc * per;
        const bool ok = n < p.r && col < p.K;
        cp16(as + n * kFwdAS + pc * 16, ok ? (const void *)((const char *)p.a + (n * p.K + col) * es) : p.a, ok);
    }
}

template <int S>
__global__ void __launch_bounds__(kFwdThreads) k_lora_fwd(fwd_args p, copy_job side)
{
    extern __shared__ __align__(16) unsigned char fwd_smem_buf[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, t4 = lane >> 2, c = lane & 3;
    const int64_t r0 = (int64_t)blockIdx.x * kFwdRows;
    const uint32_t base = (uint32_t)__cvta_generic_to_shared(fwd_smem_buf);
    float acc[2][2][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;
    /* this block's stages: the blockIdx.y-th of gridDim.y equal parts of K (a cluster along y
     * where there are few row blocks) */
    const int64_t total = (p.K + kFwdCols - 1) / kFwdCols, per = (total + gridDim.y - 1) / gridDim.y;
    const int64_t s0 = (int64_t)blockIdx.y * per, n = s0 < total ? min(per, total - s0) : 0;
    /* blocks start at different stages (all of them reading the same columns of a at once would
     * queue on the same L2 slices); stage i is the s0 + (i + rot) % n-th */
    const int64_t rot = n ? (int64_t)blockIdx.x * n / gridDim.x : 0;
    auto kcol = [&](int64_t i) { return (s0 + (i + rot) % n) * kFwdCols; };
    for (int s = 0; s < S - 1; s++) {   /* the first S - 1 stages (empty groups past the end) */
        if (s < n)
            fwd_issue(p, base + s * kFwdStage, r0, kcol(s));
        cp_commit();
    }
    for (int64_t i = 0; i < n; i++) {
        cp_wait<S - 2>();   /* stage i has landed (this thread's copies) */
        __syncthreads();    /* everyone's; and stage i - 1 is read by all */
        const int64_t nx = i + S - 1;
        if (nx < n)
            fwd_issue(p, base + (uint32_t)(nx % S) * kFwdStage, r0, kcol(nx));
        cp_commit();
        const unsigned char *st = fwd_smem_buf + (size_t)(i % S) * kFwdStage;
        const int colb = warp * 32 + 8 * c;   /* the lane's 8 columns within the stage */
        uint4 xr[4];
#pragma unroll
        for (int j = 0; j < 4; j++)
            xr[j] = *(const uint4 *)(st + (t4 + 8 * j) * kFwdXS + colb * 2);
        uint4 av[2];
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            const unsigned char *ar = st + kFwdXBytes + (nt * 8 + t4) * kFwdAS;
            if (p.a_f32) {
                const float4 u = *(const float4 *)(ar + colb * 4), v = *(const float4 *)(ar + colb * 4 + 16);
                av[nt] = make_uint4(pack2(u.x, u.y), pack2(u.z, u.w), pack2(v.x, v.y), pack2(v.z, v.w));
            } else {
                av[nt] = *(const uint4 *)(ar + colb * 2);
            }
        }
#pragma unroll
        for (int s2 = 0; s2 < 2; s2++)   /* columns 4 s2 .. 4 s2 + 3 of the lane's 8 */
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                const uint4 &lo = xr[2 * mt], &hi = xr[2 * mt + 1];
                const uint32_t af[4] = { s2 ? lo.z : lo.x, s2 ? hi.z : hi.x, s2 ? lo.w : lo.y, s2 ? hi.w : hi.y };
#pragma unroll
                for (int nt = 0; nt < 2; nt++) {
                    const uint32_t bf[2] = { s2 ? av[nt].z : av[nt].x, s2 ? av[nt].w : av[nt].y };
                    mma16816(acc[mt][nt], af, bf[0], bf[1]);
                }
            }
    }
    cp_wait<0>();
    __syncthreads();
    float (*red)[kFwdRows][16] = (float (*)[kFwdRows][16])fwd_smem_buf;
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            red[warp][mt * 16 + t4][nt * 8 + 2 * c] = acc[mt][nt][0];
            red[warp][mt * 16 + t4][nt * 8 + 2 * c + 1] = acc[mt][nt][1];
            red[warp][mt * 16 + t4 + 8][nt * 8 + 2 * c] = acc[mt][nt][2];
            red[warp][mt * 16 + t4 + 8][nt * 8 + 2 * c + 1] = acc[mt][nt][3];
        }
    __syncthreads();
    __shared__ float part[kFwdRows * 16];   /* the block's sums (over its warps, in warp order) */
    for (int o = tid; o < kFwdRows * 16; o += kFwdThreads) {
        float s = 0.0f;
#pragma unroll
        for (int w = 0; w < kFwdWarps; w++)
            s += red[w][o >> 4][o & 15];
        part[o] = s;
    }
    cg::cluster_group cl = cg::this_cluster();
    if (gridDim.y > 1)
        cl.sync();   /* the cluster's blocks (along y) have their sums */
    if (blockIdx.y == 0)
        for (int o = tid; o < kFwdRows * 16; o += kFwdThreads) {
            const int rl = o >> 4, j = o & 15;
            const int64_t row = r0 + rl;
            if (row < p.N && j < p.r) {
                float s = part[o];
                for (unsigned c = 1; c < gridDim.y; c++)   /* the other blocks' sums, in order */
                    s += cl.map_shared_rank(part, c)[o];
                const uint16_t v = ghc_dev_f32_to_bf16(p.scale * s);
                p.h[row * p.ldh + j] = v;
                if (p.keep)
                    p.keep[row * p.r + j] = v;
            }
        }
    if (gridDim.y > 1)
        cl.sync();   /* their shared memory stays until read */
    copy_all(side);
}

/* The plain forward: one thread per element of h (a sum over K), and keep. */
template <typename T>
__global__ void k_lora_fwd_plain(const T *x, int64_t ldx, const void *a, int a_bf16, T *h, int64_t ldh, T *keep,
                                 int64_t N, int64_t K, int64_t r, float scale)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < N * r; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t n = i / r, j = i % r;
        float s = 0.0f;
        for (int64_t k = 0; k < K; k++)
            s += ghc_ld(x, n * ldx + k) * ghc_round_to(ghc_ld_dt(a, a_bf16, j * K + k), (const T *)0);
        ghc_st(h, n * ldh + j, scale * s);
        if (keep)
            ghc_st(keep, i, scale * s);
    }
}

/* A copy job from two tensors (empty where dst is NULL). */
static copy_job job(ghc_tensor_t *dst, const ghc_tensor_t *src)
{
    copy_job c = { NULL, 0, 0, NULL, 0, 0, 0, 1 };
    if (!dst)
        return c;
    c.dst = ghc_tensor_data(dst);
    c.ldd = ghc_tensor_row_stride(dst);
    c.dst_bf16 = ghc_tensor_dtype(dst) == GHC_DTYPE_BF16;
    c.src = ghc_tensor_cdata(src);
    c.lds = ghc_tensor_row_stride(src);
    c.src_bf16 = ghc_tensor_dtype(src) == GHC_DTYPE_BF16;
    c.cols = ghc_tensor_dim(dst, -1);
    c.rows = ghc_tensor_numel(dst) / c.cols;
    return c;
}

}   /* namespace */

extern "C" int ghc_k_lora_fwd(ghc_tensor_t *h, ghc_tensor_t *keep, const ghc_tensor_t *x, const ghc_tensor_t *a,
                              float scale, ghc_tensor_t *wcols, const ghc_tensor_t *b, void *stream)
{
    ghc_k_device_guard guard(h);
    GHC_K_TRY(guard.err);
    cudaStream_t st = (cudaStream_t)stream;
    const int64_t r = ghc_tensor_dim(h, -1), N = ghc_tensor_numel(h) / r;
    const copy_job side = job(wcols, b);
    if (!x) {   /* h from keep (a dense [N, r] as a [N, r] view) */
        copy_job c = job(h, keep);
        c.lds = r;
        k_lora_copies<<<ghc_k_blocks(N * r + side.rows * side.cols, 256), 256, 0, st>>>(c, side);
        return (int)cudaGetLastError();
    }
    /* stages: as many as the shared memory of a block allows, up to 6 (H100: 6; GB10: 2) */
    static int optin[64];
    const int dev = ghc_tensor_device(h);
    if (dev >= 0 && dev < 64 && !optin[dev]) {
        int v = 0;
        if (cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
            cudaGetLastError();
            v = 48 * 1024;
        }
        void (*const kerns[3])(fwd_args, copy_job) = { k_lora_fwd<2>, k_lora_fwd<3>, k_lora_fwd<6> };
        const int ss[3] = { 2, 3, 6 };
        for (int i = 0; i < 3; i++)
            if (fwd_fits(ss[i], v))
                GHC_K_TRY(cudaFuncSetAttribute(kerns[i], cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)fwd_smem(ss[i])));
        optin[dev] = v;
    }
    const int avail = dev >= 0 && dev < 64 ? optin[dev] : 48 * 1024;
    const int64_t K = ghc_tensor_dim(x, -1), ldx = ghc_tensor_row_stride(x), ldh = ghc_tensor_row_stride(h);
    const bool fast = ghc_tensor_dtype(h) == GHC_DTYPE_BF16 && r <= 16 && K % 8 == 0 && ldx % 8 == 0 &&
                      fwd_fits(2, avail) && ghc_k_aligned(ghc_tensor_cdata(x), 2, 8) &&
                      ghc_k_aligned(ghc_tensor_cdata(a), ghc_dtype_size(ghc_tensor_dtype(a)), 8);
    if (!fast || N == 0) {
        if (N > 0) {
            GHC_K_TRY((cudaError_t)ghc_k_dispatch(ghc_tensor_dtype(h), [&](auto tag) {
                using T = decltype(tag);
                k_lora_fwd_plain<T><<<ghc_k_blocks(N * r, 256), 256, 0, st>>>(
                    ghc_k_cptr<T>(x), ldx, ghc_tensor_cdata(a), ghc_tensor_dtype(a) == GHC_DTYPE_BF16, ghc_k_ptr<T>(h),
                    ldh, ghc_k_ptr<T>(keep), N, K, r, scale);
                return (int)cudaGetLastError();
            }));
        }
        if (side.dst)
            k_lora_copies<<<ghc_k_blocks(side.rows * side.cols, 256), 256, 0, st>>>(side, job(NULL, NULL));
        return (int)cudaGetLastError();
    }
    fwd_args p;
    p.x = (const uint16_t *)ghc_tensor_cdata(x);
    p.ldx = ldx;
    p.a = ghc_tensor_cdata(a);
    p.a_f32 = ghc_tensor_dtype(a) == GHC_DTYPE_F32;
    p.h = (uint16_t *)ghc_tensor_data(h);
    p.ldh = ldh;
    p.keep = keep ? (uint16_t *)ghc_tensor_data(keep) : NULL;
    p.N = N;
    p.K = K;
    p.r = (int)r;
    p.scale = scale;
    /* few row blocks (the 512 text rows: 16): K split over a cluster of up to 8 along y */
    const int64_t blocks = (N + kFwdRows - 1) / kFwdRows, stages = (K + kFwdCols - 1) / kFwdCols;
    int64_t ks = ghc_k_sm_count() / blocks;
    ks = ks < 1 ? 1 : ks > 8 ? 8 : ks > stages ? stages : ks;
    const int S = fwd_fits(6, avail) ? 6 : fwd_fits(3, avail) ? 3 : 2;
    void (*kern)(fwd_args, copy_job) = S == 6 ? k_lora_fwd<6> : S == 3 ? k_lora_fwd<3> : k_lora_fwd<2>;
    for (;;) {
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute at[1];
        cfg.gridDim = dim3((unsigned)blocks, (unsigned)ks, 1);
        cfg.blockDim = dim3(kFwdThreads, 1, 1);
        cfg.dynamicSmemBytes = fwd_smem(S);
        cfg.stream = st;
        at[0].id = cudaLaunchAttributeClusterDimension;
        at[0].val.clusterDim.x = 1;
        at[0].val.clusterDim.y = (unsigned)ks;
        at[0].val.clusterDim.z = 1;
        cfg.attrs = at;
        cfg.numAttrs = ks > 1 ? 1 : 0;
        cudaError_t e = cudaLaunchKernelEx(&cfg, kern, p, side);
        if (e == cudaSuccess || ks == 1)
            return (int)e;
        cudaGetLastError();   /* no such cluster here: one block a row group */
        ks = 1;
    }
}

extern "C" int ghc_k_lora_cast_bwd(ghc_tensor_t *g, ghc_tensor_t *dh, ghc_tensor_t *db, const ghc_tensor_t *dy,
                                   const ghc_tensor_t *h, const ghc_tensor_t *b, float scale, ghc_tensor_t *wrows,
                                   const ghc_tensor_t *a, void *stream)
{
    ghc_k_device_guard guard(g);
    GHC_K_TRY(guard.err);
    cudaStream_t st = (cudaStream_t)stream;
    const int64_t M = ghc_tensor_dim(g, -1), r = ghc_tensor_dim(b, 1), N = ghc_tensor_numel(g) / M;
    const int64_t ldg = ghc_tensor_row_stride(g), ldy = ghc_tensor_row_stride(dy);
    const int64_t ldh = ghc_tensor_row_stride(h), ldd = ghc_tensor_row_stride(dh);
    const bool fast = ghc_tensor_dtype(g) == GHC_DTYPE_BF16 && ghc_tensor_dtype(dy) == GHC_DTYPE_F32 && r <= 16 &&
                      M % 4 == 0 && ldy % 4 == 0 && ldg % 4 == 0 && ghc_k_aligned(ghc_tensor_cdata(dy), 4, 4) &&
                      ghc_k_aligned(ghc_tensor_cdata(g), 2, 4);
    const copy_job side = job(wrows, a);
    if (!fast || N == 0) {
        if (N > 0)
            GHC_K_TRY((cudaError_t)ghc_k_cast(g, dy, 1.0f, NULL, stream));
        GHC_K_TRY((cudaError_t)ghc_k_dispatch(ghc_tensor_dtype(g), [&](auto tag) {
            using T = decltype(tag);
            k_lora_plain<T><<<ghc_k_blocks((N + M) * r, 256), 256, 0, st>>>(
                ghc_k_cptr<T>(g), ldg, ghc_k_cptr<T>(h), ldh, ghc_tensor_cdata(b), ghc_tensor_dtype(b) == GHC_DTYPE_BF16,
                ghc_k_ptr<T>(dh), ldd, ghc_k_ptr<float>(db), N, M, r, scale);
            return (int)cudaGetLastError();
        }));
        if (side.dst)
            k_lora_copies<<<ghc_k_blocks(side.rows * side.cols, 256), 256, 0, st>>>(side, job(NULL, NULL));
        return (int)cudaGetLastError();
    }
    const int sms = ghc_k_sm_count();
    const int64_t strip = (int64_t)kCols * kSub, ncol = (M + strip - 1) / strip;
    int64_t want = (2 * sms + ncol - 1) / ncol;   /* row strips for about two blocks a multiprocessor */
    if (want < 1)
        want = 1;
    int64_t rows = (N + want - 1) / want;
    rows = (rows + kSub - 1) / kSub * kSub;
    if (rows < kSub)
        rows = kSub;
    const int64_t nrow = (N + rows - 1) / rows, np = (N + kSub - 1) / kSub * kSub, mp = (M + kSub - 1) / kSub * kSub;
    const size_t bytes_h = (size_t)(ncol * np * 16) * sizeof(float), bytes_b = (size_t)(nrow * mp * 16) * sizeof(float);
    void *scr;
    GHC_K_TRY((cudaError_t)ghc_k_scratch(ghc_tensor_device(g), stream, bytes_h + bytes_b, &scr));
    fast_args fa;
    fa.dy = ghc_k_cptr<float>(dy);
    fa.ldy = ldy;
    fa.g = (uint16_t *)ghc_tensor_data(g);
    fa.ldg = ldg;
    fa.h = (const uint16_t *)ghc_tensor_cdata(h);
    fa.ldh = ldh;
    fa.b = ghc_tensor_cdata(b);
    fa.b_f32 = ghc_tensor_dtype(b) == GHC_DTYPE_F32;
    fa.ph = (float *)scr;
    fa.pb = (float *)((char *)scr + bytes_h);
    fa.N = N;
    fa.M = M;
    fa.np = np;
    fa.mp = mp;
    fa.rows = rows;
    fa.r = (int)r;
    k_lora_cast_bwd<<<dim3((unsigned)ncol, (unsigned)nrow), kThreads, 0, st>>>(fa);
    GHC_K_TRY(cudaGetLastError());
    k_lora_finish<<<ghc_k_blocks((N + M) * 16, 256), 256, 0, st>>>(fa.ph, (int)ncol, np, fa.pb, (int)nrow, mp,
                                                                  (uint16_t *)ghc_tensor_data(dh), ldd,
                                                                  ghc_k_ptr<float>(db), N, M, (int)r, scale, side);
    return (int)cudaGetLastError();
}
