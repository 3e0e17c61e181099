/* forward.c: the Wan2.2 DiT forward, as the official code computes it, with the precision of
 * doc/wan22.md ("Precision"): patch
 * embedding, text MLP over all 512 (zero-padded) rows, sinusoidal time embedding and
 * projection, the blocks (modulated LayerNorms, self-attention with RMSNorm q/k and 3-D RoPE,
 * cross-attention, GELU-tanh FFN, gated residuals), the head and unpatchify.
 *
 * Only the ops of ops.h compute, so the same code runs on the CPU and on a GPU. The residual
 * stream, norms, modulation, gates, time path and head are f32; block and text linears take
 * base-dtype operands (bf16 or f32) with f32 accumulation and write f32 outputs, which the
 * adapter hook sees and adds to, but for self-attention v (block_qkv: q and k too) and ffn.0
 * (with its GELU, ghc_linear_forward_gelu), written in the base dtype; attention runs in the
 * base dtype with f32 statistics.
 * Patchify (with the I2V channel concatenation) and unpatchify are the device ops
 * ghc_op_patchify / ghc_op_unpatchify (backward.c uses their _bwd ops), so they run where the
 * model runs without a host synchronisation; so are the f64 sinusoid
 * (ghc_op_timestep_embedding) and the padded, masked text rows (ghc_op_pad_rows). A forward
 * whose batch is on the model's device, or whose timesteps only are on the host (the
 * trainer's), queues its work and returns without waiting for the device. */
#include <config.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wan22_impl.h"

#define TRY(expr) do { if ((rc = (expr)) < 0) goto out; } while (0)

/* ---- tensors ------------------------------------------------------------------------------- */

ghc_tensor_t *wan22_view(struct wan22 *m, ghc_tensor_t *t, int64_t offset_elems, int ndim, const int64_t *shape)
{
    char *p = (char *)ghc_tensor_data(t) + (size_t)offset_elems * ghc_dtype_size(ghc_tensor_dtype(t));
    return ghc_tensor_wrap(m->core, ghc_tensor_dtype(t), ndim, shape, ghc_tensor_device(t), p);
}

/* Allocate *t on the model's device; returns 0 or the error code. */
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

#define SH(...) (int)(sizeof((int64_t[]){ __VA_ARGS__ }) / sizeof(int64_t)), (const int64_t[]){ __VA_ARGS__ }

static void act_free(struct wan22_act *a)
{
    ghc_tensor_t **p = (ghc_tensor_t **)a;
    for (size_t i = 0; i < sizeof(*a) / sizeof(ghc_tensor_t *); i++)
        ghc_tensor_free(p[i]);   /* views first or last: a view never owns memory */
    memset(a, 0, sizeof(*a));
}

/* *v = the first K columns of a new zeroed [B, L, K + P] tensor *t (P = 0: *v = *t, dense). */
static int mkpad(struct wan22 *m, ghc_tensor_t **t, ghc_tensor_t **v, enum ghc_dtype dt, int64_t B, int64_t L,
                 int64_t K, int64_t P)
{
    if (!P)
        return mk(m, v, dt, SH(B, L, K));
    int rc = mk(m, t, dt, SH(B, L, K + P));
    if (rc < 0 || (rc = ghc_op_fill(*t, 0.0, NULL)) < 0)   /* spare columns no adapter writes stay 0 */
        return rc;
    *v = ghc_tensor_view_cols(*t, 0, K);
    return *v ? 0 : GHC_ENOMEM;
}

/* A slot's activations; ffn: with the FFN's h1 (a slot the backward reads without recomputing:
 * checkpointing off, or a block checkpoint_every keeps). */
static int act_alloc(struct wan22 *m, struct wan22_act *a, int64_t B, int64_t L, bool ffn)
{
    int rc = 0;
    const int64_t D = m->d.dim, F = m->d.ffn_dim, H = m->d.heads, Dh = D / H, Lc = WAN22_TEXT_LEN;
    const enum ghc_dtype b = m->base, f = GHC_DTYPE_F32;
    const int64_t P = m->concat ? m->pad : 0;   /* K-concatenation: the inputs' spare columns */
    for (int k = 0; k < 6; k++)
        TRY(mk(m, &a->m[k], f, SH(B, D)));
    TRY(mk(m, &a->st1, f, SH(B * L, 2)));
    TRY(mk(m, &a->st3, f, SH(B * L, 2)));
    TRY(mk(m, &a->st2, f, SH(B * L, 2)));
    TRY(mkpad(m, &a->up, &a->u, b, B, L, D, 3 * P));
    TRY(mk(m, m->ckpt_qkv ? &a->qb : &a->qp, m->ckpt_qkv ? b : f, SH(B, L, D)));
    TRY(mk(m, m->ckpt_qkv ? &a->kb : &a->kp, m->ckpt_qkv ? b : f, SH(B, L, D)));
    TRY(mk(m, &a->rq, f, SH(B * L)));
    TRY(mk(m, &a->rk, f, SH(B * L)));
    TRY(mk(m, &a->q, b, SH(B, L, D)));
    TRY(mk(m, &a->k, b, SH(B, L, D)));
    TRY(mk(m, &a->v, b, SH(B, L, D)));
    TRY(mkpad(m, &a->op, &a->o, b, B, L, D, P));
    TRY(mkview(m, &a->q4, a->q, SH(B, L, H, Dh)));
    TRY(mkview(m, &a->k4, a->k, SH(B, L, H, Dh)));
    TRY(mkview(m, &a->v4, a->v, SH(B, L, H, Dh)));
    TRY(mk(m, &a->lse, f, SH(B, H, L)));
    TRY(mk(m, &a->x1, f, SH(B, L, D)));
    TRY(mk(m, &a->x2, f, SH(B, L, D)));
    TRY(mkpad(m, &a->cp, &a->c, b, B, L, D, P));
    TRY(mk(m, &a->qcp, f, SH(B, L, D)));
    TRY(mk(m, &a->rqc, f, SH(B * L)));
    TRY(mk(m, &a->qc, b, SH(B, L, D)));
    TRY(mkview(m, &a->qc4, a->qc, SH(B, L, H, Dh)));
    TRY(mk(m, &a->kcp, f, SH(B, Lc, D)));
    TRY(mk(m, &a->rkc, f, SH(B * Lc)));
    TRY(mk(m, &a->kc, b, SH(B, Lc, D)));
    TRY(mkview(m, &a->kc4, a->kc, SH(B, Lc, H, Dh)));
    TRY(mk(m, &a->vcp, f, SH(B, Lc, D)));
    TRY(mk(m, &a->vc, b, SH(B, Lc, D)));
    TRY(mkview(m, &a->vc4, a->vc, SH(B, Lc, H, Dh)));
    TRY(mkpad(m, &a->ocp, &a->oc, b, B, L, D, P));
    TRY(mk(m, &a->lsec, f, SH(B, H, L)));
    TRY(mkpad(m, &a->u2p, &a->u2, b, B, L, D, P));
    if (ffn)
        TRY(mk(m, &a->h1, b, SH(B, L, F)));
    TRY(mkpad(m, &a->gp, &a->g, b, B, L, F, P));
out:
    return rc;
}

