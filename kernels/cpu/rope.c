/* kernels/cpu/rope.c: Wan's 3-D rotary position embedding, as the official code: adjacent
 * pairs of each head rotate by pos * 10000^(-2j/d_axis), with the head dim split into time,
 * height and width parts. Angles, cos and sin in f64; the rotation in fp32. */
#include <config.h>

#include <math.h>
#include <stdlib.h>

#include "cpu.h"

void ghc_cpu_rope_angles(float *cs, int64_t Dh, int64_t l, int64_t h, int64_t w, bool inverse)
{
    const int64_t P = Dh / 2, d_hw = 2 * (Dh / 6), d_t = Dh - 2 * d_hw;
    const int64_t pos_t = l / (h * w), pos_h = (l / w) % h, pos_w = l % w;
    for (int64_t p = 0; p < P; p++) {
        int64_t j, d_axis, pos;
        if (2 * p < d_t) {
            j = p, d_axis = d_t, pos = pos_t;
        } else if (2 * p < d_t + d_hw) {
            j = p - d_t / 2, d_axis = d_hw, pos = pos_h;
        } else {
            j = p - (d_t + d_hw) / 2, d_axis = d_hw, pos = pos_w;
        }
        double theta = (double)pos * pow(10000.0, -2.0 * (double)j / (double)d_axis);
        cs[2 * p] = (float)cos(theta);
        cs[2 * p + 1] = (float)(inverse ? -sin(theta) : sin(theta));
    }
}

int ghc_cpu_rope(ghc_tensor_t *y, const ghc_tensor_t *x, int64_t f, int64_t h, int64_t w, bool inverse)
{
    int64_t B = ghc_tensor_dim(x, 0), L = ghc_tensor_dim(x, 1), H = ghc_tensor_dim(x, 2);
    int64_t Dh = ghc_tensor_dim(x, 3), P = Dh / 2;
    float *cs = malloc((size_t)(2 * P) * sizeof(float));
    if (!cs)
        return ghc_error_set(ghc_tensor_core(y), GHC_ENOMEM, "rope: no memory for %lld floats", (long long)(2 * P));
    (void)f;
    for (int64_t l = 0; l < L; l++) {
        ghc_cpu_rope_angles(cs, Dh, l, h, w, inverse);
        for (int64_t b = 0; b < B; b++)
            for (int64_t hh = 0; hh < H; hh++) {
                int64_t o = ((b * L + l) * H + hh) * Dh;
                for (int64_t p = 0; p < P; p++) {
                    float x0 = GHC_CPU_GET(x, o + 2 * p), x1 = GHC_CPU_GET(x, o + 2 * p + 1);
                    float c = cs[2 * p], s = cs[2 * p + 1];
                    GHC_CPU_SET(y, o + 2 * p, x0 * c - x1 * s);
                    GHC_CPU_SET(y, o + 2 * p + 1, x0 * s + x1 * c);
                }
            }
    }
    free(cs);
    return 0;
}

/* The sinusoidal timestep embedding (ghc_op_timestep_embedding): the f64 expression the wan22
 * model computed on the host, term for term (t read as f32, then widened). */
int ghc_cpu_timestep_embedding(ghc_tensor_t *out, const ghc_tensor_t *t, bool cos_first, double max_period)
{
    const int64_t B = ghc_tensor_dim(out, 0), dim = ghc_tensor_dim(out, 1), half = dim / 2;
    float *o = ghc_tensor_data(out);
    for (int64_t b = 0; b < B; b++) {
        float tb = GHC_CPU_GET(t, b);
        for (int64_t k = 0; k < half; k++) {
            double a = (double)tb * pow(max_period, -(double)k / (double)half);
            float c = (float)cos(a), s = (float)sin(a);
            o[b * dim + k] = cos_first ? c : s;
            o[b * dim + half + k] = cos_first ? s : c;
        }
        if (dim % 2)
            o[b * dim + dim - 1] = 0.0f;
    }
    return 0;
}
