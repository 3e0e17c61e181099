/* wan22.c: the `wan22` model plugin: the Wan2.2 diffusion transformer (A14B T2V/I2V as two
 * experts, TI2V-5B, Wan2.1 1.3B, any custom shape) with a frozen base and adapter hooks on
 * the 10 linears of every block. This file is the glue: configuration, experts and routing,
 * the adapter target list, the ops table and the plugin descriptor. The math lives in
 * forward.c and backward.c, checkpoints in load.c and detect.c. doc/wan22.md describes the
 * keys and the behaviour. */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gh200core/run.h>   /* defines: ghc_cfg_resolve_path */

#include "wan22_impl.h"

/* ---- configuration -------------------------------------------------------------------------- */

static const struct ghc_cfg_key wan22_random_keys[] = {
    { "dim",          GHC_CFG_INT, "256",                "2 to 65536",  NULL },
    { "ffn_dim",      GHC_CFG_INT, "704",                "1 to 2^20",   NULL },
    { "heads",        GHC_CFG_INT, "(dim / 128, or 1)",  "1 to 4096",   NULL },
    { "layers",       GHC_CFG_INT, "3",                  "1 to 1000",   NULL },
    { "in_channels",  GHC_CFG_INT, "16",                 "1 to 4096",   NULL },
    { "out_channels", GHC_CFG_INT, "16",                 "1 to 4096",   NULL },
    { "text_dim",     GHC_CFG_INT, "4096",               "1 to 2^20",   NULL },
    { "freq_dim",     GHC_CFG_INT, "256",                "2 to 2^20",   NULL },
    { "experts",      GHC_CFG_INT, "1",                  "1 to 2",      NULL },
    { "seed",         GHC_CFG_INT, "0",                  "0 to 2^63-1", NULL },
    { NULL, 0, NULL, NULL, NULL }
};

static const struct ghc_cfg_key wan22_keys[] = {
    /* one model: a .safetensors file or an .index.json */
    { "checkpoint", GHC_CFG_STRING, NULL, NULL, NULL },
    /* two experts: [ high noise, low noise ] */
    { "checkpoints", GHC_CFG_LIST, NULL, NULL, NULL },
    /* a custom head count; 0: dim / 128 */
    { "heads", GHC_CFG_INT, "(dim / 128)", "0 to 4096", NULL },
    /* high-noise expert iff t >= boundary * 1000 */
    { "boundary", GHC_CFG_FLOAT, "(0.875; 0.9 for 36 input channels, I2V)", "0 to 1", NULL },
    /* fp8: e4m3 block linears */
    { "dtype", GHC_CFG_STRING, "bf16", "bf16, f32, fp8", NULL },
    /* dtype "fp8": forward block linears as fp8 x fp8 GEMMs (inputs cast to e4m3, scale 1,
     * saturating) */
    { "fp8_gemm", GHC_CFG_BOOL, "false", NULL, NULL },
    /* -1 = CPU, 0.. = CUDA */
    { "device", GHC_CFG_INT, "(0 with CUDA device memory, else -1)", "-1 to 1023", NULL },
    /* "block_attn": as "block", and a recomputed block's self-attention output and lse are
     * kept (saved activations) so that the recomputation skips the attention forward;
     * "block_qkv": its q, k and v products' outputs too (q's and k's rounded to the GEMM dtype
     * before their norms), so that it skips those three products */
    { "checkpointing", GHC_CFG_STRING, "block", "off, block, block_attn, block_qkv", NULL },
    /* k, with "block", "block_attn" or "block_qkv": block i is recomputed in backward iff i % k == 0, the
     * others keep their activations; k = 1 is every block */
    { "checkpoint_every", GHC_CFG_INT, "1", "1 to 1000", NULL },
    /* a randomly initialised model instead */
    { "random", GHC_CFG_GROUP, NULL, NULL, wan22_random_keys },
    /* K-concatenation: spare rows and columns a block linear keeps for an adapter's rank-r
     * factors (0: none; adapters of a higher rank take the model's hooks instead) */
    { "adapter_pad", GHC_CFG_INT, "16", "0 to 1024", NULL },
    /* the FFN runs on at most this many tokens of a batch at once (B L split in equal chunks):
     * its [tokens, ffn_dim] activations and gradients take memory for this many, not all */
    { "ffn_chunk", GHC_CFG_INT, "4096", "1 to 2^40", NULL },
    { NULL, 0, NULL, NULL, NULL }
};


