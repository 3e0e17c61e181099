/* pardit.c: a small diffusion transformer written as a third party would write one, against
 * the installed headers only: the proof that a model gets LoRA training, K-concatenation
 * included, through the contract (model.h, linear.h, ops.h) and nothing else. It is not Wan:
 * one joint stream of video and text tokens through "parallel" blocks (ViT-22B, PixArt-style
 * single-stream blocks), 1x1 patches, a position table, adaLN from a sinusoidal time embedding.
 *
 *   latent [B, C, F, H, W] -> tokens [B, L, C] (1x1 patches) -> embed -> + position table
 *   text   [B, <= Lt, Dt]  -> zero-padded to Lt rows        -> text_in
 *   joint stream h [B, L + Lt, D]: per sample its L video rows, then its Lt text rows
 *   t -> sinusoid -> time_in -> silu -> mod: per block shift, scale, gate; the head's shift, scale
 *   block: n = LN(h) (1 + scale) + shift;  h += gate (out(attn(qkv(n))) + fc2(gelu(fc1(n))))
 *   head:  the video rows, LN (1 + scale) + shift, a linear to C -> [B, C, F, H, W]
 *
 * Adapter targets: blocks.N.attn.qkv, blocks.N.attn.out, blocks.N.mlp.fc1, blocks.N.mlp.fc2,
 * and text_in (outside the blocks). Every linear runs through ghc_linear_forward/backward; the
 * model never calls the hook. Each target keeps `spare` rows after its weight and `spare`
 * columns after its input and weight, so that a LoRA of rank <= spare K-concatenates: its
 * factors join the model's own GEMMs. qkv and fc1 read the same normed input, so its buffer
 * is [n | qkv's spare | fc1's spare]: fc1's spare columns start at D + spare (spare_col) and
 * its weight is zero over qkv's. Random weights from model.seed, f32 throughout, on the CPU
 * or a CUDA device (every computation is a ghc_op_*; only the sinusoids and tables of a few
 * numbers are made on the host). The plugin-level members, estimate and merge_names, are in
 * estimate.c. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gh200core/linear.h>   /* defines: ghc_linears_t, struct ghc_linear, ghc_linear_forward */
#include <gh200core/model.h>    /* defines: struct ghc_model_ops, ghc_register_model */
#include <gh200core/ops.h>      /* defines: ghc_op_gemm, ghc_op_attention_fwd, ghc_op_layernorm_fwd */

#include "pardit.h"             /* defines: struct pardit_cfg, SLOTS, pardit_estimate */

#define EPS 1e-6f
static const char *const slot_name[SLOTS] = { "attn.qkv", "attn.out", "mlp.fc1", "mlp.fc2" };

/* One frozen linear y = x W^T + b: w [out + spare, spare_col + spare] (the linear is its first
 * out rows and in columns; the rest is zero until an adapter's factors are copied in), b [out]. */
struct plin {
    ghc_tensor_t *w, *b, *wv;   /* wv: w's [out, in] (target_weight) */
    int64_t out, in, spare_col, spare;
    int32_t target;             /* -1: not an adapter target */
};

/* Tensors released together, views after what they look into (in reverse order). */
struct pool {
    ghc_tensor_t **t;
    int n, cap;
    bool failed;
};

struct blk_act {
    ghc_tensor_t *st, *xn, *n, *qkv, *qv[3], *q, *k, *v, *q4, *k4, *v4, *lse, *xo, *o, *ya, *u, *xg, *g, *ym;
};

/* The activations of one batch shape, and the backward's buffers. */
struct act {
    int64_t B, Lv, S;   /* S = Lv + Lt rows per sample */
    ghc_tensor_t *lat, *tok, *pos, *hpos, *ev, *txp, *tx, *et, *th, *hsin, *sinus, *tpre, *temb, *modo;
    ghc_tensor_t **mod, **modv, **hs;   /* [3 blocks + 2] of [B, D] and the views they come from; [blocks + 1] */
    struct blk_act *blk;
    ghc_tensor_t *hv, *fst, *nf, *ho, *out;
    ghc_tensor_t *dout, *dho, *dnf, *dhv, *dh, *dyo, *dg, *du, *dn, *dao, *dao4, *dq, *dk, *dv, *dq4, *dk4, *dv4;
    ghc_tensor_t *dqkv, *dqv[3], *gp, *det, *dev, *dtok;
};

struct pardit {
    ghc_core_t *core;
    int device;
    int64_t D, H, M, nb, C, Dt, Lt, Ft, spare;
    float scale;   /* attention's 1/sqrt(head dim) */
    struct plin embed, text_in, time_in, mod, head, *blk;   /* blk: [nb * SLOTS] */
    struct ghc_model_target *targets;
    char (*names)[32];
    int32_t n_targets;
    ghc_linears_t *lin;
    ghc_tensor_t *eye;   /* I_C: the 1x1 patches' transpositions are GEMMs with it */
    struct pool wpool, apool;
    struct act a;
    bool kept;           /* the last forward kept its activations for a backward */
    char ch_from[256], td_from[256], tl_from[256];
};

/* ---- small helpers ----------------------------------------------------------------------- */

#define TRY(x)                   \
    do {                         \
        if ((rc = (x)) < 0)      \
            goto out;            \
    } while (0)

static int fail_code(struct pardit *m)
{
    int rc = ghc_error_code(m->core);
    return rc < 0 ? rc : ghc_error_set(m->core, GHC_ENOMEM, "pardit: out of memory");
}

static ghc_tensor_t *pool_add(struct pool *p, ghc_tensor_t *t)
{
    if (!t) {
        p->failed = true;
        return NULL;
    }
    if (p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 64;
        ghc_tensor_t **n = realloc(p->t, (size_t)cap * sizeof(*n));
        if (!n) {
            ghc_tensor_free(t);
            p->failed = true;
            return NULL;
        }
        p->t = n;
        p->cap = cap;
    }
    return p->t[p->n++] = t;
}

static void pool_free(struct pool *p)
{
    while (p->n > 0)
        ghc_tensor_free(p->t[--p->n]);
    free(p->t);
    *p = (struct pool){ 0 };
}

static ghc_tensor_t *tnew(struct pardit *m, struct pool *p, int device, enum ghc_mem_role role, int nd,
                          const int64_t *shape)
{
    return pool_add(p, p->failed ? NULL : ghc_tensor_init(m->core, GHC_DTYPE_F32, nd, shape, device, role));
}