void wan22_state_free(struct wan22 *m)
{
    struct wan22_state *s = &m->st;
    wan22_unit_end(m, &s->uv[0], NULL);   /* open only after a failure */
    wan22_unit_end(m, &s->uv[1], NULL);
    ghc_tensor_t *single[] = { s->ctxv, s->ctxp, s->ctx, s->ctx_in, s->ctx_h, s->sinus, s->e, s->se, s->th,
                               s->patches, s->hshift, s->hscale, s->hst, s->hn, s->ho, s->xq, s->xalt,
                               s->y, s->fh1 };
    for (size_t i = 0; i < sizeof(single) / sizeof(single[0]); i++)
        ghc_tensor_free(single[i]);
    for (int k = 0; k < 6; k++)
        ghc_tensor_free(s->e0[k]);
    if (s->xs)
        for (int64_t i = 0; i <= m->d.layers; i++)
            ghc_tensor_free(s->xs[i]);   /* with keep: views of the units' homes, then xs[N] */
    free(s->xs);
    if (s->units)
        for (int64_t i = 0; i < m->d.layers; i++)
            ghc_tensor_free(s->units[i].home);
    free(s->units);
    for (int i = 0; i < s->n_acts; i++)
        act_free(&s->acts[i]);
    free(s->acts);
    ghc_tensor_t **g = (ghc_tensor_t **)&s->grad;
    for (size_t i = 0; i < sizeof(s->grad) / sizeof(ghc_tensor_t *); i++)
        ghc_tensor_free(g[i]);
    memset(s, 0, sizeof(*s));
}

static size_t align256(size_t n)
{
    return (n + 255) / 256 * 256;
}

/* The saved units of a training state (wan22_unit), each one allocation of role saved; xs[i]
 * views unit i's home. */
static int units_alloc(struct wan22 *m, int64_t B, int64_t L)
{
    struct wan22_state *s = &m->st;
    const int64_t D = m->d.dim, H = m->d.heads, N = m->d.layers, P = m->concat ? m->pad : 0;
    if (!(s->units = calloc((size_t)N, sizeof(*s->units))))
        return ghc_error_set(m->core, GHC_ENOMEM, "wan22: out of memory");
    for (int64_t i = 0; i < N; i++) {
        struct wan22_unit *u = &s->units[i];
        size_t at = align256((size_t)(B * L * D) * sizeof(float));
        if (m->ckpt_attn && wan22_recomputed(m, i)) {
            u->off_o = at;
            at += align256((size_t)(B * L * (D + P)) * ghc_dtype_size(m->base));
            u->off_lse = at;
            at += align256((size_t)(B * H * L) * sizeof(float));
            if (m->ckpt_qkv) {
                const size_t each = align256((size_t)(B * L * D) * ghc_dtype_size(m->base));
                u->off_qb = at;
                u->off_kb = at + each;
                u->off_v = at + 2 * each;
                at += 3 * each;
            }
        }
        u->bytes = at;
        if (!(u->home = wan22_tensor(m, GHC_DTYPE_F32, 1, (const int64_t[]){ (int64_t)(at / sizeof(float)) },
                                     GHC_ROLE_SAVED)))
            return ghc_error_code(m->core) < 0 ? ghc_error_code(m->core) : GHC_ENOMEM;
        if (!(s->xs[i] = wan22_view(m, u->home, 0, SH(B, L, D))))
            return GHC_ENOMEM;
    }
    return 0;
}

/* Allocate the state for B samples of L tokens (kept while the shapes stay and, for keep, it
 * was allocated to keep). */
