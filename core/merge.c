/* merge.c: `gh200core merge`: bake an adapter into a base checkpoint, through the plugins that
 * know each side (doc/plugin-guide.md): the network plugin (--network, default lycoris) reads
 * the adapter file into modules and merges each into its base weight with its own math (W' = W +
 * m delta-W; DoRA: W + m (W_new - W)); the model plugin (--model, default wan22) names, for each
 * tensor of the base, the module names an adapter may give it (wan22: official/ComfyUI names
 * with or without the `model.diffusion_model.` / `diffusion_model.` prefix and diffusers names
 * through its name map, dotted or underscored as musubi writes them). A base is a single file
 * or a sharded index. Every check runs before anything is written; the output is one
 * safetensors file written atomically, with every other tensor and the metadata copied
 * unchanged. The whole output is held in memory until it is written. */
#include <config.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <gh200core/safetensors.h>

#include "cli.h"

static bool matches(const struct ghc_merge_module *am, const struct ghc_merge_names *n)
{
    for (int32_t k = 0; k < n->n; k++)
        if (n->underscored[k] == am->underscored && strcmp(n->name[k], am->name) == 0)
            return true;
    return false;
}

/* "[5120, 16, 1, 2, 2]" into buf. Returns buf. */
static const char *shape_text(int ndim, const int64_t *shape, char *buf, size_t len)
{
    size_t n = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim; i++)
        n += (size_t)snprintf(buf + n, len > n ? len - n : 0, "%s%lld", i ? ", " : "", (long long)shape[i]);
    snprintf(buf + n, len > n ? len - n : 0, "]");
    return buf;
}

/* The merged tensor: base W as f32, the module merged in, stored as dt. A non-finite value of
 * the base weight read here is an error (the weights merged into are the ones read anyway;
 * tensors copied as they are are not scanned), and so is one the merge makes. */
static int merge_one(ghc_core_t *core, ghc_st_t *st, const char *base, ghc_merge_t *ad, int32_t mi,
                     const struct ghc_st_info *t, float mult, enum ghc_dtype dt, ghc_st_writer_t *w)
{
    int rc;
    int64_t bad;
    ghc_tensor_t *o = NULL, *f = ghc_st_load(st, t->name, GHC_DTYPE_F32, GHC_ROLE_WORKSPACE);
    if (!f)
        return ghc_error_code(core);
    if ((bad = ghc_tensor_find_nonfinite(f)) >= 0) {
        rc = ghc_error_set(core, GHC_EFORMAT, "%s: tensor '%s': element %lld is %g (a non-finite base weight)", base,
                           t->name, (long long)bad, (double)((const float *)ghc_tensor_cdata(f))[bad]);
        goto out;
    }
    if ((rc = ghc_merge_apply(ad, mi, f, mult)) < 0)
        goto out;
    if ((bad = ghc_tensor_find_nonfinite(f)) >= 0) {
        rc = ghc_error_set(core, GHC_EINVAL, "merge: tensor '%s': element %lld is %g after the merge (multiplier %g); "
                           "nothing written", t->name, (long long)bad,
                           (double)((const float *)ghc_tensor_cdata(f))[bad], (double)mult);
        goto out;
    }
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
    ghc_merge_t *ad = NULL;
    ghc_st_t *st = NULL;
    ghc_st_writer_t *w = NULL;
    struct ghc_merge_names *names = NULL;      /* per base tensor: the module names it may have */
    int32_t *target = NULL, *by_base = NULL;   /* adapter module -> base tensor, base tensor -> module */
    int rc = 0, n_algo[4] = { 0 };
    char s1[96], s2[96];
    const char *network = o->network ? o->network : "lycoris", *model = o->model ? o->model : "wan22";
    if (stat(o->out, &sb) == 0)
        return ghc_error_set(core, GHC_EEXIST, "%s exists: merge never overwrites a file; remove it or choose another "
                             "--out", o->out);
    if (!(ad = ghc_merge_open(core, network, o->adapter))) {
        rc = ghc_error_code(core);
        goto out;
    }
    if (!(st = ghc_st_open(core, o->base))) {
        rc = ghc_error_code(core);
        goto out;
    }
    int32_t nm = ghc_merge_count(ad), nb = ghc_st_count(st);
    if (!(target = malloc((size_t)nm * sizeof(int32_t))) ||
        !(by_base = malloc((size_t)(nb ? nb : 1) * sizeof(int32_t))) ||
        !(names = malloc((size_t)(nb ? nb : 1) * sizeof(*names)))) {
        rc = ghc_error_set(core, GHC_ENOMEM, "merge: out of memory");
        goto out;
    }
    for (int32_t b = 0; b < nb; b++) {
        struct ghc_st_info t;
        ghc_st_info_at(st, b, &t);
        by_base[b] = -1;
        names[b].struct_size = sizeof(names[b]);
        if ((rc = ghc_model_merge_names(core, model, t.name, t.ndim, t.shape, &names[b])) < 0)
            goto out;
    }
    /* match every adapter module to one base weight, and check shapes and dtypes */
    for (int32_t i = 0; i < nm; i++) {
        struct ghc_merge_module am = { .struct_size = sizeof(am) };
        struct ghc_st_info t;
        if ((rc = ghc_merge_module(ad, i, &am)) < 0)
            goto out;
        target[i] = -1;
        for (int32_t b = 0; b < nb && target[i] < 0; b++)
            if (matches(&am, &names[b]))
                target[i] = b;
        if (target[i] < 0) {
            rc = ghc_error_set(core, GHC_EFORMAT, "%s: adapter module '%s' (delta-W [%lld, %lld]) matches no weight "
                               "of the base %s (official, ComfyUI or diffusers names)", o->adapter, am.key,
                               (long long)am.out, (long long)am.in, o->base);
            goto out;
        }
        ghc_st_info_at(st, target[i], &t);
        if (by_base[target[i]] >= 0) {
            struct ghc_merge_module prev = { .struct_size = sizeof(prev) };
            if ((rc = ghc_merge_module(ad, by_base[target[i]], &prev)) < 0)
                goto out;
            rc = ghc_error_set(core, GHC_EFORMAT, "%s: adapter modules '%s' and '%s' both adapt '%s'", o->adapter,
                               prev.key, am.key, t.name);
            goto out;
        }
        by_base[target[i]] = i;
        if (t.ndim != 2 || t.shape[0] != am.out || t.shape[1] != am.in) {
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
        n_algo[!am.algo ? 3 : strcmp(am.algo, "lora") == 0 ? 0 : strcmp(am.algo, "loha") == 0 ? 1 :
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
            rc = merge_one(core, st, o->base, ad, by_base[b], &t, (float)o->multiplier,
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
        int32_t ns = 0;
        while (ghc_merge_skipped(ad, ns))
            ns++;
        fprintf(print, "  skipped adapter keys: %d%s\n", (int)ns, ns ? " (no adapter suffix; not merged):" : "");
        for (int32_t i = 0; i < ns && i < 20; i++)
            fprintf(print, "    %s\n", ghc_merge_skipped(ad, i));
        if (ns > 20)
            fprintf(print, "    ... and %d more\n", (int)(ns - 20));
    }
out:
    ghc_st_writer_free(w);
    free(names);
    free(target);
    free(by_base);
    ghc_st_free(st);
    ghc_merge_free(ad);
    return rc;
}
