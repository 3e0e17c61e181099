/* algo.c: what the lycoris adapters' math shares, and the entry points that choose among the
 * algorithms (doc/lycoris.md, "Computation"). Each algorithm has its own file (algo_lora.c,
 * algo_loha.c, algo_lokr.c, algo_dora.c), all written once on the ops of ops.h so the same code
 * runs on the CPU and on CUDA; here is what they all use: scratch in grow-only buffers of the
 * network, views, casts and GEMMs, and rank dropout, which masks output rows of delta-W (as
 * LyCORIS), that is the adapter's output columns in the forward and the rows of G in the
 * backward. The input x comes in the model's GEMM dtype (bf16 or f32): small operands are cast
 * to it, the outputs and gradients stay f32. The hook's forward and backward, delta-W and the
 * merge into a frozen weight live here too, as each of them picks the algorithm per module. */
#include <config.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lycoris_impl.h"

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
bool lyc_grow(struct lycoris *net, ghc_tensor_t **buf, size_t bytes)
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
ghc_tensor_t *lyc_ws(struct lycoris *net, int slot, enum ghc_dtype dt, int ndim, const int64_t *shape)
{
    int64_t n;
    if (!ghc_shape_numel(ndim, shape, &n)) {
        ghc_error_set(net->core, GHC_EINVAL, "lycoris: scratch shape overflow");
        return NULL;
    }
    if (!lyc_grow(net, &net->ws[slot], (size_t)n * ghc_dtype_size(dt)))
        return NULL;
    return ghc_tensor_wrap(net->core, dt, ndim, shape, net->device, ghc_tensor_data(net->ws[slot]));
}

/* A view of t's memory (from element `first` on) with another shape. A column view (x with
 * the model's spare columns, a weight with spare room) keeps its row stride: only its leading
 * dimensions may be regrouped (the same last dimension, first 0). */
ghc_tensor_t *lyc_view(const ghc_tensor_t *t, int64_t first, int ndim, const int64_t *shape)
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

/* f32 tensor t as dtype dt: a view of t itself, or a cast into scratch `slot`. */
ghc_tensor_t *lyc_as_dtype(struct lycoris *net, int slot, const ghc_tensor_t *t, enum ghc_dtype dt, void *stream)
{
    if (dt == ghc_tensor_dtype(t))
        return lyc_view(t, 0, ghc_tensor_ndim(t), ghc_tensor_shape(t));
    ghc_tensor_t *c = lyc_ws(net, slot, dt, ghc_tensor_ndim(t), ghc_tensor_shape(t));
    if (c && ghc_op_cast(c, t, 1.0f, NULL, stream) < 0) {
        ghc_tensor_free(c);
        return NULL;
    }
    return c;
}

int lyc_gemm(ghc_tensor_t *c, const ghc_tensor_t *a, const ghc_tensor_t *b, bool ta, bool tb, float alpha,
             float beta, void *stream)
{
    struct ghc_gemm g = { .trans_a = ta, .trans_b = tb, .alpha = alpha, .beta = beta };
    return ghc_op_gemm(c, a, b, &g, stream);
}

int lyc_nomem(struct lycoris *net)
{
    int rc = ghc_error_code(net->core);
    return rc < 0 ? rc : ghc_error_set(net->core, GHC_ENOMEM, "lycoris: out of memory");
}

/* ---- output masking ------------------------------------------------------------------------- */

/* Where the forward writes its delta: y itself (beta 1; 0 when net->overwrite: lyc_forward's write),
 * or with a rank-dropout mask a scratch like y (beta 0) that lyc_out_end() masks and adds (or
 * writes). */
ghc_tensor_t *lyc_out_begin(struct lycoris *net, struct lyc_module *md, ghc_tensor_t *y2, float *beta)
{
    *beta = md->mask || net->overwrite ? 0.0f : 1.0f;
    if (!md->mask)
        return lyc_view(y2, 0, 2, ghc_tensor_shape(y2));
    return lyc_ws(net, WS_MASKED, GHC_DTYPE_F32, 2, ghc_tensor_shape(y2));
}

int lyc_out_end(const struct lycoris *net, struct lyc_module *md, ghc_tensor_t *y2, ghc_tensor_t *d, void *stream)
{
    if (!md->mask)
        return 0;
    if (net->overwrite)
        return ghc_op_mul(y2, d, md->mask, stream);
    int rc = ghc_op_mul(d, d, md->mask, stream);
    return rc < 0 ? rc : ghc_op_add(y2, y2, d, 1.0f, 1.0f, stream);
}

