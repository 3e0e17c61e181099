/* algo.c: forward and backward of the lycoris adapters in factorised form (doc/lycoris.md,
 * "Computation"), written once on the ops of ops.h so the same code runs on the CPU and on CUDA:
 *   LoRA: H = X A^T, dY = s H B^T; the backward takes H from the forward right before it (the
 *         checkpointed block's recomputation) where kept, else recomputes it; or by
 *         K-concatenation, H and the factors in the model's own GEMMs;
 *   LoHa: the materialised Hadamard product (W1a W1b) * (W2a W2b), recomputed in the
 *         backward, or the Khatri-Rao form below where it is smaller;
 *   LoKr: the reshape trick, never forming kron(W1, W2); dW1 as a batched GEMM over token
 *         chunks followed by a row sum.
 * The input x comes in the model's GEMM dtype (bf16 or f32): small operands are cast to it, the
 * outputs and gradients stay f32. Rank dropout masks output rows of delta-W (as LyCORIS), that is
 * the adapter's output columns in the forward and the rows of G in the backward. Scratch lives
 * in grow-only buffers of the network. */
#include <config.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lycoris_impl.h"

enum { WS_H, WS_CAST_W, WS_MASKED, WS_DH, WS_CAST_X, WS_P1, WS_P2, WS_DW, WS_CHUNK, WS_SUM,
       WS_WB, WS_WC, WS_Z, WS_PT, WS_QT, WS_BT, WS_S, WS_VEC, WS_EYE, WS_M };

#define TRY(x) do { if ((rc = (x)) < 0) goto out; } while (0)

/* ---- scratch and views -------------------------------------------------------------------- */

void lyc_ws_free(struct lycoris *net)
{
    for (int i = 0; i < LYC_WS_SLOTS; i++) {
        ghc_tensor_free(net->ws[i]);
        net->ws[i] = NULL;
    }
    for (int i = 0; i < LYC_HKEEP; i++)
        ghc_tensor_free(net->hk[i].buf);
    memset(net->hk, 0, sizeof(net->hk));
}

/* *buf grown to hold `bytes` when too small (after waiting for the device: queued work may
 * still read the old buffer). false (error set) on failure. */
static bool grow(struct lycoris *net, ghc_tensor_t **buf, size_t bytes)
{
    if (*buf && ghc_tensor_nbytes(*buf) >= bytes)
        return true;
    if (*buf && ghc_op_sync(net->core, net->device, NULL) < 0)
        return false;
    ghc_tensor_free(*buf);
    int64_t want = (int64_t)(bytes + bytes / 4 + 256);
    *buf = ghc_tensor_init(net->core, GHC_DTYPE_U8, 1, &want, net->device, GHC_ROLE_WORKSPACE);
    return *buf != NULL;
}

/* A view of dtype/shape over scratch slot `slot`, grown when too small. The caller frees the view
 * (not the slot). */
static ghc_tensor_t *ws(struct lycoris *net, int slot, enum ghc_dtype dt, int ndim, const int64_t *shape)
{
    int64_t n;
    if (!ghc_shape_numel(ndim, shape, &n)) {
        ghc_error_set(net->core, GHC_EINVAL, "lycoris: scratch shape overflow");
        return NULL;
    }
    if (!grow(net, &net->ws[slot], (size_t)n * ghc_dtype_size(dt)))
        return NULL;
    return ghc_tensor_wrap(net->core, dt, ndim, shape, net->device, ghc_tensor_data(net->ws[slot]));
}

/* ---- H kept from the forward (LoRA) ------------------------------------------------------------
 * The core calls a target's forward with the same X right before its backward (model.h: with
 * checkpointing the block's forward runs again first), so H = X A^T of that forward, kept
 * in one of LYC_HKEEP entries, saves the backward its own pass over X. An entry serves the
 * backward of the same module, X (data and rows) and step (begin_step; A changes only between
 * steps); otherwise the backward computes H. */

/* The entry md's forward writes H of X [n, in] into: md's own, else the oldest; invalid until
 * the forward sets `valid`. NULL (out of memory) after setting the error. */
static struct lyc_hkeep *hkeep_put(struct lycoris *net, const struct lyc_module *md, const ghc_tensor_t *x2, int64_t n)
{
    struct lyc_hkeep *k = NULL, *old = &net->hk[0];
    for (int i = 0; i < LYC_HKEEP && !k; i++) {
        if (net->hk[i].md == md)
            k = &net->hk[i];
        else if (net->hk[i].stamp < old->stamp)
            old = &net->hk[i];
    }
    if (!k)
        k = old;
    k->md = NULL;
    k->valid = false;
    if (!grow(net, &k->buf, (size_t)n * (size_t)md->rank * sizeof(float)))
        return NULL;
    k->md = md;
    k->x = ghc_tensor_cdata(x2);
    k->n = n;
    k->step = net->step;
    k->stamp = ++net->hk_clock;
    return k;
}

/* md's kept H for X [n, in] in this step, or NULL (none kept for that X: the backward computes
 * it, e.g. after more than LYC_HKEEP other forwards). */
static struct lyc_hkeep *hkeep_get(struct lycoris *net, const struct lyc_module *md, const ghc_tensor_t *x2,
                                   int64_t n)
{
    for (int i = 0; i < LYC_HKEEP; i++) {
        struct lyc_hkeep *k = &net->hk[i];
        if (k->md == md && k->valid && k->x == ghc_tensor_cdata(x2) && k->n == n && k->step == net->step)
            return k;
    }
    return NULL;
}

/* A view of t's memory (from element `first` on) with another shape. A column view (x with
 * the model's spare columns, a weight with spare room) keeps its row stride: only its leading
 * dimensions may be regrouped (the same last dimension, first 0). */
static ghc_tensor_t *view(const ghc_tensor_t *t, int64_t first, int ndim, const int64_t *shape)
{
    char *p = (char *)ghc_tensor_cdata(t) + (size_t)first * ghc_dtype_size(ghc_tensor_dtype(t));
    const int64_t rs = ghc_tensor_row_stride(t), last = ghc_tensor_dim(t, -1);
    if (rs == last)
        return ghc_tensor_wrap(ghc_tensor_core(t), ghc_tensor_dtype(t), ndim, shape, ghc_tensor_device(t), p);
    if (first != 0 || ndim < 1 || ndim > 5 || shape[ndim - 1] != last) {
        ghc_error_set(ghc_tensor_core(t), GHC_EINTERNAL, "lycoris: a column view (rows %lld apart) regrouped to "
                      "other columns", (long long)rs);
        return NULL;
    }
    int64_t sh[5];
    memcpy(sh, shape, (size_t)ndim * sizeof(int64_t));
    sh[ndim - 1] = rs;   /* the parent's rows, then the same columns of them */
    ghc_tensor_t *w = ghc_tensor_wrap(ghc_tensor_core(t), ghc_tensor_dtype(t), ndim, sh, ghc_tensor_device(t), p);
    ghc_tensor_t *v = w ? ghc_tensor_view_cols(w, 0, last) : NULL;
    ghc_tensor_free(w);
    return v;
}

#define V2(t, r, c) view((t), 0, 2, (const int64_t[]){ (r), (c) })
#define V3(t, a, b, c) view((t), 0, 3, (const int64_t[]){ (a), (b), (c) })

/* f32 tensor t as dtype dt: a view of t itself, or a cast into scratch `slot`. */
static ghc_tensor_t *as_dtype(struct lycoris *net, int slot, const ghc_tensor_t *t, enum ghc_dtype dt, void *stream)
{
    if (dt == ghc_tensor_dtype(t))
        return view(t, 0, ghc_tensor_ndim(t), ghc_tensor_shape(t));
    ghc_tensor_t *c = ws(net, slot, dt, ghc_tensor_ndim(t), ghc_tensor_shape(t));
    if (c && ghc_op_cast(c, t, 1.0f, NULL, stream) < 0) {
        ghc_tensor_free(c);
        return NULL;
    }
    return c;
}

static int gemm(ghc_tensor_t *c, const ghc_tensor_t *a, const ghc_tensor_t *b, bool ta, bool tb, float alpha,
                float beta, void *stream)
{
    struct ghc_gemm g = { .trans_a = ta, .trans_b = tb, .alpha = alpha, .beta = beta };
    return ghc_op_gemm(c, a, b, &g, stream);
}

static int nomem(struct lycoris *net)
{
    int rc = ghc_error_code(net->core);
    return rc < 0 ? rc : ghc_error_set(net->core, GHC_ENOMEM, "lycoris: out of memory");
}

/* ---- output masking ------------------------------------------------------------------------- */

/* Where the forward writes its delta: y itself (beta 1; 0 when net->overwrite: lyc_forward's write),
 * or with a rank-dropout mask a scratch like y (beta 0) that out_end() masks and adds (or
 * writes). */
static ghc_tensor_t *out_begin(struct lycoris *net, struct lyc_module *md, ghc_tensor_t *y2, float *beta)
{
    *beta = md->mask || net->overwrite ? 0.0f : 1.0f;
    if (!md->mask)
        return view(y2, 0, 2, ghc_tensor_shape(y2));
    return ws(net, WS_MASKED, GHC_DTYPE_F32, 2, ghc_tensor_shape(y2));
}

static int out_end(const struct lycoris *net, struct lyc_module *md, ghc_tensor_t *y2, ghc_tensor_t *d, void *stream)
{
    if (!md->mask)
        return 0;
    if (net->overwrite)
        return ghc_op_mul(y2, d, md->mask, stream);
    int rc = ghc_op_mul(d, d, md->mask, stream);
    return rc < 0 ? rc : ghc_op_add(y2, y2, d, 1.0f, 1.0f, stream);
}

