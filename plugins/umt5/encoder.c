/* encoder.c: the umT5 encoder: weights from safetensors (transformers/diffusers/ComfyUI or Wan's
 * official names, sharded or not, fp8 "scaled" dequantised) and the forward pass as Wan's
 * T5Encoder computes it, in f32 on the CPU through libgh200core_ops:
 *   x = E[ids]; per layer: x += Attn(RMS(x) g1) Wo^T with per-layer relative-position bias,
 *   no 1/sqrt(d_kv), padded keys masked; x += (gelu_tanh(h W0^T) * (h W1^T)) W2^T, h = RMS(x) g2;
 *   y = RMS(x) g_final, trimmed to the true length. */
#include <config.h>

#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <gh200core/ops.h>
#include <gh200core/safetensors.h>

#include "umt5.h"

/* The per-layer tensors, in the order of their names below. */
enum { W_NORM1, W_Q, W_K, W_V, W_O, W_BIAS, W_NORM2, W_WI0, W_WI1, W_WO, W_COUNT };

/* transformers names under "encoder.block.{i}.", Wan's official under "blocks.{i}." */
static const char *const hf_names[W_COUNT] = {
    "layer.0.layer_norm.weight", "layer.0.SelfAttention.q.weight", "layer.0.SelfAttention.k.weight",
    "layer.0.SelfAttention.v.weight", "layer.0.SelfAttention.o.weight",
    "layer.0.SelfAttention.relative_attention_bias.weight", "layer.1.layer_norm.weight",
    "layer.1.DenseReluDense.wi_0.weight", "layer.1.DenseReluDense.wi_1.weight", "layer.1.DenseReluDense.wo.weight",
};
static const char *const official_names[W_COUNT] = {
    "norm1.weight", "attn.q.weight", "attn.k.weight", "attn.v.weight", "attn.o.weight",
    "pos_embedding.embedding.weight", "norm2.weight", "ffn.gate.0.weight", "ffn.fc1.weight", "ffn.fc2.weight",
};

struct layer {
    ghc_tensor_t *w[W_COUNT];
};

struct ghc_umt5 {
    ghc_core_t            *core;
    struct ghc_umt5_config cfg;
    int                    device;       /* GHC_DEVICE_CPU or a CUDA ordinal: every tensor below lives there */
    enum ghc_dtype         dtype;        /* the linears' and the activations' between the norms */
    ghc_tensor_t          *embed;        /* [vocab, d_model]: the file's dtype when bf16 or f16, else `dtype` */
    ghc_tensor_t          *final_norm;   /* [d_model] f32 */
    struct layer          *layers;       /* norms and bias tables f32, linears `dtype` */
};

void ghc_umt5_config_xxl(struct ghc_umt5_config *cfg)
{
    *cfg = (struct ghc_umt5_config){ .vocab = 256384, .d_model = 4096, .d_kv = 64, .d_ff = 10240, .layers = 24,
                                     .heads = 64, .num_buckets = 32, .max_distance = 128, .eps = 1e-6f };
}

const struct ghc_umt5_config *ghc_umt5_get_config(const ghc_umt5_t *enc)
{
    return &enc->cfg;
}

void ghc_umt5_free(ghc_umt5_t *enc)
{
    if (!enc)
        return;
    for (int64_t l = 0; enc->layers && l < enc->cfg.layers; l++)
        for (int j = 0; j < W_COUNT; j++)
            ghc_tensor_free(enc->layers[l].w[j]);
    free(enc->layers);
    ghc_tensor_free(enc->embed);
    ghc_tensor_free(enc->final_norm);
    free(enc);
}

/* ---- loading ---------------------------------------------------------------------------------- */

/* How the file names its tensors. */
struct naming {
    bool        official;
    const char *prefix;   /* before every name: "" or "encoder." (official names only) */
};

static void tensor_name(const struct naming *nm, int64_t layer, int slot, char *buf, size_t len)
{
    if (nm->official)
        snprintf(buf, len, "%sblocks.%lld.%s", nm->prefix, (long long)layer, official_names[slot]);
    else
        snprintf(buf, len, "encoder.block.%lld.%s", (long long)layer, hf_names[slot]);
}