static int state_prepare(struct wan22 *m, int64_t B, int64_t L, bool keep)
{
    struct wan22_state *s = &m->st;
    int rc = 0;
    if (s->xs && s->B == B && s->L == L && (s->keep || !keep))   /* a training state serves inference */
        return 0;
    wan22_state_free(m);
    const int64_t D = m->d.dim, N = m->d.layers, Lc = WAN22_TEXT_LEN;
    const enum ghc_dtype b = m->base, f = GHC_DTYPE_F32;
    s->B = B;
    s->L = L;
    s->keep = keep;
    TRY(mk(m, &s->ctx_in, b, SH(B, Lc, m->d.text_dim)));
    TRY(mk(m, &s->ctx_h, b, SH(B, Lc, D)));
    TRY(mk(m, &s->ctx, b, SH(B, Lc, D)));
    if (m->concat)   /* the context again with cross-attention k and v's spare columns */
        TRY(mkpad(m, &s->ctxp, &s->ctxv, b, B, Lc, D, 2 * m->pad));
    TRY(mk(m, &s->sinus, f, SH(B, m->d.freq_dim)));
    TRY(mk(m, &s->th, f, SH(B, D)));
    TRY(mk(m, &s->e, f, SH(B, D)));
    TRY(mk(m, &s->se, f, SH(B, D)));
    for (int k = 0; k < 6; k++)
        TRY(mk(m, &s->e0[k], f, SH(B, D)));
    TRY(mk(m, &s->patches, f, SH(B, L, WAN22_PATCH * m->d.in_ch)));
    if (!(s->xs = calloc((size_t)N + 1, sizeof(*s->xs)))) {
        rc = ghc_error_set(m->core, GHC_ENOMEM, "wan22: out of memory");
        goto out;
    }
    if (keep)
        TRY(units_alloc(m, B, L));
    for (int64_t i = keep ? N : 0; i <= (keep ? N : 1); i++)
        TRY(mk(m, &s->xs[i], f, SH(B, L, D)));
    s->n_acts = keep ? (int)wan22_act_slots(m, N) : 1;
    if (!(s->acts = calloc((size_t)s->n_acts, sizeof(*s->acts)))) {
        rc = ghc_error_set(m->core, GHC_ENOMEM, "wan22: out of memory");
        goto out;
    }
    /* slot 0 of a checkpointed or inference forward keeps no h1: its FFN runs in chunks */
    const bool chunked = !keep || m->ckpt;
    for (int i = 0; i < s->n_acts; i++)
        TRY(act_alloc(m, &s->acts[i], B, L, !(chunked && i == 0)));
    TRY(mk(m, &s->y, f, SH(B, L, D)));
    if (chunked)
        TRY(mk(m, &s->fh1, b, SH(wan22_ffn_rows(m, B * L), m->d.ffn_dim)));
    TRY(mk(m, &s->hshift, f, SH(B, D)));
    TRY(mk(m, &s->hscale, f, SH(B, D)));
    TRY(mk(m, &s->hst, f, SH(B * L, 2)));
    TRY(mk(m, &s->hn, f, SH(B, L, D)));
    TRY(mk(m, &s->ho, f, SH(B, L, WAN22_PATCH * m->d.out_ch)));
    if (m->fp8_gemm) {   /* one e4m3 input scratch for every block linear of this shape */
        const int64_t F = m->d.ffn_dim;
        int64_t n = B * L * (F > D ? F : D);
        if (B * Lc * D > n)
            n = B * Lc * D;
        TRY(mk(m, &s->xq, GHC_DTYPE_F8_E4M3, SH(n)));
    }
out:
    if (rc < 0)
        wan22_state_free(m);
    return rc;
}

/* ---- host helpers ------------------------------------------------------------------------------ */

float *wan22_host_f32(struct wan22 *m, const ghc_tensor_t *t, void *stream)
{
    int64_t n = ghc_tensor_numel(t);
    float *v = malloc((size_t)(n ? n : 1) * sizeof(float));
    ghc_tensor_t *w = NULL, *h = NULL;
    const ghc_tensor_t *src = t;
    if (!v) {
        ghc_error_set(m->core, GHC_ENOMEM, "wan22: out of memory for %lld floats", (long long)n);
        return NULL;
    }
    if (!(w = ghc_tensor_wrap(m->core, GHC_DTYPE_F32, ghc_tensor_ndim(t), ghc_tensor_shape(t), GHC_DEVICE_CPU, v)))
        goto fail;
    if (ghc_tensor_device(t) != GHC_DEVICE_CPU) {
        if (!(h = ghc_tensor_init(m->core, ghc_tensor_dtype(t), ghc_tensor_ndim(t), ghc_tensor_shape(t),
                                  GHC_DEVICE_CPU, GHC_ROLE_WORKSPACE)))
            goto fail;
        if (ghc_op_copy(h, t, stream) < 0 || ghc_op_sync(m->core, ghc_tensor_device(t), stream) < 0)
            goto fail;
        src = h;
    }
    if (ghc_tensor_convert_cpu(w, src, 1.0f) < 0)
        goto fail;
    ghc_tensor_free(h);
    ghc_tensor_free(w);
    return v;
fail:
    ghc_tensor_free(h);
    ghc_tensor_free(w);
    free(v);
    return NULL;
}

int wan22_dev_begin(struct wan22 *m, const ghc_tensor_t *t, ghc_tensor_t **tmp, bool copy_in, void *stream)
{
    *tmp = NULL;
    if (!t || ghc_tensor_device(t) == m->device)
        return 0;
    if (!(*tmp = wan22_tensor(m, ghc_tensor_dtype(t), ghc_tensor_ndim(t), ghc_tensor_shape(t), GHC_ROLE_WORKSPACE)))
        return ghc_error_code(m->core) < 0 ? ghc_error_code(m->core) : GHC_ENOMEM;
    return copy_in ? ghc_op_copy(*tmp, t, stream) : 0;
}

int wan22_dev_done(struct wan22 *m, ghc_tensor_t *t, ghc_tensor_t **tmp, bool copy_out, void *stream)
{
    int rc = 0, rs;
    if (!*tmp)
        return 0;
    if (copy_out)
        rc = ghc_op_copy(t, *tmp, stream);
    rs = ghc_op_sync(m->core, m->device, stream);   /* *tmp dies next */
    ghc_tensor_free(*tmp);
    *tmp = NULL;
    return rc < 0 ? rc : rs;
}

