/* optim_impl.cuh: what the optimizer update's translation units share (optim_adamw.cu,
 * optim_automagic.cu, optim_am_fused.cu, optim_plan.cu): the param loads and stochastic
 * rounding stores, automagic's tensor table and plan as the kernels see them, the element
 * arithmetic that the separate passes and the cluster kernel must do alike (the same bits
 * for masks and polarity), the cluster kernel's shared-memory layout (the planner sizes
 * launches with it), and the host functions one unit calls in another. Never installed;
 * device code here is static or a template (one copy per unit). */
#ifndef GHC_KERNELS_CUDA_OPTIM_IMPL_CUH
#define GHC_KERNELS_CUDA_OPTIM_IMPL_CUH

#include "common.cuh"   /* defines: GHC_D, GHC_K_TRY, ghc_dev_philox_block, ghc_warp_sum, ghc_automagic_args */

/* Functions one of these units defines for another: hidden, so libgh200core_ops exports only
 * the ghc_k_* entries. */
#define GHC_OPTIM_LOCAL __attribute__((visibility("hidden")))

/* ---- params: f32 or bf16 --------------------------------------------------------------------- */

/* f32 -> bf16 by stochastic rounding with 32 random bits (kernels/cpu/random.c's rule). */
GHC_D uint16_t sr_bf16(float x, uint32_t r)
{
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7fffffffu) >= 0x7f800000u)
        return ghc_dev_f32_to_bf16(x);
    return (uint16_t)((u + (r >> 16)) >> 16);
}