/* G = dy, or dy times the rank-dropout mask (scratch). */
static ghc_tensor_t *grad_in(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *dy2, void *stream)
{
    if (!md->mask)
        return view(dy2, 0, 2, ghc_tensor_shape(dy2));
    ghc_tensor_t *g = ws(net, WS_MASKED, GHC_DTYPE_F32, 2, ghc_tensor_shape(dy2));
    if (g && ghc_op_mul(g, dy2, md->mask, stream) < 0) {
        ghc_tensor_free(g);
        return NULL;
    }
    return g;
}

/* ---- LoRA ------------------------------------------------------------------------------------ */

static int lora_fwd(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *x2, ghc_tensor_t *y2,
                    void *stream)
{
    int64_t N = ghc_tensor_dim(x2, 0);
    float beta;
    int rc = 0;
    ghc_tensor_t *ax = as_dtype(net, WS_CAST_W, md->p[0], ghc_tensor_dtype(x2), stream);
    struct lyc_hkeep *k = hkeep_put(net, md, x2, N);   /* H kept for the backward */
    ghc_tensor_t *h = k ? ghc_tensor_wrap(net->core, GHC_DTYPE_F32, 2, (const int64_t[]){ N, md->rank }, net->device,
                                          ghc_tensor_data(k->buf))
                        : NULL;
    ghc_tensor_t *d = out_begin(net, md, y2, &beta);
    if (!ax || !h || !d) {
        rc = nomem(net);
        goto out;
    }
    TRY(gemm(h, x2, ax, false, true, 1.0f, 0.0f, stream));
    k->valid = true;
    TRY(gemm(d, h, md->p[1], false, true, md->scale, beta, stream));
    TRY(out_end(net, md, y2, d, stream));
out:
    ghc_tensor_free(ax);
    ghc_tensor_free(h);
    ghc_tensor_free(d);
    return rc;
}

/* The LoRA backward: dB += s G^T H, dH = s G B, dX (+)= dH A (beta: 1 adds, 0 writes; dx2 NULL:
 * none), dA += dH^T X, with H = X A^T kept from the forward (hkeep_get) or recomputed. G is dy
 * (f32, times the rank-dropout mask if any), or g: dy in x's dtype (bf16, the operand of the
 * model's own GEMMs), when given and there is no mask: H and dH then in that dtype too (f32
 * accumulation, f32 parameter gradients), which halves the reads of G. */
static int lora_bwd(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *x2, const ghc_tensor_t *dy2,
                    const ghc_tensor_t *g2, ghc_tensor_t *dx2, float dx_beta, void *stream)
{
    int64_t N = ghc_tensor_dim(x2, 0), r = md->rank;
    enum ghc_dtype xdt = ghc_tensor_dtype(x2);
    const bool lp = g2 && !md->mask;
    const enum ghc_dtype hdt = lp ? xdt : GHC_DTYPE_F32;
    int rc = 0;
    ghc_tensor_t *ax = as_dtype(net, WS_CAST_W, md->p[0], xdt, stream);
    ghc_tensor_t *bx = lp ? as_dtype(net, WS_P2, md->p[1], xdt, stream) : view(md->p[1], 0, 2, ghc_tensor_shape(md->p[1]));
    const struct lyc_hkeep *k = hkeep_get(net, md, x2, N);   /* H from the forward, if kept */
    ghc_tensor_t *kh = k ? ghc_tensor_wrap(net->core, GHC_DTYPE_F32, 2, (const int64_t[]){ N, r }, net->device,
                                           ghc_tensor_data(k->buf))
                         : NULL;
    ghc_tensor_t *h = k && hdt == GHC_DTYPE_F32 ? kh : ws(net, WS_H, hdt, 2, (const int64_t[]){ N, r });
    ghc_tensor_t *dh = ws(net, WS_DH, hdt, 2, (const int64_t[]){ N, r });
    ghc_tensor_t *g = lp ? view(g2, 0, 2, ghc_tensor_shape(g2)) : grad_in(net, md, dy2, stream), *dhx = NULL;
    if (!ax || !bx || !h || !dh || !g || (k && !kh)) {
        rc = nomem(net);
        goto out;
    }
    if (k) {   /* H = X A^T */
        net->hk_hits++;
        if (h != kh)
            TRY(ghc_op_cast(h, kh, 1.0f, NULL, stream));
    } else {
        TRY(gemm(h, x2, ax, false, true, 1.0f, 0.0f, stream));
    }
    TRY(gemm(md->g[1], g, h, true, false, md->scale, 1.0f, stream));       /* dB += s G^T H */
    TRY(gemm(dh, g, bx, false, false, md->scale, 0.0f, stream));           /* dH = s G B */
    if (!(dhx = as_dtype(net, WS_CAST_X, dh, xdt, stream))) {
        rc = nomem(net);
        goto out;
    }
    if (dx2)                                                               /* dX (+)= dH A */
        TRY(lp ? gemm(dx2, dhx, ax, false, false, 1.0f, dx_beta, stream)
               : gemm(dx2, dh, md->p[0], false, false, 1.0f, dx_beta, stream));
    TRY(gemm(md->g[0], dhx, x2, true, false, 1.0f, 1.0f, stream));         /* dA += dH^T X */
out:
    ghc_tensor_free(ax);
    ghc_tensor_free(bx);
    if (h != kh)
        ghc_tensor_free(h);
    ghc_tensor_free(kh);
    ghc_tensor_free(dh);
    ghc_tensor_free(g);
    ghc_tensor_free(dhx);
    return rc;
}

/* ---- LoHa ------------------------------------------------------------------------------------ */

/* P1 = W1a W1b, P2 = W2a W2b, DW = P1 * P2 (each [out, in] f32 scratch). */
static int loha_build(struct lycoris *net, struct lyc_module *md, ghc_tensor_t **p1, ghc_tensor_t **p2,
                      ghc_tensor_t **dw, void *stream)
{
    const int64_t shape[2] = { md->out, md->in };
    *p1 = ws(net, WS_P1, GHC_DTYPE_F32, 2, shape);
    *p2 = ws(net, WS_P2, GHC_DTYPE_F32, 2, shape);
    *dw = ws(net, WS_DW, GHC_DTYPE_F32, 2, shape);
    if (!*p1 || !*p2 || !*dw)
        return nomem(net);
    int rc = gemm(*p1, md->p[0], md->p[1], false, false, 1.0f, 0.0f, stream);
    if (rc == 0)
        rc = gemm(*p2, md->p[2], md->p[3], false, false, 1.0f, 0.0f, stream);
    if (rc == 0)
        rc = ghc_op_mul(*dw, *p1, *p2, stream);
    return rc;
}

static int loha_fwd(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *x2, ghc_tensor_t *y2,
                    void *stream)
{
    ghc_tensor_t *p1 = NULL, *p2 = NULL, *dw = NULL, *dwx = NULL, *d = NULL;
    float beta;
    int rc;
    TRY(loha_build(net, md, &p1, &p2, &dw, stream));
    if (!(dwx = as_dtype(net, WS_CAST_W, dw, ghc_tensor_dtype(x2), stream)) || !(d = out_begin(net, md, y2, &beta))) {
        rc = nomem(net);
        goto out;
    }
    TRY(gemm(d, x2, dwx, false, true, md->scale, beta, stream));
    TRY(out_end(net, md, y2, d, stream));
out:
    ghc_tensor_free(p1);
    ghc_tensor_free(p2);
    ghc_tensor_free(dw);
    ghc_tensor_free(dwx);
    ghc_tensor_free(d);
    return rc;
}

static int loha_bwd(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *x2, const ghc_tensor_t *dy2,
                    ghc_tensor_t *dx2, void *stream)
{
    const int64_t shape[2] = { md->out, md->in };
    ghc_tensor_t *p1 = NULL, *p2 = NULL, *dw = NULL, *g = NULL, *gx = NULL, *D = NULL, *T = NULL;
    int rc;
    TRY(loha_build(net, md, &p1, &p2, &dw, stream));
    if (!(g = grad_in(net, md, dy2, stream)) || !(gx = as_dtype(net, WS_CAST_X, g, ghc_tensor_dtype(x2), stream)) ||
        !(D = ws(net, WS_H, GHC_DTYPE_F32, 2, shape)) || !(T = ws(net, WS_DH, GHC_DTYPE_F32, 2, shape))) {
        rc = nomem(net);
        goto out;
    }
    TRY(gemm(D, gx, x2, true, false, md->scale, 0.0f, stream));            /* D = s G^T X */
    TRY(ghc_op_mul(T, D, p2, stream));                                     /* T1 = D * P2 */
    TRY(gemm(md->g[0], T, md->p[1], false, true, 1.0f, 1.0f, stream));     /* dW1a += T1 W1b^T */
    TRY(gemm(md->g[1], md->p[0], T, true, false, 1.0f, 1.0f, stream));     /* dW1b += W1a^T T1 */
    TRY(ghc_op_mul(T, D, p1, stream));                                     /* T2 = D * P1 */
    TRY(gemm(md->g[2], T, md->p[3], false, true, 1.0f, 1.0f, stream));
    TRY(gemm(md->g[3], md->p[2], T, true, false, 1.0f, 1.0f, stream));
    if (dx2)
        TRY(gemm(dx2, g, dw, false, false, md->scale, 1.0f, stream));      /* dX += s G DW */
out:
    ghc_tensor_free(p1);
    ghc_tensor_free(p2);
    ghc_tensor_free(dw);
    ghc_tensor_free(g);
    ghc_tensor_free(gx);
    ghc_tensor_free(D);
    ghc_tensor_free(T);
    return rc;
}

