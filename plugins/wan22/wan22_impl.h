/* wan22_impl.h: the wan22 model plugin's internal types and functions, shared by its files:
 * wan22.c (plugin glue, configuration, targets, experts), detect.c (tensor names and shapes,
 * official <-> diffusers names, config detection), load.c (checkpoints and random weights),
 * forward.c and backward.c (the official code's math on the ops of ops.h; doc/wan22.md),
 * stream.c (weights and saved activations through the memory policy), estimate.c (the memory a
 * run will take).
 * Never installed; nothing here crosses the plugin ABI (the plugin exports only its
 * descriptor). tests/test_wan22.c links these sources to check detection without giant files
 * and to read the intermediates of a forward. */
#ifndef GHC_WAN22_IMPL_H
#define GHC_WAN22_IMPL_H

#include <gh200core/linear.h>  /* defines: ghc_linears_t, struct ghc_linear, the model interface */
#include <gh200core/ops.h>     /* defines: ghc_op_*, ghc_tensor_t */

#define WAN22_TEXT_LEN   512      /* context rows the DiT always attends to (zero padded) */
#define WAN22_EPS        1e-6f    /* every LayerNorm and RMSNorm */
#define WAN22_TARGETS    10       /* adapter targets per block */
#define WAN22_PATCH      4        /* patch volume 1 x 2 x 2 */

/* ---- configuration ------------------------------------------------------------------------- */

struct wan22_dims {
    int64_t dim;        /* D */
    int64_t ffn_dim;    /* F */
    int64_t heads;      /* H; head_dim = D / H */
    int64_t layers;     /* N */
    int64_t in_ch;      /* C_in (16, 36 for I2V, 48 for the 5B) */
    int64_t out_ch;     /* C_out */
    int64_t text_dim;   /* 4096 for umT5 */
    int64_t freq_dim;   /* 256 */
};

enum wan22_variant {
    WAN22_CUSTOM = 0,       /* any other shape set (tiny test models) */
    WAN22_A14B_T2V,         /* an A14B T2V expert (same shapes as Wan2.1 T2V-14B) */
    WAN22_A14B_I2V,         /* an A14B I2V expert (C_in 36) */
    WAN22_TI2V_5B,
    WAN21_T2V_1_3B,
};

enum wan22_layout {
    WAN22_LAYOUT_OFFICIAL = 0,   /* official / ComfyUI names */
    WAN22_LAYOUT_DIFFUSERS,      /* diffusers names, with the norm2/norm3 swap */
};

/* One tensor as a file lists it (names may carry a prefix). */
struct wan22_tensor_desc {
    const char    *name;
    int            ndim;
    const int64_t *shape;
};

/* What detection found. */
struct wan22_detected {
    struct wan22_dims   dims;
    enum wan22_variant  variant;
    enum wan22_layout   layout;
    const char         *prefix;   /* "", "model.diffusion_model." or "diffusion_model." (static) */
    bool                fp8_scaled;   /* some weights are F8_E4M3 with a per-tensor scale */
};

/* Where a tensor's values live after loading. */
enum wan22_kind {
    WAN22_T_BASE = 0,   /* the base dtype (bf16/f32): text linears */
    WAN22_T_F32,        /* always f32: biases, norms, modulation, time path, patch embed, head */
    WAN22_T_BLOCK,      /* block linears: the base dtype, or e4m3 with a per-tensor scale (fp8) */
};

/* One expected tensor: official name (no prefix), shape, dtype class, and (when weights are
 * given) the slot it loads into. */
struct wan22_tspec {
    char            name[80];
    int             ndim;
    int64_t         shape[5];
    enum wan22_kind kind;
    ghc_tensor_t  **slot;
    float          *scale;   /* WAN22_T_BLOCK: its dequantisation scale (1 unless fp8) */
};

/* ---- weights ---------------------------------------------------------------------------------- */

/* Target slots within a block, in the order of the model's target list. */
enum wan22_slot {
    WAN22_SA_Q = 0, WAN22_SA_K, WAN22_SA_V, WAN22_SA_O,
    WAN22_CA_Q, WAN22_CA_K, WAN22_CA_V, WAN22_CA_O,
    WAN22_FFN_0, WAN22_FFN_2,
};

