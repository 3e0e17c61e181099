/* backward.c: the backward of a frozen Wan2.2 DiT: from d(loss)/d(output)
 * through unpatchify, the head and the blocks in reverse to d(loss)/d(input latent), calling
 * the adapter hook's backward on every target linear with the linear's input x and output
 * gradient dy, and letting it add to dx. Nothing of the base gets a gradient; m0..m5, the
 * head's shift/scale and the text context are constants.
 *
 * With checkpointing "block" the forward kept only each block's input, and each block's
 * forward runs again (hooks included) right before its backward; "block_attn" also kept the
 * self-attention output and lse, so the recomputation skips the attention forward; with "off"
 * every block's activations were kept. A block's input (and kept attention) is its saved
 * unit, opened for reading where the memory policy gives it (stream.c). Gradients stay f32; a
 * frozen linear's dx = dy W takes dy cast to the base dtype (GEMM operands), attention
 * gradients are in the base dtype like q, k, v.
 * With dtype "fp8" dx = dy W always runs in bf16 on the dequantised weight, fp8_gemm or not
 * (fp8 GEMMs need the x W^T layout on Hopper; dy W would need W transposed); recomputation
 * goes through wan22_block_forward and so takes the forward's fp8 path. */
#include <config.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wan22_impl.h"

#define TRY(expr) do { if ((rc = (expr)) < 0) goto out; } while (0)
#define SH(...) (int)(sizeof((int64_t[]){ __VA_ARGS__ }) / sizeof(int64_t)), (const int64_t[]){ __VA_ARGS__ }

static int mk(struct wan22 *m, ghc_tensor_t **t, enum ghc_dtype dt, int ndim, const int64_t *shape)
{
    *t = wan22_tensor(m, dt, ndim, shape, GHC_ROLE_ACTIVATIONS);
    return *t ? 0 : (ghc_error_code(m->core) < 0 ? ghc_error_code(m->core) : GHC_ENOMEM);
}

static int mkview(struct wan22 *m, ghc_tensor_t **v, ghc_tensor_t *t, int ndim, const int64_t *shape)
{
    *v = wan22_view(m, t, 0, ndim, shape);
    return *v ? 0 : GHC_ENOMEM;
}

/* The backward scratch for the state's B and L (kept between steps of the same shape). */
static int grad_prepare(struct wan22 *m)
{
    struct wan22_state *s = &m->st;
    struct wan22_grad *g = &s->grad;
    int rc = 0;
    if (s->grad_ready)
        return 0;
    const int64_t B = s->B, L = s->L, D = m->d.dim, F = m->d.ffn_dim, H = m->d.heads, Dh = D / H;
    const int64_t Lc = WAN22_TEXT_LEN, P = WAN22_PATCH;
    const enum ghc_dtype b = m->base, f = GHC_DTYPE_F32;
    TRY(mk(m, &g->G, f, SH(B, L, D)));
    TRY(mk(m, &g->dy, f, SH(B, L, D)));
    TRY(mk(m, &g->du, f, SH(B, L, D)));
    const int64_t R = wan22_ffn_rows(m, B * L);   /* the FFN's chunk */
    TRY(mk(m, &g->dF, f, SH(R, F)));
    TRY(mk(m, &g->dF2, f, SH(R, F)));
    TRY(mk(m, &g->cD, b, SH(B, L, D)));
    TRY(mkview(m, &g->cD4, g->cD, SH(B, L, H, Dh)));
    TRY(mk(m, &g->cF, b, SH(R, F)));
    if (m->concat) {   /* K-concatenation: dy cast with the adapter's spare columns */
        TRY(mk(m, &g->gD, b, SH(B, L, D + m->pad)));
        TRY(mk(m, &g->gF, b, SH(R, F + m->pad)));
        TRY(mk(m, &g->gC, b, SH(B, Lc, D + m->pad)));
    }
    TRY(mk(m, &g->dq, b, SH(B, L, D)));
    TRY(mk(m, &g->dk, b, SH(B, L, D)));
    TRY(mk(m, &g->dv, b, SH(B, L, D)));
    TRY(mkview(m, &g->dq4, g->dq, SH(B, L, H, Dh)));
    TRY(mkview(m, &g->dk4, g->dk, SH(B, L, H, Dh)));
    TRY(mkview(m, &g->dv4, g->dv, SH(B, L, H, Dh)));
    TRY(mk(m, &g->dkc, b, SH(B, Lc, D)));
    TRY(mk(m, &g->dvc, b, SH(B, Lc, D)));
    TRY(mkview(m, &g->dkc4, g->dkc, SH(B, Lc, H, Dh)));
    TRY(mkview(m, &g->dvc4, g->dvc, SH(B, Lc, H, Dh)));
    TRY(mk(m, &g->dkcp, f, SH(B, Lc, D)));
    TRY(mk(m, &g->dvcp, f, SH(B, Lc, D)));
    TRY(mk(m, &g->dhead, f, SH(B, L, P * m->d.out_ch)));
    TRY(mk(m, &g->dpatch, f, SH(B, L, P * m->d.in_ch)));
    s->grad_ready = true;
out:
    if (rc < 0) {
        ghc_tensor_t **p = (ghc_tensor_t **)g;
        for (size_t i = 0; i < sizeof(*g) / sizeof(ghc_tensor_t *); i++)
            ghc_tensor_free(p[i]);
        memset(g, 0, sizeof(*g));
    }
    return rc;
}