/* ---- linears ---------------------------------------------------------------------------------- */

/* The linear y = x W^T + b of `target` (-1: none) as the core takes it (linear.h). A block
 * linear's weight keeps spare room for K-concatenation (wan22_pad_cols). With fp8_gemm an e4m3
 * block weight multiplies x cast to e4m3 in st.xq. */
static struct ghc_linear lin_of(struct wan22 *m, int32_t target, const ghc_tensor_t *w, float wscale,
                                const ghc_tensor_t *b)
{
    struct ghc_linear lin = { .target = target, .w = w, .w_scale = wscale, .b = b,
                              .out = ghc_tensor_dim(w, 0), .in = ghc_tensor_dim(w, 1),
                              .x_e4m3 = m->fp8_gemm ? m->st.xq : NULL };
    if (target >= 0)
        wan22_linear_room(m, target, &lin);
    return lin;
}

/* y = x W^T + b (f32, or base where the caller keeps it so) and the adapter's part of `target`,
 * run by the core; xp is x with its spare columns (NULL: none). */
static int linear_s(struct wan22 *m, int32_t target, ghc_tensor_t *y, const ghc_tensor_t *x, ghc_tensor_t *xp,
                    const ghc_tensor_t *w, float wscale, const ghc_tensor_t *b, void *stream)
{
    struct ghc_linear lin = lin_of(m, target, w, wscale, b);
    return ghc_linear_forward(m->lin, &lin, y, x, xp, stream);
}

static int linear(struct wan22 *m, int32_t target, ghc_tensor_t *y, const ghc_tensor_t *x, const ghc_tensor_t *w,
                  const ghc_tensor_t *b, void *stream)
{
    return linear_s(m, target, y, x, NULL, w, 1.0f, b, stream);
}

/* A block linear (slot j of block bw); xp: x with its spare columns, or NULL. */
#define BLIN(j, y, x, xp) linear_s(m, t0 + (j), (y), (x), (xp), bw->w[j], bw->wscale[j], bw->b[j], stream)

/* ---- one block ---------------------------------------------------------------------------------- */

int wan22_rows(struct wan22 *m, ghc_tensor_t *t, ghc_tensor_t *p, int64_t r0, int64_t n, ghc_tensor_t **vr,
               ghc_tensor_t **pr)
{
    const int64_t cols = ghc_tensor_dim(t, -1);
    *vr = NULL;
    if (pr)
        *pr = NULL;
    if (!p) {
        *vr = wan22_view(m, t, r0 * cols, SH(1, n, cols));
        return *vr ? 0 : GHC_ENOMEM;
    }
    const int64_t pc = ghc_tensor_dim(p, -1);
    if (!(*pr = wan22_view(m, p, r0 * pc, SH(1, n, pc))) || !(*vr = ghc_tensor_view_cols(*pr, 0, cols)))
        return GHC_ENOMEM;
    return 0;
}

int wan22_ffn_rows_view(struct wan22 *m, struct wan22_act *a, int64_t r0, int64_t n, struct wan22_ffn_rows *v)
{
    memset(v, 0, sizeof(*v));
    int rc;
    if ((rc = wan22_rows(m, a->u2, a->u2p, r0, n, &v->u2, &v->u2p)) < 0 ||
        (rc = wan22_rows(m, a->g, a->gp, r0, n, &v->g, &v->gp)) < 0 ||
        (rc = wan22_rows(m, m->st.y, NULL, r0, n, &v->y, NULL)) < 0)
        return rc;
    if (a->h1)
        return wan22_rows(m, a->h1, NULL, r0, n, &v->h1, NULL);
    v->h1 = wan22_view(m, m->st.fh1, 0, SH(1, n, m->d.ffn_dim));
    return v->h1 ? 0 : GHC_ENOMEM;
}

void wan22_ffn_rows_free(struct wan22_ffn_rows *v)
{
    ghc_tensor_t *all[] = { v->u2, v->u2p, v->h1, v->g, v->gp, v->y };
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        ghc_tensor_free(all[i]);   /* views: the column views before or after their rows alike */
    memset(v, 0, sizeof(*v));
}

int wan22_ffn_hidden(struct wan22 *m, const struct wan22_block_w *bw, int32_t block, const struct wan22_ffn_rows *v,
                     void *stream)
{
    const int j = WAN22_FFN_0;   /* h1 and g in base; the GELU in the GEMM's epilogue where it can */
    struct ghc_linear lin = lin_of(m, block * WAN22_TARGETS + j, bw->w[j], bw->wscale[j], bw->b[j]);
    return ghc_linear_forward_gelu(m->lin, &lin, v->g, v->h1, v->u2, v->u2p, stream);
}

