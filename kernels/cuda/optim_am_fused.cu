/* optim_am_fused.cu: automagic's update of the thin tensors (LoRA's A and B), a cluster of
 * blocks a tensor, g read once (k_am_fused); the planner (optim_plan.cu) decides which tensors
 * it takes and launches it through af_kernel. */
#include <type_traits>

#include "optim_impl.cuh"        /* defines: am_desc, am_plan_dev, af_small, af_layout_of */
#include "optim_am_cluster.cuh"  /* defines: af_bar_*, af_load, af_store, af_push*, af_map */

/* A thin tensor (LoRA's A [K][C] or B [R][K], K = 4, 8, 16 or 32; f32 params and g, the int8
 * mask, one matrix, the long side in whole groups of 128 elements, 16-byte aligned arrays) is
 * stepped whole by one cluster of `fused` blocks (am_desc::fused), each holding `span` lines of
 * the long side in shared memory. Each block has AF_MAXW compute warps and one mover warp. The
 * mover brings a tensor's g, codes, polarity words and long-side state in by bulk copies (the
 * tensor memory accelerator: every byte in flight at once, no registers held) into one of two
 * stages while the compute warps work on the other, and sends the finished stage's results back
 * the same way; the params come in by bulk copies too, into one buffer of their own, where it
 * fits in shared memory (pbuf), else through registers (prefetched into L2). The compute warps: the
 * long side's state (complete in the block) and the short side's partials, pushed to every
 * block of the cluster (st.async into their shared memory; summed in rank order:
 * deterministic); then every block alike the short side's state and the clipping divisor; the
 * update; the new int8 scale and the codes. The new scale (the max new lr) is known before the
 * update: the sign of u is the sign of g unless u underflows to zero, so each element's new lr
 * is known from g, its old code and polarity (a 512-entry table of (agreement, old code) made
 * once a tensor), and the block's max |new lr|, pushed with the partials, gives it; the update
 * then takes each lr and new code from the tables and writes the codes. Where a u could
 * underflow (a bound from the smallest |g| and factors says so), the cluster takes the scale
 * from the lr max the update pushes and writes the codes after it (the fallback). So g is read
 * once from HBM and every byte of state moves once: 14.25 B a param and the long side's state
 * (the agreement bits, scratch, stay in shared memory: state[5] is left as it was). The
 * clusters are persistent: cluster c steps tensors c, c + ncl, ... of its launch (ncl
 * resident). Per element the arithmetic is the flat passes' (the same bits for masks and
 * polarity; the sums in another fixed order). */

/* Stage s's slices of a block: g, the long side's state, the codes, polarity and agreement. */
struct af_stage {
    float    *g, *lst;
    uint8_t  *mq;
    uint32_t *pol, *agr;
};

GHC_D af_stage af_stage_at(unsigned char *sm, const af_layout &lo, int s)
{
    unsigned char *st = sm + lo.g + s * lo.stage;
    return af_stage{ (float *)st, (float *)(st + lo.lst), st + lo.mask, (uint32_t *)(st + lo.pol),
                     (uint32_t *)(st + lo.agree) };
}

/* Block q's slice of tensor t: its first line and its lines. */
GHC_D void af_slice(const am_desc &t, bool wide, uint32_t q, int *l0, int *nl)
{
    const int L = wide ? t.C : t.R;
    *l0 = (int)q * t.span;
    *nl = max(0, min(t.span, L - *l0));
}

/* The mover's lanes: tensor ti's table entry and old int8 scale into stage s's slots, then the
 * bulk loads of block q's slice into stage s (for a wide tensor a lane a row): g, codes,
 * polarity, the long side's state and the short side's old state, on barrier full[s]; and,
 * without the params' buffer (pb false), the slice's params into L2 (the update reads them into
 * registers). */
template <int K, bool WIDE>
GHC_D void af_fetch(const am_plan_dev &P, int32_t ti, uint32_t q, unsigned char *sm, const af_layout &lo, int s,
                    bool pb)
{
    const int lane = threadIdx.x % 32;
    af_small<K> &S = *(af_small<K> *)(sm + lo.small);
    {
        const uint32_t *src = (const uint32_t *)(P.t + ti);
        uint32_t *dst = (uint32_t *)&S.desc[s];
        for (int w = lane; w < (int)(sizeof(am_desc) / 4); w += 32)
            dst[w] = src[w];
        __syncwarp();
    }
    const am_desc &t = S.desc[s];
    int l0, nl;
    af_slice(t, WIDE, q, &l0, &nl);
    const int E = nl * K;
    unsigned long long *bar = &S.full[s];
    if (lane == 0) {   /* the entry, then the bytes (an empty slice completes the phase with none) */
        S.oscale[s] = t.aux[0];
        af_bar_expect(bar, nl > 0 ? (uint32_t)(4 * E + E + E / 8 + 4 * nl + 4 * K) : 0u);
    }
    if (nl == 0)
        return;
    const int64_t C = t.C;
    const af_stage sl = af_stage_at(sm, lo, s);
    float *g = sl.g, *lst = sl.lst;
    uint8_t *mq = sl.mq;
    uint32_t *pol = sl.pol;
    if (WIDE) {
        if (lane < K) {
            const int r = lane;
            af_load(g + r * nl, (const float *)t.g + r * C + l0, 4 * nl, bar);
            af_load(mq + r * nl, (const uint8_t *)t.mask + r * C + l0, nl, bar);
            af_load(pol + r * nl / 32, t.pol + (r * C + l0) / 32, nl / 8, bar);
            if (!pb)
                af_l2((const float *)t.p + r * C + l0, 4 * nl);
        }
        if (lane == K % 32) {
            af_load(lst, t.s1 + l0, 4 * nl, bar);
            af_load(S.sold[s], t.s0, 4 * K, bar);
        }
    } else {
        const int64_t e0 = (int64_t)l0 * K;
        if (lane == 0)
            af_load(g, (const float *)t.g + e0, 4 * E, bar);
        else if (lane == 1)
            af_load(mq, (const uint8_t *)t.mask + e0, E, bar);
        else if (lane == 2)
            af_load(pol, t.pol + e0 / 32, E / 8, bar);
        else if (lane == 3)
            af_load(lst, t.s0 + l0, 4 * nl, bar);
        else if (lane == 4)
            af_load(S.sold[s], t.s1, 4 * K, bar);
        else if (lane == 5 && !pb)
            af_l2((const float *)t.p + e0, 4 * E);
    }
}

