/* file.c: adapter files of the lycoris plugin (doc/lycoris.md, "Files"): one
 * safetensors file per expert, in musubi/kohya naming (`lora_unet_<path with _>`, the default:
 * the one naming the Wan loaders of ComfyUI, musubi-tuner and diffusers all take), ComfyUI
 * naming (`diffusion_model.<Wan path>.<tensor>`) or diffusers/peft naming
 * (`transformer.<diffusers path>.lora_A.weight`, LoRA only, scale folded into lora_B), plus one
 * file per extra format beside it. Factors in the save dtype, alpha as a 0-dim F32 tensor, the
 * metadata minimum set (Wan's keys only for a model that claims Wan's architecture); DoRA's
 * dora_scale stored as ComfyUI's weight_decompose reads it (divided by the base weight's row
 * norms, LYC_DORA_NORM_KEY). The reader accepts every naming above, any key order and any
 * float dtype, checks the whole file before it changes a parameter, and rescales the "up"
 * factor when the file's scale differs from ours. */
#include <config.h>

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <gh200core/safetensors.h>

#include "lycoris_impl.h"

/* ---- names --------------------------------------------------------------------------------- */

const char *lyc_format_name(enum lyc_format f)
{
    static const char *const names[] = { "comfyui", "musubi", "diffusers" };
    return (unsigned)f < LYC_N_FORMATS ? names[f] : "?";
}

void lyc_extra_path(const char *path, enum lyc_format f, char *buf, size_t len)
{
    size_t l = strlen(path), sl = strlen(".safetensors");
    if (l > sl && strcmp(path + l - sl, ".safetensors") == 0)
        l -= sl;
    snprintf(buf, len, "%.*s.%s.safetensors", (int)l, path, lyc_format_name(f));
}

const char *lyc_key_prefix(const struct lyc_module *md, enum lyc_format format, char *buf, size_t len)
{
    if (format == LYC_FMT_MUSUBI) {
        snprintf(buf, len, "lora_unet_%s", md->name);
        for (char *p = buf + 10; *p; p++)
            if (*p == '.')
                *p = '_';
    } else if (format == LYC_FMT_DIFFUSERS) {
        snprintf(buf, len, "transformer.%s", md->alias ? md->alias : md->name);
    } else {
        snprintf(buf, len, "diffusion_model.%s", md->name);
    }
    return buf;
}

/* The diffusers/peft suffix of LoRA slot i. */
static const char *peft_suffix(int i)
{
    return i == 0 ? "lora_A.weight" : "lora_B.weight";
}

/* The factor that carries a file's scale ratio: lora_up, hada_w1_a, lokr_w1 / lokr_w1_a. */
static int up_slot(const struct lyc_module *md)
{
    return md->algo == LYC_LORA ? 1 : 0;
}

static const char *shape_text(int ndim, const int64_t *shape, char *buf, size_t len)
{
    size_t o = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < len)
        snprintf(buf + o, len - o, "]");
    return buf;
}

/* ---- save ---------------------------------------------------------------------------------- */

static int add_param(struct lycoris *net, ghc_st_writer_t *w, const char *key, const ghc_tensor_t *p, float mul,
                     enum ghc_dtype dt)
{
    int rc;
    ghc_tensor_t *h = ghc_tensor_init(net->core, GHC_DTYPE_F32, ghc_tensor_ndim(p), ghc_tensor_shape(p),
                                      GHC_DEVICE_CPU, GHC_ROLE_WORKSPACE);
    ghc_tensor_t *o = ghc_tensor_init(net->core, dt, ghc_tensor_ndim(p), ghc_tensor_shape(p),
                                      GHC_DEVICE_CPU, GHC_ROLE_WORKSPACE);
    if (!h || !o)
        rc = ghc_error_code(net->core) ? ghc_error_code(net->core) : GHC_ENOMEM;
    else if ((rc = ghc_op_copy(h, p, NULL)) == 0 && (rc = ghc_op_sync(net->core, net->device, NULL)) == 0 &&
             (rc = ghc_tensor_convert_cpu(o, h, mul)) == 0)
        rc = ghc_st_writer_add(w, key, o);
    ghc_tensor_free(h);
    ghc_tensor_free(o);
    return rc;
}