static int read_random(struct wan22 *m, ghc_cfg_t *g, int64_t *experts, int64_t *seed)
{
    int rc;
    struct wan22_dims *d = &m->d;
    if ((rc = ghc_cfg_get_int(g, "dim", 256, 2, 65536, &d->dim)) < 0 ||
        (rc = ghc_cfg_get_int(g, "ffn_dim", 704, 1, 1 << 20, &d->ffn_dim)) < 0 ||
        (rc = ghc_cfg_get_int(g, "heads", d->dim % 128 == 0 ? d->dim / 128 : 1, 1, 4096, &d->heads)) < 0 ||
        (rc = ghc_cfg_get_int(g, "layers", 3, 1, 1000, &d->layers)) < 0 ||
        (rc = ghc_cfg_get_int(g, "in_channels", 16, 1, 4096, &d->in_ch)) < 0 ||
        (rc = ghc_cfg_get_int(g, "out_channels", 16, 1, 4096, &d->out_ch)) < 0 ||
        (rc = ghc_cfg_get_int(g, "text_dim", 4096, 1, 1 << 20, &d->text_dim)) < 0 ||
        (rc = ghc_cfg_get_int(g, "freq_dim", 256, 2, 1 << 20, &d->freq_dim)) < 0 ||
        (rc = ghc_cfg_get_int(g, "experts", 1, 1, 2, experts)) < 0 ||
        (rc = ghc_cfg_get_int(g, "seed", 0, 0, INT64_MAX, seed)) < 0)
        return rc;
    if (d->dim % d->heads || (d->dim / d->heads) % 2 || d->dim / d->heads > 256)
        return ghc_error_set(m->core, GHC_ECONFIG, "%s: wan22: dim %lld with %lld heads: the head dim must be even "
                             "and at most 256", ghc_cfg_where(g, "heads"), (long long)d->dim, (long long)d->heads);
    if (d->freq_dim % 2)
        return ghc_error_set(m->core, GHC_ECONFIG, "%s: wan22: freq_dim must be even, got %lld",
                             ghc_cfg_where(g, "freq_dim"), (long long)d->freq_dim);
    return 0;
}

/* Where one of input_spec's numbers came from: "model.random.in_channels at train.cfg:12",
 * "--set model.random.in_channels", or "model.random.in_channels (default 16)" (`given`: the
 * key was in the section before its default was filled in). */
static void setting_from(ghc_cfg_t *g, const char *key, bool given, int64_t value, char *buf, size_t len)
{
    const char *w = ghc_cfg_where(g, key);
    if (!given)
        snprintf(buf, len, "%s.%s (default %lld)", ghc_cfg_path(g), key, (long long)value);
    else if (!strncmp(w, "--set ", 6))
        snprintf(buf, len, "%s", w);
    else
        snprintf(buf, len, "%s.%s at %s", ghc_cfg_path(g), key, w);
}

/* The same for the random model's channels (C_in, and C_out where it differs: I2V) and
 * text_dim, or for a checkpoint's (its file, and the key that named it). */