/* Find `name` with the expected shape (dims < 0 are not checked). */
static int find(ghc_core_t *core, ghc_st_t *st, const char *path, const char *name, int ndim, const int64_t *shape,
                struct ghc_st_info *info)
{
    if (!ghc_st_find(st, name, info))
        return ghc_error_set(core, GHC_EFORMAT, "%s: umT5 tensor '%s' is missing", path, name);
    bool ok = info->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++)
        ok = shape[i] < 0 || info->shape[i] == shape[i];
    if (!ok) {
        char got[96] = "[", want[96] = "[";
        for (int i = 0; i < info->ndim; i++)
            snprintf(got + strlen(got), sizeof(got) - strlen(got), "%s%lld", i ? ", " : "", (long long)info->shape[i]);
        for (int i = 0; i < ndim; i++)
            snprintf(want + strlen(want), sizeof(want) - strlen(want), "%s%lld", i ? ", " : "", (long long)shape[i]);
        return ghc_error_set(core, GHC_EFORMAT, "%s: umT5 tensor '%s' has shape %s], expected %s]", path, name, got,
                             want);
    }
    return 0;
}

/* *t (a CPU tensor) times scale in `dt`, rounded once; *t replaced (NULL on error). */
static int convert(ghc_core_t *core, ghc_tensor_t **t, enum ghc_dtype dt, float scale)
{
    ghc_tensor_t *w = ghc_tensor_init(core, dt, ghc_tensor_ndim(*t), ghc_tensor_shape(*t), GHC_DEVICE_CPU,
                                      GHC_ROLE_ENCODER_WEIGHTS);
    int rc = w ? ghc_tensor_convert_cpu(w, *t, scale) : ghc_error_code(core) < 0 ? ghc_error_code(core) : GHC_ENOMEM;
    ghc_tensor_free(*t);
    if (rc < 0) {
        ghc_tensor_free(w);
        w = NULL;
    }
    *t = w;
    return rc;
}

/* Load a found tensor on the CPU as `dt` (f32, bf16 or f16), dequantising fp8 with ComfyUI's
 * per-tensor scale (X.scale_weight, or X.weight_scale) in f32 first. */
static int load(ghc_core_t *core, ghc_st_t *st, const char *path, const struct ghc_st_info *info, enum ghc_dtype dt,
                ghc_tensor_t **out)
{
    float scale = 1.0f;
    const enum ghc_dtype want = dt;
    if (info->dtype == GHC_DTYPE_F8_E4M3 || info->dtype == GHC_DTYPE_F8_E5M2) {
        char base[300], sname[320];
        size_t n = strlen(info->name);
        snprintf(base, sizeof(base), "%.*s", (int)(n > 7 && strcmp(info->name + n - 7, ".weight") == 0 ? n - 7 : n),
                 info->name);
        struct ghc_st_info si;
        snprintf(sname, sizeof(sname), "%s.scale_weight", base);
        if (!ghc_st_find(st, sname, &si))
            snprintf(sname, sizeof(sname), "%s.weight_scale", base);
        if (!ghc_st_find(st, sname, &si))
            return ghc_error_set(core, GHC_EFORMAT, "%s: tensor '%s' is %s without a per-tensor scale "
                                 "('%s.scale_weight')", path, info->name, ghc_dtype_name(info->dtype), base);
        ghc_tensor_t *s = ghc_st_load(st, sname, GHC_DTYPE_F32, GHC_ROLE_ENCODER_WEIGHTS);
        if (!s)
            return ghc_error_code(core);
        bool one = ghc_tensor_numel(s) == 1;
        scale = one ? *(const float *)ghc_tensor_cdata(s) : 0.0f;
        ghc_tensor_free(s);
        if (!one)
            return ghc_error_set(core, GHC_EUNSUPPORTED, "%s: scale '%s' is not one number; only per-tensor fp8 "
                                 "scales are supported", path, sname);
        dt = GHC_DTYPE_F32;   /* scaled in f32, then rounded once to `want` */
    } else if (!ghc_dtype_is_float(info->dtype)) {
        return ghc_error_set(core, GHC_EFORMAT, "%s: tensor '%s' is %s, expected a float dtype", path, info->name,
                             ghc_dtype_name(info->dtype));
    }
    ghc_tensor_t *t = ghc_st_load(st, info->name, dt, GHC_ROLE_ENCODER_WEIGHTS);
    if (!t)
        return ghc_error_code(core) < 0 ? ghc_error_code(core) : GHC_EIO;
    if (dt == want && scale == 1.0f) {
        *out = t;
        return 0;
    }
    int rc = convert(core, &t, want, scale);
    *out = t;
    return rc;
}

