/* data_formats.c: the layouts sample files come in, as one table: how a file name is
 * classified (a latent or a text embedding, and the stem that pairs them), which tensor keys
 * hold the latent and the text, how a latent finds its text file and what more is checked.
 * Also a dataset's listing, and the header checks every format shares: discovery reads only
 * headers, so that opening a large dataset reads no tensor data. */
#include <config.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataset_impl.h"

#define HEADER_PROBE (64u * 1024)   /* first read of a header; longer headers read again */

/* ---- names ----------------------------------------------------------------------------------- */

/* The first n bytes of name as the stem: 1, or GHC_ENOMEM. */
static int stem_cut(const char *name, size_t n, char **stem)
{
    char *s = malloc(n + 1);
    if (!s)
        return GHC_ENOMEM;
    memcpy(s, name, n);
    s[n] = '\0';
    *stem = s;
    return 1;
}

/* gh200core: "<stem>.latent.safetensors" and "<stem>.text.safetensors". */
static int native_classify(const char *name, enum ghc_sample_kind *kind, char **stem)
{
    static const struct { const char *suffix; enum ghc_sample_kind kind; } files[] = {
        { ".latent.safetensors", GHC_SAMPLE_LATENT }, { ".text.safetensors", GHC_SAMPLE_TEXT_EMBED } };
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++)
        if (ghc_data_ends_with(name, files[i].suffix)) {
            *kind = files[i].kind;
            return stem_cut(name, strlen(name) - strlen(files[i].suffix), stem);
        }
    return 0;
}

/* "_1280x0720_wan.safetensors" at the end of s: where it starts, or NULL. */
static const char *musubi_size_suffix(const char *s)
{
    if (!ghc_data_ends_with(s, "_wan.safetensors"))
        return NULL;
    const char *end = s + strlen(s) - strlen("_wan.safetensors");
    const char *p = end;
    int digits = 0;
    while (p > s && p[-1] >= '0' && p[-1] <= '9') { p--; digits++; }
    if (!digits || p == s || p[-1] != 'x')
        return NULL;
    p--;
    digits = 0;
    while (p > s && p[-1] >= '0' && p[-1] <= '9') { p--; digits++; }
    if (!digits || p == s || p[-1] != '_')
        return NULL;
    return p - 1;
}

/* musubi-tuner: "<stem>_<W>x<H>_wan.safetensors" and "<stem>_wan_te.safetensors". */
static int musubi_classify(const char *name, enum ghc_sample_kind *kind, char **stem)
{
    const char *size;
    if (ghc_data_ends_with(name, "_wan_te.safetensors")) {
        *kind = GHC_SAMPLE_TEXT_EMBED;
        return stem_cut(name, strlen(name) - strlen("_wan_te.safetensors"), stem);
    }
    if ((size = musubi_size_suffix(name))) {
        *kind = GHC_SAMPLE_LATENT;
        return stem_cut(name, (size_t)(size - name), stem);
    }
    return 0;
}

/* ---- tensor keys ----------------------------------------------------------------------------- */

static bool key_is_latent(const char *key) { return strcmp(key, "latent") == 0; }

static bool key_is_text_embed(const char *key) { return strcmp(key, "text_embed") == 0; }

/* "latents_<F>x<H>x<W>_<dtype>" */
static bool musubi_latent_key(const char *key)
{
    return strncmp(key, "latents_", 8) == 0 && key[8] >= '0' && key[8] <= '9';
}

/* "varlen_t5_<dtype>" */
static bool musubi_text_key(const char *key) { return strncmp(key, "varlen_t5_", 10) == 0; }

static enum ghc_dtype torch_dtype(const char *name, bool *ok)
{
    *ok = true;
    if (strcmp(name, "bfloat16") == 0) return GHC_DTYPE_BF16;
    if (strcmp(name, "float16") == 0)  return GHC_DTYPE_F16;
    if (strcmp(name, "float32") == 0)  return GHC_DTYPE_F32;
    *ok = false;
    return GHC_DTYPE_F32;
}

/* musubi-tuner's latent key names its shape and dtype; a file whose tensor says otherwise was
 * not written by it as it is. */