/* A frozen block linear y = x W^T + b (target t): dx (=, or += with accumulate) dy W and the
 * adapter's part, run by the core (linear.h), with dy cast to the base dtype in `cast` (with
 * K-concatenation into gp, the cast with spare columns). dx NULL: no input gradient (the text
 * context), the adapter's gradients only. xp: x with its spare columns (holding the forward's
 * H), or NULL. */
static int linear_bwd(struct wan22 *m, int32_t target, ghc_tensor_t *dx, const ghc_tensor_t *x, ghc_tensor_t *xp,
                      const ghc_tensor_t *dy, const ghc_tensor_t *w, float wscale, ghc_tensor_t *cast,
                      ghc_tensor_t *gp, bool accumulate, void *stream)
{
    struct ghc_linear lin = { .target = target, .w = w, .w_scale = wscale };
    wan22_linear_room(m, target, &lin);
    return ghc_linear_backward(m->lin, &lin, dx, x, xp, dy, cast, gp, accumulate, stream);
}

/* Block linear j of bw (xp: x with its spare columns or NULL; gp: the cast with them or NULL). */
#define LBWD(j, dx, x, xp, dy, cast, gp, acc) \
    linear_bwd(m, t0 + (j), (dx), (x), (xp), (dy), bw->w[j], bw->wscale[j], (cast), (gp), (acc), stream)

/* An attention output linear's backward (slot j, its input o with spare columns op): dO into
 * cD, the bf16 operand of the attention's backward. Straight from the product where the call
 * K-concatenates with an adapter on bf16 weights (rounded once; gDv, gD's first D columns, is
 * the cast scratch, which such a call never writes), else in f32 into du and cast. */
static int out_bwd(struct wan22 *m, const struct wan22_block_w *bw, int32_t block, int j, const ghc_tensor_t *o,
                   ghc_tensor_t *op, const ghc_tensor_t *dy, ghc_tensor_t *gDv, void *stream)
{
    struct wan22_grad *g = &m->st.grad;
    const int32_t t0 = block * WAN22_TARGETS, t = t0 + j;
    if (gDv && m->base == GHC_DTYPE_BF16 && !m->fp8 && op && ghc_linears_adapted(m->lin, t) &&
        ghc_linears_concat_rank(m->lin, t, NULL) > 0)
        return LBWD(j, g->cD, o, op, dy, gDv, g->gD, false);
    int rc = LBWD(j, g->du, o, op, dy, g->cD, g->gD, false);
    return rc < 0 ? rc : ghc_op_cast(g->cD, g->du, 1.0f, NULL, stream);
}

