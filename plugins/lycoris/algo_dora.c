/* algo_dora.c: DoRA, the weight decomposition of a LoRA along its output axis: its set-up from
 * the model's frozen weight, its forward and backward through the per-row coefficients c
 * (derived below), and dora_scale between what we train and what a file stores. Kept apart
 * because it alone reads the frozen weight and goes through the host (for [out]-vectors only);
 * lyc_dora_coef and lyc_download also serve the merge (algo.c). */
#include <config.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lycoris_impl.h"

/* ---- DoRA (LoRA, output axis, the norm not detached as in LyCORIS; no [out, in] delta) ------
 * The hook's y already holds Y0 + b = X W^T + b and dx the frozen G W, so
 *   forward:  y = c (y + s H B^T) + (1 - c) b         (= c Z + b, Z = X W'^T)
 *   backward: dx += (G (c - 1)) W + dH A,  dH = s (G c) B
 * with q_o^2 = |W_o|^2 + s B_o (P + Q)_o^T, P = W A^T, Q = P + s B S, S = A A^T, n = q + eps,
 * c = g / n (m = 1 in training), rho = colsum(G * Z), dg = rho / n, beta = -g rho / (n^2 q),
 *   dB += s (Gc^T H + diag(beta) Q),  dA += dH^T X + s (diag(beta) B)^T W + s^2 (diag(beta) B)^T B A.
 * Only [out]-vectors go through the host (sqrt and division); everything else is ops. */

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
        if (!(src = lyc_ws(net, WS_WB, ghc_tensor_dtype(w), 2, shape)) || ghc_op_copy(src, w, stream) < 0)
            goto fail;
    } else {
        src = lyc_view(w, 0, 2, shape);
    }
    if (ghc_tensor_dtype(w) == dt && sc == 1.0f)
        return src;
    if (!(c = lyc_ws(net, WS_WC, dt, 2, shape)) || ghc_op_cast(c, src, sc, NULL, stream) < 0)
        goto fail;
    ghc_tensor_free(src);
    return c;
