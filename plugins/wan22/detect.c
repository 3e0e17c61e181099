/* detect.c: the Wan2.x DiT's tensors by name and shape, the official <-> diffusers name
 * mapping (and the module names `gh200core merge` matches adapters with: the model member
 * merge_names), and config detection from a file's tensor list (doc/wan22.md, "Checkpoints"):
 * file prefix, layout, dimensions, the known variants, and a strict check that every expected
 * tensor is present with its shape. Pure functions of names and shapes, so the tests can
 * check detection for A14B, 5B and 1.3B shape sets without the files. */
#include <config.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wan22_impl.h"

/* ---- names -------------------------------------------------------------------------------- */

const char *wan22_variant_name(enum wan22_variant v)
{
    switch (v) {
    case WAN22_A14B_T2V: return "A14B T2V expert (same shapes as Wan2.1 T2V-14B)";
    case WAN22_A14B_I2V: return "A14B I2V expert";
    case WAN22_TI2V_5B:  return "TI2V-5B";
    case WAN21_T2V_1_3B: return "Wan2.1 T2V-1.3B";
    default:             return "custom";
    }
}

const char *wan22_shape_text(int ndim, const int64_t *shape, char *buf, size_t len)
{
    size_t n = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim; i++)
        n += (size_t)snprintf(buf + n, len > n ? len - n : 0, "%s%lld", i ? ", " : "", (long long)shape[i]);
    snprintf(buf + n, len > n ? len - n : 0, "]");
    return buf;
}

/* Official -> diffusers for the part of a block key after "blocks.i." (diffusers' norm2 is the
 * official norm3 and the other way round). */
static const char *const block_map[][2] = {
    { "modulation", "scale_shift_table" },
    { "self_attn.q.", "attn1.to_q." },
    { "self_attn.k.", "attn1.to_k." },
    { "self_attn.v.", "attn1.to_v." },
    { "self_attn.o.", "attn1.to_out.0." },
    { "self_attn.", "attn1." },              /* norm_q, norm_k */
    { "cross_attn.q.", "attn2.to_q." },
    { "cross_attn.k.", "attn2.to_k." },
    { "cross_attn.v.", "attn2.to_v." },
    { "cross_attn.o.", "attn2.to_out.0." },
    { "cross_attn.", "attn2." },
    { "norm3.", "norm2." },                  /* the swap: only the affine norm is stored */
    { "ffn.0.", "ffn.net.0.proj." },
    { "ffn.2.", "ffn.net.2." },
};

static const char *const stem_map[][2] = {
    { "text_embedding.0.", "condition_embedder.text_embedder.linear_1." },
    { "text_embedding.2.", "condition_embedder.text_embedder.linear_2." },
    { "time_embedding.0.", "condition_embedder.time_embedder.linear_1." },
    { "time_embedding.2.", "condition_embedder.time_embedder.linear_2." },
    { "time_projection.1.", "condition_embedder.time_proj." },
    { "head.modulation", "scale_shift_table" },
    { "head.head.", "proj_out." },
};

static bool starts(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }

const char *wan22_name_diffusers(const char *official, char *buf, size_t len)
{
    if (starts(official, "blocks.")) {
        const char *rest = strchr(official + 7, '.');
        if (rest) {
            rest++;
            for (size_t i = 0; i < sizeof(block_map) / sizeof(block_map[0]); i++)
                if (starts(rest, block_map[i][0])) {
                    snprintf(buf, len, "%.*s%s%s", (int)(rest - official), official, block_map[i][1],
                             rest + strlen(block_map[i][0]));
                    return buf;
                }
        }
    } else {
        for (size_t i = 0; i < sizeof(stem_map) / sizeof(stem_map[0]); i++)
            if (starts(official, stem_map[i][0])) {
                snprintf(buf, len, "%s%s", stem_map[i][1], official + strlen(stem_map[i][0]));
                return buf;
            }
    }
    snprintf(buf, len, "%s", official);
    return buf;
}