/* The FFN's backward, chunk by chunk of tokens (wan22_ffn_rows): dy = d loss / d its output on
 * entry, du = d loss / d its input u2 on return. A slot without h1 (a recomputed block) runs
 * ffn.0 and the GELU of the chunk again first, and writes ffn.2's K-concatenated H again
 * (ffn.2's forward output is not needed); a slot with h1 kept them. */
static int ffn_backward(struct wan22 *m, const struct wan22_block_w *bw, int32_t block, struct wan22_act *a,
                        void *stream)
{
    int rc = 0;
    struct wan22_state *s = &m->st;
    struct wan22_grad *g = &s->grad;
    const int32_t t0 = block * WAN22_TARGETS;
    const int64_t BL = s->B * s->L, rows = wan22_ffn_rows(m, BL), F = m->d.ffn_dim;
    const bool again = a->h1 == NULL;
    for (int64_t r0 = 0; r0 < BL && rc == 0; r0 += rows) {
        const int64_t n = BL - r0 < rows ? BL - r0 : rows;
        struct wan22_ffn_rows v;
        ghc_tensor_t *dy = NULL, *du = NULL, *cD = NULL, *gD = NULL, *gF = NULL;
        ghc_tensor_t *dF = wan22_view(m, g->dF, 0, SH(1, n, F)), *dF2 = wan22_view(m, g->dF2, 0, SH(1, n, F));
        ghc_tensor_t *cF = wan22_view(m, g->cF, 0, SH(1, n, F));
        if (g->gF)
            gF = wan22_view(m, g->gF, 0, SH(1, n, F + m->pad));
        if ((rc = wan22_ffn_rows_view(m, a, r0, n, &v)) < 0 || (rc = wan22_rows(m, g->dy, NULL, r0, n, &dy, NULL)) < 0 ||
            (rc = wan22_rows(m, g->du, NULL, r0, n, &du, NULL)) < 0 ||
            (rc = wan22_rows(m, g->cD, NULL, r0, n, &cD, NULL)) < 0 ||
            (g->gD && (rc = wan22_rows(m, g->gD, NULL, r0, n, &gD, NULL)) < 0) || !dF || !dF2 || !cF || (g->gF && !gF)) {
            rc = rc < 0 ? rc : GHC_ENOMEM;
        } else if (again) {   /* the same inputs as this step's forward (model.h) */
            ghc_linears_recompute(m->lin, true);
            struct ghc_linear lin = { .target = t0 + WAN22_FFN_2, .w = bw->w[WAN22_FFN_2],
                                      .w_scale = bw->wscale[WAN22_FFN_2] };
            wan22_linear_room(m, lin.target, &lin);
            if ((rc = wan22_ffn_hidden(m, bw, block, &v, stream)) == 0)
                rc = ghc_linear_restore(m->lin, &lin, v.g, v.gp, stream);
            ghc_linears_recompute(m->lin, false);
        }
        if (rc == 0 && (rc = LBWD(WAN22_FFN_2, dF, v.g, v.gp, dy, cD, gD, false)) == 0 &&
            (rc = ghc_op_gelu_tanh_bwd(dF2, dF, v.h1, stream)) == 0)
            rc = LBWD(WAN22_FFN_0, du, v.u2, v.u2p, dF2, cF, gF, false);
        wan22_ffn_rows_free(&v);
        ghc_tensor_t *all[] = { dy, du, cD, gD, gF, dF, dF2, cF };
        for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
            ghc_tensor_free(all[i]);
    }
    return rc;
}

