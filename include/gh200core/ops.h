/* ops.h: the compute ops the model, adapters and optimizers use (library libgh200core_ops).
 *
 * An op runs on the device of its tensors (all on the CPU, or all on one CUDA device) and
 * takes a stream (a cudaStream_t; NULL for the default stream; ignored on the CPU). On the
 * GPU no op synchronises with the host. Tensors are row-major and contiguous, except the
 * column views (ghc_tensor_view_cols in tensor.h: rows further apart than their length) that
 * the ops below accept where they say so (copy, cast, gemm, attention's o, layernorm_fwd's y,
 * gelu_tanh's y). Every op checks dtypes, shapes and devices first and returns GHC_EINVAL
 * naming the op and the offending tensor; GHC_EUNSUPPORTED for a CUDA tensor in a build without CUDA; GHC_ECUDA
 * for a failed launch. Errors go to the core of the first tensor argument.
 *
 * The CPU versions (kernels/cpu/) are the reference: plain loops, fp32 accumulation (f64
 * where noted). The CUDA versions (kernels/cuda/) match them within per-op tolerances.
 * Float dtypes accepted: f32 and bf16 unless noted; f16 where noted. */
#ifndef GHC_OPS_H
#define GHC_OPS_H

#include <stdio.h>              /* defines: FILE */

#include <gh200core/tensor.h>   /* defines: ghc_tensor_t, enum ghc_dtype */

GHC_BEGIN_DECLS

/* ---- memory ------------------------------------------------------------------------------- */

/* dst = src, same dtype and numel, between any two devices (host<->device copies are
 * asynchronous on `stream`; the host side should be pinned for overlap). Since API 7 dst
 * and/or src may be a column view; both must then have the same last dimension (so the same
 * rows), row r of src going to row r of dst; a view's other columns are left as they were.
 * dst and src must not overlap (unless they are the same tensor). */
GHC_API int ghc_op_copy(ghc_tensor_t *dst, const ghc_tensor_t *src, void *stream);
/* Every element = value (converted to t's dtype with round-to-nearest-even). */
GHC_API int ghc_op_fill(ghc_tensor_t *t, double value, void *stream);
/* Block until the work queued on `stream` of `device` is done (tests, benchmarks, I/O).
 * No-op on the CPU. */
GHC_API int ghc_op_sync(ghc_core_t *core, int device, void *stream);
/* (since API 17) The free and total memory of CUDA device `device` in bytes (cudaMemGetInfo),
 * e.g. to choose a plan that fits it. GHC_EUNSUPPORTED in a build without CUDA, GHC_ECUDA (no
 * such device). */
GHC_API int ghc_op_device_memory(ghc_core_t *core, int device, uint64_t *free_bytes, uint64_t *total_bytes);
/* (since API 18) Measured speeds of CUDA device `device`: *flops, the FLOP/s of a bf16 product
 * of 4096 x 4096 x 4096 through ghc_op_gemm; *h2d_bytes, the bytes/s of a 128 MiB copy from
 * pinned host memory to the device. Each the median of a few timed calls, about 0.1 s in all
 * with 0.2 GB of device and 128 MiB of pinned host memory, freed before it returns; e.g. to
 * tell whether streaming weights hides under compute. Errors as ghc_op_device_memory. */
GHC_API int ghc_op_device_speed(ghc_core_t *core, int device, double *flops, double *h2d_bytes);
/* (since API 18) Where CUDA device `device`'s time goes from ghc_op_profile_start to
 * ghc_op_profile_stop: every kernel, copy and memset from CUPTI's activity records (libcupti.so.13
 * loaded at run time; GHC_CUPTI_LIBRARY names another file). Stop writes to `out` a Markdown
 * report over `steps` steps (per-step figures; title its heading): the wall time, the GPU busy
 * and idle, the time by class (matrix products, attention, convolutions, other kernels, copies
 * by direction, memsets) and the 30 kernels that took the most (out NULL: none, the recording
 * ends). Both synchronise the device.
 * GHC_EUNSUPPORTED without CUDA or without CUPTI, GHC_EIO when writing fails. */
GHC_API int ghc_op_profile_start(ghc_core_t *core, int device);
GHC_API int ghc_op_profile_stop(ghc_core_t *core, int device, FILE *out, int32_t steps, const char *title);

/* ---- casts and random numbers --------------------------------------------------------------- */

/* A counter-based generator (Philox4x32-10). Element i of a call uses counter
 * (offset + i / 4, 0, 0, 0) and lane i % 4 with key (seed low, seed high): the same numbers on
 * CPU and GPU, independent of launch shape. Advance `offset` by ceil(numel / 4) per call.
 * (The 64-bit block number n = offset + i / 4 fills the counter as (lo32(n), hi32(n), 0, 0).) */
struct ghc_rng {
    uint64_t seed;
    uint64_t offset;
};

