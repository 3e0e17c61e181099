/* merge.c: the network's merge members (network.h, merge_open ... merge_free): an adapter file
 * read for `gh200core merge`, its tensors grouped into modules by the suffixes file.c knows,
 * in any naming (ComfyUI `diffusion_model.`, musubi `lora_unet_`, diffusers/peft
 * `transformer.` and lora_A/lora_B, bare names); each module's algorithm, factor shapes and
 * scale inferred from which keys exist and their shapes, as the loaders of ComfyUI and LyCORIS
 * do (no tensor stores rank, factor or algorithm); delta-W and the DoRA rule from algo.c
 * (lyc_delta, lyc_merge_weight), so a merge and the hooks use one math. A DoRA file's metadata
 * says what its dora_scale is divided by (LYC_DORA_NORM_KEY): the base weight's row norms in
 * the files the plugin writes (ComfyUI's reading), those of W + delta-W in LyCORIS's and older
 * ones. */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gh200core/safetensors.h>

#include "lycoris_impl.h"

typedef struct lyc_adapter lyc_adapter_t;

struct lyc_amod {
    char              *key;                  /* module name as in the file */
    const char        *name;                 /* into key, past the naming's prefix */
    bool               musubi;
    int                kind;                 /* -1 none yet, else enum lyc_algo */
    const char        *t[LYC_MAX_PARAMS];    /* tensor names per slot */
    const char        *sfx[LYC_MAX_PARAMS];
    const char        *alpha, *dora;
    struct lyc_module  md;
};

struct lyc_adapter {
    ghc_core_t        *core;
    struct lycoris     net;                  /* CPU, scratch only: no model, no experts */
    struct lyc_amod   *m;
    int32_t            n, cap;
    const char       **skipped;
    int32_t            n_skipped;
    ghc_st_t          *st;
    bool               dora_base;            /* LYC_DORA_NORM_KEY "base_weight" */
};

static const char *const prefixes[] = { "model.diffusion_model.", "diffusion_model.", "base_model.model.",
                                        "transformer.", "lora_unet_" };

static int bad(lyc_adapter_t *a, const char *path, const char *tensor, const char *what)
{
    return ghc_error_set(a->core, GHC_EFORMAT, "%s: tensor '%s': %s", path, tensor, what);
}

static struct lyc_amod *module_for(lyc_adapter_t *a, const char *key, size_t len)
{
    for (int32_t i = 0; i < a->n; i++)
        if (strlen(a->m[i].key) == len && strncmp(a->m[i].key, key, len) == 0)
            return &a->m[i];
    if (a->n == a->cap) {
        int32_t cap = a->cap ? 2 * a->cap : 64;
        struct lyc_amod *m = realloc(a->m, (size_t)cap * sizeof(*m));
        if (!m)
            return NULL;
        a->m = m;
        a->cap = cap;
    }
    struct lyc_amod *md = &a->m[a->n];
    *md = (struct lyc_amod){ .kind = -1 };
    if (!(md->key = strndup(key, len)))
        return NULL;
    md->name = md->key;
    for (size_t p = 0; p < sizeof(prefixes) / sizeof(prefixes[0]); p++) {
        size_t l = strlen(prefixes[p]);
        if (strncmp(md->key, prefixes[p], l) == 0 && md->key[l]) {
            md->name = md->key + l;
            md->musubi = p == 4;
            break;
        }
    }
    a->n++;
    return md;
}

static const int64_t *shape2(lyc_adapter_t *a, const char *name, struct ghc_st_info *info)
{
    ghc_st_find(a->st, name, info);
    return info->ndim == 2 && ghc_dtype_is_float(info->dtype) ? info->shape : NULL;
}