/* What the mover works on for the tensor in stage s: the block's small part, the tensor's
 * table entry and block q's slice of it. */
template <int K>
struct af_mslice {
    af_small<K>   *S;
    const am_desc *t;
    int            l0, nl;
};

template <int K>
GHC_D af_mslice<K> af_mover_slice(uint32_t q, unsigned char *sm, const af_layout &lo, int s, bool wide)
{
    af_mslice<K> m;
    m.S = (af_small<K> *)(sm + lo.small);
    m.t = &m.S->desc[s];
    af_slice(*m.t, wide, q, &m.l0, &m.nl);
    return m;
}

/* The mover's lanes: the params of block q's slice of the tensor in stage s into the params'
 * buffer (for a wide tensor a lane a row), on barrier pfull. */
template <int K, bool WIDE>
GHC_D void af_fetch_par(uint32_t q, unsigned char *sm, const af_layout &lo, int s)
{
    const int lane = threadIdx.x % 32;
    const af_mslice<K> m = af_mover_slice<K>(q, sm, lo, s, WIDE);
    af_small<K> &S = *m.S;
    const am_desc &t = *m.t;
    const int l0 = m.l0, nl = m.nl, E = nl * K;
    float *par = (float *)(sm + lo.par);
    if (lane == 0)
        af_bar_expect(&S.pfull, (uint32_t)(4 * E));
    if (nl == 0)
        return;
    if (WIDE) {
        if (lane < K)
            af_load(par + lane * nl, (const float *)t.p + (int64_t)lane * t.C + l0, 4 * nl, &S.pfull);
    } else if (lane == 0) {
        af_load(par, (const float *)t.p + (int64_t)l0 * K, 4 * E, &S.pfull);
    }
}

/* The mover's lanes: stage s's results out (codes, polarity, the long side's state; the
 * agreement bits are scratch, used in the stage only: they stay there). */
