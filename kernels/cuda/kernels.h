/* kernels.h: the CUDA kernels behind ops.h (the .cu files in kernels/cuda/), plain C. Same signatures as
 * the ghc_op_* functions plus the stream; called by kernels/ops.c after it has validated
 * dtypes, shapes and devices (all tensors on one CUDA device). Each returns 0 or a
 * cudaError_t (ghc_k_error_string() names it); none synchronises with the host. */
#ifndef GHC_KERNELS_CUDA_H
#define GHC_KERNELS_CUDA_H

#include <gh200core/ops.h>

#include "device.h"   /* defines: ghc_k_device_count, ghc_k_error_string */

GHC_BEGIN_DECLS

/* dst = src between devices (cudaMemcpyAsync with the right kind; cudaMemcpy2DAsync when
 * either is a column view). */
int ghc_k_copy(ghc_tensor_t *dst, const ghc_tensor_t *src, void *stream);
int ghc_k_sync(int device, void *stream);
/* At least `bytes` of device memory of `dev` for work on `stream` (a cudaStream_t), reused
 * across calls and ops on that stream (stream order keeps them apart; growing it synchronises
 * the stream). Returns 0 or a cudaError_t. */
int ghc_k_scratch(int dev, void *stream, size_t bytes, void **out);
/* ghc_op_device_speed: the rate of a bf16 4096^3 product through ghc_k_gemm (FLOP/s) and of a
 * 128 MiB copy from pinned host memory (bytes/s), the medians of a few timed calls on a stream
 * of its own; synchronises. */
int ghc_k_device_speed(ghc_core_t *core, int dev, double *flops, double *h2d);
/* kernels/cuda/profile.cu: ghc_op_profile_start / _stop. Return 0, -1 (the reason in
 * ghc_k_profile_why()) or -2 (writing `out` failed). */
int ghc_k_profile_start(int dev);
int ghc_k_profile_stop(int dev, FILE *out, int32_t steps, const char *title);
const char *ghc_k_profile_why(void);

int ghc_k_fill(ghc_tensor_t *t, double value, void *stream);
int ghc_k_cast(ghc_tensor_t *dst, const ghc_tensor_t *src, float scale, const struct ghc_rng *rng, void *stream);
int ghc_k_rand_uniform(ghc_tensor_t *t, const struct ghc_rng *rng, void *stream);
int ghc_k_rand_normal(ghc_tensor_t *t, const struct ghc_rng *rng, void *stream);
int ghc_k_gemm(ghc_tensor_t *c, const ghc_tensor_t *a, const ghc_tensor_t *b, const struct ghc_gemm *args, void *stream);
/* kernels/cuda/lora.cu */
int ghc_k_lora_fwd(ghc_tensor_t *h, ghc_tensor_t *keep, const ghc_tensor_t *x, const ghc_tensor_t *a, float scale,
                   ghc_tensor_t *wcols, const ghc_tensor_t *b, void *stream);
int ghc_k_lora_cast_bwd(ghc_tensor_t *g, ghc_tensor_t *dh, ghc_tensor_t *db, const ghc_tensor_t *dy,
                        const ghc_tensor_t *h, const ghc_tensor_t *b, float scale, ghc_tensor_t *wrows,
                        const ghc_tensor_t *a, void *stream);
int ghc_k_attention_fwd(ghc_tensor_t *o, ghc_tensor_t *lse, const ghc_tensor_t *q, const ghc_tensor_t *k,
                          const ghc_tensor_t *v, float scale, void *stream);
int ghc_k_attention_bwd(ghc_tensor_t *dq, ghc_tensor_t *dk, ghc_tensor_t *dv, const ghc_tensor_t *dout,
                          const ghc_tensor_t *q, const ghc_tensor_t *k, const ghc_tensor_t *v,
                          const ghc_tensor_t *o, const ghc_tensor_t *lse, float scale, void *stream);
/* Which attention runs (tests and benches; the default is GHC_K_ATTN_AUTO: cuDNN's fused
 * attention where the library loads and takes the problem, our kernels otherwise;
 * GHC_K_ATTN_CUDNN is AUTO that the caller means to check). Returns the previous setting; -1
 * only reads it. */