/* Columns [c0, c0 + n) of t. */
static ghc_tensor_t *tview(struct pool *p, const ghc_tensor_t *t, int64_t c0, int64_t n)
{
    return pool_add(p, t && !p->failed ? ghc_tensor_view_cols(t, c0, n) : NULL);
}

/* t's memory with another shape. */
static ghc_tensor_t *talias(struct pardit *m, struct pool *p, ghc_tensor_t *t, int nd, const int64_t *shape)
{
    return pool_add(p, t && !p->failed ? ghc_tensor_wrap(m->core, GHC_DTYPE_F32, nd, shape, ghc_tensor_device(t),
                                                         ghc_tensor_data(t))
                                       : NULL);
}

#define SHAPE(...) (int)(sizeof((int64_t[]){ __VA_ARGS__ }) / sizeof(int64_t)), (const int64_t[]){ __VA_ARGS__ }
#define ACT(...) tnew(m, &m->apool, m->device, GHC_ROLE_ACTIVATIONS, SHAPE(__VA_ARGS__))
#define HOST(...) tnew(m, &m->apool, GHC_DEVICE_CPU, GHC_ROLE_WORKSPACE, SHAPE(__VA_ARGS__))
#define VIEW(t, c0, n) tview(&m->apool, (t), (c0), (n))
#define ALIAS(t, ...) talias(m, &m->apool, (t), SHAPE(__VA_ARGS__))

/* Rows [r0, r0 + n) of sample b of a dense [B, R, W] tensor, as a dense [n, W] handle over its
 * memory (free it; t must outlive it). */
static ghc_tensor_t *rows_of(struct pardit *m, const ghc_tensor_t *t, int64_t b, int64_t r0, int64_t n)
{
    const int64_t R = ghc_tensor_dim(t, 1), W = ghc_tensor_dim(t, -1);
    const size_t off = (size_t)((b * R + r0) * W) * ghc_dtype_size(ghc_tensor_dtype(t));
    return ghc_tensor_wrap(m->core, ghc_tensor_dtype(t), 2, (const int64_t[]){ n, W }, ghc_tensor_device(t),
                           (char *)ghc_tensor_cdata(t) + off);
}

/* Rows [d0, d0 + n) of every sample of dst = rows [s0, s0 + n) of src (the joint stream). */
static int rows_copy(struct pardit *m, ghc_tensor_t *dst, int64_t d0, const ghc_tensor_t *src, int64_t s0, int64_t n,
                     void *stream)
{
    int rc = 0;
    for (int64_t b = 0; b < m->a.B && rc == 0; b++) {
        ghc_tensor_t *d = rows_of(m, dst, b, d0, n), *s = rows_of(m, src, b, s0, n);
        rc = d && s ? ghc_op_copy(d, s, stream) : fail_code(m);
        ghc_tensor_free(d);
        ghc_tensor_free(s);
    }
    return rc;
}

/* dst = src for any float dtypes, devices and shapes of the same element count: the batch
 * comes in any float dtype on the model's device or the CPU, and so may `out`. */
static int move_cast(struct pardit *m, ghc_tensor_t *dst, const ghc_tensor_t *src, void *stream)
{
    ghc_tensor_t *tmp = NULL;
    int rc = 0;
    if (ghc_tensor_device(src) != ghc_tensor_device(dst)) {   /* over there in src's dtype first */
        if (!(tmp = ghc_tensor_init(m->core, ghc_tensor_dtype(src), ghc_tensor_ndim(src), ghc_tensor_shape(src),
                                    ghc_tensor_device(dst), GHC_ROLE_WORKSPACE)))
            return fail_code(m);
        if ((rc = ghc_op_copy(tmp, src, stream)) == 0)
            rc = ghc_op_sync(m->core, ghc_tensor_device(src), stream);
        src = tmp;
    }
    if (rc == 0)
        rc = ghc_op_cast(dst, src, 1.0f, NULL, stream);
    if (rc == 0 && tmp)   /* tmp is released now */
        rc = ghc_op_sync(m->core, ghc_tensor_device(dst), stream);
    ghc_tensor_free(tmp);
    return rc;
}

/* dst (on the model's device) = host, a CPU tensor of the same element count. */
static int upload(struct pardit *m, ghc_tensor_t *dst, const ghc_tensor_t *host, void *stream)
{
    ghc_tensor_t *h = ghc_tensor_wrap(m->core, GHC_DTYPE_F32, ghc_tensor_ndim(dst), ghc_tensor_shape(dst),
                                      GHC_DEVICE_CPU, (void *)ghc_tensor_cdata(host));
    int rc = h ? ghc_op_copy(dst, h, stream) : fail_code(m);
    if (rc == 0)
        rc = ghc_op_sync(m->core, m->device, stream);
    ghc_tensor_free(h);
    return rc;
}

static int gemm(ghc_tensor_t *c, const ghc_tensor_t *a, const ghc_tensor_t *b, bool ta, bool tb, void *stream)
{
    struct ghc_gemm g = { .trans_a = ta, .trans_b = tb };
    return ghc_op_gemm(c, a, b, &g, stream);
}

static int randn(ghc_tensor_t *t, struct ghc_rng *rng, float std)
{
    int rc = ghc_op_rand_normal(t, rng, NULL);
    rng->offset += ((uint64_t)ghc_tensor_numel(t) + 3) / 4;
    return rc < 0 ? rc : ghc_op_scale(t, t, std, NULL);
}

/* ---- linears ----------------------------------------------------------------------------- */

static struct ghc_linear plin_desc(const struct plin *L)
{
    return (struct ghc_linear){ .target = L->target, .w = L->w, .w_scale = 1.0f, .b = L->b, .out = L->out,
                                .in = L->in, .spare_col = L->spare_col, .spare = L->spare };
}

/* y = x W^T + b and the adapter's part; xp: x with the target's spare columns (x a view of it). */
static int lin_fwd(struct pardit *m, const struct plin *L, ghc_tensor_t *y, const ghc_tensor_t *x, ghc_tensor_t *xp,
                   void *stream)
{
    struct ghc_linear d = plin_desc(L);
    return ghc_linear_forward(m->lin, &d, y, x, xp, stream);
}

/* dx (+)= dy W and the adapter's part and gradients; dx NULL: the adapter's gradients only. The
 * scratch gp serves as the dy cast with `spare` columns after it. */
