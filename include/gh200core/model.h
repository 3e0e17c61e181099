/* model.h: the model plugin interface: a diffusion transformer with a frozen base, one or
 * more experts (Wan2.2 A14B: high-noise and low-noise), named adapter targets, and
 * forward/backward of a batch at given timesteps with adapter hooks on the targets. */
#ifndef GHC_MODEL_H
#define GHC_MODEL_H

#include <gh200core/plugin.h>   /* defines: ghc_core_t, ghc_cfg_t, ghc_tensor_t */

GHC_BEGIN_DECLS

/* A linear layer adapters may attach to. Strings belong to the model instance. */
struct ghc_model_target {
    const char *name;        /* official naming: "blocks.3.self_attn.q" */
    const char *alias;       /* diffusers naming: "blocks.3.attn1.to_q" (may be NULL) */
    int64_t     in_features;
    int64_t     out_features;
    int32_t     block;       /* transformer block index, -1 outside blocks */
};

/* One batch. Tensors are borrowed for the call; any float dtype, on the model's device or on
 * the CPU (the model moves what it needs). */
struct ghc_model_batch {
    ghc_tensor_t *noisy;       /* x_sigma, [B, C, F, H, W] */
    ghc_tensor_t *timesteps;   /* t = 1000 sigma, [B] */
    ghc_tensor_t *text_embed;  /* [B, L, text_dim], L <= 512; the model zero-pads to 512 rows */
    ghc_tensor_t *text_mask;   /* [B, L] (float) or NULL: rows where it is 0 count as padding */
    ghc_tensor_t *cond;        /* NULL, or channels appended after noisy's up to the model's input
                                  channels (Wan2.2 I2V: [B, 20, F, H, W] = mask 4 + image latent 16) */
};

/* ---- adapters on the model's linears ----
 * The network installs a hook; the model never calls it itself: it runs each of its frozen
 * linears through ghc_linear_forward / ghc_linear_backward (linear.h), and the core decides
 * from the hook's plan of the target how the adapter's part joins the model's GEMM. Tensors
 * are borrowed for the call and [B, rows, features]: rows = the video tokens, or the text
 * context rows for a linear whose input is the context (Wan: cross_attn.k and .v).
 *
 * What the network can do on one target (hook member plan). The caller sets struct_size =
 * sizeof(struct ghc_adapter_plan) and zeroes the rest; the network fills at most struct_size
 * bytes (members are only ever appended). */
struct ghc_adapter_plan {
    uint32_t struct_size;
    bool     adapted;          /* the target has an adapter; false: no other member is called on it */
    bool     forward_writes;   /* forward may be asked to write its part (write = true) */
    bool     backward_writes;  /* backward may be asked to write dx (accumulate = false) */
    bool     fold;             /* fold and grads run this target: delta-W folded into the GEMM's weight.
                                * A numerical choice (the sum is rounded to the weight's dtype), so it is
                                * the user's: a network sets it only where its config asks */
    int32_t  concat_rank;      /* r > 0: the part is a rank-r product s (x A^T) B^T that concat_forward
                                * and concat_backward give (K-concatenation); 0: not this target */
};

/* Every member returns 1 when it did its work, 0 when the target has nothing to add in this
 * step (e.g. module dropout: the buffers it would write are untouched), or GHC_E* with a
 * message (ghc_error_set). x is the linear's input in the model's GEMM operand dtype (bf16, or
 * f32). With gradient checkpointing a block's forward runs again right before its backward,
 * with the same inputs: the hook must then give the same results (seed any dropout per step). */