GHC_D float ld_f(const void *p, int bf16, int64_t i)
{
    return bf16 ? ghc_dev_bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

GHC_D void st_param(void *p, int bf16, int64_t i, float x, uint64_t seed, uint64_t offset)
{
    if (!bf16) {
        ((float *)p)[i] = x;
        return;
    }
    uint32_t r[4];
    ghc_dev_philox_block(seed, offset, (uint64_t)i / 4, r);
    ((uint16_t *)p)[i] = sr_bf16(x, r[i % 4]);
}

/* ---- automagic: sizes, the tensor table, the plan -------------------------------------------- */

#define AM_T     256    /* threads per block in every automagic kernel */
#define AM_CH    8192   /* elements per chunk: exactly for the flat passes (a multiple of 32) */
#define AM_SCH   4096   /* elements per stats chunk of a factored tensor, about (whole lines) */
#define AM_TU    8      /* rows a thread in k_am_stats_thin's tall tensors */

/* One tensor of a call in the plan's device table (each kernel copies its tensor's entry into
 * registers: through a reference every field would be reloaded after each store to a tensor,
 * which the compiler cannot tell from the table). Factored tensors (ndim >= 2) are B
 * matrices [R, C]; 1-D ones have R = 1, C = n and no s1. The stats pass cuts a factored
 * tensor into chunks that hold whole lines of the longer side: column ranges of all R rows
 * (wide: R < C) or row ranges of all C columns (tall), `span` lines each, `cpm` per matrix;
 * the short side's sums are completed in the chunk, the long side's go to the scratch as
 * partials (K = the short side's length); `span` is about AM_SCH / K lines, or for a thin tensor
 * what k_am_stats_thin's block holds. The flat passes cut every tensor into AM_CH chunks. */
struct am_desc {
    void       *p;
    const void *g;
    float      *s0, *s1;
    void       *mask;
    float      *aux;
    uint32_t   *pol, *agree;
    uint64_t    seed, offset;
    int64_t     part;    /* scratch offset: [B][cpm][2][K] sums of v and of g^2 / (new short side) (factored), [nf] (1-D) */
    int64_t     rmean;   /* scratch offset: [B] means of the new R (factored) */
    int64_t     lrp;     /* scratch offset: [nf][2] max and sum of the new lr per flat chunk */
    int64_t     rcf;     /* scratch offset: [B][R] row factors 1/sqrt(R_r/rmean), [B][C] column factors 1/sqrt(C_c) */
    int32_t     n, R, C, B;
    int32_t     p_bf16, g_bf16, m8, wide;
    int32_t     span, cpm, nf;
    uint32_t    mC, mRC;     /* i / C and i / (R C) as (umulhi(m, i) + i) >> l (i < 2^31) */
    int32_t     lC, lRC;
    int32_t     vec;         /* 16-byte aligned p, g (8 if bf16), s0 (1-D) and mask (4 if int8): the
                              * update pass moves 4 elements a load */
    int32_t     thin;        /* the short side's length K (4, 8, 16 or 32) where k_am_stats_thin
                              * takes the tensor (f32 g, 16-byte aligned, rows of whole 16-byte
                              * groups), else 0 */
    int32_t     fused;       /* blocks of the cluster that steps the tensor in k_am_fused (span: the
                              * long side's lines a block), else 0 (no implicit padding: plans
                              * compare tables with memcmp) */
};

static_assert(sizeof(am_desc) == 184, "am_desc has no padding");

/* A plan as the kernels see it: the table, the first chunk of each tensor in the stats pass
 * and in the flat passes ([n + 1] each), per tensor [div, old int8 scale], the partials. */
struct am_plan_dev {
    const am_desc *t;
    const int32_t *start1, *startf;
    float         *scal, *scr;
    int32_t        n;
    const int32_t *own1, *ownf;   /* the tensor of each stats chunk and of each flat chunk */
    const int32_t *list1;         /* the stats chunks of k_am_stats_thin, then those of k_am_stats */
    int32_t       *done;          /* [n] stats chunks done per tensor (zero between calls) */
    const int32_t *listf;         /* the flat chunks of the tensors k_am_fused does not take */
    const int32_t *fl;            /* the tensors k_am_fused takes, by launch group */
};

/* ---- automagic: the element arithmetic of both the passes and the cluster kernel ------------- */

GHC_D float am_ema(float old, float x, const ghc_automagic_args &a)
{
    return __fmaf_rn(x, a.beta2_comp, __fmul_rn(old, a.beta2));
}

GHC_D float am_lr(float lr, bool same, const ghc_automagic_args &a)
{
    lr = same ? __fadd_rn(lr, a.lr_bump) : __fsub_rn(lr, a.lr_bump);
    return fminf(fmaxf(lr, a.min_lr), a.max_lr);
}

/* A tall thin row's 4 consecutive elements e of a lane, LPR lanes a row: the row's sum of
 * v = g^2 + eps (every one of its lanes gets the same bits). */
template <int LPR>
GHC_D float am_row4(const float e[4], const ghc_automagic_args &a)
{
    float sum = 0.0f;
#pragma unroll
    for (int q = 0; q < 4; q++)
        sum = __fadd_rn(sum, __fadd_rn(__fmul_rn(e[q], e[q]), a.eps));
#pragma unroll
    for (int o = 1; o < LPR; o *= 2)
        sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, o));
    return sum;
}

/* Adds e's column partials: v, and g^2 times rr (1 / the row's new state). */
GHC_D void am_acc4(float pv[4], float pq[4], const float e[4], float rr, const ghc_automagic_args &a)
{
#pragma unroll
    for (int q = 0; q < 4; q++) {
        float g2 = __fmul_rn(e[q], e[q]);
        pv[q] = __fadd_rn(pv[q], __fadd_rn(g2, a.eps));
        pq[q] = __fadd_rn(pq[q], __fmul_rn(g2, rr));
    }
}

/* The column partials summed over the lanes that hold the same columns (fixed order). */
template <int LPR>
GHC_D void am_lanes4(float pv[4], float pq[4])
{
#pragma unroll
    for (int q = 0; q < 4; q++)
#pragma unroll
        for (int o = LPR; o < 32; o *= 2) {
            pv[q] = __fadd_rn(pv[q], __shfl_xor_sync(0xffffffffu, pv[q], o));
            pq[q] = __fadd_rn(pq[q], __shfl_xor_sync(0xffffffffu, pq[q], o));
        }
}

