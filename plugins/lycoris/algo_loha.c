/* algo_loha.c: LoHa (doc/lycoris.md, "Computation"): the materialised Hadamard product
 * (W1a W1b) * (W2a W2b), recomputed in the backward, or the Khatri-Rao form, a LoRA of rank r^2,
 * where that is smaller. lyc_loha_build also serves delta-W (algo.c). */
#include <config.h>

#include "lycoris_impl.h"

/* ---- LoHa ------------------------------------------------------------------------------------ */

/* P1 = W1a W1b, P2 = W2a W2b, DW = P1 * P2 (each [out, in] f32 scratch). */
int lyc_loha_build(struct lycoris *net, struct lyc_module *md, ghc_tensor_t **p1, ghc_tensor_t **p2,
                   ghc_tensor_t **dw, void *stream)
{
    const int64_t shape[2] = { md->out, md->in };
    *p1 = lyc_ws(net, WS_P1, GHC_DTYPE_F32, 2, shape);
    *p2 = lyc_ws(net, WS_P2, GHC_DTYPE_F32, 2, shape);
    *dw = lyc_ws(net, WS_DW, GHC_DTYPE_F32, 2, shape);
    if (!*p1 || !*p2 || !*dw)
        return lyc_nomem(net);
    int rc = lyc_gemm(*p1, md->p[0], md->p[1], false, false, 1.0f, 0.0f, stream);
    if (rc == 0)
        rc = lyc_gemm(*p2, md->p[2], md->p[3], false, false, 1.0f, 0.0f, stream);
    if (rc == 0)
        rc = ghc_op_mul(*dw, *p1, *p2, stream);
    return rc;
}

int lyc_loha_fwd(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *x2, ghc_tensor_t *y2,
                 void *stream)
{
    ghc_tensor_t *p1 = NULL, *p2 = NULL, *dw = NULL, *dwx = NULL, *d = NULL;
    float beta;
    int rc;
    TRY(lyc_loha_build(net, md, &p1, &p2, &dw, stream));
    if (!(dwx = lyc_as_dtype(net, WS_CAST_W, dw, ghc_tensor_dtype(x2), stream)) || !(d = lyc_out_begin(net, md, y2, &beta))) {
        rc = lyc_nomem(net);
        goto out;
    }
    TRY(lyc_gemm(d, x2, dwx, false, true, md->scale, beta, stream));
    TRY(lyc_out_end(net, md, y2, d, stream));
out:
    ghc_tensor_free(p1);
    ghc_tensor_free(p2);
    ghc_tensor_free(dw);
    ghc_tensor_free(dwx);
    ghc_tensor_free(d);
    return rc;
}