/* The architecture the files are for: the run model's (ghc_model_architecture; NULL where it
 * claims none), or, where the run has no model (a network driven on its own by a program or a
 * test, on targets it is given), Wan's, the naming the plugin's files follow. */
static const char *file_architecture(const struct lycoris *net)
{
    ghc_model_t *model = ghc_model_get(net->core);
    return model ? ghc_model_architecture(model) : "wan2.1";
}

/* The metadata minimum set: kohya's ss_* keys and SAI ModelSpec's. The architecture and the keys
 * the tools' Wan loaders look for are written only for the architecture the model claims. */
static int add_metadata(struct lycoris *net, ghc_st_writer_t *w, enum lyc_format format)
{
    char dim[32], alpha[48], args[256], date[32], spec[96];
    time_t now = time(NULL);
    struct tm tm;
    bool lora = net->algo == LYC_LORA;
    const char *arch = file_architecture(net);
    bool wan = arch && strncmp(arch, "wan", 3) == 0;
    double a = net->alpha > 0 ? net->alpha : (double)net->rank;
    snprintf(dim, sizeof(dim), "%d", (int)net->rank);
    snprintf(alpha, sizeof(alpha), "%.1f", a);
    if (a != floor(a))
        snprintf(alpha, sizeof(alpha), "%.9g", a);
    if (net->algo == LYC_LOKR)
        snprintf(args, sizeof(args), "{\"algo\": \"lokr\", \"factor\": \"%lld\", \"decompose_both\": \"%s\", "
                 "\"full_matrix\": \"%s\"%s}", (long long)net->factor, net->decompose_both ? "True" : "False",
                 net->full_matrix ? "True" : "False", net->rs_lora ? ", \"rs_lora\": \"True\"" : "");
    else
        snprintf(args, sizeof(args), "{\"algo\": \"%s\"%s%s}", lyc_algo_name(net->algo),
                 net->rs_lora ? ", \"rs_lora\": \"True\"" : "", net->dora ? ", \"dora_wd\": \"True\"" : "");
    snprintf(spec, sizeof(spec), "%s/lora", arch ? arch : "");
    gmtime_r(&now, &tm);
    strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", &tm);
    const char *kv[][2] = {
        { "ss_network_module", wan && lora && !net->dora && format != LYC_FMT_COMFYUI ? "networks.lora_wan" :
                               "lycoris.kohya" },
        { "ss_network_dim", dim },
        { "ss_network_args", args },
        { "ss_network_alpha", alpha },
        { "modelspec.title", net->title ? net->title : "gh200core adapter" },
        { "modelspec.date", date },
        { "gh200core.format", lyc_format_name(format) },
        { LYC_DORA_NORM_KEY, net->dora ? "base_weight" : NULL },   /* DoRA files only */
        { "ss_base_model_version", wan ? "wan" : arch },            /* the architecture's keys */
        { "modelspec.sai_model_spec", arch ? "1.0.0" : NULL },
        { "modelspec.architecture", arch ? spec : NULL },
        { "modelspec.implementation", wan ? "https://github.com/Wan-Video/Wan2.1" : NULL },
    };
    int rc = 0;
    for (size_t i = 0; i < sizeof(kv) / sizeof(kv[0]) && rc == 0; i++)
        if (kv[i][1])
            rc = ghc_st_writer_metadata(w, kv[i][0], kv[i][1]);
    return rc;
}

/* A DoRA module's dora_scale as the file stores it (LYC_DORA_NORM_KEY "base_weight"): ComfyUI's
 * weight_decompose (comfy/weight_adapter/base.py) divides the stored value by |W_o| + eps, where
 * we divide g by |W_o + delta-W_o| + eps. So the stored value is g (|W_o| + eps) / (q_o + eps),
 * q from the factors as rounded to the save dtype (the delta-W every loader forms from this
 * file): in ComfyUI each row of W + delta-W gets the norm g we trained. */