fail:
    lyc_nomem(net);
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
int lyc_download(struct lycoris *net, const ghc_tensor_t *t, float *v, void *stream)
{
    int64_t n = ghc_tensor_numel(t);
    ghc_tensor_t *h = ghc_tensor_wrap(net->core, GHC_DTYPE_F32, 1, &n, GHC_DEVICE_CPU, v);
    ghc_tensor_t *d = lyc_view(t, 0, 1, &n);
    int rc = h && d ? ghc_op_copy(h, d, stream) : lyc_nomem(net);
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
    ghc_tensor_t *d = lyc_ws(net, WS_VEC, GHC_DTYPE_F32, 2, shape);
    if (!h || !d || ghc_op_copy(d, h, stream) < 0 || ghc_op_sync(net->core, net->device, stream) < 0) {
        lyc_nomem(net);
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
        rc = lyc_nomem(net);
        goto out;
    }
    if ((rc = lyc_download(net, wf, hw, NULL)) < 0)
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
        rc = rc < 0 ? rc : lyc_nomem(net);
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
            rc = lyc_nomem(net);
            goto out;
        }
        ghc_tensor_t *bh = ghc_tensor_init(net->core, ghc_tensor_dtype(b), 1, (const int64_t[]){ md->out },
                                           GHC_DEVICE_CPU, GHC_ROLE_WORKSPACE);
        if (!bh || (rc = ghc_op_copy(bh, b, NULL)) < 0 || (rc = ghc_op_sync(net->core, ghc_tensor_device(b), NULL)) < 0 ||
            (rc = ghc_op_cast(bf, bh, 1.0f, NULL, NULL)) < 0)
            rc = rc < 0 ? rc : lyc_nomem(net);
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
int lyc_dora_coef(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *wx, ghc_tensor_t **qt,
                  ghc_tensor_t **bt, float *v, void *stream)
{
    int64_t r = md->rank, out = md->out;
    float s = md->scale;
    int rc = 0;
    ghc_tensor_t *aw = lyc_as_dtype(net, WS_CAST_W, md->p[0], ghc_tensor_dtype(wx), stream);
    ghc_tensor_t *pt = lyc_ws(net, WS_PT, GHC_DTYPE_F32, 2, (const int64_t[]){ r, out });
    ghc_tensor_t *S = lyc_ws(net, WS_S, GHC_DTYPE_F32, 2, (const int64_t[]){ r, r });
    ghc_tensor_t *eye = lyc_ws(net, WS_EYE, GHC_DTYPE_F32, 2, (const int64_t[]){ r, r });
    ghc_tensor_t *hi = ghc_tensor_init(net->core, GHC_DTYPE_F32, 2, (const int64_t[]){ r, r }, GHC_DEVICE_CPU,
                                       GHC_ROLE_WORKSPACE);
    ghc_tensor_t *e = NULL;
    *qt = lyc_ws(net, WS_QT, GHC_DTYPE_F32, 2, (const int64_t[]){ r, out });
    *bt = lyc_ws(net, WS_BT, GHC_DTYPE_F32, 2, (const int64_t[]){ r, out });
    if (!aw || !pt || !S || !eye || !hi || !*qt || !*bt || !(e = lyc_ws(net, WS_M, GHC_DTYPE_F32, 1, &out))) {
        rc = lyc_nomem(net);
        goto out;
    }
    float *iv = ghc_tensor_data(hi);
    for (int64_t k = 0; k < r * r; k++)
        iv[k] = k % (r + 1) == 0;
    TRY(ghc_op_copy(eye, hi, stream));
    TRY(lyc_gemm(pt, aw, wx, false, true, 1.0f, 0.0f, stream));             /* P^T = A W^T */
    TRY(lyc_gemm(S, md->p[0], md->p[0], false, true, 1.0f, 0.0f, stream));  /* S = A A^T */
    TRY(ghc_op_copy(*qt, pt, stream));
    TRY(lyc_gemm(*qt, S, md->p[1], false, true, s, 1.0f, stream));          /* Q^T = P^T + s S B^T */
    TRY(lyc_gemm(*bt, eye, md->p[1], false, true, 1.0f, 0.0f, stream));     /* B^T */
    TRY(ghc_op_add(pt, pt, *qt, 1.0f, 1.0f, stream));                    /* (P + Q)^T */
    TRY(ghc_op_mul(pt, pt, *bt, stream));
    TRY(ghc_op_sum_rows(e, pt, stream));                                 /* e_o = B_o (P + Q)_o^T */
    TRY(lyc_download(net, e, v + 2 * out, stream));
    TRY(lyc_download(net, md->p[2], v, stream));
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
        rc = ghc_error_code(net->core) ? ghc_error_code(net->core) : lyc_nomem(net);
        goto out;
    }
    TRY(lyc_dora_coef(net, &t, wf, &qt, &bt, v, NULL));
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