struct wan22_block_w {
    ghc_tensor_t *mod;                    /* [1, 6, D] f32 */
    ghc_tensor_t *w[WAN22_TARGETS];       /* [out, in] base dtype, or e4m3 (fp8); with spare room
                                           * for K-concatenation (wan22_pad_cols) [out + pad,
                                           * in + cols]: the weight in the first out rows' first
                                           * in columns (see wan22_wsub) */
    float         wscale[WAN22_TARGETS];  /* w's dequantisation scale (1 unless e4m3) */
    ghc_tensor_t *b[WAN22_TARGETS];       /* [out] f32 */
    ghc_tensor_t *norm_q, *norm_k;        /* self-attn RMSNorm weights [D] f32 */
    ghc_tensor_t *cnorm_q, *cnorm_k;      /* cross-attn RMSNorm weights [D] f32 */
    ghc_tensor_t *norm3_w, *norm3_b;      /* cross-attn pre-norm (official norm3) [D] f32 */
};

struct wan22_weights {                    /* one expert */
    ghc_tensor_t *pe_w, *pe_b;            /* [D, C_in, 1, 2, 2] f32 (used as [D, 4 C_in]), [D] */
    ghc_tensor_t *te0_w, *te0_b;          /* text MLP: [D, text_dim] base, [D] f32 */
    ghc_tensor_t *te2_w, *te2_b;          /* [D, D] base, [D] f32 */
    ghc_tensor_t *t0_w, *t0_b;            /* time MLP: [D, freq_dim] f32, [D] */
    ghc_tensor_t *t2_w, *t2_b;            /* [D, D] f32, [D] */
    ghc_tensor_t *tp_w, *tp_b;            /* time projection [6D, D] f32, [6D] */
    ghc_tensor_t *head_mod;               /* [1, 2, D] f32 */
    ghc_tensor_t *head_w, *head_b;        /* [4 C_out, D] f32, [4 C_out] */
    struct wan22_block_w *blocks;         /* [layers] */
};

/* ---- activations -------------------------------------------------------------------------- */

/* What one block's forward computes (and its backward reads). Shapes for B samples of L
 * tokens; "base" is the GEMM operand dtype. Views (*4) alias the tensor before them. */
struct wan22_act {
    ghc_tensor_t *m[6];                   /* modulation m0..m5 [B, D] f32 */
    ghc_tensor_t *st1, *st3, *st2;        /* LayerNorm stats [B L, 2] f32 */
    ghc_tensor_t *u;                      /* modulated LN1 [B, L, D] base (a column view of up
                                           * when the model keeps spare columns, see wan22_pad_x) */
    ghc_tensor_t *up, *cp, *u2p, *op, *ocp, *gp;   /* u, c, u2, o, oc and g with their spare
                                           * columns (K-concatenation), or NULL */
    ghc_tensor_t *qp, *kp;                /* q, k linear outputs [B, L, D] f32 (v's: v, in base);
                                           * NULL with "block_qkv", which keeps qb and kb instead */
    ghc_tensor_t *qb, *kb;                /* "block_qkv": q, k linear outputs written in base
                                           * [B, L, D], the norms' inputs; else NULL */
    ghc_tensor_t *rq, *rk;                /* RMSNorm rstd [B L] f32 */
    ghc_tensor_t *q, *k, *v, *o;          /* [B, L, D] base (q, k after RoPE) */
    ghc_tensor_t *q4, *k4, *v4;           /* views [B, L, H, Dh] */
    ghc_tensor_t *lse;                    /* [B, H, L] f32 */
    ghc_tensor_t *x1, *x2;                /* residual after self- and cross-attention f32 */
    ghc_tensor_t *c;                      /* affine LN3 [B, L, D] base */
    ghc_tensor_t *qcp, *rqc, *qc, *qc4;   /* cross q: pre-norm f32, rstd, base, view */
    ghc_tensor_t *kcp, *rkc, *kc, *kc4;   /* cross k over the context [B, 512, D] */
    ghc_tensor_t *vcp, *vc, *vc4;
    ghc_tensor_t *oc, *lsec;              /* cross-attention output base, lse [B, H, L] */
    ghc_tensor_t *u2;                     /* modulated LN2 [B, L, D] base */
    ghc_tensor_t *h1;                     /* ffn.0 output (pre-GELU) [B, L, F] base; NULL in the
                                           * slot of the recomputed blocks (and of inference):
                                           * the FFN then runs chunk by chunk through st.fh1 */
    ghc_tensor_t *g;                      /* GELU output [B, L, F] base (whole in every slot: the
                                           * adapter keys what it keeps by its input's address,
                                           * so each chunk's input has its own rows) */
};