static int add_dora_scale(struct lycoris *net, ghc_st_writer_t *w, const char *key, struct lyc_module *md)
{
    ghc_tensor_t *f[2] = { NULL, NULL }, *g = NULL;
    int rc = 0;
    for (int i = 0; i < 2 && rc == 0; i++) {   /* A and B through the save dtype, on the device */
        ghc_tensor_t *h = ghc_tensor_init(net->core, GHC_DTYPE_F32, 2, ghc_tensor_shape(md->p[i]), GHC_DEVICE_CPU,
                                          GHC_ROLE_WORKSPACE);
        ghc_tensor_t *r = ghc_tensor_init(net->core, net->save_dtype, 2, ghc_tensor_shape(md->p[i]), GHC_DEVICE_CPU,
                                          GHC_ROLE_WORKSPACE);
        f[i] = ghc_tensor_init(net->core, GHC_DTYPE_F32, 2, ghc_tensor_shape(md->p[i]), net->device,
                               GHC_ROLE_WORKSPACE);
        if (!h || !r || !f[i])
            rc = ghc_error_code(net->core) ? ghc_error_code(net->core) : GHC_ENOMEM;
        else if ((rc = ghc_op_copy(h, md->p[i], NULL)) == 0 && (rc = ghc_op_sync(net->core, net->device, NULL)) == 0 &&
                 (rc = ghc_tensor_convert_cpu(r, h, 1.0f)) == 0 && (rc = ghc_tensor_convert_cpu(h, r, 1.0f)) == 0 &&
                 (rc = ghc_op_copy(f[i], h, NULL)) == 0)
            rc = ghc_op_sync(net->core, net->device, NULL);
        ghc_tensor_free(h);
        ghc_tensor_free(r);
    }
    if (rc == 0 && !(g = ghc_tensor_init(net->core, GHC_DTYPE_F32, 2, ghc_tensor_shape(md->p[2]), GHC_DEVICE_CPU,
                                         GHC_ROLE_WORKSPACE)))
        rc = ghc_error_code(net->core) ? ghc_error_code(net->core) : GHC_ENOMEM;
    if (rc == 0 && (rc = ghc_op_copy(g, md->p[2], NULL)) == 0 && (rc = ghc_op_sync(net->core, net->device, NULL)) == 0 &&
        (rc = lyc_dora_file_scale(net, md, f[0], f[1], ghc_tensor_data(g), true)) == 0)
        rc = ghc_st_writer_add(w, key, g);
    ghc_tensor_free(f[0]);
    ghc_tensor_free(f[1]);
    ghc_tensor_free(g);
    return rc;
}

static int save_one(struct lycoris *net, struct lyc_expert *e, const char *path, enum lyc_format format)
{
    ghc_st_writer_t *w = ghc_st_writer_init(net->core);
    char prefix[256], key[320];
    int rc = 0;
    if (!w)
        return ghc_error_set(net->core, GHC_ENOMEM, "lycoris: out of memory");
    for (int32_t m = 0; m < e->n_mods && rc == 0; m++) {
        struct lyc_module *md = &e->mods[m];
        lyc_key_prefix(md, format, prefix, sizeof(prefix));
        for (int i = 0; i < LYC_MAX_PARAMS && rc == 0; i++) {
            if (!md->p[i])
                continue;
            bool peft = format == LYC_FMT_DIFFUSERS;
            snprintf(key, sizeof(key), "%s.%s", prefix, peft ? peft_suffix(i) : lyc_param_suffix(md, i));
            if (md->dora && i == 2)   /* dora_scale: always F32, whatever the save dtype */
                rc = add_dora_scale(net, w, key, md);
            else
                rc = add_param(net, w, key, md->p[i], peft && i == up_slot(md) ? md->scale : 1.0f, net->save_dtype);
        }
        if (rc == 0 && format != LYC_FMT_DIFFUSERS) {
            snprintf(key, sizeof(key), "%s.alpha", prefix);
            rc = ghc_st_writer_add_raw(w, key, GHC_DTYPE_F32, 0, NULL, &md->alpha_saved);
        }
    }
    if (rc == 0)
        rc = add_metadata(net, w, format);
    if (rc == 0)
        rc = ghc_st_writer_finish(w, path);
    ghc_st_writer_free(w);
    return rc;
}

