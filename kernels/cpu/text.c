/* kernels/cpu/text.c: the reference text-encoder ops of ops.h (umT5): the embedding lookup,
 * T5's relative-position bias and attention with an additive bias and a key padding mask.
 * Inputs are read as f32; the dot products and softmax sums accumulate in f64, the outputs are
 * rounded once (as kernels/cpu/attention.c). */
#include <config.h>

#include <math.h>
#include <stdlib.h>

#include "cpu.h"

int ghc_cpu_embedding(ghc_tensor_t *y, const ghc_tensor_t *table, const ghc_tensor_t *ids)
{
    const int64_t n = ghc_tensor_numel(ids), D = ghc_tensor_dim(table, 1);
    const bool i32 = ghc_tensor_dtype(ids) == GHC_DTYPE_I32;
    for (int64_t i = 0; i < n; i++) {
        const int64_t id = i32 ? ((const int32_t *)ghc_tensor_cdata(ids))[i] : ((const int64_t *)ghc_tensor_cdata(ids))[i];
        for (int64_t d = 0; d < D; d++)
            GHC_CPU_SET(y, i * D + d, GHC_CPU_GET(table, id * D + d));
    }
    return 0;
}

int ghc_cpu_rel_pos_bias(ghc_tensor_t *bias, const ghc_tensor_t *table, int32_t num_buckets, int32_t max_distance,
                         bool bidirectional)
{
    const int64_t H = ghc_tensor_dim(bias, 0), Lq = ghc_tensor_dim(bias, 1), Lk = ghc_tensor_dim(bias, 2);
    float *out = ghc_tensor_data(bias);
    for (int64_t i = 0; i < Lq; i++)
        for (int64_t j = 0; j < Lk; j++) {
            const int32_t bk = ghc_rel_pos_bucket(j - i, num_buckets, max_distance, bidirectional);
            for (int64_t h = 0; h < H; h++)
                out[(h * Lq + i) * Lk + j] = GHC_CPU_GET(table, (int64_t)bk * H + h);
        }
    return 0;
}

int ghc_cpu_attention_bias_fwd(ghc_tensor_t *o, const ghc_tensor_t *q, const ghc_tensor_t *k, const ghc_tensor_t *v,
                               const ghc_tensor_t *bias, const ghc_tensor_t *key_mask, float scale)
{
    const char *op = "attention_bias_fwd";
    const int64_t B = ghc_tensor_dim(q, 0), Lq = ghc_tensor_dim(q, 1), H = ghc_tensor_dim(q, 2),
                  Dh = ghc_tensor_dim(q, 3), Lk = ghc_tensor_dim(k, 1);
    const float *pb = bias ? ghc_tensor_cdata(bias) : NULL;
    float *fq = NULL, *fk = NULL, *fv = NULL, *fm = NULL;
    double *s = NULL, *acc = NULL;
    int rc = 0;
    if (!(fq = ghc_cpu_f32_copy(q, op)) || !(fk = ghc_cpu_f32_copy(k, op)) || !(fv = ghc_cpu_f32_copy(v, op)) ||
        (key_mask && !(fm = ghc_cpu_f32_copy(key_mask, op)))) {
        rc = GHC_ENOMEM;
        goto out;
    }
    if (!(s = malloc((size_t)(Lk ? Lk : 1) * sizeof(double))) || !(acc = malloc((size_t)Dh * sizeof(double)))) {
        rc = ghc_error_set(ghc_tensor_core(o), GHC_ENOMEM, "%s: no memory for a row of scores", op);
        goto out;
    }
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < Lq; i++) {
                const float *qi = fq + ((b * Lq + i) * H + h) * Dh;
                double m = -INFINITY, sum = 0.0;
                for (int64_t j = 0; j < Lk; j++) {
                    s[j] = -INFINITY;
                    if (fm && fm[b * Lk + j] == 0.0f)
                        continue;
                    const float *kj = fk + ((b * Lk + j) * H + h) * Dh;
                    double d = 0.0;
                    for (int64_t e = 0; e < Dh; e++)
                        d += (double)qi[e] * kj[e];
                    /* the score in f32 as the op's definition: scale q.k + bias */
                    s[j] = (double)((float)d * scale + (pb ? pb[(h * Lq + i) * Lk + j] : 0.0f));
                    m = s[j] > m ? s[j] : m;
                }
                for (int64_t e = 0; e < Dh; e++)
                    acc[e] = 0.0;
                if (m > -INFINITY)
                    for (int64_t j = 0; j < Lk; j++) {
                        if (s[j] == -INFINITY)
                            continue;
                        const double p = exp(s[j] - m);
                        const float *vj = fv + ((b * Lk + j) * H + h) * Dh;
                        sum += p;
                        for (int64_t e = 0; e < Dh; e++)
                            acc[e] += p * vj[e];
                    }
                for (int64_t e = 0; e < Dh; e++)   /* o [B, Lq, H, Dh] and [B, Lq, H Dh] are the same elements */
                    GHC_CPU_SET(o, ((b * Lq + i) * H + h) * Dh + e, sum > 0.0 ? (float)(acc[e] / sum) : 0.0f);
            }
out:
    free(fq);
    free(fk);
    free(fv);
    free(fm);
    free(s);
    free(acc);
    return rc;
}