enum { GHC_K_ATTN_AUTO, GHC_K_ATTN_OWN, GHC_K_ATTN_CUDNN };
int ghc_k_attention_impl(int impl);
/* The path the last attention call took: "cudnn", "wgmma", "mma", "generic" (or "none"). */
const char *ghc_k_attention_last(void);
void ghc_k_attention_note(const char *path);
/* kernels/cuda/attention_cudnn.c: cuDNN's version (e.g. 91900) once loaded, 0 when absent; the
 * paths return 0 done, -1 not taken (the caller runs its own), else a cudaError_t. ldo: o's
 * token stride in elements (dout like q). */
int ghc_k_cudnn_version(void);
/* Why cuDNN declined the last problem it declined ("" when none): the problem, cuDNN's status,
 * the step and its last error message. */
const char *ghc_k_cudnn_why(void);
int ghc_k_cudnn_attention_fwd(ghc_tensor_t *o, ghc_tensor_t *lse, const ghc_tensor_t *q, const ghc_tensor_t *k,
                              const ghc_tensor_t *v, int64_t ldo, float scale, void *stream);
int ghc_k_cudnn_attention_bwd(ghc_tensor_t *dq, ghc_tensor_t *dk, ghc_tensor_t *dv, const ghc_tensor_t *dout,
                              const ghc_tensor_t *q, const ghc_tensor_t *k, const ghc_tensor_t *v,
                              const ghc_tensor_t *o, int64_t ldo, const ghc_tensor_t *lse, float scale,
                              void *stream);
int ghc_k_layernorm_fwd(ghc_tensor_t *y, ghc_tensor_t *stats, const ghc_tensor_t *x, const ghc_tensor_t *weight,
                          const ghc_tensor_t *bias, const ghc_tensor_t *shift, const ghc_tensor_t *scale, float eps, void *stream);
int ghc_k_layernorm_bwd(ghc_tensor_t *dx, const ghc_tensor_t *dy, const ghc_tensor_t *x, const ghc_tensor_t *stats,
                          const ghc_tensor_t *weight, const ghc_tensor_t *scale, bool accumulate, void *stream);
int ghc_k_rmsnorm_fwd(ghc_tensor_t *y, ghc_tensor_t *rstd, const ghc_tensor_t *x, const ghc_tensor_t *weight, float eps, void *stream);
int ghc_k_rmsnorm_bwd(ghc_tensor_t *dx, const ghc_tensor_t *dy, const ghc_tensor_t *x, const ghc_tensor_t *rstd,
                        const ghc_tensor_t *weight, void *stream);
int ghc_k_rope(ghc_tensor_t *y, const ghc_tensor_t *x, int64_t f, int64_t h, int64_t w, bool inverse, void *stream);
int ghc_k_rmsnorm_rope_fwd(ghc_tensor_t *y, ghc_tensor_t *rstd, const ghc_tensor_t *x, const ghc_tensor_t *weight,
                           float eps, int64_t heads, int64_t h, int64_t w, void *stream);
int ghc_k_rmsnorm_rope_bwd(ghc_tensor_t *dx, const ghc_tensor_t *dy, const ghc_tensor_t *x, const ghc_tensor_t *rstd,
                           const ghc_tensor_t *weight, int64_t heads, int64_t h, int64_t w, void *stream);
int ghc_k_patchify(ghc_tensor_t *rows, const ghc_tensor_t *lat, const ghc_tensor_t *cond, void *stream);
int ghc_k_patchify_bwd(ghc_tensor_t *dlat, const ghc_tensor_t *drows, void *stream);
int ghc_k_unpatchify(ghc_tensor_t *out, const ghc_tensor_t *rows, void *stream);
int ghc_k_unpatchify_bwd(ghc_tensor_t *drows, const ghc_tensor_t *dout, void *stream);
int ghc_k_gelu_tanh(ghc_tensor_t *y, const ghc_tensor_t *x, void *stream);
int ghc_k_gelu_tanh_bwd(ghc_tensor_t *dx, const ghc_tensor_t *dy, const ghc_tensor_t *x, void *stream);
int ghc_k_silu(ghc_tensor_t *y, const ghc_tensor_t *x, void *stream);
int ghc_k_silu_bwd(ghc_tensor_t *dx, const ghc_tensor_t *dy, const ghc_tensor_t *x, void *stream);
int ghc_k_add(ghc_tensor_t *y, const ghc_tensor_t *a, const ghc_tensor_t *b, float alpha, float beta, void *stream);
int ghc_k_mul(ghc_tensor_t *y, const ghc_tensor_t *a, const ghc_tensor_t *b, void *stream);
int ghc_k_gated_residual(ghc_tensor_t *out, const ghc_tensor_t *x, const ghc_tensor_t *y, const ghc_tensor_t *gate,
                         void *stream);