/* Backward scratch, one set for all blocks. */
struct wan22_grad {
    ghc_tensor_t *G;                      /* d loss / d residual [B, L, D] f32 */
    ghc_tensor_t *dy;                     /* gated output gradient [B, L, D] f32 */
    ghc_tensor_t *du;                     /* gradient of a linear's input [B, L, D] f32 */
    ghc_tensor_t *dF, *dF2;               /* [ffn_rows, F] f32: one FFN chunk's */
    ghc_tensor_t *cD, *cD4, *cF;          /* casts to base: [B, L, D] (and its view), [ffn_rows, F] */
    ghc_tensor_t *gD, *gF, *gC;           /* K-concatenation: dy cast to base with pad spare
                                           * columns [B, L, D + pad], [ffn_rows, F + pad], and for
                                           * the text rows [B, 512, D + pad], or NULL */
    ghc_tensor_t *dq, *dk, *dv, *dq4, *dk4, *dv4;   /* attention grads base, views (their f32
                                           * gradients before the norms go through dy, one at a
                                           * time) */
    ghc_tensor_t *dkc, *dvc, *dkc4, *dvc4;          /* cross k, v grads [B, 512, D] base */
    ghc_tensor_t *dkcp, *dvcp;            /* f32 */
    ghc_tensor_t *dhead;                  /* head output gradient [B, L, 4 C_out] f32 */
    ghc_tensor_t *dpatch;                 /* patch-embedding input gradient [B, L, 4 C_in] f32 */
};

/* What block i's backward needs from its forward, in one allocation of role GHC_ROLE_SAVED (the
 * policy decides where it lives, mempolicy.h): the block's input x [B, L, D] f32 and, with
 * checkpointing "block_attn" or "block_qkv" for a recomputed block, its self-attention output
 * with the spare columns after it (op, [B, L, D + pad] base; o without them) and log-sum-exp
 * [B, H, L] f32; with "block_qkv" also its q and k linears' outputs before their norms and v,
 * each [B, L, D] base. */
struct wan22_unit {
    ghc_tensor_t *home;                   /* [bytes / 4] f32, role saved */
    size_t        bytes;
    size_t        off_o, off_lse;         /* byte offsets; 0: no attention output kept */
    size_t        off_qb, off_kb, off_v;  /* byte offsets; 0: no q, k, v kept */
};

/* A unit's tensors at the address saved_begin gave (wrappers), between wan22_unit_begin and
 * wan22_unit_end. */
struct wan22_uview {
    bool          open;
    int64_t       unit;
    void         *at;
    ghc_tensor_t *x;
    ghc_tensor_t *op, *o, *lse;           /* with off_o; op NULL when the model keeps no spare columns */
    ghc_tensor_t *qb, *kb, *v, *v4;       /* with off_qb (v4: v's [B, L, H, Dh] view) */
};

/* Everything one forward leaves for the backward. */
struct wan22_state {
    bool              valid;              /* a forward with keep ran; backward may follow */
    bool              keep;               /* the allocation below keeps every block input */
    int32_t           expert;
    int64_t           B, T, Hl, Wl, f, h, w, L;
    int64_t           c_noisy;            /* channels of batch->noisy (C_in minus cond's) */
    ghc_tensor_t     *ctx;                /* text context [B, 512, D] base */
    ghc_tensor_t     *ctxp;               /* K-concatenation: ctx with cross k and v's H in 2 pad
                                           * spare columns [B, 512, D + 2 pad], or NULL */
    ghc_tensor_t     *ctxv;               /* its first D columns (a view) */
    ghc_tensor_t     *ctx_in;             /* padded text embedding [B, 512, text_dim] base */
    ghc_tensor_t     *ctx_h;              /* text MLP hidden [B, 512, D] base */
    ghc_tensor_t     *sinus;              /* [B, freq_dim] f32 */
    ghc_tensor_t     *e, *se, *th;        /* time embedding e, silu(e), hidden [B, D] f32 */
    ghc_tensor_t     *e0[6];              /* [B, D] f32 */
    ghc_tensor_t     *patches;            /* [B, L, 4 C_in] f32 */
    ghc_tensor_t    **xs;                 /* [layers + 1] residual stream f32: with keep xs[i] (i < N)
                                           * views of unit i's home (read them outside a pass only,
                                           * and only where the policy keeps them in place) and
                                           * xs[N] the last block's output; without keep xs[0] and
                                           * xs[1] alternate */
    struct wan22_unit *units;             /* [layers] with keep */
    struct wan22_uview uv[2];             /* the units open now (forward: a block's input and output) */
    ghc_tensor_t     *xalt;               /* with keep: xs[N]'s partner in a forward without keep
                                           * (made on first use) */
    struct wan22_act *acts;               /* [n_acts], see wan22_act_slot() */
    int               n_acts;
    ghc_tensor_t     *hshift, *hscale;    /* head modulation [B, D] f32 */
    ghc_tensor_t     *hst, *hn, *ho;      /* head LN stats, modulated LN f32, output [B, L, 4 C_out] */
    ghc_tensor_t     *y;                  /* a linear's output before a residual [B, L, D] f32
                                           * (nothing backward reads) */
    ghc_tensor_t     *fh1;                /* one FFN chunk's ffn.0 output [ffn_rows, F] base, for
                                           * the slots that keep no h1; or NULL */
    ghc_tensor_t     *xq;                 /* fp8_gemm: e4m3 scratch for a block linear's input,
                                           * the largest of [B, L, F], [B, L, D], [B, 512, D] */
    struct wan22_grad grad;
    bool              grad_ready;
};

