/* plugin.c: the `umt5` text_encoder plugin (encoder.h): umT5 (umt5.h) with its SentencePiece
 * tokenizer, read from `path` and `tokenizer`, or for the embedded demo drawn at random from a
 * small shape (`random`), its ids then the caption's UTF-8 bytes. It runs where `device` and
 * `dtype` say (a GPU in bf16 by default where the memory policy gives CUDA memory); captions in
 * and embeddings out stay on the host either way. */
#include <config.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gh200core/encoder.h>
#include <gh200core/mempolicy.h>
#include <gh200core/plugin.h>
#include <gh200core/run.h>

#include "umt5.h"

static const struct ghc_cfg_key umt5_random_keys[] = {
    { "d_model", GHC_CFG_INT, "32", "1 to 65536", NULL },
    { "layers", GHC_CFG_INT, "2", "1 to 256", NULL },
    { "heads", GHC_CFG_INT, "2", "1 to 1024", NULL },
    { "d_kv", GHC_CFG_INT, "16", "1 to 4096", NULL },
    { "d_ff", GHC_CFG_INT, "64", "1 to 262144", NULL },
    { "seed", GHC_CFG_INT, "11", "0 or more", NULL },
    { NULL, 0, NULL, NULL, NULL }
};

static const struct ghc_cfg_key umt5_keys[] = {
    { "path", GHC_CFG_STRING, NULL, "the encoder: a .safetensors file or a sharded index", NULL },
    { "tokenizer", GHC_CFG_STRING, NULL, "the SentencePiece model (spiece.model / tokenizer.model)", NULL },
    { "text_len", GHC_CFG_INT, "512", "1 to 4096 (Wan: 512)", NULL },
    { "clean", GHC_CFG_BOOL, "true", "Wan's prompt cleaning first", NULL },
    { "device", GHC_CFG_INT, "(0 with CUDA device memory, else -1)", "-1 to 1023", NULL },
    { "dtype", GHC_CFG_STRING, "(bf16 on a GPU, f32 on the cpu)", "f32, bf16", NULL },
    { "random", GHC_CFG_GROUP, NULL, NULL, umt5_random_keys },
    { NULL, 0, NULL, NULL, NULL }
};

/* The byte ids of a random encoder: 3 + each UTF-8 byte (0 pad, 1 end, 2 unknown below). */
#define BYTE_IDS 3

struct umt5p {
    ghc_core_t     *core;
    ghc_umt5_t     *enc;
    ghc_umt5_tok_t *tok;    /* NULL: byte ids (random) */
    int32_t         text_len;
    bool            clean;
    int32_t        *ids;
};

static void umt5p_free(void *self)
{
    struct umt5p *p = self;
    if (!p)
        return;
    ghc_umt5_free(p->enc);
    ghc_umt5_tok_free(p->tok);
    free(p->ids);
    free(p);
}

/* The `device` and `dtype` keys: by default the GPU (in bf16) where the run's memory policy gives
 * CUDA memory, else the CPU (in f32). */
static int umt5p_place(ghc_core_t *core, ghc_cfg_t *cfg, struct ghc_umt5_place *place)
{
    static const char *const dtypes[] = { "f32", "bf16", NULL };
    int64_t device = GHC_DEVICE_CPU;
    int dt, rc;
    if (ghc_cfg_has(cfg, "device")) {
        if ((rc = ghc_cfg_get_int(cfg, "device", GHC_DEVICE_CPU, GHC_DEVICE_CPU, 1023, &device)) < 0)
            return rc;
    } else {
        device = ghc_mem_default_device(core);
    }
    if ((rc = ghc_cfg_get_choice(cfg, "dtype", device == GHC_DEVICE_CPU ? 0 : 1, dtypes, &dt)) < 0)
        return rc;
    place->device = (int)device;
    place->dtype = dt == 1 ? GHC_DTYPE_BF16 : GHC_DTYPE_F32;
    return 0;
}