static int musubi_latent_check(ghc_dataset_t *ds, const char *disk, const char *key, const struct ghc_st_info *info)
{
    long long f, h, w;
    char dt[32];
    bool ok;
    if (sscanf(key, "latents_%lldx%lldx%lld_%31s", &f, &h, &w, dt) != 4 ||
        f != info->shape[1] || h != info->shape[2] || w != info->shape[3] ||
        torch_dtype(dt, &ok) != info->dtype || !ok)
        return ghc_data_bad_sample(ds, GHC_EFORMAT, "%s: \"%s\" holds [%lld, %lld, %lld, %lld] %s, which its name "
                                   "contradicts", disk, key, (long long)info->shape[0], (long long)info->shape[1],
                                   (long long)info->shape[2], (long long)info->shape[3],
                                   ghc_dtype_name(info->dtype));
    return 0;
}

/* Its text key names the dtype, likewise. */
static int musubi_text_check(ghc_dataset_t *ds, const char *disk, const char *key, const struct ghc_st_info *info)
{
    bool ok;
    if (torch_dtype(key + 10, &ok) != info->dtype || !ok)
        return ghc_data_bad_sample(ds, GHC_EFORMAT, "%s: \"%s\" holds %s, which its name contradicts", disk, key,
                                   ghc_dtype_name(info->dtype));
    return 0;
}

/* ---- pairing --------------------------------------------------------------------------------- */

/* The text file with the latent's stem. */
static int pair_same_stem(ghc_dataset_t *ds, struct data_listing *ls, const struct data_found *lat,
                          const struct data_found **text)
{
    (void)ds;
    *text = ghc_data_listing_find(ls, ghc_data_class(lat->format, GHC_SAMPLE_TEXT_EMBED), lat->stem);
    return 0;
}

/* musubi-tuner caches a video's clips "<stem>_<start:05d>-<frames:03d>" with one text file,
 * the video's. */
static int musubi_pair(ghc_dataset_t *ds, struct data_listing *ls, const struct data_found *lat,
                       const struct data_found **text)
{
    pair_same_stem(ds, ls, lat, text);
    size_t sl = strlen(lat->stem);
    char base[4096];
    if (!*text && sl > 10 && sl < sizeof(base) && lat->stem[sl - 10] == '_' && lat->stem[sl - 4] == '-') {
        memcpy(base, lat->stem, sl - 10);
        base[sl - 10] = '\0';
        *text = ghc_data_listing_find(ls, ghc_data_class(lat->format, GHC_SAMPLE_TEXT_EMBED), base);
    }
    return 0;
}

/* ---- the table ------------------------------------------------------------------------------- */

/* In the order names are tried: a name two formats could claim is the first one's (a
 * "_latent_cache/x_<W>x<H>_wan.safetensors" is ai-toolkit's, a "<x>.latent.safetensors"
 * anywhere is gh200core's). */
static const struct data_format formats[] = {
    {
        .format = GHC_DATA_FORMAT_NATIVE, .name = "gh200core", .what = "gh200core format",
        .classify = native_classify,
        .latent = { .match = key_is_latent, .hint = "\"latent\"" },
        .text = { .match = key_is_text_embed, .hint = "\"text_embed\"" },
        .pair = pair_same_stem, .text_name = ".text.safetensors",
        /* one text file per latent, both written by the project */
        .lone_text = ".latent.safetensors",
    },
    {
        .format = GHC_DATA_FORMAT_AITK, .name = "ai-toolkit", .what = "ai-toolkit cache",
        .latents = "posterior samples",
        .classify = ghc_aitk_classify,
        .latent = { .match = key_is_latent, .hint = "\"latent\"" },
        .text = { .match = key_is_text_embed, .hint = "\"text_embed\"" },
        .pair = ghc_aitk_pair, .text_name = "_<hash>.safetensors in _t_e_cache/",
        .report = ghc_aitk_report,
    },
    {
        .format = GHC_DATA_FORMAT_MUSUBI, .name = "musubi-tuner", .what = "musubi-tuner cache",
        .latents = "posterior means",
        .classify = musubi_classify,
        .latent = { .match = musubi_latent_key, .hint = "\"latents_<F>x<H>x<W>_<dtype>\"",
                    .check = musubi_latent_check },
        .text = { .match = musubi_text_key, .hint = "\"varlen_t5_<dtype>\"", .check = musubi_text_check },
        .pair = musubi_pair, .text_name = "_wan_te.safetensors",
    },
};
_Static_assert(sizeof(formats) / sizeof(formats[0]) == GHC_DATA_N_FORMATS, "one entry per enum ghc_data_format");