static void input_from(struct wan22 *m, ghc_cfg_t *cfg, ghc_cfg_t *rnd, const bool given[3], const char *path,
                       bool list)
{
    if (rnd) {
        char in[480], out[480];
        setting_from(rnd, "in_channels", given[0], m->d.in_ch, in, sizeof(in));
        setting_from(rnd, "out_channels", given[1], m->d.out_ch, out, sizeof(out));
        if (m->d.in_ch == m->d.out_ch)
            snprintf(m->ch_from, sizeof(m->ch_from), "%s", in);
        else
            snprintf(m->ch_from, sizeof(m->ch_from), "%s and %s", in, out);
        setting_from(rnd, "text_dim", given[2], m->d.text_dim, m->text_from, sizeof(m->text_from));
        return;
    }
    const char *key = list ? "checkpoints" : "checkpoint", *w = ghc_cfg_where(cfg, key);
    char by[600];
    if (!strncmp(w, "--set ", 6))
        snprintf(by, sizeof(by), "%s", w);
    else
        snprintf(by, sizeof(by), "%s.%s at %s", ghc_cfg_path(cfg), key, w);
    snprintf(m->ch_from, sizeof(m->ch_from), "patch_embedding.weight of the checkpoint %s (%s)", path, by);
    snprintf(m->text_from, sizeof(m->text_from), "text_embedding.0.weight of the checkpoint %s (%s)", path, by);
}

/* The adapter targets: 10 per block, official names with diffusers aliases. */
static int build_targets(struct wan22 *m)
{
    static const char *const lin[WAN22_TARGETS] = {
        "self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o",
        "cross_attn.q", "cross_attn.k", "cross_attn.v", "cross_attn.o", "ffn.0", "ffn.2",
    };
    const size_t len = 64;
    m->n_targets = (int32_t)(m->d.layers * WAN22_TARGETS);
    m->targets = calloc((size_t)m->n_targets, sizeof(*m->targets));
    m->target_names = malloc((size_t)m->n_targets * 2 * len);
    if (!m->targets || !m->target_names)
        return ghc_error_set(m->core, GHC_ENOMEM, "wan22: out of memory for the targets");
    for (int32_t i = 0; i < m->n_targets; i++) {
        int32_t blk = i / WAN22_TARGETS, j = i % WAN22_TARGETS;
        char *name = m->target_names + (size_t)i * 2 * len, *alias = name + len, full[96];
        snprintf(name, len, "blocks.%d.%s", (int)blk, lin[j]);
        snprintf(full, sizeof(full), "%s.weight", name);
        wan22_name_diffusers(full, alias, len);
        alias[strlen(alias) - 7] = '\0';   /* drop ".weight" */
        m->targets[i] = (struct ghc_model_target){
            .name = name, .alias = alias, .block = blk,
            .in_features = j == WAN22_FFN_2 ? m->d.ffn_dim : m->d.dim,
            .out_features = j == WAN22_FFN_0 ? m->d.ffn_dim : m->d.dim,
        };
    }
    return 0;
}

static void wan22_free(void *self)
{
    struct wan22 *m = self;
    if (!m)
        return;
    wan22_state_free(m);
    ghc_linears_free(m->lin);
    ghc_tensor_free(m->twv);
    for (int32_t e = 0; m->experts && e < m->n_experts; e++)
        wan22_weights_free(m, &m->experts[e]);
    free(m->experts);
    free(m->targets);
    free(m->target_names);
    free(m);
}

