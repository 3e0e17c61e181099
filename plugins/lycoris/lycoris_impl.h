/* lycoris_impl.h: the lycoris network plugin's internal types, shared by lycoris.c (config,
 * targets, parameters, dropout, plugin glue), algo.c with algo_lora.c, algo_loha.c, algo_lokr.c
 * and algo_dora.c (forward and backward of LoRA, LoHa, LoKr and DoRA on the ops of ops.h, one
 * code path for CPU and CUDA), file.c (adapter files: key names, save, load), merge.c (an
 * adapter file read for merging) and estimate.c (the memory estimate). Never installed;
 * tests/test_lycoris.c links these sources to reach the factorization and the key mapping
 * directly. Formulas: doc/lycoris.md. */
#ifndef GHC_LYCORIS_IMPL_H
#define GHC_LYCORIS_IMPL_H

#include <gh200core/network.h>   /* defines: struct ghc_network_ops, ghc_param, targets */
#include <gh200core/ops.h>       /* defines: ghc_op_*, ghc_tensor_t */
#include <gh200core/safetensors.h>   /* defines: ghc_st_t */

#define LYC_MAX_EXPERTS 8
#define LYC_MAX_PARAMS  4        /* tensors per module */
#define LYC_WS_SLOTS    20       /* scratch buffers */
#define LYC_HKEEP       16       /* LoRA H = X A^T kept from a forward for the backward: entries
                                  * (a block's targets with room to spare) */

enum lyc_algo { LYC_LORA = 0, LYC_LOHA, LYC_LOKR };

enum lyc_format { LYC_FMT_COMFYUI = 0, LYC_FMT_MUSUBI, LYC_FMT_DIFFUSERS };
#define LYC_N_FORMATS 3

/* The tools whose Wan LoRA loaders take a file (lyc_loaders): a bit each. */
enum lyc_tool { LYC_TOOL_COMFYUI = 1, LYC_TOOL_MUSUBI = 2, LYC_TOOL_DIFFUSERS = 4 };

/* Metadata key of a DoRA file: what its dora_scale is divided by. "base_weight" (what we write):
 * the row norms of the frozen W, as ComfyUI's weight_decompose divides it (so the stored value
 * is g (|W_o| + eps) / (|W_o + dW_o| + eps)); "adapted_weight" or absent: the row norms of
 * W + delta-W (LyCORIS, peft, the magnitude g we train). */
#define LYC_DORA_NORM_KEY "gh200core.dora_norm"

/* Parameter slots per algorithm (p[] of struct lyc_module):
 *   lora: 0 lora_down [r, in] (A), 1 lora_up [out, r] (B)
 *   loha: 0 hada_w1_a [out, r], 1 hada_w1_b [r, in], 2 hada_w2_a [out, r], 3 hada_w2_b [r, in]
 *   lokr: 0 lokr_w1 [a, c] or lokr_w1_a [a, r], 1 -- or lokr_w1_b [r, c],
 *         2 lokr_w2 [b, d] or lokr_w2_a [b, r], 3 -- or lokr_w2_b [r, d]  (unused slots NULL)
 *   lora with DoRA: 2 dora_scale [out, 1] (g, the magnitude per output row) */
struct lyc_module {
    int32_t        target;          /* index into the model's targets */
    ghc_tensor_t  *hc;              /* K-concatenation: the H its forward wrote in step hc_step
                                     * (for the recomputation), or NULL */
    int64_t        hc_step;
    const void    *hc_x;            /* ... from the input at this address (a model may run a linear
                                     * over row chunks of its input, each its own forward) */
    const char    *name;            /* official name "blocks.0.self_attn.q" (the model's) */
    const char    *alias;           /* diffusers name or NULL (the model's) */
    int64_t        in, out;
    enum lyc_algo  algo;
    int32_t        rank;
    double         alpha;           /* the alpha in effect (user alpha, or r; LoKr both-full: r) */
    float          scale;           /* s = alpha / r (alpha / sqrt(r) with rs_lora) */
    float          alpha_saved;     /* the file's alpha tensor: alpha r / r_f, so that a loader's
                                     * alpha / rank gives s; both-full LoKr: b // a (LyCORIS's
                                     * defensive value) */
    int64_t        a, b, c, d;      /* LoKr: W1 [a, c], W2 [b, d]; out = a b, in = c d */
    bool           w1_lr, w2_lr;    /* LoKr: factor stored as two low-rank tensors */
    ghc_tensor_t  *p[LYC_MAX_PARAMS], *g[LYC_MAX_PARAMS];   /* f32 on the network's device */
    ghc_tensor_t  *mask;            /* rank dropout: [out] f32 output-row mask of this step, or NULL */
    bool           dropped;         /* module dropout: skipped in this step */
    bool           dora;            /* weight decomposition (LoRA, output axis): g in p[2] */
    int32_t        expert;          /* the expert whose frozen weight DoRA normalises */
    bool           dora_base;       /* merge: p[2] holds a file's dora_scale divided by the base
                                     * weight's row norms (LYC_DORA_NORM_KEY "base_weight") */
    float         *wn2;             /* DoRA: host [out] squared row norms of the frozen W */
    float         *bias;            /* DoRA: host [out] frozen bias, or NULL */
};

struct lyc_expert {
    bool               attached;
    struct lyc_module *mods;
    int32_t            n_mods;
    int32_t           *by_target;   /* [n_targets]: module index or -1 */
    int32_t            n_targets;
    struct ghc_param  *params;
    int32_t            n_params;
    char              *names;       /* storage of the params' names */
};

struct lyc_override {               /* "pattern:rank[:alpha]" */
    char   *pattern;
    int32_t rank;
    double  alpha;                  /* < 0: unset */
};

/* H = X A^T of a LoRA module's last forward, for its backward in the same step (algo_lora.c). */
struct lyc_hkeep {
    const struct lyc_module *md;    /* NULL: free */
    const void              *x;     /* the forward's X (its data) */
    int64_t                  n;     /* its rows */
    int64_t                  step;  /* net->step then */
    uint64_t                 stamp; /* when written (the oldest goes first) */
    bool                     valid; /* H written */
    ghc_tensor_t            *buf;   /* [n, rank] f32, grown on demand */
};

struct lycoris {
    ghc_core_t         *core;
    enum lyc_algo       algo;
    int32_t             rank;
    double              alpha;          /* 0: unset (= rank) */
    bool                rs_lora;
    int64_t             factor;
    bool                decompose_both, full_matrix;
    double              rank_dropout, module_dropout;
    bool                rank_dropout_scale;
    int                 preset;         /* 0 attn, 1 attn_ffn, 2 full */
    const char        **include, **exclude;
    int                 n_include, n_exclude;
    struct lyc_override *ov;
    int                 n_ov;
    enum lyc_format     format;         /* the file ghc_network_save names */
    enum lyc_format     extra[LYC_N_FORMATS];   /* extra_formats: more files beside it */
    int                 n_extra;
    enum ghc_dtype      save_dtype;
    const char         *title;
    uint64_t            seed;
    int                 device;
    int64_t             step;
    struct lyc_expert   ex[LYC_MAX_EXPERTS];
    ghc_tensor_t       *ws[LYC_WS_SLOTS];   /* scratch, grown on demand */
    struct lyc_hkeep    hk[LYC_HKEEP];      /* LoRA: H kept from the forward for the backward */
    uint64_t            hk_clock;
    int64_t             hk_hits;            /* backward calls that took H from hk (for tests) */
    int64_t             hc_hits;            /* concat recomputations that took H from md->hc (tests) */
    int32_t             hook_expert;        /* the expert whose hook hook() handed out last */
    bool                dora;               /* dora_wd */
    bool                fold;               /* key fold: plan fold on LoRA (the user's numerical choice) */
    bool                overwrite;          /* within lyc_forward(write = true): write y, not add to it */
    ghc_model_t        *model;              /* the run's model (DoRA's frozen weights), or NULL */
    float              *hbuf;               /* DoRA: host scratch */
    size_t              hbuf_len;
};

/* ---- lycoris.c ------------------------------------------------------------------------------- */

/* (m, n) = LyCORIS's factorization(d, f): m n = d, m <= n. With f > 0 dividing d: {f, d / f};
 * else divisors are tried upwards, none above f (f < 0: no bound), until the pair passes
 * sqrt(d). */
void lyc_factorization(int64_t d, int64_t f, int64_t *m, int64_t *n);
/* "lora", "loha", "lokr". Static. */
const char *lyc_algo_name(enum lyc_algo a);
/* The file suffix of parameter slot i of module md (NULL: unused slot). Static. */
const char *lyc_param_suffix(const struct lyc_module *md, int i);

/* ---- algo*.c: the adapters' math ------------------------------------------------------------ */

/* The members of the hook (model.h, struct ghc_adapter_hook) for one module; x [.., in], y and
 * dy [.., out] f32, dx f32 or NULL. Return 0 or GHC_E* (the hook turns 0 into 1).
 * lyc_forward: y += the module's part, or y = it (write; not DoRA, whose output is not a sum).
 * lyc_backward: dx += the input gradient (accumulate), or dx = it (not accumulate: LoRA
 *   without DoRA only, the plan's backward_writes), and the parameter gradients. LoRA without
 *   DoRA takes its products from g (dy in x's dtype) where given, like the model's own dx
 *   GEMM; the others from dy. */
int lyc_forward(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *x, ghc_tensor_t *y, bool write,
                void *stream);
int lyc_backward(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *x, const ghc_tensor_t *dy,
                 const ghc_tensor_t *g, ghc_tensor_t *dx, bool accumulate, void *stream);
/* The fold member for a LoRA module: wf = w + s B A in w's dtype (wf may be w). Returns 1, or
 * GHC_E*. The grads member: dB += s G^T H, dA += (s G B)^T X with H = X A^T, G = g (dy in f32
 * or x's dtype); returns 0 or GHC_E*. */
int lyc_fold(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *w, ghc_tensor_t *wf, void *stream);
int lyc_grads(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *x, const ghc_tensor_t *g, void *stream);
/* K-concatenation (model.h, concat_forward and concat_backward) of a LoRA module without DoRA
 * or rank dropout: the forward writes H = s X A^T into h and B into wcols (the weight's
 * dtype), and keeps a copy of H for the recomputation (again: writes that copy instead of a
 * GEMM over X). The backward, with h still holding H, writes G = dy in g's dtype (rounded to
 * nearest even), dH = s G B into dh and A into wrows, and accumulates dB += G^T H,
 * dA += dH^T X; G, dH and dB from one read of dy where r <= 16 or on the CPU
 * (ghc_op_lora_cast_bwd). x, h, g, dh, wcols, wrows may be column views. Return 1, or GHC_E*. */
int lyc_concat_forward(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *x, ghc_tensor_t *h,
                       ghc_tensor_t *wcols, bool again, void *stream);
int lyc_concat_backward(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *x, const ghc_tensor_t *h,
                        const ghc_tensor_t *dy, ghc_tensor_t *g, ghc_tensor_t *dh, ghc_tensor_t *wrows, void *stream);
/* The module's delta-W (s applied once, multiplier 1) into dw [out, in] f32 on the network's
 * device. Returns 0 or GHC_E*. */
int lyc_delta(struct lycoris *net, struct lyc_module *md, ghc_tensor_t *dw, void *stream);
/* DoRA: read md's frozen W and b (through the model's target_weight), keep its row norms and
 * bias on the host, and set g (p[2]) to the row norms (so the adapter starts as the identity). */
int lyc_dora_init(struct lycoris *net, struct lyc_module *md);
/* The frozen weight of md as an [out, in] tensor of dtype dt on the network's device: a view of
 * the model's tensor, or a copy / dequantisation in scratch (the caller frees the result). */
ghc_tensor_t *lyc_base_weight(struct lycoris *net, struct lyc_module *md, enum ghc_dtype dt, void *stream);
/* Release the scratch buffers (and the kept H). */
void lyc_ws_free(struct lycoris *net);
/* DoRA's dora_scale between what we train and what a file stores (LYC_DORA_NORM_KEY
 * "base_weight"): g (host [out]) becomes g (|W_o| + eps) / (q_o + eps) with to_file, and the
 * inverse without, q_o = |W_o + delta-W_o| with delta-W from the LoRA factors a [r, in] and
 * b [out, r] (the factors as the file holds them) and W the frozen weight whose squared row
 * norms md->wn2 holds. Returns 0 or GHC_E*. */
int lyc_dora_file_scale(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *a, const ghc_tensor_t *b,
                        float *g, bool to_file);
/* Merge md into its frozen weight w (f32 [out, in] on the network's device, in place):
 * W + m delta-W, for DoRA W + m (W_new - W) (ComfyUI's strength semantics),
 * W_new = diag(c) (W + delta-W) with
 * c = g / (|W + delta-W|_o + eps), or with md->dora_base c = g / (|W_o| + eps) (ComfyUI's
 * weight_decompose on the stored value). Sets md->wn2 for DoRA.
 * Returns 0 or GHC_E*. */
int lyc_merge_weight(struct lycoris *net, struct lyc_module *md, ghc_tensor_t *w, float m, void *stream);

/* ---- algo*.c: shared between the algorithm files only ---------------------------------------
 * Helpers each algorithm file uses, and the per-algorithm pieces that algo.c's dispatch,
 * delta-W and merge call. Comments at the definitions. The macros expect a local `rc` and a
 * label `out` (TRY), and the views of V2 / V3 are the caller's to free. */

/* Scratch slots of net->ws (LYC_WS_SLOTS of them). */
enum { WS_H, WS_CAST_W, WS_MASKED, WS_DH, WS_CAST_X, WS_P1, WS_P2, WS_DW, WS_CHUNK, WS_SUM,
       WS_WB, WS_WC, WS_Z, WS_PT, WS_QT, WS_BT, WS_S, WS_VEC, WS_EYE, WS_M };

#define TRY(x) do { if ((rc = (x)) < 0) goto out; } while (0)
#define V2(t, r, c) lyc_view((t), 0, 2, (const int64_t[]){ (r), (c) })
#define V3(t, a, b, c) lyc_view((t), 0, 3, (const int64_t[]){ (a), (b), (c) })
#define DORA_EPS 1.1920929e-07   /* n = q + eps in DoRA's c = g / n */

/* algo.c: scratch, views, casts, GEMMs, rank-dropout masking */
bool lyc_grow(struct lycoris *net, ghc_tensor_t **buf, size_t bytes);
ghc_tensor_t *lyc_ws(struct lycoris *net, int slot, enum ghc_dtype dt, int ndim, const int64_t *shape);
ghc_tensor_t *lyc_view(const ghc_tensor_t *t, int64_t first, int ndim, const int64_t *shape);
ghc_tensor_t *lyc_as_dtype(struct lycoris *net, int slot, const ghc_tensor_t *t, enum ghc_dtype dt, void *stream);
int lyc_gemm(ghc_tensor_t *c, const ghc_tensor_t *a, const ghc_tensor_t *b, bool ta, bool tb, float alpha,
             float beta, void *stream);
int lyc_nomem(struct lycoris *net);
ghc_tensor_t *lyc_out_begin(struct lycoris *net, struct lyc_module *md, ghc_tensor_t *y2, float *beta);
int lyc_out_end(const struct lycoris *net, struct lyc_module *md, ghc_tensor_t *y2, ghc_tensor_t *d, void *stream);
ghc_tensor_t *lyc_grad_in(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *dy2, void *stream);
/* algo_lora.c, algo_loha.c, algo_lokr.c, algo_dora.c: forward and backward on [N, features]
 * views (the dispatch), and the factors delta-W and the merge need */
int lyc_lora_fwd(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *x2, ghc_tensor_t *y2,
                 void *stream);
int lyc_lora_bwd(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *x2, const ghc_tensor_t *dy2,
                 const ghc_tensor_t *g2, ghc_tensor_t *dx2, float dx_beta, void *stream);
bool lyc_loha_kr(const struct lyc_module *md);
int lyc_loha_build(struct lycoris *net, struct lyc_module *md, ghc_tensor_t **p1, ghc_tensor_t **p2,
                   ghc_tensor_t **dw, void *stream);
int lyc_loha_fwd(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *x2, ghc_tensor_t *y2,
                 void *stream);
int lyc_loha_bwd(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *x2, const ghc_tensor_t *dy2,
                 ghc_tensor_t *dx2, void *stream);
int lyc_loha_kr_fwd(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *x2, ghc_tensor_t *y2,
                    void *stream);
int lyc_loha_kr_bwd(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *x2, const ghc_tensor_t *dy2,
                    ghc_tensor_t *dx2, void *stream);
int lyc_lokr_factors(struct lycoris *net, struct lyc_module *md, ghc_tensor_t **w1, ghc_tensor_t **w2,
                     void *stream);
int lyc_lokr_fwd(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *x2, ghc_tensor_t *y2,
                 void *stream);
int lyc_lokr_bwd(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *x2, const ghc_tensor_t *dy2,
                 ghc_tensor_t *dx2, void *stream);
int lyc_dora_coef(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *wx, ghc_tensor_t **qt,
                  ghc_tensor_t **bt, float *v, void *stream);
int lyc_download(struct lycoris *net, const ghc_tensor_t *t, float *v, void *stream);
int lyc_dora_fwd(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *x2, ghc_tensor_t *y2,
                 void *stream);
int lyc_dora_bwd(struct lycoris *net, struct lyc_module *md, const ghc_tensor_t *x2, const ghc_tensor_t *g,
                 ghc_tensor_t *dx2, void *stream);

/* ---- file.c ---------------------------------------------------------------------------------- */

/* The module's name in the file for `format` into buf ("diffusion_model.blocks.0.ffn.0",
 * "lora_unet_blocks_0_ffn_0", "transformer.blocks.0.ffn.net.0.proj"). Returns buf. */
const char *lyc_key_prefix(const struct lyc_module *md, enum lyc_format format, char *buf, size_t len);
/* "comfyui", "musubi", "diffusers". Static. */
const char *lyc_format_name(enum lyc_format f);
/* Save expert's adapter to path in net->format, and one file per extra format beside it
 * (lyc_extra_path). Returns 0 or GHC_E*. */
int lyc_save(struct lycoris *net, int32_t expert, const char *path);
/* The path of the file in extra format f beside `path`: "out.safetensors" -> "out.diffusers.safetensors". */
void lyc_extra_path(const char *path, enum lyc_format f, char *buf, size_t len);
/* Which tools (enum lyc_tool bits) load a file of expert's modules in format f and apply it as
 * trained, by the rules of their Wan loaders (doc/lycoris.md, "Which tool loads which file");
 * for each tool that does not, a reason in why (may be NULL). */
unsigned lyc_loaders(const struct lycoris *net, const struct lyc_expert *e, enum lyc_format f, char *why,
                     size_t len);
/* The adapter tensor suffix `key` ends with ("lora_down.weight", "hada_w1_a", "alpha", ...; the
 * longest that fits after a '.'): *kind 0 LoRA, 1 LoHa, 2 LoKr (= enum lyc_algo), 3 alpha,
 * 4 dora_scale; *slot its parameter slot (-1 for alpha and dora_scale); *prefix_len the length
 * of the module name before the '.'. Returns the suffix (static) or NULL when none fits. */
const char *lyc_suffix_match(const char *key, size_t *prefix_len, int *kind, int *slot);
int lyc_load(struct lycoris *net, int32_t expert, const char *path);
/* Tensor `key` of an adapter file as f32 on the CPU: NULL (message set) when it cannot be read
 * or holds a NaN or an infinity (named with the file, the tensor and the element). */
ghc_tensor_t *lyc_load_finite(ghc_core_t *core, ghc_st_t *st, const char *path, const char *key);

/* ---- merge.c: the merge members (network.h, since API 13) ------------------------------------ */

/* merge_open: `path` read onto the CPU (f32 factors). Tensors with no known adapter suffix are
 * kept as skipped; an incomplete or inconsistent module, a malformed alpha, an input-axis or
 * non-LoRA dora_scale are GHC_EFORMAT / GHC_EUNSUPPORTED naming the tensor. */
int lyc_merge_open(ghc_core_t *core, const char *path, void **adapter);
/* Modules in file order of their first key. */
int32_t lyc_merge_count(void *adapter);
int lyc_merge_module(void *adapter, int32_t i, struct ghc_merge_module *out);
/* w <- W + m delta-W, DoRA: W + m (W_new - W) (lyc_merge_weight). */
int lyc_merge_apply(void *adapter, int32_t i, ghc_tensor_t *w, float multiplier);
const char *lyc_merge_skipped(void *adapter, int32_t i);
void lyc_merge_free(void *adapter);

/* ---- estimate.c: the estimate member (network.h, since API 13) ------------------------------- */

int lyc_estimate(ghc_core_t *core, ghc_cfg_t *cfg, const struct ghc_model_memory *model,
                 struct ghc_network_memory *out);

#endif /* GHC_LYCORIS_IMPL_H */