/* A lane's 4 polarity and agreement bits (element i0 .. i0 + 3, i0 % 4 == 0, 8 lanes a 32-bit
 * word) OR-ed into their words over the 8 lanes; the word's first lane stores them at pol[w],
 * agree[w] (w = i0 / 32) where `store`. */
GHC_D void am_bits4(uint32_t nu, uint32_t ns, int i0, uint32_t *pol, uint32_t *agree, bool store)
{
    const uint32_t sh = (uint32_t)i0 % 32u;
    nu <<= sh;
    ns <<= sh;
#pragma unroll
    for (int o = 1; o < 8; o *= 2) {
        nu |= __shfl_xor_sync(0xffffffffu, nu, o);
        ns |= __shfl_xor_sync(0xffffffffu, ns, o);
    }
    if (threadIdx.x % 8 == 0 && store) {
        pol[i0 / 32] = nu;
        agree[i0 / 32] = ns;
    }
}

/* The int8 scale of a mask whose largest |lr| is m (upstream's Auto8bitTensor: absmax / 127). */
GHC_D float am_scale(float m) { return m > 0.0f ? (float)((double)m / 127.0) : 1.0f; }

/* The new int8 code of an element from its old code and agreement bit. */
GHC_D uint32_t am_code(uint8_t q, bool same, float old_scale, float ns, const ghc_automagic_args &a)
{
    float lr = am_lr(__fmul_rn((float)(int8_t)q, old_scale), same, a);
    float c = fminf(fmaxf(rintf(__fdiv_rn(lr, ns)), -127.0f), 127.0f);
    return (uint8_t)(int8_t)c;
}

/* ---- automagic's cluster kernel: its sizes and shared-memory layout -------------------------- */

#define AF_MAXW  23    /* compute warps a block (H100, bench_optim, once: 16 warps 0.62 ms, 20 0.605, 23 0.600; later, 24: 0.571 against 0.532) */
#define AF_T     (32 * AF_MAXW + 32)   /* with the mover warp: one block an SM (at most 85 registers) */
#define AF_NS    2     /* stages (one tensor each; the exchange's prologue takes the next tensor's, the other one) */
#define AF_MAXNC 16    /* blocks a cluster (more than 8: a non-portable size) */
#define AF_NEX   3     /* the extremes a block sends with its partials (k_am_fused, 1.) */

/* floats a block's partials take in a receiver's slot: 2 K + 1 + AF_NEX, in 16-byte stores */
static constexpr int af_xw(int K) { return (2 * K + 1 + AF_NEX + 3) / 4 * 4; }

/* What a block keeps besides the tensor's slices (sized for the short side K: B [13824, 16]
 * takes its params through shared memory only so). */
template <int K>
struct af_small {
    __align__(16) float sfac[32];       /* the short side's update factors (read as float4) */
    float sold[2][32];                  /* [stage] the short side's old state (by bulk copy) */
    __align__(16) float rx[2][AF_MAXNC][af_xw(K)];   /* [k % 2][block] the blocks' partials, pushed */
    float rl[2][AF_MAXNC][2];           /* [k % 2][block] the blocks' lr max and sum, pushed */
    am_desc desc[2];                    /* [stage] the tensor's table entry (the mover's copy) */
    float oscale[2];                    /* [stage] its old int8 scale */
    float misc[3];                      /* div, exact (1) or not (0), new scale */
    float part[AF_MAXW][2 * K];         /* tall: the warps' column partials */
    uint32_t pex[AF_MAXW][AF_NEX];      /* the warps' extremes */
    float prs[AF_MAXW];                 /* tall: the warps' sums of their rows' states */
    float plr[AF_MAXW][2];              /* the warps' lr max and sum (the update) */
    __align__(16) float xch[af_xw(K)];  /* this block's partials: [2 K] sums of v and of g^2 / state, [2 K] its rows' sum (tall), then the AF_NEX extremes */
    float2 lc[2][512];                  /* [k % 2] the new lr (x) and new code (y, its bits) of (agreement, old code) */
    int32_t pre[2];                     /* [k % 2] k: tensor k's lr table and columns were made during k - 1's exchange */
    int32_t pf;                         /* the next tensor is in (the prologue's test) */
    unsigned long long full[2], done[2];   /* [stage] loaded (mover -> compute), finished (compute -> mover) */
    unsigned long long xb[2][2];        /* [k % 2][partials, lr] the cluster's pushes have arrived */
    unsigned long long pfull;           /* the params of the tensor next to update are in (af_layout::par) */
};

