/* merge.c: `gh200core merge`: bake an adapter into a base checkpoint. The adapter is read by
 * the lycoris plugin's reader (plugins/lycoris/merge.c: any naming it writes or loads) and each
 * module's W' = W + m delta-W (DoRA: W + m (W_new - W)) comes from the plugin's own math; the
 * base names are matched in the layouts wan22 loads (official/ComfyUI names with or without the
 * `model.diffusion_model.` / `diffusion_model.` prefix, diffusers names through wan22's name
 * map; a single file or a sharded index). Every check runs before anything is written; the
 * output is one safetensors file written atomically, with every other tensor and the metadata
 * copied unchanged. The whole output is held in memory until it is written. */
#include <config.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <gh200core/safetensors.h>

#include "cli.h"
#include "../plugins/lycoris/lyc_merge.h"
#include "../plugins/wan22/wan22_impl.h"   /* defines: wan22_name_diffusers */

static const char *const base_prefixes[] = { "model.diffusion_model.", "diffusion_model." };

/* A base tensor's module names: stripped of its prefix and ".weight" (m), its diffusers name
 * (d), and both with '.' as '_' (musubi). */
struct names {
    char m[256], d[256], mu[256], du[256];
};

/* wan22's diffusers name of a module (its map works on tensor names: add and drop ".weight"). */
static void diffusers_name(const char *module, char *buf, size_t len)
{
    char full[300];
    snprintf(full, sizeof(full), "%s.weight", module);
    wan22_name_diffusers(full, buf, len);
    size_t l = strlen(buf);
    if (l > 7 && strcmp(buf + l - 7, ".weight") == 0)
        buf[l - 7] = '\0';
}

static void underscore(char *dst, const char *src, size_t len)
{
    snprintf(dst, len, "%s", src);
    for (char *p = dst; *p; p++)
        if (*p == '.')
            *p = '_';
}

static bool base_names(const struct ghc_st_info *t, struct names *n)
{
    size_t l = strlen(t->name);
    if (t->ndim != 2 || l < 8 || strcmp(t->name + l - 7, ".weight") != 0)
        return false;
    const char *s = t->name;
    for (size_t p = 0; p < sizeof(base_prefixes) / sizeof(base_prefixes[0]); p++)
        if (strncmp(s, base_prefixes[p], strlen(base_prefixes[p])) == 0) {
            s += strlen(base_prefixes[p]);
            break;
        }
    snprintf(n->m, sizeof(n->m), "%.*s", (int)(t->name + l - 7 - s), s);
    diffusers_name(n->m, n->d, sizeof(n->d));
    underscore(n->mu, n->m, sizeof(n->mu));
    underscore(n->du, n->d, sizeof(n->du));
    return true;
}

/* A musubi name's dotted official form: '_' -> '.' except inside the official names' own
 * words (self_attn, cross_attn, *_embedding, time_projection). */
static void dotted(char *dst, const char *src, size_t len)
{
    static const char *const words[] = { "self_attn", "cross_attn", "text_embedding", "time_embedding",
                                         "time_projection", "patch_embedding" };
    underscore(dst, src, len);
    for (char *p = dst; *p; p++)
        if (*p == '_')
            *p = '.';
    for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++) {
        char dw[32], *hit;
        underscore(dw, words[i], sizeof(dw));
        for (char *q = dw; *q; q++)
            if (*q == '_')
                *q = '.';
        while ((hit = strstr(dst, dw)))
            hit[strchr(words[i], '_') - words[i]] = '_';
    }
}

static bool matches(const struct lyc_adapter_module *am, const struct names *n)
{
    char d[256], o[256];
    if (am->musubi) {
        if (strcmp(am->name, n->mu) == 0 || strcmp(am->name, n->du) == 0)
            return true;
        dotted(o, am->name, sizeof(o));   /* a diffusers-named base: compare diffusers names */
        diffusers_name(o, d, sizeof(d));
        return strcmp(d, n->m) == 0;
    }
    diffusers_name(am->name, d, sizeof(d));
    return strcmp(am->name, n->m) == 0 || strcmp(am->name, n->d) == 0 || strcmp(d, n->m) == 0;
}