static int lin_bwd(struct pardit *m, const struct plin *L, ghc_tensor_t *dx, const ghc_tensor_t *x, ghc_tensor_t *xp,
                   const ghc_tensor_t *dy, bool accumulate, void *stream)
{
    struct ghc_linear d = plin_desc(L);
    ghc_tensor_t *gp = ghc_tensor_wrap(m->core, GHC_DTYPE_F32, 3,
                                       (const int64_t[]){ ghc_tensor_dim(dy, 0), ghc_tensor_dim(dy, 1),
                                                          L->out + L->spare },
                                       m->device, ghc_tensor_data(m->a.gp));
    ghc_tensor_t *cast = gp && L->spare ? ghc_tensor_view_cols(gp, 0, L->out) : NULL;
    int rc = !gp || (L->spare && !cast) ? fail_code(m)
                                        : ghc_linear_backward(m->lin, &d, dx, x, xp, dy, cast ? cast : gp,
                                                              L->spare ? gp : NULL, accumulate, stream);
    ghc_tensor_free(cast);
    ghc_tensor_free(gp);
    return rc;
}

/* A linear of `out` x `in` with N(0, std^2) weights and N(0, 0.02^2) biases; a target keeps
 * `spare` rows after the weight and `spare` columns from spare_col (>= in; zero between). */
static int plin_init(struct pardit *m, struct plin *L, int32_t target, int64_t out, int64_t in, int64_t spare_col,
                     float std, struct ghc_rng *rng)
{
    struct pool *p = &m->wpool;
    const int64_t s = target >= 0 ? m->spare : 0, ld = target >= 0 ? spare_col + s : in;
    *L = (struct plin){ .out = out, .in = in, .spare_col = target >= 0 ? spare_col : in, .spare = s, .target = target };
    L->w = tnew(m, p, m->device, GHC_ROLE_WEIGHTS, SHAPE(out + s, ld));
    L->b = tnew(m, p, m->device, GHC_ROLE_WEIGHTS, SHAPE(out));
    if (ld == in && s == 0)
        L->wv = L->w;
    else {
        ghc_tensor_t *rows = talias(m, p, L->w, SHAPE(out, ld));   /* the first out rows */
        L->wv = ld == in ? rows : tview(p, rows, 0, in);
    }
    if (p->failed)
        return fail_code(m);
    ghc_tensor_t *r = ghc_tensor_init(m->core, GHC_DTYPE_F32, 2, (const int64_t[]){ out, in }, m->device,
                                      GHC_ROLE_WORKSPACE);
    int rc = r ? 0 : fail_code(m);
    if (rc == 0 && (rc = ghc_op_fill(L->w, 0.0, NULL)) == 0 && (rc = randn(r, rng, std)) == 0 &&
        (rc = ghc_op_copy(L->wv, r, NULL)) == 0 && (rc = randn(L->b, rng, 0.02f)) == 0)
        rc = ghc_op_sync(m->core, m->device, NULL);
    ghc_tensor_free(r);
    return rc;
}

/* ---- activations ------------------------------------------------------------------------- */

static void act_free(struct pardit *m)
{
    pool_free(&m->apool);
    free(m->a.blk);
    free(m->a.hs);
    free(m->a.mod);
    free(m->a.modv);
    memset(&m->a, 0, sizeof(m->a));
}

/* The buffers of batches of B samples of Lv video tokens (kept until the shape changes). */
static int act_ensure(struct pardit *m, int64_t B, int64_t Lv, void *stream)
{
    struct act *a = &m->a;
    if (a->blk && a->B == B && a->Lv == Lv)
        return 0;
    act_free(m);
    const int64_t D = m->D, S = Lv + m->Lt, s = m->spare, H = m->H, Dh = D / H, M = m->M, C = m->C, nm = 3 * m->nb + 2;
    int64_t wide = 3 * D > M ? 3 * D : M;
    wide = wide > C ? wide : C;
    *a = (struct act){ .B = B, .Lv = Lv, .S = S };
    if (!(a->blk = calloc((size_t)m->nb, sizeof(*a->blk))) || !(a->hs = calloc((size_t)m->nb + 1, sizeof(*a->hs))) ||
        !(a->mod = calloc((size_t)nm, sizeof(*a->mod))) || !(a->modv = calloc((size_t)nm, sizeof(*a->modv)))) {
        act_free(m);
        return ghc_error_set(m->core, GHC_ENOMEM, "pardit: out of memory");
    }
    a->lat = ACT(B, C, Lv);
    a->tok = ACT(B, Lv, C);
    a->pos = ACT(B, Lv, D);
    a->hpos = HOST(B, Lv, D);
    a->ev = ACT(B, Lv, D);
    a->txp = ACT(B, m->Lt, m->Dt + s);
    a->tx = VIEW(a->txp, 0, m->Dt);
    a->et = ACT(B, m->Lt, D);
    a->th = HOST(B);
    a->hsin = HOST(B, 1, m->Ft);
    a->sinus = ACT(B, 1, m->Ft);
    a->tpre = ACT(B, 1, D);
    a->temb = ACT(B, 1, D);
    a->modo = ACT(B, 1, nm * D);
    for (int64_t k = 0; k < nm; k++) {
        a->mod[k] = ACT(B, D);
        a->modv[k] = VIEW(a->modo, k * D, D);
    }
    for (int64_t i = 0; i <= m->nb; i++)
        a->hs[i] = ACT(B, S, D);
    for (int64_t i = 0; i < m->nb; i++) {
        struct blk_act *k = &a->blk[i];
        k->st = ACT(B * S, 2);
        k->xn = ACT(B, S, D + 2 * s);
        k->n = VIEW(k->xn, 0, D);
        k->qkv = ACT(B, S, 3 * D);
        for (int j = 0; j < 3; j++)
            k->qv[j] = VIEW(k->qkv, j * D, D);
        k->q = ACT(B, S, D);
        k->k = ACT(B, S, D);
        k->v = ACT(B, S, D);
        k->q4 = ALIAS(k->q, B, S, H, Dh);
        k->k4 = ALIAS(k->k, B, S, H, Dh);
        k->v4 = ALIAS(k->v, B, S, H, Dh);
        k->lse = ACT(B, H, S);
        k->xo = ACT(B, S, D + s);
        k->o = VIEW(k->xo, 0, D);
        k->ya = ACT(B, S, D);
        k->u = ACT(B, S, M);
        k->xg = ACT(B, S, M + s);
        k->g = VIEW(k->xg, 0, M);
        k->ym = ACT(B, S, D);
    }
    a->hv = ACT(B, Lv, D);
    a->fst = ACT(B * Lv, 2);
    a->nf = ACT(B, Lv, D);
    a->ho = ACT(B, Lv, C);
    a->out = ACT(B, C, Lv);
    a->dout = ACT(B, C, Lv);
    a->dho = ACT(B, Lv, C);
    a->dnf = ACT(B, Lv, D);
    a->dhv = ACT(B, Lv, D);
    a->dh = ACT(B, S, D);
    a->dyo = ACT(B, S, D);
    a->dg = ACT(B, S, M);
    a->du = ACT(B, S, M);
    a->dn = ACT(B, S, D);
    a->dao = ACT(B, S, D);
    a->dao4 = ALIAS(a->dao, B, S, H, Dh);
    a->dq = ACT(B, S, D);
    a->dk = ACT(B, S, D);
    a->dv = ACT(B, S, D);
    a->dq4 = ALIAS(a->dq, B, S, H, Dh);
    a->dk4 = ALIAS(a->dk, B, S, H, Dh);
    a->dv4 = ALIAS(a->dv, B, S, H, Dh);
    a->dqkv = ACT(B, S, 3 * D);
    for (int j = 0; j < 3; j++)
        a->dqv[j] = VIEW(a->dqkv, j * D, D);
    a->gp = ACT(B * S * (wide + s));
    a->det = ACT(B, m->Lt, D);
    a->dev = ACT(B, Lv, D);
    a->dtok = ACT(B, Lv, C);
    int rc = m->apool.failed ? fail_code(m) : 0;
    /* the inputs' spare columns: zero but where an adapter writes its H */
    for (int64_t i = 0; i < m->nb && rc == 0; i++)
        if ((rc = ghc_op_fill(a->blk[i].xn, 0.0, stream)) == 0 && (rc = ghc_op_fill(a->blk[i].xo, 0.0, stream)) == 0)
            rc = ghc_op_fill(a->blk[i].xg, 0.0, stream);
    if (rc == 0) {   /* the position table: sinusoids of the token's index in (f, h, w) order */
        float *p = ghc_tensor_data(a->hpos);
        for (int64_t b = 0; b < B; b++)
            for (int64_t l = 0; l < Lv; l++)
                for (int64_t j = 0; j < D / 2; j++) {
                    double ang = (double)l * pow(10000.0, -2.0 * (double)j / (double)D);
                    p[(b * Lv + l) * D + 2 * j] = (float)sin(ang);
                    p[(b * Lv + l) * D + 2 * j + 1] = (float)cos(ang);
                }
        rc = upload(m, a->pos, a->hpos, stream);
    }
    if (rc < 0)
        act_free(m);
    return rc;
}

