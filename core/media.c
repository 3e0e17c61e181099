/* media.c: raw media (media.h) without FFmpeg: the settings and their keys, the folder scan
 * with its captions, musubi-tuner's buckets and resize geometry, the clips of each frame
 * extraction mode, and the VAE's input. Resizing is in media_resize.c, decoding in
 * media_ffmpeg.c. */
#include <config.h>

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <gh200core/media.h>
#include <gh200core/tensor.h>   /* defines: ghc_f32_to_bf16, ghc_bf16_to_f32 */

#define BUCKET_STEP 16                 /* musubi-tuner's step for Wan */
#define CAPTION_MAX (1 << 20)          /* a caption file larger than this is a bad sample */

/* ---- settings -------------------------------------------------------------------------------- */

static const char *const extraction_names[] = { "head", "chunk", "slide", "uniform", "full", NULL };

static const struct ghc_cfg_key media_keys[] = {
    { "resolution",        GHC_CFG_LIST,   "[960, 544]", "[width, height], each 1 to 8192", NULL },
    { "enable_bucket",     GHC_CFG_BOOL,   "false", NULL, NULL },
    { "bucket_no_upscale", GHC_CFG_BOOL,   "false", NULL, NULL },
    { "target_frames",     GHC_CFG_LIST,   "[1]", "frame counts, each 1 to 100000", NULL },
    { "frame_extraction",  GHC_CFG_STRING, "head", "head, chunk, slide, uniform, full", NULL },
    { "frame_stride",      GHC_CFG_INT,    "1", "1 to 100000", NULL },
    { "frame_sample",      GHC_CFG_INT,    "1", "1 to 100000", NULL },
    { "max_frames",        GHC_CFG_INT,    "129", "1 to 100000", NULL },
    { "source_fps",        GHC_CFG_FLOAT,  "(none: no conversion)", "above 0", NULL },
    { "caption_extension", GHC_CFG_STRING, ".txt", NULL, NULL },
    { "flip_x",            GHC_CFG_BOOL,   "false", "(prepare also encodes each clip mirrored left-right)", NULL },
    { "flip_y",            GHC_CFG_BOOL,   "false", "(prepare also encodes each clip upside down)", NULL },
    { "random_crop",       GHC_CFG_BOOL,   "false", "(the crop's corner drawn at random instead of centred)", NULL },
    { NULL, 0, NULL, NULL, NULL },
};

const struct ghc_cfg_key *ghc_media_keys(void)
{
    return media_keys;
}

const char *ghc_media_extraction_name(enum ghc_media_extraction e)
{
    return (unsigned)e < 5 ? extraction_names[e] : "?";
}

void ghc_media_settings_default(struct ghc_media_settings *s)
{
    memset(s, 0, sizeof(*s));
    s->width = 960;
    s->height = 544;
    s->n_target_frames = 1;
    s->target_frames[0] = 1;
    s->frame_extraction = GHC_MEDIA_HEAD;
    s->frame_stride = 1;
    s->frame_sample = 1;
    s->max_frames = 129;
    s->target_fps = 16.0;
    snprintf(s->caption_extension, sizeof(s->caption_extension), ".txt");
}

/* A list of whole numbers in [lo, hi] into out (at most max); *n its length. */
static int read_int_list(ghc_cfg_t *cfg, const char *key, int lo, int hi, int32_t *out, int max, int *n,
                         const char *expected)
{
    ghc_core_t *core = ghc_cfg_core(cfg);
    int len, rc;
    if ((rc = ghc_cfg_list_len(cfg, key, &len)) < 0)
        return rc;
    if (len < 1 || len > max)
        return ghc_error_set(core, GHC_ECONFIG, "%s: %s.%s: expected %s, got %d element%s",
                             ghc_cfg_where(cfg, key), ghc_cfg_path(cfg), key, expected, len,
                             len == 1 ? "" : "s");
    for (int i = 0; i < len; i++) {
        double v;
        if ((rc = ghc_cfg_list_float(cfg, key, i, &v)) < 0)
            return rc;
        if (v != floor(v) || v < lo || v > hi)
            return ghc_error_set(core, GHC_ECONFIG, "%s: %s.%s[%d] = %g: expected a whole number from %d to %d",
                                 ghc_cfg_where(cfg, key), ghc_cfg_path(cfg), key, i, v, lo, hi);
        out[i] = (int32_t)v;
    }
    *n = len;
    return 0;
}

