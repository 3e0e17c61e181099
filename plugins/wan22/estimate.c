/* estimate.c: the model member estimate (model.h): the memory a training run of the configured
 * Wan2.x model takes, before anything is loaded, for `gh200core estimate`: weights per expert
 * from the checkpoint headers (or the random model's dims) in the precision they load in, one
 * block's weights (an offload ring slot), activations with and without checkpointing, the
 * backward scratch, the text context and the batch's own tensors. The sizes follow what the
 * plugin allocates (load.c, wan22_pad_weights; forward.c act_alloc, state_prepare; backward.c
 * grad_prepare): a change there changes these formulas (tests/test_mem*.c compare them with
 * measured peaks). */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ctype.h>
#include <unistd.h>

#include <gh200core/run.h>   /* defines: ghc_cfg_resolve_path */
#include <gh200core/safetensors.h>

#include "wan22_impl.h"

struct est_model {
    int64_t dim, ffn, heads, layers, in_ch, out_ch, text_dim, freq_dim, experts;
    uint64_t expert_bytes[2];     /* as loaded */
    uint64_t block_bytes;         /* one block's weights as loaded (the offload ring's slot) */
    int      base;                /* bytes per element of the GEMM operand dtype: 2 bf16, 4 f32 */
    int      block_elem;          /* bytes per block-linear element: base, or 1 for fp8 */
    int64_t  pad;                 /* adapter_pad: the block linears' spare rows and columns */
    int64_t  ffn_chunk;           /* key ffn_chunk: the FFN's tokens at once */
    char     dims_from[128];      /* for people (struct ghc_model_memory) */
};

/* Elements of a block linear [out, in] as the model stores it with `pad` spare rows and columns
 * (load.c wan22_pad_weights: self-attention q, k, v 3 pad columns, cross-attention k, v 2). */