/* ---- forward ----------------------------------------------------------------------------- */

static int check_batch(struct pardit *m, const struct ghc_model_batch *bt, const ghc_tensor_t *out)
{
    const ghc_tensor_t *x = bt->noisy, *te = bt->text_embed;
    char d[160];
    if (!x || ghc_tensor_ndim(x) != 5 || ghc_tensor_dim(x, 1) != m->C)
        return ghc_error_set(m->core, GHC_EINVAL, "pardit: noisy is %s, expected [B, %lld, F, H, W] (%s)",
                             x ? ghc_tensor_describe(x, d, sizeof(d)) : "NULL", (long long)m->C, m->ch_from);
    const int64_t B = ghc_tensor_dim(x, 0);
    if (!bt->timesteps || ghc_tensor_numel(bt->timesteps) != B)
        return ghc_error_set(m->core, GHC_EINVAL, "pardit: timesteps must have %lld elements", (long long)B);
    if (!te || ghc_tensor_ndim(te) != 3 || ghc_tensor_dim(te, 0) != B || ghc_tensor_dim(te, 2) != m->Dt ||
        ghc_tensor_dim(te, 1) > m->Lt)
        return ghc_error_set(m->core, GHC_EINVAL, "pardit: text_embed is %s, expected [%lld, <= %lld, %lld] (%s; %s)",
                             te ? ghc_tensor_describe(te, d, sizeof(d)) : "NULL", (long long)B, (long long)m->Lt,
                             (long long)m->Dt, m->tl_from, m->td_from);
    if (bt->text_mask && ghc_tensor_numel(bt->text_mask) != B * ghc_tensor_dim(te, 1))
        return ghc_error_set(m->core, GHC_EINVAL, "pardit: text_mask must be [%lld, %lld]", (long long)B,
                             (long long)ghc_tensor_dim(te, 1));
    if (bt->cond)
        return ghc_error_set(m->core, GHC_EUNSUPPORTED, "pardit: the model takes no conditioning channels (batch.cond)");
    if (!out || ghc_tensor_numel(out) != ghc_tensor_numel(x))
        return ghc_error_set(m->core, GHC_EINVAL, "pardit: out must have the %lld elements of noisy",
                             (long long)ghc_tensor_numel(x));
    return 0;
}

/* The text rows: zero-padded to Lt (the rows past the given ones and those text_mask marks as
 * padding are zeros), then text_in. */