/* dst = src * scale in dst's dtype, any float dtype to any float dtype (f32, bf16, f16,
 * e4m3, e5m2). rng NULL: round to nearest even. rng set (dst bf16 only): stochastic rounding,
 * rounding up with probability equal to the discarded fraction, using uniform numbers of rng:
 * element i, with r its 32-bit Philox lane (numbering as below), becomes the top 16 bits of
 * bits(f32 value) + (r >> 16); NaN stays NaN, inf stays inf. Since API 7 dst and/or src may
 * be a column view when rng is NULL (stochastic rounding takes dense tensors only); both must
 * then have the same last dimension, row r of src going to row r of dst, and a view's other
 * columns are left as they were. */
GHC_API int ghc_op_cast(ghc_tensor_t *dst, const ghc_tensor_t *src, float scale,
                        const struct ghc_rng *rng, void *stream);
/* Uniform floats in [0, 1) (24 random bits: u32 >> 8 times 2^-24), or normal N(0, 1) by
 * Box-Muller computed in f64 and rounded: pairs (u1, u2) from lanes (0,1) and (2,3) of one
 * Philox output, z0 = sqrt(-2 ln(1 - u1)) cos(2 pi u2), z1 = ... sin(...), with u the 32-bit
 * lane times 2^-32. Element 4b+0 is z0 and 4b+1 is z1 of lanes (0,1) of block b; 4b+2 and
 * 4b+3 are z0, z1 of lanes (2,3). `t` is f32 or bf16 (rounded from f32 to nearest even, so a
 * bf16 uniform can be 1.0). */
GHC_API int ghc_op_rand_uniform(ghc_tensor_t *t, const struct ghc_rng *rng, void *stream);
GHC_API int ghc_op_rand_normal(ghc_tensor_t *t, const struct ghc_rng *rng, void *stream);
/* The raw Philox4x32-10 output block for (counter, key): out[4]. For tests. */
GHC_API void ghc_philox4x32(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]);

/* ---- GEMM --------------------------------------------------------------------------------- */

enum ghc_epilogue {
    GHC_EPI_NONE = 0,       /* C = alpha op(A) op(B) + beta C */
    GHC_EPI_BIAS,           /* ... + bias (broadcast over rows) */
    GHC_EPI_BIAS_GELU,      /* gelu_tanh(alpha op(A) op(B) + bias); beta must be 0 */
};

struct ghc_gemm {
    bool                trans_a;   /* op(A) = A^T: A stored [K, M] instead of [M, K] */
    bool                trans_b;   /* op(B) = B^T: B stored [N, K] instead of [K, N] (nn.Linear) */
    float               alpha;     /* 0 is taken as 1 (so a zeroed struct is a plain product) */
    float               beta;      /* C's old value counts beta times (0: C is only written) */
    enum ghc_epilogue   epilogue;
    const ghc_tensor_t *bias;      /* [N], f32 or bf16, for the BIAS epilogues */
    ghc_tensor_t       *pre_gelu;  /* optional, BIAS_GELU: the value before gelu, like C */
    float               scale_a;   /* fp8 operands: dequantisation scales (0 is taken as 1) */
    float               scale_b;
};

/* C[M, N] = op(A)[M, K] op(B)[K, N] with fp32 accumulation. A and B: both f32, both bf16,
 * or both f8_e4m3 (with scale_a, scale_b); C: f32 or bf16 (f8: C bf16 or f32). Batched
 * (strided) when A, B or C has 3 dims [batch, rows, cols]: a 2-D operand is shared by all
 * batches (a weight); C must then be 3-D. A linear layer y = x W^T + b is
 * (a = x [M, in], b = W [out, in], trans_b = true, epilogue BIAS). A, B and C may be column
 * views (ghc_tensor_view_cols, since API 6: rows further apart than their length, e.g. a
 * K-concatenated [x | H] or a slice of a wider output) when they are f32 or bf16: A and B
 * with any epilogue (since API 7; API 6: NONE only), C with any epilogue since API 20 (before:
 * NONE only; C's other columns are left as they were); pre_gelu and bias are dense. */
GHC_API int ghc_op_gemm(ghc_tensor_t *c, const ghc_tensor_t *a, const ghc_tensor_t *b,
                        const struct ghc_gemm *args, void *stream);

/* ---- LoRA in the model's own GEMMs (K-concatenation, model.h; since API 8) ---------------------
 * For a linear y = x W^T whose GEMMs take [x | H] [W | B]^T and [g | dH] [W ; A] (H = s x A^T,
 * dH = s g B): the products of a rank-r LoRA with the factors a [r, K] and b [M, r], and the
 * factors' copies into the weight's spare room, in as few passes as the data allows. x, h, g,
 * dh, dy and the spare-room tensors may be column views (rows further apart); a and b are
 * dense, f32 or x's dtype, and are rounded to x's (g's) dtype before they multiply. fp32
 * accumulation; on CUDA the sums' order is fixed, so repeated calls agree bit for bit. */

/* The forward: h = scale x a^T, x [.., K] and h [.., r] (N rows) f32 or bf16 alike; keep
 * (optional, dense, like h) gets a copy of h; with x NULL, h = keep instead (the recomputation
 * of a checkpointed block: the H its forward kept). wcols (optional, with b) = b in wcols's
 * dtype (f32 or bf16, [M, r]). CUDA: one pass over x (bf16, r <= 16, K a multiple of 8,
 * 16-byte aligned rows; one thread per output otherwise). */