struct ghc_adapter_hook {
    uint32_t struct_size;      /* required: sizeof(struct ghc_adapter_hook) */
    void *user;
    /* required; asked once per target when the hook is installed. Returns 1 (or 0) or GHC_E*. */
    int (*plan)(void *user, int32_t target, struct ghc_adapter_plan *out);
    /* required; y (f32): add the adapter's part to it (write false: y holds x W^T + b of the
     * frozen linear), or write it (write true, only where plan.forward_writes: y's old content is
     * ignored and the model's GEMM adds its product to it afterwards). */
    int (*forward)(void *user, int32_t target, const ghc_tensor_t *x, ghc_tensor_t *y, bool write, void *stream);
    /* required; dy (f32) = d loss / d y, g: dy in x's dtype (the operand of the model's own dx
     * GEMM) or NULL; dx (f32): add the adapter's input gradient to it (accumulate true), or write
     * it (false, only where plan.backward_writes); NULL where the model needs no input gradient
     * (a linear over a constant: Wan's text context). Accumulates the adapter's own parameter
     * gradients. Called once per target per model backward, blocks in reverse order, or once
     * per row chunk where the model runs a linear over chunks of its rows (Wan's FFN: each
     * chunk's x its rows of the whole input, its forward or recomputation before its backward);
     * what a hook keeps from a forward for a backward it keys by x's address and rows, not by
     * the target alone. */
    int (*backward)(void *user, int32_t target, const ghc_tensor_t *x, const ghc_tensor_t *dy,
                    const ghc_tensor_t *g, ghc_tensor_t *dx, bool accumulate, void *stream);
    /* where plan.fold: w is the weight the GEMMs take ([out, in], bf16 or f32, never e4m3), wf a
     * scratch like w or w itself (fold in place). Where it returns 1, wf holds w + delta-W and the
     * GEMMs compute y = x wf^T + b and dx = dy wf; forward and backward are then not called on
     * that GEMM's behalf, grads is. Called in the forward and again in the backward (same step,
     * same result); not where no GEMM takes the weight (a backward without dx: backward is
     * called), nor with e4m3 GEMMs (forward is). */
    int (*fold)(void *user, int32_t target, const ghc_tensor_t *w, ghc_tensor_t *wf, void *stream);
    /* where plan.fold: the backward of a folded target: the parameter gradients from x and g
     * (dy in x's dtype, or f32 where x is f32). Returns 1 or GHC_E*. */
    int (*grads)(void *user, int32_t target, const ghc_tensor_t *x, const ghc_tensor_t *g, void *stream);
    /* where plan.concat_rank = r > 0 and the model keeps r spare columns after the linear's input
     * and after its weight's rows ([out, in + r]), and r spare rows after the weight: the GEMMs
     * compute y = [x | H] [W | B]^T + b and dx = [g | dH] [W ; A], with H = s x A^T and
     * dH = s g B. forward, backward, fold and grads are then not called on the target.
     * concat_forward: x [B, rows, in], h [B, rows, r] (column view), wcols [out, r] (the weight's
     *   spare columns, its dtype): write H into h and B into wcols. again: the recomputation
     *   (checkpointing) of a forward of this step with the same x.
     * concat_backward: after concat_forward returned 1 on the same input in this step: x and h
     *   as there (h holds H), dy (f32), g [B, rows, out] (a view to write: dy in x's dtype,
     *   rounded to nearest even), dh [B, rows, r] and wrows [r, in] (the weight's spare rows):
     *   write g, dH into dh and A into wrows, and accumulate dB += g^T H, dA += dH^T x. Also
     *   called on a linear without an input gradient (no GEMM then reads g, dh or wrows). */
    int (*concat_forward)(void *user, int32_t target, const ghc_tensor_t *x, ghc_tensor_t *h, ghc_tensor_t *wcols,
                          bool again, void *stream);
    int (*concat_backward)(void *user, int32_t target, const ghc_tensor_t *x, const ghc_tensor_t *h,
                           const ghc_tensor_t *dy, ghc_tensor_t *g, ghc_tensor_t *dh, ghc_tensor_t *wrows,
                           void *stream);
};

/* What a model takes as input (input_spec, since API 11), so that the trainer can check every
 * sample of the dataset before it writes anything and name both the sample's file and the
 * setting the model's number came from. The caller sets struct_size = sizeof(struct
 * ghc_model_input) and zeroes the rest; the model fills what it knows (members are only ever
 * appended: a model copies at most struct_size bytes). Strings belong to the model instance
 * (valid until its free); each names where its number came from, e.g.
 * "model.random.in_channels at train.cfg:12" or "patch_embedding.weight of the checkpoint
 * /models/x.safetensors (model.checkpoint at train.cfg:3)". */
struct ghc_model_input {
    uint32_t    struct_size;
    int64_t     channels;        /* C of batch.noisy: the latent's channels (I2V's cond apart) */
    int64_t     cond_channels;   /* C of batch.cond, the channels appended after noisy's (0: none) */
    int64_t     text_dim;        /* the last dim of batch.text_embed */
    int64_t     text_len;        /* the most rows batch.text_embed may have */
    int64_t     patch[3];        /* F, H and W of the latent must be multiples of these */
    const char *channels_from;   /* where channels and cond_channels came from */
    const char *text_dim_from;
    const char *text_len_from;
    const char *patch_from;
};

/* The adapter module names that may stand for one tensor of a base checkpoint (merge_names,
 * since API 13): `gh200core merge` compares each module of an adapter file
 * (struct ghc_merge_module in network.h) with them. The caller sets struct_size = sizeof(struct
 * ghc_merge_names) and zeroes the rest; the model fills at most struct_size bytes. */
