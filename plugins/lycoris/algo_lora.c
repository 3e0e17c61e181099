/* algo_lora.c: LoRA in factorised form (doc/lycoris.md, "Computation"): H = X A^T, dY = s H B^T;
 * the backward takes H from the forward right before it (the checkpointed block's recomputation)
 * where kept, else recomputes it. Also the two ways the model's own GEMMs carry a LoRA: the fold
 * (W + s B A into the weight they read) and K-concatenation (H and the factors in spare columns
 * and rows). Only LoRA has these paths and the kept H, so they sit apart from the other
 * algorithms. */
#include <config.h>

#include "lycoris_impl.h"

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
    if (!lyc_grow(net, &k->buf, (size_t)n * (size_t)md->rank * sizeof(float)))
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

/* ---- LoRA ------------------------------------------------------------------------------------ */

int lyc_lora_fwd(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *x2, ghc_tensor_t *y2,
                 void *stream)
{
    int64_t N = ghc_tensor_dim(x2, 0);
    float beta;
    int rc = 0;
    ghc_tensor_t *ax = lyc_as_dtype(net, WS_CAST_W, md->p[0], ghc_tensor_dtype(x2), stream);
    struct lyc_hkeep *k = hkeep_put(net, md, x2, N);   /* H kept for the backward */
    ghc_tensor_t *h = k ? ghc_tensor_wrap(net->core, GHC_DTYPE_F32, 2, (const int64_t[]){ N, md->rank }, net->device,
                                          ghc_tensor_data(k->buf))
                        : NULL;
    ghc_tensor_t *d = lyc_out_begin(net, md, y2, &beta);
    if (!ax || !h || !d) {
        rc = lyc_nomem(net);
        goto out;
    }
    TRY(lyc_gemm(h, x2, ax, false, true, 1.0f, 0.0f, stream));
    k->valid = true;
    TRY(lyc_gemm(d, h, md->p[1], false, true, md->scale, beta, stream));
    TRY(lyc_out_end(net, md, y2, d, stream));
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
int lyc_lora_bwd(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *x2, const ghc_tensor_t *dy2,
                 const ghc_tensor_t *g2, ghc_tensor_t *dx2, float dx_beta, void *stream)
{
    int64_t N = ghc_tensor_dim(x2, 0), r = md->rank;
    enum ghc_dtype xdt = ghc_tensor_dtype(x2);
    const bool lp = g2 && !md->mask;
    const enum ghc_dtype hdt = lp ? xdt : GHC_DTYPE_F32;
    int rc = 0;
    ghc_tensor_t *ax = lyc_as_dtype(net, WS_CAST_W, md->p[0], xdt, stream);
    ghc_tensor_t *bx = lp ? lyc_as_dtype(net, WS_P2, md->p[1], xdt, stream) : lyc_view(md->p[1], 0, 2, ghc_tensor_shape(md->p[1]));
    const struct lyc_hkeep *k = hkeep_get(net, md, x2, N);   /* H from the forward, if kept */
    ghc_tensor_t *kh = k ? ghc_tensor_wrap(net->core, GHC_DTYPE_F32, 2, (const int64_t[]){ N, r }, net->device,
                                           ghc_tensor_data(k->buf))
                         : NULL;
    ghc_tensor_t *h = k && hdt == GHC_DTYPE_F32 ? kh : lyc_ws(net, WS_H, hdt, 2, (const int64_t[]){ N, r });
    ghc_tensor_t *dh = lyc_ws(net, WS_DH, hdt, 2, (const int64_t[]){ N, r });
    ghc_tensor_t *g = lp ? lyc_view(g2, 0, 2, ghc_tensor_shape(g2)) : lyc_grad_in(net, md, dy2, stream), *dhx = NULL;
    if (!ax || !bx || !h || !dh || !g || (k && !kh)) {
        rc = lyc_nomem(net);
        goto out;
    }
    if (k) {   /* H = X A^T */
        net->hk_hits++;
        if (h != kh)
            TRY(ghc_op_cast(h, kh, 1.0f, NULL, stream));
    } else {
        TRY(lyc_gemm(h, x2, ax, false, true, 1.0f, 0.0f, stream));
    }
    TRY(lyc_gemm(md->g[1], g, h, true, false, md->scale, 1.0f, stream));       /* dB += s G^T H */
    TRY(lyc_gemm(dh, g, bx, false, false, md->scale, 0.0f, stream));           /* dH = s G B */
    if (!(dhx = lyc_as_dtype(net, WS_CAST_X, dh, xdt, stream))) {
        rc = lyc_nomem(net);
        goto out;
    }
    if (dx2)                                                               /* dX (+)= dH A */
        TRY(lp ? lyc_gemm(dx2, dhx, ax, false, false, 1.0f, dx_beta, stream)
               : lyc_gemm(dx2, dh, md->p[0], false, false, 1.0f, dx_beta, stream));
    TRY(lyc_gemm(md->g[0], dhx, x2, true, false, 1.0f, 1.0f, stream));         /* dA += dH^T X */
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
    ghc_tensor_t *ax = lyc_as_dtype(net, WS_CAST_W, md->p[0], dt, stream);
    ghc_tensor_t *bx = lyc_as_dtype(net, WS_P2, md->p[1], dt, stream);
    if (!w2 || !wf2 || !ax || !bx) {
        rc = lyc_nomem(net);
        goto out;
    }
    if (ghc_tensor_cdata(w) != ghc_tensor_cdata(wf))
        TRY(ghc_op_copy(wf2, w2, stream));
    TRY(lyc_gemm(wf2, bx, ax, false, false, md->scale, 1.0f, stream));         /* W' = W + s B A */
    rc = 1;
out:
    ghc_tensor_free(w2);
    ghc_tensor_free(wf2);
    ghc_tensor_free(ax);
    ghc_tensor_free(bx);
    return rc;
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
        rc = lyc_nomem(net);
        goto out;
    }
    const int64_t shape[2] = { N, r };
    const enum ghc_dtype dt = ghc_tensor_dtype(x);
    /* kept: H as this step's forward wrote it (the recomputation); keep: this forward's H kept
     * for that (one [N, r] per module) */
    const bool kept = again && md->hc && md->hc_step == net->step && md->hc_x == ghc_tensor_cdata(x) &&
                      ghc_tensor_same_shape(md->hc, h2) &&
                      ghc_tensor_dtype(md->hc) == dt;
    const bool keep = !again;
    if (keep && md->hc && (!ghc_tensor_same_shape(md->hc, h2) || ghc_tensor_dtype(md->hc) != dt)) {
        ghc_tensor_free(md->hc);
        md->hc = NULL;
    }
    if (keep && !md->hc && !(md->hc = ghc_tensor_init(net->core, dt, 2, shape, net->device, GHC_ROLE_ACTIVATIONS))) {
        rc = lyc_nomem(net);
        goto out;
    }
    if (lora_ops(net, md)) {   /* H (or the kept H), its copy and B into the spare columns: one pass over X */
        TRY(ghc_op_lora_fwd(h2, kept || keep ? md->hc : NULL, kept ? NULL : x2, kept ? NULL : md->p[0], md->scale,
                            wc2, md->p[1], stream));
    } else {
        if (kept) {
            TRY(ghc_op_cast(h2, md->hc, 1.0f, NULL, stream));
        } else {
            if (!(ax = lyc_as_dtype(net, WS_CAST_W, md->p[0], dt, stream))) {
                rc = lyc_nomem(net);
                goto out;
            }
            TRY(lyc_gemm(h2, x2, ax, false, true, md->scale, 0.0f, stream));   /* H = s X A^T */
            if (keep)
                TRY(ghc_op_cast(md->hc, h2, 1.0f, NULL, stream));
        }
        TRY(ghc_op_cast(wc2, md->p[1], 1.0f, NULL, stream));            /* the weight's spare columns: B */
    }
    net->hc_hits += kept;
    if (keep) {
        md->hc_step = net->step;
        md->hc_x = ghc_tensor_cdata(x);
    }
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
        rc = lyc_nomem(net);
        goto out;
    }
    if (lora_ops(net, md)) {   /* G, dH and dB from one read of dy, and A into the spare rows */
        TRY(ghc_op_lora_cast_bwd(g2, dh2, md->g[1], dy2, h2, md->p[1], md->scale, wr2, md->p[0], stream));
    } else {
        if (!(bx = lyc_as_dtype(net, WS_P2, md->p[1], xdt, stream))) {
            rc = lyc_nomem(net);
            goto out;
        }
        TRY(ghc_op_cast(g2, dy2, 1.0f, NULL, stream));
        TRY(lyc_gemm(md->g[1], g2, h2, true, false, 1.0f, 1.0f, stream));      /* dB += G^T H (H holds s) */
        TRY(lyc_gemm(dh2, g2, bx, false, false, md->scale, 0.0f, stream));     /* dH = s G B */
        TRY(ghc_op_cast(wr2, md->p[0], 1.0f, NULL, stream));               /* the weight's spare rows: A */
    }
    TRY(lyc_gemm(md->g[0], dh2, x2, true, false, 1.0f, 1.0f, stream));         /* dA += dH^T X */
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