/* ---- the instance --------------------------------------------------------------------------- */

struct wan22 {
    ghc_core_t             *core;
    struct wan22_dims       d;
    enum wan22_variant      variant;
    enum ghc_dtype          base;         /* GEMM operand dtype of block and text linears */
    bool                    fp8;          /* block linears stored e4m3, dequantised per GEMM */
    bool                    fp8_gemm;     /* fp8: forward block linears as e4m3 x e4m3 GEMMs, the
                                           * input cast with scale 1 (saturating) into st.xq */
    int                     device;       /* GHC_DEVICE_CPU or a CUDA ordinal */
    bool                    ckpt;         /* gradient checkpointing per block */
    bool                    ckpt_attn;    /* "block_attn" and "block_qkv": a recomputed block's
                                           * self-attention output and lse are kept (saved) and
                                           * not recomputed */
    bool                    ckpt_qkv;     /* "block_qkv": its q, k and v linears' outputs too (the
                                           * recomputation skips those products); every block
                                           * rounds q's and k's to base before their norms */
    int                     ckpt_every;   /* k: with ckpt, block i is recomputed iff i % k == 0 */
    int64_t                 ffn_chunk;    /* the FFN runs on at most this many of the batch's B L
                                           * tokens at once (key ffn_chunk): its [rows, F] tensors
                                           * are that long; wan22_ffn_rows */
    double                  boundary;     /* high-noise expert iff t >= boundary * 1000 */
    int32_t                 n_experts;    /* 1, or 2 (0 = high noise, 1 = low noise) */
    int32_t                 active;
    struct wan22_weights   *experts;
    struct ghc_model_target *targets;
    char                   *target_names; /* storage of the targets' strings */
    int32_t                 n_targets;
    ghc_linears_t          *lin;          /* the linears run by the core, with the network's hook */
    struct wan22_state      st;
    int64_t                 pad;          /* K-concatenation: spare rows and columns a block
                                           * linear keeps for its adapter (key adapter_pad;
                                           * 0: none, also with fp8 weights) */
    bool                    concat;       /* some target concatenates: inputs with spare columns */
    ghc_tensor_t           *twv;          /* target_weight's view of a weight with spare room */
    int                     pad_told;     /* a rank above pad was logged */
    char                    ch_from[1024];   /* input_spec: the setting or file C_in and C_out
                                              * came from, and text_dim's */
    char                    text_from[1024];
};

/* K-concatenation (model.h, concat_rank). Slot j's spare columns of its weight (the q, k and v
 * of self-attention share their input u, whose spare columns hold their three H side by side:
 * their weights keep 3 pad columns, of which each uses its own; cross-attention's k and v share
 * the text context the same way, with 2) and where its H starts after the input's columns. */