#define GHC_MERGE_NAMES_MAX 8
struct ghc_merge_names {
    uint32_t struct_size;
    int32_t  n;                                  /* names given; 0: no adapter merges into it */
    char     name[GHC_MERGE_NAMES_MAX][256];     /* "blocks.0.self_attn.q", "blocks.0.attn1.to_q" */
    bool     underscored[GHC_MERGE_NAMES_MAX];   /* name[i] writes '.' as '_' (musubi-tuner's
                                                  * lora_unet_ names: "blocks_0_self_attn_q") */
};

/* Adapter targets of one shape (struct ghc_model_memory). */
struct ghc_target_shape {
    int64_t in_features;
    int64_t out_features;
    int64_t count;                               /* targets of this shape per expert */
};
#define GHC_MODEL_MEMORY_SHAPES 16

/* (since API 14) One checkpointing mode of a model (struct ghc_model_memory): the settings of
 * the model's section that select it and the figures of struct ghc_model_memory that change. */
struct ghc_model_mode {
    char     set[96];             /* "key=value" pairs, space-separated: "checkpointing=block" */
    uint64_t activations;         /* what the forward keeps (saved included): activations_ckpt,
                                   * or activations_full without checkpointing */
    uint64_t saved;               /* as saved */
    uint64_t saved_unit;          /* as saved_unit */
};
#define GHC_MODEL_MEMORY_MODES 8

/* What a training run of a model will take (estimate, since API 13), for `gh200core estimate`:
 * bytes as the model allocates them for the batch and tokens asked. The caller sets
 * struct_size = sizeof(struct ghc_model_memory) and zeroes the rest; members are only ever
 * appended: a model fills at most struct_size bytes. */
struct ghc_model_memory {
    uint32_t struct_size;
    int32_t  experts;             /* 1, or the experts of a mixture (Wan2.2 A14B: 2) */
    int32_t  checkpoint_every;    /* 0: no gradient checkpointing; k >= 1: with it, as configured */
    uint64_t weights;             /* the active expert's weights, in the precision they load in */
    uint64_t weights_inactive;    /* the other experts' */
    uint64_t block;               /* one block's weights as loaded: a streaming policy's ring slot */
    uint64_t activations_full;    /* what a training forward keeps, without checkpointing */
    uint64_t activations_ckpt;    /* the same with checkpointing (every checkpoint_every-th block
                                   * recomputed; every block when checkpointing is off) */
    uint64_t backward_scratch;    /* what the backward allocates besides */
    uint64_t text_embeds;         /* the batch's text context, as the model takes it */
    uint64_t latents;             /* the batch's own tensors: noisy latent, output, their gradients */
    int32_t  n_shapes;            /* entries of shapes */
    struct ghc_target_shape shapes[GHC_MODEL_MEMORY_SHAPES];   /* the adapter targets by shape,
                                   * for the network's part (struct ghc_network_memory) */
    char     summary[128];        /* for people: "dim 5120, ffn 13824, 40 blocks, bf16 weights" */
    uint64_t saved;               /* of the activations kept, what goes in saved-activation units
                                   * (GHC_ROLE_SAVED, mempolicy.h: a policy may keep it off the card) */
    uint64_t saved_unit;          /* the largest unit (a policy's ring buffers are this size) */
    char     checkpointing[64];   /* for people: "per block, attention kept"; "" says it from
                                   * checkpoint_every */
    /* (since API 14) for people: where the dims came from: "the checkpoint headers", or a
     * variant's known dims when the files are absent ("" says nothing) */
    char     dims_from[128];
    /* (since API 14) the model's checkpointing modes for the run asked, most memory first
     * (recomputing least), for the plan search of `gh200core estimate --device-memory`; 0: it
     * offers none. mode: the configured one's index. */
    int32_t  n_modes;
    int32_t  mode;
    struct ghc_model_mode modes[GHC_MODEL_MEMORY_MODES];
    /* (since API 17) the latent frames, rows and columns one token covers (Wan: 1, 2, 2), so
     * that a caller turns a latent's shape into `tokens`; 0: 1 */
    int64_t  patch[3];
    /* (since API 17) blocks per expert (offload's resident unit is `block` bytes); 0: weights
     * over block */
    int64_t  blocks;
    /* (since API 18) floating-point operations of one training step for the batch and tokens
     * asked (the forward, the recomputation its checkpointing configures, the backward), and of
     * the forward alone, the adapters left out: for plan = "auto" to weigh a plan's compute
     * against the copies it needs (streamed weights, saved activations). 0: not known. */
    double   flops_step;
    double   flops_forward;
};