GHC_API int ghc_op_lora_fwd(ghc_tensor_t *h, ghc_tensor_t *keep, const ghc_tensor_t *x, const ghc_tensor_t *a,
                            float scale, ghc_tensor_t *wcols, const ghc_tensor_t *b, void *stream);
/* The backward at the output, from one read of dy: g = dy in g's dtype (round to nearest even),
 * then from that rounded g: dh = scale g b and db += g^T h. dy [.., M] f32 or bf16 and g [.., M]
 * (N rows) f32 or bf16; h and dh [.., r] (N rows) in g's dtype; b [M, r]; db [M, r] f32 dense.
 * wrows (optional, with a [r, K]) = a in wrows's dtype (f32 or bf16). g, dh, db and wrows must
 * not overlap the inputs. CUDA: one pass over dy (bf16 g, r <= 16, M a multiple of 4, 16-byte
 * aligned rows; the cast and one thread per output otherwise). */
GHC_API int ghc_op_lora_cast_bwd(ghc_tensor_t *g, ghc_tensor_t *dh, ghc_tensor_t *db, const ghc_tensor_t *dy,
                                 const ghc_tensor_t *h, const ghc_tensor_t *b, float scale, ghc_tensor_t *wrows,
                                 const ghc_tensor_t *a, void *stream);

/* ---- attention ---------------------------------------------------------------------------- */

/* O = softmax(scale Q K^T) V per batch and head, non-causal, no mask.
 * q: [B, Lq, H, Dh], k and v: [B, Lk, H, Dh], o: like q; all f32 or all bf16; Dh <= 256 and
 * even (128 for Wan; smaller in tests). lse: [B, H, Lq] f32, the natural-log log-sum-exp of
 * each row of scale Q K^T (saved for the backward). Softmax statistics in fp32.
 * Since API 7 o may also be [B, Lq, H Dh], dense or a column view: one row per token (b, i)
 * holding its heads' values in q's order, rows ghc_tensor_row_stride(o) apart (a view's other
 * columns are left as they were). The values are the same as with o like q. */
GHC_API int ghc_op_attention_fwd(ghc_tensor_t *o, ghc_tensor_t *lse, const ghc_tensor_t *q,
                                 const ghc_tensor_t *k, const ghc_tensor_t *v, float scale,
                                 void *stream);
/* Gradients from dO, recomputing P from lse: dq like q; dk, dv like k (each may be NULL when
 * not needed; cross-attention needs only dq). Written, not accumulated. o (the forward's
 * output, read) in either form of ghc_op_attention_fwd (since API 7); dout like q. */
GHC_API int ghc_op_attention_bwd(ghc_tensor_t *dq, ghc_tensor_t *dk, ghc_tensor_t *dv,
                                 const ghc_tensor_t *dout, const ghc_tensor_t *q,
                                 const ghc_tensor_t *k, const ghc_tensor_t *v,
                                 const ghc_tensor_t *o, const ghc_tensor_t *lse, float scale,
                                 void *stream);

/* ---- normalisation ------------------------------------------------------------------------ */

/* LayerNorm over the last dim D, biased variance, in fp32:
 *   xhat = (x - mean) / sqrt(var + eps)
 *   y = (xhat * weight + bias) * (1 + scale) + shift
 * weight, bias: [D] or NULL (no affine); shift, scale: the per-sample modulation, [B, D] for
 * x of [B, L, D] (or [D]), or NULL. x: f32 or bf16; y: f32 or bf16, x's shape; since API 7 y may
 * be a column view (x stays dense; y's other columns are left as they were). stats: [rows, 2]
 * f32 (mean, rstd) for the backward, or NULL. */
GHC_API int ghc_op_layernorm_fwd(ghc_tensor_t *y, ghc_tensor_t *stats, const ghc_tensor_t *x,
                                 const ghc_tensor_t *weight, const ghc_tensor_t *bias,
                                 const ghc_tensor_t *shift, const ghc_tensor_t *scale,
                                 float eps, void *stream);
/* Input gradient only (the parameters are frozen): with da = dy (1 + scale) weight,
 *   dx = rstd (da - mean(da) - xhat mean(da xhat)).
 * accumulate: dx += instead of dx =. dx, dy: f32 or bf16. */
GHC_API int ghc_op_layernorm_bwd(ghc_tensor_t *dx, const ghc_tensor_t *dy, const ghc_tensor_t *x,
                                 const ghc_tensor_t *stats, const ghc_tensor_t *weight,
                                 const ghc_tensor_t *scale, bool accumulate, void *stream);
/* RMSNorm over the last dim D (the full model dim for Wan's q/k norms):
 *   y = cast(x rstd) * weight,  rstd = (mean(x^2) + eps)^-1/2   (normalised in fp32, cast to
 * y's dtype, then multiplied, as the official code does). weight [D]. rstd: [rows] f32 or NULL. */
GHC_API int ghc_op_rmsnorm_fwd(ghc_tensor_t *y, ghc_tensor_t *rstd, const ghc_tensor_t *x,
                               const ghc_tensor_t *weight, float eps, void *stream);