static inline int64_t wan22_pad_cols(const struct wan22 *m, int j)
{
    if (!m->pad)
        return 0;
    return j <= WAN22_SA_V ? 3 * m->pad : j == WAN22_CA_K || j == WAN22_CA_V ? 2 * m->pad : m->pad;
}
/* Block linear j's [out, in]. */
static inline void wan22_slot_dims(const struct wan22 *m, int j, int64_t *out, int64_t *in)
{
    *out = j == WAN22_FFN_0 ? m->d.ffn_dim : m->d.dim;
    *in = j == WAN22_FFN_2 ? m->d.ffn_dim : m->d.dim;
}
static inline int64_t wan22_pad_off(const struct wan22 *m, int j)
{
    return j <= WAN22_SA_V ? j * m->pad : j == WAN22_CA_V ? m->pad : 0;
}
/* Target t's linear: its own shape and spare room (struct ghc_linear). */
static inline void wan22_linear_room(const struct wan22 *m, int32_t t, struct ghc_linear *lin)
{
    const int j = t % WAN22_TARGETS;
    wan22_slot_dims(m, j, &lin->out, &lin->in);
    lin->spare_col = lin->in + wan22_pad_off(m, j);
    lin->spare = wan22_pad_cols(m, j) > 0 ? m->pad : 0;
}

/* With checkpointing, is block i recomputed in backward (else its activations are kept)? */
static inline bool wan22_recomputed(const struct wan22 *m, int64_t i)
{
    return m->ckpt && i % m->ckpt_every == 0;
}

#define WAN22_FFN_CHUNK 4096   /* ffn_chunk's default: GEMMs of 4096 rows run at full speed */

/* Rows of an FFN chunk for BL = B L tokens: BL split into the fewest chunks of at most
 * ffn_chunk rows, of equal length (from 64 rows on rounded up to a multiple of 64; the last
 * chunk shorter). */
static inline int64_t wan22_ffn_rows(const struct wan22 *m, int64_t BL)
{
    int64_t n = (BL + m->ffn_chunk - 1) / m->ffn_chunk, rows = (BL + n - 1) / n;
    if (n > 1 && rows >= 64)
        rows = (rows + 63) / 64 * 64;
    return rows < BL ? rows : BL;
}

/* The activation slots a training forward (keep) allocates for N blocks: one per block with
 * checkpointing off; else slot 0, shared by the recomputed blocks, plus one per kept block. */
static inline int64_t wan22_act_slots(const struct wan22 *m, int64_t N)
{
    int64_t k = m->ckpt_every;
    return m->ckpt ? 1 + N - (N + k - 1) / k : N;
}

/* Block i's activation slot in a training forward (keep). */
static inline int64_t wan22_act_slot(const struct wan22 *m, int64_t i)
{
    int64_t k = m->ckpt_every;
    if (!m->ckpt)
        return i;
    return wan22_recomputed(m, i) ? 0 : 1 + i - (i + k - 1) / k;   /* 1 + kept blocks before i */
}

/* ---- detect.c --------------------------------------------------------------------------------- */

/* "A14B T2V expert" etc. Static. */
const char *wan22_variant_name(enum wan22_variant v);
/* The expected tensors for `d`: *out (malloc'ed, caller frees) gets 12 + 27 layers + 3 entries;
 * when `w` is non-NULL (with w->blocks allocated) each entry's slot points into it.
 * Returns 0 or GHC_ENOMEM. */
int wan22_tensor_list(ghc_core_t *core, const struct wan22_dims *d, struct wan22_weights *w,
                      struct wan22_tspec **out, int *n);
/* The diffusers name of an official name (no prefix) into buf. Returns buf. */
const char *wan22_name_diffusers(const char *official, char *buf, size_t len);
/* The official name of a diffusers name (no prefix) into buf, the inverse of
 * wan22_name_diffusers (a name the map does not know is copied). Returns buf. */
const char *wan22_name_official(const char *diffusers, char *buf, size_t len);
/* The model member merge_names (model.h): the module names an adapter may give a base tensor. */
int wan22_merge_names(ghc_core_t *core, const char *tensor, int32_t ndim, const int64_t *shape,
                      struct ghc_merge_names *out);
/* Block indices above this are refused: no Wan model has nearly as many blocks. */
#define WAN22_MAX_BLOCKS 100000
/* The block index that `s` (the text after "blocks.") starts with, parsed without overflow:
 * 1 and *idx when s starts with decimal digits (*end after them), 0 when it starts with none,
 * -1 when the digits are no Wan block index (WAN22_MAX_BLOCKS or more). */