static int wan22_init(ghc_core_t *core, ghc_cfg_t *cfg, void **self)
{
    static const char *const dtypes[] = { "bf16", "f32", "fp8", NULL };
    static const char *const ckpts[] = { "off", "block", "block_attn", "block_qkv", NULL };
    int rc, dt, ck, nlist = 0;
    bool given[3] = { false, false, false };
    int64_t heads, device, every, n_random = 1, seed = 0;
    const char *path = NULL, *paths[2] = { NULL, NULL };
    ghc_cfg_t *rnd = NULL;
    struct wan22 *m = calloc(1, sizeof(*m));
    if (!m)
        return ghc_error_set(core, GHC_ENOMEM, "wan22: out of memory");
    m->core = core;
    if ((rc = ghc_cfg_get_choice(cfg, "dtype", 0, dtypes, &dt)) < 0 ||
        (rc = ghc_cfg_get_choice(cfg, "checkpointing", 1, ckpts, &ck)) < 0 ||
        (rc = ghc_cfg_get_int(cfg, "checkpoint_every", 1, 1, 1000, &every)) < 0 ||
        (rc = ghc_cfg_get_int(cfg, "heads", 0, 0, 4096, &heads)) < 0 ||
        (rc = ghc_cfg_get_string(cfg, "checkpoint", NULL, &path)) < 0 ||
        (rc = ghc_cfg_list_len(cfg, "checkpoints", &nlist)) < 0 ||
        (rc = ghc_cfg_get_group(cfg, "random", wan22_random_keys, &rnd)) < 0 ||
        (rc = ghc_cfg_get_bool(cfg, "fp8_gemm", false, &m->fp8_gemm)) < 0 ||
        (rc = ghc_cfg_get_int(cfg, "adapter_pad", 16, 0, 1024, &m->pad)) < 0 ||
        (rc = ghc_cfg_get_int(cfg, "ffn_chunk", WAN22_FFN_CHUNK, 1, (int64_t)1 << 40, &m->ffn_chunk)) < 0)
        goto fail;
    m->base = dt == 1 ? GHC_DTYPE_F32 : GHC_DTYPE_BF16;
    m->fp8 = dt == 2;
    if (m->fp8)
        m->pad = 0;   /* e4m3 block linears are dequantised per GEMM: no spare room (doc/wan22.md) */
    m->ckpt = ck >= 1;
    m->ckpt_attn = ck >= 2;
    m->ckpt_qkv = ck == 3;
    m->ckpt_every = (int)every;
    if (m->fp8_gemm && !m->fp8) {
        rc = ghc_error_set(core, GHC_ECONFIG, "%s: wan22: 'fp8_gemm' needs dtype = \"fp8\" (e4m3 block linears), "
                           "got dtype = \"%s\"", ghc_cfg_where(cfg, "fp8_gemm"), dtypes[dt]);
        goto fail;
    }
    if (!m->ckpt && every != 1) {
        rc = ghc_error_set(core, GHC_ECONFIG, "%s: wan22: 'checkpoint_every' needs checkpointing = \"block\", "
                           "\"block_attn\" or \"block_qkv\"", ghc_cfg_where(cfg, "checkpoint_every"));
        goto fail;
    }
    if (ghc_cfg_has(cfg, "device")) {
        if ((rc = ghc_cfg_get_int(cfg, "device", GHC_DEVICE_CPU, GHC_DEVICE_CPU, 1023, &device)) < 0)
            goto fail;
    } else {
        device = ghc_mem_default_device(core);
    }
    m->device = (int)device;
    if ((path != NULL) + (nlist > 0) + (rnd != NULL) != 1) {
        rc = ghc_error_set(core, GHC_ECONFIG, "%s: wan22: give exactly one of 'checkpoint' (one model), "
                           "'checkpoints' ([high noise, low noise]) or 'random' { ... }", ghc_cfg_where(cfg, NULL));
        goto fail;
    }
    if (nlist) {
        if (nlist != 2) {
            rc = ghc_error_set(core, GHC_ECONFIG, "%s: wan22: 'checkpoints' takes two files, the high-noise expert "
                               "then the low-noise one; got %d", ghc_cfg_where(cfg, "checkpoints"), nlist);
            goto fail;
        }
        for (int i = 0; i < 2; i++)
            if ((rc = ghc_cfg_list_string(cfg, "checkpoints", i, &paths[i])) < 0)
                goto fail;
        if (strstr(paths[0], "low_noise") || strstr(paths[0], "transformer_2/"))
            ghc_log(core, GHC_LOG_WARN, "%s: wan22: the first of 'checkpoints' is the high-noise expert, but '%s' "
                    "looks like a low-noise one", ghc_cfg_where(cfg, "checkpoints"), paths[0]);
        if (strstr(paths[1], "high_noise"))
            ghc_log(core, GHC_LOG_WARN, "%s: wan22: the second of 'checkpoints' is the low-noise expert, but '%s' "
                    "looks like a high-noise one", ghc_cfg_where(cfg, "checkpoints"), paths[1]);
        m->n_experts = 2;
    } else if (rnd) {
        given[0] = ghc_cfg_has(rnd, "in_channels");
        given[1] = ghc_cfg_has(rnd, "out_channels");
        given[2] = ghc_cfg_has(rnd, "text_dim");
        if ((rc = read_random(m, rnd, &n_random, &seed)) < 0)
            goto fail;
        m->n_experts = (int32_t)n_random;
    } else {
        paths[0] = path;
        m->n_experts = 1;
    }
    /* relative to the configuration file when written there, to the working directory when
     * given with --set (the rule of every path in a configuration) */
    char abs[2][4096];
    for (int i = 0; !rnd && i < m->n_experts; i++) {
        if ((rc = ghc_cfg_resolve_path(cfg, nlist ? "checkpoints" : "checkpoint", paths[i], abs[i], sizeof(abs[i]))) < 0)
            goto fail;
        paths[i] = abs[i];
    }
    if (!(m->experts = calloc((size_t)m->n_experts, sizeof(*m->experts)))) {
        rc = ghc_error_set(core, GHC_ENOMEM, "wan22: out of memory");
        goto fail;
    }
    for (int32_t e = 0; e < m->n_experts; e++) {
        enum ghc_mem_role role = e == 0 ? GHC_ROLE_WEIGHTS : GHC_ROLE_WEIGHTS_INACTIVE;
        if (rnd) {
            rc = wan22_random(m, (uint64_t)seed + (uint64_t)e * 0x9e3779b97f4a7c15ull, &m->experts[e], role);
        } else {
            struct wan22_detected det;
            rc = wan22_load(m, paths[e], heads, &m->experts[e], role, &det);
        }
        if (rc < 0 || (rc = wan22_pad_weights(m, &m->experts[e], role)) < 0 ||
            (rc = wan22_weights_group(m, e)) < 0)   /* for policies that stream blocks */
            goto fail;
    }
    double def_boundary = m->d.in_ch == 36 ? 0.9 : 0.875;
    if ((rc = ghc_cfg_get_float(cfg, "boundary", def_boundary, 0.0, 1.0, &m->boundary)) < 0)
        goto fail;
    if ((rc = build_targets(m)) < 0)
        goto fail;
    /* the largest block linear, D x F: the scratch for a dequantised or folded weight */
    const int64_t wmax = m->d.dim * (m->d.ffn_dim > m->d.dim ? m->d.ffn_dim : m->d.dim);
    if (!(m->lin = ghc_linears_new(core, m->device, m->base, m->n_targets, wmax))) {
        rc = ghc_error_code(core) < 0 ? ghc_error_code(core) : GHC_ENOMEM;
        goto fail;
    }
    input_from(m, cfg, rnd, given, paths[0], nlist > 0);
    ghc_log(core, GHC_LOG_INFO, "wan22: %d expert%s%s, %s weights, %s, checkpointing %s (every %d), %d targets",
            (int)m->n_experts, m->n_experts > 1 ? "s" : "", m->n_experts > 1 ? " (0 high noise, 1 low noise)" : "",
            m->fp8 ? (m->fp8_gemm ? "F8_E4M3 (scaled) block, fp8 GEMM" : "F8_E4M3 (scaled) block")
                   : ghc_dtype_name(m->base),
            m->device == GHC_DEVICE_CPU ? "cpu" : "cuda", ckpts[ck], m->ckpt_every, (int)m->n_targets);
    *self = m;
    return 0;
fail:
    wan22_free(m);
    return rc;
}

