/* dataset.c: the training data (dataset.h): the `data` section, opening (discovery of each
 * dataset's samples through the formats' table, one text width, the ai-toolkit blank
 * embeddings, buckets, the cache's binding), the statistics and the shared helpers. The
 * formats are in data_formats.c and data_aitk.c, the order in data_order.c, batches in
 * data_batch.c. */
#include <config.h>

#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <gh200core/media.h>   /* defines: ghc_media_keys */

#include "dataset_impl.h"

/* ---- shared helpers -------------------------------------------------------------------------- */

double ghc_data_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The file on disk behind an entry, for messages: "/data/set/a.latent.safetensors". */
const char *ghc_data_disk_name(const ghc_dataset_t *ds, const char *entry, char *buf, size_t n)
{
    char *end, raw[8192];
    long r = strtol(entry, &end, 10);
    if (end != entry && *end == '/' && r >= 0 && r < ds->n_sets)
        snprintf(raw, sizeof(raw), "%s/%s", ds->sets[r].path, end + 1);
    else
        snprintf(raw, sizeof(raw), "%s", entry);
    return ghc_path_quote(raw, buf, n);   /* for messages: control bytes escaped */
}

int ghc_data_reserve(ghc_dataset_t *ds, void **p, int64_t *cap, int64_t n, size_t size)
{
    if (n < *cap)
        return 0;
    int64_t want = *cap ? *cap * 2 : 256;
    void *q = realloc(*p, (size_t)want * size);
    if (!q)
        return ghc_error_set(ds->core, GHC_ENOMEM, "data: out of memory");
    *p = q;
    *cap = want;
    return 0;
}

/* A bad sample: an error, or with skip_bad_samples a warning and a count (returns 1). The
 * message so far (if any) is kept as the reason. */