static int64_t padded_numel(const char *name, int64_t out, int64_t in, int64_t pad)
{
    if (!pad)
        return out * in;
    bool qkv = strstr(name, "self_attn.q.") || strstr(name, "self_attn.k.") || strstr(name, "self_attn.v.") ||
               strstr(name, "attn1.to_q.") || strstr(name, "attn1.to_k.") || strstr(name, "attn1.to_v.");
    bool ckv = strstr(name, "cross_attn.k.") || strstr(name, "cross_attn.v.") || strstr(name, "attn2.to_k.") ||
               strstr(name, "attn2.to_v.");
    return (out + pad) * (in + (qkv ? 3 : ckv ? 2 : 1) * pad);
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* A block linear (attention q/k/v/o, ffn) or a text linear: loaded in the base dtype. */
static int linear_kind(const char *name, int ndim)
{
    if (ndim != 2 || !ends_with(name, ".weight"))
        return 0;
    if (strstr(name, "blocks.") && (strstr(name, "attn") || strstr(name, ".ffn.")))
        return 1;
    if (strstr(name, "text_embedding.") || strstr(name, "text_embedder."))
        return 2;
    return 0;
}

/* The first tensor whose name ends with one of the suffixes; false when none. */
static bool find_suffix(const ghc_st_t *st, const char *const *suffixes, struct ghc_st_info *out)
{
    for (int i = 0; i < ghc_st_count(st); i++) {
        struct ghc_st_info in;
        ghc_st_info_at(st, i, &in);
        for (int k = 0; suffixes[k]; k++)
            if (ends_with(in.name, suffixes[k])) {
                *out = in;
                return true;
            }
    }
    return false;
}

/* Bytes of an expert as loaded, counted tensor by tensor (est_count_tensor). */
struct est_count {
    int64_t  layers;
    uint64_t bytes, block0;
};

/* Count one tensor of a checkpoint (its name as the file spells it) in the precision it loads in.
 * `path` names the file in messages. Returns 0, or GHC_EFORMAT for a block index no Wan model has. */
static int est_count_tensor(ghc_core_t *core, const char *path, const struct est_model *m, struct est_count *c,
                            const char *name, int ndim, const int64_t *shape)
{
    const char *b = strstr(name, "blocks.");
    if (b) {
        int64_t idx = 0;
        const char *end;
        int k = wan22_block_index(b + 7, &idx, &end);
        if (k < 0)
            return ghc_error_set(core, GHC_EFORMAT, "%s: estimate: tensor '%s': '%.*s' is not a Wan block index "
                                 "(0 to %d)", path, name, (int)(end - (b + 7)) > 40 ? 40 : (int)(end - (b + 7)), b + 7,
                                 WAN22_MAX_BLOCKS - 1);
        if (idx + 1 > c->layers)   /* idx < WAN22_MAX_BLOCKS (0 when no digits follow, as before) */
            c->layers = idx + 1;
    }
    if (ends_with(name, "scale_weight") || ends_with(name, "scale_input"))
        return 0;   /* ComfyUI fp8 scales: folded into the weights */
    int64_t numel = 1;
    for (int d = 0; d < ndim; d++)
        numel *= shape[d];
    int kind = linear_kind(name, ndim);
    if (kind == 1)
        numel = padded_numel(name, shape[0], shape[1], m->pad);
    uint64_t nb = (uint64_t)numel * (uint64_t)(kind == 1 ? m->block_elem : kind == 2 ? m->base : 4);
    c->bytes += nb;
    if (b && strncmp(b + 7, "0.", 2) == 0)
        c->block0 += nb;
    return 0;
}

/* Dims and bytes of one expert from a checkpoint header (nothing but the header is read). */
static int est_checkpoint(ghc_core_t *core, const char *path, struct est_model *m, int e)
{
    ghc_st_t *st = ghc_st_open(core, path);
    if (!st)
        return ghc_error_code(core);
    struct ghc_st_info in;
    static const char *const q[] = { "blocks.0.self_attn.q.weight", "blocks.0.attn1.to_q.weight", NULL };
    static const char *const f[] = { "blocks.0.ffn.0.weight", "blocks.0.ffn.net.0.proj.weight", NULL };
    static const char *const te[] = { "text_embedding.0.weight", "text_embedder.linear_1.weight", NULL };
    static const char *const pe[] = { "patch_embedding.weight", NULL };
    static const char *const hd[] = { "head.head.weight", "proj_out.weight", NULL };
    int rc = 0;
    if (!find_suffix(st, q, &in) || in.ndim != 2) {
        rc = ghc_error_set(core, GHC_EFORMAT, "%s: estimate: no blocks.0 self-attention q weight; not a Wan2.x DiT "
                           "checkpoint", path);
        goto out;
    }
    m->dim = in.shape[0];
    if (find_suffix(st, f, &in))
        m->ffn = in.shape[0];
    if (find_suffix(st, te, &in))
        m->text_dim = in.shape[1];
    if (find_suffix(st, pe, &in))
        m->in_ch = in.shape[1];
    if (find_suffix(st, hd, &in))
        m->out_ch = in.shape[0] / 4;
    struct est_count c = { 0 };
    for (int i = 0; i < ghc_st_count(st) && rc == 0; i++) {
        ghc_st_info_at(st, i, &in);
        rc = est_count_tensor(core, path, m, &c, in.name, in.ndim, in.shape);
    }
    if (rc < 0)
        goto out;
    m->layers = c.layers;
    m->expert_bytes[e] = c.bytes;
    m->block_bytes = c.block0;
out:
    ghc_st_free(st);
    return rc;
}

/* Bytes of one expert with random weights of the given dims (the layout of load.c). */
static void est_random_bytes(struct est_model *m)
{
    const uint64_t D = (uint64_t)m->dim, F = (uint64_t)m->ffn;
    const uint64_t p = (uint64_t)m->pad;
    /* the block linears with their spare room: q, k, v; o and cross q, o; cross k, v; ffn.0, ffn.2 */
    uint64_t lin = 3 * (D + p) * (D + 3 * p) + 3 * (D + p) * (D + p) + 2 * (D + p) * (D + 2 * p) +
                   2 * (D + p) * (F + p);
    uint64_t small = 6 * D + (9 * D + F) + 6 * D;   /* mod, biases, norms */
    m->block_bytes = lin * (uint64_t)m->block_elem + small * 4;
    uint64_t rest = (D * 4 * (uint64_t)m->in_ch + D) * 4                         /* patch embedding */
                  + (D * (uint64_t)m->text_dim + D * D) * (uint64_t)m->base + 2 * D * 4   /* text MLP */
                  + (D * (uint64_t)m->freq_dim + D + D * D + D + 6 * D * D + 6 * D) * 4    /* time */
                  + (2 * D + 4 * (uint64_t)m->out_ch * D + 4 * (uint64_t)m->out_ch) * 4;   /* head */
    m->expert_bytes[0] = m->block_bytes * (uint64_t)m->layers + rest;
    m->expert_bytes[1] = m->experts > 1 ? m->expert_bytes[0] : 0;
}

/* ---- the released variants (detect.c), for a configuration whose checkpoint files are absent ---- */

/* A variant is recognised when every word is in the checkpoint's path (lower case): the names
 * the official, diffusers and ComfyUI releases carry ("Wan2.2-T2V-A14B/high_noise_model/...",
 * "wan2.2_i2v_low_noise_14B_fp8_scaled.safetensors", "wan2.2_ti2v_5B_fp16.safetensors"). The
 * first match wins (TI2V before I2V: "ti2v" holds "i2v"). */
static const struct est_variant {
    const char *name;
    const char *words[3];
    struct wan22_dims d;   /* dim, ffn, heads, layers, in, out, text, freq: their config.json */
} est_variants[] = {
    { "TI2V-5B", { "ti2v", "5b", NULL }, { 3072, 14336, 24, 30, 48, 48, 4096, 256 } },
    { "A14B I2V expert", { "i2v", "14b", NULL }, { 5120, 13824, 40, 40, 36, 16, 4096, 256 } },
    { "A14B T2V expert", { "t2v", "14b", NULL }, { 5120, 13824, 40, 40, 16, 16, 4096, 256 } },
    { "Wan2.1 T2V-1.3B", { "t2v", "1.3b", NULL }, { 1536, 8960, 12, 30, 16, 16, 4096, 256 } },
    { "Wan2.1 T2V-1.3B", { "t2v", "1_3b", NULL }, { 1536, 8960, 12, 30, 16, 16, 4096, 256 } },
};

static const struct est_variant *est_variant_of(const char *path)
{
    char low[4096];
    size_t n = 0;
    for (; path[n] && n + 1 < sizeof(low); n++)
        low[n] = (char)tolower((unsigned char)path[n]);
    low[n] = 0;
    for (size_t v = 0; v < sizeof(est_variants) / sizeof(est_variants[0]); v++) {
        bool all = true;
        for (int w = 0; w < 3 && est_variants[v].words[w]; w++)
            all = all && strstr(low, est_variants[v].words[w]);
        if (all)
            return &est_variants[v];
    }
    return NULL;
}

/* Dims and bytes of one expert of a variant: its tensor list (detect.c), counted as a header. */
static int est_variant_bytes(ghc_core_t *core, const struct est_variant *v, struct est_model *m, int e)
{
    struct wan22_tspec *spec = NULL;
    int n = 0, rc;
    if ((rc = wan22_tensor_list(core, &v->d, NULL, &spec, &n)) < 0)
        return rc;
    struct est_count c = { 0 };
    for (int i = 0; i < n && rc == 0; i++)
        rc = est_count_tensor(core, v->name, m, &c, spec[i].name, spec[i].ndim, spec[i].shape);
    free(spec);
    if (rc < 0)
        return rc;
    m->dim = v->d.dim;
    m->ffn = v->d.ffn_dim;
    m->heads = v->d.heads;
    m->layers = v->d.layers;
    m->in_ch = v->d.in_ch;
    m->out_ch = v->d.out_ch;
    m->text_dim = v->d.text_dim;
    m->freq_dim = v->d.freq_dim;
    m->expert_bytes[e] = c.bytes;
    m->block_bytes = c.block0;
    return 0;
}

static int est_model_read(ghc_core_t *core, ghc_cfg_t *cfg, struct est_model *m)
{
    static const struct ghc_cfg_key random_keys[] = {
        { "dim", GHC_CFG_INT }, { "ffn_dim", GHC_CFG_INT }, { "heads", GHC_CFG_INT }, { "layers", GHC_CFG_INT },
        { "in_channels", GHC_CFG_INT }, { "out_channels", GHC_CFG_INT }, { "text_dim", GHC_CFG_INT },
        { "freq_dim", GHC_CFG_INT }, { "experts", GHC_CFG_INT }, { "seed", GHC_CFG_INT }, { NULL, 0 } };
    static const char *const dtypes[] = { "bf16", "f32", "fp8", NULL };
    int rc, dt, nlist = 0;
    ghc_cfg_t *rnd = NULL;
    const char *path = NULL;
    if ((rc = ghc_cfg_get_choice(cfg, "dtype", 0, dtypes, &dt)) < 0 ||
        (rc = ghc_cfg_get_group(cfg, "random", random_keys, &rnd)) < 0 ||
        (rc = ghc_cfg_list_len(cfg, "checkpoints", &nlist)) < 0 ||
        (rc = ghc_cfg_get_string(cfg, "checkpoint", NULL, &path)) < 0)
        return rc;
    m->base = dt == 1 ? 4 : 2;
    m->block_elem = dt == 2 ? 1 : m->base;
    if ((rc = ghc_cfg_get_int(cfg, "adapter_pad", 16, 0, 1024, &m->pad)) < 0 ||
        (rc = ghc_cfg_get_int(cfg, "ffn_chunk", WAN22_FFN_CHUNK, 1, (int64_t)1 << 40, &m->ffn_chunk)) < 0)
        return rc;
    if (dt == 2)
        m->pad = 0;   /* fp8 block linears are stored dense */
    m->heads = 0;
    m->freq_dim = 256;
    if (rnd) {
        if ((rc = ghc_cfg_get_int(rnd, "dim", 256, 2, 65536, &m->dim)) < 0 ||
            (rc = ghc_cfg_get_int(rnd, "ffn_dim", 704, 1, 1 << 20, &m->ffn)) < 0 ||
            (rc = ghc_cfg_get_int(rnd, "heads", m->dim % 128 == 0 ? m->dim / 128 : 1, 1, 4096, &m->heads)) < 0 ||
            (rc = ghc_cfg_get_int(rnd, "layers", 3, 1, 1000, &m->layers)) < 0 ||
            (rc = ghc_cfg_get_int(rnd, "in_channels", 16, 1, 4096, &m->in_ch)) < 0 ||
            (rc = ghc_cfg_get_int(rnd, "out_channels", 16, 1, 4096, &m->out_ch)) < 0 ||
            (rc = ghc_cfg_get_int(rnd, "text_dim", 4096, 1, 1 << 20, &m->text_dim)) < 0 ||
            (rc = ghc_cfg_get_int(rnd, "freq_dim", 256, 2, 1 << 20, &m->freq_dim)) < 0 ||
            (rc = ghc_cfg_get_int(rnd, "experts", 1, 1, 2, &m->experts)) < 0)
            return rc;
        est_random_bytes(m);
        snprintf(m->dims_from, sizeof(m->dims_from), "the random model's dims");
        return 0;
    }
    /* the files that exist are read (headers only); an absent one takes the other expert's
     * bytes, or, when none exists, the dims of the variant its name says */
    m->experts = nlist == 2 ? 2 : 1;
    char paths[2][4096];
    int read = -1, absent = -1;
    for (int e = 0; e < m->experts; e++) {
        if (nlist == 2 && (rc = ghc_cfg_list_string(cfg, "checkpoints", e, &path)) < 0)
            return rc;
        if (!path)
            return ghc_error_set(core, GHC_ECONFIG, "%s: estimate: the model has neither 'checkpoint', 'checkpoints' "
                                 "nor 'random'", ghc_cfg_where(cfg, NULL));
        if (ghc_cfg_resolve_path(cfg, nlist == 2 ? "checkpoints" : "checkpoint", path, paths[e], sizeof(paths[e])) < 0)
            snprintf(paths[e], sizeof(paths[e]), "%s", path);
        if (access(paths[e], F_OK) != 0) {
            absent = absent < 0 ? e : absent;
            continue;
        }
        if ((rc = est_checkpoint(core, paths[e], m, e)) < 0)
            return rc;
        read = e;
    }
    int64_t h;
    if ((rc = ghc_cfg_get_int(cfg, "heads", 0, 0, 4096, &h)) < 0)
        return rc;
    m->heads = h ? h : m->dim / 128 ? m->dim / 128 : 1;
    if (absent < 0) {
        snprintf(m->dims_from, sizeof(m->dims_from), "the checkpoint header%s", m->experts > 1 ? "s" : "");
    } else if (read >= 0) {
        m->expert_bytes[absent] = m->expert_bytes[read];
        snprintf(m->dims_from, sizeof(m->dims_from), "the %s expert's checkpoint header (the other file is absent)",
                 read == 0 ? "first" : "second");
    } else {
        const struct est_variant *v = est_variant_of(paths[0]);
        if (!v && m->experts > 1)
            v = est_variant_of(paths[1]);
        if (!v)
            return ghc_error_set(core, GHC_ENOTFOUND, "%s: estimate: no such file, and its name says no known "
                                 "variant to take the dims from (t2v or i2v with 14b, ti2v with 5b, t2v with 1.3b)",
                                 paths[0]);
        for (int e = 0; e < m->experts; e++)
            if ((rc = est_variant_bytes(core, v, m, e)) < 0)
                return rc;
        if (h)
            m->heads = h;
        snprintf(m->dims_from, sizeof(m->dims_from), "the variant the checkpoint name%s: %s (files absent, "
                 "no header read)", m->experts > 1 ? "s say" : " says", v->name);
    }
    return 0;
}

/* ---- activations (bytes for B samples of L tokens) -------------------------------------------- */

/* One block's kept activations (forward.c act_alloc); ffn: with the FFN's h1, in the GEMM dtype
 * (a block whose backward reads them kept; the recomputed blocks' slot has none); qkv:
 * "block_qkv" (q's and k's products in the GEMM dtype, not f32). */
static uint64_t act_block(const struct est_model *m, uint64_t B, uint64_t L, bool ffn, bool qkv)
{
    const uint64_t D = (uint64_t)m->dim, F = (uint64_t)m->ffn, H = (uint64_t)m->heads, b = (uint64_t)m->base;
    uint64_t per_token = (qkv ? 12 * D + 11 * b * D : 20 * D + 9 * b * D) + (ffn ? b * F : 0) + b * F + 24 + 12 + 8 * H;
    uint64_t ctx = WAN22_TEXT_LEN * (8 * D + 4 + 2 * b * D);
    return B * (L * per_token + ctx + 6 * 4 * D);
}

/* The rows of an FFN chunk (wan22_ffn_rows for the configured ffn_chunk). */
static uint64_t ffn_rows(const struct est_model *m, uint64_t BL)
{
    struct wan22 w = { .ffn_chunk = m->ffn_chunk };
    return (uint64_t)wan22_ffn_rows(&w, (int64_t)BL);
}

/* Everything else a training forward keeps (state_prepare), residual stream excluded: the text
 * context, time path, patches, head, and st.y. */
static uint64_t act_state(const struct est_model *m, uint64_t B, uint64_t L)
{
    const uint64_t D = (uint64_t)m->dim, b = (uint64_t)m->base;
    return B * (WAN22_TEXT_LEN * ((uint64_t)m->text_dim * b + 2 * D * b) + (uint64_t)m->freq_dim * 4 + 9 * 4 * D +
                L * 4 * (uint64_t)m->in_ch * 4 + 8 * D + L * 8 + L * D * 4 + L * 4 * (uint64_t)m->out_ch * 4 +
                L * D * 4);
}

/* The backward scratch (backward.c grad_prepare): [B L, D] tensors, and the FFN's per chunk. */
static uint64_t act_grad(const struct est_model *m, uint64_t B, uint64_t L)
{
    const uint64_t D = (uint64_t)m->dim, F = (uint64_t)m->ffn, b = (uint64_t)m->base;
    return B * (L * (12 * D + b * D + 3 * b * D) + WAN22_TEXT_LEN * (2 * b * D + 8 * D) +
                L * 4 * (uint64_t)m->out_ch * 4 + L * 4 * (uint64_t)m->in_ch * 4) +
           ffn_rows(m, B * L) * (8 * F + b * F);
}

/* ---- the member ------------------------------------------------------------------------------- */

/* One checkpointing mode's figures (struct ghc_model_mode): ck 0 off, 1 "block", 2 "block_attn",
 * 3 "block_qkv"; every k: block i recomputed iff i % k == 0. */
static void est_mode(const struct est_model *m, uint64_t B, uint64_t L, int ck, uint64_t every,
                     struct ghc_model_mode *out)
{
    const uint64_t N = (uint64_t)m->layers, D = (uint64_t)m->dim;
    uint64_t n_rec = (N + every - 1) / every, slots_ck = 1 + N - n_rec;
    uint64_t blk = act_block(m, B, L, true, ck == 3), resid = B * L * D * 4, state = act_state(m, B, L);
    /* the recomputed blocks' slot: no h1, the FFN's chunk scratch (st.fh1, GEMM dtype) instead */
    uint64_t rec = act_block(m, B, L, false, ck == 3) + ffn_rows(m, B * L) * (uint64_t)m->ffn * (uint64_t)m->base;
    /* a recomputed block's kept attention output (o in the GEMM dtype) and lse, with block_attn
     * and block_qkv; with block_qkv also q, k and v in the GEMM dtype */
    uint64_t attn = ck >= 2 ? B * L * D * (uint64_t)m->base + B * (uint64_t)m->heads * L * 4 : 0;
    if (ck == 3)
        attn += 3 * B * L * D * (uint64_t)m->base;
    out->activations = ck ? rec + (slots_ck - 1) * blk + (N + 1) * resid + state + n_rec * attn
                          : N * blk + (N + 1) * resid + state;
    /* saved-activation units: each block's input, with block_attn (block_qkv) the recomputed
     * blocks' attention output (and q, k, v) too (stream.c) */
    out->saved = N * resid + n_rec * attn;
    out->saved_unit = resid + attn;
}

/* The FLOPs of a training step of B samples of L tokens (forward, recomputation, backward) and
 * of its forward, with checkpointing ck (0 off, 1 block, 2 block_attn, 3 block_qkv) every k-th
 * block. Per
 * block: the self-attention's q, k, v, o and the cross-attention's q, o over L rows, its k, v
 * over the text's rows, the FFN; the two attention products; a linear's backward is twice its
 * forward, an attention's 2.5 times (dQ, dK, dV, and the product recomputed). block_attn
 * recomputes all but the self-attention's products (their output is kept), block_qkv also all
 * but the q, k and v products. */
static void est_flops(const struct est_model *m, double B, double L, int ck, uint64_t every, double *fwd,
                      double *step)
{
    const double D = (double)m->dim, F = (double)m->ffn, T = WAN22_TEXT_LEN, N = (double)m->layers;
    const double lin = B * (2 * L * D * D * 6 + 2 * T * D * D * 2 + 2 * L * D * F * 2);
    const double self = B * 4 * L * L * D, cross = B * 4 * L * T * D;
    const double n_rec = ck ? (double)(((uint64_t)m->layers + every - 1) / every) : 0;
    *fwd = N * (lin + self + cross);
    const double qkv = ck == 3 ? B * 2 * L * D * D * 3 : 0;
    *step = *fwd + N * (2 * lin + 2.5 * (self + cross)) + n_rec * (lin - qkv + cross + (ck >= 2 ? 0 : self));
}

int wan22_estimate(ghc_core_t *core, ghc_cfg_t *cfg, int64_t batch, int64_t tokens, struct ghc_model_memory *out)
{
    static const char *const ckpts[] = { "off", "block", "block_attn", "block_qkv", NULL };
    int rc, ck = 1;
    struct est_model m = { 0 };
    int64_t every = 1;
    /* the defaults of wan22.c: checkpointing "block", every block */
    if ((rc = est_model_read(core, cfg, &m)) < 0 ||
        (rc = ghc_cfg_get_choice(cfg, "checkpointing", 1, ckpts, &ck)) < 0 ||
        (rc = ghc_cfg_get_int(cfg, "checkpoint_every", 1, 1, 1000, &every)) < 0)
        return rc;
    const uint64_t B = (uint64_t)batch, L = (uint64_t)tokens;
    struct ghc_model_mode off, ckpt;
    est_mode(&m, B, L, 0, 1, &off);
    est_mode(&m, B, L, ck ? ck : 1, (uint64_t)every, &ckpt);
    struct ghc_model_memory r = {
        .struct_size = out->struct_size,
        .experts = (int32_t)m.experts,
        .checkpoint_every = ck ? (int32_t)every : 0,
        .weights = m.expert_bytes[0],
        .weights_inactive = m.experts > 1 ? m.expert_bytes[1] : 0,
        .block = m.block_bytes,
        .activations_full = off.activations,
        .activations_ckpt = ckpt.activations,
        .backward_scratch = act_grad(&m, B, L),
        .text_embeds = B * WAN22_TEXT_LEN * (uint64_t)m.text_dim * 4,
        /* the batch's own tensors: noisy, model output, its gradient, dnoisy (f32 latents) */
        .latents = 4 * B * L * 4 * (uint64_t)(m.in_ch > m.out_ch ? m.in_ch : m.out_ch) * 4,
        /* the adapter targets per block: 8 linears [D, D], ffn.0 [F, D], ffn.2 [D, F] */
        .n_shapes = 3,
        .shapes = { { m.dim, m.dim, 8 * m.layers }, { m.dim, m.ffn, m.layers }, { m.ffn, m.dim, m.layers } },
        .saved = ck ? ckpt.saved : off.saved,
        .saved_unit = ck ? ckpt.saved_unit : off.saved_unit,
        .patch = { 1, 2, 2 },   /* WAN22_PATCH: 1 x 2 x 2 */
        .blocks = m.layers,
    };
    est_flops(&m, (double)B, (double)L, ck, (uint64_t)every, &r.flops_forward, &r.flops_step);
    snprintf(r.checkpointing, sizeof(r.checkpointing), "%s",
             ck == 3 ? "per block, attention and its q, k, v kept" : ck == 2 ? "per block, attention kept"
             : ck   ? "per block"
                    : "off");
    snprintf(r.summary, sizeof(r.summary), "dim %lld, ffn %lld, %lld blocks, %s weights", (long long)m.dim,
             (long long)m.ffn, (long long)m.layers, m.block_elem == 1 ? "fp8 block" : m.base == 2 ? "bf16" : "f32");
    snprintf(r.dims_from, sizeof(r.dims_from), "%s", m.dims_from);
    /* the modes for a plan search: off, block_qkv, block_attn and block as configured (every
     * k), and with k > 1 all three every block; most memory first */
    static const struct { int ck; bool every1; } cand[] = { { 0, true }, { 3, false }, { 2, false }, { 1, false },
                                                            { 3, true }, { 2, true }, { 1, true } };
    struct est_tag { int ck; int64_t every; } tag[GHC_MODEL_MEMORY_MODES];
    int n = 0;
    for (size_t c = 0; c < sizeof(cand) / sizeof(cand[0]); c++) {
        if (cand[c].ck && cand[c].every1 && every == 1)
            continue;   /* as configured already */
        int64_t k = cand[c].every1 ? 1 : every;
        est_mode(&m, B, L, cand[c].ck, (uint64_t)k, &r.modes[n]);
        snprintf(r.modes[n].set, sizeof(r.modes[n].set), "checkpointing=%s%s", ckpts[cand[c].ck],
                 k != every ? " checkpoint_every=1" : "");
        tag[n] = (struct est_tag){ cand[c].ck, k };
        n++;
    }
    for (int a = 1; a < n; a++)   /* insertion sort, most memory first */
        for (int b = a; b > 0 && r.modes[b].activations > r.modes[b - 1].activations; b--) {
            struct ghc_model_mode t = r.modes[b];
            r.modes[b] = r.modes[b - 1];
            r.modes[b - 1] = t;
            struct est_tag u = tag[b];
            tag[b] = tag[b - 1];
            tag[b - 1] = u;
        }
    r.n_modes = n;
    for (int i = 0; i < n; i++)
        if (tag[i].ck == ck && (ck == 0 || tag[i].every == every))
            r.mode = i;
    memcpy(out, &r, out->struct_size < sizeof(r) ? out->struct_size : sizeof(r));
    return 0;
}