const char *wan22_name_official(const char *diffusers, char *buf, size_t len)
{
    if (starts(diffusers, "blocks.")) {
        const char *rest = strchr(diffusers + 7, '.');
        if (rest) {
            rest++;
            for (size_t i = 0; i < sizeof(block_map) / sizeof(block_map[0]); i++)
                if (starts(rest, block_map[i][1])) {
                    snprintf(buf, len, "%.*s%s%s", (int)(rest - diffusers), diffusers, block_map[i][0],
                             rest + strlen(block_map[i][1]));
                    return buf;
                }
        }
    } else {
        for (size_t i = 0; i < sizeof(stem_map) / sizeof(stem_map[0]); i++)
            if (starts(diffusers, stem_map[i][1])) {
                snprintf(buf, len, "%s%s", stem_map[i][0], diffusers + strlen(stem_map[i][1]));
                return buf;
            }
    }
    snprintf(buf, len, "%s", diffusers);
    return buf;
}

/* ---- merging: the module names of a base tensor ---------------------------------------------- */

/* Add `name` (a module, '.' written '_' when underscored) to out unless it is there. */
static void merge_name_add(struct ghc_merge_names *out, const char *name, bool underscored)
{
    char u[256];
    snprintf(u, sizeof(u), "%s", name);
    for (char *p = u; underscored && *p; p++)
        if (*p == '.')
            *p = '_';
    for (int32_t i = 0; i < out->n; i++)
        if (out->underscored[i] == underscored && strcmp(out->name[i], u) == 0)
            return;
    if (out->n < GHC_MERGE_NAMES_MAX) {
        snprintf(out->name[out->n], sizeof(out->name[0]), "%s", u);
        out->underscored[out->n++] = underscored;
    }
}

/* The name map works on tensor names: module -> module.weight -> mapped -> without .weight. */
static void module_mapped(const char *module, bool to_diffusers, char *buf, size_t len)
{
    char full[300];
    snprintf(full, sizeof(full), "%s.weight", module);
    if (to_diffusers)
        wan22_name_diffusers(full, buf, len);
    else
        wan22_name_official(full, buf, len);
    size_t l = strlen(buf);
    if (l > 7 && strcmp(buf + l - 7, ".weight") == 0)
        buf[l - 7] = '\0';
}

/* The model's merge_names: a 2-D <module>.weight, in the layouts wan22 loads (official/ComfyUI
 * names with or without the model.diffusion_model. / diffusion_model. prefix, diffusers names),
 * is the module's official and diffusers names, dotted and underscored (musubi-tuner). */
int wan22_merge_names(ghc_core_t *core, const char *tensor, int32_t ndim, const int64_t *shape,
                      struct ghc_merge_names *out)
{
    (void)core;
    (void)shape;
    static const char *const prefixes[] = { "model.diffusion_model.", "diffusion_model." };
    struct ghc_merge_names n = { .struct_size = out->struct_size };
    size_t l = strlen(tensor);
    if (ndim == 2 && l >= 8 && strcmp(tensor + l - 7, ".weight") == 0) {
        const char *s = tensor;
        for (size_t p = 0; p < sizeof(prefixes) / sizeof(prefixes[0]); p++)
            if (starts(s, prefixes[p])) {
                s += strlen(prefixes[p]);
                break;
            }
        char m[256], d[256], o[256];
        snprintf(m, sizeof(m), "%.*s", (int)(tensor + l - 7 - s), s);
        module_mapped(m, true, d, sizeof(d));    /* an official base: its diffusers name */
        module_mapped(m, false, o, sizeof(o));   /* a diffusers base: its official name */
        for (int u = 0; u < 2; u++) {
            merge_name_add(&n, m, u);
            merge_name_add(&n, d, u);
            merge_name_add(&n, o, u);
        }
    }
    memcpy(out, &n, out->struct_size < sizeof(n) ? out->struct_size : sizeof(n));
    return 0;
}

/* ---- the expected tensors ------------------------------------------------------------------- */

struct list {
    struct wan22_tspec *v;
    int                 n;
};

static struct wan22_tspec *add(struct list *l, const char *name, enum wan22_kind kind, ghc_tensor_t **slot,
                               int ndim, ...)
{
    struct wan22_tspec *t = &l->v[l->n++];
    va_list ap;
    snprintf(t->name, sizeof(t->name), "%s", name);
    t->ndim = ndim;
    t->kind = kind;
    t->slot = slot;
    va_start(ap, ndim);
    for (int i = 0; i < ndim; i++)
        t->shape[i] = va_arg(ap, int64_t);
    va_end(ap);
    return t;
}
#define SLOT(w, member) ((w) ? &(w)->member : NULL)