/* ---- experts, targets, hooks ----------------------------------------------------------------- */

static int32_t wan22_experts(void *self)
{
    return ((struct wan22 *)self)->n_experts;
}

static int32_t wan22_expert_for(void *self, float t)
{
    struct wan22 *m = self;
    if (m->n_experts < 2)
        return 0;
    return (double)t >= m->boundary * 1000.0 ? 0 : 1;   /* t >= boundary: the high-noise expert */
}

static int wan22_targets(void *self, const struct ghc_model_target **out, int32_t *n)
{
    struct wan22 *m = self;
    *out = m->targets;
    *n = m->n_targets;
    return 0;
}

/* A14B's two experts by the noise level they serve: the names of the peers' files. */
static const char *wan22_expert_name(void *self, int32_t expert)
{
    struct wan22 *m = self;
    if (m->n_experts < 2)
        return NULL;
    return expert == 0 ? "high_noise" : "low_noise";
}

/* Every variant has the Wan2.1 DiT's layout, which musubi-tuner's ModelSpec metadata names
 * "wan2.1" (the files the Wan loaders of musubi-tuner, ComfyUI and diffusers read). */
static const char *wan22_architecture(void *self)
{
    (void)self;
    return "wan2.1";
}

static int wan22_set_hook(void *self, const struct ghc_adapter_hook *hook)
{
    struct wan22 *m = self;
    int64_t *room = NULL;
    if (hook && m->pad) {   /* every block linear keeps pad spare columns for its adapter */
        if (!(room = calloc((size_t)m->n_targets, sizeof(*room))))
            return ghc_error_set(m->core, GHC_ENOMEM, "wan22: out of memory");
        for (int32_t t = 0; t < m->n_targets; t++) {
            struct ghc_linear lin = { 0 };
            wan22_linear_room(m, t, &lin);
            room[t] = lin.spare;
        }
    }
    int rc = ghc_linears_set_hook(m->lin, hook, room);
    free(room);
    if (rc < 0)
        return rc;
    for (int32_t t = 0; hook && t < m->n_targets; t++) {
        int32_t wanted = 0;
        if (ghc_linears_concat_rank(m->lin, t, &wanted) == 0 && wanted > m->pad && m->pad && !m->pad_told++)
            ghc_log(m->core, GHC_LOG_INFO, "wan22: %s (and any other such target): the adapter's rank %d is "
                    "above adapter_pad = %lld: its part runs in passes of its own (adapter_pad >= %d puts it "
                    "into the model's GEMMs)", m->targets[t].name, (int)wanted, (long long)m->pad, (int)wanted);
    }
    bool concat = rc > 0;
    if (hook && concat != m->concat) {   /* (no hook: the spare columns stay, unused) */
        wan22_state_free(m);   /* the activations' spare columns come and go with it */
        m->concat = concat;
    }
    return 0;
}