static int umt5p_init(ghc_core_t *core, ghc_cfg_t *cfg, void **self)
{
    const char *path = NULL, *tok = NULL;
    ghc_cfg_t *rnd = NULL;
    int64_t text_len;
    bool clean;
    struct ghc_umt5_place place;
    int rc;
    if ((rc = ghc_cfg_get_string(cfg, "path", NULL, &path)) < 0 ||
        (rc = ghc_cfg_get_string(cfg, "tokenizer", NULL, &tok)) < 0 ||
        (rc = ghc_cfg_get_int(cfg, "text_len", 512, 1, 4096, &text_len)) < 0 ||
        (rc = ghc_cfg_get_bool(cfg, "clean", true, &clean)) < 0 ||
        (rc = ghc_cfg_get_group(cfg, "random", umt5_random_keys, &rnd)) < 0 ||
        (rc = umt5p_place(core, cfg, &place)) < 0)
        return rc;
    if (!path == !rnd)
        return ghc_error_set(core, GHC_ECONFIG, "%s: text_encoder: give either 'path' (the umT5 .safetensors) or "
                             "'random' { ... } (a small random encoder), not %s", ghc_cfg_where(cfg, NULL),
                             path ? "both" : "neither");
    if (path && !tok)
        return ghc_error_set(core, GHC_ECONFIG, "%s: text_encoder: 'tokenizer' is missing (the umT5 SentencePiece "
                             "model, e.g. google/umt5-xxl's spiece.model)", ghc_cfg_where(cfg, NULL));
    struct umt5p *p = calloc(1, sizeof(*p));
    if (!p || !(p->ids = calloc((size_t)text_len, sizeof(*p->ids)))) {
        free(p);
        return ghc_error_set(core, GHC_ENOMEM, "umt5: out of memory");
    }
    p->core = core;
    p->text_len = (int32_t)text_len;
    p->clean = clean;
    char abs[4096];
    if (rnd) {
        int64_t v[6];
        static const char *const k[6] = { "d_model", "layers", "heads", "d_kv", "d_ff", "seed" };
        static const int64_t def[6] = { 32, 2, 2, 16, 64, 11 }, max[6] = { 65536, 256, 1024, 4096, 262144, INT64_MAX };
        for (int i = 0; i < 6 && rc == 0; i++)
            rc = ghc_cfg_get_int(rnd, k[i], def[i], i == 5 ? 0 : 1, max[i], &v[i]);
        struct ghc_umt5_config c = { .vocab = BYTE_IDS + 256, .d_model = v[0], .layers = v[1], .heads = v[2],
                                     .d_kv = v[3], .d_ff = v[4], .num_buckets = 32 };
        if (rc == 0 && !(p->enc = ghc_umt5_init_random(core, &c, (uint64_t)v[5], &place)))
            rc = ghc_error_code(core) < 0 ? ghc_error_code(core) : GHC_EINVAL;
    } else {
        if ((rc = ghc_cfg_resolve_path(cfg, "path", path, abs, sizeof(abs))) == 0 &&
            !(p->enc = ghc_umt5_init(core, abs, NULL, &place)))
            rc = ghc_error_code(core) < 0 ? ghc_error_code(core) : GHC_EIO;
        if (rc == 0 && (rc = ghc_cfg_resolve_path(cfg, "tokenizer", tok, abs, sizeof(abs))) == 0 &&
            !(p->tok = ghc_umt5_tok_init(core, abs)))
            rc = ghc_error_code(core) < 0 ? ghc_error_code(core) : GHC_EIO;
        if (rc == 0 && ghc_umt5_tok_size(p->tok) > ghc_umt5_get_config(p->enc)->vocab)
            rc = ghc_error_set(core, GHC_EFORMAT, "%s: text_encoder: the tokenizer has %d pieces, the encoder's "
                               "embedding %lld rows: not the same model", ghc_cfg_where(cfg, "tokenizer"),
                               ghc_umt5_tok_size(p->tok), (long long)ghc_umt5_get_config(p->enc)->vocab);
    }
    if (rc < 0) {
        umt5p_free(p);
        return rc;
    }
    *self = p;
    return 0;
}

static int umt5p_info(void *self, struct ghc_text_encoder_info *out)
{
    const struct umt5p *p = self;
    const struct ghc_umt5_config *c = ghc_umt5_get_config(p->enc);
    struct ghc_text_encoder_info in = { .struct_size = sizeof(in), .dim = c->d_model, .max_len = p->text_len };
    snprintf(in.summary, sizeof(in.summary), "umT5%s (%lld layers, d_model %lld)", p->tok ? "" : ", random",
             (long long)c->layers, (long long)c->d_model);
    size_t n = out->struct_size < sizeof(in) ? out->struct_size : sizeof(in);
    memcpy((char *)out + sizeof(uint32_t), (const char *)&in + sizeof(uint32_t), n - sizeof(uint32_t));
    return 0;
}

static int umt5p_encode(void *self, const char *text, ghc_tensor_t **embed)
{
    struct umt5p *p = self;
    int L;
    if (p->tok) {
        if ((L = ghc_umt5_tok_encode(p->tok, text, p->clean, p->text_len, p->ids, NULL)) < 0)
            return L;
    } else {
        /* bytes as ids, cut to text_len - 1, then the end of text (as the tokenizer does) */
        L = 0;
        for (const unsigned char *s = (const unsigned char *)text; *s && L < p->text_len - 1; s++)
            p->ids[L++] = BYTE_IDS + *s;
        p->ids[L++] = GHC_UMT5_EOS_ID;
    }
    *embed = ghc_umt5_encode(p->enc, p->ids, NULL, L);
    return *embed ? 0 : (ghc_error_code(p->core) < 0 ? ghc_error_code(p->core) : GHC_EINVAL);
}

static const struct ghc_text_encoder_ops umt5_ops = {
    .struct_size = sizeof(struct ghc_text_encoder_ops),
    .name = "umt5",
    .keys = umt5_keys,
    .init = umt5p_init,
    .info = umt5p_info,
    .encode = umt5p_encode,
    .free = umt5p_free,
};

static int umt5_plugin_init(ghc_core_t *core) { return ghc_register_text_encoder(core, &umt5_ops); }

GHC_PLUGIN_EXPORT const struct ghc_plugin ghc_plugin_umt5 = {
    .abi = GHC_PLUGIN_ABI,
    .api = GHC_API_VERSION,
    .struct_size = sizeof(struct ghc_plugin),
    .kinds = GHC_KIND_BIT(GHC_KIND_TEXT_ENCODER),
    .name = "umt5",
    .version = GHC_VERSION,
    .description = "the umT5-XXL text encoder of Wan with its SentencePiece tokenizer, CPU or CUDA",
    .init = umt5_plugin_init,
};
