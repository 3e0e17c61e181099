/* cpu.h: the CPU reference kernels behind ops.h (kernels/cpu/). Same signatures as the
 * ghc_op_* functions; called by kernels/ops.c after it has validated dtypes, shapes and
 * devices, so these only compute. Plain loops, fp32 accumulation (f64 where ops.h says).
 * Each returns 0, or GHC_ENOMEM (message set on the tensors' core) when a work buffer cannot
 * be allocated. The helpers at the end are internal to kernels/cpu/. */
#ifndef GHC_KERNELS_CPU_H
#define GHC_KERNELS_CPU_H

#include <string.h>   /* defines: memcpy (for the kernels) */

#include <gh200core/ops.h>

#include "../../core/elem.h"   /* defines: ghc_cpu_load, ghc_cpu_store */

int ghc_cpu_fill(ghc_tensor_t *t, double value);
int ghc_cpu_cast(ghc_tensor_t *dst, const ghc_tensor_t *src, float scale, const struct ghc_rng *rng);
int ghc_cpu_rand_uniform(ghc_tensor_t *t, const struct ghc_rng *rng);
int ghc_cpu_rand_normal(ghc_tensor_t *t, const struct ghc_rng *rng);
int ghc_cpu_gemm(ghc_tensor_t *c, const ghc_tensor_t *a, const ghc_tensor_t *b, const struct ghc_gemm *args);
int ghc_cpu_lora_fwd(ghc_tensor_t *h, ghc_tensor_t *keep, const ghc_tensor_t *x, const ghc_tensor_t *a, float scale,
                     ghc_tensor_t *wcols, const ghc_tensor_t *b);
int ghc_cpu_lora_cast_bwd(ghc_tensor_t *g, ghc_tensor_t *dh, ghc_tensor_t *db, const ghc_tensor_t *dy,
                          const ghc_tensor_t *h, const ghc_tensor_t *b, float scale, ghc_tensor_t *wrows,
                          const ghc_tensor_t *a);
int ghc_cpu_attention_fwd(ghc_tensor_t *o, ghc_tensor_t *lse, const ghc_tensor_t *q, const ghc_tensor_t *k,
                          const ghc_tensor_t *v, float scale);
int ghc_cpu_attention_bwd(ghc_tensor_t *dq, ghc_tensor_t *dk, ghc_tensor_t *dv, const ghc_tensor_t *dout,
                          const ghc_tensor_t *q, const ghc_tensor_t *k, const ghc_tensor_t *v,
                          const ghc_tensor_t *o, const ghc_tensor_t *lse, float scale);
int ghc_cpu_layernorm_fwd(ghc_tensor_t *y, ghc_tensor_t *stats, const ghc_tensor_t *x, const ghc_tensor_t *weight,
                          const ghc_tensor_t *bias, const ghc_tensor_t *shift, const ghc_tensor_t *scale, float eps);
int ghc_cpu_layernorm_bwd(ghc_tensor_t *dx, const ghc_tensor_t *dy, const ghc_tensor_t *x, const ghc_tensor_t *stats,
                          const ghc_tensor_t *weight, const ghc_tensor_t *scale, bool accumulate);
int ghc_cpu_rmsnorm_fwd(ghc_tensor_t *y, ghc_tensor_t *rstd, const ghc_tensor_t *x, const ghc_tensor_t *weight, float eps);
int ghc_cpu_rmsnorm_bwd(ghc_tensor_t *dx, const ghc_tensor_t *dy, const ghc_tensor_t *x, const ghc_tensor_t *rstd,
                        const ghc_tensor_t *weight);
int ghc_cpu_rope(ghc_tensor_t *y, const ghc_tensor_t *x, int64_t f, int64_t h, int64_t w, bool inverse);
/* Token l's cos and +-sin of each of the Dh / 2 pairs (cs [Dh]), as ghc_op_rope computes them. */
void ghc_cpu_rope_angles(float *cs, int64_t Dh, int64_t l, int64_t h, int64_t w, bool inverse);
int ghc_cpu_rmsnorm_rope_fwd(ghc_tensor_t *y, ghc_tensor_t *rstd, const ghc_tensor_t *x, const ghc_tensor_t *weight,
                             float eps, int64_t heads, int64_t h, int64_t w);
int ghc_cpu_rmsnorm_rope_bwd(ghc_tensor_t *dx, const ghc_tensor_t *dy, const ghc_tensor_t *x, const ghc_tensor_t *rstd,
                             const ghc_tensor_t *weight, int64_t heads, int64_t h, int64_t w);
