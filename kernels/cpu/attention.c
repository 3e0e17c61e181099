/* kernels/cpu/attention.c: reference attention, non-causal, per batch and head:
 * O = softmax(scale Q K^T) V with the natural-log log-sum-exp of each row, and the backward
 * that recomputes P = exp(scale Q K^T - lse) (nothing of P is kept):
 *   dV = P^T dO,  dP = dO V^T,  dS = P (dP - rowsum(dO O)),  dQ = scale dS K,  dK = scale dS^T Q.
 * The inputs are read as f32; every sum (the D-long dot products and the sums over the Lq or
 * Lk rows) accumulates in f64 and the outputs are rounded once. This path is the reference
 * for tests and tiny runs: with f32 row sums, the softmax denominator over a short caption's
 * hundreds of zero padding rows alone put a relative 6e-7 error into lse, and through
 * exp(s - lse) into every gradient (4e-6, enough to flip an Automagic sign test); in f64 the
 * results are within a few f32 roundings of exact. o may also be [B, Lq, H Dh], a column view
 * included: token t's values start at t * ldo (attn_ldo). */
#include <config.h>

#include <math.h>
#include <stdlib.h>

#include "cpu.h"

/* Offset of row i, head h of a [B, L, H, Dh] tensor. */
#define ROW(b, i, h, L, H, Dh) ((((b) * (L) + (i)) * (H) + (h)) * (Dh))

/* Elements between the starts of o's tokens: H Dh for [B, Lq, H, Dh], the row stride for
 * [B, Lq, H Dh]. */
static int64_t attn_ldo(const ghc_tensor_t *o)
{
    return ghc_tensor_ndim(o) == 3 ? ghc_tensor_row_stride(o) : ghc_tensor_dim(o, 2) * ghc_tensor_dim(o, 3);
}

static double dot(const float *x, const float *y, int64_t n)
{
    double s = 0.0;
    for (int64_t d = 0; d < n; d++)
        s += (double)x[d] * y[d];
    return s;
}

int ghc_cpu_attention_fwd(ghc_tensor_t *o, ghc_tensor_t *lse, const ghc_tensor_t *q, const ghc_tensor_t *k,
                          const ghc_tensor_t *v, float scale)
{
    int rc = 0;
    int64_t B = ghc_tensor_dim(q, 0), Lq = ghc_tensor_dim(q, 1), H = ghc_tensor_dim(q, 2);
    int64_t Dh = ghc_tensor_dim(q, 3), Lk = ghc_tensor_dim(k, 1), ldo = attn_ldo(o);
    float *fq = NULL, *fk = NULL, *fv = NULL;
    double *s = NULL, *acc = NULL;
    float *pl = ghc_tensor_data(lse);
    if (!(fq = ghc_cpu_f32_copy(q, "attention_fwd")) || !(fk = ghc_cpu_f32_copy(k, "attention_fwd")) ||
        !(fv = ghc_cpu_f32_copy(v, "attention_fwd"))) {
        rc = GHC_ENOMEM;
        goto out;
    }
    if (!(s = malloc((size_t)(Lk ? Lk : 1) * sizeof(double))) || !(acc = malloc((size_t)Dh * sizeof(double)))) {
        rc = ghc_error_set(ghc_tensor_core(o), GHC_ENOMEM, "attention_fwd: no memory for a row of scores");
        goto out;
    }
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < Lq; i++) {
                const float *qi = fq + ROW(b, i, h, Lq, H, Dh);
                double m = -INFINITY;
                for (int64_t j = 0; j < Lk; j++) {
                    s[j] = scale * dot(qi, fk + ROW(b, j, h, Lk, H, Dh), Dh);
                    if (s[j] > m)
                        m = s[j];
                }
                double sum = 0.0;
                for (int64_t j = 0; j < Lk; j++)
                    sum += exp(s[j] - m);
                double l = Lk ? m + log(sum) : -INFINITY;
                pl[(b * H + h) * Lq + i] = (float)l;
                for (int64_t d = 0; d < Dh; d++)
                    acc[d] = 0.0;
                for (int64_t j = 0; j < Lk; j++) {
                    double p = exp(s[j] - l);
                    const float *vj = fv + ROW(b, j, h, Lk, H, Dh);
                    for (int64_t d = 0; d < Dh; d++)
                        acc[d] += p * vj[d];
                }
                int64_t oo = (b * Lq + i) * ldo + h * Dh;
                for (int64_t d = 0; d < Dh; d++)
                    GHC_CPU_SET(o, oo + d, (float)acc[d]);
            }