/* Move *t (a CPU tensor) to `device` (GHC_DEVICE_CPU: leave it), freeing the host copy. */
static int to_device(ghc_core_t *core, ghc_tensor_t **t, int device)
{
    if (device == GHC_DEVICE_CPU)
        return 0;
    ghc_tensor_t *d = ghc_tensor_init(core, ghc_tensor_dtype(*t), ghc_tensor_ndim(*t), ghc_tensor_shape(*t), device,
                                      GHC_ROLE_ENCODER_WEIGHTS);
    int rc = !d ? (ghc_error_code(core) < 0 ? ghc_error_code(core) : GHC_ENOMEM) : ghc_op_copy(d, *t, NULL);
    if (rc == 0)
        rc = ghc_op_sync(core, device, NULL);   /* the host copy may go */
    if (rc < 0) {
        ghc_tensor_free(d);
        return rc;
    }
    ghc_tensor_free(*t);
    *t = d;
    return 0;
}

/* The CPU dtype a tensor of slot j (W_COUNT: the final norm) is loaded in. */
static enum ghc_dtype slot_dtype(const ghc_umt5_t *enc, int j)
{
    return j == W_COUNT || j == W_NORM1 || j == W_NORM2 || j == W_BIAS ? GHC_DTYPE_F32 : enc->dtype;
}

/* Check a placement (NULL: the CPU in f32) and record it. */
static int set_place(ghc_core_t *core, ghc_umt5_t *enc, const struct ghc_umt5_place *place)
{
    enc->device = place ? place->device : GHC_DEVICE_CPU;
    enc->dtype = place ? place->dtype : GHC_DTYPE_F32;
    if (enc->dtype != GHC_DTYPE_F32 && enc->dtype != GHC_DTYPE_BF16)
        return ghc_error_set(core, GHC_EINVAL, "umt5: dtype %s, expected F32 or BF16", ghc_dtype_name(enc->dtype));
    if (enc->device < GHC_DEVICE_CPU)
        return ghc_error_set(core, GHC_EINVAL, "umt5: device %d is neither the cpu (-1) nor a CUDA ordinal",
                             enc->device);
    return 0;
}