static int text_fwd(struct pardit *m, const struct ghc_model_batch *bt, void *stream)
{
    struct act *a = &m->a;
    const ghc_tensor_t *te = bt->text_embed;
    const int64_t L = ghc_tensor_dim(te, 1);
    ghc_tensor_t *tmp = NULL, *mask = NULL;
    int rc = ghc_op_fill(a->txp, 0.0, stream);
    if (rc == 0 && ghc_tensor_device(te) != m->device) {
        if (!(tmp = ghc_tensor_init(m->core, ghc_tensor_dtype(te), 3, ghc_tensor_shape(te), m->device,
                                    GHC_ROLE_TEXT_EMBEDS)))
            return fail_code(m);
        if ((rc = ghc_op_copy(tmp, te, stream)) == 0)
            rc = ghc_op_sync(m->core, ghc_tensor_device(te), stream);
        te = tmp;
    }
    for (int64_t b = 0; b < a->B && rc == 0 && L > 0; b++) {
        ghc_tensor_t *dst = rows_of(m, a->txp, b, 0, L), *src = rows_of(m, te, b, 0, L);
        ghc_tensor_t *dv = dst ? ghc_tensor_view_cols(dst, 0, m->Dt) : NULL;
        rc = dv && src ? ghc_op_cast(dv, src, 1.0f, NULL, stream) : fail_code(m);
        ghc_tensor_free(dv);
        ghc_tensor_free(dst);
        ghc_tensor_free(src);
    }
    if (rc == 0 && bt->text_mask && L > 0) {
        if (!(mask = ghc_tensor_init(m->core, GHC_DTYPE_F32, 2, (const int64_t[]){ a->B, L }, GHC_DEVICE_CPU,
                                     GHC_ROLE_MASKS)))
            rc = fail_code(m);
        else
            rc = move_cast(m, mask, bt->text_mask, stream);
        const float *mk = rc == 0 ? ghc_tensor_cdata(mask) : NULL;
        for (int64_t i = 0; mk && i < a->B * L && rc == 0; i++) {
            if (mk[i] != 0.0f)
                continue;
            ghc_tensor_t *row = rows_of(m, a->txp, i / L, i % L, 1);
            rc = row ? ghc_op_fill(row, 0.0, stream) : fail_code(m);
            ghc_tensor_free(row);
        }
    }
    if (rc == 0)
        rc = lin_fwd(m, &m->text_in, a->et, a->tx, a->txp, stream);
    if (tmp)   /* released now: the copy must be done */
        ghc_op_sync(m->core, m->device, stream);
    ghc_tensor_free(tmp);
    ghc_tensor_free(mask);
    return rc;
}

/* t -> sinusoid (host) -> time_in -> silu -> mod -> the per-sample shifts, scales and gates. */
static int time_fwd(struct pardit *m, const ghc_tensor_t *ts, void *stream)
{
    struct act *a = &m->a;
    const int64_t half = m->Ft / 2;
    int rc = move_cast(m, a->th, ts, stream);
    if (rc < 0)
        return rc;
    const float *t = ghc_tensor_cdata(a->th);
    float *s = ghc_tensor_data(a->hsin);
    for (int64_t b = 0; b < a->B; b++)
        for (int64_t j = 0; j < half; j++) {
            double f = exp(-log(10000.0) * (double)j / (double)half), x = (double)t[b] * f;
            s[b * m->Ft + j] = (float)cos(x);
            s[b * m->Ft + half + j] = (float)sin(x);
        }
    TRY(upload(m, a->sinus, a->hsin, stream));
    TRY(lin_fwd(m, &m->time_in, a->tpre, a->sinus, NULL, stream));
    TRY(ghc_op_silu(a->temb, a->tpre, stream));
    TRY(lin_fwd(m, &m->mod, a->modo, a->temb, NULL, stream));
    for (int64_t k = 0; k < 3 * m->nb + 2; k++)
        TRY(ghc_op_copy(a->mod[k], a->modv[k], stream));
out:
    return rc;
}

/* One parallel block: hs[i + 1] = hs[i] + gate (attention + MLP), both of one normed input. */
static int block_fwd(struct pardit *m, int64_t i, void *stream)
{
    struct act *a = &m->a;
    struct blk_act *k = &a->blk[i];
    const struct plin *W = &m->blk[i * SLOTS];
    ghc_tensor_t *x = a->hs[i], *y = a->hs[i + 1], *const *md = &a->mod[3 * i];
    int rc;
    TRY(ghc_op_layernorm_fwd(k->n, k->st, x, NULL, NULL, md[0], md[1], EPS, stream));
    TRY(lin_fwd(m, &W[QKV], k->qkv, k->n, k->xn, stream));
    TRY(ghc_op_copy(k->q, k->qv[0], stream));
    TRY(ghc_op_copy(k->k, k->qv[1], stream));
    TRY(ghc_op_copy(k->v, k->qv[2], stream));
    TRY(ghc_op_attention_fwd(k->o, k->lse, k->q4, k->k4, k->v4, m->scale, stream));
    TRY(lin_fwd(m, &W[OUT], k->ya, k->o, k->xo, stream));
    TRY(lin_fwd(m, &W[FC1], k->u, k->n, k->xn, stream));
    TRY(ghc_op_gelu_tanh(k->g, k->u, stream));
    TRY(lin_fwd(m, &W[FC2], k->ym, k->g, k->xg, stream));
    TRY(ghc_op_copy(y, x, stream));
    TRY(ghc_op_gated_residual(y, k->ya, md[2], stream));
    TRY(ghc_op_gated_residual(y, k->ym, md[2], stream));
out:
    return rc;
}

static int pardit_forward(void *self, int32_t expert, const struct ghc_model_batch *bt, ghc_tensor_t *out, bool keep,
                          void *stream)
{
    struct pardit *m = self;
    struct act *a = &m->a;
    (void)expert;
    m->kept = false;
    int rc = check_batch(m, bt, out);
    if (rc < 0)
        return rc;
    const int64_t B = ghc_tensor_dim(bt->noisy, 0), Lv = ghc_tensor_numel(bt->noisy) / (B * m->C);
    TRY(act_ensure(m, B, Lv, stream));
    /* video tokens: 1x1 patches, [B, C, L] -> [B, L, C] (a GEMM with I_C), embed, + positions */
    TRY(move_cast(m, a->lat, bt->noisy, stream));
    TRY(gemm(a->tok, a->lat, m->eye, true, false, stream));
    TRY(lin_fwd(m, &m->embed, a->ev, a->tok, NULL, stream));
    TRY(ghc_op_add(a->ev, a->ev, a->pos, 1.0f, 1.0f, stream));
    TRY(text_fwd(m, bt, stream));
    TRY(time_fwd(m, bt->timesteps, stream));
    TRY(rows_copy(m, a->hs[0], 0, a->ev, 0, Lv, stream));
    TRY(rows_copy(m, a->hs[0], Lv, a->et, 0, m->Lt, stream));
    for (int64_t i = 0; i < m->nb; i++)
        TRY(block_fwd(m, i, stream));
    /* the head on the video rows, back to [B, C, L] */
    TRY(rows_copy(m, a->hv, 0, a->hs[m->nb], 0, Lv, stream));
    TRY(ghc_op_layernorm_fwd(a->nf, a->fst, a->hv, NULL, NULL, a->mod[3 * m->nb], a->mod[3 * m->nb + 1], EPS, stream));
    TRY(lin_fwd(m, &m->head, a->ho, a->nf, NULL, stream));
    TRY(gemm(a->out, m->eye, a->ho, false, true, stream));
    TRY(move_cast(m, out, a->out, stream));
    m->kept = keep;
out:
    return rc;
}