/* One block: G holds d loss / d block output on entry and d loss / d block input on return. */
static int block_backward(struct wan22 *m, const struct wan22_block_w *bw, int32_t block, const ghc_tensor_t *x,
                          struct wan22_act *a, void *stream)
{
    int rc = 0;
    struct wan22_state *s = &m->st;
    struct wan22_grad *g = &s->grad;
    const float scale = 1.0f / sqrtf((float)(m->d.dim / m->d.heads));
    const int32_t t0 = block * WAN22_TARGETS;
    /* the context is a constant: only adapters on cross-attention k and v learn from it */
    const bool hb = ghc_linears_adapted(m->lin, t0 + WAN22_CA_K) || ghc_linears_adapted(m->lin, t0 + WAN22_CA_V);
    /* out_bwd's cast scratch: gD's first D columns */
    ghc_tensor_t *gDv = g->gD ? ghc_tensor_view_cols(g->gD, 0, m->d.dim) : NULL;
    if (g->gD && !gDv)
        return GHC_ENOMEM;

    /* FFN: x3 = x2 + y2 m5 */
    TRY(ghc_op_mul(g->dy, g->G, a->m[5], stream));
    TRY(ffn_backward(m, bw, block, a, stream));
    TRY(ghc_op_layernorm_bwd(g->G, g->du, a->x2, a->st2, NULL, a->m[4], true, stream));

    /* cross-attention: x2 = x1 + o_c Woc^T + boc (ungated); dq path, dk/dv for the hook */
    TRY(out_bwd(m, bw, block, WAN22_CA_O, a->oc, a->ocp, g->G, gDv, stream));
    TRY(ghc_op_attention_bwd(g->dq4, hb ? g->dkc4 : NULL, hb ? g->dvc4 : NULL, g->cD4, a->qc4, a->kc4, a->vc4,
                             a->oc, a->lsec, scale, stream));
    TRY(ghc_op_rmsnorm_bwd(g->dy, g->dq, a->qcp, a->rqc, bw->cnorm_q, stream));   /* dy: free again */
    TRY(LBWD(WAN22_CA_Q, g->du, a->c, a->cp, g->dy, g->cD, g->gD, false));
    if (hb && !wan22_recomputed(m, block)) {
        /* the context's spare columns hold the H of the last block forwarded, not this one's
         * (kept, not recomputed right before): k's and v's written again */
        for (int j = WAN22_CA_K; j <= WAN22_CA_V; j++) {
            struct ghc_linear lin = { .target = t0 + j, .w = bw->w[j], .w_scale = bw->wscale[j] };
            wan22_linear_room(m, t0 + j, &lin);
            TRY(ghc_linear_restore(m->lin, &lin, s->ctx, s->ctxp, stream));
        }
    }
    if (hb) {   /* the context is a constant: only the adapters of k and v learn from it */
        TRY(ghc_op_rmsnorm_bwd(g->dkcp, g->dkc, a->kcp, a->rkc, bw->cnorm_k, stream));
        TRY(ghc_op_cast(g->dvcp, g->dvc, 1.0f, NULL, stream));
        TRY(linear_bwd(m, t0 + WAN22_CA_K, NULL, s->ctx, s->ctxp, g->dkcp, bw->w[WAN22_CA_K], bw->wscale[WAN22_CA_K], g->dkc, g->gC, false,
                       stream));
        TRY(linear_bwd(m, t0 + WAN22_CA_V, NULL, s->ctx, s->ctxp, g->dvcp, bw->w[WAN22_CA_V], bw->wscale[WAN22_CA_V], g->dvc, g->gC, false,
                       stream));
    }
    TRY(ghc_op_layernorm_bwd(g->G, g->du, a->x1, a->st3, bw->norm3_w, NULL, true, stream));