int ghc_media_settings_read(ghc_cfg_t *cfg, struct ghc_media_settings *out)
{
    ghc_core_t *core = ghc_cfg_core(cfg);
    struct ghc_media_settings s;
    ghc_media_settings_default(&s);
    int rc, n, e;
    int64_t v;
    int32_t wh[2];
    const char *ext;
    if (ghc_cfg_has(cfg, "resolution")) {
        if ((rc = read_int_list(cfg, "resolution", 1, 8192, wh, 2, &n, "[width, height]")) < 0)
            return rc;
        if (n != 2)
            return ghc_error_set(core, GHC_ECONFIG, "%s: %s.resolution: expected [width, height], got 1 element",
                                 ghc_cfg_where(cfg, "resolution"), ghc_cfg_path(cfg));
        s.width = wh[0];
        s.height = wh[1];
    }
    if ((rc = ghc_cfg_get_bool(cfg, "enable_bucket", false, &s.enable_bucket)) < 0 ||
        (rc = ghc_cfg_get_bool(cfg, "bucket_no_upscale", false, &s.bucket_no_upscale)) < 0)
        return rc;
    if (ghc_cfg_has(cfg, "target_frames")) {
        int32_t given[GHC_MEDIA_MAX_TARGETS];
        if ((rc = read_int_list(cfg, "target_frames", 1, 100000, given, GHC_MEDIA_MAX_TARGETS, &n,
                                "1 to 32 frame counts")) < 0)
            return rc;
        s.n_target_frames = ghc_media_target_frames(given, n, s.target_frames);
        bool same = s.n_target_frames == n;
        for (int i = 0; same && i < n; i++)
            same = given[i] == s.target_frames[i];
        if (!same) {
            char list[GHC_MEDIA_MAX_TARGETS * 8] = "";
            for (int i = 0; i < s.n_target_frames; i++)
                snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%d", i ? ", " : "",
                         (int)s.target_frames[i]);
            ghc_log(core, GHC_LOG_WARN, "%s: %s.target_frames are rounded down to 4k + 1: [%s]",
                    ghc_cfg_where(cfg, "target_frames"), ghc_cfg_path(cfg), list);
        }
    }
    if ((rc = ghc_cfg_get_choice(cfg, "frame_extraction", GHC_MEDIA_HEAD, extraction_names, &e)) < 0 ||
        (rc = ghc_cfg_get_int(cfg, "frame_stride", 1, 1, 100000, &v)) < 0)
        return rc;
    s.frame_extraction = (enum ghc_media_extraction)e;
    s.frame_stride = (int32_t)v;
    if ((rc = ghc_cfg_get_int(cfg, "frame_sample", 1, 1, 100000, &v)) < 0)
        return rc;
    s.frame_sample = (int32_t)v;
    if ((rc = ghc_cfg_get_int(cfg, "max_frames", 129, 1, 100000, &v)) < 0)
        return rc;
    s.max_frames = (int32_t)v;
    if (ghc_cfg_has(cfg, "source_fps")) {
        if ((rc = ghc_cfg_get_float(cfg, "source_fps", 0.0, 1e-3, 1e6, &s.source_fps)) < 0)
            return rc;
    }
    if ((rc = ghc_cfg_get_string(cfg, "caption_extension", ".txt", &ext)) < 0 ||
        (rc = ghc_cfg_get_bool(cfg, "flip_x", false, &s.flip_x)) < 0 ||
        (rc = ghc_cfg_get_bool(cfg, "flip_y", false, &s.flip_y)) < 0)
        return rc;
    if (!ext[0] || strlen(ext) >= sizeof(s.caption_extension) || strchr(ext, '/'))
        return ghc_error_set(core, GHC_ECONFIG, "%s: %s.caption_extension = \"%s\": expected a file name "
                             "ending such as \".txt\" (1 to %zu bytes, no '/')",
                             ghc_cfg_where(cfg, "caption_extension"), ghc_cfg_path(cfg), ext,
                             sizeof(s.caption_extension) - 1);
    snprintf(s.caption_extension, sizeof(s.caption_extension), "%s", ext);
    if (s.frame_extraction == GHC_MEDIA_UNIFORM && s.frame_sample == 1) {
        ghc_log(core, GHC_LOG_WARN, "%s: %s: frame_extraction \"uniform\" with frame_sample = 1 is \"head\"",
                ghc_cfg_where(cfg, "frame_extraction"), ghc_cfg_path(cfg));
        s.frame_extraction = GHC_MEDIA_HEAD;
    }
    if (ghc_media_buckets(s.width, s.height, s.enable_bucket, NULL, 0) < 0)
        return ghc_error_set(core, GHC_ECONFIG, "%s: %s.resolution = [%d, %d]: no bucket fits: expected "
                             "at least 32 x 32 in area with enable_bucket", ghc_cfg_where(cfg, "resolution"),
                             ghc_cfg_path(cfg), (int)s.width, (int)s.height);
    *out = s;
    return 0;
}