/* ---- backward ---------------------------------------------------------------------------- */

/* dh (the gradient of hs[i + 1]) becomes that of hs[i]. */
static int block_bwd(struct pardit *m, int64_t i, void *stream)
{
    struct act *a = &m->a;
    struct blk_act *k = &a->blk[i];
    const struct plin *W = &m->blk[i * SLOTS];
    ghc_tensor_t *const *md = &a->mod[3 * i];
    int rc;
    TRY(ghc_op_mul(a->dyo, a->dh, md[2], stream));   /* both branches' output gradient */
    TRY(lin_bwd(m, &W[FC2], a->dg, k->g, k->xg, a->dyo, false, stream));
    TRY(ghc_op_gelu_tanh_bwd(a->du, a->dg, k->u, stream));
    TRY(lin_bwd(m, &W[FC1], a->dn, k->n, k->xn, a->du, false, stream));
    TRY(lin_bwd(m, &W[OUT], a->dao, k->o, k->xo, a->dyo, false, stream));
    TRY(ghc_op_attention_bwd(a->dq4, a->dk4, a->dv4, a->dao4, k->q4, k->k4, k->v4, k->o, k->lse, m->scale, stream));
    TRY(ghc_op_copy(a->dqv[0], a->dq, stream));
    TRY(ghc_op_copy(a->dqv[1], a->dk, stream));
    TRY(ghc_op_copy(a->dqv[2], a->dv, stream));
    TRY(lin_bwd(m, &W[QKV], a->dn, k->n, k->xn, a->dqkv, true, stream));
    TRY(ghc_op_layernorm_bwd(a->dh, a->dn, a->hs[i], k->st, NULL, md[1], true, stream));   /* + the residual's */
out:
    return rc;
}

static int pardit_backward(void *self, int32_t expert, const ghc_tensor_t *dout, ghc_tensor_t *dnoisy, void *stream)
{
    struct pardit *m = self;
    struct act *a = &m->a;
    (void)expert;
    if (!m->kept)
        return ghc_error_set(m->core, GHC_EINVAL, "pardit: backward without a forward that kept its activations");
    if (!dout || ghc_tensor_numel(dout) != a->B * m->C * a->Lv || (dnoisy && ghc_tensor_numel(dnoisy) != ghc_tensor_numel(dout)))
        return ghc_error_set(m->core, GHC_EINVAL, "pardit: backward: dout and dnoisy must be like the forward's noisy "
                             "[%lld, %lld, ...] of %lld elements", (long long)a->B, (long long)m->C,
                             (long long)(a->B * m->C * a->Lv));
    m->kept = false;
    int rc;
    TRY(move_cast(m, a->dout, dout, stream));
    TRY(gemm(a->dho, a->dout, m->eye, true, false, stream));
    TRY(lin_bwd(m, &m->head, a->dnf, a->nf, NULL, a->dho, false, stream));
    TRY(ghc_op_layernorm_bwd(a->dhv, a->dnf, a->hv, a->fst, NULL, a->mod[3 * m->nb + 1], false, stream));
    TRY(ghc_op_fill(a->dh, 0.0, stream));   /* the text rows' outputs are not used */
    TRY(rows_copy(m, a->dh, 0, a->dhv, 0, a->Lv, stream));
    for (int64_t i = m->nb - 1; i >= 0; i--)
        TRY(block_bwd(m, i, stream));
    /* text_in reads a constant: its adapter's gradients only, no input gradient */
    TRY(rows_copy(m, a->det, 0, a->dh, a->Lv, m->Lt, stream));
    TRY(lin_bwd(m, &m->text_in, NULL, a->tx, a->txp, a->det, false, stream));
    if (dnoisy) {
        TRY(rows_copy(m, a->dev, 0, a->dh, 0, a->Lv, stream));
        TRY(lin_bwd(m, &m->embed, a->dtok, a->tok, NULL, a->dev, false, stream));
        TRY(gemm(a->dout, m->eye, a->dtok, false, true, stream));
        TRY(move_cast(m, dnoisy, a->dout, stream));
    }
out:
    return rc;
}

/* ---- the rest of the ops ------------------------------------------------------------------ */

static int32_t pardit_experts(void *self)
{
    (void)self;
    return 1;
}

static int32_t pardit_expert_for(void *self, float t)
{
    (void)self;
    (void)t;
    return 0;
}

static int pardit_targets(void *self, const struct ghc_model_target **out, int32_t *n)
{
    struct pardit *m = self;
    *out = m->targets;
    *n = m->n_targets;
    return 0;
}

/* Every target keeps `spare` columns: the core K-concatenates each adapter whose rank fits. */
static int pardit_set_hook(void *self, const struct ghc_adapter_hook *hook)
{
    struct pardit *m = self;
    int64_t *room = malloc((size_t)m->n_targets * sizeof(*room));
    if (!room)
        return ghc_error_set(m->core, GHC_ENOMEM, "pardit: out of memory");
    for (int32_t t = 0; t < m->n_targets; t++)
        room[t] = m->spare;
    int rc = ghc_linears_set_hook(m->lin, hook, room);
    free(room);
    if (rc < 0 || !hook)
        return rc < 0 ? rc : 0;
    int32_t adapted = 0, wanted = 0;
    for (int32_t t = 0; t < m->n_targets; t++) {
        int32_t w = 0;
        if (!ghc_linears_adapted(m->lin, t))
            continue;
        adapted++;
        if (ghc_linears_concat_rank(m->lin, t, &w) == 0 && w > wanted)
            wanted = w;
    }
    ghc_log(m->core, GHC_LOG_INFO, "pardit: %d of %d adapted targets K-concatenate (spare = %lld)", rc,
            (int)adapted, (long long)m->spare);
    if (wanted > m->spare)
        ghc_log(m->core, GHC_LOG_INFO, "pardit: an adapter of rank %d does not fit spare = %lld: it runs in passes "
                "of its own (spare >= %d puts it into the model's GEMMs)", (int)wanted, (long long)m->spare,
                (int)wanted);
    return 0;
}

static int pardit_device(void *self) { return ((struct pardit *)self)->device; }

static const struct plin *target_lin(const struct pardit *m, int32_t t)
{
    return t == m->n_targets - 1 ? &m->text_in : &m->blk[t];
}