const struct data_format *ghc_data_format_of(enum ghc_data_format format)
{
    for (size_t i = 0; i < sizeof(formats) / sizeof(formats[0]); i++)
        if (formats[i].format == format)
            return &formats[i];
    return NULL;
}

const char *ghc_data_format_name(enum ghc_data_format f)
{
    const struct data_format *fmt = ghc_data_format_of(f);
    return fmt ? fmt->name : "?";
}

/* ---- the listing ----------------------------------------------------------------------------- */

static int visit_entry(void *user, const char *name, uint64_t size)
{
    (void)size;
    struct data_listing *ls = user;
    struct data_found f = { .cls = GHC_DATA_CLASS_CAPTION };
    int rc = 0;
    for (size_t i = 0; i < sizeof(formats) / sizeof(formats[0]) && rc == 0; i++)
        if ((rc = formats[i].classify(name, &f.kind, &f.stem)) > 0) {
            f.format = formats[i].format;
            f.cls = ghc_data_class(f.format, f.kind);
        }
    if (rc == 0 && ghc_data_ends_with(name, ".txt"))
        rc = stem_cut(name, strlen(name) - 4, &f.stem);
    if (rc <= 0) {
        ls->oom |= rc == GHC_ENOMEM;
        return rc;
    }
    if (ls->n == ls->cap) {
        size_t cap = ls->cap ? ls->cap * 2 : 256;
        struct data_found *nf = realloc(ls->f, cap * sizeof(*nf));
        if (!nf) {
            free(f.stem);
            ls->oom = true;
            return GHC_ENOMEM;
        }
        ls->f = nf;
        ls->cap = cap;
    }
    if (!(f.name = strdup(name))) {
        free(f.stem);
        ls->oom = true;
        return GHC_ENOMEM;
    }
    ls->f[ls->n++] = f;
    return 0;
}

static int cmp_found(const void *a, const void *b)
{
    const struct data_found *x = a, *y = b;
    int c = strcmp(x->stem, y->stem);
    return c ? c : x->cls - y->cls;
}

int ghc_data_listing_read(ghc_dataset_t *ds, int32_t d, struct data_listing *ls)
{
    char prefix[24];
    snprintf(prefix, sizeof(prefix), "%d/", (int)d);
    int rc = ghc_backend_list(ds->backend, prefix, visit_entry, ls);
    if (ls->oom)
        rc = ghc_error_set(ds->core, GHC_ENOMEM, "data: out of memory listing %s", ds->sets[d].path);
    if (rc < 0)
        return rc;
    if (ls->n)   /* an empty folder: f is NULL, and qsort(NULL, 0, ...) is undefined */
        qsort(ls->f, ls->n, sizeof(*ls->f), cmp_found);
    return 0;
}

void ghc_data_listing_free(struct data_listing *ls)
{
    for (size_t i = 0; i < ls->n; i++) {
        free(ls->f[i].name);
        free(ls->f[i].stem);
    }
    free(ls->f);
}

const struct data_found *ghc_data_listing_find(const struct data_listing *ls, int cls, const char *stem)
{
    struct data_found key = { .stem = (char *)stem, .cls = cls };
    return bsearch(&key, ls->f, ls->n, sizeof(*ls->f), cmp_found);
}

bool ghc_data_listing_range(const struct data_listing *ls, int cls, const char *stem, size_t *lo, size_t *hi)
{
    const struct data_found *f = ghc_data_listing_find(ls, cls, stem);
    if (!f)
        return false;
    size_t a = (size_t)(f - ls->f), b = a + 1;
    while (a > 0 && ls->f[a - 1].cls == cls && strcmp(ls->f[a - 1].stem, stem) == 0)
        a--;
    while (b < ls->n && ls->f[b].cls == cls && strcmp(ls->f[b].stem, stem) == 0)
        b++;
    *lo = a;
    *hi = b;
    return true;
}

/* ---- headers --------------------------------------------------------------------------------- */