/* With G = weight dy: dx = rstd G - x rstd^3 mean(x G). */
GHC_API int ghc_op_rmsnorm_bwd(ghc_tensor_t *dx, const ghc_tensor_t *dy, const ghc_tensor_t *x,
                               const ghc_tensor_t *rstd, const ghc_tensor_t *weight, void *stream);

/* ---- position ----------------------------------------------------------------------------- */

/* Wan's 3-D RoPE on x [B, L, H, Dh] with L = f h w tokens in (f, h, w) row-major order.
 * Adjacent pairs (2j, 2j+1) rotate by theta = pos * 10000^(-2j/d_axis); the head dim splits
 * into d_t = Dh - 4 floor(Dh/6) (time), then 2 floor(Dh/6) (height), 2 floor(Dh/6) (width):
 * 44/42/42 for Dh = 128. Angles in f64, rotation in fp32. inverse: rotate by -theta (the
 * backward). y may be x. */
GHC_API int ghc_op_rope(ghc_tensor_t *y, const ghc_tensor_t *x, int64_t f, int64_t h, int64_t w,
                        bool inverse, void *stream);
/* (since API 19) Wan's q and k norms with their RoPE in one pass: the bits of
 * ghc_op_rmsnorm_fwd(y, rstd, x, weight, eps) followed by ghc_op_rope on y's [B, L, heads, Dh]
 * view (in place, not inverse). x and y [B, L, D], D = heads Dh with Dh even, L = f h w. */
GHC_API int ghc_op_rmsnorm_rope_fwd(ghc_tensor_t *y, ghc_tensor_t *rstd, const ghc_tensor_t *x,
                                    const ghc_tensor_t *weight, float eps, int64_t heads, int64_t f, int64_t h,
                                    int64_t w, void *stream);
/* Its backward: the bits of ghc_op_rope(t, dy, inverse) into a t like dy, then
 * ghc_op_rmsnorm_bwd(dx, t, x, rstd, weight); dy is not written. Shapes as above. */
GHC_API int ghc_op_rmsnorm_rope_bwd(ghc_tensor_t *dx, const ghc_tensor_t *dy, const ghc_tensor_t *x,
                                    const ghc_tensor_t *rstd, const ghc_tensor_t *weight, int64_t heads, int64_t f,
                                    int64_t h, int64_t w, void *stream);

/* ---- patches --------------------------------------------------------------------------------- */

/* Wan's 2x2 spatial patches. A latent is [B, C, F, H, W] with H and W even; its rows are
 * [B, L, 4 C'] with L = F (H/2) (W/2) tokens (fi, hi, wi) row-major, and k = kh * 2 + kw the
 * position in the patch: latent element (b, c, fi, 2 hi + kh, 2 wi + kw) is row b * L +
 * (fi (H/2) + hi) (W/2) + wi. Pure permutations: each element is read as f32 and written once
 * in the destination's dtype (f32 or bf16; sources any float dtype), so CPU and GPU agree
 * bit for bit. No operand may alias another. */

/* Patchify for the patch embedding (the Conv3d weight [D, C, 1, 2, 2] flattened to [D, 4 C]):
 * the channels of lat [B, Cl, F, H, W] then those of cond [B, Cc, F, H, W] (NULL: Cc = 0;
 * the I2V concatenation noisy 16 + mask/image 20) form C = Cl + Cc, and channel c at k goes to
 * column c * 4 + k of rows [B, L, 4 C]. */
GHC_API int ghc_op_patchify(ghc_tensor_t *rows, const ghc_tensor_t *lat, const ghc_tensor_t *cond,
                            void *stream);
/* Its backward for the first Cl channels: dlat [B, Cl, F, H, W] element (c, k) = drows
 * [B, L, 4 C] column c * 4 + k, C >= Cl (the columns of channels >= Cl, cond's, are not read). */
GHC_API int ghc_op_patchify_bwd(ghc_tensor_t *dlat, const ghc_tensor_t *drows, void *stream);
/* Unpatchify of the head's output: out [B, C, F, H, W] element (c, k) = rows [B, L, 4 C]
 * column k * C + c (channel fastest). */
GHC_API int ghc_op_unpatchify(ghc_tensor_t *out, const ghc_tensor_t *rows, void *stream);
/* Its backward: drows [B, L, 4 C] column k * C + c = dout [B, C, F, H, W] element (c, k). */
GHC_API int ghc_op_unpatchify_bwd(ghc_tensor_t *drows, const ghc_tensor_t *dout, void *stream);

/* ---- activations -------------------------------------------------------------------------- */

/* gelu_tanh(z) = 0.5 z (1 + tanh(sqrt(2/pi) (z + 0.044715 z^3))); y may be x. Since API 7
 * y may be a column view like x (x dense; y's other columns are left as they were), which
 * must not overlap x: in place only on dense tensors. */
GHC_API int ghc_op_gelu_tanh(ghc_tensor_t *y, const ghc_tensor_t *x, void *stream);
/* dx = dy gelu_tanh'(x) (x: the pre-activation). */
GHC_API int ghc_op_gelu_tanh_bwd(ghc_tensor_t *dx, const ghc_tensor_t *dy, const ghc_tensor_t *x,
                                 void *stream);