int wan22_block_forward(struct wan22 *m, const struct wan22_block_w *bw, int32_t block, const ghc_tensor_t *x,
                        ghc_tensor_t *xo, struct wan22_act *a, const struct wan22_uview *kept, void *stream)
{
    int rc = 0;
    struct wan22_state *s = &m->st;
    const int64_t D = m->d.dim;
    const float scale = 1.0f / sqrtf((float)(D / m->d.heads));
    const int32_t t0 = block * WAN22_TARGETS;
    ghc_tensor_t *row[6] = { 0 };
    for (int k = 0; k < 6; k++) {   /* m_k = modulation[0, k] + e0_k */
        if (!(row[k] = wan22_view(m, bw->mod, k * D, SH(D)))) {
            rc = GHC_ENOMEM;
            goto out;
        }
        TRY(ghc_op_add(a->m[k], s->e0[k], row[k], 1.0f, 1.0f, stream));
    }
    /* self-attention */
    TRY(ghc_op_layernorm_fwd(a->u, a->st1, x, NULL, NULL, a->m[0], a->m[1], WAN22_EPS, stream));
    if (a->qb) {   /* block_qkv: q and k rounded to base before their norms, as the unit keeps them */
        if (kept && kept->qb) {   /* the products are kept: only their adapters' spare columns again */
            for (int j = WAN22_SA_Q; j <= WAN22_SA_V; j++) {
                struct ghc_linear lin = { .target = t0 + j, .w = bw->w[j], .w_scale = bw->wscale[j] };
                wan22_linear_room(m, t0 + j, &lin);
                TRY(ghc_linear_restore(m->lin, &lin, a->u, a->up, stream));
            }
        } else {
            TRY(BLIN(WAN22_SA_Q, a->qb, a->u, a->up));
            TRY(BLIN(WAN22_SA_K, a->kb, a->u, a->up));
        }
        TRY(ghc_op_rmsnorm_rope_fwd(a->q, a->rq, a->qb, bw->norm_q, WAN22_EPS, m->d.heads, s->f, s->h, s->w, stream));
        TRY(ghc_op_rmsnorm_rope_fwd(a->k, a->rk, a->kb, bw->norm_k, WAN22_EPS, m->d.heads, s->f, s->h, s->w, stream));
    } else {
        TRY(BLIN(WAN22_SA_Q, a->qp, a->u, a->up));
        TRY(ghc_op_rmsnorm_rope_fwd(a->q, a->rq, a->qp, bw->norm_q, WAN22_EPS, m->d.heads, s->f, s->h, s->w, stream));
        TRY(BLIN(WAN22_SA_K, a->kp, a->u, a->up));
        TRY(ghc_op_rmsnorm_rope_fwd(a->k, a->rk, a->kp, bw->norm_k, WAN22_EPS, m->d.heads, s->f, s->h, s->w, stream));
    }
    /* v straight in the base dtype (the bias rounded to it, fused in the GEMM: linear.h) */
    if (!(kept && kept->qb))
        TRY(BLIN(WAN22_SA_V, a->v, a->u, a->up));
    if (!(kept && kept->o))   /* deterministic: a kept o and lse are the bits this would write */
        TRY(ghc_op_attention_fwd(a->o, a->lse, a->q4, a->k4, a->v4, scale, stream));
    TRY(BLIN(WAN22_SA_O, s->y, a->o, a->op));
    TRY(ghc_op_gated_residual_to(a->x1, x, s->y, a->m[2], stream));
    /* cross-attention: affine pre-norm, no modulation, no gate, no RoPE, all 512 keys */
    TRY(ghc_op_layernorm_fwd(a->c, a->st3, a->x1, bw->norm3_w, bw->norm3_b, NULL, NULL, WAN22_EPS, stream));
    TRY(BLIN(WAN22_CA_Q, a->qcp, a->c, a->cp));
    TRY(ghc_op_rmsnorm_fwd(a->qc, a->rqc, a->qcp, bw->cnorm_q, WAN22_EPS, stream));
    TRY(BLIN(WAN22_CA_K, a->kcp, s->ctx, s->ctxp));
    TRY(ghc_op_rmsnorm_fwd(a->kc, a->rkc, a->kcp, bw->cnorm_k, WAN22_EPS, stream));
    TRY(BLIN(WAN22_CA_V, a->vcp, s->ctx, s->ctxp));
    TRY(ghc_op_cast(a->vc, a->vcp, 1.0f, NULL, stream));
    TRY(ghc_op_attention_fwd(a->oc, a->lsec, a->qc4, a->kc4, a->vc4, scale, stream));
    TRY(BLIN(WAN22_CA_O, s->y, a->oc, a->ocp));
    TRY(ghc_op_gated_residual_to(a->x2, a->x1, s->y, NULL, stream));
    /* FFN, chunk by chunk of tokens (its [rows, F] tensors are the largest of a block); the
     * recomputation stops at its input: the backward runs it per chunk */
    TRY(ghc_op_layernorm_fwd(a->u2, a->st2, a->x2, NULL, NULL, a->m[3], a->m[4], WAN22_EPS, stream));
    if (xo) {
        const int64_t BL = s->B * s->L, rows = wan22_ffn_rows(m, BL);
        for (int64_t r0 = 0; r0 < BL && rc == 0; r0 += rows) {
            struct wan22_ffn_rows v;
            if ((rc = wan22_ffn_rows_view(m, a, r0, BL - r0 < rows ? BL - r0 : rows, &v)) == 0 &&
                (rc = wan22_ffn_hidden(m, bw, block, &v, stream)) == 0)
                rc = BLIN(WAN22_FFN_2, v.y, v.g, v.gp);
            wan22_ffn_rows_free(&v);
        }
        TRY(rc);
        TRY(ghc_op_gated_residual_to(xo, a->x2, s->y, a->m[5], stream));
    }
out:
    for (int k = 0; k < 6; k++)
        ghc_tensor_free(row[k]);
    return rc;
}

/* ---- the model ---------------------------------------------------------------------------------- */