/* ---- scanning --------------------------------------------------------------------------------- */

static const char *const image_exts[] = { "png", "jpg", "jpeg", "webp", "bmp", "avif", "jxl", NULL };
static const char *const video_exts[] = { "mp4", "webm", "avi", "mkv", "mov", "flv", "wmv", "m4v",
                                          "mpg", "mpeg", NULL };

/* musubi-tuner lists each extension all lower or all upper case ("a.Mp4" is not a video). */
static bool ext_in(const char *ext, const char *const *list)
{
    for (int i = 0; list[i]; i++) {
        size_t n = strlen(list[i]);
        if (strlen(ext) != n)
            continue;
        bool lower = true, upper = true;
        for (size_t j = 0; j < n; j++) {
            lower = lower && ext[j] == list[i][j];
            upper = upper && ext[j] == (char)toupper((unsigned char)list[i][j]);
        }
        if (lower || upper)
            return true;
    }
    return false;
}

enum ghc_media_kind ghc_media_kind_of(const char *name)
{
    const char *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    const char *dot = strrchr(base, '.');
    if (!dot || dot == base)
        return GHC_MEDIA_NONE;
    if (ext_in(dot + 1, image_exts))
        return GHC_MEDIA_IMAGE;
    if (ext_in(dot + 1, video_exts))
        return GHC_MEDIA_VIDEO;
    return GHC_MEDIA_NONE;
}

struct ghc_media_list {
    struct ghc_media_item *items;
    int64_t                n, bad;
};

/* Length of the UTF-8 character at s (n bytes left), 0 when invalid (overlong forms,
 * surrogates and values above U+10FFFF included); *cp its value. */
static int utf8_char(const unsigned char *s, size_t n, uint32_t *cp)
{
    if (s[0] < 0x80) {
        *cp = s[0];
        return 1;
    }
    int len = s[0] >= 0xf0 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc2 ? 2 : 0;
    if (!len || s[0] > 0xf4 || (size_t)len > n)
        return 0;
    uint32_t c = s[0] & (0x7f >> len);
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        c = (c << 6) | (s[i] & 0x3f);
    }
    if ((len == 3 && (c < 0x800 || (c >= 0xd800 && c <= 0xdfff))) || (len == 4 && (c < 0x10000 || c > 0x10ffff)))
        return 0;
    *cp = c;
    return len;
}

/* Python's str.isspace() (what str.strip() removes): Unicode White_Space plus the
 * information separators U+001C..U+001F. */
static bool py_space(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
           c == 0x202f || c == 0x205f || c == 0x3000;
}

/* Read a caption as musubi-tuner does (UTF-8 text, universal newlines, strip()). Returns the
 * malloc'ed caption, or NULL with the reason in why (a bad sample; ENOMEM as "out of memory"). */