int ghc_data_bad_sample(ghc_dataset_t *ds, int rc, const char *fmt, ...)
{
    char msg[GHC_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (!ds->skip_bad)
        return ghc_error_set(ds->core, rc, "data: %s", msg);
    ds->st.skipped++;
    ghc_log(ds->core, GHC_LOG_WARN, "data: skipping a bad sample: %s", msg);
    ghc_error_clear(ds->core);
    return 1;
}

/* ---- configuration --------------------------------------------------------------------------- */

static const struct ghc_cfg_key data_keys[] = {
    { "batch_size",       GHC_CFG_INT,    "1",     "1 to 2^20", NULL },
    { "seed",             GHC_CFG_INT,    "(the top-level seed, else 42)", "0 to 2^63-1", NULL },
    { "shuffle",          GHC_CFG_BOOL,   "true",  NULL, NULL },
    { "text_dropout",     GHC_CFG_FLOAT,  "0.0",   "0 to 1", NULL },
    { "empty_prompt",     GHC_CFG_STRING, NULL,    "(a safetensors file: text_embed or varlen_t5_<dtype>)", NULL },
    { "skip_bad_samples", GHC_CFG_BOOL,   "false", NULL, NULL },
    { "datasets",         GHC_CFG_LIST,   NULL,    "(groups with the keys of `data datasets`)", NULL },
    { "prepare",          GHC_CFG_STRING, "auto",  "auto, never, always", NULL },
    { "augmentations_cache_mode", GHC_CFG_STRING, "static", "static, disable_cache, refresh_each_epoch", NULL },
    { NULL, 0, NULL, NULL, NULL }
};

static const struct ghc_cfg_key set_keys[] = {
    { "path",            GHC_CFG_STRING, NULL,   "(a directory; required)", NULL },
    { "repeats",         GHC_CFG_INT,    "1",    "1 to 1000000", NULL },
    { "weight",          GHC_CFG_FLOAT,  "1.0",  "0 to 1e6", NULL },
    { "compression",     GHC_CFG_STRING, "none", "none, lz4, zlib, snappy", NULL },
    { "trigger_word",    GHC_CFG_STRING, NULL,   "(ai-toolkit's, for the names of its text caches)", NULL },
    { "default_caption", GHC_CFG_STRING, NULL,   "(ai-toolkit's, for the names of its text caches)", NULL },
    { "musubi_cache",    GHC_CFG_BOOL,   "false", "(prepare also writes musubi-tuner's caches beside the media)", NULL },
    { "augmentations_cache_mode", GHC_CFG_STRING, "(data's, else static)",
      "static, disable_cache, refresh_each_epoch", NULL },
    { NULL, 0, NULL, NULL, NULL }
};

/* A dataset's keys: set_keys, then the media keys of `prepare` (media.h), joined once. */
static const struct ghc_cfg_key *entry_keys(void)
{
    static struct ghc_cfg_key all[64];
    if (!all[0].name) {
        int n = 0;
        for (const struct ghc_cfg_key *k = set_keys; k->name && n < 63; k++)
            all[n++] = *k;
        for (const struct ghc_cfg_key *k = ghc_media_keys(); k->name && n < 63; k++)
            all[n++] = *k;
    }
    return all;
}

const struct ghc_cfg_key *ghc_dataset_keys(bool entry) { return entry ? entry_keys() : data_keys; }

/* `p` made absolute against the configuration file's folder. */
static char *resolve_path(ghc_core_t *core, const char *p)
{
    char buf[8200];
    if (p[0] == '/')
        snprintf(buf, sizeof(buf), "%s", p);
    else
        snprintf(buf, sizeof(buf), "%s/%s", ghc_config_dir(core), p);
    char real[PATH_MAX];
    return strdup(realpath(buf, real) ? real : buf);
}

int ghc_data_seed(ghc_core_t *core, ghc_cfg_t *data, uint64_t *seed)
{
    ghc_cfg_t *top = ghc_config_root(core);
    int64_t top_seed = 42, v;
    int rc;
    if (top && ghc_cfg_has(top, "seed") && (rc = ghc_cfg_get_int(top, "seed", 42, 0, INT64_MAX, &top_seed)) < 0)
        return rc;
    if ((rc = ghc_cfg_get_int(data, "seed", top_seed, 0, INT64_MAX, &v)) < 0)
        return rc;
    *seed = (uint64_t)v;
    return 0;
}

static int read_config(ghc_dataset_t *ds, ghc_cfg_t *cfg)
{
    ghc_core_t *core = ds->core;
    int rc;
    int64_t bs;
    const char *empty = NULL;
    if ((rc = ghc_cfg_get_int(cfg, "batch_size", 1, 1, 1 << 20, &bs)) < 0 ||
        (rc = ghc_data_seed(core, cfg, &ds->seed)) < 0 ||
        (rc = ghc_cfg_get_bool(cfg, "shuffle", true, &ds->shuffle)) < 0 ||
        (rc = ghc_cfg_get_float(cfg, "text_dropout", 0.0, 0.0, 1.0, &ds->text_dropout)) < 0 ||
        (rc = ghc_cfg_get_string(cfg, "empty_prompt", NULL, &empty)) < 0 ||
        (rc = ghc_cfg_get_bool(cfg, "skip_bad_samples", false, &ds->skip_bad)) < 0)
        return rc;
    ds->batch_size = bs;

    int n;
    if ((rc = ghc_cfg_list_len(cfg, "datasets", &n)) < 0)
        return rc;
    if (n == 0)
        return ghc_error_set(core, GHC_ECONFIG, "%s: data: no datasets (datasets = ( { path = \"...\"; } );)",
                             ghc_cfg_where(cfg, ghc_cfg_has(cfg, "datasets") ? "datasets" : NULL));
    if (!(ds->sets = calloc((size_t)n, sizeof(*ds->sets))))
        return ghc_error_set(core, GHC_ENOMEM, "data: out of memory");
    ds->n_sets = n;
    for (int i = 0; i < n; i++) {
        ghc_cfg_t *g;
        int mode;
        if ((rc = ghc_cfg_list_group(cfg, "datasets", i, entry_keys(), &g)) < 0 ||
            (rc = ghc_data_aug_mode(cfg, g, &mode)) < 0)
            return rc;
        const char *what = ghc_cfg_path(g);   /* "data.datasets[1]" */
        const char *path, *comp, *trigger, *defcap;
        struct data_set *d = &ds->sets[i];
        if (!ghc_cfg_has(g, "path"))
            return ghc_error_set(core, GHC_ECONFIG, "%s: %s: missing key 'path' (the dataset directory)",
                                 ghc_cfg_where(g, NULL), what);
        if ((rc = ghc_cfg_get_string(g, "path", NULL, &path)) < 0 ||
            (rc = ghc_cfg_get_int(g, "repeats", 1, 1, 1000000, &d->repeats)) < 0 ||
            (rc = ghc_cfg_get_float(g, "weight", 1.0, 0.0, 1e6, &d->weight)) < 0 ||
            (rc = ghc_cfg_get_string(g, "compression", "none", &comp)) < 0 ||
            (rc = ghc_cfg_get_string(g, "trigger_word", NULL, &trigger)) < 0 ||
            (rc = ghc_cfg_get_string(g, "default_caption", NULL, &defcap)) < 0)
            return rc;
        /* both only name ai-toolkit's cache files, whose hash is over the caption's UTF-8 */
        if (trigger && !ghc_utf8_valid(trigger))
            return ghc_error_set(core, GHC_ECONFIG, "%s: %s.trigger_word is not UTF-8", ghc_cfg_where(g, "trigger_word"), what);
        if (defcap && !ghc_utf8_valid(defcap))
            return ghc_error_set(core, GHC_ECONFIG, "%s: %s.default_caption is not UTF-8",
                                 ghc_cfg_where(g, "default_caption"), what);
        /* "" is no trigger word to ai-toolkit either */
        if ((trigger && *trigger && !(d->trigger_word = strdup(trigger))) ||
            (defcap && !(d->default_caption = strdup(defcap))))
            return ghc_error_set(core, GHC_ENOMEM, "data: out of memory");
        if (!*path)
            return ghc_error_set(core, GHC_ECONFIG, "%s: %s.path must not be empty", ghc_cfg_where(g, "path"), what);
        if (!ghc_compression_from_name(comp, &d->compression))
            return ghc_error_set(core, GHC_ECONFIG, "%s: %s.compression = \"%s\" is not one of: none, lz4, zlib, snappy",
                                 ghc_cfg_where(g, "compression"), what, comp);
        if (!(d->path = resolve_path(core, path)))
            return ghc_error_set(core, GHC_ENOMEM, "data: out of memory");
    }
    if (empty && *empty) {
        char *p = resolve_path(core, empty);
        if (!p)
            return ghc_error_set(core, GHC_ENOMEM, "data: out of memory");
        ghc_st_t *st = ghc_st_open(core, p);
        const char *key = NULL;
        for (int i = 0; st && i < ghc_st_count(st); i++) {
            struct ghc_st_info info;
            ghc_st_info_at(st, i, &info);
            if (strcmp(info.name, "text_embed") == 0 || strncmp(info.name, "varlen_t5_", 10) == 0)
                key = info.name;
        }
        if (st && !key)
            rc = ghc_error_set(core, GHC_EFORMAT, "%s: data.empty_prompt: no tensor \"text_embed\" or \"varlen_t5_<dtype>\"", p);
        else if (st && !(ds->empty = ghc_st_load(st, key, GHC_DTYPE_F32, GHC_ROLE_TEXT_EMBEDS)))
            rc = ghc_error_code(core);
        else if (!st)
            rc = ghc_error_code(core);
        if (rc == 0) {
            int nd = ghc_tensor_ndim(ds->empty);
            if (!((nd == 2) || (nd == 3 && ghc_tensor_dim(ds->empty, 0) == 1)) || ghc_tensor_dim(ds->empty, -2) < 1) {
                char buf[96];
                rc = ghc_error_set(core, GHC_EFORMAT, "%s: data.empty_prompt: \"%s\" is %s, expected [L, D] or [1, L, D]",
                                   p, key, ghc_tensor_describe(ds->empty, buf, sizeof(buf)));
            } else {
                int64_t sh[2] = { ghc_tensor_dim(ds->empty, -2), ghc_tensor_dim(ds->empty, -1) };
                ghc_tensor_reshape(ds->empty, 2, sh);
            }
        }
        ghc_st_free(st);
        free(p);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* ---- discovery ------------------------------------------------------------------------------- */

void ghc_data_sample_clear(struct data_sample *s)
{
    for (int k = 0; k < GHC_SAMPLE_KIND_COUNT; k++) {
        free(s->file[k]);
        free(s->key[k]);
    }
    free(s->caption);
    memset(s, 0, sizeof(*s));
}

/* What a dataset's discovery has to say once its samples are found: each format's word on
 * its files no sample took, a warning where it mixes latents of two kinds (posterior means
 * with posterior samples), and its samples by format. */
static void report_formats(ghc_dataset_t *ds, int32_t d, const struct data_listing *ls, unsigned formats)
{
    const struct data_format *mixed[2] = { NULL, NULL };
    char what[256] = "";
    for (int f = 0; f < GHC_DATA_N_FORMATS; f++) {
        const struct data_format *fmt = ghc_data_format_of((enum ghc_data_format)f);
        if (fmt->report)
            fmt->report(ds, d, ls);
        if (!(formats & (1u << f)))
            continue;
        snprintf(what + strlen(what), sizeof(what) - strlen(what), ", %s", fmt->what);
        if (!fmt->latents || mixed[1])
            continue;
        if (!mixed[0])
            mixed[0] = fmt;
        else if (strcmp(mixed[0]->latents, fmt->latents) != 0)
            mixed[1] = fmt;
    }
    if (mixed[1])
        ghc_log(ds->core, GHC_LOG_WARN, "data: dataset %d (%s) mixes %s latents (%s) with %s latents (%s)", (int)d,
                ds->sets[d].path, mixed[0]->name, mixed[0]->latents, mixed[1]->name, mixed[1]->latents);
    ghc_log(ds->core, GHC_LOG_INFO, "data: dataset %d (%s): %lld samples%s", (int)d, ds->sets[d].path,
            (long long)ds->sets[d].n, what);
}

/* The samples of dataset d: each latent some format claims, paired with its text file (and a
 * caption), its headers checked. */
static int discover(ghc_dataset_t *ds, int32_t d)
{
    struct data_listing ls = { .ds = d };
    char disk[4400];
    int rc = ghc_data_listing_read(ds, d, &ls);
    if (rc < 0)
        goto out;
    ds->sets[d].first = ds->n_samples;
    unsigned formats = 0;
    int64_t shadowed = 0;
    for (size_t i = 0; i < ls.n; i++) {
        const struct data_found *f = &ls.f[i];
        if (f->cls == GHC_DATA_CLASS_CAPTION)
            continue;
        const struct data_format *fmt = ghc_data_format_of(f->format);
        if (f->kind == GHC_SAMPLE_TEXT_EMBED) {
            if (fmt->lone_text && !ghc_data_listing_find(&ls, ghc_data_class(f->format, GHC_SAMPLE_LATENT), f->stem)) {
                char txt[4400];
                ghc_data_disk_name(ds, f->name, txt, sizeof(txt));
                if ((rc = ghc_data_bad_sample(ds, GHC_ENOTFOUND, "%s: its latent %s%s is missing", txt,
                                              ghc_data_disk_name(ds, f->stem, disk, sizeof(disk)),
                                              fmt->lone_text)) < 0)
                    goto out;
                rc = 0;
            }
            continue;
        }
        /* prepare's musubi_cache writes both layouts from one encoding: the gh200core file of
         * the same stem is the sample, the musubi-tuner one is left to musubi-tuner */
        if (f->format == GHC_DATA_FORMAT_MUSUBI &&
            ghc_data_listing_find(&ls, ghc_data_class(GHC_DATA_FORMAT_NATIVE, GHC_SAMPLE_LATENT), f->stem)) {
            shadowed++;
            continue;
        }
        formats |= 1u << f->format;
        const struct data_found *t = NULL;
        if ((rc = fmt->pair(ds, &ls, f, &t)) < 0)
            goto out;
        if (rc > 0) {
            rc = 0;
            continue;
        }
        if (!t) {
            char lat[4400];
            ghc_data_disk_name(ds, f->name, lat, sizeof(lat));
            if ((rc = ghc_data_bad_sample(ds, GHC_ENOTFOUND, "%s: its text embedding is missing (expected %s%s)", lat,
                                          ghc_data_disk_name(ds, f->stem, disk, sizeof(disk)), fmt->text_name)) < 0)
                goto out;
            rc = 0;
            continue;
        }
        if ((rc = ghc_data_reserve(ds, (void **)&ds->samples, &ds->cap_samples, ds->n_samples,
                                   sizeof(*ds->samples))) < 0)
            goto out;
        struct data_sample *s = &ds->samples[ds->n_samples];
        memset(s, 0, sizeof(*s));
        s->ds = d;
        s->format = f->format;
        const struct data_found *cap = ghc_data_listing_find(&ls, GHC_DATA_CLASS_CAPTION, f->stem);
        if (!(s->file[GHC_SAMPLE_LATENT] = strdup(f->name)) ||
            !(s->file[GHC_SAMPLE_TEXT_EMBED] = strdup(t->name)) ||
            (cap && !(s->caption = strdup(cap->name)))) {
            ghc_data_sample_clear(s);
            rc = ghc_error_set(ds->core, GHC_ENOMEM, "data: out of memory");
            goto out;
        }
        if ((rc = ghc_data_sample_check(ds, s)) != 0) {
            ghc_data_sample_clear(s);
            if (rc < 0)
                goto out;
            rc = 0;
            continue;
        }
        ds->n_samples++;
    }
    ds->sets[d].n = ds->n_samples - ds->sets[d].first;
    if (shadowed)
        ghc_log(ds->core, GHC_LOG_INFO, "data: dataset %d (%s): %lld musubi-tuner latent%s not read: the gh200core "
                "cache of the same stem is", (int)d, ds->sets[d].path, (long long)shadowed, shadowed == 1 ? "" : "s");
    report_formats(ds, d, &ls, formats);
out:
    ghc_data_listing_free(&ls);
    return rc;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Keep the samples `judge` keeps (0), drop those it reports (1, already a counted bad sample),
 * dataset by dataset, in order; a negative result is the error. */
static int filter_samples(ghc_dataset_t *ds, int (*judge)(ghc_dataset_t *ds, int64_t i, void *user), void *user)
{
    int64_t kept = 0;
    for (int32_t d = 0; d < ds->n_sets; d++) {
        struct data_set *set = &ds->sets[d];
        int64_t first = kept;
        for (int64_t i = set->first; i < set->first + set->n; i++) {
            int rc = judge(ds, i, user);
            if (rc < 0) {
                for (int64_t k = i; k < set->first + set->n; k++)   /* the rest stay, for ghc_dataset_free */
                    ds->samples[kept++] = ds->samples[k];
                for (int32_t e = d + 1; e < ds->n_sets; e++)
                    for (int64_t k = ds->sets[e].first; k < ds->sets[e].first + ds->sets[e].n; k++)
                        ds->samples[kept++] = ds->samples[k];
                ds->n_samples = kept;
                return rc;
            }
            if (rc > 0) {
                ghc_data_sample_clear(&ds->samples[i]);
                continue;
            }
            ds->samples[kept++] = ds->samples[i];
        }
        set->first = first;
        set->n = kept - first;
    }
    ds->n_samples = kept;
    return 0;
}

/* A sample whose text width is not ds->text_dim is bad, named with a sample that has it. */
static int judge_text_dim(ghc_dataset_t *ds, int64_t i, void *user)
{
    const char *ref = user;
    const struct data_sample *s = &ds->samples[i];
    if (s->txt_dim == ds->text_dim)
        return 0;
    char a[4400], b[4400];
    return ghc_data_bad_sample(ds, GHC_EFORMAT, "%s: \"%s\" has width %lld, but %s has %lld",
                               ghc_data_disk_name(ds, s->file[GHC_SAMPLE_TEXT_EMBED], a, sizeof(a)),
                               s->key[GHC_SAMPLE_TEXT_EMBED], (long long)s->txt_dim,
                               ref ? ghc_data_disk_name(ds, ref, b, sizeof(b)) : "data.empty_prompt",
                               (long long)ds->text_dim);
}

/* One text width for all: the empty prompt's, else the most common one; other samples are
 * bad (named with a sample that has the width kept). */
static int unify_text_dim(ghc_dataset_t *ds)
{
    if (!ds->text_dim) {
        int64_t *w = malloc((size_t)ds->n_samples * sizeof(*w));
        if (!w)
            return ghc_error_set(ds->core, GHC_ENOMEM, "data: out of memory");
        for (int64_t i = 0; i < ds->n_samples; i++)
            w[i] = ds->samples[i].txt_dim;
        if (ds->n_samples)
            qsort(w, (size_t)ds->n_samples, sizeof(*w), cmp_i64);
        int64_t best = 0, run = 0;
        for (int64_t i = 0; i < ds->n_samples; i++) {
            run = i && w[i] == w[i - 1] ? run + 1 : 1;
            if (run > best) {
                best = run;
                ds->text_dim = w[i];
            }
        }
        free(w);
    }
    const char *ref = NULL;
    for (int64_t i = 0; i < ds->n_samples && !ref; i++)
        if (ds->samples[i].txt_dim == ds->text_dim)
            ref = ds->samples[i].file[GHC_SAMPLE_TEXT_EMBED];
    return filter_samples(ds, judge_text_dim, (void *)ref);
}

/* ---- what the model takes --------------------------------------------------------------------- */

struct fit_state {
    ghc_data_fit_fn fit;
    void           *user;
    int64_t         misfits;             /* without skip_bad_samples: counted, the first kept */
    char            first[GHC_ERROR_MAX];
};

/* A sample the model cannot take: with skip_bad_samples a bad sample (one line, counted), else
 * counted for one error at the end. */
static int judge_fit(ghc_dataset_t *ds, int64_t i, void *user)
{
    struct fit_state *f = user;
    struct ghc_data_sample_info si;
    char why[GHC_ERROR_MAX];
    if (!ghc_dataset_sample_at(ds, i, &si) || f->fit(f->user, &si, why, sizeof(why)))
        return 0;
    if (ds->skip_bad)
        return ghc_data_bad_sample(ds, GHC_ECONFIG, "%s", why);
    if (!f->misfits++)
        snprintf(f->first, sizeof(f->first), "%s", why);
    return 0;
}

static int fit_samples(ghc_dataset_t *ds, const char *section, ghc_data_fit_fn fit, void *user)
{
    struct fit_state f = { .fit = fit, .user = user };
    int rc = filter_samples(ds, judge_fit, &f);
    if (rc < 0 || !f.misfits)
        return rc;
    if (f.misfits > 1)
        return ghc_error_set(ds->core, GHC_ECONFIG, "%s: %s; and %lld more sample%s", section, f.first,
                             (long long)(f.misfits - 1), f.misfits == 2 ? " that does not fit" : "s that do not fit");
    return ghc_error_set(ds->core, GHC_ECONFIG, "%s: %s", section, f.first);
}

/* ---- opening --------------------------------------------------------------------------------- */

int ghc_dataset_open(ghc_core_t *core, ghc_dataset_t **out)
{
    return ghc_dataset_open_section(core, "data", out);
}

int ghc_dataset_open_section(ghc_core_t *core, const char *section, ghc_dataset_t **out)
{
    return ghc_dataset_open_fit(core, section, NULL, NULL, out);
}

int ghc_dataset_open_fit(ghc_core_t *core, const char *section, ghc_data_fit_fn fit, void *user, ghc_dataset_t **out)
{
    *out = NULL;
    double t0 = ghc_data_seconds();
    /* the run's backend and cache serve the training data; another section (held-out
     * validation data) reads its folders through a local backend of its own, uncached */
    bool main_data = strcmp(section, "data") == 0;
    ghc_cfg_t *top = ghc_config_root(core), *cfg = NULL;
    int rc = top ? ghc_cfg_get_group(top, section, data_keys, &cfg) : 0;
    if (rc < 0)
        return rc;
    if (!cfg)
        return ghc_error_set(core, GHC_ECONFIG, "%s: no `%s` section (%s = { datasets = ( { path = \"...\"; } ); })",
                             top ? ghc_cfg_where(top, NULL) : "configuration", section, section);
    ghc_dataset_t *ds = calloc(1, sizeof(*ds));
    if (!ds)
        return ghc_error_set(core, GHC_ENOMEM, "data: out of memory");
    ds->core = core;
    ds->order_epoch = -1;
    if ((rc = read_config(ds, cfg)) < 0)
        goto fail;
    if (ds->empty)
        ds->text_dim = ghc_tensor_dim(ds->empty, -1);
    ds->backend = main_data ? ghc_backend_get(core) : NULL;
    if (!ds->backend) {
        if (!(ds->own_backend = ghc_backend_init(core, ghc_backend_local_ops(), NULL))) {
            rc = ghc_error_code(core);
            goto fail;
        }
        ds->backend = ds->own_backend;
    }
    struct ghc_backend_root *roots = calloc((size_t)ds->n_sets, sizeof(*roots));
    if (!roots) {
        rc = ghc_error_set(core, GHC_ENOMEM, "data: out of memory");
        goto fail;
    }
    for (int32_t d = 0; d < ds->n_sets; d++)
        roots[d] = (struct ghc_backend_root){ .path = ds->sets[d].path, .compression = ds->sets[d].compression };
    rc = ghc_backend_mount(ds->backend, roots, ds->n_sets);
    free(roots);
    if (rc < 0)
        goto fail;
    for (int32_t d = 0; d < ds->n_sets; d++) {
        ghc_cfg_t *g;
        if ((rc = discover(ds, d)) < 0 || (rc = ghc_cfg_list_group(cfg, "datasets", d, entry_keys(), &g)) < 0 ||
            (rc = ghc_data_aug_discover(ds, d, cfg, g)) < 0)
            goto fail;
        ds->sets[d].n = ds->n_samples - ds->sets[d].first;   /* its augmented clips too */
    }
    if (ds->n_samples && ((rc = unify_text_dim(ds)) < 0 || (rc = ghc_data_blanks_load(ds)) < 0))
        goto fail;
    if (ds->n_samples && fit && (rc = fit_samples(ds, section, fit, user)) < 0)
        goto fail;
    if (ds->n_samples == 0) {
        rc = ghc_error_set(core, GHC_ENOTFOUND, "data: no samples found in %s%s (expected <stem>.latent.safetensors + "
                           "<stem>.text.safetensors, musubi-tuner or ai-toolkit caches; doc/dataset.md)%s",
                           ds->sets[0].path, ds->n_sets > 1 ? " and the other datasets" : "",
                           ds->st.skipped ? ", all skipped as bad" : "");
        goto fail;
    }
    if ((rc = ghc_data_buckets_make(ds)) < 0)
        goto fail;
    if (ds->epoch_size == 0) {
        rc = ghc_error_set(core, GHC_ECONFIG, "%s: data: the weights leave no sample in an epoch",
                           ghc_cfg_where(cfg, "datasets"));
        goto fail;
    }
    ds->cache = main_data ? ghc_cache_get(core) : NULL;
    if (ds->cache) {
        struct ghc_sample_ref *refs = calloc((size_t)ds->n_samples, sizeof(*refs));
        if (!refs) {
            rc = ghc_error_set(core, GHC_ENOMEM, "data: out of memory");
            goto fail;
        }
        for (int64_t i = 0; i < ds->n_samples; i++)
            for (int k = 0; k < GHC_SAMPLE_KIND_COUNT; k++) {
                /* an augmented clip's latent is encoded at training time (data_aug.c): no file */
                bool none = k == GHC_SAMPLE_LATENT && ds->samples[i].aug1;
                refs[i].file[k] = none ? NULL : ds->samples[i].file[k];
                refs[i].key[k] = none ? NULL : ds->samples[i].key[k];
            }
        rc = ghc_cache_bind(ds->cache, ds->backend, refs, ds->n_samples);
        free(refs);
        if (rc < 0)
            goto fail;
    }
    ds->st.samples = ds->n_samples;
    ds->st.epoch_size = ds->epoch_size;
    ds->st.datasets = ds->n_sets;
    ds->st.buckets = ds->n_buckets;
    ds->st.open_seconds = ghc_data_seconds() - t0;
    ghc_log(core, GHC_LOG_INFO, "%s: %lld samples in %d buckets, %lld per epoch, batch %lld%s (%.2f s)", section,
            (long long)ds->n_samples, (int)ds->n_buckets, (long long)ds->epoch_size, (long long)ds->batch_size,
            ds->st.skipped ? ", some skipped as bad" : "", ds->st.open_seconds);
    *out = ds;
    return 0;
fail:
    ghc_dataset_free(ds);
    return rc < 0 ? rc : GHC_EINTERNAL;
}

void ghc_dataset_free(ghc_dataset_t *ds)
{
    if (!ds)
        return;
    ghc_data_aug_free(ds);
    for (int64_t i = 0; i < ds->n_samples; i++)
        ghc_data_sample_clear(&ds->samples[i]);
    free(ds->samples);
    for (int32_t d = 0; d < ds->n_sets; d++) {
        struct data_set *set = &ds->sets[d];
        free(set->path);
        free(set->trigger_word);
        free(set->default_caption);
        free(set->blank_file);
        free(set->blank_caption);
        ghc_tensor_free(set->empty);
    }
    free(ds->sets);
    free(ds->buckets);
    free(ds->order);
    free(ds->batches);
    ghc_tensor_free(ds->empty);
    ghc_backend_free(ds->own_backend);
    free(ds);
}

int64_t ghc_dataset_size(ghc_dataset_t *ds) { return ds->epoch_size; }

int64_t ghc_dataset_samples(ghc_dataset_t *ds) { return ds->n_samples; }

bool ghc_dataset_sample_at(ghc_dataset_t *ds, int64_t i, struct ghc_data_sample_info *out)
{
    if (i < 0 || i >= ds->n_samples)
        return false;
    const struct data_sample *s = &ds->samples[i];
    *out = (struct ghc_data_sample_info){
        .dataset = s->ds, .format = s->format,
        .latent_file = s->file[GHC_SAMPLE_LATENT], .text_file = s->file[GHC_SAMPLE_TEXT_EMBED],
        .caption_file = s->caption,
        .latent_key = s->key[GHC_SAMPLE_LATENT], .text_key = s->key[GHC_SAMPLE_TEXT_EMBED],
        .latent_dtype = s->lat_dtype, .text_dtype = s->txt_dtype,
        .text_len = s->txt_len, .text_dim = ds->text_dim, .bucket = s->bucket,
        .has_noise = s->file[GHC_SAMPLE_NOISE] != NULL, .has_timestep = s->file[GHC_SAMPLE_TIMESTEP] != NULL,
    };
    memcpy(out->latent_shape, s->lat_shape, sizeof(s->lat_shape));
    return true;
}

int ghc_dataset_stats(ghc_dataset_t *ds, struct ghc_data_stats *out)
{
    if (out->struct_size < sizeof(*out))
        return ghc_error_set(ds->core, GHC_EINVAL, "data: stats struct_size %u too small", out->struct_size);
    *out = ds->st;
    out->struct_size = sizeof(*out);
    return 0;
}