/* The safetensors header of `entry` through the backend, header-only: 0 with *st and *owned
 * (the bytes *st may borrow; freed after ghc_st_free), or the failure as a bad sample. */
static int read_header(ghc_dataset_t *ds, const char *entry, char *disk, size_t dn, ghc_st_t **st, void **owned)
{
    const void *data;
    size_t len;
    uint64_t size;
    *st = NULL;
    *owned = NULL;
    ghc_data_disk_name(ds, entry, disk, dn);
    if (ghc_backend_fetch(ds->backend, entry, HEADER_PROBE, &data, owned, &len, &size) < 0)
        goto fail;
    if (len >= 8) {
        uint64_t hlen = 0;
        for (int i = 7; i >= 0; i--)
            hlen = (hlen << 8) | ((const uint8_t *)data)[i];
        if (hlen <= GHC_ST_MAX_HEADER && 8 + hlen > len && 8 + hlen <= size) {
            free(*owned);
            *owned = NULL;
            if (ghc_backend_fetch(ds->backend, entry, 8 + hlen, &data, owned, &len, &size) < 0)
                goto fail;
        }
    }
    if ((*st = ghc_st_open_memory(ds->core, disk, data, len, size)))
        return 0;
fail:
    free(*owned);
    *owned = NULL;
    return ghc_data_bad_sample(ds, ghc_error_code(ds->core), "%s", ghc_error_message(ds->core));
}

/* The header of `entry` and its tensor by `rule`: 0 with *st, *owned (free both) and *info
 * (its key is info->name), else a bad sample ("no <what>") with nothing left to free. */
static int header_key(ghc_dataset_t *ds, const char *entry, const struct data_key_rule *rule, const char *what,
                      char *disk, size_t dn, ghc_st_t **st, void **owned, struct ghc_st_info *info)
{
    int rc = read_header(ds, entry, disk, dn, st, owned);
    if (rc != 0)
        return rc;
    for (int i = 0; i < ghc_st_count(*st); i++) {
        ghc_st_info_at(*st, i, info);
        if (rule->match(info->name))
            return 0;
    }
    rc = ghc_data_bad_sample(ds, GHC_EFORMAT, "%s: no %s (expected %s)", disk, what, rule->hint);
    ghc_st_free(*st);
    free(*owned);
    return rc;
}

/* The dtypes a batch can serve: bf16, f16 and f32 (no fp8). */
static bool servable(enum ghc_dtype dt)
{
    return ghc_dtype_is_float(dt) && dt != GHC_DTYPE_F8_E4M3 && dt != GHC_DTYPE_F8_E5M2;
}

/* "1, 512, 4096" */
static const char *shape_str(const struct ghc_st_info *info, char *sh, size_t n)
{
    sh[0] = '\0';
    for (int i = 0; i < info->ndim; i++)
        snprintf(sh + strlen(sh), n - strlen(sh), "%s%lld", i ? ", " : "", (long long)info->shape[i]);
    return sh;
}

/* Check the latent file's header and fill the sample's latent fields, with the stored noise
 * and timestep any format's latent file may hold. */