    /* self-attention: x1 = x + (o Wo^T + bo) m2 */
    TRY(ghc_op_mul(g->dy, g->G, a->m[2], stream));
    TRY(out_bwd(m, bw, block, WAN22_SA_O, a->o, a->op, g->dy, gDv, stream));
    TRY(ghc_op_attention_bwd(g->dq4, g->dk4, g->dv4, g->cD4, a->q4, a->k4, a->v4, a->o, a->lse, scale, stream));
    /* the f32 gradients of q, k and v before their norms, one after the other in dy (free
     * since SA_O's backward): each linear's backward is queued before the next overwrites it */
    TRY(ghc_op_rmsnorm_rope_bwd(g->dy, g->dq, a->qb ? a->qb : a->qp, a->rq, bw->norm_q, m->d.heads, s->f, s->h, s->w,
                                stream));
    TRY(LBWD(WAN22_SA_Q, g->du, a->u, a->up, g->dy, g->cD, g->gD, false));
    TRY(ghc_op_rmsnorm_rope_bwd(g->dy, g->dk, a->kb ? a->kb : a->kp, a->rk, bw->norm_k, m->d.heads, s->f, s->h, s->w,
                                stream));
    TRY(LBWD(WAN22_SA_K, g->du, a->u, a->up, g->dy, g->cD, g->gD, true));
    TRY(ghc_op_cast(g->dy, g->dv, 1.0f, NULL, stream));
    TRY(LBWD(WAN22_SA_V, g->du, a->u, a->up, g->dy, g->cD, g->gD, true));
    TRY(ghc_op_layernorm_bwd(g->G, g->du, x, a->st1, NULL, a->m[1], true, stream));
out:
    ghc_tensor_free(gDv);
    return rc;
}