struct ghc_model_ops {
    uint32_t struct_size;                 /* required: sizeof(struct ghc_model_ops) */
    const char *name;                     /* required */
    const struct ghc_cfg_key *keys;       /* optional: keys of the [model] section */
    /* required; once per run: reads the checkpoints named in the config. */
    int (*init)(ghc_core_t *core, ghc_cfg_t *cfg, void **self);
    /* required; number of experts (1 for a single model). */
    int32_t (*experts)(void *self);
    /* required; the expert that serves timestep t (0 .. experts-1). */
    int32_t (*expert_for)(void *self, float t);
    /* required; the adapter targets (the same list for every expert). Borrowed until free. */
    int (*targets)(void *self, const struct ghc_model_target **out, int32_t *n);
    /* required; install (or with NULL remove) the adapter hook, used by every later forward
     * and backward (of any expert: install the active expert's hook). The model hands it to its
     * ghc_linears_t (ghc_linears_set_hook, linear.h), which keeps what it needs. */
    int (*set_hook)(void *self, const struct ghc_adapter_hook *hook);
    /* required; prediction of the flow-matching velocity for `batch` with `expert` into `out`
     * ([B, C_out, F, H, W], f32 or bf16, on the model's device or the CPU). keep: keep what
     * backward needs (training); false for inference and validation. */
    int (*forward)(void *self, int32_t expert, const struct ghc_model_batch *batch,
                   ghc_tensor_t *out, bool keep, void *stream);
    /* required; once after a forward with keep: backpropagate dout = d(loss)/d(out) through the
     * frozen base, calling the hook's backward on every target. dnoisy: NULL, or it receives
     * d(loss)/d(batch.noisy) (like batch.noisy; f32 or bf16). */
    int (*backward)(void *self, int32_t expert, const ghc_tensor_t *dout, ghc_tensor_t *dnoisy,
                    void *stream);
    /* optional; make `expert` the active one (placement of the inactive one is the policy's). */
    int (*activate)(void *self, int32_t expert);
    /* optional; once, last. */
    void (*free)(void *self);
    /* optional (since API 3); the device the model computes on: GHC_DEVICE_CPU or a CUDA ordinal.
     * Absent: the CPU. Callers put the batch, the noise and the loss there. */
    int (*device)(void *self);
    /* optional (since API 3); the frozen weight and bias of `target` of `expert` as the model
     * stores them (for DoRA and merging): *w [out, in] in the base dtype (bf16, f32), or e4m3
     * to be multiplied by *w_scale (1 otherwise); *b [out] or NULL (no bias). Borrowed; on
     * the model's device, or wherever its memory policy keeps them (ghc_tensor_device). */
    int (*target_weight)(void *self, int32_t expert, int32_t target, const ghc_tensor_t **w, float *w_scale,
                         const ghc_tensor_t **b);
    /* optional (since API 11); after init, any time: what the model takes (struct
     * ghc_model_input). The trainer checks the dataset's samples against it at the start, so
     * that a latent or text embedding of another shape is an error naming the sample's file
     * and the key behind the model's number, before anything is written; without it the
     * mismatch shows only at the first forward. */
    int (*input_spec)(void *self, struct ghc_model_input *out);
    /* optional (since API 13); plugin-level, no instance (`gh200core estimate` runs before
     * anything is loaded): the memory a training run of the model configured by `cfg` (its
     * section) will take for `batch` samples of `tokens` tokens each (struct
     * ghc_model_memory), from the configuration and at most the checkpoints' headers. */
    int (*estimate)(ghc_core_t *core, ghc_cfg_t *cfg, int64_t batch, int64_t tokens, struct ghc_model_memory *out);
    /* optional (since API 13); plugin-level, no instance and no configuration (`gh200core
     * merge`): the module names an adapter file may give tensor `tensor` of a base checkpoint
     * (its name in the file, prefix and all; ndim and shape as stored): the model's namings
     * and their underscored forms (struct ghc_merge_names); n = 0 for a tensor no adapter
     * merges into. */
    int (*merge_names)(ghc_core_t *core, const char *tensor, int32_t ndim, const int64_t *shape,
                       struct ghc_merge_names *out);
    /* optional (since API 13); after init: the name of `expert` in file names and settings
     * ("high_noise" for Wan2.2 A14B's expert 0), [a-z0-9_] only; borrowed until free. Absent
     * (or NULL): "expert<N>". A single-expert model's files carry no expert name. */
    const char *(*expert_name)(void *self, int32_t expert);
    /* optional (since API 13); after init, any time: the model's architecture as adapter files
     * name it for the tools that load them: SAI ModelSpec's modelspec.architecture without the
     * adapter's "/lora" ("wan2.1": what musubi-tuner writes for Wan2.1 and Wan2.2 DiTs, one
     * layout). A network writes it into its files' metadata, with the metadata the tools expect
     * for that architecture; absent (or NULL): the model claims none, and the files carry no
     * architecture. Borrowed until free. */
    const char *(*architecture)(void *self);
};