struct advise_ctx {
    ghc_mempolicy_t  *mp;
    enum ghc_mem_role role;
};

static int advise_one(void *user, ghc_tensor_t *t)
{
    struct advise_ctx *c = user;
    return ghc_mem_advise(c->mp, ghc_tensor_data(t), ghc_tensor_nbytes(t), c->role);
}

static int wan22_activate(void *self, int32_t expert)
{
    struct wan22 *m = self;
    ghc_mempolicy_t *mp = ghc_mempolicy_get(m->core);
    int rc = 0;
    if (expert == m->active || m->n_experts < 2)
        return 0;
    if (mp) {
        struct advise_ctx off = { mp, GHC_ROLE_WEIGHTS_INACTIVE }, on = { mp, GHC_ROLE_WEIGHTS };
        if ((rc = wan22_weights_each(m, &m->experts[m->active], advise_one, &off)) < 0 ||
            (rc = wan22_weights_each(m, &m->experts[expert], advise_one, &on)) < 0 ||
            (rc = ghc_mem_phase(mp, GHC_PHASE_EXPERT_SWITCH, expert)) < 0)
            return rc;
    }
    m->active = expert;
    m->st.valid = false;
    return 0;
}

static int wan22_fwd(void *self, int32_t expert, const struct ghc_model_batch *batch, ghc_tensor_t *out, bool keep,
                     void *stream)
{
    return wan22_forward(self, expert, batch, out, keep, stream);
}

static int wan22_bwd(void *self, int32_t expert, const ghc_tensor_t *dout, ghc_tensor_t *dnoisy, void *stream)
{
    return wan22_backward(self, expert, dout, dnoisy, stream);
}