/* Checks of the batch against the model; fills the state's geometry. */
static int check_batch(struct wan22 *m, const struct ghc_model_batch *bt, const ghc_tensor_t *out, int64_t *B_out,
                       int64_t *L_out, int64_t geo[4])
{
    char buf[160];
    const ghc_tensor_t *x = bt ? bt->noisy : NULL;
    if (!x || ghc_tensor_ndim(x) != 5)
        return ghc_error_set(m->core, GHC_EINVAL, "wan22: forward: batch.noisy is %s, expected [B, C, T, H, W]",
                             x ? ghc_tensor_describe(x, buf, sizeof(buf)) : "NULL");
    int64_t B = ghc_tensor_dim(x, 0), Cn = ghc_tensor_dim(x, 1), T = ghc_tensor_dim(x, 2);
    int64_t Hl = ghc_tensor_dim(x, 3), Wl = ghc_tensor_dim(x, 4);
    if (B < 1 || T < 1 || Hl < 2 || Wl < 2 || Hl % 2 || Wl % 2)
        return ghc_error_set(m->core, GHC_EINVAL, "wan22: forward: batch.noisy is %s: H and W must be even (patch 2x2)",
                             ghc_tensor_describe(x, buf, sizeof(buf)));
    if (Cn > m->d.in_ch || (Cn < m->d.in_ch && !bt->cond))
        return ghc_error_set(m->core, GHC_EINVAL, "wan22: forward: batch.noisy has %lld channels, the model takes %lld%s",
                             (long long)Cn, (long long)m->d.in_ch,
                             Cn < m->d.in_ch ? " (the rest come from batch.cond, which is NULL)" : "");
    if (Cn < m->d.in_ch) {
        const ghc_tensor_t *c = bt->cond;
        if (ghc_tensor_ndim(c) != 5 || ghc_tensor_dim(c, 0) != B || ghc_tensor_dim(c, 1) != m->d.in_ch - Cn ||
            ghc_tensor_dim(c, 2) != T || ghc_tensor_dim(c, 3) != Hl || ghc_tensor_dim(c, 4) != Wl)
            return ghc_error_set(m->core, GHC_EINVAL,
                                 "wan22: forward: batch.cond is %s, expected [%lld, %lld, %lld, %lld, %lld]",
                                 ghc_tensor_describe(c, buf, sizeof(buf)), (long long)B, (long long)(m->d.in_ch - Cn),
                                 (long long)T, (long long)Hl, (long long)Wl);
    }
    if (!bt->timesteps || ghc_tensor_numel(bt->timesteps) != B || !ghc_dtype_is_float(ghc_tensor_dtype(bt->timesteps)))
        return ghc_error_set(m->core, GHC_EINVAL, "wan22: forward: batch.timesteps is %s, expected [%lld] f32",
                             bt->timesteps ? ghc_tensor_describe(bt->timesteps, buf, sizeof(buf)) : "NULL", (long long)B);
    const ghc_tensor_t *te = bt->text_embed;
    if (!te || ghc_tensor_ndim(te) != 3 || ghc_tensor_dim(te, 0) != B || ghc_tensor_dim(te, 1) > WAN22_TEXT_LEN ||
        ghc_tensor_dim(te, 2) != m->d.text_dim || !ghc_dtype_is_float(ghc_tensor_dtype(te)))
        return ghc_error_set(m->core, GHC_EINVAL, "wan22: forward: batch.text_embed is %s, expected [%lld, <= 512, %lld]",
                             te ? ghc_tensor_describe(te, buf, sizeof(buf)) : "NULL", (long long)B,
                             (long long)m->d.text_dim);
    if (bt->text_mask && (ghc_tensor_numel(bt->text_mask) != B * ghc_tensor_dim(te, 1) ||
                          !ghc_dtype_is_float(ghc_tensor_dtype(bt->text_mask))))
        return ghc_error_set(m->core, GHC_EINVAL,
                             "wan22: forward: batch.text_mask is %s, expected [%lld, %lld] of a float dtype",
                             ghc_tensor_describe(bt->text_mask, buf, sizeof(buf)), (long long)B,
                             (long long)ghc_tensor_dim(te, 1));
    if (!out || ghc_tensor_ndim(out) != 5 || ghc_tensor_dim(out, 0) != B || ghc_tensor_dim(out, 1) != m->d.out_ch ||
        ghc_tensor_dim(out, 2) != T || ghc_tensor_dim(out, 3) != Hl || ghc_tensor_dim(out, 4) != Wl ||
        (ghc_tensor_dtype(out) != GHC_DTYPE_F32 && ghc_tensor_dtype(out) != GHC_DTYPE_BF16))
        return ghc_error_set(m->core, GHC_EINVAL, "wan22: forward: out is %s, expected [%lld, %lld, %lld, %lld, %lld] f32",
                             out ? ghc_tensor_describe(out, buf, sizeof(buf)) : "NULL", (long long)B,
                             (long long)m->d.out_ch, (long long)T, (long long)Hl, (long long)Wl);
    const ghc_tensor_t *dev[] = { x, bt->cond, bt->timesteps, te };
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++)
        if (dev[i] && ghc_tensor_device(dev[i]) != m->device && ghc_tensor_device(dev[i]) != GHC_DEVICE_CPU)
            return ghc_error_set(m->core, GHC_EINVAL, "wan22: forward: batch tensor %s is on another device than the "
                                 "model (%d)", ghc_tensor_describe(dev[i], buf, sizeof(buf)), m->device);
    *B_out = B;
    *L_out = T * (Hl / 2) * (Wl / 2);
    geo[0] = T, geo[1] = Hl, geo[2] = Wl, geo[3] = Cn;
    return 0;
}

/* The padded text embedding (zero rows past the given rows and where text_mask is 0):
 * ghc_op_pad_rows on the model's device. A text embedding or mask on another device than the
 * model's (a host batch for a GPU model) is copied over first and synchronised before its copy
 * dies; batches the core moves to the device (core/data_batch.c) take no synchronisation. */