int wan22_tensor_list(ghc_core_t *core, const struct wan22_dims *d, struct wan22_weights *w,
                      struct wan22_tspec **out, int *n)
{
    int64_t D = d->dim, F = d->ffn_dim;
    struct list l = { calloc((size_t)(15 + 27 * d->layers), sizeof(struct wan22_tspec)), 0 };
    *out = NULL;
    *n = 0;
    if (!l.v)
        return ghc_error_set(core, GHC_ENOMEM, "wan22: out of memory for the tensor list");
    add(&l, "patch_embedding.weight", WAN22_T_F32, SLOT(w, pe_w), 5, D, d->in_ch, (int64_t)1, (int64_t)2, (int64_t)2);
    add(&l, "patch_embedding.bias", WAN22_T_F32, SLOT(w, pe_b), 1, D);
    add(&l, "text_embedding.0.weight", WAN22_T_BASE, SLOT(w, te0_w), 2, D, d->text_dim);
    add(&l, "text_embedding.0.bias", WAN22_T_F32, SLOT(w, te0_b), 1, D);
    add(&l, "text_embedding.2.weight", WAN22_T_BASE, SLOT(w, te2_w), 2, D, D);
    add(&l, "text_embedding.2.bias", WAN22_T_F32, SLOT(w, te2_b), 1, D);
    add(&l, "time_embedding.0.weight", WAN22_T_F32, SLOT(w, t0_w), 2, D, d->freq_dim);
    add(&l, "time_embedding.0.bias", WAN22_T_F32, SLOT(w, t0_b), 1, D);
    add(&l, "time_embedding.2.weight", WAN22_T_F32, SLOT(w, t2_w), 2, D, D);
    add(&l, "time_embedding.2.bias", WAN22_T_F32, SLOT(w, t2_b), 1, D);
    add(&l, "time_projection.1.weight", WAN22_T_F32, SLOT(w, tp_w), 2, 6 * D, D);
    add(&l, "time_projection.1.bias", WAN22_T_F32, SLOT(w, tp_b), 1, 6 * D);
    static const char *const lin[WAN22_TARGETS] = {
        "self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o",
        "cross_attn.q", "cross_attn.k", "cross_attn.v", "cross_attn.o", "ffn.0", "ffn.2",
    };
    for (int64_t i = 0; i < d->layers; i++) {
        struct wan22_block_w *bw = w ? &w->blocks[i] : NULL;
        char nm[80];
        snprintf(nm, sizeof(nm), "blocks.%lld.modulation", (long long)i);
        add(&l, nm, WAN22_T_F32, bw ? &bw->mod : NULL, 3, (int64_t)1, (int64_t)6, D);
        for (int j = 0; j < WAN22_TARGETS; j++) {
            int64_t o = j == WAN22_FFN_0 ? F : D, in = j == WAN22_FFN_2 ? F : D;
            snprintf(nm, sizeof(nm), "blocks.%lld.%s.weight", (long long)i, lin[j]);
            add(&l, nm, WAN22_T_BLOCK, bw ? &bw->w[j] : NULL, 2, o, in)->scale = bw ? &bw->wscale[j] : NULL;
            snprintf(nm, sizeof(nm), "blocks.%lld.%s.bias", (long long)i, lin[j]);
            add(&l, nm, WAN22_T_F32, bw ? &bw->b[j] : NULL, 1, o);
            if (j == WAN22_SA_V) {
                snprintf(nm, sizeof(nm), "blocks.%lld.self_attn.norm_q.weight", (long long)i);
                add(&l, nm, WAN22_T_F32, bw ? &bw->norm_q : NULL, 1, D);
                snprintf(nm, sizeof(nm), "blocks.%lld.self_attn.norm_k.weight", (long long)i);
                add(&l, nm, WAN22_T_F32, bw ? &bw->norm_k : NULL, 1, D);
            } else if (j == WAN22_CA_V) {
                snprintf(nm, sizeof(nm), "blocks.%lld.cross_attn.norm_q.weight", (long long)i);
                add(&l, nm, WAN22_T_F32, bw ? &bw->cnorm_q : NULL, 1, D);
                snprintf(nm, sizeof(nm), "blocks.%lld.cross_attn.norm_k.weight", (long long)i);
                add(&l, nm, WAN22_T_F32, bw ? &bw->cnorm_k : NULL, 1, D);
            } else if (j == WAN22_SA_O) {
                snprintf(nm, sizeof(nm), "blocks.%lld.norm3.weight", (long long)i);
                add(&l, nm, WAN22_T_F32, bw ? &bw->norm3_w : NULL, 1, D);
                snprintf(nm, sizeof(nm), "blocks.%lld.norm3.bias", (long long)i);
                add(&l, nm, WAN22_T_F32, bw ? &bw->norm3_b : NULL, 1, D);
            }
        }
    }
    add(&l, "head.modulation", WAN22_T_F32, SLOT(w, head_mod), 3, (int64_t)1, (int64_t)2, D);
    add(&l, "head.head.weight", WAN22_T_F32, SLOT(w, head_w), 2, WAN22_PATCH * d->out_ch, D);
    add(&l, "head.head.bias", WAN22_T_F32, SLOT(w, head_b), 1, WAN22_PATCH * d->out_ch);
    *out = l.v;
    *n = l.n;
    return 0;
}