int lyc_save(struct lycoris *net, int32_t expert, const char *path)
{
    struct lyc_expert *e = &net->ex[expert];
    char extra[4200];
    int rc = 0;
    for (int k = -1; k < net->n_extra && rc == 0; k++) {
        enum lyc_format f = k < 0 ? net->format : net->extra[k];
        if (k >= 0)
            lyc_extra_path(path, f, extra, sizeof(extra));
        if ((rc = save_one(net, e, k < 0 ? path : extra, f)) == 0)
            ghc_log(net->core, GHC_LOG_INFO, "lycoris: expert %d: %d modules saved to %s (%s naming)", (int)expert,
                    (int)e->n_mods, k < 0 ? path : extra, lyc_format_name(f));
    }
    return rc;
}

/* ---- which tools load a file ------------------------------------------------------------------
 * The rules of the tools' own Wan loaders (doc/lycoris.md, "Which tool loads which file"):
 *   ComfyUI (comfy/lora.py model_lora_keys_unet, load_lora): `diffusion_model.<path>` or
 *     `lora_unet_<path with _>` for every weight of the model; no diffusers names for Wan;
 *     LoRA, LoHa, LoKr and dora_scale (comfy/weight_adapter/).
 *   musubi-tuner (utils/lora_utils.py load_safetensors_with_lora_and_fp8, networks/loha.py and
 *     lokr.py merge_weights_to_tensor): `lora_unet_<path with _>` only; LoRA, LoHa, LoKr with a
 *     full lokr_w1; dora_scale is never read.
 *   diffusers (WanLoraLoaderMixin.lora_state_dict, lora_conversion_utils.py): LoRA only;
 *     `diffusion_model.` names (_convert_non_diffusers_wan_lora_to_diffusers, any subset),
 *     `lora_unet_` names (_convert_musubi_wan_lora_to_diffusers: all 10 linears of blocks 0 to
 *     N-1, nothing else) or peft names; a dora_scale left over is an error.
 * The network checks them only for a model that claims Wan's architecture (or none in the run,
 * see file_architecture); diffusers only where the targets have diffusers names (alias): a
 * model without them has no diffusers naming, and no file of its is expected to load there. */

static const char *const wan_block_linears[] = { "self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o",
                                                 "cross_attn.q", "cross_attn.k", "cross_attn.v", "cross_attn.o",
                                                 "ffn.0", "ffn.2" };

/* Does e hold exactly the 10 Wan linears of blocks 0 .. N-1 (diffusers' musubi converter)? If
 * not, the first module missing or out of place into miss. */
static bool whole_blocks(const struct lyc_expert *e, char *miss, size_t len)
{
    int32_t nb = 0;
    for (int32_t m = 0; m < e->n_mods; m++) {
        long b;
        char *end;
        const char *nm = e->mods[m].name;
        bool wan = strncmp(nm, "blocks.", 7) == 0 && (b = strtol(nm + 7, &end, 10)) >= 0 && end > nm + 7 && *end == '.';
        size_t k = 0;
        while (wan && k < 10 && strcmp(end + 1, wan_block_linears[k]) != 0)
            k++;
        if (!wan || k == 10) {
            snprintf(miss, len, "%s is not one of the 10 block linears", nm);
            return false;
        }
        if ((int32_t)b + 1 > nb)
            nb = (int32_t)b + 1;
    }
    for (int32_t b = 0; b < nb; b++)
        for (size_t k = 0; k < 10; k++) {
            char want[64];
            int32_t m = 0;
            snprintf(want, sizeof(want), "blocks.%d.%s", (int)b, wan_block_linears[k]);
            while (m < e->n_mods && strcmp(e->mods[m].name, want) != 0)
                m++;
            if (m == e->n_mods) {
                snprintf(miss, len, "%s is not adapted", want);
                return false;
            }
        }
    return true;
}

static void add_why(char *why, size_t len, const char *fmt, ...) GHC_PRINTF(3, 4);
static void add_why(char *why, size_t len, const char *fmt, ...)
{
    size_t o = strlen(why);
    va_list ap;
    va_start(ap, fmt);
    if (o < len)
        vsnprintf(why + o, len - o, fmt, ap);
    va_end(ap);
}