int lyc_dora_fwd(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *x2, ghc_tensor_t *y2,
                 void *stream)
{
    int64_t N = ghc_tensor_dim(x2, 0), out = md->out;
    int rc = 0;
    float *v = hbuf(net, (size_t)(6 * out));
    ghc_tensor_t *wx = lyc_base_weight(net, md, ghc_tensor_dtype(x2), stream);
    ghc_tensor_t *ax = lyc_as_dtype(net, WS_CAST_X, md->p[0], ghc_tensor_dtype(x2), stream);
    ghc_tensor_t *h = lyc_ws(net, WS_H, GHC_DTYPE_F32, 2, (const int64_t[]){ N, md->rank });
    ghc_tensor_t *qt = NULL, *bt = NULL, *vec = NULL, *c = NULL, *cb = NULL;
    if (!v || !wx || !ax || !h) {
        rc = lyc_nomem(net);
        goto out;
    }
    TRY(lyc_dora_coef(net, md, wx, &qt, &bt, v, stream));
    for (int64_t o = 0; o < out; o++)   /* row 4: (1 - c) b */
        v[4 * out + o] = md->bias ? (1.0f - v[3 * out + o]) * md->bias[o] : 0.0f;
    if (!(vec = upload(net, v + 3 * out, 2, out, stream)) || !(c = lyc_view(vec, 0, 1, &out)) ||
        !(cb = lyc_view(vec, out, 1, &out))) {
        rc = lyc_nomem(net);
        goto out;
    }
    TRY(lyc_gemm(h, x2, ax, false, true, 1.0f, 0.0f, stream));                 /* H = X A^T */
    TRY(lyc_gemm(y2, h, md->p[1], false, true, md->scale, 1.0f, stream));      /* y = Z + b */
    TRY(ghc_op_mul(y2, y2, c, stream));
    TRY(ghc_op_add(y2, y2, cb, 1.0f, 1.0f, stream));                       /* c Z + b */
out:;
    ghc_tensor_t *all[] = { wx, ax, h, qt, bt, vec, c, cb };
    for (size_t k = 0; k < sizeof(all) / sizeof(all[0]); k++)
        ghc_tensor_free(all[k]);
    return rc;
}