/* ---- detection ------------------------------------------------------------------------------ */

struct entry {
    const char *name;   /* without the prefix */
    int         idx;
};

static int entry_cmp(const void *a, const void *b)
{
    return strcmp(((const struct entry *)a)->name, ((const struct entry *)b)->name);
}

struct index {
    struct entry                   *e;
    int                             n;
    const struct wan22_tensor_desc *t;
    enum wan22_layout               layout;
};

/* The file's tensor for a stripped name in the file's own layout, or NULL. */
static const struct wan22_tensor_desc *find_raw(const struct index *ix, const char *name)
{
    struct entry key = { name, 0 };
    struct entry *hit = bsearch(&key, ix->e, (size_t)ix->n, sizeof(*ix->e), entry_cmp);
    return hit ? &ix->t[hit->idx] : NULL;
}

/* The file's tensor for an official name, and its name in the file (into buf). */
static const struct wan22_tensor_desc *find(const struct index *ix, const char *official, char *buf, size_t len)
{
    if (ix->layout == WAN22_LAYOUT_DIFFUSERS)
        wan22_name_diffusers(official, buf, len);
    else
        snprintf(buf, len, "%s", official);
    return find_raw(ix, buf);
}

static int64_t dim_at(const struct wan22_tensor_desc *t, int i)
{
    if (i < 0)
        i += t->ndim;
    return i >= 0 && i < t->ndim ? t->shape[i] : -1;
}

static int missing(ghc_core_t *core, const char *what, const char *prefix, const char *name, const char *why)
{
    return ghc_error_set(core, GHC_EFORMAT, "%s: missing tensor '%s%s' (%s)", what, prefix, name, why);
}

int wan22_block_index(const char *s, int64_t *idx, const char **end)
{
    int64_t v = 0;
    const char *p = s;
    if (*p < '0' || *p > '9')
        return 0;
    for (; *p >= '0' && *p <= '9'; p++)
        if (v < WAN22_MAX_BLOCKS)   /* stops growing at the limit: never overflows */
            v = v * 10 + (*p - '0');
    if (end)
        *end = p;
    if (v >= WAN22_MAX_BLOCKS)
        return -1;
    *idx = v;
    return 1;
}

int wan22_detect(ghc_core_t *core, const char *what, const struct wan22_tensor_desc *t, int n, int64_t heads,
                 struct wan22_detected *out)
{
    int rc = 0;
    char nm[160], s1[96], s2[96];
    struct wan22_tspec *spec = NULL;
    int nspec = 0;
    memset(out, 0, sizeof(*out));