/* G = dy, or dy times the rank-dropout mask (scratch). */
ghc_tensor_t *lyc_grad_in(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *dy2, void *stream)
{
    if (!md->mask)
        return lyc_view(dy2, 0, 2, ghc_tensor_shape(dy2));
    ghc_tensor_t *g = lyc_ws(net, WS_MASKED, GHC_DTYPE_F32, 2, ghc_tensor_shape(dy2));
    if (g && ghc_op_mul(g, dy2, md->mask, stream) < 0) {
        ghc_tensor_free(g);
        return NULL;
    }
    return g;
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
        rc = lyc_nomem(net);
    else if (md->dora)
        rc = lyc_dora_fwd(net, md, x2, y2, stream);
    else if (md->algo == LYC_LORA)
        rc = lyc_lora_fwd(net, md, x2, y2, stream);
    else if (md->algo == LYC_LOHA)
        rc = lyc_loha_kr(md) ? lyc_loha_kr_fwd(net, md, x2, y2, stream) : lyc_loha_fwd(net, md, x2, y2, stream);
    else
        rc = lyc_lokr_fwd(net, md, x2, y2, stream);
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
        rc = lyc_nomem(net);
    else if (md->dora)
        rc = lyc_dora_bwd(net, md, x2, dy2, dx2, stream);
    else if (md->algo == LYC_LORA)
        rc = lyc_lora_bwd(net, md, x2, dy2, g2, dx2, dx_beta, stream);
    else if (md->algo == LYC_LOHA)
        rc = lyc_loha_kr(md) ? lyc_loha_kr_bwd(net, md, x2, dy2, dx2, stream) : lyc_loha_bwd(net, md, x2, dy2, dx2, stream);
    else
        rc = lyc_lokr_bwd(net, md, x2, dy2, dx2, stream);
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

/* ---- delta-W ----------------------------------------------------------------------------------- */

int lyc_delta(struct lycoris *net, struct lyc_module *md, ghc_tensor_t *dw, void *stream)
{
    ghc_tensor_t *p1 = NULL, *p2 = NULL, *w = NULL, *w1 = NULL, *w2 = NULL;
    int rc = 0;
    switch (md->algo) {
    case LYC_LORA:
        return lyc_gemm(dw, md->p[1], md->p[0], false, false, md->scale, 0.0f, stream);
    case LYC_LOHA:
        TRY(lyc_loha_build(net, md, &p1, &p2, &w, stream));
        TRY(ghc_op_scale(dw, w, md->scale, stream));
        break;
    case LYC_LOKR:
        /* kron(W1, W2) without a permute: rows i b .. i b + b - 1 of dW, viewed [b, c, d],
         * are the batched outer products W1[i, :]^T [c, 1] times W2[k, :] [1, d] over k. */
        TRY(lyc_lokr_factors(net, md, &w1, &w2, stream));
        for (int64_t i = 0; i < md->a && rc == 0; i++) {
            ghc_tensor_t *c3 = lyc_view(dw, i * md->b * md->in, 3, (const int64_t[]){ md->b, md->c, md->d });
            ghc_tensor_t *a1 = lyc_view(w1, i * md->c, 2, (const int64_t[]){ md->c, 1 });
            ghc_tensor_t *b3 = lyc_view(w2, 0, 3, (const int64_t[]){ md->b, 1, md->d });
            if (!c3 || !a1 || !b3)
                rc = lyc_nomem(net);
            else
                rc = lyc_gemm(c3, a1, b3, false, false, md->scale, 0.0f, stream);
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
 * from lyc_dora_coef (the same c the forward uses); for a stored value divided by the base
 * weight's norms (md->dora_base) c = g / (|W_o| + eps), ComfyUI's weight_decompose
 * (comfy/weight_adapter/base.py) on the same numbers. */
int lyc_merge_weight(struct lycoris *net, struct lyc_module *md, ghc_tensor_t *w, float m, void *stream)
{
    const int64_t shape[2] = { md->out, md->in }, n = md->out * md->in;
    int64_t out = md->out, in = md->in;
    ghc_tensor_t *dw = lyc_ws(net, WS_Z, GHC_DTYPE_F32, 2, shape), *qt = NULL, *bt = NULL, *hwt = NULL;
    float *hw = NULL, *hd = NULL, *v = NULL;
    int rc = 0;
    if (!dw || ghc_tensor_numel(w) != n || ghc_tensor_dtype(w) != GHC_DTYPE_F32) {
        rc = dw ? ghc_error_set(net->core, GHC_EINVAL, "lycoris: %s: merge needs an f32 [%lld, %lld] weight",
                                md->name, (long long)out, (long long)in) : lyc_nomem(net);
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
        rc = lyc_nomem(net);
        goto out;
    }
    TRY(lyc_download(net, w, hw, stream));
    TRY(lyc_download(net, dw, hd, stream));
    for (int64_t o = 0; o < out; o++) {
        double acc = 0;
        for (int64_t i = 0; i < in; i++)
            acc += (double)hw[o * in + i] * hw[o * in + i];
        md->wn2[o] = (float)acc;
    }
    if (md->dora_base) {
        TRY(lyc_download(net, md->p[2], v, stream));
        for (int64_t o = 0; o < out; o++)
            v[3 * out + o] = (float)(v[o] / (sqrt((double)md->wn2[o]) + DORA_EPS));
    } else {
        TRY(lyc_dora_coef(net, md, w, &qt, &bt, v, stream));
    }
    for (int64_t o = 0; o < out; o++) {
        float c = v[3 * out + o];
        for (int64_t i = 0; i < in; i++) {
            float w0 = hw[o * in + i];
            hw[o * in + i] = w0 + m * (c * (w0 + hd[o * in + i]) - w0);
        }
    }
    if (!(hwt = ghc_tensor_wrap(net->core, GHC_DTYPE_F32, 2, shape, GHC_DEVICE_CPU, hw))) {
        rc = lyc_nomem(net);
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