out:
    free(acc);
    free(s);
    free(fv);
    free(fk);
    free(fq);
    return rc;
}

int ghc_cpu_attention_bwd(ghc_tensor_t *dq, ghc_tensor_t *dk, ghc_tensor_t *dv, const ghc_tensor_t *dout,
                          const ghc_tensor_t *q, const ghc_tensor_t *k, const ghc_tensor_t *v,
                          const ghc_tensor_t *o, const ghc_tensor_t *lse, float scale)
{
    int rc = 0;
    int64_t B = ghc_tensor_dim(q, 0), Lq = ghc_tensor_dim(q, 1), H = ghc_tensor_dim(q, 2);
    int64_t Dh = ghc_tensor_dim(q, 3), Lk = ghc_tensor_dim(k, 1);
    const float *pl = ghc_tensor_cdata(lse);
    float *fq = NULL, *fk = NULL, *fv = NULL, *fo = NULL, *fdo = NULL;
    double *gq = NULL, *gk = NULL, *gv = NULL;
    const char *op = "attention_bwd";
    if (!(fq = ghc_cpu_f32_copy(q, op)) || !(fk = ghc_cpu_f32_copy(k, op)) || !(fv = ghc_cpu_f32_copy(v, op)) ||
        !(fo = ghc_cpu_f32_copy(o, op)) || !(fdo = ghc_cpu_f32_copy(dout, op))) {   /* fo: dense, like q */
        rc = GHC_ENOMEM;
        goto out;
    }
    size_t nk = (size_t)((Lk ? Lk : 1) * Dh);
    if (!(gq = malloc((size_t)Dh * sizeof(double))) || !(gk = malloc(nk * sizeof(double))) || !(gv = malloc(nk * sizeof(double)))) {
        rc = ghc_error_set(ghc_tensor_core(q), GHC_ENOMEM, "attention_bwd: no memory for the work rows");
        goto out;
    }
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            for (size_t e = 0; e < (size_t)(Lk * Dh); e++)
                gk[e] = gv[e] = 0.0;
            for (int64_t i = 0; i < Lq; i++) {
                int64_t oi = ROW(b, i, h, Lq, H, Dh);
                const float *qi = fq + oi, *doi = fdo + oi;
                double l = pl[(b * H + h) * Lq + i];
                double Di = dot(doi, fo + oi, Dh);
                for (int64_t d = 0; d < Dh; d++)
                    gq[d] = 0.0;
                for (int64_t j = 0; j < Lk; j++) {
                    int64_t oj = ROW(b, j, h, Lk, H, Dh);
                    const float *kj = fk + oj, *vj = fv + oj;
                    double p = exp(scale * dot(qi, kj, Dh) - l);
                    double dp = dot(doi, vj, Dh);
                    double dsij = p * (dp - Di);
                    for (int64_t d = 0; d < Dh; d++) {
                        gq[d] += dsij * kj[d];
                        gk[j * Dh + d] += dsij * qi[d];
                        gv[j * Dh + d] += p * doi[d];
                    }
                }
                if (dq)
                    for (int64_t d = 0; d < Dh; d++)
                        GHC_CPU_SET(dq, oi + d, (float)(scale * gq[d]));
            }
            for (int64_t j = 0; j < Lk; j++) {
                int64_t oj = ROW(b, j, h, Lk, H, Dh);
                for (int64_t d = 0; d < Dh; d++) {
                    if (dk)
                        GHC_CPU_SET(dk, oj + d, (float)(scale * gk[j * Dh + d]));
                    if (dv)
                        GHC_CPU_SET(dv, oj + d, (float)gv[j * Dh + d]);
                }
            }
        }
out:
    free(gv);
    free(gk);
    free(gq);
    free(fdo);
    free(fo);
    free(fv);
    free(fk);
    free(fq);
    return rc;
}