    /* 1. prefix (ComfyUI's model.diffusion_model. first) and layout */
    static const char *const prefixes[] = { "model.diffusion_model.", "diffusion_model.", "" };
    const char *prefix = "";
    for (size_t p = 0; p < 2 && !*prefix; p++)
        for (int i = 0; i < n; i++)
            if (starts(t[i].name, prefixes[p])) {
                prefix = prefixes[p];
                break;
            }
    size_t pl = strlen(prefix);
    struct index ix = { malloc((size_t)(n ? n : 1) * sizeof(struct entry)), 0, t, WAN22_LAYOUT_OFFICIAL };
    if (!ix.e)
        return ghc_error_set(core, GHC_ENOMEM, "wan22: out of memory");
    int64_t max_block = -1;
    for (int i = 0; i < n; i++) {
        if (!starts(t[i].name, prefix))
            continue;
        const char *s = t[i].name + pl;
        ix.e[ix.n++] = (struct entry){ s, i };
        if (strstr(s, "img_emb.") || strstr(s, ".k_img.") || strstr(s, ".v_img.") || strstr(s, "add_k_proj") ||
            strstr(s, "image_embedder.")) {
            rc = ghc_error_set(core, GHC_EUNSUPPORTED,
                               "%s: tensor '%s' belongs to a Wan2.1 I2V/FLF2V model (CLIP image branch), which "
                               "wan22 does not support (Wan2.2 I2V has no image branch)", what, t[i].name);
            goto out;
        }
        if (starts(s, "blocks.")) {
            const char *end;
            int64_t b;
            int k = wan22_block_index(s + 7, &b, &end);
            if (k < 0) {
                rc = ghc_error_set(core, GHC_EFORMAT, "%s: tensor '%s': '%.*s' is not a Wan block index (0 to %d)",
                                   what, t[i].name, (int)(end - (s + 7)) > 40 ? 40 : (int)(end - (s + 7)), s + 7,
                                   WAN22_MAX_BLOCKS - 1);
                goto out;
            }
            if (k > 0 && *end == '.' && b > max_block)
                max_block = b;
        }
    }
    qsort(ix.e, (size_t)ix.n, sizeof(*ix.e), entry_cmp);
    if (find_raw(&ix, "head.modulation") || find_raw(&ix, "time_projection.1.weight")) {
        ix.layout = WAN22_LAYOUT_OFFICIAL;
    } else if (find_raw(&ix, "scale_shift_table") || find_raw(&ix, "condition_embedder.time_proj.weight")) {
        ix.layout = WAN22_LAYOUT_DIFFUSERS;
    } else {
        rc = ghc_error_set(core, GHC_EFORMAT,
                           "%s: not a Wan2.x DiT checkpoint: none of head.modulation, time_projection.1.weight "
                           "(official/ComfyUI) or scale_shift_table, condition_embedder.time_proj.weight "
                           "(diffusers)%s%s%s", what, *prefix ? " under the prefix '" : "", prefix,
                           *prefix ? "'" : "");
        goto out;
    }