/* Shapes, rank, LoKr factors and scale of one module; its tensors loaded as f32. */
static int infer(lyc_adapter_t *a, const char *path, struct lyc_amod *am)
{
    static const char *const kind_name[] = { "LoRA", "LoHa", "LoKr" };
    struct lyc_module *md = &am->md;
    struct ghc_st_info in[LYC_MAX_PARAMS];
    const int64_t *s[LYC_MAX_PARAMS] = { 0 };
    char msg[256];
    if (am->kind < 0)
        return bad(a, path, am->alpha ? am->alpha : am->dora, "an alpha or dora_scale without adapter factors");
    md->algo = (enum lyc_algo)am->kind;
    md->name = am->key;
    for (int i = 0; i < LYC_MAX_PARAMS; i++)
        if (am->t[i] && !(s[i] = shape2(a, am->t[i], &in[i])))
            return bad(a, path, am->t[i], "expected a 2-D float tensor");
    if (md->algo == LYC_LOKR) {
        md->w1_lr = am->sfx[0] && strcmp(am->sfx[0], "lokr_w1_a") == 0;
        md->w2_lr = am->sfx[2] && strcmp(am->sfx[2], "lokr_w2_a") == 0;
    }
    /* which slots the algorithm needs */
    bool need[LYC_MAX_PARAMS] = { true, true, md->algo != LYC_LORA, md->algo != LYC_LORA };
    if (md->algo == LYC_LOKR) {
        need[1] = md->w1_lr;
        need[3] = md->w2_lr;
    }
    for (int i = 0; i < LYC_MAX_PARAMS; i++) {
        if (need[i] && !am->t[i]) {
            snprintf(msg, sizeof(msg), "%s module '%s' is missing a factor (slot %d: %s)", kind_name[md->algo],
                     am->key, i, md->algo == LYC_LORA ? (i ? "lora_up / lora_B" : "lora_down / lora_A") :
                     md->algo == LYC_LOHA ? "hada_w1_a, hada_w1_b, hada_w2_a, hada_w2_b" :
                     i == 1 ? "lokr_w1_b" : i == 3 ? "lokr_w2_b" : "lokr_w1 / lokr_w2");
            return ghc_error_set(a->core, GHC_EFORMAT, "%s: %s", path, msg);
        }
        if (!need[i] && am->t[i])
            return bad(a, path, am->t[i], "does not fit the module's other tensors (a full LoKr factor and its "
                       "low-rank halves, or a stray factor)");
    }
    bool ok = true;
    switch (md->algo) {
    case LYC_LORA:    /* down [r, in], up [out, r] */
        md->rank = (int32_t)s[0][0];
        md->in = s[0][1];
        md->out = s[1][0];
        ok = s[1][1] == s[0][0];
        break;
    case LYC_LOHA:    /* w1a [out, r], w1b [r, in], w2a [out, r2], w2b [r2, in] */
        md->rank = (int32_t)s[1][0];
        md->out = s[0][0];
        md->in = s[1][1];
        ok = s[0][1] == s[1][0] && s[2][1] == s[3][0] && s[2][0] == md->out && s[3][1] == md->in;
        break;
    case LYC_LOKR:    /* W1 [a, c] (or [a, r] [r, c]), W2 [b, d] (or [b, r] [r, d]) */
        md->a = s[0][0];
        md->c = md->w1_lr ? s[1][1] : s[0][1];
        md->b = s[2][0];
        md->d = md->w2_lr ? s[3][1] : s[2][1];
        ok = (!md->w1_lr || s[0][1] == s[1][0]) && (!md->w2_lr || s[2][1] == s[3][0]);
        md->rank = (int32_t)(md->w2_lr ? s[2][1] : md->w1_lr ? s[0][1] : 0);   /* ComfyUI's dim rule */
        md->out = md->a * md->b;
        md->in = md->c * md->d;
        break;
    }
    if (!ok)
        return ghc_error_set(a->core, GHC_EFORMAT, "%s: %s module '%s': the factors' inner dimensions disagree",
                             path, kind_name[md->algo], am->key);
    md->scale = 1.0f;
    if (am->alpha) {
        struct ghc_st_info ai;
        ghc_st_find(a->st, am->alpha, &ai);
        if (ai.nbytes == 0 || ai.nbytes / ghc_dtype_size(ai.dtype) != 1 || !ghc_dtype_is_float(ai.dtype))
            return bad(a, path, am->alpha, "alpha must be one float");
        ghc_tensor_t *t = lyc_load_finite(a->core, a->st, path, am->alpha);
        if (!t)
            return ghc_error_code(a->core);
        if (md->rank > 0)   /* rank 0: both-full LoKr, s = 1 whatever its alpha */
            md->scale = (float)(*(const float *)ghc_tensor_cdata(t) / md->rank);
        ghc_tensor_free(t);
    }
    if (am->dora) {
        struct ghc_st_info di;
        const int64_t *g = shape2(a, am->dora, &di);
        if (md->algo != LYC_LORA)
            return ghc_error_set(a->core, GHC_EUNSUPPORTED, "%s: tensor '%s': DoRA on %s is not supported (the "
                                 "lycoris plugin implements DoRA on LoRA only, doc/lycoris.md)", path, am->dora,
                                 kind_name[md->algo]);
        if (!g || g[0] != md->out || g[1] != 1) {
            snprintf(msg, sizeof(msg), "expected dora_scale [%lld, 1] float (output axis)%s", (long long)md->out,
                     g && g[0] == 1 && g[1] == md->in ? "; input-axis DoRA (wd_on_out = False) is not supported" : "");
            return bad(a, path, am->dora, msg);
        }
        md->dora = true;
        md->dora_base = a->dora_base;
        am->t[2] = am->dora;
    }
    for (int i = 0; i < LYC_MAX_PARAMS; i++)
        if (am->t[i] && !(md->p[i] = lyc_load_finite(a->core, a->st, path, am->t[i])))
            return ghc_error_code(a->core);
    return 0;
}