/* ---- the run's instance (core wrappers; a NULL optional member is a successful no-op) ---- */

typedef struct ghc_model ghc_model_t;

/* The run's model, or NULL. Borrowed. */
GHC_API ghc_model_t *ghc_model_get(ghc_core_t *core);
/* The wrappers below call the ops of the same name. Those taking an expert check it against
 * ghc_model_experts() first (GHC_EINVAL). Returns 0 or GHC_E*, reason in ghc_error_message. */
GHC_API int32_t ghc_model_experts(ghc_model_t *model);
GHC_API int32_t ghc_model_expert_for(ghc_model_t *model, float t);
/* *out is borrowed from the model; valid until the run is freed. */
GHC_API int ghc_model_targets(ghc_model_t *model, const struct ghc_model_target **out, int32_t *n);
/* Install `hook` (NULL: remove). The model gets the core's copy: the same members (NULL where
 * hook's are), each calling hook's and giving a failure without a message one that names the
 * run's network, the member and the target. hook need not outlive the call. */
GHC_API int ghc_model_set_hook(ghc_model_t *model, const struct ghc_adapter_hook *hook);
GHC_API int ghc_model_forward(ghc_model_t *model, int32_t expert, const struct ghc_model_batch *batch,
                              ghc_tensor_t *out, bool keep, void *stream);
GHC_API int ghc_model_backward(ghc_model_t *model, int32_t expert, const ghc_tensor_t *dout,
                               ghc_tensor_t *dnoisy, void *stream);
GHC_API int ghc_model_activate(ghc_model_t *model, int32_t expert);
GHC_API int ghc_model_device(ghc_model_t *model);
/* The frozen weight (with its dequantisation scale) and bias of a target. GHC_EUNSUPPORTED when
 * the model lacks the member, GHC_EINVAL for an expert or target out of range. */
GHC_API int ghc_model_target_weight(ghc_model_t *model, int32_t expert, int32_t target, const ghc_tensor_t **w,
                                    float *w_scale, const ghc_tensor_t **b);
/* (since API 11) What the model takes as input: out->struct_size must be set; the rest is
 * zeroed and filled by the model. GHC_EUNSUPPORTED (message set) when the model lacks the member. */
GHC_API int ghc_model_input_spec(ghc_model_t *model, struct ghc_model_input *out);
/* (since API 13) The model's name of `expert` (its expert_name, checked: [a-z0-9_], 1 to 63
 * characters), or "expert<N>" without one; "" for an expert out of range. Borrowed until the
 * run is freed. */
GHC_API const char *ghc_model_expert_name(ghc_model_t *model, int32_t expert);
/* (since API 13) The model's architecture (its architecture member), or NULL where it claims
 * none. Borrowed until the run is freed. */
GHC_API const char *ghc_model_architecture(ghc_model_t *model);

/* ---- plugin-level members (core wrappers, no instance; since API 13) ---- */

/* The estimate of model plugin `model` (loaded if needed) for the configuration section `cfg`:
 * out->struct_size must be set; the rest is zeroed and filled by the model. Returns 0 or GHC_E*,
 * reason in ghc_error_message: GHC_ELOAD when the plugin cannot be loaded or registers no model
 * of that name, GHC_EUNSUPPORTED when it lacks the member. */
GHC_API int ghc_model_estimate(ghc_core_t *core, const char *model, ghc_cfg_t *cfg, int64_t batch, int64_t tokens,
                               struct ghc_model_memory *out);
/* The merge_names of model plugin `model` (loaded if needed) for a base checkpoint's tensor:
 * out->struct_size must be set; the rest is zeroed and filled by the model. Returns 0 or
 * GHC_E* as ghc_model_estimate(). */
GHC_API int ghc_model_merge_names(ghc_core_t *core, const char *model, const char *tensor, int32_t ndim,
                                  const int64_t *shape, struct ghc_merge_names *out);

GHC_END_DECLS

#endif /* GHC_MODEL_H */