unsigned lyc_loaders(const struct lycoris *net, const struct lyc_expert *e, enum lyc_format f, char *why,
                     size_t len)
{
    char buf[512] = "", miss[160];
    unsigned tools = 0;
    bool lokr_w1_lr = false, aliases = false;
    for (int32_t m = 0; m < e->n_mods; m++) {
        lokr_w1_lr |= e->mods[m].algo == LYC_LOKR && e->mods[m].w1_lr;
        aliases |= e->mods[m].alias != NULL;
    }
    if (f == LYC_FMT_DIFFUSERS)
        add_why(buf, sizeof(buf), "ComfyUI maps no diffusers names for Wan; ");
    else
        tools |= LYC_TOOL_COMFYUI;
    if (f != LYC_FMT_MUSUBI)
        add_why(buf, sizeof(buf), "musubi-tuner reads lora_unet_ names only; ");
    else if (net->dora)
        add_why(buf, sizeof(buf), "musubi-tuner does not read dora_scale (it applies the LoRA part alone); ");
    else if (lokr_w1_lr)
        add_why(buf, sizeof(buf), "musubi-tuner's LoKr merge needs a full lokr_w1 (decompose_both gives lokr_w1_a/b); ");
    else
        tools |= LYC_TOOL_MUSUBI;
    if (!aliases) {
        /* the model has no diffusers naming: nothing to expect of diffusers */
    } else if (net->algo != LYC_LORA) {
        add_why(buf, sizeof(buf), "diffusers loads no %s for Wan; ", lyc_algo_name(net->algo));
    } else if (net->dora) {
        add_why(buf, sizeof(buf), "diffusers refuses dora_scale in Wan files; ");
    } else if (f == LYC_FMT_MUSUBI && !whole_blocks(e, miss, sizeof(miss))) {
        add_why(buf, sizeof(buf), "diffusers takes lora_unet_ names only with all 10 linears of blocks 0 to N-1 "
                "(here %s); ", miss);
    } else {
        tools |= LYC_TOOL_DIFFUSERS;
    }
    size_t l = strlen(buf);
    if (l >= 2)
        buf[l - 2] = '\0';
    if (why)
        snprintf(why, len, "%s", buf);
    return tools;
}

/* ---- load ---------------------------------------------------------------------------------- */

/* Tensor suffixes a module may carry, and what they are. */
enum kind { K_UNKNOWN = -1, K_LORA, K_LOHA, K_LOKR, K_ALPHA, K_DORA };

struct suffix {
    const char *name;
    enum kind   kind;
    int         slot;      /* parameter slot; -1 for none */
};

static const struct suffix suffixes[] = {
    { "lora_down.weight", K_LORA, 0 }, { "lora_up.weight", K_LORA, 1 },
    { "lora_A.weight", K_LORA, 0 },    { "lora_B.weight", K_LORA, 1 },
    { "lora_A", K_LORA, 0 },           { "lora_B", K_LORA, 1 },
    { "lora.down.weight", K_LORA, 0 }, { "lora.up.weight", K_LORA, 1 },
    { "hada_w1_a", K_LOHA, 0 }, { "hada_w1_b", K_LOHA, 1 }, { "hada_w2_a", K_LOHA, 2 }, { "hada_w2_b", K_LOHA, 3 },
    { "lokr_w1", K_LOKR, 0 }, { "lokr_w1_a", K_LOKR, 0 }, { "lokr_w1_b", K_LOKR, 1 },
    { "lokr_w2", K_LOKR, 2 }, { "lokr_w2_a", K_LOKR, 2 }, { "lokr_w2_b", K_LOKR, 3 },
    { "alpha", K_ALPHA, -1 },
    { "dora_scale", K_DORA, -1 },
};

const char *lyc_suffix_match(const char *key, size_t *prefix_len, int *kind, int *slot)
{
    const struct suffix *best = NULL;
    size_t kl = strlen(key);
    for (size_t k = 0; k < sizeof(suffixes) / sizeof(suffixes[0]); k++) {
        size_t sl = strlen(suffixes[k].name);
        if (kl > sl + 1 && key[kl - sl - 1] == '.' && strcmp(key + kl - sl, suffixes[k].name) == 0 &&
            (!best || sl > strlen(best->name)))
            best = &suffixes[k];
    }
    if (!best)
        return NULL;
    *prefix_len = kl - strlen(best->name) - 1;
    *kind = (int)best->kind;
    *slot = best->slot;
    return best->name;
}