/* ---- registration ----------------------------------------------------------------------------- */

static int wan22_device(void *self) { return ((struct wan22 *)self)->device; }

/* The frozen weight of a target as loaded (base dtype or e4m3 with its scale; resident where the
 * memory policy put it) and its f32 bias. */
static int wan22_target_weight(void *self, int32_t expert, int32_t target, const ghc_tensor_t **w,
                               float *w_scale, const ghc_tensor_t **b)
{
    struct wan22 *m = self;
    if (target < 0 || target >= m->n_targets)
        return ghc_error_set(m->core, GHC_EINVAL, "wan22: target %d out of range (the model has %d)", (int)target,
                             (int)m->n_targets);
    const struct wan22_block_w *bw = &m->experts[expert].blocks[target / WAN22_TARGETS];
    int j = target % WAN22_TARGETS;
    *w = bw->w[j];
    int64_t N, K;
    wan22_slot_dims(m, j, &N, &K);
    if (ghc_tensor_dim(*w, 1) != K) {   /* with spare room: the weight's view */
        ghc_tensor_free(m->twv);
        if (!(m->twv = wan22_wsub(m, *w, 0, N, 0, K)))
            return ghc_error_code(m->core) < 0 ? ghc_error_code(m->core) : GHC_ENOMEM;
        *w = m->twv;
    }
    *w_scale = bw->wscale[j];
    *b = bw->b[j];
    return 0;
}

/* Wan's input: the latent's channels (C_out of them are the noisy latent; I2V appends
 * C_in - C_out conditioning channels), the umT5 width, 512 text rows, patches of 1 x 2 x 2. */
static int wan22_input_spec(void *self, struct ghc_model_input *out)
{
    struct wan22 *m = self;
    int64_t c = m->d.in_ch < m->d.out_ch ? m->d.in_ch : m->d.out_ch;
    struct ghc_model_input in = {
        .struct_size = out->struct_size, .channels = c, .cond_channels = m->d.in_ch - c,
        .text_dim = m->d.text_dim, .text_len = WAN22_TEXT_LEN, .patch = { 1, 2, 2 },
        .channels_from = m->ch_from, .text_dim_from = m->text_from,
        .text_len_from = "Wan2.2's text context of 512 rows",
        .patch_from = "Wan2.2's patches of 1 x 2 x 2 frames x height x width",
    };
    memcpy(out, &in, out->struct_size < sizeof(in) ? out->struct_size : sizeof(in));
    return 0;
}

static const struct ghc_model_ops wan22_ops = {
    .struct_size = sizeof(struct ghc_model_ops),
    .name = "wan22",
    .keys = wan22_keys,
    .init = wan22_init,
    .experts = wan22_experts,
    .expert_for = wan22_expert_for,
    .targets = wan22_targets,
    .set_hook = wan22_set_hook,
    .forward = wan22_fwd,
    .backward = wan22_bwd,
    .activate = wan22_activate,
    .free = wan22_free,
    .device = wan22_device,
    .target_weight = wan22_target_weight,
    .input_spec = wan22_input_spec,
    .expert_name = wan22_expert_name,
    .estimate = wan22_estimate,
    .merge_names = wan22_merge_names,
    .architecture = wan22_architecture,
};

static int wan22_plugin_init(ghc_core_t *core)
{
    return ghc_register_model(core, &wan22_ops);
}

GHC_PLUGIN_EXPORT const struct ghc_plugin ghc_plugin_wan22 = {
    .abi = GHC_PLUGIN_ABI,
    .api = GHC_API_VERSION,
    .struct_size = sizeof(struct ghc_plugin),
    .kinds = GHC_KIND_BIT(GHC_KIND_MODEL),
    .name = "wan22",
    .version = GHC_VERSION,
    .description = "Wan2.2 diffusion transformer (A14B experts, 5B, 1.3B, custom): forward, backward, adapter hooks",
    .init = wan22_plugin_init,
};