/* LoHa in Khatri-Rao form, where r^2 (in + out) < in out: the same delta-W, exactly, as Ua Ub with
 * Ua[o, (i, j)] = W1a[o, i] W2a[o, j] [out, r^2] and Ub[(i, j), c] = W1b[i, c] W2b[j, c]
 * [r^2, in], so the adapter runs as a LoRA of rank r^2 (no [out, in] product); the factors'
 * gradients are scattered back from dUa and dUb. */
static bool loha_kr(const struct lyc_module *md)
{
    int64_t r2 = (int64_t)md->rank * md->rank;
    return r2 * (md->in + md->out) < md->in * md->out;
}

static int loha_kr_build(struct lycoris *net, struct lyc_module *md, ghc_tensor_t **ua, ghc_tensor_t **ub,
                         void *stream)
{
    const int64_t r = md->rank, in = md->in, out = md->out;
    ghc_tensor_t *ua3 = NULL, *a3 = NULL, *b3 = NULL, *ub2 = NULL, *ub3 = NULL, *w2f = NULL;
    int rc;
    *ua = ws(net, WS_P1, GHC_DTYPE_F32, 2, (const int64_t[]){ out, r * r });
    *ub = ws(net, WS_P2, GHC_DTYPE_F32, 2, (const int64_t[]){ r * r, in });
    if (!*ua || !*ub || !(ua3 = V3(*ua, out, r, r)) || !(a3 = V3(md->p[0], out, r, 1)) ||
        !(b3 = V3(md->p[2], out, 1, r)) || !(ub2 = V2(*ub, r, r * in)) || !(ub3 = V3(*ub, r, r, in)) ||
        !(w2f = view(md->p[3], 0, 1, (const int64_t[]){ r * in }))) {
        rc = nomem(net);
        goto out;
    }
    TRY(gemm(ua3, a3, b3, false, false, 1.0f, 0.0f, stream));             /* Ua[o] = W1a[o]^T W2a[o] */
    TRY(ghc_op_fill(*ub, 0.0, stream));
    TRY(ghc_op_add(ub2, ub2, w2f, 0.0f, 1.0f, stream));                    /* Ub[i, (j, c)] = W2b[j, c] */
    TRY(ghc_op_mul(ub3, ub3, md->p[1], stream));                           /*   times W1b[i, c] */
out:
    ghc_tensor_free(ua3);
    ghc_tensor_free(a3);
    ghc_tensor_free(b3);
    ghc_tensor_free(ub2);
    ghc_tensor_free(ub3);
    ghc_tensor_free(w2f);
    return rc;
}

static int loha_kr_fwd(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *x2, ghc_tensor_t *y2,
                       void *stream)
{
    const int64_t N = ghc_tensor_dim(x2, 0), r2 = (int64_t)md->rank * md->rank;
    ghc_tensor_t *ua = NULL, *ub = NULL, *ubx = NULL, *h = NULL, *d = NULL;
    float beta;
    int rc;
    TRY(loha_kr_build(net, md, &ua, &ub, stream));
    if (!(ubx = as_dtype(net, WS_CAST_W, ub, ghc_tensor_dtype(x2), stream)) ||
        !(h = ws(net, WS_H, GHC_DTYPE_F32, 2, (const int64_t[]){ N, r2 })) || !(d = out_begin(net, md, y2, &beta))) {
        rc = nomem(net);
        goto out;
    }
    TRY(gemm(h, x2, ubx, false, true, 1.0f, 0.0f, stream));                /* H = X Ub^T */
    TRY(gemm(d, h, ua, false, true, md->scale, beta, stream));             /* dY = s H Ua^T */
    TRY(out_end(net, md, y2, d, stream));
out:
    ghc_tensor_free(ua);
    ghc_tensor_free(ub);
    ghc_tensor_free(ubx);
    ghc_tensor_free(h);
    ghc_tensor_free(d);
    return rc;
}

static int loha_kr_bwd(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *x2, const ghc_tensor_t *dy2,
                       ghc_tensor_t *dx2, void *stream)
{
    const int64_t N = ghc_tensor_dim(x2, 0), r = md->rank, r2 = r * r, in = md->in, out = md->out;
    const enum ghc_dtype xdt = ghc_tensor_dtype(x2);
    ghc_tensor_t *ua = NULL, *ub = NULL, *ubx = NULL, *h = NULL, *dh = NULL, *dhx = NULL, *g = NULL;
    ghc_tensor_t *dua = NULL, *dub = NULL, *t = NULL, *ones = NULL;
    ghc_tensor_t *v[12] = { 0 };   /* views */
    int rc;
    TRY(loha_kr_build(net, md, &ua, &ub, stream));
    if (!(ubx = as_dtype(net, WS_CAST_W, ub, xdt, stream)) || !(g = grad_in(net, md, dy2, stream)) ||
        !(h = ws(net, WS_H, GHC_DTYPE_F32, 2, (const int64_t[]){ N, r2 })) ||
        !(dh = ws(net, WS_DH, GHC_DTYPE_F32, 2, (const int64_t[]){ N, r2 })) ||
        !(dua = ws(net, WS_DW, GHC_DTYPE_F32, 2, (const int64_t[]){ out, r2 })) ||
        !(dub = ws(net, WS_Z, GHC_DTYPE_F32, 2, (const int64_t[]){ r2, in })) ||
        !(t = ws(net, WS_PT, GHC_DTYPE_F32, 2, (const int64_t[]){ r, r * in })) ||
        !(ones = ws(net, WS_EYE, GHC_DTYPE_F32, 2, (const int64_t[]){ 1, r }))) {
        rc = nomem(net);
        goto out;
    }
    TRY(gemm(h, x2, ubx, false, true, 1.0f, 0.0f, stream));                /* H = X Ub^T */
    TRY(gemm(dua, g, h, true, false, md->scale, 0.0f, stream));            /* dUa = s G^T H */
    TRY(gemm(dh, g, ua, false, false, md->scale, 0.0f, stream));           /* dH = s G Ua */
    if (dx2)
        TRY(gemm(dx2, dh, ub, false, false, 1.0f, 1.0f, stream));          /* dX += dH Ub */
    if (!(dhx = as_dtype(net, WS_CAST_X, dh, xdt, stream))) {
        rc = nomem(net);
        goto out;
    }
    TRY(gemm(dub, dhx, x2, true, false, 1.0f, 0.0f, stream));              /* dUb = dH^T X */
    TRY(ghc_op_fill(ones, 1.0, stream));
    /* dW1a[o, i] += sum_j dUa[o, i, j] W2a[o, j];  dW2a[o, j] += sum_i dUa[o, i, j] W1a[o, i] */
    if (!(v[0] = V3(dua, out, r, r)) || !(v[1] = V3(md->p[2], out, r, 1)) || !(v[2] = V3(md->g[0], out, r, 1)) ||
        !(v[3] = V3(md->p[0], out, r, 1)) || !(v[4] = V3(md->g[2], out, r, 1)) || !(v[5] = V2(dub, r, r * in)) ||
        !(v[6] = view(md->p[3], 0, 1, (const int64_t[]){ r * in })) || !(v[7] = V3(t, r, r, in)) ||
        !(v[8] = V3(md->g[1], r, 1, in)) || !(v[9] = V3(dub, r, r, in)) || !(v[10] = V2(md->g[3], 1, r * in))) {
        rc = nomem(net);
        goto out;
    }
    TRY(gemm(v[2], v[0], v[1], false, false, 1.0f, 1.0f, stream));
    TRY(gemm(v[4], v[0], v[3], true, false, 1.0f, 1.0f, stream));
    /* dW1b[i, c] += sum_j dUb[i, j, c] W2b[j, c] */
    TRY(ghc_op_mul(t, v[5], v[6], stream));
    TRY(gemm(v[8], ones, v[7], false, false, 1.0f, 1.0f, stream));
    /* dW2b[j, c] += sum_i dUb[i, j, c] W1b[i, c] */
    TRY(ghc_op_mul(v[7], v[9], md->p[1], stream));
    TRY(gemm(v[10], ones, t, false, false, 1.0f, 1.0f, stream));
out:
    for (int k = 0; k < 12; k++)
        ghc_tensor_free(v[k]);
    ghc_tensor_t *all[] = { ua, ub, ubx, h, dh, dhx, g, dua, dub, t, ones };
    for (size_t k = 0; k < sizeof(all) / sizeof(all[0]); k++)
        ghc_tensor_free(all[k]);
    return rc;
}

/* ---- LoKr ------------------------------------------------------------------------------------ */

/* W1 [a, c] and W2 [b, d]: the parameters, or the products of their low-rank halves. */
static int lokr_factors(struct lycoris *net, struct lyc_module *md, ghc_tensor_t **w1, ghc_tensor_t **w2,
                        void *stream)
{
    int rc = 0;
    *w1 = md->w1_lr ? ws(net, WS_P1, GHC_DTYPE_F32, 2, (const int64_t[]){ md->a, md->c }) : V2(md->p[0], md->a, md->c);
    *w2 = md->w2_lr ? ws(net, WS_P2, GHC_DTYPE_F32, 2, (const int64_t[]){ md->b, md->d }) : V2(md->p[2], md->b, md->d);
    if (!*w1 || !*w2)
        return nomem(net);
    if (md->w1_lr)
        rc = gemm(*w1, md->p[0], md->p[1], false, false, 1.0f, 0.0f, stream);
    if (rc == 0 && md->w2_lr)
        rc = gemm(*w2, md->p[2], md->p[3], false, false, 1.0f, 0.0f, stream);
    return rc;
}