static char *caption_read(const char *path, const char *shown, char *why, size_t n)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT)
            snprintf(why, n, "no caption %s", shown);
        else
            snprintf(why, n, "caption %s cannot be read: %s", shown, strerror(errno));
        return NULL;
    }
    char *buf = malloc(CAPTION_MAX + 1);
    size_t len = buf ? fread(buf, 1, CAPTION_MAX + 1, f) : 0;
    bool err = buf && ferror(f);
    fclose(f);
    if (!buf) {
        snprintf(why, n, "out of memory");
        return NULL;
    }
    if (err || len > CAPTION_MAX) {
        snprintf(why, n, err ? "caption %s cannot be read" : "caption %s is larger than 1 MiB", shown);
        free(buf);
        return NULL;
    }
    /* check, fold line ends, and find the first and last characters that are not white space */
    size_t j = 0, first = SIZE_MAX, last = 0;
    for (size_t i = 0; i < len;) {
        uint32_t c;
        int l = utf8_char((const unsigned char *)buf + i, len - i, &c);
        if (!l || c == 0) {
            snprintf(why, n, l ? "caption %s holds a NUL byte (byte %zu)" : "caption %s is not valid UTF-8 (byte %zu)",
                     shown, i);
            free(buf);
            return NULL;
        }
        if (c == '\r') {
            c = '\n';
            if (i + 1 < len && buf[i + 1] == '\n')
                l = 2;
            buf[j] = '\n';
            i += (size_t)l;
            l = 1;
        } else {
            memmove(buf + j, buf + i, (size_t)l);
            i += (size_t)l;
        }
        if (!py_space(c)) {
            if (first == SIZE_MAX)
                first = j;
            last = j + (size_t)l;
        }
        j += (size_t)l;
    }
    if (first == SIZE_MAX) {
        snprintf(why, n, "caption %s is empty", shown);
        free(buf);
        return NULL;
    }
    memmove(buf, buf + first, last - first);
    buf[last - first] = '\0';
    return buf;
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(((const struct ghc_media_item *)a)->name, ((const struct ghc_media_item *)b)->name);
}

void ghc_media_list_free(ghc_media_list_t *l)
{
    if (!l)
        return;
    for (int64_t i = 0; i < l->n; i++) {
        free((char *)l->items[i].path);
        free((char *)l->items[i].name);
        free((char *)l->items[i].caption);
        free((char *)l->items[i].bad);
    }
    free(l->items);
    free(l);
}

/* Fill item `it` (name set) of folder `dir`: its path, kind and caption. */
static int scan_item(ghc_core_t *core, const char *dir, const char *ext, struct ghc_media_item *it)
{
    size_t dl = strlen(dir), nl = strlen(it->name);
    char *path = malloc(dl + nl + 2), *cap = malloc(dl + nl + strlen(ext) + 2);
    if (!path || !cap) {
        free(path);
        free(cap);
        return ghc_error_set(core, GHC_ENOMEM, "media: out of memory scanning %s", dir);
    }
    snprintf(path, dl + nl + 2, "%s/%s", dir, it->name);
    it->path = path;
    it->kind = ghc_media_kind_of(it->name);
    snprintf(cap, dl + nl + strlen(ext) + 2, "%s", path);
    *strrchr(cap, '.') = '\0';
    strcat(cap, ext);
    char why[GHC_ERROR_MAX / 2], qp[GHC_ERROR_MAX / 2 - 16], qc[GHC_ERROR_MAX / 4];
    const char *base = strrchr(cap, '/') + 1;
    it->caption = caption_read(cap, ghc_path_quote(base, qc, sizeof(qc)), why, sizeof(why));
    free(cap);
    if (it->caption)
        return 0;
    if (!strcmp(why, "out of memory"))
        return ghc_error_set(core, GHC_ENOMEM, "media: out of memory reading a caption in %s", dir);
    char line[GHC_ERROR_MAX];
    snprintf(line, sizeof(line), "media: %s: %s", ghc_path_quote(path, qp, sizeof(qp)), why);
    if (!(it->bad = strdup(line)))
        return ghc_error_set(core, GHC_ENOMEM, "media: out of memory scanning %s", dir);
    return 1;
}