/* silu(z) = z sigmoid(z), and its backward. */
GHC_API int ghc_op_silu(ghc_tensor_t *y, const ghc_tensor_t *x, void *stream);
GHC_API int ghc_op_silu_bwd(ghc_tensor_t *dx, const ghc_tensor_t *dy, const ghc_tensor_t *x,
                            void *stream);

/* ---- elementwise -------------------------------------------------------------------------- */

/* Broadcasting in the binary ops below: b has a's shape, or is [D] (the last dim of a), or is
 * [B, D] for a of [B, ..., D] (one row per sample: modulation vectors and gates). */

/* y = alpha a + beta b. y may be a. */
GHC_API int ghc_op_add(ghc_tensor_t *y, const ghc_tensor_t *a, const ghc_tensor_t *b,
                       float alpha, float beta, void *stream);
/* y = a * b. y may be a. */
GHC_API int ghc_op_mul(ghc_tensor_t *y, const ghc_tensor_t *a, const ghc_tensor_t *b, void *stream);
/* The gated residual x += y * gate (gate NULL: x += y). x f32 (the residual stream); y f32 or
 * bf16; gate like b above. Its backward is dx += g (identity) and dy = g * gate (ghc_op_mul). */
GHC_API int ghc_op_gated_residual(ghc_tensor_t *x, const ghc_tensor_t *y, const ghc_tensor_t *gate,
                                  void *stream);
/* (since API 19) The same into another tensor: out = x + y * gate (gate NULL: x + y), the same
 * bits as copying x to out and ghc_op_gated_residual(out, y, gate), in one pass. out f32 like x;
 * out may be x. */
GHC_API int ghc_op_gated_residual_to(ghc_tensor_t *out, const ghc_tensor_t *x, const ghc_tensor_t *y,
                                     const ghc_tensor_t *gate, void *stream);
/* y = alpha x (y may be x). */
GHC_API int ghc_op_scale(ghc_tensor_t *y, const ghc_tensor_t *x, float alpha, void *stream);

/* ---- reductions and losses ---------------------------------------------------------------- */

/* out (a 1-element f32 tensor) = sum or mean of all elements of x, accumulated in f64 on the
 * CPU and in fp32 pairwise/tree order on the GPU. */
GHC_API int ghc_op_sum(ghc_tensor_t *out, const ghc_tensor_t *x, void *stream);
GHC_API int ghc_op_mean(ghc_tensor_t *out, const ghc_tensor_t *x, void *stream);
/* out[j] = sum over rows of x[rows, D] (x viewed as 2-D over its last dim): bias gradients. */
GHC_API int ghc_op_sum_rows(ghc_tensor_t *out, const ghc_tensor_t *x, void *stream);
/* loss (1-element f32) = mean((pred - target)^2) over all elements; grad (like pred, or
 * NULL) = 2 (pred - target) / numel. pred and target f32 or bf16. */
GHC_API int ghc_op_mse_loss(ghc_tensor_t *loss, ghc_tensor_t *grad, const ghc_tensor_t *pred,
                            const ghc_tensor_t *target, void *stream);

/* ---- model inputs (since API 14) ------------------------------------------------------------
 * The small per-step inputs a diffusion model builds from a batch, on the model's device so
 * that a forward queues them without a host round trip. */

/* The sinusoidal timestep embedding: out [B, dim] f32 from t [B] (any float dtype, read as
 * f32), with half = floor(dim / 2) and, in f64 (as the official Wan code),
 *   a = t[b] * pow(max_period, -k / half)   (k < half; t unscaled, no frequency shift)
 *   cos_first: out[b, k] = cos(a), out[b, half + k] = sin(a); else sin first, then cos;
 * each rounded to f32 (nearest even); an odd dim's last column is 0. The CPU computes this with
 * the C library's pow, cos and sin; CUDA's f64 pow, sin and cos may differ from them in the
 * last bit of the f64 value, so (rarely) an element differs by 1 ulp of f32. */
GHC_API int ghc_op_timestep_embedding(ghc_tensor_t *out, const ghc_tensor_t *t, bool cos_first, double max_period,
                                      void *stream);
/* Rows of x zero-padded to y's length, dropping masked rows: x [B, Lx, D] (any float dtype),
 * y [B, Ly, D] (f32 or bf16) with Lx <= Ly, mask (optional) B Lx elements of any float dtype
 * (e.g. [B, Lx]). Row (b, r) of y = row (b, r) of x in y's dtype (nearest even) where r < Lx
 * and mask (b, r) is not 0 (NaN counts as not 0); every other row is 0. (A text embedding
 * padded to the model's context length, as a host loop over the mask would.) No operand may
 * alias another. */
GHC_API int ghc_op_pad_rows(ghc_tensor_t *y, const ghc_tensor_t *x, const ghc_tensor_t *mask, void *stream);

/* ==== text encoder (umT5: plugins/umt5, doc/text-encoder.md; since API 16) =========================
 * The ops of a T5-family encoder that the ops above lack: the token embedding lookup, T5's
 * relative-position bias and attention with an additive bias and a key padding mask. On the
 * CPU and on CUDA (kernels/cuda/text.cu, since API 16: the embedding and the bias bit-identical
 * to the CPU; attention as batched cuBLASLt GEMMs around an f32 softmax, P rounded to q's dtype
 * before P V, so bf16 agrees with the CPU within bf16's precision). */