int lyc_merge_open(ghc_core_t *core, const char *path, void **out)
{
    int rc = 0;
    lyc_adapter_t *a = calloc(1, sizeof(*a));
    *out = NULL;
    if (!a)
        return ghc_error_set(core, GHC_ENOMEM, "lycoris: out of memory");
    a->core = a->net.core = core;
    a->net.device = GHC_DEVICE_CPU;
    if (!(a->st = ghc_st_open(core, path))) {
        rc = ghc_error_code(core);
        goto fail;
    }
    const char *norm = ghc_st_metadata(a->st, LYC_DORA_NORM_KEY);
    if (norm && strcmp(norm, "base_weight") != 0 && strcmp(norm, "adapted_weight") != 0) {
        rc = ghc_error_set(core, GHC_EFORMAT, "%s: metadata %s = '%s': expected \"base_weight\" or "
                           "\"adapted_weight\"", path, LYC_DORA_NORM_KEY, norm);
        goto fail;
    }
    a->dora_base = norm && strcmp(norm, "base_weight") == 0;
    int n = ghc_st_count(a->st);
    if (!(a->skipped = calloc((size_t)(n ? n : 1), sizeof(char *)))) {
        rc = ghc_error_set(core, GHC_ENOMEM, "lycoris: out of memory");
        goto fail;
    }
    for (int t = 0; t < n; t++) {
        struct ghc_st_info info;
        size_t plen;
        int kind, slot;
        ghc_st_info_at(a->st, t, &info);
        const char *sfx = lyc_suffix_match(info.name, &plen, &kind, &slot);
        if (!sfx) {
            a->skipped[a->n_skipped++] = info.name;
            continue;
        }
        struct lyc_amod *m = module_for(a, info.name, plen);
        if (!m) {
            rc = ghc_error_set(core, GHC_ENOMEM, "lycoris: out of memory");
            goto fail;
        }
        if (kind == 3 || kind == 4) {
            *(kind == 3 ? &m->alpha : &m->dora) = info.name;
            continue;
        }
        if (m->kind >= 0 && m->kind != kind) {
            rc = bad(a, path, info.name, "mixes adapter algorithms in one module");
            goto fail;
        }
        if (m->t[slot]) {
            char msg[320];
            snprintf(msg, sizeof(msg), "a second tensor for the same factor (first '%s')", m->t[slot]);
            rc = bad(a, path, info.name, msg);
            goto fail;
        }
        m->kind = kind;
        m->t[slot] = info.name;
        m->sfx[slot] = sfx;
    }
    if (!a->n) {
        rc = ghc_error_set(core, GHC_EFORMAT, "%s: no adapter tensors (none ends in lora_down/lora_up, lora_A/"
                           "lora_B, hada_w*, lokr_w*)", path);
        goto fail;
    }
    for (int32_t i = 0; i < a->n && rc == 0; i++)
        rc = infer(a, path, &a->m[i]);
    if (rc < 0)
        goto fail;
    *out = a;
    return 0;
fail:
    lyc_merge_free(a);
    return rc;
}

int32_t lyc_merge_count(void *adapter)
{
    return ((const lyc_adapter_t *)adapter)->n;
}

int lyc_merge_module(void *adapter, int32_t i, struct ghc_merge_module *out)
{
    const struct lyc_amod *m = &((const lyc_adapter_t *)adapter)->m[i];
    struct ghc_merge_module mm = { .struct_size = out->struct_size, .key = m->key, .name = m->name,
                                   .underscored = m->musubi, .algo = m->md.dora ? "dora" : lyc_algo_name(m->md.algo),
                                   .out = m->md.out, .in = m->md.in };
    memcpy(out, &mm, out->struct_size < sizeof(mm) ? out->struct_size : sizeof(mm));
    return 0;
}

const char *lyc_merge_skipped(void *adapter, int32_t i)
{
    const lyc_adapter_t *a = adapter;
    return i >= 0 && i < a->n_skipped ? a->skipped[i] : NULL;
}

int lyc_merge_apply(void *adapter, int32_t i, ghc_tensor_t *w, float multiplier)
{
    lyc_adapter_t *a = adapter;
    return lyc_merge_weight(&a->net, &a->m[i].md, w, multiplier, NULL);
}

void lyc_merge_free(void *adapter)
{
    lyc_adapter_t *a = adapter;
    if (!a)
        return;
    for (int32_t i = 0; i < a->n; i++) {
        for (int k = 0; k < LYC_MAX_PARAMS; k++)
            ghc_tensor_free(a->m[i].md.p[k]);
        free(a->m[i].md.wn2);
        free(a->m[i].key);
    }
    free(a->m);
    free(a->skipped);
    lyc_ws_free(&a->net);
    free(a->net.hbuf);
    ghc_st_free(a->st);
    free(a);
}