int ghc_media_scan(ghc_core_t *core, const char *dir, const char *caption_extension, ghc_media_list_t **out)
{
    char q[4096];
    int rc = 0;
    *out = NULL;
    const char *ext = caption_extension && caption_extension[0] ? caption_extension : ".txt";
    ghc_media_list_t *l = calloc(1, sizeof(*l));
    if (!l)
        return ghc_error_set(core, GHC_ENOMEM, "media: out of memory scanning %s", dir);
    DIR *d = opendir(dir);
    if (!d) {
        rc = ghc_error_set(core, errno == ENOENT ? GHC_ENOTFOUND : GHC_EIO, "media: %s: cannot read the folder: %s",
                           ghc_path_quote(dir, q, sizeof(q)), strerror(errno));
        goto out_free;
    }
    int64_t cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' || ghc_media_kind_of(e->d_name) == GHC_MEDIA_NONE)
            continue;
        if (l->n == cap) {
            cap = cap ? 2 * cap : 64;
            struct ghc_media_item *p = realloc(l->items, (size_t)cap * sizeof(*p));
            if (!p) {
                rc = ghc_error_set(core, GHC_ENOMEM, "media: out of memory scanning %s", dir);
                goto out_close;
            }
            l->items = p;
        }
        memset(&l->items[l->n], 0, sizeof(l->items[0]));
        if (!(l->items[l->n].name = strdup(e->d_name))) {
            rc = ghc_error_set(core, GHC_ENOMEM, "media: out of memory scanning %s", dir);
            goto out_close;
        }
        l->n++;
    }
    if (l->n)
        qsort(l->items, (size_t)l->n, sizeof(l->items[0]), name_cmp);
    for (int64_t i = 0; i < l->n; i++) {
        if ((rc = scan_item(core, dir, ext, &l->items[i])) < 0)
            goto out_close;
        l->bad += rc;
        rc = 0;
    }
out_close:
    closedir(d);
out_free:
    if (rc < 0)
        ghc_media_list_free(l);
    else
        *out = l;
    return rc;
}

int64_t ghc_media_list_len(const ghc_media_list_t *l)
{
    return l ? l->n : 0;
}

const struct ghc_media_item *ghc_media_list_at(const ghc_media_list_t *l, int64_t i)
{
    return l && i >= 0 && i < l->n ? &l->items[i] : NULL;
}

int64_t ghc_media_list_bad(const ghc_media_list_t *l)
{
    return l ? l->bad : 0;
}

/* ---- buckets and geometry --------------------------------------------------------------------- */

static int pair_cmp(const void *a, const void *b)
{
    const int32_t *x = a, *y = b;
    return x[0] != y[0] ? (x[0] > y[0]) - (x[0] < y[0]) : (x[1] > y[1]) - (x[1] < y[1]);
}

/* All buckets, malloc'ed into *out (sorted, distinct); returns the count or GHC_E*. */
static int buckets_all(int32_t width, int32_t height, bool enable_bucket, int32_t (**out)[2])
{
    *out = NULL;
    if (width < 1 || height < 1)
        return GHC_EINVAL;
    if (!enable_bucket) {
        if (!(*out = malloc(sizeof(**out))))
            return GHC_ENOMEM;
        (*out)[0][0] = width;
        (*out)[0][1] = height;
        return 1;
    }
    int64_t area = (int64_t)width * height;
    int64_t s = (int64_t)sqrt((double)area);
    while (s * s > area)
        s--;
    while ((s + 1) * (s + 1) <= area)
        s++;
    int64_t lo = (s / 2) / BUCKET_STEP * BUCKET_STEP;
    if (lo < BUCKET_STEP)
        return GHC_EINVAL;
    int cap = 2 * (int)((s + BUCKET_STEP - 1 - lo) / BUCKET_STEP + 1);
    int32_t (*b)[2] = malloc((size_t)cap * sizeof(*b));
    if (!b)
        return GHC_ENOMEM;
    int n = 0;
    for (int64_t w = lo; w < s + BUCKET_STEP; w += BUCKET_STEP) {
        int64_t h = (area / w) / BUCKET_STEP * BUCKET_STEP;
        b[n][0] = (int32_t)w, b[n][1] = (int32_t)h, n++;
        b[n][0] = (int32_t)h, b[n][1] = (int32_t)w, n++;
    }
    qsort(b, (size_t)n, sizeof(*b), pair_cmp);
    int m = 0;
    for (int i = 0; i < n; i++)
        if (!m || pair_cmp(b[i], b[m - 1]) != 0)
            b[m][0] = b[i][0], b[m][1] = b[i][1], m++;
    *out = b;
    return m;
}