/* y[i, :] = table[ids[i], :] in y's dtype (nearest even). ids: I32 or I64, n elements (any
 * shape); table [V, D] any float dtype; y f32 or bf16 with n rows of D (e.g. [n, D]). An id
 * outside [0, V) is GHC_EINVAL naming its position on the CPU; CUDA cannot see device ids
 * without a synchronisation and writes that row as NaN (check ids on the host first). */
GHC_API int ghc_op_embedding(ghc_tensor_t *y, const ghc_tensor_t *table, const ghc_tensor_t *ids, void *stream);

/* T5's bucket of the relative position r = key - query (transformers'
 * _relative_position_bucket): bidirectional, half the buckets (nb = num_buckets / 2) per
 * direction, (r > 0) nb + f(|r|); else (causal) f(max(-r, 0)) over all num_buckets = nb. With
 * exact = nb / 2: f(n) = n for n < exact, else min(nb - 1, exact + trunc(logf(n / exact) /
 * (float)ln(max_distance / exact) * (nb - exact))) in f32 as PyTorch computes it. For the
 * umT5 defaults (32, 128, bidirectional) f(n) is n below 8, 8 at 8-11, ..., 15 from 91. */
GHC_API int32_t ghc_rel_pos_bucket(int64_t r, int32_t num_buckets, int32_t max_distance, bool bidirectional);
/* bias[h, i, j] = table[ghc_rel_pos_bucket(j - i, ...), h]: bias [H, Lq, Lk] f32, table
 * [num_buckets, H] any float dtype (a layer's relative_attention_bias). */
GHC_API int ghc_op_rel_pos_bias(ghc_tensor_t *bias, const ghc_tensor_t *table, int32_t num_buckets,
                                int32_t max_distance, bool bidirectional, void *stream);

/* O = softmax_j(scale Q K^T + bias) V per batch and head, non-causal, keys j with key_mask 0
 * left out (probability exactly 0; a query whose keys are all masked gets O = 0). q [B, Lq, H,
 * Dh], k and v [B, Lk, H, Dh], all f32 or all bf16, any Dh >= 1; o like q, or [B, Lq, H Dh]
 * dense. bias: [H, Lq, Lk] f32 shared by the batch, or NULL. key_mask: B Lk elements of any
 * float dtype (e.g. [B, Lk]; 0 = padding), or NULL. Scores in fp32 (sums in f64 on the CPU). T5 does
 * not scale (scale 1). o must not overlap the inputs. */
GHC_API int ghc_op_attention_bias_fwd(ghc_tensor_t *o, const ghc_tensor_t *q, const ghc_tensor_t *k,
                                      const ghc_tensor_t *v, const ghc_tensor_t *bias,
                                      const ghc_tensor_t *key_mask, float scale, void *stream);
/* ==== end text encoder ========================================================================== */
/* ==== convolution / VAE (since API 16) ===========================================================
 * The ops of the Wan video VAEs (doc/vae.md): video tensors are [B, C, T, H, W] (batch,
 * channels, frames, height, width), dense, f32 or bf16 (read as f32, fp32 accumulation, written
 * in the output's dtype); weights f32 or bf16. No operand may alias another unless an op says so.
 * CUDA kernels too (kernels/cuda/vae.cu): conv3d runs through cuDNN's convolution (loaded at run
 * time; bf16 activations, fp32 accumulation, channels-last inside) where it is available, else
 * on an implicit GEMM of exact fp32 products; frame_attention through cuBLASLt GEMMs. */

/* Geometry of ghc_op_conv3d. A zeroed struct is a stride-1 convolution without padding. */
struct ghc_conv3d {
    int32_t stride_t, stride_h, stride_w;   /* 0 is taken as 1 */
    int32_t pad_t;                          /* frames in front of x (causal: none behind) */
    int32_t pad_top, pad_bottom;            /* zero rows above and below each frame */
    int32_t pad_left, pad_right;            /* zero columns left and right */
};

/* The causal 3-D convolution of the Wan VAEs (CausalConv3d, and with kT = 1 the per-frame
 * Conv2d): y = conv(w, s) + bias over the sequence s = [pad_t front frames, x], where the front
 * frames are zeros except the last c, which are the frames of `cache` (the feature cache: the
 * previous chunk's last input frames; NULL: c = 0; c <= pad_t). Spatially x is zero-padded by
 * pad_top/bottom/left/right. x [B, Ci, T, H, W]; cache [B, Ci, c, H, W] or NULL; w [Co, Ci, kT,
 * kH, kW] (PyTorch's Conv3d layout; a Conv2d weight is kT = 1); bias [Co] or NULL; y [B, Co, To,
 * Ho, Wo] with To = (pad_t + T - kT) / stride_t + 1, Ho = (H + pad_top + pad_bottom - kH) /
 * stride_h + 1, Wo likewise, each at least 1. Wan's k3 conv is pad_t 2 and 1 on each side; its
 * downsampling Conv2d is stride 2 with pad_bottom = pad_right = 1 (ZeroPad2d(0, 1, 0, 1)). */