int ghc_cpu_gelu_tanh(ghc_tensor_t *y, const ghc_tensor_t *x);
int ghc_cpu_gelu_tanh_bwd(ghc_tensor_t *dx, const ghc_tensor_t *dy, const ghc_tensor_t *x);
int ghc_cpu_silu(ghc_tensor_t *y, const ghc_tensor_t *x);
int ghc_cpu_silu_bwd(ghc_tensor_t *dx, const ghc_tensor_t *dy, const ghc_tensor_t *x);
int ghc_cpu_add(ghc_tensor_t *y, const ghc_tensor_t *a, const ghc_tensor_t *b, float alpha, float beta);
int ghc_cpu_mul(ghc_tensor_t *y, const ghc_tensor_t *a, const ghc_tensor_t *b);
int ghc_cpu_gated_residual(ghc_tensor_t *out, const ghc_tensor_t *x, const ghc_tensor_t *y, const ghc_tensor_t *gate);
int ghc_cpu_scale(ghc_tensor_t *y, const ghc_tensor_t *x, float alpha);
int ghc_cpu_sum(ghc_tensor_t *out, const ghc_tensor_t *x, bool mean);
int ghc_cpu_sum_rows(ghc_tensor_t *out, const ghc_tensor_t *x);
int ghc_cpu_patchify(ghc_tensor_t *rows, const ghc_tensor_t *lat, const ghc_tensor_t *cond);
int ghc_cpu_patchify_bwd(ghc_tensor_t *dlat, const ghc_tensor_t *drows);
int ghc_cpu_unpatchify(ghc_tensor_t *out, const ghc_tensor_t *rows);
int ghc_cpu_unpatchify_bwd(ghc_tensor_t *drows, const ghc_tensor_t *dout);
int ghc_cpu_mse_loss(ghc_tensor_t *loss, ghc_tensor_t *grad, const ghc_tensor_t *pred, const ghc_tensor_t *target);
/* model inputs (since API 14; timestep_embedding in kernels/cpu/rope.c, pad_rows in kernels/cpu/patch.c) */
int ghc_cpu_timestep_embedding(ghc_tensor_t *out, const ghc_tensor_t *t, bool cos_first, double max_period);
int ghc_cpu_pad_rows(ghc_tensor_t *y, const ghc_tensor_t *x, const ghc_tensor_t *mask);
/* text encoder (since API 16; kernels/cpu/text.c) */
int ghc_cpu_embedding(ghc_tensor_t *y, const ghc_tensor_t *table, const ghc_tensor_t *ids);
int ghc_cpu_rel_pos_bias(ghc_tensor_t *bias, const ghc_tensor_t *table, int32_t num_buckets, int32_t max_distance,
                         bool bidirectional);
int ghc_cpu_attention_bias_fwd(ghc_tensor_t *o, const ghc_tensor_t *q, const ghc_tensor_t *k, const ghc_tensor_t *v,
                               const ghc_tensor_t *bias, const ghc_tensor_t *key_mask, float scale);
/* optimizer updates (kernels/cpu/optim.c) */
int ghc_cpu_adamw(struct ghc_optim_tensor *ts, int32_t n, const struct ghc_adamw_args *args);
int ghc_cpu_automagic(struct ghc_optim_tensor *ts, int32_t n, const struct ghc_automagic_args *args);

/* convolution / VAE (since API 16; kernels/cpu/conv.c). conv3d gets the geometry with the strides
 * made >= 1; with a residual it is conv3d_add. */
int ghc_cpu_conv3d(ghc_tensor_t *y, const ghc_tensor_t *x, const ghc_tensor_t *cache, const ghc_tensor_t *w,
                   const ghc_tensor_t *bias, const ghc_tensor_t *residual, const struct ghc_conv3d *args);
/* with silu: channel_rmsnorm_silu */
int ghc_cpu_channel_rmsnorm(ghc_tensor_t *y, const ghc_tensor_t *x, const ghc_tensor_t *gamma, bool silu);
int ghc_cpu_channel_affine(ghc_tensor_t *y, const ghc_tensor_t *x, const ghc_tensor_t *scale,
                           const ghc_tensor_t *shift);
int ghc_cpu_upsample2x(ghc_tensor_t *y, const ghc_tensor_t *x);
int ghc_cpu_copy_frames(ghc_tensor_t *dst, int64_t dst_t, const ghc_tensor_t *src, int64_t src_t, int64_t n);
int ghc_cpu_frame_attention(ghc_tensor_t *o, const ghc_tensor_t *qkv, float scale);
int ghc_cpu_clamp(ghc_tensor_t *y, const ghc_tensor_t *x, float lo, float hi);
int ghc_cpu_avg_down3d(ghc_tensor_t *y, const ghc_tensor_t *x, int32_t ft, int32_t fs);
int ghc_cpu_dup_up3d(ghc_tensor_t *y, const ghc_tensor_t *x, int32_t ft, int32_t fs, int32_t drop);
/* patchify, or (un) unpatchify */
int ghc_cpu_vae_patch(ghc_tensor_t *y, const ghc_tensor_t *x, int32_t p, bool un);

/* ---- internal helpers (kernels/cpu/) ------------------------------------------------------ */

/* v rounded to dtype dt and back (what a store then a load gives). */
static inline float ghc_cpu_round(enum ghc_dtype dt, float v)
{
    unsigned char tmp[4];
    ghc_cpu_store(tmp, dt, 0, v);
    return ghc_cpu_load(tmp, dt, 0);
}

/* Tensor element access by tensor. */
#define GHC_CPU_GET(t, i) ghc_cpu_load(ghc_tensor_cdata(t), ghc_tensor_dtype(t), (i))
#define GHC_CPU_SET(t, i, v) ghc_cpu_store(ghc_tensor_data(t), ghc_tensor_dtype(t), (i), (v))

/* A new f32 copy of all elements of t (malloc; the caller frees), or NULL with GHC_ENOMEM
 * set on t's core. */
float *ghc_cpu_f32_copy(const ghc_tensor_t *t, const char *op);

/* Index into a broadcast operand b (ops.h rule: a's shape, [D], or [B, D]) for element i of
 * a tensor with `numel` elements, last dim D and leading dim B. */
struct ghc_cpu_bcast {
    int     mode;        /* 0: same shape, 1: [D], 2: [B, D] */
    int64_t D, per_sample;
};
struct ghc_cpu_bcast ghc_cpu_bcast_init(const ghc_tensor_t *a, const ghc_tensor_t *b);
static inline int64_t ghc_cpu_bcast_index(const struct ghc_cpu_bcast *bc, int64_t i)
{
    switch (bc->mode) {
    case 1:  return i % bc->D;
    case 2:  return (i / bc->per_sample) * bc->D + i % bc->D;
    default: return i;
    }
}

#endif /* GHC_KERNELS_CPU_H */