int ghc_media_buckets(int32_t width, int32_t height, bool enable_bucket, int32_t (*out)[2], int max)
{
    int32_t (*b)[2];
    int n = buckets_all(width, height, enable_bucket, &b);
    for (int i = 0; i < n && i < max; i++)
        out[i][0] = b[i][0], out[i][1] = b[i][1];
    free(b);
    return n;
}

int ghc_media_bucket_select(int32_t width, int32_t height, bool enable_bucket, bool no_upscale,
                            int32_t w, int32_t h, int32_t *bw, int32_t *bh)
{
    if (w < 1 || h < 1)
        return GHC_EINVAL;
    if (enable_bucket && no_upscale && (int64_t)w * h <= (int64_t)width * height) {
        if (w < BUCKET_STEP || h < BUCKET_STEP)
            return GHC_EFORMAT;
        *bw = w / BUCKET_STEP * BUCKET_STEP;
        *bh = h / BUCKET_STEP * BUCKET_STEP;
        return 0;
    }
    int32_t (*b)[2];
    int n = buckets_all(width, height, enable_bucket, &b);
    if (n < 0)
        return n;
    /* numpy's argmin of |w_b / h_b - w / h| in doubles: the first of equals */
    double a = (double)w / (double)h, best = INFINITY;
    int k = 0;
    for (int i = 0; i < n; i++) {
        double err = fabs((double)b[i][0] / (double)b[i][1] - a);
        if (err < best)
            best = err, k = i;
    }
    *bw = b[k][0];
    *bh = b[k][1];
    free(b);
    return 0;
}

void ghc_media_fit(int32_t w, int32_t h, int32_t bw, int32_t bh, int32_t *rw, int32_t *rh,
                   int32_t *left, int32_t *top)
{
    double sw = (double)bw / w, sh = (double)bh / h, s = sw > sh ? sw : sh;
    int32_t W = (int32_t)(w * s + 0.5), H = (int32_t)(h * s + 0.5);
    if (w == bw && h == bh)
        W = w, H = h;
    if (rw)
        *rw = W;
    if (rh)
        *rh = H;
    if (left)
        *left = (W - bw) / 2;
    if (top)
        *top = (H - bh) / 2;
}

/* ---- frame extraction ----------------------------------------------------------------------- */