template <int K, bool WIDE>
GHC_D void af_flush(uint32_t q, unsigned char *sm, const af_layout &lo, int s)
{
    const int lane = threadIdx.x % 32;
    const af_mslice<K> m = af_mover_slice<K>(q, sm, lo, s, WIDE);
    const am_desc &t = *m.t;
    const int l0 = m.l0, nl = m.nl;
    if (nl == 0)
        return;
    const int E = nl * K;
    const int64_t C = t.C;
    const af_stage sl = af_stage_at(sm, lo, s);
    const float *lst = sl.lst;
    const uint8_t *mq = sl.mq;
    const uint32_t *pol = sl.pol;
    if (WIDE) {
        if (lane < K) {
            const int r = lane;
            af_store((uint8_t *)t.mask + r * C + l0, mq + r * nl, nl);
            af_store(t.pol + (r * C + l0) / 32, pol + r * nl / 32, nl / 8);
        }
        if (lane == K % 32)
            af_store(t.s1 + l0, lst, 4 * nl);
    } else {
        const int64_t e0 = (int64_t)l0 * K;
        if (lane == 0)
            af_store((uint8_t *)t.mask + e0, mq, E);
        else if (lane == 1)
            af_store(t.pol + e0 / 32, pol, E / 8);
        else if (lane == 2)
            af_store(t.s0 + l0, lst, 4 * nl);
    }
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

#ifdef AF_TRACE
/* A timing aid (build with -DAF_TRACE; bench_optim prints the phases): thread 0 of the first
 * 8 blocks records clock64() per tensor k < 32 (wide, K = 16) at 0 the loop's top, 1 the stage
 * in, 2 the stats done, 6 the partials in (warp 0), 7 their sums, 8 the trees, 9 lane 0's
 * scalars, 3 after the exchange's barrier, 4 its update done, 5 the stage handed back, 12 its
 * partials gathered (warp 0), 13 pushed; thread 32 at 11 its prologue done and 10 the partials
 * in. (The compiler may move the clock reads among nearby instructions.) */
__device__ long long af_trace[8][32][14];
#define AF_TR(j)                                                                                        \
    do {                                                                                                \
        if (WIDE && K == 16 && blockIdx.x < 8 && (tid == 0 || (tid == 32 && (j) >= 10)) && k < 32)      \
            af_trace[blockIdx.x][k][j] = clock64();                                                     \
    } while (0)
extern "C" void ghc_k_automagic_trace(long long *out)
{
    cudaMemcpyFromSymbol(out, af_trace, sizeof(af_trace));
}
#else
#define AF_TR(j) (void)0
#endif

/* The tensors P.fl[first .. first + count) (thin: K, wide or tall), cluster c of the launch's ncl
 * taking c, c + ncl, ...; span: the largest of theirs (the shared-memory layout). */
template <int K, bool WIDE>
static __global__ void __launch_bounds__(AF_T, 1) k_am_fused(const am_plan_dev P, const ghc_automagic_args a,
                                                             int32_t first, int32_t count, int32_t span,
                                                             int32_t late, int32_t pbuf)
{
    extern __shared__ __align__(16) unsigned char sm[];
    const uint32_t q = af_rank(), nc = af_nrank();
    const int cid = (int)(blockIdx.x / nc), ncl = (int)(gridDim.x / nc);
    const int nk = cid < count ? (count - cid + ncl - 1) / ncl : 0;   /* this cluster's tensors */
    constexpr int FC = AF_MAXW * 32, NS = AF_NS;
    const af_layout lo = af_layout_of(K, span, pbuf != 0, WIDE);
    af_small<K> &S = *(af_small<K> *)(sm + lo.small);
    /* (lrcb: wide tensors only; a tall one's layout has none, and its code never reads it) */
    float *const lrcb = (float *)(sm + lo.lrc), *const lfacb = (float *)(sm + lo.lfac);
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, NW = AF_MAXW;
    if (tid == 0) {
        for (int b = 0; b < 2; b++) {
            S.pre[b] = -1;
            af_bar_init(&S.full[b]);
            af_bar_init(&S.done[b]);
            af_bar_init(&S.xb[b][0]);
            af_bar_init(&S.xb[b][1]);
            if (b == 0)
                af_bar_init(&S.pfull);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    af_cluster_sync();   /* every block's barriers are set before any push */

    if (warp == NW) {   /* the mover */
        for (int k = 0; k < nk + NS; k++) {
            const int s = k % NS;
            if (k >= NS) {   /* tensor k - NS's results out, once computed; its stage then free */
                af_bar_wait(&S.done[s], (uint32_t)((k - NS) / NS) & 1u);
                /* first tensor k - 1's params (the buffer is free with k - 2 done): its update
                 * comes before tensor k's stats */
                if (pbuf && k - 1 < nk)
                    af_fetch_par<K, WIDE>(q, sm, lo, (k - 1) % NS);
                af_flush<K, WIDE>(q, sm, lo, s);
                asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
            }
            if (k < nk)
                af_fetch<K, WIDE>(P, P.fl[first + cid + k * ncl], q, sm, lo, s, pbuf != 0);
            if (pbuf && k == 0 && nk > 0)
                af_fetch_par<K, WIDE>(q, sm, lo, 0);
        }
    } else {
        float *prev_aux = NULL;   /* exact mode: the previous tensor's aux and size, its lr sums pending */
        int32_t prev_n = 0;
        /* a warp (0 for the fallback, else 1, off warp 0's path): waits for tensor kk's lr pushes;
         * rank 0 writes its mean lr (the sums in rank order) */
        auto mean_lr = [&](int kk, float *aux, int32_t n) {
            af_bar_wait(&S.xb[kk & 1][1], (uint32_t)(kk >> 1) & 1u);
            if (q == 0 && lane == 0) {
                float sum = 0.0f;
                for (int b = 0; b < (int)nc; b++)
                    sum = __fadd_rn(sum, S.rl[kk & 1][b][1]);
                aux[1] = __fdiv_rn(sum, (float)n);
            }
        };
        /* the new code of every (agreement, old code) against the new scale nsc (into lc[].y), the threads
         * from i0 in steps of n */
        auto code_table = [&](float2 *lc, int s, float nsc, int i0, int n) {
            for (int e = i0; e < 512; e += n)
                lc[e].y = __uint_as_float(am_code((uint8_t)e, e >> 8, S.oscale[s], nsc, a) & 0xffu);
        };
        /* the new lr of (agreement, old code) against the old scale os (exact, a lookup), the
         * threads from i0 in steps of n */
        auto lr_table = [&](float2 *lc, float os, int i0, int n) {
            for (int e = i0; e < 512; e += n)
                lc[e].x = am_lr(__fmul_rn((float)(int8_t)(uint8_t)e, os), e >> 8, a);
        };
        /* wide: the nl columns' new state (in lst), 1 / state and factor, the threads from i0
         * in steps of n; returns the largest state (bits) */
        auto columns = [&](const float *g, float *lst, int nl, float *lrc, float *lfac, int i0, int n) {
            uint32_t mx = 0u;
            for (int c = i0; c < nl; c += n) {
                float sum = 0.0f;
#pragma unroll
                for (int r = 0; r < K; r++) {
                    const float v = g[r * nl + c];
                    sum = __fadd_rn(sum, __fadd_rn(__fmul_rn(v, v), a.eps));
                }
                const float nv = am_ema(lst[c], __fdiv_rn(sum, (float)K), a);
                lst[c] = nv;
                lrc[c] = __frcp_rn(nv);
                lfac[c] = __fdiv_rn(1.0f, __fsqrt_rn(nv));
                mx = max(mx, __float_as_uint(nv));
            }
            return mx;
        };
        uint32_t ex2n = 0u;   /* the prologue's largest column state (for the next tensor) */
        for (int k = 0; k < nk; k++) {
            const int s = k % NS, x = k & 1;
            AF_TR(0);
            af_bar_wait(&S.full[s], (uint32_t)(k / NS) & 1u);
            AF_TR(1);
            const am_desc t = S.desc[s];
            int l0, nl;
            af_slice(t, WIDE, q, &l0, &nl);
            const int E = nl * K;
            const af_stage sl = af_stage_at(sm, lo, s);
            float *g = sl.g, *lst = sl.lst;
            uint8_t *mq = sl.mq;
            uint32_t *pol = sl.pol, *agr = sl.agr;
            float *lrc = lrcb + (k & 1) * span, *lfac = lfacb + (k & 1) * span;
            float2 *lc = S.lc[k & 1];
            const bool pre = S.pre[k & 1] == k;   /* made in the previous tensor's exchange */
            if (!pre)
                lr_table(lc, S.oscale[s], tid, FC);

            /* 1. the long side's lines (complete here) and this block's partials of the short
             * side; and for the new int8 scale, known before the update: the max |new lr|
             * (the sign of u is the sign of g unless u underflows: checked in 2), the smallest
             * nonzero |g| and the largest long-side state. ex[]: maxima of order-preserving u32 */
            uint32_t ex[AF_NEX] = { 0u, 0u, pre ? ex2n : 0u }, gmn = 0xffffffffu;   /* gmn: min of 2 |g| - 1 (bits) */
            if (WIDE && !pre)   /* a column: its new state, 1 / state, the factor */
                ex[2] = columns(g, lst, nl, lrc, lfac, tid, FC);
            af_csync();
            float lm = 0.0f;   /* the max |new lr| */
            /* 4 consecutive elements e, their codes c4 and old polarity bits (low 4 of old) */
            auto track4 = [&](const float e[4], uint32_t c4, uint32_t old) {
                uint32_t gp = 0u;
#pragma unroll
                for (int u = 0; u < 4; u++)
                    gp |= (uint32_t)(e[u] > 0.0f) << u;
                const uint32_t sb = ~(gp ^ old);   /* bit u: its sign agrees (the sign of u is g's) */
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    lm = fmaxf(lm, fabsf(lc[__byte_perm(c4, 0u, 0x4440u + (uint32_t)u) | ((sb << (8 - u)) & 0x100u)].x));
                    gmn = min(gmn, (__float_as_uint(e[u]) << 1) - 1u);   /* zeros wrap to the max */
                }
            };
            if (WIDE) {
                for (int r = warp; r < K; r += NW) {   /* a row's partials: a warp over the columns, 4 a lane */
                    float sv = 0.0f, sq = 0.0f;
                    for (int c = 4 * lane; c < nl; c += 128) {
                        const int i = r * nl + c;
                        const float4 v = *(const float4 *)(g + i), rc = *(const float4 *)(lrc + c);
                        const float e[4] = { v.x, v.y, v.z, v.w }, f[4] = { rc.x, rc.y, rc.z, rc.w };
                        const uint32_t c4 = *(const uint32_t *)(mq + i), old = pol[i / 32] >> (i % 32);
#pragma unroll
                        for (int u = 0; u < 4; u++) {
                            const float g2 = __fmul_rn(e[u], e[u]);
                            sv = __fadd_rn(sv, __fadd_rn(g2, a.eps));
                            sq = __fadd_rn(sq, __fmul_rn(g2, f[u]));
                        }
                        track4(e, c4, old);
                    }
                    sv = ghc_warp_sum(sv);
                    sq = ghc_warp_sum(sq);
                    if (lane == 0) {
                        S.xch[r] = sv;
                        S.xch[K + r] = sq;
                    }
                }
            } else {
                constexpr int LPR = K / 4, RPS = FC / LPR;   /* lanes a row, rows a step */
                const int cg = tid % LPR;
                float pv[4] = { 0.0f, 0.0f, 0.0f, 0.0f }, pq[4] = { 0.0f, 0.0f, 0.0f, 0.0f }, rs = 0.0f;
                /* a warp's rows are all in or all out: nl is a multiple of 128 / K = 32 / LPR */
                for (int r = tid / LPR; r < nl; r += RPS) {
                    const int i = r * K + 4 * cg;
                    const float4 v = *(const float4 *)(g + i);
                    const float e[4] = { v.x, v.y, v.z, v.w };
                    const uint32_t c4 = *(const uint32_t *)(mq + i), old = pol[i / 32] >> (i % 32);
                    track4(e, c4, old);
                    const float nv = am_ema(lst[r], __fdiv_rn(am_row4<LPR>(e, a), (float)K), a);
                    __syncwarp();
                    if (cg == 0) {
                        lst[r] = nv;
                        rs = __fadd_rn(rs, nv);
                    }
                    ex[2] = max(ex[2], __float_as_uint(nv));
                    am_acc4(pv, pq, e, __frcp_rn(nv), a);
                }
                am_lanes4<LPR>(pv, pq);
                if (lane < LPR)
#pragma unroll
                    for (int u = 0; u < 4; u++) {
                        S.part[warp][4 * cg + u] = pv[u];
                        S.part[warp][K + 4 * cg + u] = pq[u];
                    }
                rs = ghc_warp_sum(rs);
                if (lane == 0)
                    S.prs[warp] = rs;
            }
            ex[0] = __float_as_uint(lm);   /* >= 0: ordered as its bits */
            ex[1] = ~gmn;                  /* all zeros: 0 */
#pragma unroll
            for (int v = 0; v < AF_NEX; v++)   /* the extremes over the warp, then the block */
                for (int o = 16; o > 0; o /= 2)
                    ex[v] = max(ex[v], __shfl_xor_sync(0xffffffffu, ex[v], o));
            if (lane == 0)
#pragma unroll
                for (int v = 0; v < AF_NEX; v++)
                    S.pex[warp][v] = ex[v];
            af_csync();

            /* this thread's first group of the update: row r0, column c0 of the slice (wide) and,
             * without the params' buffer, its params (the mover prefetched them into L2) loaded
             * now, in flight while the partials cross the cluster (warp 0: after its pushes) */
            AF_TR(2);
            int r0 = 0, c0 = 0;
            float *p0 = NULL;
            float4 xfirst = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            auto first_group = [&]() {   /* (warp 0: once its partials are pushed) */
                r0 = WIDE && nl > 0 ? 4 * tid / nl : 0;
                c0 = WIDE && nl > 0 ? 4 * tid % nl : 0;
                p0 = (float *)t.p + (WIDE ? (int64_t)l0 + (int64_t)r0 * t.C + c0 : (int64_t)l0 * K + 4 * tid);
                if (!pbuf && 4 * tid < E)
                    xfirst = __ldcg((const float4 *)p0);
            };
            if (warp != 0)
                first_group();

            /* 2. the partials to every block of the cluster, then from all of
             * them in rank order: the short side's state and factors, the clipping divisor, and
             * (exact: no u can underflow to zero, so its sign is g's) the new int8 scale */
            constexpr int NX = (2 * K + 1 + AF_NEX + 3) / 4;   /* 16-byte pushes a block */
            if (warp == 0) {
                /* the block's partials from the warps' (tall: the columns' in warp order, the
                 * rows' states by a tree) and its extremes (lane w takes warp w's) */
                if (!WIDE) {
                    for (int i = lane; i < 2 * K; i += 32) {
                        float sum = 0.0f;
#pragma unroll
                        for (int w = 0; w < NW; w++)
                            sum = __fadd_rn(sum, S.part[w][i]);
                        S.xch[i] = sum;
                    }
                    const float rs = ghc_warp_sum(lane < NW ? S.prs[lane] : 0.0f);
                    if (lane == 0)
                        S.xch[2 * K] = rs;
                }
                {
                    uint32_t m[AF_NEX];
#pragma unroll
                    for (int v = 0; v < AF_NEX; v++) {
                        m[v] = lane < NW ? S.pex[lane][v] : 0u;
#pragma unroll
                        for (int o = 16; o > 0; o /= 2)
                            m[v] = max(m[v], __shfl_xor_sync(0xffffffffu, m[v], o));
                    }
#pragma unroll
                    for (int v = 0; v < AF_NEX; v++)
                        if (lane == v)
                            S.xch[2 * K + 1 + v] = __uint_as_float(m[v]);
                }
                __syncwarp();
                AF_TR(12);
                if (lane == 0)
                    af_bar_expect(&S.xb[x][0], (uint32_t)(16 * NX) * nc);
                {   /* piece i / nc to block i % nc: nc is a power of two up to 16 (af_fit), so a
                     * lane's block is the same in each of its steps */
                    const uint32_t lg = (uint32_t)__ffs((int)nc) - 1u, rk = (uint32_t)lane & (nc - 1u);
                    const uint32_t dst = af_map(&S.rx[x][q][0], rk), bar = af_map(&S.xb[x][0], rk);
                    for (int i = lane; i < NX * (int)nc; i += 32) {
                        const uint32_t pc = (uint32_t)i >> lg;
                        af_push4a(dst + 16u * pc, *(const float4 *)&S.xch[4 * pc], bar);
                    }
                }
                AF_TR(13);
                first_group();
                const float sqn = (float)sqrt((double)t.n);
                af_bar_wait(&S.xb[x][0], (uint32_t)(k >> 1) & 1u);
                AF_TR(6);
                float sv = 0.0f, sq = 0.0f, rsum = 0.0f;
                uint32_t exv = 0u;
#pragma unroll 4
                for (int b = 0; b < (int)nc; b++) {
                    if (lane < K) {
                        sv = __fadd_rn(sv, S.rx[x][b][lane]);
                        sq = __fadd_rn(sq, S.rx[x][b][K + lane]);
                    }
                    if (!WIDE)
                        rsum = __fadd_rn(rsum, S.rx[x][b][2 * K]);
                    if (lane < AF_NEX)
                        exv = max(exv, __float_as_uint(S.rx[x][b][2 * K + 1 + lane]));
                }
                AF_TR(7);
                float nv = 0.0f, w = 0.0f;
                if (lane < K) {
                    nv = am_ema(S.sold[s][lane], __fdiv_rn(sv, (float)(WIDE ? t.C : t.R)), a);
                    w = __fdiv_rn(sq, nv);
                }
                /* over the lines: fixed trees (every block the same bits); the largest state
                 * gives the smallest factor (each step of the factor is monotone) */
                float wsum = w, nsum = nv, nmax = nv;
#pragma unroll
                for (int o = 16; o > 0; o /= 2) {
                    wsum = __fadd_rn(wsum, __shfl_xor_sync(0xffffffffu, wsum, o));
                    nsum = __fadd_rn(nsum, __shfl_xor_sync(0xffffffffu, nsum, o));
                    nmax = fmaxf(nmax, __shfl_xor_sync(0xffffffffu, nmax, o));
                }
                AF_TR(8);
                /* (wide: K is a power of two, so the division is this product, exactly) */
                const float rmean = WIDE ? __fmul_rn(nsum, 1.0f / K) : __fdiv_rn(rsum, (float)t.R);
                /* the factors 1 / sqrt(nv / rmean) (tall: 1 / sqrt(nv)) in the lanes < K, the
                 * smallest (of nmax) in lane 30 and the divisor sqrt(rmean wsum) / sqrt(n) / clip
                 * in lane 31: the same steps in every lane (a division by 1 is exact) */
                float fac, smin, div;
                if constexpr (K <= 16) {
                    const bool dl = lane == 31;
                    const float xin = dl ? __fmul_rn(rmean, wsum) : lane < K ? nv : nmax;
                    const float y1 = __fsqrt_rn(WIDE ? __fdiv_rn(xin, dl ? 1.0f : rmean) : xin);
                    const float z1 = __fdiv_rn(dl ? y1 : 1.0f, dl ? sqn : y1);
                    fac = __fdiv_rn(z1, dl ? a.clip : 1.0f);
                    smin = __shfl_sync(0xffffffffu, fac, 30);
                    div = __shfl_sync(0xffffffffu, fac, 31);
                } else {   /* K = 32: every lane a factor, the divisor alike in all */
                    fac = WIDE ? __fdiv_rn(1.0f, __fsqrt_rn(__fdiv_rn(nv, rmean))) : __fdiv_rn(1.0f, __fsqrt_rn(nv));
                    smin = fac;
#pragma unroll
                    for (int o = 16; o > 0; o /= 2)
                        smin = fminf(smin, __shfl_xor_sync(0xffffffffu, smin, o));
                    div = __fdiv_rn(__fdiv_rn(__fsqrt_rn(__fmul_rn(rmean, wsum)), sqn), a.clip);
                }
                if (lane < K) {
                    S.sfac[lane] = fac;
                    if (q == 0)
                        (WIDE ? t.s0 : t.s1)[lane] = nv;
                }
                uint32_t ev[AF_NEX];
#pragma unroll
                for (int v = 0; v < AF_NEX; v++)
                    ev[v] = __shfl_sync(0xffffffffu, exv, v);
                if (lane == 0) {
                    if (!(div >= 1.0f))
                        div = 1.0f;
                    S.misc[0] = div;
                    /* the smallest |u| of a nonzero g, from below (a quarter for the roundings and the fast
                     * reciprocal): the smallest |g| times the smallest factors of the short side and (from the
                     * largest state) of the long side, over div */
                    const float gmin = __uint_as_float((~ev[1] + 1u) >> 1), lmax = __uint_as_float(ev[2]);
                    const float lfmin = WIDE ? rsqrtf(lmax) : rsqrtf(lmax / rmean);
                    /* (f32: an underflow or a NaN here only sends the cluster to the fallback) */
                    const float bound = 0.25f * gmin * smin * lfmin * __fdividef(1.0f, div);   /* (within 2 ulp) */
                    const bool exact = !late && (ev[1] == 0u || bound >= 0x1p-100f);
                    S.misc[1] = exact ? 1.0f : 0.0f;   /* (the new scale: the other warps) */
                    AF_TR(9);
                }
            } else if (warp % 4 != 0) {
                /* the compute warps off warp 0's scheduler (warp w issues on sub-partition
                 * w % 4: warp 0's chain keeps its own) meanwhile: the next tensor's lr table
                 * and (wide) its columns if its stage is in, then the new codes against the
                 * scale the partials give (the update writes them if exact) */
                constexpr int NP = 32 * ((FC / 32 - 1) - (FC / 32 - 1) / 4);
                const int pt = 32 * (warp - 1 - (warp - 1) / 4) + lane;
                if (warp == 1 && prev_aux)   /* the previous tensor's lr sums, if its scale was known early */
                    mean_lr(k - 1, prev_aux, prev_n);
                if (k + 1 < nk) {
                    const int s1 = (k + 1) % NS, k1 = (k + 1) & 1;
                    const uint32_t par = (uint32_t)((k + 1) / NS) & 1u;
                    if (pt == 0)
                        S.pf = af_bar_test(&S.full[s1], par);
                    asm volatile("bar.sync 2, %0;" ::"n"(NP) : "memory");
                    if (S.pf) {
                        af_bar_wait(&S.full[s1], par);   /* complete: each thread's acquire */
                        lr_table(S.lc[k1], S.oscale[s1], pt, NP);
                        if (WIDE) {
                            int l1, nl1;
                            af_slice(S.desc[s1], WIDE, q, &l1, &nl1);
                            const af_stage sn = af_stage_at(sm, lo, s1);
                            ex2n = columns(sn.g, sn.lst, nl1, lrcb + k1 * span, lfacb + k1 * span, pt, NP);
                        }
                        if (pt == 0)
                            S.pre[k1] = k + 1;
                    }
                }
                AF_TR(11);
                af_bar_wait(&S.xb[x][0], (uint32_t)(k >> 1) & 1u);
                AF_TR(10);
                uint32_t m = 0u;   /* the max |new lr| as warp 0 takes it */
                for (int b = 0; b < (int)nc; b++)
                    m = max(m, __float_as_uint(S.rx[x][b][2 * K + 1]));
                const float nsc = am_scale(__uint_as_float(m));
                if (pt == 0)
                    S.misc[2] = nsc;
                code_table(lc, s, nsc, pt, NP);
                if (!WIDE) {   /* the rows' factors: the mean row as warp 0 takes it */
                    float rsum = 0.0f;
                    for (int b = 0; b < (int)nc; b++)
                        rsum = __fadd_rn(rsum, S.rx[x][b][2 * K]);
                    const float rmean = __fdiv_rn(rsum, (float)t.R);
                    for (int r = pt; r < nl; r += NP)
                        lfac[r] = __fdiv_rn(1.0f, __fsqrt_rn(__fdiv_rn(lst[r], rmean)));
                }
            }
            af_csync();
            prev_aux = NULL;
            const bool exact = S.misc[1] != 0.0f;
            if (exact && q == 0 && tid == 32)
                t.aux[0] = S.misc[2];
            AF_TR(3);
            if (pbuf)   /* its params in */
                af_bar_wait(&S.pfull, (uint32_t)k & 1u);

            /* 3. the update, 4 elements a lane (8 lanes a polarity word) */
            const float div = S.misc[0];
            float lr_max = 0.0f, lr_sum = 0.0f;
            /* u / div as __fdiv_rn computes it: the reciprocal refined once here, the quotient and
             * its correction per element (the fast path's bits; exact where nothing over- or
             * underflows: div in (1, 2^60], |u| in [2^-60, 2^60)); otherwise __fdiv_rn (a zero is
             * itself) */
            const bool dfast = div != 1.0f && div <= 0x1p60f;
            float rdiv;
            asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(rdiv) : "f"(div));   /* what the fast path starts from */
            rdiv = __fmaf_rn(rdiv, __fmaf_rn(-div, rdiv, 1.0f), rdiv);
            /* wd: weight decay; one: div == 1 (uniform branches, not template arguments: one
             * update loop a kind of codes, 83 KB of code a kernel rather than 105) */
            const bool wd = a.weight_decay != 0.0f, one = div == 1.0f;
            auto update = [&](auto codesc) {
                /* CODES: the new codes written here (exact) */
                constexpr bool CODES = decltype(codesc)::value;
                /* the group's row r and column c of the slice (wide) and params pp, from the
                 * first (r0, c0, p0); per step of 4 FC elements dr rows and dc columns further
                 * (one row more where the columns wrap) */
                int r = r0, c = c0, dr = 0, dc = 0;
                if (WIDE && nl > 0) {
                    dr = 4 * FC / nl, dc = 4 * FC % nl;
                }
                float *pp = p0;
                const int64_t d1 = WIDE ? (int64_t)dr * t.C + dc : 4 * FC, d2 = d1 + t.C - nl;
                float4 xn = xfirst;
                const float *par = (const float *)(sm + lo.par);
                for (int i0 = 4 * tid; i0 < E; i0 += 4 * FC) {   /* E is a multiple of 128: whole warps */
                    /* the params from shared memory (pbuf) or L2, one group ahead */
                    float4 *pg = (float4 *)pp, xv = pbuf ? *(const float4 *)(par + i0) : xn;
                    float rf, cf[4];
                    if (WIDE) {
                        rf = S.sfac[r];
                        const float4 f = *(const float4 *)(lfac + c);
                        cf[0] = f.x, cf[1] = f.y, cf[2] = f.z, cf[3] = f.w;
                        c += dc;
                        r += dr;
                        const bool wrap = c >= nl;
                        if (wrap) {
                            c -= nl;
                            r++;
                        }
                        pp += wrap ? d2 : d1;
                    } else {
                        rf = lfac[i0 / K];
                        const float4 f = *(const float4 *)(S.sfac + i0 % K);
                        cf[0] = f.x, cf[1] = f.y, cf[2] = f.z, cf[3] = f.w;
                        pp += d1;
                    }
                    if (!pbuf && i0 + 4 * FC < E)
                        xn = __ldcg((const float4 *)pp);
                    const float4 gv = *(const float4 *)(g + i0);
                    const float ge[4] = { gv.x, gv.y, gv.z, gv.w };
                    float xe[4] = { xv.x, xv.y, xv.z, xv.w }, v[4], u[4];   /* v: u before the division */
                    bool slow = false;
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        u[e] = v[e] = __fmul_rn(__fmul_rn(rf, cf[e]), ge[e]);
                        if (!one) {
                            slow = slow || (__float_as_uint(v[e]) & 0x7fffffffu) - 0x21800000u >= 0x3c000000u;
                            const float q0 = __fmaf_rn(v[e], rdiv, 0.0f);
                            u[e] = __fmaf_rn(rdiv, __fmaf_rn(-div, q0, v[e]), q0);
                        }
                    }
                    if (!one && (slow || !dfast))
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            u[e] = v[e] == 0.0f ? v[e] : __fdiv_rn(v[e], div);
                    const uint32_t c4 = *(const uint32_t *)(mq + i0), sh = (uint32_t)i0 % 32u;
                    const uint32_t old = pol[i0 / 32] >> sh;
                    uint32_t nu = 0u, nc[4];
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        nu |= (uint32_t)(u[e] > 0.0f) << e;
                    const uint32_t sb = ~(nu ^ old);   /* bit e: element e's sign agrees */
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        /* (agreement, old code): the tables' index */
                        const uint32_t b = __byte_perm(c4, 0u, 0x4440u + (uint32_t)e) | ((sb << (8 - e)) & 0x100u);
                        const float2 lv = lc[b];   /* am_lr(old lr, same) and the new code: one load */
                        const float l = lv.x;
                        if (CODES)
                            nc[e] = __float_as_uint(lv.y);
                        else
                            lr_max = fmaxf(lr_max, fabsf(l));
                        lr_sum = __fadd_rn(lr_sum, l);
                        float xx = xe[e];
                        if (wd)
                            xx = __fadd_rn(xx, __fmul_rn(__fmul_rn(xx, -a.weight_decay), l));
                        xe[e] = __fadd_rn(xx, -__fmul_rn(u[e], l));
                    }
                    __stcg(pg, make_float4(xe[0], xe[1], xe[2], xe[3]));
                    if (CODES)
                        *(uint32_t *)(mq + i0) =
                            __byte_perm(__byte_perm(nc[0], nc[1], 0x0040u), __byte_perm(nc[2], nc[3], 0x0040u), 0x5410u);
                    am_bits4(nu, sb & 0xfu, i0, pol, agr, true);   /* polarity, agreement */
                }
            };
            if (exact)
                update(std::true_type());
            else
                update(std::false_type());
            AF_TR(4);
            lr_sum = ghc_warp_sum(lr_sum);   /* the warps' lr max and sum */
            for (int o = 16; o > 0; o /= 2)
                lr_max = fmaxf(lr_max, __shfl_xor_sync(0xffffffffu, lr_max, o));
            if (lane == 0) {
                S.plr[warp][0] = lr_max;
                S.plr[warp][1] = lr_sum;
            }

            /* 4. the block's lr max and sum (warp 0, once a barrier completed plr) to every
             * block. Exact: only rank 0 needs them (the mean lr, with the next tensor's
             * partials), so they go after the stage is handed back; else now: the new scale
             * (the cluster's max lr: exact in any order), the mean lr (rank order), then the
             * codes */
            auto push_lr = [&]() {   /* (lane w takes warp w's; the sum by a tree) */
                float mx = lane < NW ? S.plr[lane][0] : 0.0f;
                const float sum = ghc_warp_sum(lane < NW ? S.plr[lane][1] : 0.0f);
                for (int o = 16; o > 0; o /= 2)
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
                if (lane == 0)
                    af_bar_expect(&S.xb[x][1], 8u * nc);
                if (lane < (int)nc)
                    af_push2(&S.rl[x][q][0], mx, sum, &S.xb[x][1], (uint32_t)lane);
            };
            if (!exact) {
                af_csync();
                if (warp == 0) {
                    push_lr();
                    mean_lr(k, t.aux, t.n);
                    float m = lane < (int)nc ? S.rl[x][lane][0] : 0.0f;
                    for (int o = 16; o > 0; o /= 2)
                        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
                    if (lane == 0) {
                        S.misc[2] = am_scale(m);
                        if (q == 0)
                            t.aux[0] = S.misc[2];
                    }
                }
                af_csync();
                code_table(lc, s, S.misc[2], tid, FC);
                af_csync();
                for (int i = 4 * tid; i < E; i += 4 * FC) {
                    const uint32_t c4 = *(const uint32_t *)(mq + i), ag = agr[i / 32] >> (i % 32);
                    uint32_t o = 0;
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        o |= __float_as_uint(lc[((ag >> e) & 1u) << 8 | ((c4 >> (8 * e)) & 0xffu)].y) << (8 * e);
                    *(uint32_t *)(mq + i) = o;
                }
            }
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");   /* for the mover's bulk stores */
            af_csync();
            if (tid == 0)
                af_bar_arrive(&S.done[s]);
            AF_TR(5);
            if (exact) {
                if (warp == 0)
                    push_lr();
                prev_aux = t.aux;
                prev_n = t.n;
            }
        }
        if (warp == 1 && prev_aux)   /* the last tensor's lr sums */
            mean_lr(nk - 1, prev_aux, prev_n);
    }
    __syncwarp();
    af_cluster_sync();   /* no block leaves while its stores or another's pushes may be in flight */
}

af_fn af_kernel(int K, bool wide)
{
    switch (K * (wide ? 1 : -1)) {
    case 4: return k_am_fused<4, true>;
    case 8: return k_am_fused<8, true>;
    case 16: return k_am_fused<16, true>;
    case 32: return k_am_fused<32, true>;
    case -4: return k_am_fused<4, false>;
    case -8: return k_am_fused<8, false>;
    case -16: return k_am_fused<16, false>;
    default: return k_am_fused<32, false>;
    }
}