static int text_input(struct wan22 *m, const struct ghc_model_batch *bt, void *stream)
{
    int rc = 0;
    struct wan22_state *s = &m->st;
    const ghc_tensor_t *te = bt->text_embed, *mask = bt->text_mask;
    const int64_t Lt = ghc_tensor_dim(te, 1), Lc = WAN22_TEXT_LEN;
    ghc_tensor_t *moved[2] = { NULL, NULL };
    if (Lt == Lc && !mask && ghc_tensor_device(te) == m->device)
        return ghc_op_cast(s->ctx_in, te, 1.0f, NULL, stream);
    const ghc_tensor_t **in[2] = { &te, &mask };
    for (int i = 0; i < 2; i++) {   /* a host tensor for a device model: move it over */
        const ghc_tensor_t *t = *in[i];
        if (!t || ghc_tensor_device(t) == m->device)
            continue;
        if (!(moved[i] = wan22_tensor(m, ghc_tensor_dtype(t), ghc_tensor_ndim(t), ghc_tensor_shape(t),
                                      i ? GHC_ROLE_MASKS : GHC_ROLE_TEXT_EMBEDS))) {
            rc = ghc_error_code(m->core) < 0 ? ghc_error_code(m->core) : GHC_ENOMEM;
            goto out;
        }
        TRY(ghc_op_copy(moved[i], t, stream));
        *in[i] = moved[i];
    }
    TRY(ghc_op_pad_rows(s->ctx_in, te, mask, stream));
    if (moved[0] || moved[1])
        rc = ghc_op_sync(m->core, m->device, stream);   /* the copies die next */
out:
    ghc_tensor_free(moved[0]);
    ghc_tensor_free(moved[1]);
    return rc;
}

/* The time embedding's sinusoid in f64, as the official code (diffusers: f32): cos half first,
 * t unscaled (ghc_op_timestep_embedding). Timesteps on the model's device (or a CPU model's)
 * are read in place. Host timesteps for a GPU model (the trainer's) go over by value: one
 * ghc_op_fill per sample into the first B elements of st.th, which is free here (the time MLP
 * below writes it after the sinusoid has been read), so nothing waits for the host. */
static int time_input(struct wan22 *m, const ghc_tensor_t *timesteps, void *stream)
{
    struct wan22_state *s = &m->st;
    int rc = 0;
    float *t = NULL;
    ghc_tensor_t *tv = NULL, *one = NULL;
    if (ghc_tensor_device(timesteps) == m->device)
        return ghc_op_timestep_embedding(s->sinus, timesteps, true, 10000.0, stream);
    if (!(t = wan22_host_f32(m, timesteps, stream))) {   /* a host tensor: no synchronisation */
        rc = ghc_error_code(m->core);
        goto out;
    }
    if (!(tv = wan22_view(m, s->th, 0, SH(s->B)))) {
        rc = GHC_ENOMEM;
        goto out;
    }
    for (int64_t b = 0; b < s->B; b++) {
        if (!(one = wan22_view(m, s->th, b, SH(1)))) {
            rc = GHC_ENOMEM;
            goto out;
        }
        TRY(ghc_op_fill(one, (double)t[b], stream));
        ghc_tensor_free(one);
        one = NULL;
    }
    rc = ghc_op_timestep_embedding(s->sinus, tv, true, 10000.0, stream);
out:
    ghc_tensor_free(one);
    ghc_tensor_free(tv);
    free(t);
    return rc;
}