static const char *shape_text(int ndim, const int64_t *shape, char *buf, size_t len)
{
    return wan22_shape_text(ndim, shape, buf, len);
}

/* The merged tensor: base W as f32, the module merged in, stored as dt. */
static int merge_one(ghc_core_t *core, ghc_st_t *st, lyc_adapter_t *ad, int32_t mi, const struct ghc_st_info *t,
                     float mult, enum ghc_dtype dt, ghc_st_writer_t *w)
{
    int rc;
    ghc_tensor_t *o = NULL, *f = ghc_st_load(st, t->name, GHC_DTYPE_F32, GHC_ROLE_WORKSPACE);
    if (!f)
        return ghc_error_code(core);
    if ((rc = lyc_adapter_merge(ad, mi, f, mult)) < 0)
        goto out;
    if (!(o = ghc_tensor_init(core, dt, t->ndim, t->shape, GHC_DEVICE_CPU, GHC_ROLE_WORKSPACE))) {
        rc = ghc_error_code(core) ? ghc_error_code(core) : GHC_ENOMEM;
        goto out;
    }
    if ((rc = ghc_tensor_convert_cpu(o, f, 1.0f)) == 0)
        rc = ghc_st_writer_add(w, t->name, o);
out:
    ghc_tensor_free(o);
    ghc_tensor_free(f);
    return rc;
}