static int check_latent(ghc_dataset_t *ds, const struct data_format *fmt, struct data_sample *s)
{
    char disk[4400], sh[80];
    void *owned;
    ghc_st_t *st;
    struct ghc_st_info info = { 0 };
    int rc = header_key(ds, s->file[GHC_SAMPLE_LATENT], &fmt->latent, "latent tensor", disk, sizeof(disk), &st,
                        &owned, &info);
    if (rc != 0)
        return rc;
    const char *key = info.name;
    if (info.ndim != 4 || !servable(info.dtype) || info.shape[0] < 1 || info.shape[1] < 1 || info.shape[2] < 1 ||
        info.shape[3] < 1) {
        rc = ghc_data_bad_sample(ds, GHC_EFORMAT, "%s: \"%s\" is [%s] %s, expected [C, F, H, W] (each at least 1) of "
                                 "bf16, f16 or f32",
                                 disk, key, shape_str(&info, sh, sizeof(sh)), ghc_dtype_name(info.dtype));
        goto out;
    }
    if (fmt->latent.check && (rc = fmt->latent.check(ds, disk, key, &info)) != 0)
        goto out;
    s->lat_dtype = info.dtype;
    memcpy(s->lat_shape, info.shape, sizeof(s->lat_shape));
    if (!(s->key[GHC_SAMPLE_LATENT] = strdup(key))) {
        rc = ghc_error_set(ds->core, GHC_ENOMEM, "data: out of memory");
        goto out;
    }
    struct ghc_st_info ni;
    if (ghc_st_find(st, "noise", &ni)) {
        if (ni.dtype != info.dtype || ni.ndim != 4 || memcmp(ni.shape, info.shape, 4 * sizeof(int64_t)) != 0) {
            rc = ghc_data_bad_sample(ds, GHC_EFORMAT, "%s: \"noise\" must have the latent's shape and dtype (%s)",
                                     disk, ghc_dtype_name(info.dtype));
            goto out;
        }
        if (!(s->file[GHC_SAMPLE_NOISE] = strdup(s->file[GHC_SAMPLE_LATENT])) ||
            !(s->key[GHC_SAMPLE_NOISE] = strdup("noise"))) {
            rc = ghc_error_set(ds->core, GHC_ENOMEM, "data: out of memory");
            goto out;
        }
    }
    if (ghc_st_find(st, "timestep", &ni)) {
        int64_t numel = 1;
        for (int i = 0; i < ni.ndim; i++)
            numel *= ni.shape[i];
        if (numel != 1 || !ghc_dtype_is_float(ni.dtype)) {
            rc = ghc_data_bad_sample(ds, GHC_EFORMAT, "%s: \"timestep\" must be one float, got %lld elements of %s",
                                     disk, (long long)numel, ghc_dtype_name(ni.dtype));
            goto out;
        }
        if (!(s->file[GHC_SAMPLE_TIMESTEP] = strdup(s->file[GHC_SAMPLE_LATENT])) ||
            !(s->key[GHC_SAMPLE_TIMESTEP] = strdup("timestep"))) {
            rc = ghc_error_set(ds->core, GHC_ENOMEM, "data: out of memory");
            goto out;
        }
    }
out:
    ghc_st_free(st);
    free(owned);
    return rc;
}

/* Check the text file's header and fill the sample's text fields. */
static int check_text(ghc_dataset_t *ds, const struct data_format *fmt, struct data_sample *s)
{
    char disk[4400], sh[80];
    void *owned;
    ghc_st_t *st;
    struct ghc_st_info info = { 0 };
    int rc = header_key(ds, s->file[GHC_SAMPLE_TEXT_EMBED], &fmt->text, "text embedding", disk, sizeof(disk), &st,
                        &owned, &info);
    if (rc != 0)
        return rc;
    const char *key = info.name;
    bool shape_ok = (info.ndim == 2 || (info.ndim == 3 && info.shape[0] == 1)) && info.shape[info.ndim - 2] >= 1;
    if (!shape_ok || !servable(info.dtype)) {
        rc = ghc_data_bad_sample(ds, GHC_EFORMAT, "%s: \"%s\" is [%s] %s, expected [L, D] or [1, L, D] (L >= 1) of "
                                 "bf16, f16 or f32", disk, key, shape_str(&info, sh, sizeof(sh)),
                                 ghc_dtype_name(info.dtype));
        goto out;
    }
    if (fmt->text.check && (rc = fmt->text.check(ds, disk, key, &info)) != 0)
        goto out;
    s->txt_dim = info.shape[info.ndim - 1];
    s->txt_dtype = info.dtype;
    s->txt_len = info.shape[info.ndim - 2];
    if (!(s->key[GHC_SAMPLE_TEXT_EMBED] = strdup(key)))
        rc = ghc_error_set(ds->core, GHC_ENOMEM, "data: out of memory");
out:
    ghc_st_free(st);
    free(owned);
    return rc;
}

int ghc_data_text_check(ghc_dataset_t *ds, struct data_sample *s)
{
    return check_text(ds, ghc_data_format_of(s->format), s);
}

int ghc_data_sample_check(ghc_dataset_t *ds, struct data_sample *s)
{
    const struct data_format *fmt = ghc_data_format_of(s->format);
    int rc = check_latent(ds, fmt, s);
    return rc == 0 ? check_text(ds, fmt, s) : rc;
}