/* T [N c, b] = X[N c, d] W2^T (in scratch WS_H); *w2x: W2 in x's dtype. */
static ghc_tensor_t *lokr_t(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *xr, const ghc_tensor_t *w2,
                            void *stream)
{
    ghc_tensor_t *w2x = as_dtype(net, WS_CAST_W, w2, ghc_tensor_dtype(xr), stream);
    ghc_tensor_t *t = ws(net, WS_H, GHC_DTYPE_F32, 2, (const int64_t[]){ ghc_tensor_dim(xr, 0), md->b });
    if (!w2x || !t || gemm(t, xr, w2x, false, true, 1.0f, 0.0f, stream) < 0) {
        ghc_tensor_free(t);
        t = NULL;
    }
    ghc_tensor_free(w2x);
    return t;
}

static int lokr_fwd(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *x2, ghc_tensor_t *y2,
                    void *stream)
{
    int64_t N = ghc_tensor_dim(x2, 0);
    ghc_tensor_t *w1 = NULL, *w2 = NULL, *xr = NULL, *t = NULL, *t3 = NULL, *d = NULL, *d3 = NULL;
    float beta;
    int rc;
    TRY(lokr_factors(net, md, &w1, &w2, stream));
    if (!(xr = V2(x2, N * md->c, md->d)) || !(t = lokr_t(net, md, xr, w2, stream)) ||
        !(t3 = V3(t, N, md->c, md->b)) || !(d = out_begin(net, md, y2, &beta)) || !(d3 = V3(d, N, md->a, md->b))) {
        rc = nomem(net);
        goto out;
    }
    TRY(gemm(d3, w1, t3, false, false, md->scale, beta, stream));           /* Y~_n += s W1 T_n */
    TRY(out_end(net, md, y2, d, stream));
out:
    ghc_tensor_free(w1);
    ghc_tensor_free(w2);
    ghc_tensor_free(xr);
    ghc_tensor_free(t);
    ghc_tensor_free(t3);
    ghc_tensor_free(d);
    ghc_tensor_free(d3);
    return rc;
}

/* dst += the sum over tokens of s G_n T_n^T ([a, c]), in chunks of tokens so the batched
 * product [chunk, a, c] stays within 64 MiB. */
static int lokr_dw1(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *g, const ghc_tensor_t *t,
                    ghc_tensor_t *dst, float beta, void *stream)
{
    int64_t N = ghc_tensor_numel(g) / md->out, ac = md->a * md->c;
    int64_t K = (64ll << 20) / (4 * ac);
    int rc = 0;
    K = K < 1 ? 1 : K > N ? N : K;
    ghc_tensor_t *sum = ws(net, WS_SUM, GHC_DTYPE_F32, 1, &ac), *sum2 = NULL;
    if (!sum || !(sum2 = V2(sum, md->a, md->c)))
        rc = nomem(net);
    for (int64_t n0 = 0; n0 < N && rc == 0; n0 += K) {
        int64_t k = N - n0 < K ? N - n0 : K;
        ghc_tensor_t *gc = view(g, n0 * md->out, 3, (const int64_t[]){ k, md->a, md->b });
        ghc_tensor_t *tc = view(t, n0 * md->c * md->b, 3, (const int64_t[]){ k, md->c, md->b });
        ghc_tensor_t *cc = ws(net, WS_CHUNK, GHC_DTYPE_F32, 3, (const int64_t[]){ k, md->a, md->c });
        ghc_tensor_t *cr = cc ? V2(cc, k, ac) : NULL;
        if (!gc || !tc || !cr)
            rc = nomem(net);
        if (rc == 0)
            rc = gemm(cc, gc, tc, false, true, md->scale, 0.0f, stream);
        if (rc == 0)
            rc = ghc_op_sum_rows(sum, cr, stream);
        if (rc == 0)
            rc = ghc_op_add(dst, dst, sum2, n0 == 0 ? beta : 1.0f, 1.0f, stream);
        ghc_tensor_free(gc);
        ghc_tensor_free(tc);
        ghc_tensor_free(cc);
        ghc_tensor_free(cr);
    }
    ghc_tensor_free(sum);
    ghc_tensor_free(sum2);
    return rc;
}

/* Gradients of the low-rank halves from the full factor's gradient df: da += df hb^T,
 * db += ha^T df. */
static int lowrank_grads(struct lyc_module *md, int ia, const ghc_tensor_t *df, void *stream)
{
    int rc = gemm(md->g[ia], df, md->p[ia + 1], false, true, 1.0f, 1.0f, stream);
    return rc < 0 ? rc : gemm(md->g[ia + 1], md->p[ia], df, true, false, 1.0f, 1.0f, stream);
}

static int lokr_bwd(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *x2, const ghc_tensor_t *dy2,
                    ghc_tensor_t *dx2, void *stream)
{
    int64_t N = ghc_tensor_dim(x2, 0), Nc = N * md->c;
    ghc_tensor_t *w1 = NULL, *w2 = NULL, *xr = NULL, *t = NULL, *g = NULL, *g3 = NULL, *u = NULL, *u3 = NULL;
    ghc_tensor_t *ux = NULL, *dxr = NULL, *df = NULL;
    int rc;
    TRY(lokr_factors(net, md, &w1, &w2, stream));
    if (!(xr = V2(x2, Nc, md->d)) || !(t = lokr_t(net, md, xr, w2, stream)) || !(g = grad_in(net, md, dy2, stream)) ||
        !(g3 = V3(g, N, md->a, md->b)) || !(u = ws(net, WS_DH, GHC_DTYPE_F32, 2, (const int64_t[]){ Nc, md->b })) ||
        !(u3 = V3(u, N, md->c, md->b))) {
        rc = nomem(net);
        goto out;
    }
    TRY(gemm(u3, w1, g3, true, false, md->scale, 0.0f, stream));            /* U_n = s W1^T G_n */
    if (dx2) {
        if (!(dxr = V2(dx2, Nc, md->d))) {
            rc = nomem(net);
            goto out;
        }
        TRY(gemm(dxr, u, w2, false, false, 1.0f, 1.0f, stream));            /* dX += U W2 */
    }
    if (!(ux = as_dtype(net, WS_CAST_X, u, ghc_tensor_dtype(x2), stream))) {
        rc = nomem(net);
        goto out;
    }
    if (md->w2_lr) {
        if (!(df = ws(net, WS_DW, GHC_DTYPE_F32, 2, (const int64_t[]){ md->b, md->d }))) {
            rc = nomem(net);
            goto out;
        }
        TRY(gemm(df, ux, xr, true, false, 1.0f, 0.0f, stream));             /* dW2 = U^T X */
        TRY(lowrank_grads(md, 2, df, stream));
        ghc_tensor_free(df);
        df = NULL;
    } else {
        TRY(gemm(md->g[2], ux, xr, true, false, 1.0f, 1.0f, stream));
    }
    if (md->w1_lr) {
        if (!(df = ws(net, WS_DW, GHC_DTYPE_F32, 2, (const int64_t[]){ md->a, md->c }))) {
            rc = nomem(net);
            goto out;
        }
        TRY(lokr_dw1(net, md, g, t, df, 0.0f, stream));                     /* dW1 = s sum G_n T_n^T */
        TRY(lowrank_grads(md, 0, df, stream));
    } else {
        TRY(lokr_dw1(net, md, g, t, md->g[0], 1.0f, stream));
    }
out:
    ghc_tensor_free(w1);
    ghc_tensor_free(w2);
    ghc_tensor_free(xr);
    ghc_tensor_free(t);
    ghc_tensor_free(g);
    ghc_tensor_free(g3);
    ghc_tensor_free(u);
    ghc_tensor_free(u3);
    ghc_tensor_free(ux);
    ghc_tensor_free(dxr);
    ghc_tensor_free(df);
    return rc;
}


/* ---- DoRA (LoRA, output axis, the norm not detached as in LyCORIS; no [out, in] delta) ------
 * The hook's y already holds Y0 + b = X W^T + b and dx the frozen G W, so
 *   forward:  y = c (y + s H B^T) + (1 - c) b         (= c Z + b, Z = X W'^T)
 *   backward: dx += (G (c - 1)) W + dH A,  dH = s (G c) B
 * with q_o^2 = |W_o|^2 + s B_o (P + Q)_o^T, P = W A^T, Q = P + s B S, S = A A^T, n = q + eps,
 * c = g / n (m = 1 in training), rho = colsum(G * Z), dg = rho / n, beta = -g rho / (n^2 q),
 *   dB += s (Gc^T H + diag(beta) Q),  dA += dH^T X + s (diag(beta) B)^T W + s^2 (diag(beta) B)^T B A.
 * Only [out]-vectors go through the host (sqrt and division); everything else is ops. */

#define DORA_EPS 1.1920929e-07