int lyc_loha_bwd(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *x2, const ghc_tensor_t *dy2,
                 ghc_tensor_t *dx2, void *stream)
{
    const int64_t shape[2] = { md->out, md->in };
    ghc_tensor_t *p1 = NULL, *p2 = NULL, *dw = NULL, *g = NULL, *gx = NULL, *D = NULL, *T = NULL;
    int rc;
    TRY(lyc_loha_build(net, md, &p1, &p2, &dw, stream));
    if (!(g = lyc_grad_in(net, md, dy2, stream)) || !(gx = lyc_as_dtype(net, WS_CAST_X, g, ghc_tensor_dtype(x2), stream)) ||
        !(D = lyc_ws(net, WS_H, GHC_DTYPE_F32, 2, shape)) || !(T = lyc_ws(net, WS_DH, GHC_DTYPE_F32, 2, shape))) {
        rc = lyc_nomem(net);
        goto out;
    }
    TRY(lyc_gemm(D, gx, x2, true, false, md->scale, 0.0f, stream));            /* D = s G^T X */
    TRY(ghc_op_mul(T, D, p2, stream));                                     /* T1 = D * P2 */
    TRY(lyc_gemm(md->g[0], T, md->p[1], false, true, 1.0f, 1.0f, stream));     /* dW1a += T1 W1b^T */
    TRY(lyc_gemm(md->g[1], md->p[0], T, true, false, 1.0f, 1.0f, stream));     /* dW1b += W1a^T T1 */
    TRY(ghc_op_mul(T, D, p1, stream));                                     /* T2 = D * P1 */
    TRY(lyc_gemm(md->g[2], T, md->p[3], false, true, 1.0f, 1.0f, stream));
    TRY(lyc_gemm(md->g[3], md->p[2], T, true, false, 1.0f, 1.0f, stream));
    if (dx2)
        TRY(lyc_gemm(dx2, g, dw, false, false, md->scale, 1.0f, stream));      /* dX += s G DW */
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
bool lyc_loha_kr(const struct lyc_module *md)
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
    *ua = lyc_ws(net, WS_P1, GHC_DTYPE_F32, 2, (const int64_t[]){ out, r * r });
    *ub = lyc_ws(net, WS_P2, GHC_DTYPE_F32, 2, (const int64_t[]){ r * r, in });
    if (!*ua || !*ub || !(ua3 = V3(*ua, out, r, r)) || !(a3 = V3(md->p[0], out, r, 1)) ||
        !(b3 = V3(md->p[2], out, 1, r)) || !(ub2 = V2(*ub, r, r * in)) || !(ub3 = V3(*ub, r, r, in)) ||
        !(w2f = lyc_view(md->p[3], 0, 1, (const int64_t[]){ r * in }))) {
        rc = lyc_nomem(net);
        goto out;
    }
    TRY(lyc_gemm(ua3, a3, b3, false, false, 1.0f, 0.0f, stream));             /* Ua[o] = W1a[o]^T W2a[o] */
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

int lyc_loha_kr_fwd(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *x2, ghc_tensor_t *y2,
                    void *stream)
{
    const int64_t N = ghc_tensor_dim(x2, 0), r2 = (int64_t)md->rank * md->rank;
    ghc_tensor_t *ua = NULL, *ub = NULL, *ubx = NULL, *h = NULL, *d = NULL;
    float beta;
    int rc;
    TRY(loha_kr_build(net, md, &ua, &ub, stream));
    if (!(ubx = lyc_as_dtype(net, WS_CAST_W, ub, ghc_tensor_dtype(x2), stream)) ||
        !(h = lyc_ws(net, WS_H, GHC_DTYPE_F32, 2, (const int64_t[]){ N, r2 })) || !(d = lyc_out_begin(net, md, y2, &beta))) {
        rc = lyc_nomem(net);
        goto out;
    }
    TRY(lyc_gemm(h, x2, ubx, false, true, 1.0f, 0.0f, stream));                /* H = X Ub^T */
    TRY(lyc_gemm(d, h, ua, false, true, md->scale, beta, stream));             /* dY = s H Ua^T */
    TRY(lyc_out_end(net, md, y2, d, stream));
out:
    ghc_tensor_free(ua);
    ghc_tensor_free(ub);
    ghc_tensor_free(ubx);
    ghc_tensor_free(h);
    ghc_tensor_free(d);
    return rc;
}

int lyc_loha_kr_bwd(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *x2, const ghc_tensor_t *dy2,
                    ghc_tensor_t *dx2, void *stream)
{
    const int64_t N = ghc_tensor_dim(x2, 0), r = md->rank, r2 = r * r, in = md->in, out = md->out;
    const enum ghc_dtype xdt = ghc_tensor_dtype(x2);
    ghc_tensor_t *ua = NULL, *ub = NULL, *ubx = NULL, *h = NULL, *dh = NULL, *dhx = NULL, *g = NULL;
    ghc_tensor_t *dua = NULL, *dub = NULL, *t = NULL, *ones = NULL;
    ghc_tensor_t *v[12] = { 0 };   /* views */
    int rc;
    TRY(loha_kr_build(net, md, &ua, &ub, stream));
    if (!(ubx = lyc_as_dtype(net, WS_CAST_W, ub, xdt, stream)) || !(g = lyc_grad_in(net, md, dy2, stream)) ||
        !(h = lyc_ws(net, WS_H, GHC_DTYPE_F32, 2, (const int64_t[]){ N, r2 })) ||
        !(dh = lyc_ws(net, WS_DH, GHC_DTYPE_F32, 2, (const int64_t[]){ N, r2 })) ||
        !(dua = lyc_ws(net, WS_DW, GHC_DTYPE_F32, 2, (const int64_t[]){ out, r2 })) ||
        !(dub = lyc_ws(net, WS_Z, GHC_DTYPE_F32, 2, (const int64_t[]){ r2, in })) ||
        !(t = lyc_ws(net, WS_PT, GHC_DTYPE_F32, 2, (const int64_t[]){ r, r * in })) ||
        !(ones = lyc_ws(net, WS_EYE, GHC_DTYPE_F32, 2, (const int64_t[]){ 1, r }))) {
        rc = lyc_nomem(net);
        goto out;
    }
    TRY(lyc_gemm(h, x2, ubx, false, true, 1.0f, 0.0f, stream));                /* H = X Ub^T */
    TRY(lyc_gemm(dua, g, h, true, false, md->scale, 0.0f, stream));            /* dUa = s G^T H */
    TRY(lyc_gemm(dh, g, ua, false, false, md->scale, 0.0f, stream));           /* dH = s G Ua */
    if (dx2)
        TRY(lyc_gemm(dx2, dh, ub, false, false, 1.0f, 1.0f, stream));          /* dX += dH Ub */
    if (!(dhx = lyc_as_dtype(net, WS_CAST_X, dh, xdt, stream))) {
        rc = lyc_nomem(net);
        goto out;
    }
    TRY(lyc_gemm(dub, dhx, x2, true, false, 1.0f, 0.0f, stream));              /* dUb = dH^T X */
    TRY(ghc_op_fill(ones, 1.0, stream));
    /* dW1a[o, i] += sum_j dUa[o, i, j] W2a[o, j];  dW2a[o, j] += sum_i dUa[o, i, j] W1a[o, i] */
    if (!(v[0] = V3(dua, out, r, r)) || !(v[1] = V3(md->p[2], out, r, 1)) || !(v[2] = V3(md->g[0], out, r, 1)) ||
        !(v[3] = V3(md->p[0], out, r, 1)) || !(v[4] = V3(md->g[2], out, r, 1)) || !(v[5] = V2(dub, r, r * in)) ||
        !(v[6] = lyc_view(md->p[3], 0, 1, (const int64_t[]){ r * in })) || !(v[7] = V3(t, r, r, in)) ||
        !(v[8] = V3(md->g[1], r, 1, in)) || !(v[9] = V3(dub, r, r, in)) || !(v[10] = V2(md->g[3], 1, r * in))) {
        rc = lyc_nomem(net);
        goto out;
    }
    TRY(lyc_gemm(v[2], v[0], v[1], false, false, 1.0f, 1.0f, stream));
    TRY(lyc_gemm(v[4], v[0], v[3], true, false, 1.0f, 1.0f, stream));
    /* dW1b[i, c] += sum_j dUb[i, j, c] W2b[j, c] */
    TRY(ghc_op_mul(t, v[5], v[6], stream));
    TRY(lyc_gemm(v[8], ones, v[7], false, false, 1.0f, 1.0f, stream));
    /* dW2b[j, c] += sum_i dUb[i, j, c] W1b[i, c] */
    TRY(ghc_op_mul(v[7], v[9], md->p[1], stream));
    TRY(lyc_gemm(v[10], ones, t, false, false, 1.0f, 1.0f, stream));
out:
    for (int k = 0; k < 12; k++)
        ghc_tensor_free(v[k]);
    ghc_tensor_t *all[] = { ua, ub, ubx, h, dh, dhx, g, dua, dub, t, ones };
    for (size_t k = 0; k < sizeof(all) / sizeof(all[0]); k++)
        ghc_tensor_free(all[k]);
    return rc;
}