static int pardit_target_weight(void *self, int32_t expert, int32_t target, const ghc_tensor_t **w, float *w_scale,
                                const ghc_tensor_t **b)
{
    struct pardit *m = self;
    (void)expert;
    if (target < 0 || target >= m->n_targets)
        return ghc_error_set(m->core, GHC_EINVAL, "pardit: target %d out of range (the model has %d)", (int)target,
                             (int)m->n_targets);
    const struct plin *L = target_lin(m, target);
    *w = L->wv;
    *w_scale = 1.0f;
    *b = L->b;
    return 0;
}

static int pardit_input_spec(void *self, struct ghc_model_input *out)
{
    struct pardit *m = self;
    struct ghc_model_input in = {
        .struct_size = out->struct_size, .channels = m->C, .text_dim = m->Dt, .text_len = m->Lt,
        .patch = { 1, 1, 1 }, .channels_from = m->ch_from, .text_dim_from = m->td_from,
        .text_len_from = m->tl_from, .patch_from = "pardit's 1x1 patches (a linear over the channels)",
    };
    memcpy(out, &in, out->struct_size < sizeof(in) ? out->struct_size : sizeof(in));
    return 0;
}

static void pardit_free(void *self)
{
    struct pardit *m = self;
    if (!m)
        return;
    act_free(m);
    pool_free(&m->wpool);
    ghc_linears_free(m->lin);
    free(m->blk);
    free(m->targets);
    free(m->names);
    free(m);
}

/* ---- init -------------------------------------------------------------------------------- */

static const struct ghc_cfg_key pardit_keys[] = {
    { "dim",      GHC_CFG_INT, "64",  "8 to 4096",   NULL },   /* model width D */
    { "heads",    GHC_CFG_INT, "4",   "1 to 64",     NULL },
    { "mlp",      GHC_CFG_INT, "128", "1 to 65536",  NULL },   /* the MLP's hidden width */
    { "blocks",   GHC_CFG_INT, "2",   "1 to 256",    NULL },
    { "channels", GHC_CFG_INT, "16",  "1 to 4096",   NULL },   /* the latent's channels */
    { "text_dim", GHC_CFG_INT, "32",  "1 to 65536",  NULL },   /* the text embedding's width */
    { "text_len", GHC_CFG_INT, "16",  "1 to 512",    NULL },   /* text rows (zero-padded to this) */
    { "freq_dim", GHC_CFG_INT, "32",  "2 to 4096",   NULL },   /* sinusoids of the time embedding */
    { "spare",    GHC_CFG_INT, "8",   "0 to 1024",   NULL },   /* spare rows/columns per target (K-concatenation) */
    { "seed",     GHC_CFG_INT, "7",   "0 to 2^62",   NULL },   /* of the random weights */
    { "device",   GHC_CFG_INT, "-1",  "-1 to 1023",  NULL },   /* -1: the CPU, else a CUDA ordinal */
    { NULL, 0, NULL, NULL, NULL }
};

static void where(ghc_cfg_t *cfg, const char *key, char *buf, size_t len)
{
    snprintf(buf, len, "%s.%s at %s", ghc_cfg_path(cfg), key, ghc_cfg_where(cfg, key));
}

int pardit_cfg_read(ghc_core_t *core, ghc_cfg_t *cfg, struct pardit_cfg *c)
{
    int rc;
    if ((rc = ghc_cfg_get_int(cfg, "dim", 64, 8, 4096, &c->D)) < 0 ||
        (rc = ghc_cfg_get_int(cfg, "heads", 4, 1, 64, &c->H)) < 0 ||
        (rc = ghc_cfg_get_int(cfg, "mlp", 128, 1, 65536, &c->M)) < 0 ||
        (rc = ghc_cfg_get_int(cfg, "blocks", 2, 1, 256, &c->nb)) < 0 ||
        (rc = ghc_cfg_get_int(cfg, "channels", 16, 1, 4096, &c->C)) < 0 ||
        (rc = ghc_cfg_get_int(cfg, "text_dim", 32, 1, 65536, &c->Dt)) < 0 ||
        (rc = ghc_cfg_get_int(cfg, "text_len", 16, 1, 512, &c->Lt)) < 0 ||
        (rc = ghc_cfg_get_int(cfg, "freq_dim", 32, 2, 4096, &c->Ft)) < 0 ||
        (rc = ghc_cfg_get_int(cfg, "spare", 8, 0, 1024, &c->spare)) < 0 ||
        (rc = ghc_cfg_get_int(cfg, "seed", 7, 0, INT64_C(1) << 62, &c->seed)) < 0 ||
        (rc = ghc_cfg_get_int(cfg, "device", -1, -1, 1023, &c->device)) < 0)
        return rc;
    if (c->D % c->H || (c->D / c->H) % 2 || c->D / c->H > 256 || c->Ft % 2)
        return ghc_error_set(core, GHC_ECONFIG, "%s: pardit: dim %lld over %lld heads must give an even head dim of "
                             "at most 256, and freq_dim (%lld) must be even", ghc_cfg_where(cfg, "dim"),
                             (long long)c->D, (long long)c->H, (long long)c->Ft);
    return 0;
}

int32_t pardit_n_targets(const struct pardit_cfg *c) { return (int32_t)(c->nb * SLOTS + 1); }

/* fc1 reads the normed input after qkv's spare columns: its own start at D + spare. */
void pardit_target_shape(const struct pardit_cfg *c, int32_t t, int64_t *out, int64_t *in, int64_t *spare_col)
{
    const int32_t j = t % SLOTS;
    if (t == pardit_n_targets(c) - 1) {   /* text_in */
        *out = c->D;
        *in = *spare_col = c->Dt;
        return;
    }
    *out = j == QKV ? 3 * c->D : j == FC1 ? c->M : c->D;
    *in = j == FC2 ? c->M : c->D;
    *spare_col = j == FC1 ? c->D + c->spare : *in;
}