int wan22_block_index(const char *s, int64_t *idx, const char **end);
/* Detect layout, prefix and dimensions from a file's tensor list and check that
 * every expected tensor is present with its expected shape. `what` names the file in
 * messages; `heads` 0 takes D / 128 (D must then be a multiple of 128), else the given head
 * count. Returns 0, or GHC_EFORMAT naming the tensor with the expected and found shape. */
int wan22_detect(ghc_core_t *core, const char *what, const struct wan22_tensor_desc *t, int n,
                 int64_t heads, struct wan22_detected *out);
/* "[5120, 16, 1, 2, 2]" into buf. Returns buf. */
const char *wan22_shape_text(int ndim, const int64_t *shape, char *buf, size_t len);

/* ---- load.c ----------------------------------------------------------------------------------- */

/* Open `path` (a .safetensors file or a sharded .index.json), detect its config and load
 * every tensor into `w` on m->device (m->base for linears, e4m3 block linears with m->fp8, f32
 * for the rest; ComfyUI fp8_scaled weights dequantised, or kept with m->fp8); `role` is the
 * memory role of the weights. When m->d.dim is 0 the detected dims are taken, else they must
 * match (second expert). Returns 0 or GHC_E*. */
int wan22_load(struct wan22 *m, const char *path, int64_t heads, struct wan22_weights *w,
               enum ghc_mem_role role, struct wan22_detected *det);
/* A tensor on the model's device (NULL on error, message set). */
ghc_tensor_t *wan22_tensor(struct wan22 *m, enum ghc_dtype dt, int ndim, const int64_t *shape,
                           enum ghc_mem_role role);
/* Random weights for m->d, seeded, into `w`. Returns 0 or GHC_E*. */
int wan22_random(struct wan22 *m, uint64_t seed, struct wan22_weights *w, enum ghc_mem_role role);
/* K-concatenation: every block linear of `w` moved into storage with spare room (wan22_pad_cols
 * columns, m->pad rows), zeroed; none when m->pad is 0 (also with e4m3 weights). Returns 0 or
 * GHC_E*. */
int wan22_pad_weights(struct wan22 *m, struct wan22_weights *w, enum ghc_mem_role role);
/* Rows [r0, r0 + nr) and columns [c0, c0 + nc) of a weight's storage t (a column view unless
 * whole rows), or NULL (message set). */
ghc_tensor_t *wan22_wsub(struct wan22 *m, const ghc_tensor_t *t, int64_t r0, int64_t nr, int64_t c0, int64_t nc);
/* Release an expert's tensors (NULL-safe). */
void wan22_weights_free(struct wan22 *m, struct wan22_weights *w);
/* Every tensor of an expert, for advise(): calls fn on each. */
int wan22_weights_each(struct wan22 *m, struct wan22_weights *w,
                       int (*fn)(void *user, ghc_tensor_t *t), void *user);

/* ---- forward.c -------------------------------------------------------------------------------- */

int wan22_forward(struct wan22 *m, int32_t expert, const struct ghc_model_batch *batch, ghc_tensor_t *out,
                  bool keep, void *stream);
/* One block's forward from x (f32 [B, L, D]) into xo, filling `a`. xo NULL: not the output (the
 * recomputation before the backward, which needs only `a`: it stops at the FFN's input u2, the
 * backward runs the FFN chunk by chunk). kept: the unit of that recomputation (NULL in a
 * forward): what it keeps (wan22_unit_act put it in `a`) is not computed again: with o, the
 * self-attention's output and lse; with qb, the q, k and v products (their adapters' spare
 * columns are written again). */
int wan22_block_forward(struct wan22 *m, const struct wan22_block_w *bw, int32_t block,
                        const ghc_tensor_t *x, ghc_tensor_t *xo, struct wan22_act *a,
                        const struct wan22_uview *kept, void *stream);
/* One FFN chunk: rows [r0, r0 + n) of the batch's B L tokens, as [1, n, cols] views of the
 * slot's u2 and g (with their spare columns: u2p, gp, or NULL), its h1 (the slot's, or the
 * first n rows of st.fh1) and st.y. */
struct wan22_ffn_rows {
    ghc_tensor_t *u2, *u2p, *h1, *g, *gp, *y;
};
int  wan22_ffn_rows_view(struct wan22 *m, struct wan22_act *a, int64_t r0, int64_t n, struct wan22_ffn_rows *v);
void wan22_ffn_rows_free(struct wan22_ffn_rows *v);
/* Rows [r0, r0 + n) of t ([.., cols] dense, or the first cols of the dense p: mkpad) as
 * [1, n, cols] (*vr) and p's rows as [1, n, p's cols] (*pr; NULL when p is; pr may be NULL when
 * p is). 0 or GHC_ENOMEM. */