/* What the file holds for one module. */
struct found {
    const char *key[LYC_MAX_PARAMS];
    const char *suffix[LYC_MAX_PARAMS];
    const char *alpha;
    const char *dora;
    enum kind   kind;
    int         n;
};

/* Does `name` equal module-name candidate `cand` + "." + something? Then the suffix. */
static const char *after(const char *name, const char *cand)
{
    size_t l = strlen(cand);
    return strncmp(name, cand, l) == 0 && name[l] == '.' ? name + l + 1 : NULL;
}

static int file_err(struct lycoris *net, const char *path, const char *fmt, const char *key, const char *detail)
{
    char msg[768];
    snprintf(msg, sizeof(msg), fmt, key, detail);
    return ghc_error_set(net->core, GHC_EFORMAT, "%s: %s", path, msg);
}

/* Assign each tensor of the file to a module of `e` (any naming) in found[]. */
static int scan(struct lycoris *net, struct lyc_expert *e, ghc_st_t *st, const char *path, struct found *found,
                int *unmatched, const char **first_unmatched)
{
    char cand[4][256];
    int n = ghc_st_count(st);
    for (int t = 0; t < n; t++) {
        struct ghc_st_info info;
        ghc_st_info_at(st, t, &info);
        const char *sfx = NULL;
        int32_t m;
        for (m = 0; m < e->n_mods && !sfx; m++) {
            struct lyc_module *md = &e->mods[m];
            lyc_key_prefix(md, LYC_FMT_COMFYUI, cand[0], sizeof(cand[0]));
            lyc_key_prefix(md, LYC_FMT_MUSUBI, cand[1], sizeof(cand[1]));
            lyc_key_prefix(md, LYC_FMT_DIFFUSERS, cand[2], sizeof(cand[2]));
            snprintf(cand[3], sizeof(cand[3]), "%s", md->name);
            for (int c = 0; c < 4 && !sfx; c++)
                sfx = after(info.name, cand[c]);
        }
        if (!sfx) {
            if (!(*unmatched)++)
                *first_unmatched = info.name;
            continue;
        }
        struct found *f = &found[m - 1];
        const struct suffix *s = NULL;
        for (size_t k = 0; k < sizeof(suffixes) / sizeof(suffixes[0]); k++)
            if (strcmp(sfx, suffixes[k].name) == 0)
                s = &suffixes[k];
        if (!s)
            return file_err(net, path, "tensor '%s': unknown adapter tensor '%s' (algorithm not recognised; known: "
                            "LoRA lora_down/lora_up, LoHa hada_w*, LoKr lokr_w*, alpha, dora_scale)", info.name, sfx);
        if (s->kind == K_ALPHA || s->kind == K_DORA) {
            *(s->kind == K_ALPHA ? &f->alpha : &f->dora) = info.name;
            continue;
        }
        if (f->kind != K_UNKNOWN && f->kind != s->kind)
            return file_err(net, path, "tensor '%s': %s mixes adapter algorithms in one module", info.name,
                            e->mods[m - 1].name);
        if (f->key[s->slot])
            return file_err(net, path, "tensor '%s': a second tensor for the same factor (first '%s')", info.name,
                            f->key[s->slot]);
        f->kind = s->kind;
        f->key[s->slot] = info.name;
        f->suffix[s->slot] = s->name;
        f->n++;
    }
    return 0;
}

/* Check module md's tensors (algorithm, completeness, layout, shapes) and work out the ratio of
 * the file's scale to ours. */