ghc_tensor_t *lyc_base_weight(struct lycoris *net, struct lyc_module *md, enum ghc_dtype dt, void *stream)
{
    const ghc_tensor_t *w, *b;
    float sc;
    const int64_t shape[2] = { md->out, md->in };
    if (!net->model) {
        ghc_error_set(net->core, GHC_EINVAL, "lycoris: %s: DoRA needs the run's model (its frozen weights)", md->name);
        return NULL;
    }
    if (ghc_model_target_weight(net->model, md->expert, md->target, &w, &sc, &b) < 0)
        return NULL;
    if (ghc_tensor_numel(w) != md->out * md->in) {
        ghc_error_set(net->core, GHC_EINVAL, "lycoris: %s: the model's weight has %lld elements, expected %lld x %lld",
                      md->name, (long long)ghc_tensor_numel(w), (long long)md->out, (long long)md->in);
        return NULL;
    }
    ghc_tensor_t *src = NULL, *c = NULL;
    if (ghc_tensor_device(w) != net->device || ghc_tensor_row_stride(w) != md->in) {
        /* resident elsewhere, or a view of storage with spare room: a dense copy first */
        if (!(src = ws(net, WS_WB, ghc_tensor_dtype(w), 2, shape)) || ghc_op_copy(src, w, stream) < 0)
            goto fail;
    } else {
        src = view(w, 0, 2, shape);
    }
    if (ghc_tensor_dtype(w) == dt && sc == 1.0f)
        return src;
    if (!(c = ws(net, WS_WC, dt, 2, shape)) || ghc_op_cast(c, src, sc, NULL, stream) < 0)
        goto fail;
    ghc_tensor_free(src);
    return c;
fail:
    nomem(net);
    ghc_tensor_free(src);
    ghc_tensor_free(c);
    return NULL;
}

/* Host scratch of n floats. */
static float *hbuf(struct lycoris *net, size_t n)
{
    if (net->hbuf_len < n) {
        float *p = realloc(net->hbuf, n * sizeof(float));
        if (!p)
            return NULL;
        net->hbuf = p;
        net->hbuf_len = n;
    }
    return net->hbuf;
}

/* Device f32 t (n elements) into host v, waiting for the device. */
static int download(struct lycoris *net, const ghc_tensor_t *t, float *v, void *stream)
{
    int64_t n = ghc_tensor_numel(t);
    ghc_tensor_t *h = ghc_tensor_wrap(net->core, GHC_DTYPE_F32, 1, &n, GHC_DEVICE_CPU, v);
    ghc_tensor_t *d = view(t, 0, 1, &n);
    int rc = h && d ? ghc_op_copy(h, d, stream) : nomem(net);
    if (rc == 0)
        rc = ghc_op_sync(net->core, net->device, stream);
    ghc_tensor_free(h);
    ghc_tensor_free(d);
    return rc;
}

/* Host v (rows x n) into a new view of scratch WS_VEC [rows, n] (waits: v is reused). */
static ghc_tensor_t *upload(struct lycoris *net, const float *v, int64_t rows, int64_t n, void *stream)
{
    const int64_t shape[2] = { rows, n };
    ghc_tensor_t *h = ghc_tensor_wrap(net->core, GHC_DTYPE_F32, 2, shape, GHC_DEVICE_CPU, (void *)v);
    ghc_tensor_t *d = ws(net, WS_VEC, GHC_DTYPE_F32, 2, shape);
    if (!h || !d || ghc_op_copy(d, h, stream) < 0 || ghc_op_sync(net->core, net->device, stream) < 0) {
        nomem(net);
        ghc_tensor_free(d);
        d = NULL;
    }
    ghc_tensor_free(h);
    return d;
}

int lyc_dora_init(struct lycoris *net, struct lyc_module *md)
{
    const ghc_tensor_t *w, *b;
    float sc;
    int rc = 0;
    ghc_tensor_t *wf = lyc_base_weight(net, md, GHC_DTYPE_F32, NULL);
    float *hw = malloc((size_t)(md->out * md->in) * sizeof(float));
    free(md->wn2);
    free(md->bias);
    md->bias = NULL;
    md->wn2 = malloc((size_t)md->out * sizeof(float));
    if (!wf || !hw || !md->wn2) {
        rc = nomem(net);
        goto out;
    }
    if ((rc = download(net, wf, hw, NULL)) < 0)
        goto out;
    for (int64_t o = 0; o < md->out; o++) {
        double acc = 0;
        for (int64_t i = 0; i < md->in; i++)
            acc += (double)hw[o * md->in + i] * hw[o * md->in + i];
        md->wn2[o] = (float)acc;
        hw[o] = (float)sqrt(acc);   /* g = |W[o, :]| (hw's first row is consumed already) */
    }
    ghc_tensor_t *g = upload(net, hw, md->out, 1, NULL);
    if (!g || (rc = ghc_op_copy(md->p[2], g, NULL)) < 0 || (rc = ghc_op_sync(net->core, net->device, NULL)) < 0) {
        rc = rc < 0 ? rc : nomem(net);
        ghc_tensor_free(g);
        goto out;
    }
    ghc_tensor_free(g);
    if ((rc = ghc_model_target_weight(net->model, md->expert, md->target, &w, &sc, &b)) < 0)
        goto out;
    if (b) {
        ghc_tensor_t *bf = NULL;
        if (!(md->bias = malloc((size_t)md->out * sizeof(float))) ||
            !(bf = ghc_tensor_init(net->core, GHC_DTYPE_F32, 1, (const int64_t[]){ md->out }, GHC_DEVICE_CPU,
                                   GHC_ROLE_WORKSPACE))) {
            rc = nomem(net);
            goto out;
        }
        ghc_tensor_t *bh = ghc_tensor_init(net->core, ghc_tensor_dtype(b), 1, (const int64_t[]){ md->out },
                                           GHC_DEVICE_CPU, GHC_ROLE_WORKSPACE);
        if (!bh || (rc = ghc_op_copy(bh, b, NULL)) < 0 || (rc = ghc_op_sync(net->core, ghc_tensor_device(b), NULL)) < 0 ||
            (rc = ghc_op_cast(bf, bh, 1.0f, NULL, NULL)) < 0)
            rc = rc < 0 ? rc : nomem(net);
        else
            memcpy(md->bias, ghc_tensor_cdata(bf), (size_t)md->out * sizeof(float));
        ghc_tensor_free(bh);
        ghc_tensor_free(bf);
    }
out:
    ghc_tensor_free(wf);
    free(hw);
    return rc;
}

/* The per-call DoRA quantities from the current A, B, g and W (wx: W in x's dtype):
 * *qt = Q^T [r, out], *bt = B^T [r, out] (device scratch, caller frees), and on the host
 * v[0..out) = g, v[out..2out) = n, v[2out..3out) = q, v[3out..4out) = c. */
static int dora_coef(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *wx, ghc_tensor_t **qt,
                     ghc_tensor_t **bt, float *v, void *stream)
{
    int64_t r = md->rank, out = md->out;
    float s = md->scale;
    int rc = 0;
    ghc_tensor_t *aw = as_dtype(net, WS_CAST_W, md->p[0], ghc_tensor_dtype(wx), stream);
    ghc_tensor_t *pt = ws(net, WS_PT, GHC_DTYPE_F32, 2, (const int64_t[]){ r, out });
    ghc_tensor_t *S = ws(net, WS_S, GHC_DTYPE_F32, 2, (const int64_t[]){ r, r });
    ghc_tensor_t *eye = ws(net, WS_EYE, GHC_DTYPE_F32, 2, (const int64_t[]){ r, r });
    ghc_tensor_t *hi = ghc_tensor_init(net->core, GHC_DTYPE_F32, 2, (const int64_t[]){ r, r }, GHC_DEVICE_CPU,
                                       GHC_ROLE_WORKSPACE);
    ghc_tensor_t *e = NULL;
    *qt = ws(net, WS_QT, GHC_DTYPE_F32, 2, (const int64_t[]){ r, out });
    *bt = ws(net, WS_BT, GHC_DTYPE_F32, 2, (const int64_t[]){ r, out });
    if (!aw || !pt || !S || !eye || !hi || !*qt || !*bt || !(e = ws(net, WS_M, GHC_DTYPE_F32, 1, &out))) {
        rc = nomem(net);
        goto out;
    }
    float *iv = ghc_tensor_data(hi);
    for (int64_t k = 0; k < r * r; k++)
        iv[k] = k % (r + 1) == 0;
    TRY(ghc_op_copy(eye, hi, stream));
    TRY(gemm(pt, aw, wx, false, true, 1.0f, 0.0f, stream));             /* P^T = A W^T */
    TRY(gemm(S, md->p[0], md->p[0], false, true, 1.0f, 0.0f, stream));  /* S = A A^T */
    TRY(ghc_op_copy(*qt, pt, stream));
    TRY(gemm(*qt, S, md->p[1], false, true, s, 1.0f, stream));          /* Q^T = P^T + s S B^T */
    TRY(gemm(*bt, eye, md->p[1], false, true, 1.0f, 0.0f, stream));     /* B^T */
    TRY(ghc_op_add(pt, pt, *qt, 1.0f, 1.0f, stream));                    /* (P + Q)^T */
    TRY(ghc_op_mul(pt, pt, *bt, stream));
    TRY(ghc_op_sum_rows(e, pt, stream));                                 /* e_o = B_o (P + Q)_o^T */
    TRY(download(net, e, v + 2 * out, stream));
    TRY(download(net, md->p[2], v, stream));
    for (int64_t o = 0; o < out; o++) {
        double q2 = (double)md->wn2[o] + (double)s * v[2 * out + o], q = q2 > 0 ? sqrt(q2) : 0.0;
        v[out + o] = (float)(q + DORA_EPS);
        v[2 * out + o] = (float)q;
        v[3 * out + o] = (float)(v[o] / (q + DORA_EPS));
    }
out:
    ghc_tensor_free(aw);
    ghc_tensor_free(pt);
    ghc_tensor_free(S);
    ghc_tensor_free(eye);
    ghc_tensor_free(hi);
    ghc_tensor_free(e);
    return rc;
}