GHC_API int ghc_op_conv3d(ghc_tensor_t *y, const ghc_tensor_t *x, const ghc_tensor_t *cache,
                          const ghc_tensor_t *w, const ghc_tensor_t *bias, const struct ghc_conv3d *args,
                          void *stream);
/* (since API 19) ghc_op_conv3d with a residual added in the same pass (the Wan residual blocks'
 * and attention's y = conv(...) + x): exactly ghc_op_conv3d(y, ...) followed by ghc_op_add(y, y,
 * residual, 1, 1), the convolution rounded to y's dtype before the addition as that pair stores
 * it, but y is written once. residual: y's shape and dtype, not y itself. */
GHC_API int ghc_op_conv3d_add(ghc_tensor_t *y, const ghc_tensor_t *x, const ghc_tensor_t *cache,
                              const ghc_tensor_t *w, const ghc_tensor_t *bias, const ghc_tensor_t *residual,
                              const struct ghc_conv3d *args, void *stream);
/* The channel RMS norm of the Wan VAEs (RMS_norm: F.normalize over the channels, times sqrt(C)
 * and gamma): at every position of x [B, C, ...] (2 to 5 dims),
 *   y[b, c, ...] = x[b, c, ...] / max(||x[b, :, ...]||_2, 1e-12) * sqrt(C) * gamma[c]
 * with the norm in fp32. gamma: C elements (any shape, e.g. [C, 1, 1, 1]). y like x; y may be x. */
GHC_API int ghc_op_channel_rmsnorm(ghc_tensor_t *y, const ghc_tensor_t *x, const ghc_tensor_t *gamma,
                                   void *stream);
/* (since API 19) SiLU after the channel RMS norm in one pass (the pre-activation of the Wan
 * residual blocks and heads): exactly ghc_op_channel_rmsnorm(y, x, gamma) followed by
 * ghc_op_silu(y, y), the norm rounded to y's dtype before the SiLU as that pair stores it, but
 * y is written once. The operands and errors of ghc_op_channel_rmsnorm; y may be x. */
GHC_API int ghc_op_channel_rmsnorm_silu(ghc_tensor_t *y, const ghc_tensor_t *x, const ghc_tensor_t *gamma,
                                        void *stream);
/* y = x * scale[c] + shift[c] over the channel dim of x [B, C, ...] (2 to 5 dims): the latent
 * normalisation of the VAEs. scale, shift: C elements each (f32 or bf16), shift may be NULL.
 * y like x; y may be x. */
GHC_API int ghc_op_channel_affine(ghc_tensor_t *y, const ghc_tensor_t *x, const ghc_tensor_t *scale,
                                  const ghc_tensor_t *shift, void *stream);
/* Nearest-neighbour x2 in H and W: y[b, c, t, 2h + i, 2w + j] = x[b, c, t, h, w] (i, j in
 * {0, 1}; PyTorch's "nearest" and "nearest-exact" agree at factor 2). x [B, C, T, H, W], y
 * [B, C, T, 2H, 2W]. */
GHC_API int ghc_op_upsample2x(ghc_tensor_t *y, const ghc_tensor_t *x, void *stream);
/* Copy frames [src_t, src_t + n) of src to [dst_t, dst_t + n) of dst, both [B, C, *, H, W] with
 * the same B, C, H, W and dtype: slicing a clip into chunks, joining chunk outputs, feature-cache
 * updates. dst may be src (the frames move as by memmove). n = 0 does nothing. */
GHC_API int ghc_op_copy_frames(ghc_tensor_t *dst, int64_t dst_t, const ghc_tensor_t *src, int64_t src_t,
                               int64_t n, void *stream);
/* The single-head spatial attention of the VAEs' middle blocks, per frame: qkv [B, 3C, T, H, W]
 * holds q (channels [0, C)), k ([C, 2C)) and v ([2C, 3C)) for the N = H W tokens of each frame
 * (token index h W + w, one of dimension C);
 *   o[b, :, t, token i] = sum_j softmax_j(scale q_i . k_j) v_j        (no mask)
 * o [B, C, T, H, W]. Scores and softmax in fp32, one row at a time (no N x N matrix). */
GHC_API int ghc_op_frame_attention(ghc_tensor_t *o, const ghc_tensor_t *qkv, float scale, void *stream);
/* y = min(max(x, lo), hi) elementwise (NaN stays NaN); any shape; y like x; y may be x. */
GHC_API int ghc_op_clamp(ghc_tensor_t *y, const ghc_tensor_t *x, float lo, float hi, void *stream);
/* The Wan2.2 VAE's parameter-free stage shortcuts (spec encoders.md 3.3). With phi = ft fs fs:
 * AvgDown3D: x [B, Ci, T, H, W] gets (ft - T % ft) % ft zero frames in front (x'), then
 *   y[b, o, t, i, j] = mean over k < g of x'[b, e / phi, t ft + it, i fs + ih, j fs + iw]
 * with e = o g + k, e % phi = (it fs + ih) fs + iw and g = Ci phi / Co (a whole number);
 * y [B, Co, ceil(T / ft), H / fs, W / fs] (H, W multiples of fs). */
