/* algo_lokr.c: LoKr (doc/lycoris.md, "Computation") by the reshape trick, never forming
 * kron(W1, W2); dW1 as a batched GEMM over token chunks followed by a row sum, and a factor
 * stored as two low-rank halves formed as their product. lyc_lokr_factors also serves delta-W
 * (algo.c). */
#include <config.h>

#include "lycoris_impl.h"

/* ---- LoKr ------------------------------------------------------------------------------------ */

/* W1 [a, c] and W2 [b, d]: the parameters, or the products of their low-rank halves. */
int lyc_lokr_factors(struct lycoris *net, struct lyc_module *md, ghc_tensor_t **w1, ghc_tensor_t **w2,
                     void *stream)
{
    int rc = 0;
    *w1 = md->w1_lr ? lyc_ws(net, WS_P1, GHC_DTYPE_F32, 2, (const int64_t[]){ md->a, md->c }) : V2(md->p[0], md->a, md->c);
    *w2 = md->w2_lr ? lyc_ws(net, WS_P2, GHC_DTYPE_F32, 2, (const int64_t[]){ md->b, md->d }) : V2(md->p[2], md->b, md->d);
    if (!*w1 || !*w2)
        return lyc_nomem(net);
    if (md->w1_lr)
        rc = lyc_gemm(*w1, md->p[0], md->p[1], false, false, 1.0f, 0.0f, stream);
    if (rc == 0 && md->w2_lr)
        rc = lyc_gemm(*w2, md->p[2], md->p[3], false, false, 1.0f, 0.0f, stream);
    return rc;
}

/* T [N c, b] = X[N c, d] W2^T (in scratch WS_H); *w2x: W2 in x's dtype. */
static ghc_tensor_t *lokr_t(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *xr, const ghc_tensor_t *w2,
                            void *stream)
{
    ghc_tensor_t *w2x = lyc_as_dtype(net, WS_CAST_W, w2, ghc_tensor_dtype(xr), stream);
    ghc_tensor_t *t = lyc_ws(net, WS_H, GHC_DTYPE_F32, 2, (const int64_t[]){ ghc_tensor_dim(xr, 0), md->b });
    if (!w2x || !t || lyc_gemm(t, xr, w2x, false, true, 1.0f, 0.0f, stream) < 0) {
        ghc_tensor_free(t);
        t = NULL;
    }
    ghc_tensor_free(w2x);
    return t;
}

int lyc_lokr_fwd(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *x2, ghc_tensor_t *y2,
                 void *stream)
{
    int64_t N = ghc_tensor_dim(x2, 0);
    ghc_tensor_t *w1 = NULL, *w2 = NULL, *xr = NULL, *t = NULL, *t3 = NULL, *d = NULL, *d3 = NULL;
    float beta;
    int rc;
    TRY(lyc_lokr_factors(net, md, &w1, &w2, stream));
    if (!(xr = V2(x2, N * md->c, md->d)) || !(t = lokr_t(net, md, xr, w2, stream)) ||
        !(t3 = V3(t, N, md->c, md->b)) || !(d = lyc_out_begin(net, md, y2, &beta)) || !(d3 = V3(d, N, md->a, md->b))) {
        rc = lyc_nomem(net);
        goto out;
    }
    TRY(lyc_gemm(d3, w1, t3, false, false, md->scale, beta, stream));           /* Y~_n += s W1 T_n */
    TRY(lyc_out_end(net, md, y2, d, stream));
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
    ghc_tensor_t *sum = lyc_ws(net, WS_SUM, GHC_DTYPE_F32, 1, &ac), *sum2 = NULL;
    if (!sum || !(sum2 = V2(sum, md->a, md->c)))
        rc = lyc_nomem(net);
    for (int64_t n0 = 0; n0 < N && rc == 0; n0 += K) {
        int64_t k = N - n0 < K ? N - n0 : K;
        ghc_tensor_t *gc = lyc_view(g, n0 * md->out, 3, (const int64_t[]){ k, md->a, md->b });
        ghc_tensor_t *tc = lyc_view(t, n0 * md->c * md->b, 3, (const int64_t[]){ k, md->c, md->b });
        ghc_tensor_t *cc = lyc_ws(net, WS_CHUNK, GHC_DTYPE_F32, 3, (const int64_t[]){ k, md->a, md->c });
        ghc_tensor_t *cr = cc ? V2(cc, k, ac) : NULL;
        if (!gc || !tc || !cr)
            rc = lyc_nomem(net);
        if (rc == 0)
            rc = lyc_gemm(cc, gc, tc, false, true, md->scale, 0.0f, stream);
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
    int rc = lyc_gemm(md->g[ia], df, md->p[ia + 1], false, true, 1.0f, 1.0f, stream);
    return rc < 0 ? rc : lyc_gemm(md->g[ia + 1], md->p[ia], df, true, false, 1.0f, 1.0f, stream);
}

int lyc_lokr_bwd(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *x2, const ghc_tensor_t *dy2,
                 ghc_tensor_t *dx2, void *stream)
{
    int64_t N = ghc_tensor_dim(x2, 0), Nc = N * md->c;
    ghc_tensor_t *w1 = NULL, *w2 = NULL, *xr = NULL, *t = NULL, *g = NULL, *g3 = NULL, *u = NULL, *u3 = NULL;
    ghc_tensor_t *ux = NULL, *dxr = NULL, *df = NULL;
    int rc;
    TRY(lyc_lokr_factors(net, md, &w1, &w2, stream));
    if (!(xr = V2(x2, Nc, md->d)) || !(t = lokr_t(net, md, xr, w2, stream)) || !(g = lyc_grad_in(net, md, dy2, stream)) ||
        !(g3 = V3(g, N, md->a, md->b)) || !(u = lyc_ws(net, WS_DH, GHC_DTYPE_F32, 2, (const int64_t[]){ Nc, md->b })) ||
        !(u3 = V3(u, N, md->c, md->b))) {
        rc = lyc_nomem(net);
        goto out;
    }
    TRY(lyc_gemm(u3, w1, g3, true, false, md->scale, 0.0f, stream));            /* U_n = s W1^T G_n */
    if (dx2) {
        if (!(dxr = V2(dx2, Nc, md->d))) {
            rc = lyc_nomem(net);
            goto out;
        }
        TRY(lyc_gemm(dxr, u, w2, false, false, 1.0f, 1.0f, stream));            /* dX += U W2 */
    }
    if (!(ux = lyc_as_dtype(net, WS_CAST_X, u, ghc_tensor_dtype(x2), stream))) {
        rc = lyc_nomem(net);
        goto out;
    }
    if (md->w2_lr) {
        if (!(df = lyc_ws(net, WS_DW, GHC_DTYPE_F32, 2, (const int64_t[]){ md->b, md->d }))) {
            rc = lyc_nomem(net);
            goto out;
        }
        TRY(lyc_gemm(df, ux, xr, true, false, 1.0f, 0.0f, stream));             /* dW2 = U^T X */
        TRY(lowrank_grads(md, 2, df, stream));
        ghc_tensor_free(df);
        df = NULL;
    } else {
        TRY(lyc_gemm(md->g[2], ux, xr, true, false, 1.0f, 1.0f, stream));
    }
    if (md->w1_lr) {
        if (!(df = lyc_ws(net, WS_DW, GHC_DTYPE_F32, 2, (const int64_t[]){ md->a, md->c }))) {
            rc = lyc_nomem(net);
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