static_assert(AF_NS == 2, "af_small's [stage] slots; the exchange's prologue finds the next tensor in the other stage");

/* Byte offsets in a block's dynamic shared memory: two stages, each one tensor's slices (g,
 * codes, polarity and agreement words, the long side's state at g + the offsets), then the rest. */
struct af_layout {
    uint32_t g, stage, mask, pol, agree, lst, lrc, lfac, par, small, bytes;
};

static __host__ __device__ inline uint32_t af_small_bytes(int K)
{
    return K == 4 ? sizeof(af_small<4>) : K == 8 ? sizeof(af_small<8>) : K == 16 ? sizeof(af_small<16>)
                                                                             : sizeof(af_small<32>);
}

/* Where a block's pieces lie in its dynamic shared memory (at most span long-side lines of K;
 * the columns' reciprocals only for a wide tensor). */
static __host__ __device__ inline af_layout af_layout_of(int K, int span, bool pbuf, bool wide)
{
    const uint32_t E = (uint32_t)K * (uint32_t)span;
    af_layout l;
    uint32_t o = 0;
    auto take = [&o](uint32_t b) {
        uint32_t r = o;
        o += (b + 15u) & ~15u;
        return r;
    };
    l.small = take(af_small_bytes(K));
    l.g = take(4 * E);
    l.mask = take(E) - l.g;
    l.pol = take(E / 8) - l.g;
    l.agree = take(E / 8) - l.g;
    l.lst = take(4 * (uint32_t)span) - l.g;
    l.stage = o - l.g;
    o += l.stage * (uint32_t)(AF_NS - 1);
    l.lrc = wide ? take(8 * (uint32_t)span) : 0u;   /* [k % 2][span] */
    l.lfac = take(8 * (uint32_t)span);
    l.par = pbuf ? take(4 * E) : 0u;   /* the params of the tensor next to update (one buffer) */
    l.bytes = o;
    return l;
}

/* ---- the units' host functions --------------------------------------------------------------- */

/* optim_automagic.cu: the separate passes' launches on stream s (each launches nothing where
 * its chunk count is 0). Stats: the first thin1 of the plan's total1 stats chunks go to the
 * thin tensors' kernel, the rest to the staged one; update and mask: totalf flat chunks,
 * delta the bf16 rounding offsets' move since the plan was made. */
GHC_OPTIM_LOCAL void am_launch_stats(const am_plan_dev &d, const ghc_automagic_args &a, int32_t thin1,
                                     int32_t total1, cudaStream_t s);
GHC_OPTIM_LOCAL void am_launch_update(const am_plan_dev &d, const ghc_automagic_args &a, uint64_t delta,
                                      int32_t totalf, cudaStream_t s);
GHC_OPTIM_LOCAL void am_launch_mask(const am_plan_dev &d, const ghc_automagic_args &a, int32_t totalf,
                                    cudaStream_t s);

/* optim_am_fused.cu: k_am_fused<K, WIDE> (thin side K = 4, 8, 16 or 32, wide or tall) as a
 * pointer for cudaLaunchKernelEx and the attribute and occupancy queries; its arguments are
 * the plan, the step's arguments, then first, count, span, late and pbuf (k_am_fused). */
typedef void (*af_fn)(const am_plan_dev, const ghc_automagic_args, int32_t, int32_t, int32_t, int32_t, int32_t);
GHC_OPTIM_LOCAL af_fn af_kernel(int K, bool wide);

#endif