int wan22_forward(struct wan22 *m, int32_t expert, const struct ghc_model_batch *bt, ghc_tensor_t *out, bool keep,
                  void *stream)
{
    int rc = 0;
    int64_t B = 0, L = 0, geo[4] = { 0 };
    ghc_tensor_t *tmp[2] = { 0 }, *pe = NULL, *hrow[2] = { 0 }, *tpw[6] = { 0 }, *tpb[6] = { 0 };
    struct wan22_state *s = &m->st;
    const struct wan22_weights *w = &m->experts[expert];
    const int64_t D = m->d.dim, N = m->d.layers, P = WAN22_PATCH;
    ghc_mempolicy_t *mp = ghc_mempolicy_get(m->core);

    s->valid = false;
    TRY(check_batch(m, bt, out, &B, &L, geo));
    TRY(state_prepare(m, B, L, keep));
    s->expert = expert;
    s->T = geo[0], s->Hl = geo[1], s->Wl = geo[2], s->c_noisy = geo[3];
    s->f = s->T, s->h = s->Hl / 2, s->w = s->Wl / 2;

    /* patch embedding: patchify (I2V: noisy, then cond's mask and image channels), then one
     * GEMM (f32, as ComfyUI) */
    TRY(wan22_dev_begin(m, bt->noisy, &tmp[0], true, stream));
    if (s->c_noisy < m->d.in_ch)
        TRY(wan22_dev_begin(m, bt->cond, &tmp[1], true, stream));
    TRY(ghc_op_patchify(s->patches, tmp[0] ? tmp[0] : bt->noisy,
                        s->c_noisy < m->d.in_ch ? (tmp[1] ? tmp[1] : bt->cond) : NULL, stream));
    TRY(wan22_dev_done(m, NULL, &tmp[0], false, stream));
    TRY(wan22_dev_done(m, NULL, &tmp[1], false, stream));
    if (!(pe = wan22_view(m, w->pe_w, 0, SH(D, P * m->d.in_ch)))) {
        rc = GHC_ENOMEM;
        goto out;
    }
    /* the residual stream: with keep, block i's input in saved unit i (opened for writing
     * before its producer runs, closed after block i) and the last output in xs[N]; without,
     * two buffers alternating, the last output in the second when N is odd (xs[N % 2]) */
    ghc_tensor_t *xa = s->xs[0], *xb = s->xs[1];
    if (!keep && s->keep) {   /* a training state serves inference: xs[N] and xalt alternate */
        if (!s->xalt)
            TRY(mk(m, &s->xalt, GHC_DTYPE_F32, SH(B, L, D)));
        xa = N % 2 ? s->xalt : s->xs[N];
        xb = N % 2 ? s->xs[N] : s->xalt;
    }
    if (keep)
        TRY(wan22_unit_begin(m, 0, true, &s->uv[0], stream));
    TRY(linear(m, -1, keep ? s->uv[0].x : xa, s->patches, pe, w->pe_b, stream));

    /* time: e = MLP(sinusoid) (head), e0 = Linear(silu(e)) chunked in 6 (blocks) */
    TRY(time_input(m, bt->timesteps, stream));
    TRY(linear(m, -1, s->se, s->sinus, w->t0_w, w->t0_b, stream));
    TRY(ghc_op_silu(s->th, s->se, stream));
    TRY(linear(m, -1, s->e, s->th, w->t2_w, w->t2_b, stream));
    TRY(ghc_op_silu(s->se, s->e, stream));
    for (int k = 0; k < 6; k++) {
        if (!(tpw[k] = wan22_view(m, w->tp_w, k * D * D, SH(D, D))) || !(tpb[k] = wan22_view(m, w->tp_b, k * D, SH(D)))) {
            rc = GHC_ENOMEM;
            goto out;
        }
        TRY(linear(m, -1, s->e0[k], s->se, tpw[k], tpb[k], stream));
    }

    /* text: gelu_tanh(c W0^T + b0) W2^T + b2 over all 512 rows */
    TRY(text_input(m, bt, stream));
    struct ghc_gemm g1 = { .trans_b = true, .epilogue = GHC_EPI_BIAS_GELU, .bias = w->te0_b };
    TRY(ghc_op_gemm(s->ctx_h, s->ctx_in, w->te0_w, &g1, stream));
    TRY(linear(m, -1, s->ctx, s->ctx_h, w->te2_w, w->te2_b, stream));
    if (s->ctxp)
        TRY(ghc_op_copy(s->ctxv, s->ctx, stream));

    /* blocks */
    if (mp)
        TRY(ghc_mem_phase(mp, GHC_PHASE_FORWARD_BEGIN, N));
    for (int64_t i = 0; i < N; i++) {
        struct wan22_act *a = &s->acts[keep ? wan22_act_slot(m, i) : 0], atmp;
        ghc_tensor_t *xi = i % 2 ? xb : xa, *xo = i % 2 ? xa : xb;
        struct wan22_block_w mapped;
        const struct wan22_block_w *bw;
        if (mp)
            TRY(ghc_mem_phase(mp, GHC_PHASE_BLOCK_BEGIN, i));
        if (keep) {   /* input in unit i; output into unit i + 1, or xs[N] after the last block */
            struct wan22_uview *vi = &s->uv[i % 2], *vo = &s->uv[(i + 1) % 2];
            if (i + 1 < N)
                TRY(wan22_unit_begin(m, i + 1, true, vo, stream));
            xi = vi->x;
            xo = i + 1 < N ? vo->x : s->xs[N];
            a = wan22_unit_act(m, a, vi, &atmp);   /* block_attn: o and lse written into unit i */
        }
        TRY(wan22_block_map(m, &w->blocks[i], &mapped, &bw));
        rc = wan22_block_forward(m, bw, (int32_t)i, xi, xo, a, NULL, stream);
        wan22_block_unmap(&w->blocks[i], bw == &mapped ? &mapped : NULL);
        TRY(rc);
        if (keep)
            TRY(wan22_unit_end(m, &s->uv[i % 2], stream));   /* its copy home may start */
        if (mp)
            TRY(ghc_mem_phase(mp, GHC_PHASE_BLOCK_END, i));
    }
    if (mp)
        TRY(ghc_mem_phase(mp, GHC_PHASE_PASS_END, N));

    /* head: shift, scale = head.modulation + e (no SiLU); f32 */
    ghc_tensor_t *xN = keep ? s->xs[N] : N % 2 ? xb : xa;
    for (int k = 0; k < 2; k++)
        if (!(hrow[k] = wan22_view(m, w->head_mod, k * D, SH(D)))) {
            rc = GHC_ENOMEM;
            goto out;
        }
    TRY(ghc_op_add(s->hshift, s->e, hrow[0], 1.0f, 1.0f, stream));
    TRY(ghc_op_add(s->hscale, s->e, hrow[1], 1.0f, 1.0f, stream));
    TRY(ghc_op_layernorm_fwd(s->hn, s->hst, xN, NULL, NULL, s->hshift, s->hscale, WAN22_EPS, stream));
    TRY(linear(m, -1, s->ho, s->hn, w->head_w, w->head_b, stream));

    /* unpatchify */
    TRY(wan22_dev_begin(m, out, &tmp[0], false, stream));
    TRY(ghc_op_unpatchify(tmp[0] ? tmp[0] : out, s->ho, stream));
    TRY(wan22_dev_done(m, out, &tmp[0], true, stream));
    s->valid = keep;
out:
    for (int k = 0; k < 6; k++) {
        ghc_tensor_free(tpw[k]);
        ghc_tensor_free(tpb[k]);
    }
    ghc_tensor_free(hrow[0]);
    ghc_tensor_free(hrow[1]);
    ghc_tensor_free(pe);
    wan22_dev_done(m, NULL, &tmp[0], false, stream);   /* after a failure: only waits and frees */
    wan22_dev_done(m, NULL, &tmp[1], false, stream);
    wan22_unit_end(m, &s->uv[0], stream);                /* open only after a failure */
    wan22_unit_end(m, &s->uv[1], stream);
    return rc;
}