int lyc_dora_file_scale(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *a, const ghc_tensor_t *b,
                        float *g, bool to_file)
{
    int64_t out = md->out;
    struct lyc_module t = *md;   /* the same module with the file's factors */
    ghc_tensor_t *wf = NULL, *qt = NULL, *bt = NULL;
    float *v = malloc((size_t)(4 * out) * sizeof(float));
    int rc = 0;
    t.p[0] = (ghc_tensor_t *)a;
    t.p[1] = (ghc_tensor_t *)b;
    if (!v || !md->wn2 || !(wf = lyc_base_weight(net, md, GHC_DTYPE_F32, NULL))) {
        rc = ghc_error_code(net->core) ? ghc_error_code(net->core) : nomem(net);
        goto out;
    }
    TRY(dora_coef(net, &t, wf, &qt, &bt, v, NULL));
    for (int64_t o = 0; o < out; o++) {
        double nw = sqrt((double)md->wn2[o]) + DORA_EPS, nq = (double)v[2 * out + o] + DORA_EPS;
        g[o] = (float)(to_file ? (double)g[o] * nw / nq : (double)g[o] * nq / nw);
    }
out:
    ghc_tensor_free(wf);
    ghc_tensor_free(qt);
    ghc_tensor_free(bt);
    free(v);
    return rc;
}

static int dora_fwd(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *x2, ghc_tensor_t *y2,
                    void *stream)
{
    int64_t N = ghc_tensor_dim(x2, 0), out = md->out;
    int rc = 0;
    float *v = hbuf(net, (size_t)(6 * out));
    ghc_tensor_t *wx = lyc_base_weight(net, md, ghc_tensor_dtype(x2), stream);
    ghc_tensor_t *ax = as_dtype(net, WS_CAST_X, md->p[0], ghc_tensor_dtype(x2), stream);
    ghc_tensor_t *h = ws(net, WS_H, GHC_DTYPE_F32, 2, (const int64_t[]){ N, md->rank });
    ghc_tensor_t *qt = NULL, *bt = NULL, *vec = NULL, *c = NULL, *cb = NULL;
    if (!v || !wx || !ax || !h) {
        rc = nomem(net);
        goto out;
    }
    TRY(dora_coef(net, md, wx, &qt, &bt, v, stream));
    for (int64_t o = 0; o < out; o++)   /* row 4: (1 - c) b */
        v[4 * out + o] = md->bias ? (1.0f - v[3 * out + o]) * md->bias[o] : 0.0f;
    if (!(vec = upload(net, v + 3 * out, 2, out, stream)) || !(c = view(vec, 0, 1, &out)) ||
        !(cb = view(vec, out, 1, &out))) {
        rc = nomem(net);
        goto out;
    }
    TRY(gemm(h, x2, ax, false, true, 1.0f, 0.0f, stream));                 /* H = X A^T */
    TRY(gemm(y2, h, md->p[1], false, true, md->scale, 1.0f, stream));      /* y = Z + b */
    TRY(ghc_op_mul(y2, y2, c, stream));
    TRY(ghc_op_add(y2, y2, cb, 1.0f, 1.0f, stream));                       /* c Z + b */
out:;
    ghc_tensor_t *all[] = { wx, ax, h, qt, bt, vec, c, cb };
    for (size_t k = 0; k < sizeof(all) / sizeof(all[0]); k++)
        ghc_tensor_free(all[k]);
    return rc;
}

static int dora_bwd(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *x2, const ghc_tensor_t *g,
                    ghc_tensor_t *dx2, void *stream)
{
    int64_t N = ghc_tensor_dim(x2, 0), r = md->rank, out = md->out;
    enum ghc_dtype xdt = ghc_tensor_dtype(x2);
    float s = md->scale;
    int rc = 0;
    float *v = hbuf(net, (size_t)(8 * out));
    ghc_tensor_t *wx = lyc_base_weight(net, md, xdt, stream);
    ghc_tensor_t *ax = as_dtype(net, WS_CAST_X, md->p[0], xdt, stream);
    ghc_tensor_t *h = ws(net, WS_H, GHC_DTYPE_F32, 2, (const int64_t[]){ N, r });
    ghc_tensor_t *dh = ws(net, WS_DH, GHC_DTYPE_F32, 2, (const int64_t[]){ N, r });
    ghc_tensor_t *z = ws(net, WS_Z, GHC_DTYPE_F32, 2, (const int64_t[]){ N, out });
    ghc_tensor_t *rho = ws(net, WS_M, GHC_DTYPE_F32, 1, &out);
    ghc_tensor_t *qt = NULL, *bt = NULL, *vec = NULL, *c = NULL, *beta = NULL, *dg = NULL, *cm1 = NULL;
    ghc_tensor_t *gg = NULL, *dhx = NULL, *zx = NULL, *btx = NULL, *m = NULL;
    if (!v || !wx || !ax || !h || !dh || !z || !rho) {
        rc = nomem(net);
        goto out;
    }
    TRY(dora_coef(net, md, wx, &qt, &bt, v, stream));
    TRY(gemm(h, x2, ax, false, true, 1.0f, 0.0f, stream));                 /* H = X A^T */
    TRY(gemm(z, x2, wx, false, true, 1.0f, 0.0f, stream));                 /* Z = X W^T ... */
    TRY(gemm(z, h, md->p[1], false, true, s, 1.0f, stream));               /* ... + s H B^T */
    TRY(ghc_op_mul(z, z, g, stream));
    TRY(ghc_op_sum_rows(rho, z, stream));                                  /* rho = colsum(G * Z) */
    TRY(download(net, rho, v + 4 * out, stream));
    /* rows uploaded: 0 c, 1 beta, 2 dg, 3 c - 1 */
    float *up = v + 4 * out;   /* rho is read before each slot is overwritten */
    for (int64_t o = 0; o < out; o++) {
        double gv = v[o], n = v[out + o], q = v[2 * out + o], rh = up[o], cv = v[3 * out + o];
        v[o] = (float)cv;
        v[out + o] = q > 0 ? (float)(-gv * rh / (n * n * q)) : 0.0f;
        v[2 * out + o] = (float)(rh / n);
        v[3 * out + o] = (float)(cv - 1.0);
    }
    if (!(vec = upload(net, v, 4, out, stream)) || !(c = view(vec, 0, 1, &out)) ||
        !(beta = view(vec, out, 1, &out)) || !(dg = view(vec, 2 * out, 1, &out)) ||
        !(cm1 = view(vec, 3 * out, 1, &out)) || !(gg = view(md->g[2], 0, 1, &out))) {
        rc = nomem(net);
        goto out;
    }
    TRY(ghc_op_add(gg, gg, dg, 1.0f, 1.0f, stream));                       /* dg += rho / n */
    TRY(ghc_op_mul(z, g, c, stream));                                      /* Gc = G diag(c) */
    TRY(gemm(md->g[1], z, h, true, false, s, 1.0f, stream));               /* dB += s Gc^T H */
    TRY(ghc_op_mul(qt, qt, beta, stream));
    if (!(m = ws(net, WS_S, GHC_DTYPE_F32, 2, (const int64_t[]){ r, r }))) {
        rc = nomem(net);
        goto out;
    }
    {
        ghc_tensor_t *eye = ws(net, WS_EYE, GHC_DTYPE_F32, 2, (const int64_t[]){ r, r });   /* still I_r */
        if (!eye) {
            rc = nomem(net);
            goto out;
        }
        rc = gemm(md->g[1], qt, eye, true, false, s, 1.0f, stream);      /* dB += s diag(beta) Q */
        ghc_tensor_free(eye);
        if (rc < 0)
            goto out;
    }
    TRY(gemm(dh, z, md->p[1], false, false, s, 0.0f, stream));            /* dH = s Gc B */
    if (!(dhx = as_dtype(net, WS_CAST_W, dh, xdt, stream))) {
        rc = nomem(net);
        goto out;
    }
    TRY(gemm(md->g[0], dhx, x2, true, false, 1.0f, 1.0f, stream));         /* dA += dH^T X */
    TRY(ghc_op_mul(bt, bt, beta, stream));                                 /* (diag(beta) B)^T */
    if (!(btx = as_dtype(net, WS_PT, bt, xdt, stream))) {
        rc = nomem(net);
        goto out;
    }
    TRY(gemm(md->g[0], btx, wx, false, false, s, 1.0f, stream));           /* dA += s (bB)^T W */
    TRY(gemm(m, bt, md->p[1], false, false, 1.0f, 0.0f, stream));          /* (bB)^T B */
    TRY(gemm(md->g[0], m, md->p[0], false, false, s * s, 1.0f, stream));   /* dA += s^2 (bB)^T B A */
    if (dx2) {
        TRY(gemm(dx2, dh, md->p[0], false, false, 1.0f, 1.0f, stream));    /* dX += dH A */
        TRY(ghc_op_mul(z, g, cm1, stream));                                /* G (c - 1) */
        if (!(zx = as_dtype(net, WS_MASKED, z, xdt, stream))) {
            rc = nomem(net);
            goto out;
        }
        TRY(gemm(dx2, zx, wx, false, false, 1.0f, 1.0f, stream));          /* dX += G (c - 1) W */
    }
out:;
    ghc_tensor_t *all[] = { wx, ax, h, dh, z, rho, qt, bt, vec, c, beta, dg, cm1, gg, dhx, zx, btx, m };
    for (size_t k = 0; k < sizeof(all) / sizeof(all[0]); k++)
        ghc_tensor_free(all[k]);
    return rc;
}

/* ---- dispatch -------------------------------------------------------------------------------- */