static int check_module(struct lycoris *net, struct lyc_module *md, ghc_st_t *st, const char *path,
                        const struct found *f, float *ratio)
{
    static const enum kind want[] = { K_LORA, K_LOHA, K_LOKR };
    static const char *const kind_name[] = { "LoRA", "LoHa", "LoKr" };
    char exp[64], got[64], msg[256];
    if (md->dora != (f->dora != NULL))
        return file_err(net, path, "module '%s': %s", md->name, md->dora ?
                        "'dora_scale' is missing (the network has dora_wd = true; the file is a plain adapter)" :
                        "the file is DoRA ('dora_scale'); set dora_wd = true to load it");
    if (f->kind == K_UNKNOWN)
        return file_err(net, path, "no adapter tensors for module '%s' (%s)", md->name,
                        "the network targets it; a file for other targets cannot be loaded");
    if (f->kind != want[md->algo]) {
        snprintf(msg, sizeof(msg), "the file holds %s tensors, the network is configured for algo \"%s\"",
                 kind_name[f->kind], lyc_algo_name(md->algo));
        return file_err(net, path, "module '%s': %s", md->name, msg);
    }
    for (int i = 0; i < LYC_MAX_PARAMS; i++) {
        const char *expect = lyc_param_suffix(md, i);
        if (md->dora && i == 2) {   /* g: [out, 1] (output axis); [1, in] is the input axis */
            struct ghc_st_info info;
            ghc_st_find(st, f->dora, &info);
            bool in_axis = info.ndim == 2 && info.shape[0] == 1 && info.shape[1] == md->in && md->in != md->out;
            if (info.ndim != 2 || info.shape[0] != md->out || info.shape[1] != 1 || !ghc_dtype_is_float(info.dtype)) {
                snprintf(msg, sizeof(msg), "shape %s %s, expected [%lld, 1] float (output axis)%s",
                         shape_text(info.ndim, info.shape, got, sizeof(got)), ghc_dtype_name(info.dtype),
                         (long long)md->out, in_axis ? "; input-axis DoRA (wd_on_out = False) is not supported" : "");
                return file_err(net, path, "tensor '%s': %s", f->dora, msg);
            }
            continue;
        }
        if (!expect && f->key[i])
            return file_err(net, path, "tensor '%s': %s", f->key[i], md->algo == LYC_LOKR ?
                            "a low-rank LoKr factor where this network has a full one (check factor, rank, "
                            "decompose_both, full_matrix)" : "unexpected tensor");
        if (!expect)
            continue;
        if (!f->key[i]) {
            snprintf(msg, sizeof(msg), "'%s' is missing (found %d of the module's tensors)", expect, f->n);
            return file_err(net, path, "module '%s': %s", md->name, msg);
        }
        if (md->algo == LYC_LOKR && strcmp(f->suffix[i], expect) != 0) {
            snprintf(msg, sizeof(msg), "expected '%s' (check factor, rank, decompose_both, full_matrix)", expect);
            return file_err(net, path, "tensor '%s': %s", f->key[i], msg);
        }
        struct ghc_st_info info;
        ghc_st_find(st, f->key[i], &info);
        if (info.ndim != 2 ||
            info.shape[0] != ghc_tensor_dim(md->p[i], 0) || info.shape[1] != ghc_tensor_dim(md->p[i], 1) ||
            !ghc_dtype_is_float(info.dtype)) {
            snprintf(msg, sizeof(msg), "shape %s %s, expected %s float (rank %d, in %lld, out %lld)",
                     shape_text(info.ndim, info.shape, got, sizeof(got)), ghc_dtype_name(info.dtype),
                     shape_text(2, ghc_tensor_shape(md->p[i]), exp, sizeof(exp)), (int)md->rank, (long long)md->in,
                     (long long)md->out);
            return file_err(net, path, "tensor '%s': %s", f->key[i], msg);
        }
    }
    double s_file = 1.0;
    if (f->alpha) {
        struct ghc_st_info info;
        ghc_st_find(st, f->alpha, &info);
        if (info.nbytes == 0 || info.nbytes / ghc_dtype_size(info.dtype) != 1 || !ghc_dtype_is_float(info.dtype))
            return file_err(net, path, "tensor '%s': alpha must be one float, got %s", f->alpha,
                            shape_text(info.ndim, info.shape, got, sizeof(got)));
        ghc_tensor_t *a = lyc_load_finite(net->core, st, path, f->alpha);
        if (!a)
            return ghc_error_code(net->core);
        double alpha = *(const float *)ghc_tensor_cdata(a);
        ghc_tensor_free(a);
        bool both_full = md->algo == LYC_LOKR && !md->w1_lr && !md->w2_lr;
        if (!both_full)
            s_file = alpha / md->rank;   /* rank: down rows, w1_b rows, or the LoKr low-rank dim */
    }
    *ratio = (float)(s_file / md->scale);
    return 0;
}