    /* 2-8. dimensions */
    struct wan22_dims *d = &out->dims;
    const struct wan22_tensor_desc *pe = find(&ix, "patch_embedding.weight", nm, sizeof(nm));
    if (!pe) {
        rc = missing(core, what, prefix, nm, "it gives dim and in_channels");
        goto out;
    }
    if (pe->ndim != 5 || pe->shape[2] != 1 || pe->shape[3] != 2 || pe->shape[4] != 2) {
        rc = ghc_error_set(core, GHC_EFORMAT, "%s: tensor '%s%s' has shape %s, expected [dim, in_channels, 1, 2, 2] "
                           "(patch size (1, 2, 2))", what, prefix, nm,
                           wan22_shape_text(pe->ndim, pe->shape, s1, sizeof(s1)));
        goto out;
    }
    d->dim = pe->shape[0];
    d->in_ch = pe->shape[1];
    const struct wan22_tensor_desc *x;
    if (!(x = find(&ix, "blocks.0.ffn.0.weight", nm, sizeof(nm)))) {
        rc = missing(core, what, prefix, nm, "it gives ffn_dim");
        goto out;
    }
    d->ffn_dim = dim_at(x, 0);
    if (!(x = find(&ix, "head.head.weight", nm, sizeof(nm)))) {
        rc = missing(core, what, prefix, nm, "it gives out_channels");
        goto out;
    }
    d->out_ch = dim_at(x, 0) / WAN22_PATCH;
    if (dim_at(x, 0) % WAN22_PATCH) {
        rc = ghc_error_set(core, GHC_EFORMAT, "%s: tensor '%s%s' has shape %s, expected [4 out_channels, %lld]", what,
                           prefix, nm, wan22_shape_text(x->ndim, x->shape, s1, sizeof(s1)), (long long)d->dim);
        goto out;
    }
    if (!(x = find(&ix, "text_embedding.0.weight", nm, sizeof(nm)))) {
        rc = missing(core, what, prefix, nm, "it gives text_dim");
        goto out;
    }
    d->text_dim = dim_at(x, 1);
    if (!(x = find(&ix, "time_embedding.0.weight", nm, sizeof(nm)))) {
        rc = missing(core, what, prefix, nm, "it gives freq_dim");
        goto out;
    }
    d->freq_dim = dim_at(x, 1);
    d->layers = max_block + 1;
    if (d->layers < 1) {
        rc = ghc_error_set(core, GHC_EFORMAT, "%s: no tensors 'blocks.N.*': not a Wan2.x DiT checkpoint", what);
        goto out;
    }
    if (heads > 0) {
        d->heads = heads;
    } else if (d->dim % 128 == 0) {
        d->heads = d->dim / 128;
    } else {
        rc = ghc_error_set(core, GHC_EFORMAT, "%s: dim %lld is not a multiple of the head dim 128; set the model "
                           "key 'heads' for a custom model", what, (long long)d->dim);
        goto out;
    }
    if (d->dim % d->heads || (d->dim / d->heads) % 2 || d->dim / d->heads > 256) {
        rc = ghc_error_set(core, GHC_EFORMAT, "%s: dim %lld with %lld heads: the head dim must be even, at most 256",
                           what, (long long)d->dim, (long long)d->heads);
        goto out;
    }
    if (d->ffn_dim < 1 || d->text_dim < 1 || d->freq_dim < 2 || d->freq_dim % 2 || d->out_ch < 1 || d->in_ch < 1) {
        rc = ghc_error_set(core, GHC_EFORMAT, "%s: implausible dims (ffn %lld, text %lld, freq %lld, in %lld, out %lld)",
                           what, (long long)d->ffn_dim, (long long)d->text_dim, (long long)d->freq_dim,
                           (long long)d->in_ch, (long long)d->out_ch);
        goto out;
    }

    /* every expected tensor with its shape */
    if ((rc = wan22_tensor_list(core, d, NULL, &spec, &nspec)) < 0)
        goto out;
    for (int i = 0; i < nspec; i++) {
        const struct wan22_tensor_desc *f = find(&ix, spec[i].name, nm, sizeof(nm));
        wan22_shape_text(spec[i].ndim, spec[i].shape, s1, sizeof(s1));
        if (!f) {
            rc = ghc_error_set(core, GHC_EFORMAT, "%s: missing tensor '%s%s' (expected shape %s)", what, prefix, nm, s1);
            goto out;
        }
        bool same = f->ndim == spec[i].ndim;
        for (int k = 0; same && k < f->ndim; k++)
            same = f->shape[k] == spec[i].shape[k];
        if (!same) {
            rc = ghc_error_set(core, GHC_EFORMAT, "%s: tensor '%s%s' has shape %s, expected %s", what, prefix, nm,
                               wan22_shape_text(f->ndim, f->shape, s2, sizeof(s2)), s1);
            goto out;
        }
    }

    /* classification: the released configs by their shapes */
    if (d->dim == 5120 && d->layers == 40 && d->in_ch == 16 && d->out_ch == 16)
        out->variant = WAN22_A14B_T2V;
    else if (d->dim == 5120 && d->layers == 40 && d->in_ch == 36 && d->out_ch == 16)
        out->variant = WAN22_A14B_I2V;
    else if (d->dim == 3072 && d->layers == 30 && d->in_ch == 48 && d->out_ch == 48)
        out->variant = WAN22_TI2V_5B;
    else if (d->dim == 1536 && d->layers == 30 && d->in_ch == 16 && d->out_ch == 16)
        out->variant = WAN21_T2V_1_3B;
    else
        out->variant = WAN22_CUSTOM;
    out->layout = ix.layout;
    out->prefix = prefix;
out:
    free(spec);
    free(ix.e);
    return rc;
}