GHC_API int ghc_op_avg_down3d(ghc_tensor_t *y, const ghc_tensor_t *x, int32_t factor_t, int32_t factor_s,
                              void *stream);
/* DupUp3D: with r = Co phi / Ci (a whole number),
 *   y[b, o, t ft + it - drop, h fs + ih, w fs + iw] = x[b, ((o ft + it) fs + ih) fs + iw) / r, t, h, w]
 * for x [B, Ci, T, H, W], y [B, Co, T ft - drop, H fs, W fs]; drop (0 <= drop < ft) leaves out
 * the first frames (the first chunk drops ft - 1). */
GHC_API int ghc_op_dup_up3d(ghc_tensor_t *y, const ghc_tensor_t *x, int32_t factor_t, int32_t factor_s,
                            int32_t drop, void *stream);
/* The Wan2.2 VAE's patches of p x p pixels (spec encoders.md 3.2; the column offset r is the
 * slower index): patchify x [B, C, F, H, W] -> y [B, C p p, F, H / p, W / p],
 *   y[b, (c p + r) p + q, f, i, j] = x[b, c, f, i p + q, j p + r]
 * and unpatchify its inverse (y [B, C, F, H p, W p] from x [B, C p p, F, H, W]). */
GHC_API int ghc_op_vae_patchify(ghc_tensor_t *y, const ghc_tensor_t *x, int32_t p, void *stream);
GHC_API int ghc_op_vae_unpatchify(ghc_tensor_t *y, const ghc_tensor_t *x, int32_t p, void *stream);
/* ==== end convolution / VAE ==================================================================== */

/* ==== optimizer updates (the adamw and automagic plugins) ========================================
 * Multi-tensor fused updates: one call updates n parameter tensors (each with its gradient and
 * state) in one launch on the GPU (a chunked list of tensors, no host synchronisation), or in
 * loops on the CPU. All tensors of a call are on one device. Gradients are f32 or bf16; params
 * f32, or bf16 updated in f32 and written back by stochastic rounding with the tensor's `rng`
 * (element i uses Philox lane i as in ghc_op_cast). State tensors are f32 unless noted. */
struct ghc_optim_tensor {
    ghc_tensor_t       *param;
    const ghc_tensor_t *grad;      /* param's numel */
    ghc_tensor_t       *state[6];  /* per op, below */
    struct ghc_rng      rng;       /* bf16 params only */
};

/* AdamW as torch.optim.AdamW (single-tensor path), per element, with the scalars below
 * computed by the caller in f64 and rounded to f32 (as PyTorch passes Python floats):
 *   p = p * decay;  m = fma(beta1_comp, g - m, m);  v = fma(beta2_comp * g, g, v * beta2);
 *   p = p + (-step_size * m) / (sqrt(v) / bc2_sqrt + eps).
 * state[0] = m (exp_avg), state[1] = v (exp_avg_sq), both like param. */
struct ghc_adamw_args {
    float decay;        /* 1 - lr * weight_decay */
    float beta1_comp;   /* 1 - beta1 */
    float beta2;
    float beta2_comp;   /* 1 - beta2 */
    float bc2_sqrt;     /* sqrt(1 - beta2^k), k the tensor's step count */
    float eps;
    float step_size;    /* lr / (1 - beta1^k) */
};
/* One step count for all tensors of a call (k above): the caller groups tensors by k. */
GHC_API int ghc_op_adamw(struct ghc_optim_tensor *ts, int32_t n, const struct ghc_adamw_args *args,
                         void *stream);

/* Automagic v1 (doc/optimizers.md), per tensor P of numel N:
 *   state[0]: R, f32 P.shape[:-1] (ndim >= 2; C x B rows), or S, f32 like P (ndim < 2)
 *   state[1]: C, f32 P.shape[:-2] + P.shape[-1:] (ndim >= 2), else NULL
 *   state[2]: the lr mask: U8 int8 codes (non-negative, scale in state[3][0]) or f32 values
 *   state[3]: f32 [2]: the int8 mask's scale (read and written), mean of the new lr (written)
 *   state[4]: last polarity, I32 [ceil(N / 32)] bit words (bit i % 32 of word i / 32)
 *   state[5]: scratch, I32 [ceil(N / 32)] (agreement bits between the passes; where one CUDA
 *             kernel steps a tensor whole, it keeps them on chip and leaves this as it was)
 * The means and norms accumulate in f64 on the CPU and in f32 tree order on the GPU (both
 * deterministic). min_lr must be >= 0. */
struct ghc_automagic_args {
    float beta2;
    float beta2_comp;     /* 1 - beta2 */
    float eps;            /* added to g^2 */
    float clip;           /* clip_threshold */
    float lr_bump;
    float min_lr;
    float max_lr;
    float weight_decay;   /* 0: none */
};
GHC_API int ghc_op_automagic(struct ghc_optim_tensor *ts, int32_t n, const struct ghc_automagic_args *args,
                             void *stream);
/* ==== end optimizer updates ==================================================================== */

GHC_END_DECLS

#endif /* GHC_OPS_H */