ghc_tensor_t *lyc_load_finite(ghc_core_t *core, ghc_st_t *st, const char *path, const char *key)
{
    ghc_tensor_t *t = ghc_st_load(st, key, GHC_DTYPE_F32, GHC_ROLE_WORKSPACE);
    int64_t bad = t ? ghc_tensor_find_nonfinite(t) : -1;
    if (bad >= 0) {
        ghc_error_set(core, GHC_EFORMAT, "%s: tensor '%s': element %lld is %g (a non-finite value; the file is damaged "
                      "or the run that wrote it diverged)", path, key, (long long)bad,
                      (double)((const float *)ghc_tensor_cdata(t))[bad]);
        ghc_tensor_free(t);
        t = NULL;
    }
    return t;
}

int lyc_load(struct lycoris *net, int32_t expert, const char *path)
{
    struct lyc_expert *e = &net->ex[expert];
    int rc = 0, unmatched = 0;
    const char *first = NULL;
    float *ratio = calloc((size_t)e->n_mods, sizeof(float));
    struct found *found = calloc((size_t)e->n_mods, sizeof(*found));
    ghc_st_t *st = NULL;
    if (!ratio || !found) {
        rc = ghc_error_set(net->core, GHC_ENOMEM, "lycoris: out of memory");
        goto out;
    }
    if (!(st = ghc_st_open(net->core, path))) {
        rc = ghc_error_code(net->core);
        goto out;
    }
    for (int32_t m = 0; m < e->n_mods; m++)
        found[m].kind = K_UNKNOWN;
    const char *norm = ghc_st_metadata(st, LYC_DORA_NORM_KEY);
    if (norm && strcmp(norm, "base_weight") != 0 && strcmp(norm, "adapted_weight") != 0) {
        rc = ghc_error_set(net->core, GHC_EFORMAT, "%s: metadata %s = '%s': expected \"base_weight\" or "
                           "\"adapted_weight\"", path, LYC_DORA_NORM_KEY, norm);
        goto out;
    }
    bool base_norm = norm && strcmp(norm, "base_weight") == 0;
    if ((rc = scan(net, e, st, path, found, &unmatched, &first)) < 0)
        goto out;
    for (int32_t m = 0; m < e->n_mods && rc == 0; m++)
        rc = check_module(net, &e->mods[m], st, path, &found[m], &ratio[m]);
    if (rc < 0)
        goto out;
    if (unmatched)   /* as ComfyUI: reported, not fatal */
        ghc_log(net->core, GHC_LOG_WARN, "lycoris: %s: %d tensors match no adapted target, e.g. '%s' (not loaded)",
                path, unmatched, first);
    int rescaled = 0;
    for (int32_t m = 0; m < e->n_mods && rc == 0; m++) {
        struct lyc_module *md = &e->mods[m];
        for (int i = 0; i < LYC_MAX_PARAMS && rc == 0; i++) {
            if (!md->p[i])
                continue;
            const char *key = md->dora && i == 2 ? found[m].dora : found[m].key[i];
            ghc_tensor_t *h = lyc_load_finite(net->core, st, path, key);
            if (!h) {
                rc = ghc_error_code(net->core);
                break;
            }
            if (i == up_slot(md) && fabsf(ratio[m] - 1.0f) > 1e-7f) {
                float *v = ghc_tensor_data(h);
                for (int64_t k = 0; k < ghc_tensor_numel(h); k++)
                    v[k] *= ratio[m];
                rescaled++;
            }
            if (md->dora && i == 2 && base_norm)   /* the stored value back to g (A, B loaded before) */
                rc = lyc_dora_file_scale(net, md, md->p[0], md->p[1], ghc_tensor_data(h), false);
            if (rc == 0 && (rc = ghc_op_copy(md->p[i], h, NULL)) == 0)
                rc = ghc_op_sync(net->core, net->device, NULL);
            ghc_tensor_free(h);
        }
    }
    if (rc == 0)
        ghc_log(net->core, GHC_LOG_INFO, "lycoris: expert %d: %d modules loaded from %s (%d rescaled to this "
                "network's alpha)", (int)expert, (int)e->n_mods, path, rescaled);
out:
    ghc_st_free(st);
    free(found);
    free(ratio);
    return rc;
}