int ghc_k_scale(ghc_tensor_t *y, const ghc_tensor_t *x, float alpha, void *stream);
int ghc_k_sum(ghc_tensor_t *out, const ghc_tensor_t *x, bool mean, void *stream);
int ghc_k_sum_rows(ghc_tensor_t *out, const ghc_tensor_t *x, void *stream);
/* kernels/cuda/inputs.cu (since API 14) */
int ghc_k_timestep_embedding(ghc_tensor_t *out, const ghc_tensor_t *t, bool cos_first, double max_period, void *stream);
int ghc_k_pad_rows(ghc_tensor_t *y, const ghc_tensor_t *x, const ghc_tensor_t *mask, void *stream);
/* kernels/cuda/text.cu: the text-encoder ops (umT5; since API 16) */
int ghc_k_embedding(ghc_tensor_t *y, const ghc_tensor_t *table, const ghc_tensor_t *ids, void *stream);
int ghc_k_rel_pos_bias(ghc_tensor_t *bias, const ghc_tensor_t *table, int32_t num_buckets, int32_t max_distance,
                       bool bidirectional, void *stream);
int ghc_k_attention_bias_fwd(ghc_tensor_t *o, const ghc_tensor_t *q, const ghc_tensor_t *k, const ghc_tensor_t *v,
                             const ghc_tensor_t *bias, const ghc_tensor_t *key_mask, float scale, void *stream);
int ghc_k_mse_loss(ghc_tensor_t *loss, ghc_tensor_t *grad, const ghc_tensor_t *pred, const ghc_tensor_t *target, void *stream);
/* kernels/cuda/vae.cu: the convolution / VAE ops (since API 16); ghc_k_conv3d with a residual is
 * conv3d_add. ghc_k_vae_patch is
 * vae_patchify (un false) or vae_unpatchify (un true); ghc_k_channel_rmsnorm with silu is
 * channel_rmsnorm_silu. */
int ghc_k_conv3d(ghc_tensor_t *y, const ghc_tensor_t *x, const ghc_tensor_t *cache, const ghc_tensor_t *w,
                 const ghc_tensor_t *bias, const ghc_tensor_t *residual, const struct ghc_conv3d *args, void *stream);
int ghc_k_channel_rmsnorm(ghc_tensor_t *y, const ghc_tensor_t *x, const ghc_tensor_t *gamma, bool silu, void *stream);
int ghc_k_channel_affine(ghc_tensor_t *y, const ghc_tensor_t *x, const ghc_tensor_t *scale, const ghc_tensor_t *shift,
                         void *stream);
int ghc_k_upsample2x(ghc_tensor_t *y, const ghc_tensor_t *x, void *stream);
int ghc_k_copy_frames(ghc_tensor_t *dst, int64_t dst_t, const ghc_tensor_t *src, int64_t src_t, int64_t n,
                      void *stream);
int ghc_k_frame_attention(ghc_tensor_t *o, const ghc_tensor_t *qkv, float scale, void *stream);
int ghc_k_clamp(ghc_tensor_t *y, const ghc_tensor_t *x, float lo, float hi, void *stream);
int ghc_k_avg_down3d(ghc_tensor_t *y, const ghc_tensor_t *x, int32_t factor_t, int32_t factor_s, void *stream);
int ghc_k_dup_up3d(ghc_tensor_t *y, const ghc_tensor_t *x, int32_t factor_t, int32_t factor_s, int32_t drop,
                   void *stream);
int ghc_k_vae_patch(ghc_tensor_t *y, const ghc_tensor_t *x, int32_t p, bool un, void *stream);
/* Which convolution runs (tests and benches; the default GHC_K_CONV_AUTO: cuDNN's where the
 * library loads and takes the problem (bf16 activations), our implicit GEMM otherwise;
 * GHC_K_CONV_CUDNN is AUTO that the caller means to check). Returns the previous setting; -1
 * only reads it. ghc_k_conv_last: the path of the last conv3d, "cudnn" or "own" ("none"). */