static int pardit_init(ghc_core_t *core, ghc_cfg_t *cfg, void **self)
{
    struct pardit *m = calloc(1, sizeof(*m));
    if (!m)
        return ghc_error_set(core, GHC_ENOMEM, "pardit: out of memory");
    m->core = core;
    struct pardit_cfg c;
    int rc = pardit_cfg_read(core, cfg, &c);
    if (rc < 0)
        goto fail;
    m->D = c.D, m->H = c.H, m->M = c.M, m->nb = c.nb, m->C = c.C, m->Dt = c.Dt, m->Lt = c.Lt, m->Ft = c.Ft;
    m->spare = c.spare;
    m->device = (int)c.device;
    m->scale = 1.0f / sqrtf((float)(m->D / m->H));
    where(cfg, "channels", m->ch_from, sizeof(m->ch_from));
    where(cfg, "text_dim", m->td_from, sizeof(m->td_from));
    where(cfg, "text_len", m->tl_from, sizeof(m->tl_from));

    /* the targets: the block linears, then text_in */
    const int64_t D = m->D, M = m->M, nm = 3 * m->nb + 2;
    m->n_targets = pardit_n_targets(&c);
    if (!(m->targets = calloc((size_t)m->n_targets, sizeof(*m->targets))) ||
        !(m->names = calloc((size_t)m->n_targets, sizeof(*m->names))) ||
        !(m->blk = calloc((size_t)(m->nb * SLOTS), sizeof(*m->blk)))) {
        rc = ghc_error_set(core, GHC_ENOMEM, "pardit: out of memory");
        goto fail;
    }
    for (int32_t t = 0; t < m->n_targets; t++) {
        const bool text = t == m->n_targets - 1;
        int64_t out, in, spare_col;
        pardit_target_shape(&c, t, &out, &in, &spare_col);
        if (text)
            snprintf(m->names[t], sizeof(m->names[t]), "text_in");
        else
            snprintf(m->names[t], sizeof(m->names[t]), "blocks.%d.%s", (int)(t / SLOTS), slot_name[t % SLOTS]);
        m->targets[t] = (struct ghc_model_target){ .name = m->names[t], .block = text ? -1 : t / SLOTS,
                                                   .in_features = in, .out_features = out };
    }

    /* random weights: N(0, 1/in) but the modulation's (smaller: gates and scales near 0) */
    struct ghc_rng rng = { .seed = (uint64_t)c.seed, .offset = 0 };
    if ((rc = plin_init(m, &m->embed, -1, D, m->C, 0, 1.0f / sqrtf((float)m->C), &rng)) < 0 ||
        (rc = plin_init(m, &m->text_in, m->n_targets - 1, D, m->Dt, m->Dt, 1.0f / sqrtf((float)m->Dt), &rng)) < 0 ||
        (rc = plin_init(m, &m->time_in, -1, D, m->Ft, 0, 1.0f / sqrtf((float)m->Ft), &rng)) < 0 ||
        (rc = plin_init(m, &m->mod, -1, nm * D, D, 0, 0.5f / sqrtf((float)D), &rng)) < 0 ||
        (rc = plin_init(m, &m->head, -1, m->C, D, 0, 1.0f / sqrtf((float)D), &rng)) < 0)
        goto fail;
    int64_t max_weight = 0;
    for (int32_t t = 0; t < m->n_targets - 1; t++) {
        int64_t out, in, spare_col;
        pardit_target_shape(&c, t, &out, &in, &spare_col);
        if ((rc = plin_init(m, &m->blk[t], t, out, in, spare_col, 1.0f / sqrtf((float)in), &rng)) < 0)
            goto fail;
        if (ghc_tensor_numel(m->blk[t].w) > max_weight)
            max_weight = ghc_tensor_numel(m->blk[t].w);
    }
    if (ghc_tensor_numel(m->text_in.w) > max_weight)
        max_weight = ghc_tensor_numel(m->text_in.w);

    /* I_C, made on the host */
    ghc_tensor_t *eye_h = ghc_tensor_init(core, GHC_DTYPE_F32, 2, (const int64_t[]){ m->C, m->C }, GHC_DEVICE_CPU,
                                          GHC_ROLE_WORKSPACE);
    m->eye = tnew(m, &m->wpool, m->device, GHC_ROLE_WEIGHTS, SHAPE(m->C, m->C));
    if (!eye_h || !m->eye) {
        ghc_tensor_free(eye_h);
        rc = fail_code(m);
        goto fail;
    }
    float *e = ghc_tensor_data(eye_h);
    for (int64_t i = 0; i < m->C * m->C; i++)
        e[i] = i % (m->C + 1) == 0 ? 1.0f : 0.0f;
    rc = upload(m, m->eye, eye_h, NULL);
    ghc_tensor_free(eye_h);
    if (rc < 0)
        goto fail;
    if (!(m->lin = ghc_linears_new(core, m->device, GHC_DTYPE_F32, m->n_targets, max_weight))) {
        rc = fail_code(m);
        goto fail;
    }
    ghc_log(core, GHC_LOG_INFO, "pardit: %lld parallel blocks, dim %lld, %lld heads, mlp %lld, %lld channels, text "
            "%lld x %lld, %d targets with %lld spare rows and columns each, on %s", (long long)m->nb, (long long)D,
            (long long)m->H, (long long)M, (long long)m->C, (long long)m->Lt, (long long)m->Dt, (int)m->n_targets,
            (long long)m->spare, m->device == GHC_DEVICE_CPU ? "the CPU" : "a CUDA device");
    *self = m;
    return 0;
fail:
    pardit_free(m);
    return rc;
}

/* ---- registration ------------------------------------------------------------------------ */

static const struct ghc_model_ops pardit_ops = {
    .struct_size = sizeof(struct ghc_model_ops),
    .name = "pardit",
    .keys = pardit_keys,
    .init = pardit_init,
    .experts = pardit_experts,
    .expert_for = pardit_expert_for,
    .targets = pardit_targets,
    .set_hook = pardit_set_hook,
    .forward = pardit_forward,
    .backward = pardit_backward,
    .free = pardit_free,
    .device = pardit_device,
    .target_weight = pardit_target_weight,
    .input_spec = pardit_input_spec,
    .estimate = pardit_estimate,          /* estimate.c */
    .merge_names = pardit_merge_names,
};

static int pardit_plugin_init(ghc_core_t *core) { return ghc_register_model(core, &pardit_ops); }

GHC_PLUGIN_EXPORT const struct ghc_plugin ghc_plugin_pardit = {
    .abi = GHC_PLUGIN_ABI,
    .api = GHC_API_VERSION,
    .struct_size = sizeof(struct ghc_plugin),
    .kinds = GHC_KIND_BIT(GHC_KIND_MODEL),
    .name = "pardit",
    .version = "1.0.0",
    .description = "example: a 2-block parallel DiT over joint video and text tokens, random weights",
    .init = pardit_plugin_init,
};