int ghc_cli_merge(ghc_core_t *core, const struct ghc_merge_opts *o, FILE *print)
{
    struct stat sb;
    lyc_adapter_t *ad = NULL;
    ghc_st_t *st = NULL;
    ghc_st_writer_t *w = NULL;
    int32_t *target = NULL, *by_base = NULL;   /* adapter module -> base tensor, base tensor -> module */
    int rc = 0, n_algo[4] = { 0 };
    char s1[96], s2[96];
    if (stat(o->out, &sb) == 0)
        return ghc_error_set(core, GHC_EEXIST, "%s exists: merge never overwrites a file; remove it or choose another "
                             "--out", o->out);
    if ((rc = lyc_adapter_open(core, o->adapter, &ad)) < 0)
        goto out;
    if (!(st = ghc_st_open(core, o->base))) {
        rc = ghc_error_code(core);
        goto out;
    }
    int32_t nm = lyc_adapter_count(ad), nb = ghc_st_count(st);
    if (!(target = malloc((size_t)nm * sizeof(int32_t))) || !(by_base = malloc((size_t)(nb ? nb : 1) * sizeof(int32_t)))) {
        rc = ghc_error_set(core, GHC_ENOMEM, "merge: out of memory");
        goto out;
    }
    for (int32_t b = 0; b < nb; b++)
        by_base[b] = -1;
    /* match every adapter module to one base weight, and check shapes and dtypes */
    for (int32_t i = 0; i < nm; i++) {
        struct lyc_adapter_module am;
        struct ghc_st_info t;
        struct names n;
        lyc_adapter_module(ad, i, &am);
        target[i] = -1;
        for (int32_t b = 0; b < nb && target[i] < 0; b++) {
            ghc_st_info_at(st, b, &t);
            if (base_names(&t, &n) && matches(&am, &n))
                target[i] = b;
        }
        if (target[i] < 0) {
            rc = ghc_error_set(core, GHC_EFORMAT, "%s: adapter module '%s' (delta-W [%lld, %lld]) matches no weight "
                               "of the base %s (official, ComfyUI or diffusers names)", o->adapter, am.key,
                               (long long)am.out, (long long)am.in, o->base);
            goto out;
        }
        ghc_st_info_at(st, target[i], &t);
        if (by_base[target[i]] >= 0) {
            struct lyc_adapter_module prev;
            lyc_adapter_module(ad, by_base[target[i]], &prev);
            rc = ghc_error_set(core, GHC_EFORMAT, "%s: adapter modules '%s' and '%s' both adapt '%s'", o->adapter,
                               prev.key, am.key, t.name);
            goto out;
        }
        by_base[target[i]] = i;
        if (t.shape[0] != am.out || t.shape[1] != am.in) {
            rc = ghc_error_set(core, GHC_EFORMAT, "%s: adapter module '%s' has delta-W %s, the base tensor '%s' is %s",
                               o->adapter, am.key, shape_text(2, (const int64_t[]){ am.out, am.in }, s1, sizeof(s1)),
                               t.name, shape_text(t.ndim, t.shape, s2, sizeof(s2)));
            goto out;
        }
        if (t.dtype == GHC_DTYPE_F8_E4M3 || t.dtype == GHC_DTYPE_F8_E5M2 || !ghc_dtype_is_float(t.dtype)) {
            rc = ghc_error_set(core, GHC_EUNSUPPORTED, "%s: tensor '%s' is %s: merging into %s weights is not "
                               "supported (ComfyUI fp8_scaled checkpoints carry a scale_weight; merge into the "
                               "bf16/f16/f32 checkpoint instead)", o->base, t.name, ghc_dtype_name(t.dtype),
                               ghc_dtype_is_float(t.dtype) ? "fp8" : "non-float");
            goto out;
        }
        n_algo[strcmp(am.algo, "lora") == 0 ? 0 : strcmp(am.algo, "loha") == 0 ? 1 :
               strcmp(am.algo, "lokr") == 0 ? 2 : 3]++;
    }
    /* write: metadata, the merged weights, every other tensor as it is */
    if (!(w = ghc_st_writer_init(core))) {
        rc = ghc_error_set(core, GHC_ENOMEM, "merge: out of memory");
        goto out;
    }
    const char *k, *v;
    for (int i = 0; ghc_st_metadata_at(st, i, &k, &v) && rc == 0; i++)
        rc = ghc_st_writer_metadata(w, k, v);
    for (int32_t b = 0; b < nb && rc == 0; b++) {
        struct ghc_st_info t;
        ghc_st_info_at(st, b, &t);
        if (by_base[b] >= 0)
            rc = merge_one(core, st, ad, by_base[b], &t, (float)o->multiplier,
                           o->dtype < 0 ? t.dtype : (enum ghc_dtype)o->dtype, w);
        else
            rc = ghc_st_writer_add_raw(w, t.name, t.dtype, t.ndim, t.shape, ghc_st_raw(st, t.name));
    }
    if (rc == 0)
        rc = ghc_st_writer_finish(w, o->out);
    if (rc < 0)
        goto out;
    if (print) {
        fprintf(print, "merged %d adapter modules of %s into %s -> %s (multiplier %g, dtype %s)\n", (int)nm,
                o->adapter, o->base, o->out, o->multiplier, o->dtype < 0 ? "keep" : ghc_dtype_name(o->dtype));
        fprintf(print, "  lora %d, loha %d, lokr %d, dora %d; %d of %d base tensors changed, the rest copied\n",
                n_algo[0], n_algo[1], n_algo[2], n_algo[3], (int)nm, (int)nb);
        int32_t ns = lyc_adapter_skipped_count(ad);
        fprintf(print, "  skipped adapter keys: %d%s\n", (int)ns, ns ? " (no adapter suffix; not merged):" : "");
        for (int32_t i = 0; i < ns && i < 20; i++)
            fprintf(print, "    %s\n", lyc_adapter_skipped(ad, i));
        if (ns > 20)
            fprintf(print, "    ... and %d more\n", (int)(ns - 20));
    }
out:
    ghc_st_writer_free(w);
    free(target);
    free(by_base);
    ghc_st_free(st);
    lyc_adapter_free(ad);
    return rc;
}