static int int_cmp(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

int ghc_media_target_frames(const int32_t *in, int n, int32_t *out)
{
    int32_t tmp[GHC_MEDIA_MAX_TARGETS];
    int m = 0;
    for (int i = 0; i < n && m < GHC_MEDIA_MAX_TARGETS; i++)
        if (in[i] >= 1)
            tmp[m++] = (in[i] - 1) / 4 * 4 + 1;
    qsort(tmp, (size_t)m, sizeof(tmp[0]), int_cmp);
    int k = 0;
    for (int i = 0; i < m; i++)
        if (!k || tmp[i] != out[k - 1])
            out[k++] = tmp[i];
    return k;
}

/* Append (start, frames) when there is room; counts either way. */
static void clip_add(struct ghc_media_clip *out, int64_t max, int64_t *n, int64_t start, int32_t frames)
{
    if (*n < max)
        out[*n] = (struct ghc_media_clip){ start, frames };
    (*n)++;
}

int64_t ghc_media_clips(const struct ghc_media_settings *s, int64_t n, struct ghc_media_clip *out, int64_t max)
{
    int32_t t[GHC_MEDIA_MAX_TARGETS];
    int nt = ghc_media_target_frames(s->target_frames, s->n_target_frames, t);
    int64_t c = 0;
    enum ghc_media_extraction mode = s->frame_extraction;
    if (mode == GHC_MEDIA_UNIFORM && s->frame_sample <= 1)
        mode = GHC_MEDIA_HEAD;
    if (n < 1)
        return 0;
    if (mode == GHC_MEDIA_FULL) {
        int64_t f = n < s->max_frames ? n : s->max_frames;
        clip_add(out, max, &c, 0, (int32_t)((f - 1) / 4 * 4 + 1));
        return c;
    }
    for (int k = 0; k < nt; k++) {
        int64_t f = t[k];
        if (f > n)
            continue;
        switch (mode) {
        case GHC_MEDIA_HEAD:
            clip_add(out, max, &c, 0, (int32_t)f);
            break;
        case GHC_MEDIA_CHUNK:
            for (int64_t i = 0; i + f <= n; i += f)
                clip_add(out, max, &c, i, (int32_t)f);
            break;
        case GHC_MEDIA_SLIDE:
            for (int64_t i = 0; i <= n - f; i += s->frame_stride > 0 ? s->frame_stride : 1)
                clip_add(out, max, &c, i, (int32_t)f);
            break;
        case GHC_MEDIA_UNIFORM: {
            /* np.linspace(0, n - f, frame_sample, dtype=int): i * step in doubles, the last one
             * exactly n - f, truncated; musubi-tuner writes an equal start's file twice, so
             * equal starts are one clip here */
            double step = (double)(n - f) / (double)(s->frame_sample - 1);
            int64_t prev = -1;
            for (int32_t i = 0; i < s->frame_sample; i++) {
                int64_t st = i == s->frame_sample - 1 ? n - f : (int64_t)((double)i * step);
                if (st != prev)
                    clip_add(out, max, &c, st, (int32_t)f);
                prev = st;
            }
            break;
        }
        default:
            break;
        }
    }
    return c;
}

/* ---- augmentations ------------------------------------------------------------------------- */

void ghc_media_flip(const uint8_t *src, int64_t f, int32_t h, int32_t w, bool flip_x, bool flip_y, uint8_t *dst)
{
    size_t row = (size_t)w * 3;
    for (int64_t k = 0; k < f; k++)
        for (int32_t y = 0; y < h; y++) {
            const uint8_t *s = src + ((size_t)k * (size_t)h + (size_t)(flip_y ? h - 1 - y : y)) * row;
            uint8_t *d = dst + ((size_t)k * (size_t)h + (size_t)y) * row;
            if (!flip_x) {
                memcpy(d, s, row);
                continue;
            }
            for (int32_t x = 0; x < w; x++)
                memcpy(d + (size_t)x * 3, s + (size_t)(w - 1 - x) * 3, 3);
        }
}

/* ---- the VAE's input ------------------------------------------------------------------------ */

void ghc_media_to_vae_f32(const uint8_t *frames, int64_t f, int32_t h, int32_t w, float *out)
{
    int64_t plane = f * h * w;
    for (int64_t p = 0; p < plane; p++)
        for (int c = 0; c < 3; c++)
            out[c * plane + p] = (float)frames[3 * p + c] / 127.5f - 1.0f;
}

void ghc_media_to_vae_bf16(const uint8_t *frames, int64_t f, int32_t h, int32_t w, uint16_t *out)
{
    uint16_t lut[256];
    for (int v = 0; v < 256; v++)
        lut[v] = ghc_f32_to_bf16(ghc_bf16_to_f32(ghc_f32_to_bf16((float)v / 127.5f)) - 1.0f);
    int64_t plane = f * h * w;
    for (int64_t p = 0; p < plane; p++)
        for (int c = 0; c < 3; c++)
            out[c * plane + p] = lut[frames[3 * p + c]];
}