int wan22_backward(struct wan22 *m, int32_t expert, const ghc_tensor_t *dout, ghc_tensor_t *dnoisy, void *stream)
{
    int rc = 0;
    char buf[160];
    struct wan22_state *s = &m->st;
    const struct wan22_weights *w = &m->experts[expert];
    const int64_t N = m->d.layers, D = m->d.dim, P = WAN22_PATCH;
    ghc_tensor_t *pe = NULL, *tmp = NULL;
    ghc_mempolicy_t *mp = ghc_mempolicy_get(m->core);

    if (!s->valid)
        return ghc_error_set(m->core, GHC_EINVAL, "wan22: backward without a forward that kept its activations "
                             "(forward with keep = true, once per backward)");
    if (s->expert != expert)
        return ghc_error_set(m->core, GHC_EINVAL, "wan22: backward for expert %d after a forward of expert %d",
                             (int)expert, (int)s->expert);
    if (!dout || ghc_tensor_ndim(dout) != 5 || ghc_tensor_dim(dout, 0) != s->B ||
        ghc_tensor_dim(dout, 1) != m->d.out_ch || ghc_tensor_dim(dout, 2) != s->T ||
        ghc_tensor_dim(dout, 3) != s->Hl || ghc_tensor_dim(dout, 4) != s->Wl || !ghc_dtype_is_float(ghc_tensor_dtype(dout)))
        return ghc_error_set(m->core, GHC_EINVAL, "wan22: backward: dout is %s, expected [%lld, %lld, %lld, %lld, %lld]",
                             dout ? ghc_tensor_describe(dout, buf, sizeof(buf)) : "NULL", (long long)s->B,
                             (long long)m->d.out_ch, (long long)s->T, (long long)s->Hl, (long long)s->Wl);
    if (dnoisy && (ghc_tensor_ndim(dnoisy) != 5 || ghc_tensor_dim(dnoisy, 0) != s->B ||
                   ghc_tensor_dim(dnoisy, 1) != s->c_noisy || ghc_tensor_dim(dnoisy, 2) != s->T ||
                   ghc_tensor_dim(dnoisy, 3) != s->Hl || ghc_tensor_dim(dnoisy, 4) != s->Wl ||
                   (ghc_tensor_dtype(dnoisy) != GHC_DTYPE_F32 && ghc_tensor_dtype(dnoisy) != GHC_DTYPE_BF16)))
        return ghc_error_set(m->core, GHC_EINVAL, "wan22: backward: dnoisy is %s, expected [%lld, %lld, %lld, %lld, %lld] "
                             "f32 like batch.noisy", ghc_tensor_describe(dnoisy, buf, sizeof(buf)), (long long)s->B,
                             (long long)s->c_noisy, (long long)s->T, (long long)s->Hl, (long long)s->Wl);
    s->valid = false;
    TRY(grad_prepare(m));
    struct wan22_grad *g = &s->grad;

    /* unpatchify^-1 and the head: out = (LN(x) (1 + scale) + shift) Wh^T + bh */
    TRY(wan22_dev_begin(m, dout, &tmp, true, stream));
    TRY(ghc_op_unpatchify_bwd(g->dhead, tmp ? tmp : dout, stream));
    TRY(wan22_dev_done(m, NULL, &tmp, false, stream));
    struct ghc_gemm plain = { 0 };
    TRY(ghc_op_gemm(g->du, g->dhead, w->head_w, &plain, stream));
    TRY(ghc_op_layernorm_bwd(g->G, g->du, s->xs[N], s->hst, NULL, s->hscale, false, stream));

    /* blocks in reverse */
    if (mp)
        TRY(ghc_mem_phase(mp, GHC_PHASE_BACKWARD_BEGIN, N));
    for (int64_t i = N - 1; i >= 0; i--) {
        struct wan22_act *a = &s->acts[wan22_act_slot(m, i)], atmp;
        struct wan22_uview *v = &s->uv[0];
        struct wan22_block_w mapped;
        const struct wan22_block_w *bw;
        if (mp)
            TRY(ghc_mem_phase(mp, GHC_PHASE_BLOCK_BEGIN, i));
        TRY(wan22_unit_begin(m, i, false, v, stream));   /* the block's input (and kept attention) */
        a = wan22_unit_act(m, a, v, &atmp);
        TRY(wan22_block_map(m, &w->blocks[i], &mapped, &bw));
        rc = 0;
        if (wan22_recomputed(m, i)) {   /* recompute the activations (not the output: unused) */
            ghc_linears_recompute(m->lin, true);   /* the same inputs as in this step's forward (model.h, concat_forward) */
            rc = wan22_block_forward(m, bw, (int32_t)i, v->x, NULL, a, v, stream);
            ghc_linears_recompute(m->lin, false);
        }
        if (rc == 0)
            rc = block_backward(m, bw, (int32_t)i, v->x, a, stream);
        wan22_block_unmap(&w->blocks[i], bw == &mapped ? &mapped : NULL);
        TRY(rc);
        TRY(wan22_unit_end(m, v, stream));
        if (mp)
            TRY(ghc_mem_phase(mp, GHC_PHASE_BLOCK_END, i));
    }
    if (mp)
        TRY(ghc_mem_phase(mp, GHC_PHASE_PASS_END, N));

    /* the input latent, through the (frozen) patch embedding */
    if (dnoisy) {
        if (!(pe = wan22_view(m, w->pe_w, 0, SH(D, P * m->d.in_ch)))) {
            rc = GHC_ENOMEM;
            goto out;
        }
        TRY(ghc_op_gemm(g->dpatch, g->G, pe, &plain, stream));
        TRY(wan22_dev_begin(m, dnoisy, &tmp, false, stream));
        TRY(ghc_op_patchify_bwd(tmp ? tmp : dnoisy, g->dpatch, stream));
        TRY(wan22_dev_done(m, dnoisy, &tmp, true, stream));
    }
out:
    ghc_tensor_free(pe);
    wan22_dev_done(m, NULL, &tmp, false, stream);   /* after a failure: only waits and frees */
    wan22_unit_end(m, &s->uv[0], stream);             /* open only after a failure */
    return rc;
}