enum { GHC_K_CONV_AUTO, GHC_K_CONV_OWN, GHC_K_CONV_CUDNN };
int ghc_k_conv_impl(int impl);
const char *ghc_k_conv_last(void);
/* kernels/cuda/conv_cudnn.c: cuDNN's convolution; 0 done, -1 not taken (the caller runs its
 * own), else a cudaError_t. ghc_k_cudnn_conv_why: why cuDNN declined the last problem it
 * declined ("" when none). */
int ghc_k_cudnn_conv3d(ghc_tensor_t *y, const ghc_tensor_t *x, const ghc_tensor_t *cache, const ghc_tensor_t *w,
                       const ghc_tensor_t *bias, const ghc_tensor_t *residual, const struct ghc_conv3d *args,
                       void *stream);
const char *ghc_k_cudnn_conv_why(void);
/* Its plan tuning (GHC_CUDNN_TUNE, doc/vae.md): the problems planned with tuning on so far, and
 * of the last one the candidate plans, how many were timed (0 for one candidate), the index
 * chosen (0: the heuristics' first), the mean ms of the chosen and of the first, and the ms
 * spent building and timing them. */
struct ghc_k_cudnn_tune {
    int problems, candidates, timed, chosen;
    float best_ms, first_ms;
    double tune_ms;
};
void ghc_k_cudnn_conv_tune_stats(struct ghc_k_cudnn_tune *out);
/* Its layouts (vae.cu): dst [B, pad_t + T, Hp, Wp, Cp] bf16 from [zero frames, cache, x] with
 * args' spatial padding written out (Hp = pad_top + H + pad_bottom, Wp likewise); dst [Cop, kT,
 * kH, kW, Cip] bf16 from w; y (+ bias) from src [B, To, Ho, Wo, Cp] (bf16 when src_bf16, else
 * f32), then + residual (NULL: none; conv3d_add). Channels beyond the tensors' own are zeros
 * (packing) or skipped (unpacking). */
int ghc_k_conv_pack_x(void *dst, const ghc_tensor_t *x, const ghc_tensor_t *cache, const struct ghc_conv3d *args,
                      int64_t Cp, void *stream);
int ghc_k_conv_pack_w(void *dst, const ghc_tensor_t *w, int64_t Cop, int64_t Cip, void *stream);
int ghc_k_conv_unpack_y(ghc_tensor_t *y, const void *src, int src_bf16, int64_t Cp, const ghc_tensor_t *bias,
                        const ghc_tensor_t *residual, void *stream);
/* optimizer updates (kernels/cuda/optim*.cu) */
int ghc_k_adamw(struct ghc_optim_tensor *ts, int32_t n, const struct ghc_adamw_args *args, void *stream);
int ghc_k_automagic(struct ghc_optim_tensor *ts, int32_t n, const struct ghc_automagic_args *args, void *stream);
/* For bench_optim: while profiling is on, each automagic call synchronises and times its
 * launches. Stores in ms[3] (if not NULL) the mean ms per pass (stats with the finish, update,
 * mask) of the calls since the last call, then resets and turns profiling on or off. */
void ghc_k_automagic_profile(int on, double ms[3]);
/* Whether automagic steps thin tensors (LoRA's A and B) in one thread-block cluster each
 * (k_am_fused; on = 1, the default where the device has clusters) or in the separate passes
 * (on = 0); on = 2: the clusters, taking the new int8 scale after the update always (their
 * fallback). For benchmarks and tests comparing them (bench_optim: GHC_AUTOMAGIC_FUSED=0);
 * later calls make new plans. */
void ghc_k_automagic_fused(int on);
/* Whether k_am_fused's launches (one per group of tensors) run one after another on the
 * caller's stream (on = 1) or on streams of their own beside each other (on = 0, the default).
 * A measurement aid (bench_optim: GHC_AUTOMAGIC_SERIAL=1). */
void ghc_k_automagic_serial(int on);

GHC_END_DECLS

#endif /* GHC_KERNELS_CUDA_H */