int  wan22_rows(struct wan22 *m, ghc_tensor_t *t, ghc_tensor_t *p, int64_t r0, int64_t n, ghc_tensor_t **vr,
                ghc_tensor_t **pr);
/* ffn.0 and the GELU of one chunk (v): h1 and g, both in base, through
 * ghc_linear_forward_gelu (the GELU in the GEMM's epilogue where one product writes all of h1;
 * the hook's forward of ffn.0 runs). */
int  wan22_ffn_hidden(struct wan22 *m, const struct wan22_block_w *bw, int32_t block, const struct wan22_ffn_rows *v,
                      void *stream);
/* Release the forward state and backward scratch. */
void wan22_state_free(struct wan22 *m);
/* A view of `t`'s memory with another shape (wrapped; same numel or less). */
ghc_tensor_t *wan22_view(struct wan22 *m, ghc_tensor_t *t, int64_t offset_elems, int ndim,
                         const int64_t *shape);
/* A tensor the caller gave (a batch latent, out, dout, dnoisy) on the model's device: *tmp stays
 * NULL when t is there already, else gets a new tensor like t on the model's device, with t's
 * values when copy_in. Returns 0 or GHC_E*. wan22_dev_done() ends it: copies *tmp back into t
 * when copy_out, waits for the stream (the host side lives on) and frees *tmp; a no-op when
 * *tmp is NULL. (Patchify and unpatchify are device ops, ghc_op_patchify & co.) */
int wan22_dev_begin(struct wan22 *m, const ghc_tensor_t *t, ghc_tensor_t **tmp, bool copy_in, void *stream);
int wan22_dev_done(struct wan22 *m, ghc_tensor_t *t, ghc_tensor_t **tmp, bool copy_out, void *stream);
/* Copy any-device tensor `t` (float dtype) into a new host f32 array (caller frees). */
float *wan22_host_f32(struct wan22 *m, const ghc_tensor_t *t, void *stream);

/* ---- stream.c: weights through the memory policy --------------------------------------------- */

/* Declare each block's weights of expert e to the policy as group e x layers + block, so a
 * streaming policy (offload) can move a block as one. Returns 0 or GHC_E*. */
int wan22_weights_group(struct wan22 *m, int32_t expert);
/* The block's weights as kernels read them now: bw itself (*out = bw) unless the policy maps
 * some elsewhere (offload's ring buffer), then *out = tmp whose tensors wrap the mapped
 * addresses; wan22_block_unmap(bw, tmp) frees those (tmp NULL: nothing). Call between the block's phase hooks. */
int  wan22_block_map(struct wan22 *m, const struct wan22_block_w *bw, struct wan22_block_w *tmp,
                     const struct wan22_block_w **out);
void wan22_block_unmap(const struct wan22_block_w *bw, struct wan22_block_w *tmp);
/* Saved activations: open unit i (of the state) for writing (forward) or reading (backward) on
 * `stream` into v, its tensors at the address the policy gives; wan22_unit_end closes it (a
 * no-op for a closed v). Returns 0 or GHC_E*. */
int  wan22_unit_begin(struct wan22 *m, int64_t i, bool write, struct wan22_uview *v, void *stream);
int  wan22_unit_end(struct wan22 *m, struct wan22_uview *v, void *stream);
/* Block i's activations with unit view v's kept attention output (and q, k, v) in place of slot
 * a's (into *tmp), or a itself when the unit keeps none. */
struct wan22_act *wan22_unit_act(struct wan22 *m, struct wan22_act *a, const struct wan22_uview *v,
                                 struct wan22_act *tmp);

/* ---- backward.c ------------------------------------------------------------------------------- */

int wan22_backward(struct wan22 *m, int32_t expert, const ghc_tensor_t *dout, ghc_tensor_t *dnoisy,
                   void *stream);

/* ---- estimate.c ------------------------------------------------------------------------------- */

/* The model member estimate (model.h): the memory of a training run of the model `cfg`
 * configures, from the configuration and the checkpoints' headers. */
int wan22_estimate(ghc_core_t *core, ghc_cfg_t *cfg, int64_t batch, int64_t tokens, struct ghc_model_memory *out);

#endif /* GHC_WAN22_IMPL_H */