static bool has_suffix(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* The embedding's name and the naming of the rest. */
static int detect(ghc_core_t *core, ghc_st_t *st, const char *path, struct naming *nm, const char **embed)
{
    static const struct { const char *name; bool official; const char *prefix; } probes[] = {
        { "shared.weight", false, "" },
        { "encoder.embed_tokens.weight", false, "" },
        { "token_embedding.weight", true, "" },
        { "encoder.token_embedding.weight", true, "encoder." },
    };
    struct ghc_st_info info;
    for (size_t i = 0; i < sizeof(probes) / sizeof(probes[0]); i++)
        if (ghc_st_find(st, probes[i].name, &info)) {
            nm->official = probes[i].official;
            nm->prefix = probes[i].prefix;
            *embed = probes[i].name;
            return 0;
        }
    return ghc_error_set(core, GHC_EFORMAT, "%s: not a umT5 encoder: none of the embeddings 'shared.weight', "
                         "'encoder.embed_tokens.weight', 'token_embedding.weight' is in it", path);
}

/* 1 + the highest block index of any tensor named like the naming's blocks (so a block missing
 * one tensor is reported as such, not taken for the end). */
static int64_t count_layers(const ghc_st_t *st, const struct naming *nm)
{
    char pre[64];
    snprintf(pre, sizeof(pre), "%s%s", nm->prefix, nm->official ? "blocks." : "encoder.block.");
    const size_t np = strlen(pre);
    int64_t layers = 0;
    for (int i = 0; i < ghc_st_count(st); i++) {
        struct ghc_st_info info;
        if (!ghc_st_info_at(st, i, &info) || strncmp(info.name, pre, np) != 0)
            continue;
        char *end;
        long long b = strtoll(info.name + np, &end, 10);
        if (end != info.name + np && *end == '.' && b >= 0 && b < 100000 && b + 1 > layers)
            layers = b + 1;
    }
    return layers;
}

/* Check `got` against a wanted field (0: anything). */
static int match(ghc_core_t *core, const char *path, const char *what, int64_t want, int64_t got)
{
    if (want && want != got)
        return ghc_error_set(core, GHC_EFORMAT, "%s: umT5 %s is %lld in the file, the configuration says %lld", path,
                             what, (long long)got, (long long)want);
    return 0;
}

ghc_umt5_t *ghc_umt5_init(ghc_core_t *core, const char *path, const struct ghc_umt5_config *want,
                          const struct ghc_umt5_place *place)
{
    static const char *const pickles[] = { ".pth", ".pt", ".bin", ".ckpt", ".pkl" };
    for (size_t i = 0; i < sizeof(pickles) / sizeof(pickles[0]); i++)
        if (has_suffix(path, pickles[i])) {
            ghc_error_set(core, GHC_EUNSUPPORTED, "%s: PyTorch pickles (Wan's models_t5_umt5-xxl-enc-bf16.pth) are "
                          "not read; use a safetensors umT5: ComfyUI's umt5_xxl_fp16.safetensors or "
                          "umt5_xxl_fp8_e4m3fn_scaled.safetensors, or a diffusers repo's "
                          "text_encoder/model.safetensors.index.json", path);
            return NULL;
        }
    struct ghc_umt5_config none = { 0 };
    if (!want)
        want = &none;
    ghc_umt5_t *enc = calloc(1, sizeof(*enc));
    ghc_st_t *st = NULL;
    struct naming nm = { false, "" };
    const char *embed_name = NULL;
    struct ghc_st_info info;
    char name[320];
    int rc = 0;
    if (!enc) {
        ghc_error_set(core, GHC_ENOMEM, "umt5: out of memory");
        return NULL;
    }
    enc->core = core;
    if ((rc = set_place(core, enc, place)) < 0)
        goto out;
    if (!(st = ghc_st_open(core, path))) {
        rc = ghc_error_code(core) < 0 ? ghc_error_code(core) : GHC_EIO;
        goto out;
    }
    if ((rc = detect(core, st, path, &nm, &embed_name)) < 0)
        goto out;
    /* the shape from the tensors: embedding, layer count, layer 0's bias table, q and wi_0 */
    struct ghc_umt5_config *c = &enc->cfg;
    if ((rc = find(core, st, path, embed_name, 2, (const int64_t[]){ -1, -1 }, &info)) < 0)
        goto out;
    c->vocab = info.shape[0];
    c->d_model = info.shape[1];
    c->layers = count_layers(st, &nm);
    tensor_name(&nm, 0, W_BIAS, name, sizeof(name));
    if ((rc = find(core, st, path, name, 2, (const int64_t[]){ -1, -1 }, &info)) < 0)
        goto out;
    c->num_buckets = (int32_t)info.shape[0];
    c->heads = info.shape[1];
    tensor_name(&nm, 0, W_Q, name, sizeof(name));
    if ((rc = find(core, st, path, name, 2, (const int64_t[]){ -1, c->d_model }, &info)) < 0)
        goto out;
    c->d_kv = c->heads ? info.shape[0] / c->heads : 0;
    if (c->heads && info.shape[0] % c->heads) {
        rc = ghc_error_set(core, GHC_EFORMAT, "%s: umT5 tensor '%s' has %lld rows, not a multiple of the %lld heads "
                           "of the position bias", path, name, (long long)info.shape[0], (long long)c->heads);
        goto out;
    }
    tensor_name(&nm, 0, W_WI0, name, sizeof(name));
    if ((rc = find(core, st, path, name, 2, (const int64_t[]){ -1, c->d_model }, &info)) < 0)
        goto out;
    c->d_ff = info.shape[0];
    c->max_distance = want->max_distance ? want->max_distance : 128;
    c->eps = want->eps > 0.0f ? want->eps : 1e-6f;
    if ((rc = match(core, path, "vocab (embedding rows)", want->vocab, c->vocab)) < 0 ||
        (rc = match(core, path, "d_model", want->d_model, c->d_model)) < 0 ||
        (rc = match(core, path, "layers", want->layers, c->layers)) < 0 ||
        (rc = match(core, path, "heads", want->heads, c->heads)) < 0 ||
        (rc = match(core, path, "d_kv", want->d_kv, c->d_kv)) < 0 ||
        (rc = match(core, path, "d_ff", want->d_ff, c->d_ff)) < 0 ||
        (rc = match(core, path, "num_buckets", want->num_buckets, c->num_buckets)) < 0)
        goto out;
    if (c->layers < 1 || c->heads < 1 || c->d_kv < 1 || c->num_buckets < 4 || c->d_ff < 1 || c->d_model < 1) {
        rc = ghc_error_set(core, GHC_EFORMAT, "%s: not a umT5 encoder: %lld layers, %lld heads of %lld, %d buckets, "
                           "d_ff %lld", path, (long long)c->layers, (long long)c->heads, (long long)c->d_kv,
                           c->num_buckets, (long long)c->d_ff);
        goto out;
    }
    /* every tensor, its shape checked */
    if ((rc = find(core, st, path, embed_name, 2, (const int64_t[]){ c->vocab, c->d_model }, &info)) < 0 ||
        (rc = load(core, st, path, &info, info.dtype == GHC_DTYPE_BF16 || info.dtype == GHC_DTYPE_F16 ? info.dtype
                   : enc->dtype, &enc->embed)) < 0 || (rc = to_device(core, &enc->embed, enc->device)) < 0)
        goto out;
    snprintf(name, sizeof(name), "%s%s", nm.prefix, nm.official ? "norm.weight" : "encoder.final_layer_norm.weight");
    if ((rc = find(core, st, path, name, 1, (const int64_t[]){ c->d_model }, &info)) < 0 ||
        (rc = load(core, st, path, &info, slot_dtype(enc, W_COUNT), &enc->final_norm)) < 0 ||
        (rc = to_device(core, &enc->final_norm, enc->device)) < 0)
        goto out;
    if (!(enc->layers = calloc((size_t)c->layers, sizeof(*enc->layers)))) {
        rc = ghc_error_set(core, GHC_ENOMEM, "umt5: out of memory");
        goto out;
    }
    const int64_t D = c->d_model, I = c->heads * c->d_kv, F = c->d_ff;
    const int64_t shapes[W_COUNT][2] = {
        [W_NORM1] = { D, 0 }, [W_Q] = { I, D }, [W_K] = { I, D }, [W_V] = { I, D }, [W_O] = { D, I },
        [W_BIAS] = { c->num_buckets, c->heads }, [W_NORM2] = { D, 0 }, [W_WI0] = { F, D }, [W_WI1] = { F, D },
        [W_WO] = { D, F },
    };
    for (int64_t l = 0; l < c->layers; l++)
        for (int j = 0; j < W_COUNT; j++) {
            tensor_name(&nm, l, j, name, sizeof(name));
            if ((rc = find(core, st, path, name, shapes[j][1] ? 2 : 1, shapes[j], &info)) < 0 ||
                (rc = load(core, st, path, &info, slot_dtype(enc, j), &enc->layers[l].w[j])) < 0 ||
                (rc = to_device(core, &enc->layers[l].w[j], enc->device)) < 0)
                goto out;
        }
    ghc_log(core, GHC_LOG_INFO, "umt5: %s: %s names, %lld layers, d_model %lld, %lld heads of %lld, d_ff %lld, "
            "vocab %lld, %d buckets; embedding %s, linears %s on %s%d", path, nm.official ? "official" : "transformers",
            (long long)c->layers, (long long)D, (long long)c->heads, (long long)c->d_kv, (long long)F,
            (long long)c->vocab, c->num_buckets, ghc_dtype_name(ghc_tensor_dtype(enc->embed)),
            ghc_dtype_name(enc->dtype), enc->device < 0 ? "cpu" : "cuda:", enc->device < 0 ? 0 : enc->device);
out:
    ghc_st_free(st);
    if (rc < 0) {
        ghc_umt5_free(enc);
        return NULL;
    }
    return enc;
}

/* A drawn CPU tensor in `dt`: `one` 1 everywhere (a norm's weight), else normal times `scale`
 * drawn in f32 (then rounded once to dt). */
static int drawn(ghc_core_t *core, int ndim, const int64_t *shape, bool one, float scale, uint64_t seed,
                 enum ghc_dtype dt, ghc_tensor_t **out)
{
    struct ghc_rng rng = { .seed = seed, .offset = 0 };
    ghc_tensor_t *t = ghc_tensor_init(core, GHC_DTYPE_F32, ndim, shape, GHC_DEVICE_CPU, GHC_ROLE_ENCODER_WEIGHTS);
    int rc = !t ? (ghc_error_code(core) < 0 ? ghc_error_code(core) : GHC_ENOMEM)
           : one ? ghc_op_fill(t, 1.0, NULL) : ghc_op_rand_normal(t, &rng, NULL);
    if (rc == 0 && !one)
        rc = ghc_op_scale(t, t, scale, NULL);
    if (rc == 0 && dt != GHC_DTYPE_F32)
        rc = convert(core, &t, dt, 1.0f);
    if (rc < 0)
        ghc_tensor_free(t);
    *out = rc < 0 ? NULL : t;
    return rc;
}

ghc_umt5_t *ghc_umt5_init_random(ghc_core_t *core, const struct ghc_umt5_config *cfg, uint64_t seed,
                                 const struct ghc_umt5_place *place)
{
    const struct ghc_umt5_config *c = cfg;
    if (c->layers < 1 || c->heads < 1 || c->d_kv < 1 || c->num_buckets < 4 || c->d_ff < 1 || c->d_model < 1 ||
        c->vocab < 2) {
        ghc_error_set(core, GHC_EINVAL, "umt5: a random encoder needs layers, heads, d_kv, d_ff, d_model >= 1, "
                      "vocab >= 2 and num_buckets >= 4");
        return NULL;
    }
    ghc_umt5_t *enc = calloc(1, sizeof(*enc));
    if (!enc || !(enc->layers = calloc((size_t)c->layers, sizeof(*enc->layers)))) {
        free(enc);
        ghc_error_set(core, GHC_ENOMEM, "umt5: out of memory");
        return NULL;
    }
    enc->core = core;
    enc->cfg = *c;
    int rc = set_place(core, enc, place);
    enc->cfg.max_distance = c->max_distance ? c->max_distance : 128;
    enc->cfg.eps = c->eps > 0.0f ? c->eps : 1e-6f;
    const int64_t D = c->d_model, I = c->heads * c->d_kv, F = c->d_ff;
    const int64_t shapes[W_COUNT][2] = {
        [W_NORM1] = { D, 0 }, [W_Q] = { I, D }, [W_K] = { I, D }, [W_V] = { I, D }, [W_O] = { D, I },
        [W_BIAS] = { c->num_buckets, c->heads }, [W_NORM2] = { D, 0 }, [W_WI0] = { F, D }, [W_WI1] = { F, D },
        [W_WO] = { D, F },
    };
    /* drawn in f32 on the CPU (the same weights wherever they go), then placed */
    if (rc == 0 && (rc = drawn(core, 2, (const int64_t[]){ c->vocab, D }, false, 1.0f, seed, enc->dtype,
                               &enc->embed)) == 0)
        rc = to_device(core, &enc->embed, enc->device);
    if (rc == 0 && (rc = drawn(core, 1, &D, true, 0.0f, 0, GHC_DTYPE_F32, &enc->final_norm)) == 0)
        rc = to_device(core, &enc->final_norm, enc->device);
    for (int64_t l = 0; l < c->layers && rc == 0; l++)
        for (int j = 0; j < W_COUNT && rc == 0; j++) {
            bool norm = j == W_NORM1 || j == W_NORM2;
            float scale = j == W_BIAS ? 0.1f : (float)(1.0 / sqrt((double)shapes[j][1]));
            if ((rc = drawn(core, norm ? 1 : 2, shapes[j], norm, scale, seed + (uint64_t)(l * W_COUNT + j + 1),
                            slot_dtype(enc, j), &enc->layers[l].w[j])) == 0)
                rc = to_device(core, &enc->layers[l].w[j], enc->device);
        }
    if (rc < 0) {
        ghc_umt5_free(enc);
        return NULL;
    }
    return enc;
}

/* ---- forward ---------------------------------------------------------------------------------- */

/* Scratch of one forward over B prompts of n positions (N = B n rows), on the encoder's device:
 * the residual x and the output y in f32, the rest in the encoder's dtype; q4 .. o4 are
 * [B, n, H, d_kv] views of q .. o; host_ids, host_mask: the inputs on the CPU. */
struct scratch {
    ghc_tensor_t *ids, *mask, *x, *h, *q, *k, *v, *o, *q4, *k4, *v4, *o4, *bias, *a, *b, *y;
    ghc_tensor_t *host_ids, *host_mask;
};

static void scratch_free(struct scratch *s)
{
    ghc_tensor_t **t = (ghc_tensor_t **)s;
    for (size_t i = 0; i < sizeof(*s) / sizeof(*t); i++)
        ghc_tensor_free(t[i]);
}

static ghc_tensor_t *act(const ghc_umt5_t *enc, enum ghc_dtype dt, int ndim, const int64_t *shape)
{
    return ghc_tensor_init(enc->core, dt, ndim, shape, enc->device, GHC_ROLE_ENCODER_ACTIVATIONS);
}

static ghc_tensor_t *heads_view(const ghc_umt5_t *enc, ghc_tensor_t *t, int64_t B, int64_t n)
{
    return ghc_tensor_wrap(enc->core, ghc_tensor_dtype(t), 4,
                           (const int64_t[]){ B, n, enc->cfg.heads, enc->cfg.d_kv }, enc->device,
                           ghc_tensor_data(t));
}

/* x += y W^T, y = a W^T etc.: a linear without bias, C accumulated with beta. */
static int linear(ghc_tensor_t *y, const ghc_tensor_t *x, const ghc_tensor_t *w, float beta)
{
    const struct ghc_gemm g = { .trans_b = true, .beta = beta };
    return ghc_op_gemm(y, x, w, &g, NULL);
}

static int layer_forward(const ghc_umt5_t *enc, const struct layer *ly, struct scratch *s)
{
    const struct ghc_umt5_config *c = &enc->cfg;
    int rc;
    if ((rc = ghc_op_rmsnorm_fwd(s->h, NULL, s->x, ly->w[W_NORM1], c->eps, NULL)) < 0 ||
        (rc = linear(s->q, s->h, ly->w[W_Q], 0.0f)) < 0 || (rc = linear(s->k, s->h, ly->w[W_K], 0.0f)) < 0 ||
        (rc = linear(s->v, s->h, ly->w[W_V], 0.0f)) < 0 ||
        (rc = ghc_op_rel_pos_bias(s->bias, ly->w[W_BIAS], c->num_buckets, c->max_distance, true, NULL)) < 0 ||
        (rc = ghc_op_attention_bias_fwd(s->o4, s->q4, s->k4, s->v4, s->bias, s->mask, 1.0f, NULL)) < 0 ||
        (rc = linear(s->x, s->o, ly->w[W_O], 1.0f)) < 0)
        return rc;
    if ((rc = ghc_op_rmsnorm_fwd(s->h, NULL, s->x, ly->w[W_NORM2], c->eps, NULL)) < 0 ||
        (rc = linear(s->a, s->h, ly->w[W_WI0], 0.0f)) < 0 || (rc = ghc_op_gelu_tanh(s->a, s->a, NULL)) < 0 ||
        (rc = linear(s->b, s->h, ly->w[W_WI1], 0.0f)) < 0 || (rc = ghc_op_mul(s->a, s->a, s->b, NULL)) < 0 ||
        (rc = linear(s->x, s->a, ly->w[W_WO], 1.0f)) < 0)
        return rc;
    return 0;
}

/* Check one prompt's ids and mask; *L = its true length. */
static int check_prompt(const ghc_umt5_t *enc, int32_t p, const int32_t *ids, const int32_t *mask, int32_t n,
                        int64_t *L)
{
    ghc_core_t *core = enc->core;
    for (int32_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= enc->cfg.vocab)
            return ghc_error_set(core, GHC_EINVAL, "umt5: prompt %d: id %d at position %d is outside the vocabulary "
                                 "[0, %lld)", p, ids[i], i, (long long)enc->cfg.vocab);
    *L = n;
    if (!mask)
        return 0;
    for (*L = 0; *L < n && mask[*L] == 1; (*L)++) {}   /* 1s then 0s; L = the 1s */
    for (int32_t i = (int32_t)*L; i < n; i++)
        if (mask[i] != 0)
            return ghc_error_set(core, GHC_EINVAL, "umt5: prompt %d: mask[%d] is %d after the padding began at %lld "
                                 "(expected 1s then 0s)", p, i, mask[i], (long long)*L);
    if (*L == 0)
        return ghc_error_set(core, GHC_EINVAL, "umt5: prompt %d: the mask has no token (the EOS at least is "
                             "expected)", p);
    return 0;
}

/* The scratch of B prompts of n positions, the inputs on the device. */
static int scratch_init(const ghc_umt5_t *enc, struct scratch *s, const int32_t *ids, const int32_t *mask,
                        const int64_t *L, int64_t B, int64_t n)
{
    ghc_core_t *core = enc->core;
    const struct ghc_umt5_config *c = &enc->cfg;
    const int64_t N = B * n, D = c->d_model, I = c->heads * c->d_kv, F = c->d_ff;
    const enum ghc_dtype dt = enc->dtype, f = GHC_DTYPE_F32;
    bool padded = false;
    for (int64_t b = 0; b < B; b++)
        padded |= L[b] < n;
    if (!(s->host_ids = ghc_tensor_wrap(core, GHC_DTYPE_I32, 1, &N, GHC_DEVICE_CPU, (void *)ids)) ||
        !(s->x = act(enc, f, 2, (const int64_t[]){ N, D })) || !(s->h = act(enc, dt, 2, (const int64_t[]){ N, D })) ||
        !(s->q = act(enc, dt, 2, (const int64_t[]){ N, I })) || !(s->k = act(enc, dt, 2, (const int64_t[]){ N, I })) ||
        !(s->v = act(enc, dt, 2, (const int64_t[]){ N, I })) || !(s->o = act(enc, dt, 2, (const int64_t[]){ N, I })) ||
        !(s->q4 = heads_view(enc, s->q, B, n)) || !(s->k4 = heads_view(enc, s->k, B, n)) ||
        !(s->v4 = heads_view(enc, s->v, B, n)) || !(s->o4 = heads_view(enc, s->o, B, n)) ||
        !(s->bias = act(enc, f, 3, (const int64_t[]){ c->heads, n, n })) ||
        !(s->a = act(enc, dt, 2, (const int64_t[]){ N, F })) || !(s->b = act(enc, dt, 2, (const int64_t[]){ N, F })) ||
        !(s->y = act(enc, f, 2, (const int64_t[]){ N, D })))
        return ghc_error_code(core) < 0 ? ghc_error_code(core) : GHC_ENOMEM;
    if (padded) {   /* the padded keys' mask, [B, n] f32 */
        if (!(s->host_mask = ghc_tensor_init(core, f, 2, (const int64_t[]){ B, n }, GHC_DEVICE_CPU,
                                             GHC_ROLE_ENCODER_ACTIVATIONS)))
            return ghc_error_code(core);
        float *m = ghc_tensor_data(s->host_mask);
        for (int64_t i = 0; i < N; i++)
            m[i] = (float)mask[i];
    }
    if (enc->device == GHC_DEVICE_CPU) {
        s->ids = s->host_ids;
        s->mask = s->host_mask;
        s->host_ids = s->host_mask = NULL;
        return 0;
    }
    int rc;
    if (!(s->ids = act(enc, GHC_DTYPE_I32, 1, &N)) || (padded && !(s->mask = act(enc, f, 2, (const int64_t[]){ B, n }))))
        return ghc_error_code(core);
    if ((rc = ghc_op_copy(s->ids, s->host_ids, NULL)) < 0 ||
        (padded && (rc = ghc_op_copy(s->mask, s->host_mask, NULL)) < 0))
        return rc;
    return 0;
}

int ghc_umt5_encode_batch(ghc_umt5_t *enc, const int32_t *ids, const int32_t *mask, int32_t B, int32_t n,
                          ghc_tensor_t **out)
{
    ghc_core_t *core = enc->core;
    const struct ghc_umt5_config *c = &enc->cfg;
    struct scratch s = { 0 };
    int64_t *L = NULL;
    int rc = 0;
    for (int32_t b = 0; b < B; b++)
        out[b] = NULL;
    if (n < 1 || B < 1)
        return ghc_error_set(core, GHC_EINVAL, "umt5: %d prompts of %d ids, expected at least 1 of 1", B, n);
    if (!(L = malloc(sizeof(*L) * (size_t)B)))
        return ghc_error_set(core, GHC_ENOMEM, "umt5: out of memory");
    for (int32_t b = 0; b < B && rc == 0; b++)
        rc = check_prompt(enc, b, ids + (int64_t)b * n, mask ? mask + (int64_t)b * n : NULL, n, &L[b]);
    if (rc < 0 || (rc = scratch_init(enc, &s, ids, mask, L, B, n)) < 0)
        goto out;
    if ((rc = ghc_op_embedding(s.x, enc->embed, s.ids, NULL)) < 0)
        goto out;
    for (int64_t l = 0; l < c->layers; l++)
        if ((rc = layer_forward(enc, &enc->layers[l], &s)) < 0)
            goto out;
    if ((rc = ghc_op_rmsnorm_fwd(s.y, NULL, s.x, enc->final_norm, c->eps, NULL)) < 0)
        goto out;
    const int64_t D = c->d_model;
    if (enc->device == GHC_DEVICE_CPU && B == 1 && L[0] == n) {   /* the whole output */
        out[0] = s.y;
        s.y = NULL;
        goto out;
    }
    /* each prompt's true rows, copied from the device (or the host) straight into its tensor:
     * no staging copy of the whole batch, one synchronisation */
    for (int32_t b = 0; b < B && rc == 0; b++) {
        ghc_tensor_t *rows = NULL;
        if (!(out[b] = ghc_tensor_init(core, GHC_DTYPE_F32, 2, (const int64_t[]){ L[b], D }, GHC_DEVICE_CPU,
                                       GHC_ROLE_TEXT_EMBEDS)) ||
            !(rows = ghc_tensor_wrap(core, GHC_DTYPE_F32, 2, (const int64_t[]){ L[b], D }, enc->device,
                                     (float *)ghc_tensor_data(s.y) + (int64_t)b * n * D)))
            rc = ghc_error_code(core) < 0 ? ghc_error_code(core) : GHC_ENOMEM;
        else
            rc = ghc_op_copy(out[b], rows, NULL);
        ghc_tensor_free(rows);
    }
    if (rc == 0 && enc->device != GHC_DEVICE_CPU)
        rc = ghc_op_sync(core, enc->device, NULL);
out:
    scratch_free(&s);
    free(L);
    if (rc < 0)
        for (int32_t b = 0; b < B; b++) {
            ghc_tensor_free(out[b]);
            out[b] = NULL;
        }
    return rc;
}

ghc_tensor_t *ghc_umt5_encode(ghc_umt5_t *enc, const int32_t *ids, const int32_t *mask, int32_t n)
{
    ghc_tensor_t *out = NULL;
    return ghc_umt5_encode_batch(enc, ids, mask, 1, n, &out) < 0 ? NULL : out;
}