int lyc_forward(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *x, ghc_tensor_t *y, bool write,
                void *stream)
{
    if (write && md->dora)
        return ghc_error_set(net->core, GHC_EINVAL, "lycoris: %s: forward asked to write y, which DoRA does not "
                             "offer (its output is not a sum: the plan's forward_writes is false)", md->name);
    int64_t N = ghc_tensor_numel(x) / md->in;
    ghc_tensor_t *x2 = V2(x, N, md->in), *y2 = V2(y, N, md->out);
    int rc;
    net->overwrite = write;
    if (!x2 || !y2)
        rc = nomem(net);
    else if (md->dora)
        rc = dora_fwd(net, md, x2, y2, stream);
    else if (md->algo == LYC_LORA)
        rc = lora_fwd(net, md, x2, y2, stream);
    else if (md->algo == LYC_LOHA)
        rc = loha_kr(md) ? loha_kr_fwd(net, md, x2, y2, stream) : loha_fwd(net, md, x2, y2, stream);
    else
        rc = lokr_fwd(net, md, x2, y2, stream);
    net->overwrite = false;
    ghc_tensor_free(x2);
    ghc_tensor_free(y2);
    return rc;
}

/* The backward on [N, features] views of x, dy (f32, or NULL when g is given), g (dy in x's
 * dtype, or NULL; LoRA only) and dx (or NULL); dx_beta: 1 adds to dx, 0 writes it (LoRA only;
 * the others add). */
static int backward_2d(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *x, const ghc_tensor_t *dy,
                       const ghc_tensor_t *g, ghc_tensor_t *dx, float dx_beta, void *stream)
{
    int64_t N = ghc_tensor_numel(x) / md->in;
    ghc_tensor_t *x2 = V2(x, N, md->in), *dy2 = dy ? V2(dy, N, md->out) : NULL;
    ghc_tensor_t *g2 = g ? V2(g, N, md->out) : NULL, *dx2 = dx ? V2(dx, N, md->in) : NULL;
    int rc;
    if (!x2 || (dy && !dy2) || (g && !g2) || (dx && !dx2))
        rc = nomem(net);
    else if (md->dora)
        rc = dora_bwd(net, md, x2, dy2, dx2, stream);
    else if (md->algo == LYC_LORA)
        rc = lora_bwd(net, md, x2, dy2, g2, dx2, dx_beta, stream);
    else if (md->algo == LYC_LOHA)
        rc = loha_kr(md) ? loha_kr_bwd(net, md, x2, dy2, dx2, stream) : loha_bwd(net, md, x2, dy2, dx2, stream);
    else
        rc = lokr_bwd(net, md, x2, dy2, dx2, stream);
    ghc_tensor_free(x2);
    ghc_tensor_free(dy2);
    ghc_tensor_free(g2);
    ghc_tensor_free(dx2);
    return rc;
}

int lyc_backward(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *x, const ghc_tensor_t *dy,
                 const ghc_tensor_t *g, ghc_tensor_t *dx, bool accumulate, void *stream)
{
    const bool lora = md->algo == LYC_LORA && !md->dora;   /* dx = dH A: written as readily as added */
    if (dx && !accumulate && !lora)
        return ghc_error_set(net->core, GHC_EINVAL, "lycoris: %s: backward asked to write dx, which only LoRA without "
                             "DoRA offers (the plan's backward_writes is false)", md->name);
    int64_t N = ghc_tensor_numel(x) / md->in;
    if (!lora || (g && (ghc_tensor_numel(g) != N * md->out || ghc_tensor_dtype(g) != ghc_tensor_dtype(x))))
        g = NULL;   /* not the operand this path takes: use dy */
    return backward_2d(net, md, x, dy, g, dx, accumulate ? 1.0f : 0.0f, stream);
}

/* ---- fold (LoRA into the model's GEMM weight) ----------------------------------------------- */

int lyc_fold(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *w, ghc_tensor_t *wf, void *stream)
{
    const int64_t n = md->out * md->in;
    enum ghc_dtype dt = ghc_tensor_dtype(w);
    char b1[160], b2[160];
    if ((dt != GHC_DTYPE_BF16 && dt != GHC_DTYPE_F32) || ghc_tensor_dtype(wf) != dt || ghc_tensor_numel(w) != n ||
        ghc_tensor_numel(wf) != n || ghc_tensor_device(w) != net->device || ghc_tensor_device(wf) != net->device)
        return ghc_error_set(net->core, GHC_EINVAL, "lycoris: %s: fold: weight %s into %s, expected [%lld, %lld] bf16 "
                             "or f32 (both alike) on device %d (the network's 'device')", md->name,
                             ghc_tensor_describe(w, b1, sizeof(b1)), ghc_tensor_describe(wf, b2, sizeof(b2)),
                             (long long)md->out, (long long)md->in, net->device);
    int rc = 0;
    ghc_tensor_t *w2 = V2(w, md->out, md->in), *wf2 = V2(wf, md->out, md->in);
    ghc_tensor_t *ax = as_dtype(net, WS_CAST_W, md->p[0], dt, stream);
    ghc_tensor_t *bx = as_dtype(net, WS_P2, md->p[1], dt, stream);
    if (!w2 || !wf2 || !ax || !bx) {
        rc = nomem(net);
        goto out;
    }
    if (ghc_tensor_cdata(w) != ghc_tensor_cdata(wf))
        TRY(ghc_op_copy(wf2, w2, stream));
    TRY(gemm(wf2, bx, ax, false, false, md->scale, 1.0f, stream));         /* W' = W + s B A */
    rc = 1;
out:
    ghc_tensor_free(w2);
    ghc_tensor_free(wf2);
    ghc_tensor_free(ax);
    ghc_tensor_free(bx);
    return rc;
}

int lyc_grads(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *x, const ghc_tensor_t *g, void *stream)
{
    int64_t N = ghc_tensor_numel(x) / md->in;
    enum ghc_dtype gdt = ghc_tensor_dtype(g);
    if (md->algo != LYC_LORA || md->dora || md->mask)
        return ghc_error_set(net->core, GHC_EINVAL, "lycoris: %s: grads on a module that does not fold "
                             "(%s%s%s)", md->name, lyc_algo_name(md->algo), md->dora ? ", DoRA" : "",
                             md->mask ? ", rank dropout" : "");
    if (ghc_tensor_numel(g) != N * md->out || (gdt != GHC_DTYPE_F32 && gdt != ghc_tensor_dtype(x)))
        return ghc_error_set(net->core, GHC_EINVAL, "lycoris: %s: grads: g has %lld elements of %s, expected "
                             "%lld x %lld, f32 or x's %s", md->name, (long long)ghc_tensor_numel(g),
                             ghc_dtype_name(gdt), (long long)N, (long long)md->out,
                             ghc_dtype_name(ghc_tensor_dtype(x)));
    const bool f32 = gdt == GHC_DTYPE_F32;   /* dy itself (an f32 model), or its cast */
    return backward_2d(net, md, x, f32 ? g : NULL, f32 ? NULL : g, NULL, 0.0f, stream);
}

/* ---- K-concatenation (the model's GEMMs take H and the factors) ---------------------------------- */

/* The LoRA ops of ops.h (ghc_op_lora_fwd, ghc_op_lora_cast_bwd) where they are fast: rank up to
 * 16 on CUDA (their tensor-core kernels), any rank on the CPU; GEMMs and casts otherwise. */
static bool lora_ops(const struct lycoris *net, const struct lyc_module *md)
{
    return md->rank <= 16 || net->device == GHC_DEVICE_CPU;
}

int lyc_concat_forward(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *x, ghc_tensor_t *h,
                       ghc_tensor_t *wcols, bool again, void *stream)
{
    const int64_t N = ghc_tensor_numel(x) / md->in, r = md->rank;
    char b1[160], b2[160];
    if (ghc_tensor_numel(h) != N * r || ghc_tensor_dim(h, -1) != r || ghc_tensor_dtype(h) != ghc_tensor_dtype(x) ||
        ghc_tensor_numel(wcols) != md->out * r || ghc_tensor_dim(wcols, -1) != r)
        return ghc_error_set(net->core, GHC_EINVAL, "lycoris: %s: concat_forward: h %s and wcols %s, expected "
                             "[.., %lld] in x's dtype and [%lld, %lld]", md->name,
                             ghc_tensor_describe(h, b1, sizeof(b1)), ghc_tensor_describe(wcols, b2, sizeof(b2)),
                             (long long)r, (long long)md->out, (long long)r);
    int rc = 0;
    ghc_tensor_t *x2 = V2(x, N, md->in), *h2 = V2(h, N, r), *wc2 = V2(wcols, md->out, r), *ax = NULL;
    if (!x2 || !h2 || !wc2) {
        rc = nomem(net);
        goto out;
    }
    const int64_t shape[2] = { N, r };
    const enum ghc_dtype dt = ghc_tensor_dtype(x);
    /* kept: H as this step's forward wrote it (the recomputation); keep: this forward's H kept
     * for that (one [N, r] per module) */
    const bool kept = again && md->hc && md->hc_step == net->step && ghc_tensor_same_shape(md->hc, h2) &&
                      ghc_tensor_dtype(md->hc) == dt;
    const bool keep = !again;
    if (keep && md->hc && (!ghc_tensor_same_shape(md->hc, h2) || ghc_tensor_dtype(md->hc) != dt)) {
        ghc_tensor_free(md->hc);
        md->hc = NULL;
    }
    if (keep && !md->hc && !(md->hc = ghc_tensor_init(net->core, dt, 2, shape, net->device, GHC_ROLE_ACTIVATIONS))) {
        rc = nomem(net);
        goto out;
    }
    if (lora_ops(net, md)) {   /* H (or the kept H), its copy and B into the spare columns: one pass over X */
        TRY(ghc_op_lora_fwd(h2, kept || keep ? md->hc : NULL, kept ? NULL : x2, kept ? NULL : md->p[0], md->scale,
                            wc2, md->p[1], stream));
    } else {
        if (kept) {
            TRY(ghc_op_cast(h2, md->hc, 1.0f, NULL, stream));
        } else {
            if (!(ax = as_dtype(net, WS_CAST_W, md->p[0], dt, stream))) {
                rc = nomem(net);
                goto out;
            }
            TRY(gemm(h2, x2, ax, false, true, md->scale, 0.0f, stream));   /* H = s X A^T */
            if (keep)
                TRY(ghc_op_cast(md->hc, h2, 1.0f, NULL, stream));
        }
        TRY(ghc_op_cast(wc2, md->p[1], 1.0f, NULL, stream));            /* the weight's spare columns: B */
    }
    net->hc_hits += kept;
    if (keep)
        md->hc_step = net->step;
    rc = 1;
out:
    ghc_tensor_free(x2);
    ghc_tensor_free(h2);
    ghc_tensor_free(wc2);
    ghc_tensor_free(ax);
    return rc;
}