int lyc_dora_bwd(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *x2, const ghc_tensor_t *g,
                 ghc_tensor_t *dx2, void *stream)
{
    int64_t N = ghc_tensor_dim(x2, 0), r = md->rank, out = md->out;
    enum ghc_dtype xdt = ghc_tensor_dtype(x2);
    float s = md->scale;
    int rc = 0;
    float *v = hbuf(net, (size_t)(8 * out));
    ghc_tensor_t *wx = lyc_base_weight(net, md, xdt, stream);
    ghc_tensor_t *ax = lyc_as_dtype(net, WS_CAST_X, md->p[0], xdt, stream);
    ghc_tensor_t *h = lyc_ws(net, WS_H, GHC_DTYPE_F32, 2, (const int64_t[]){ N, r });
    ghc_tensor_t *dh = lyc_ws(net, WS_DH, GHC_DTYPE_F32, 2, (const int64_t[]){ N, r });
    ghc_tensor_t *z = lyc_ws(net, WS_Z, GHC_DTYPE_F32, 2, (const int64_t[]){ N, out });
    ghc_tensor_t *rho = lyc_ws(net, WS_M, GHC_DTYPE_F32, 1, &out);
    ghc_tensor_t *qt = NULL, *bt = NULL, *vec = NULL, *c = NULL, *beta = NULL, *dg = NULL, *cm1 = NULL;
    ghc_tensor_t *gg = NULL, *dhx = NULL, *zx = NULL, *btx = NULL, *m = NULL;
    if (!v || !wx || !ax || !h || !dh || !z || !rho) {
        rc = lyc_nomem(net);
        goto out;
    }
    TRY(lyc_dora_coef(net, md, wx, &qt, &bt, v, stream));
    TRY(lyc_gemm(h, x2, ax, false, true, 1.0f, 0.0f, stream));                 /* H = X A^T */
    TRY(lyc_gemm(z, x2, wx, false, true, 1.0f, 0.0f, stream));                 /* Z = X W^T ... */
    TRY(lyc_gemm(z, h, md->p[1], false, true, s, 1.0f, stream));               /* ... + s H B^T */
    TRY(ghc_op_mul(z, z, g, stream));
    TRY(ghc_op_sum_rows(rho, z, stream));                                  /* rho = colsum(G * Z) */
    TRY(lyc_download(net, rho, v + 4 * out, stream));
    /* rows uploaded: 0 c, 1 beta, 2 dg, 3 c - 1 */
    float *up = v + 4 * out;   /* rho is read before each slot is overwritten */
    for (int64_t o = 0; o < out; o++) {
        double gv = v[o], n = v[out + o], q = v[2 * out + o], rh = up[o], cv = v[3 * out + o];
        v[o] = (float)cv;
        v[out + o] = q > 0 ? (float)(-gv * rh / (n * n * q)) : 0.0f;
        v[2 * out + o] = (float)(rh / n);
        v[3 * out + o] = (float)(cv - 1.0);
    }
    if (!(vec = upload(net, v, 4, out, stream)) || !(c = lyc_view(vec, 0, 1, &out)) ||
        !(beta = lyc_view(vec, out, 1, &out)) || !(dg = lyc_view(vec, 2 * out, 1, &out)) ||
        !(cm1 = lyc_view(vec, 3 * out, 1, &out)) || !(gg = lyc_view(md->g[2], 0, 1, &out))) {
        rc = lyc_nomem(net);
        goto out;
    }
    TRY(ghc_op_add(gg, gg, dg, 1.0f, 1.0f, stream));                       /* dg += rho / n */
    TRY(ghc_op_mul(z, g, c, stream));                                      /* Gc = G diag(c) */
    TRY(lyc_gemm(md->g[1], z, h, true, false, s, 1.0f, stream));               /* dB += s Gc^T H */
    TRY(ghc_op_mul(qt, qt, beta, stream));
    if (!(m = lyc_ws(net, WS_S, GHC_DTYPE_F32, 2, (const int64_t[]){ r, r }))) {
        rc = lyc_nomem(net);
        goto out;
    }
    {
        ghc_tensor_t *eye = lyc_ws(net, WS_EYE, GHC_DTYPE_F32, 2, (const int64_t[]){ r, r });   /* still I_r */
        if (!eye) {
            rc = lyc_nomem(net);
            goto out;
        }
        rc = lyc_gemm(md->g[1], qt, eye, true, false, s, 1.0f, stream);      /* dB += s diag(beta) Q */
        ghc_tensor_free(eye);
        if (rc < 0)
            goto out;
    }
    TRY(lyc_gemm(dh, z, md->p[1], false, false, s, 0.0f, stream));            /* dH = s Gc B */
    if (!(dhx = lyc_as_dtype(net, WS_CAST_W, dh, xdt, stream))) {
        rc = lyc_nomem(net);
        goto out;
    }
    TRY(lyc_gemm(md->g[0], dhx, x2, true, false, 1.0f, 1.0f, stream));         /* dA += dH^T X */
    TRY(ghc_op_mul(bt, bt, beta, stream));                                 /* (diag(beta) B)^T */
    if (!(btx = lyc_as_dtype(net, WS_PT, bt, xdt, stream))) {
        rc = lyc_nomem(net);
        goto out;
    }
    TRY(lyc_gemm(md->g[0], btx, wx, false, false, s, 1.0f, stream));           /* dA += s (bB)^T W */
    TRY(lyc_gemm(m, bt, md->p[1], false, false, 1.0f, 0.0f, stream));          /* (bB)^T B */
    TRY(lyc_gemm(md->g[0], m, md->p[0], false, false, s * s, 1.0f, stream));   /* dA += s^2 (bB)^T B A */
    if (dx2) {
        TRY(lyc_gemm(dx2, dh, md->p[0], false, false, 1.0f, 1.0f, stream));    /* dX += dH A */
        TRY(ghc_op_mul(z, g, cm1, stream));                                /* G (c - 1) */
        if (!(zx = lyc_as_dtype(net, WS_MASKED, z, xdt, stream))) {
            rc = lyc_nomem(net);
            goto out;
        }
        TRY(lyc_gemm(dx2, zx, wx, false, false, 1.0f, 1.0f, stream));          /* dX += G (c - 1) W */
    }
out:;
    ghc_tensor_t *all[] = { wx, ax, h, dh, z, rho, qt, bt, vec, c, beta, dg, cm1, gg, dhx, zx, btx, m };
    for (size_t k = 0; k < sizeof(all) / sizeof(all[0]); k++)
        ghc_tensor_free(all[k]);
    return rc;
}