int lyc_concat_backward(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *x, const ghc_tensor_t *h,
                        const ghc_tensor_t *dy, ghc_tensor_t *g, ghc_tensor_t *dh, ghc_tensor_t *wrows, void *stream)
{
    const int64_t N = ghc_tensor_numel(x) / md->in, r = md->rank;
    const enum ghc_dtype xdt = ghc_tensor_dtype(x);
    char b1[160], b2[160], b3[160];
    if (ghc_tensor_numel(g) != N * md->out || ghc_tensor_dtype(g) != xdt || ghc_tensor_numel(dh) != N * r ||
        ghc_tensor_dtype(dh) != xdt || ghc_tensor_numel(wrows) != r * md->in || ghc_tensor_dim(wrows, -1) != md->in ||
        !dy || ghc_tensor_numel(dy) != N * md->out || ghc_tensor_dtype(dy) != GHC_DTYPE_F32)
        return ghc_error_set(net->core, GHC_EINVAL, "lycoris: %s: concat_backward: g %s, dh %s, wrows %s, expected "
                             "[.., %lld] and [.., %lld] in x's dtype and [%lld, %lld], and dy f32 like g", md->name,
                             ghc_tensor_describe(g, b1, sizeof(b1)), ghc_tensor_describe(dh, b2, sizeof(b2)),
                             ghc_tensor_describe(wrows, b3, sizeof(b3)), (long long)md->out, (long long)r,
                             (long long)r, (long long)md->in);
    int rc = 0;
    ghc_tensor_t *x2 = V2(x, N, md->in), *h2 = V2(h, N, r), *g2 = V2(g, N, md->out), *dh2 = V2(dh, N, r);
    ghc_tensor_t *wr2 = V2(wrows, r, md->in), *dy2 = V2(dy, N, md->out), *bx = NULL;
    if (!x2 || !h2 || !g2 || !dh2 || !wr2 || !dy2) {
        rc = nomem(net);
        goto out;
    }
    if (lora_ops(net, md)) {   /* G, dH and dB from one read of dy, and A into the spare rows */
        TRY(ghc_op_lora_cast_bwd(g2, dh2, md->g[1], dy2, h2, md->p[1], md->scale, wr2, md->p[0], stream));
    } else {
        if (!(bx = as_dtype(net, WS_P2, md->p[1], xdt, stream))) {
            rc = nomem(net);
            goto out;
        }
        TRY(ghc_op_cast(g2, dy2, 1.0f, NULL, stream));
        TRY(gemm(md->g[1], g2, h2, true, false, 1.0f, 1.0f, stream));      /* dB += G^T H (H holds s) */
        TRY(gemm(dh2, g2, bx, false, false, md->scale, 0.0f, stream));     /* dH = s G B */
        TRY(ghc_op_cast(wr2, md->p[0], 1.0f, NULL, stream));               /* the weight's spare rows: A */
    }
    TRY(gemm(md->g[0], dh2, x2, true, false, 1.0f, 1.0f, stream));         /* dA += dH^T X */
    rc = 1;
out:
    ghc_tensor_free(x2);
    ghc_tensor_free(h2);
    ghc_tensor_free(g2);
    ghc_tensor_free(dh2);
    ghc_tensor_free(wr2);
    ghc_tensor_free(dy2);
    ghc_tensor_free(bx);
    return rc;
}

/* ---- delta-W ----------------------------------------------------------------------------------- */

int lyc_delta(struct lycoris *net, struct lyc_module *md, ghc_tensor_t *dw, void *stream)
{
    ghc_tensor_t *p1 = NULL, *p2 = NULL, *w = NULL, *w1 = NULL, *w2 = NULL;
    int rc = 0;
    switch (md->algo) {
    case LYC_LORA:
        return gemm(dw, md->p[1], md->p[0], false, false, md->scale, 0.0f, stream);
    case LYC_LOHA:
        TRY(loha_build(net, md, &p1, &p2, &w, stream));
        TRY(ghc_op_scale(dw, w, md->scale, stream));
        break;
    case LYC_LOKR:
        /* kron(W1, W2) without a permute: rows i b .. i b + b - 1 of dW, viewed [b, c, d],
         * are the batched outer products W1[i, :]^T [c, 1] times W2[k, :] [1, d] over k. */
        TRY(lokr_factors(net, md, &w1, &w2, stream));
        for (int64_t i = 0; i < md->a && rc == 0; i++) {
            ghc_tensor_t *c3 = view(dw, i * md->b * md->in, 3, (const int64_t[]){ md->b, md->c, md->d });
            ghc_tensor_t *a1 = view(w1, i * md->c, 2, (const int64_t[]){ md->c, 1 });
            ghc_tensor_t *b3 = view(w2, 0, 3, (const int64_t[]){ md->b, 1, md->d });
            if (!c3 || !a1 || !b3)
                rc = nomem(net);
            else
                rc = gemm(c3, a1, b3, false, false, md->scale, 0.0f, stream);
            ghc_tensor_free(c3);
            ghc_tensor_free(a1);
            ghc_tensor_free(b3);
        }
        break;
    }
out:
    ghc_tensor_free(p1);
    ghc_tensor_free(p2);
    ghc_tensor_free(w);
    ghc_tensor_free(w1);
    ghc_tensor_free(w2);
    return rc;
}

/* ---- merge ------------------------------------------------------------------------------------- */

/* W <- W + m delta-W (s applied once), or for DoRA with ComfyUI's strength semantics
 * W <- W + m (diag(c) (W + delta-W) - W) with c = g / (q + eps) and q = |W + delta-W| per row
 * from dora_coef (the same c the forward uses); for a stored value divided by the base
 * weight's norms (md->dora_base) c = g / (|W_o| + eps), ComfyUI's weight_decompose
 * (comfy/weight_adapter/base.py) on the same numbers. */
int lyc_merge_weight(struct lycoris *net, struct lyc_module *md, ghc_tensor_t *w, float m, void *stream)
{
    const int64_t shape[2] = { md->out, md->in }, n = md->out * md->in;
    int64_t out = md->out, in = md->in;
    ghc_tensor_t *dw = ws(net, WS_Z, GHC_DTYPE_F32, 2, shape), *qt = NULL, *bt = NULL, *hwt = NULL;
    float *hw = NULL, *hd = NULL, *v = NULL;
    int rc = 0;
    if (!dw || ghc_tensor_numel(w) != n || ghc_tensor_dtype(w) != GHC_DTYPE_F32) {
        rc = dw ? ghc_error_set(net->core, GHC_EINVAL, "lycoris: %s: merge needs an f32 [%lld, %lld] weight",
                                md->name, (long long)out, (long long)in) : nomem(net);
        goto out;
    }
    TRY(lyc_delta(net, md, dw, stream));
    if (!md->dora) {
        TRY(ghc_op_add(w, w, dw, 1.0f, m, stream));
        TRY(ghc_op_sync(net->core, net->device, stream));
        goto out;
    }
    free(md->wn2);
    if (!(md->wn2 = malloc((size_t)out * sizeof(float))) || !(hw = malloc((size_t)n * sizeof(float))) ||
        !(hd = malloc((size_t)n * sizeof(float))) || !(v = malloc((size_t)(4 * out) * sizeof(float)))) {
        rc = nomem(net);
        goto out;
    }
    TRY(download(net, w, hw, stream));
    TRY(download(net, dw, hd, stream));
    for (int64_t o = 0; o < out; o++) {
        double acc = 0;
        for (int64_t i = 0; i < in; i++)
            acc += (double)hw[o * in + i] * hw[o * in + i];
        md->wn2[o] = (float)acc;
    }
    if (md->dora_base) {
        TRY(download(net, md->p[2], v, stream));
        for (int64_t o = 0; o < out; o++)
            v[3 * out + o] = (float)(v[o] / (sqrt((double)md->wn2[o]) + DORA_EPS));
    } else {
        TRY(dora_coef(net, md, w, &qt, &bt, v, stream));
    }
    for (int64_t o = 0; o < out; o++) {
        float c = v[3 * out + o];
        for (int64_t i = 0; i < in; i++) {
            float w0 = hw[o * in + i];
            hw[o * in + i] = w0 + m * (c * (w0 + hd[o * in + i]) - w0);
        }
    }
    if (!(hwt = ghc_tensor_wrap(net->core, GHC_DTYPE_F32, 2, shape, GHC_DEVICE_CPU, hw))) {
        rc = nomem(net);
        goto out;
    }
    TRY(ghc_op_copy(w, hwt, stream));
    TRY(ghc_op_sync(net->core, net->device, stream));
out:
    ghc_tensor_free(dw);
    ghc_tensor_free(qt);
    ghc_tensor_free(bt);
    ghc_tensor_free(hwt);
    free(hw);
    free(hd);
    free(v);
    return rc;
}
