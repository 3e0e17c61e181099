/* safetensors.c: the safetensors reader (mapped, strictly validated, lazy, converting on load)
 * and sharded checkpoints through *.safetensors.index.json. The writer is safetensors_write.c.
 *
 * Format: 8 bytes little-endian header length N, N bytes of UTF-8 JSON, then the data section.
 * Validation follows upstream safetensors (the Rust crate behind Python's `safetensors`) and is
 * stricter where upstream is silent:
 *   - 2 <= N <= GHC_ST_MAX_HEADER and 8 + N <= file size;
 *   - the header is one JSON object (jansson checks UTF-8; duplicate keys are rejected);
 *   - "__metadata__", when present, is an object of strings;
 *   - every other member is a tensor: an object with exactly "dtype" (a name this build knows),
 *     "shape" (at most GHC_TENSOR_MAX_DIMS non-negative integers whose product, times the
 *     dtype size, fits in int64) and "data_offsets" ([begin, end], begin <= end <= data size,
 *     end - begin = numel * dtype size); unknown members are rejected (upstream ignores them);
 *   - as upstream: the tensors, sorted by offset, cover the data section exactly: the first
 *     begins at 0, each begins where the previous one ends (no overlap, no hole) and the last
 *     ends at the end of the file.
 * Every failure is GHC_EFORMAT (GHC_EIO when the file system fails) with one line
 * "PATH: what (tensor NAME)". */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include <gh200core/safetensors.h>

#include "core_impl.h"   /* defines: ghc_strdup */

/* ---- the reader's data ------------------------------------------------------------------------ */

struct st_entry {
    char             *name;
    enum ghc_dtype    dtype;
    int               ndim;
    int64_t           shape[GHC_TENSOR_MAX_DIMS];
    uint64_t          begin, end;     /* data_offsets */
    struct st_shard  *shard;
};

struct st_shard {                     /* one mapped .safetensors file */
    char             *path;
    const uint8_t    *map;
    size_t            size;           /* of the file */
    size_t            avail;          /* bytes present at map (< size: a header-only prefix) */
    bool              borrowed;       /* map is the caller's memory (ghc_st_open_memory) */
    const uint8_t    *data;           /* the data section */
    uint64_t          data_size;
    struct st_entry  *entries;        /* in name order */
    int               n;
    char            **meta_key, **meta_val;
    int               n_meta;
};

struct ghc_st {
    ghc_core_t       *core;
    char             *path;           /* as opened: a .safetensors or an index */
    struct st_shard  *shards;
    int               n_shards;
    struct st_entry **index;          /* every tensor, in name order; points into shards */
    int               n;
    char            **meta_key, **meta_val; /* entries borrowed from shards or in own_meta */
    int               n_meta;
    bool              own_meta_arrays;      /* meta_key/meta_val themselves are ours */
    char            **own_meta;       /* strings this handle allocated for metadata */
    int               n_own_meta;
};

/* ---- messages ------------------------------------------------------------------------------ */

/* A name made safe for a one-line message: control bytes become '?', long names are cut. */
const char *ghc_st_esc(const char *s, char *buf, size_t len)
{
    size_t i, j = 0;
    for (i = 0; s[i] && j + 4 < len; i++)
        buf[j++] = ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) ? '?' : s[i];
    if (s[i]) {
        while (j > 0 && ((unsigned char)s[i] & 0xc0) == 0x80) {   /* cut between characters */
            i--;
            j--;
        }
        memcpy(buf + j, "...", 3);
        j += 3;
    }
    buf[j] = '\0';
    return buf;
}

/* jansson's text may quote raw input bytes: keep only printable ASCII. */
static const char *esc_ascii(const char *s, char *buf, size_t len)
{
    size_t j = 0;
    for (size_t i = 0; s[i] && j + 1 < len; i++)
        buf[j++] = ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] >= 0x7f) ? '?' : s[i];
    buf[j] = '\0';
    return buf;
}

static int fmt_err(ghc_core_t *core, const char *path, const char *name, const char *fmt, ...)
    GHC_PRINTF(4, 5);

/* "PATH: what (tensor NAME)" as GHC_EFORMAT; name may be NULL. */
static int fmt_err(ghc_core_t *core, const char *path, const char *name, const char *fmt, ...)
{
    char what[512], nbuf[128], q[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    ghc_path_quote(path, q, sizeof(q));
    if (name)
        return ghc_error_set(core, GHC_EFORMAT, "%s: %s (tensor \"%s\")", q, what,
                             ghc_st_esc(name, nbuf, sizeof(nbuf)));
    return ghc_error_set(core, GHC_EFORMAT, "%s: %s", q, what);
}

/* ---- one file: map and validate ------------------------------------------------------------- */

static void shard_release(struct st_shard *sh)
{
    if (sh->map && !sh->borrowed)
        munmap((void *)sh->map, sh->size);
    for (int i = 0; i < sh->n; i++)
        free(sh->entries[i].name);
    free(sh->entries);
    for (int i = 0; i < sh->n_meta; i++) {
        free(sh->meta_key[i]);
        free(sh->meta_val[i]);
    }
    free(sh->meta_key);
    free(sh->meta_val);
    free(sh->path);
    memset(sh, 0, sizeof(*sh));
}

static int map_file(ghc_core_t *core, struct st_shard *sh)
{
    int rc = 0;
    struct stat stb;
    char q[4096];
    ghc_path_quote(sh->path, q, sizeof(q));
    /* O_NONBLOCK: a FIFO opens at once (and is refused below) instead of waiting for a writer */
    int fd = open(sh->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        rc = ghc_error_set(core, GHC_EIO, "%s: cannot open: %s", q, strerror(errno));
        goto out;
    }
    if (fstat(fd, &stb) < 0) {
        rc = ghc_error_set(core, GHC_EIO, "%s: cannot stat: %s", q, strerror(errno));
        goto out_close;
    }
    if (!S_ISREG(stb.st_mode)) {
        rc = ghc_error_set(core, GHC_EIO, "%s: not a regular file", q);
        goto out_close;
    }
    if (stb.st_size < 8) {
        rc = fmt_err(core, sh->path, NULL,
                     "file is %lld bytes, shorter than the 8-byte header length",
                     (long long)stb.st_size);
        goto out_close;
    }
    if ((uint64_t)stb.st_size > SIZE_MAX) {
        rc = ghc_error_set(core, GHC_EIO, "%s: file too large to map", q);
        goto out_close;
    }
    void *m = mmap(NULL, (size_t)stb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
        rc = ghc_error_set(core, GHC_EIO, "%s: cannot map: %s", q, strerror(errno));
        goto out_close;
    }
    sh->map = m;
    sh->size = sh->avail = (size_t)stb.st_size;
out_close:
    close(fd);
out:
    return rc;
}

static int cmp_entry_name(const void *a, const void *b)
{
    return strcmp(((const struct st_entry *)a)->name, ((const struct st_entry *)b)->name);
}

static int cmp_entry_offset(const void *a, const void *b)
{
    const struct st_entry *x = *(const struct st_entry *const *)a;
    const struct st_entry *y = *(const struct st_entry *const *)b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* A non-negative JSON integer, or false. */
static bool json_uint(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return false;
    *out = (uint64_t)json_integer_value(v);
    return true;
}

/* Validate one tensor entry `val` named `name` into *e. */
static int parse_entry(ghc_core_t *core, struct st_shard *sh, const char *name, json_t *val,
                       struct st_entry *e)
{
    const char *p = sh->path;
    if (!json_is_object(val))
        return fmt_err(core, p, name, "entry is not an object");
    const char *key;
    json_t *m;
    json_object_foreach(val, key, m) {
        if (strcmp(key, "dtype") && strcmp(key, "shape") && strcmp(key, "data_offsets")) {
            char kbuf[64];
            return fmt_err(core, p, name, "unknown member \"%s\" (expected dtype, shape, "
                           "data_offsets)", ghc_st_esc(key, kbuf, sizeof(kbuf)));
        }
    }

    json_t *dt = json_object_get(val, "dtype");
    if (!dt)
        return fmt_err(core, p, name, "missing \"dtype\"");
    if (!json_is_string(dt))
        return fmt_err(core, p, name, "\"dtype\" is not a string");
    if (!ghc_dtype_from_name(json_string_value(dt), &e->dtype)) {
        char dbuf[32];
        return fmt_err(core, p, name, "unknown dtype \"%s\"",
                       ghc_st_esc(json_string_value(dt), dbuf, sizeof(dbuf)));
    }

    json_t *sp = json_object_get(val, "shape");
    if (!sp)
        return fmt_err(core, p, name, "missing \"shape\"");
    if (!json_is_array(sp))
        return fmt_err(core, p, name, "\"shape\" is not an array");
    size_t nd = json_array_size(sp);
    if (nd > GHC_TENSOR_MAX_DIMS)
        return fmt_err(core, p, name, "shape has %zu dimensions, more than %d", nd,
                       GHC_TENSOR_MAX_DIMS);
    e->ndim = (int)nd;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(sp, i);
        if (!json_is_integer(d))
            return fmt_err(core, p, name, "shape[%zu] is not an integer", i);
        if (json_integer_value(d) < 0)
            return fmt_err(core, p, name, "shape[%zu] = %lld is negative", i,
                           (long long)json_integer_value(d));
        e->shape[i] = (int64_t)json_integer_value(d);
    }
    int64_t numel;
    size_t esz = ghc_dtype_size(e->dtype);
    if (!ghc_shape_numel(e->ndim, e->shape, &numel) || numel > INT64_MAX / (int64_t)esz)
        return fmt_err(core, p, name, "shape product overflows int64");

    json_t *off = json_object_get(val, "data_offsets");
    if (!off)
        return fmt_err(core, p, name, "missing \"data_offsets\"");
    if (!json_is_array(off) || json_array_size(off) != 2 ||
        !json_uint(json_array_get(off, 0), &e->begin) ||
        !json_uint(json_array_get(off, 1), &e->end))
        return fmt_err(core, p, name, "\"data_offsets\" is not [begin, end] of non-negative "
                       "integers");
    if (e->begin > e->end)
        return fmt_err(core, p, name, "data_offsets [%" PRIu64 ", %" PRIu64 "] end before begin",
                       e->begin, e->end);
    if (e->end > sh->data_size)
        return fmt_err(core, p, name, "data_offsets [%" PRIu64 ", %" PRIu64 "] outside the data "
                       "section (%" PRIu64 " bytes)", e->begin, e->end, sh->data_size);
    uint64_t want = (uint64_t)numel * esz;
    if (e->end - e->begin != want)
        return fmt_err(core, p, name, "data_offsets span %" PRIu64 " bytes, but %s x %" PRId64
                       " elements is %" PRIu64 " bytes", e->end - e->begin,
                       ghc_dtype_name(e->dtype), numel, want);
    if (!(e->name = ghc_strdup(name)))
        return ghc_error_set(core, GHC_ENOMEM, "%s: out of memory", p);
    e->shard = sh;
    return 0;
}

static int parse_metadata(ghc_core_t *core, struct st_shard *sh, json_t *md)
{
    const char *p = sh->path;
    if (!json_is_object(md))
        return fmt_err(core, p, NULL, "__metadata__ is not an object");
    size_t n = json_object_size(md);
    if (n == 0)
        return 0;
    sh->meta_key = calloc(n, sizeof(char *));
    sh->meta_val = calloc(n, sizeof(char *));
    if (!sh->meta_key || !sh->meta_val)
        return ghc_error_set(core, GHC_ENOMEM, "%s: out of memory", p);
    const char *key;
    json_t *v;
    json_object_foreach(md, key, v) {
        char kbuf[64];
        if (!json_is_string(v))
            return fmt_err(core, p, NULL, "__metadata__ value of \"%s\" is not a string",
                           ghc_st_esc(key, kbuf, sizeof(kbuf)));
        sh->meta_key[sh->n_meta] = ghc_strdup(key);
        sh->meta_val[sh->n_meta] = ghc_strdup(json_string_value(v));
        sh->n_meta++;
        if (!sh->meta_key[sh->n_meta - 1] || !sh->meta_val[sh->n_meta - 1])
            return ghc_error_set(core, GHC_ENOMEM, "%s: out of memory", p);
    }
    return 0;
}

/* Every tensor sorted by offset must start where the previous one ended, from 0 to the end
 * of the data section (upstream's rule: no overlap, no hole, no trailing bytes). */
static int check_layout(ghc_core_t *core, struct st_shard *sh)
{
    int rc = 0;
    struct st_entry **by_off = malloc((size_t)(sh->n ? sh->n : 1) * sizeof(*by_off));
    if (!by_off)
        return ghc_error_set(core, GHC_ENOMEM, "%s: out of memory", sh->path);
    for (int i = 0; i < sh->n; i++)
        by_off[i] = &sh->entries[i];
    qsort(by_off, (size_t)sh->n, sizeof(*by_off), cmp_entry_offset);
    uint64_t pos = 0;
    const struct st_entry *prev = NULL;
    for (int i = 0; i < sh->n; i++) {
        const struct st_entry *e = by_off[i];
        if (e->begin < pos) {
            char pbuf[128];
            rc = fmt_err(core, sh->path, e->name, "data_offsets [%" PRIu64 ", %" PRIu64 "] "
                         "overlap tensor \"%s\" [%" PRIu64 ", %" PRIu64 "]", e->begin, e->end,
                         ghc_st_esc(prev->name, pbuf, sizeof(pbuf)), prev->begin, prev->end);
            goto out;
        }
        if (e->begin > pos) {
            rc = fmt_err(core, sh->path, e->name, "hole in the data section: bytes [%" PRIu64
                         ", %" PRIu64 ") belong to no tensor", pos, e->begin);
            goto out;
        }
        pos = e->end;
        prev = e;
    }
    if (pos != sh->data_size)
        rc = fmt_err(core, sh->path, NULL, "data section has %" PRIu64 " bytes after the last "
                     "tensor (tensors cover %" PRIu64 " of %" PRIu64 ")", sh->data_size - pos, pos,
                     sh->data_size);
out:
    free(by_off);
    return rc;
}

/* Map sh->path and validate its header into sh. On failure the caller releases sh. */
static int shard_open(ghc_core_t *core, struct st_shard *sh)
{
    int rc;
    json_t *root = NULL;
    const char *p = sh->path;
    if (!sh->borrowed && (rc = map_file(core, sh)) < 0)
        goto out;
    if (sh->avail < 8) {
        rc = fmt_err(core, p, NULL, "file is %zu bytes, shorter than the 8-byte header length",
                     sh->avail);
        goto out;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | sh->map[i];
    if (hlen < 2) {
        rc = fmt_err(core, p, NULL, "header length %" PRIu64 " is too small (at least 2 for "
                     "\"{}\")", hlen);
        goto out;
    }
    if (hlen > GHC_ST_MAX_HEADER) {
        rc = fmt_err(core, p, NULL, "header length %" PRIu64 " exceeds the limit of %u bytes",
                     hlen, GHC_ST_MAX_HEADER);
        goto out;
    }
    if (hlen > sh->size - 8) {
        rc = fmt_err(core, p, NULL, "header length %" PRIu64 " runs past the end of the file "
                     "(%zu bytes; truncated?)", hlen, sh->size);
        goto out;
    }
    if (hlen > sh->avail - 8) {
        rc = fmt_err(core, p, NULL, "header length %" PRIu64 " runs past the %zu bytes read",
                     hlen, sh->avail);
        goto out;
    }
    sh->data = sh->map + 8 + hlen;
    sh->data_size = sh->size - 8 - hlen;

    json_error_t jerr;
    root = json_loadb((const char *)sh->map + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        char tbuf[JSON_ERROR_TEXT_LENGTH];
        esc_ascii(jerr.text, tbuf, sizeof(tbuf));
        switch (json_error_code(&jerr)) {
        case json_error_invalid_utf8:
            rc = fmt_err(core, p, NULL, "header is not valid UTF-8 (byte %d of the header)",
                         jerr.position);
            break;
        case json_error_duplicate_key:
            rc = fmt_err(core, p, NULL, "duplicate name in the header: %s", tbuf);
            break;
        default:
            rc = fmt_err(core, p, NULL, "header is not valid JSON: %s (byte %d of the header)",
                         tbuf, jerr.position);
            break;
        }
        goto out;
    }
    if (!json_is_object(root)) {
        rc = fmt_err(core, p, NULL, "header is not a JSON object");
        goto out;
    }

    size_t cap = json_object_size(root);
    sh->entries = calloc(cap ? cap : 1, sizeof(*sh->entries));
    if (!sh->entries) {
        rc = ghc_error_set(core, GHC_ENOMEM, "%s: out of memory", p);
        goto out;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0)
            rc = parse_metadata(core, sh, val);
        else if ((rc = parse_entry(core, sh, key, val, &sh->entries[sh->n])) == 0)
            sh->n++;
        if (rc < 0)
            goto out;
    }
    if ((rc = check_layout(core, sh)) < 0)
        goto out;
    qsort(sh->entries, (size_t)sh->n, sizeof(*sh->entries), cmp_entry_name);
out:
    json_decref(root);
    return rc;
}

static struct st_entry *shard_find(const struct st_shard *sh, const char *name)
{
    struct st_entry key = { .name = (char *)name };
    return bsearch(&key, sh->entries, (size_t)sh->n, sizeof(*sh->entries), cmp_entry_name);
}

/* ---- opening --------------------------------------------------------------------------------- */

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static int cmp_index_name(const void *a, const void *b)
{
    return strcmp((*(const struct st_entry *const *)a)->name,
                  (*(const struct st_entry *const *)b)->name);
}

static char *own(ghc_st_t *st, char *s)
{
    if (s)
        st->own_meta[st->n_own_meta++] = s;
    return s;
}

/* Index metadata: strings as they are; numbers and booleans (HF writes "total_size": N)
 * as their JSON text. */
static int index_metadata(ghc_st_t *st, json_t *md, size_t extra)
{
    size_t n = md ? json_object_size(md) : 0;
    st->own_meta_arrays = true;
    st->meta_key = calloc(n + extra + 1, sizeof(char *));
    st->meta_val = calloc(n + extra + 1, sizeof(char *));
    st->own_meta = calloc(2 * n + 1, sizeof(char *));
    if (!st->meta_key || !st->meta_val || !st->own_meta)
        return ghc_error_set(st->core, GHC_ENOMEM, "%s: out of memory", st->path);
    const char *key;
    json_t *v;
    if (!md)
        return 0;
    json_object_foreach(md, key, v) {
        char kbuf[64], num[64];
        const char *text = num;
        if (json_is_string(v))
            text = json_string_value(v);
        else if (json_is_integer(v))
            snprintf(num, sizeof(num), "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        else if (json_is_real(v))
            snprintf(num, sizeof(num), "%.17g", json_real_value(v));
        else if (json_is_boolean(v))
            text = json_is_true(v) ? "true" : "false";
        else
            return fmt_err(st->core, st->path, NULL, "metadata value of \"%s\" is not a string "
                           "or number", ghc_st_esc(key, kbuf, sizeof(kbuf)));
        char *k = own(st, ghc_strdup(key)), *t = own(st, ghc_strdup(text));
        if (!k || !t)
            return ghc_error_set(st->core, GHC_ENOMEM, "%s: out of memory", st->path);
        st->meta_key[st->n_meta] = k;
        st->meta_val[st->n_meta++] = t;
    }
    return 0;
}

static bool has_meta(const ghc_st_t *st, const char *key)
{
    for (int i = 0; i < st->n_meta; i++)
        if (strcmp(st->meta_key[i], key) == 0)
            return true;
    return false;
}

/* {"metadata": {...}, "weight_map": {"tensor": "shard file", ...}}; other members are ignored.
 * Shard names are plain file names in the index's folder. Metadata: the index's, then each shard's
 * __metadata__ keys not seen before. */
static int open_index(ghc_st_t *st)
{
    int rc = 0;
    ghc_core_t *core = st->core;
    const char *p = st->path;
    char *dir = NULL;
    json_error_t jerr;
    json_t *root = json_load_file(p, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        char tbuf[JSON_ERROR_TEXT_LENGTH];
        char q[4096];
        if (json_error_code(&jerr) == json_error_cannot_open_file)
            rc = ghc_error_set(core, GHC_EIO, "%s: cannot open: %s", ghc_path_quote(p, q, sizeof(q)),
                               strerror(errno));
        else
            rc = fmt_err(core, p, NULL, "index is not valid JSON: %s (line %d)",
                         esc_ascii(jerr.text, tbuf, sizeof(tbuf)), jerr.line);
        goto out;
    }
    json_t *wm = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    if (!json_is_object(wm)) {
        rc = fmt_err(core, p, NULL, "index has no \"weight_map\" object");
        goto out;
    }
    json_t *md = json_object_get(root, "metadata");
    if (md && !json_is_object(md)) {
        rc = fmt_err(core, p, NULL, "index \"metadata\" is not an object");
        goto out;
    }

    const char *slash = strrchr(p, '/');
    size_t dlen = slash ? (size_t)(slash - p + 1) : 0;
    size_t n = json_object_size(wm);
    st->shards = calloc(n ? n : 1, sizeof(*st->shards));
    st->index = calloc(n ? n : 1, sizeof(*st->index));
    if (!st->shards || !st->index) {
        rc = ghc_error_set(core, GHC_ENOMEM, "%s: out of memory", p);
        goto out;
    }
    const char *name;
    json_t *v;
    json_object_foreach(wm, name, v) {
        const char *file = json_string_value(v);
        /* a plain file name in the index's folder: "../x" or "sub/x" could name any file */
        if (!file || !*file || strchr(file, '/') || strcmp(file, ".") == 0 ||
            strcmp(file, "..") == 0) {
            rc = fmt_err(core, p, name, "weight_map value is not a file name in the index's "
                         "folder (no '/', not \".\" or \"..\")");
            goto out;
        }
        free(dir);
        if (!(dir = malloc(dlen + strlen(file) + 1))) {
            rc = ghc_error_set(core, GHC_ENOMEM, "%s: out of memory", p);
            goto out;
        }
        memcpy(dir, p, dlen);
        strcpy(dir + dlen, file);
        struct st_shard *sh = NULL;
        for (int i = 0; i < st->n_shards && !sh; i++)
            if (strcmp(st->shards[i].path, dir) == 0)
                sh = &st->shards[i];
        if (!sh) {
            sh = &st->shards[st->n_shards++];
            sh->path = dir;
            dir = NULL;
            if ((rc = shard_open(core, sh)) < 0)
                goto out;
        }
        struct st_entry *e = shard_find(sh, name);
        if (!e) {
            char fbuf[128];
            rc = fmt_err(core, p, name, "weight_map names shard \"%s\", which has no such tensor",
                         ghc_st_esc(file, fbuf, sizeof(fbuf)));
            goto out;
        }
        st->index[st->n++] = e;
    }
    qsort(st->index, (size_t)st->n, sizeof(*st->index), cmp_index_name);

    size_t extra = 0;
    for (int i = 0; i < st->n_shards; i++)
        extra += (size_t)st->shards[i].n_meta;
    if ((rc = index_metadata(st, md, extra)) < 0)
        goto out;
    for (int i = 0; i < st->n_shards; i++)
        for (int j = 0; j < st->shards[i].n_meta; j++)
            if (!has_meta(st, st->shards[i].meta_key[j])) {
                st->meta_key[st->n_meta] = st->shards[i].meta_key[j];
                st->meta_val[st->n_meta++] = st->shards[i].meta_val[j];
            }
out:
    free(dir);
    json_decref(root);
    return rc;
}

/* Parse the one shard's header and index its tensors and metadata. */
static int index_single(ghc_st_t *st, const char *name)
{
    struct st_shard *sh = &st->shards[0];
    int rc = shard_open(st->core, sh);
    if (rc < 0)
        return rc;
    if (!(st->index = calloc(sh->n ? (size_t)sh->n : 1, sizeof(*st->index))))
        return ghc_error_set(st->core, GHC_ENOMEM, "%s: out of memory", name);
    for (int i = 0; i < sh->n; i++)
        st->index[i] = &sh->entries[i];
    st->n = sh->n;
    st->meta_key = sh->meta_key;
    st->meta_val = sh->meta_val;
    st->n_meta = sh->n_meta;
    return 0;
}

static int open_single(ghc_st_t *st)
{
    int rc = 0;
    if (!(st->shards = calloc(1, sizeof(*st->shards))) ||
        !(st->shards[0].path = ghc_strdup(st->path))) {
        rc = ghc_error_set(st->core, GHC_ENOMEM, "%s: out of memory", st->path);
        goto out;
    }
    st->n_shards = 1;
    rc = index_single(st, st->path);
out:
    return rc;
}

ghc_st_t *ghc_st_open(ghc_core_t *core, const char *path)
{
    ghc_st_t *st = calloc(1, sizeof(*st));
    if (!st || !(st->path = ghc_strdup(path))) {
        free(st);
        ghc_error_set(core, GHC_ENOMEM, "%s: out of memory", path);
        return NULL;
    }
    st->core = core;
    /* a FIFO (or a device) would block the reads below: only regular files (the shards are
     * checked again where they are opened) */
    struct stat sb;
    int rc = 0;
    char q[4096];
    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode))
        rc = ghc_error_set(core, GHC_EIO, "%s: not a regular file", ghc_path_quote(path, q, sizeof(q)));
    else
        rc = ends_with(path, ".index.json") ? open_index(st) : open_single(st);
    if (rc < 0) {
        ghc_st_free(st);
        return NULL;
    }
    return st;
}

ghc_st_t *ghc_st_open_memory(ghc_core_t *core, const char *name, const void *data, size_t len,
                             uint64_t file_size)
{
    ghc_st_t *st = calloc(1, sizeof(*st));
    if (!st || !(st->path = ghc_strdup(name))) {
        free(st);
        ghc_error_set(core, GHC_ENOMEM, "%s: out of memory", name);
        return NULL;
    }
    st->core = core;
    int rc = 0;
    if (len > file_size || file_size > SIZE_MAX) {
        rc = ghc_error_set(core, GHC_EINVAL, "%s: %zu bytes given of a %" PRIu64 "-byte file",
                           name, len, file_size);
        goto out;
    }
    if (!(st->shards = calloc(1, sizeof(*st->shards))) ||
        !(st->shards[0].path = ghc_strdup(name))) {
        rc = ghc_error_set(core, GHC_ENOMEM, "%s: out of memory", name);
        goto out;
    }
    st->n_shards = 1;
    struct st_shard *sh = &st->shards[0];
    sh->map = data;
    sh->size = (size_t)file_size;
    sh->avail = len;
    sh->borrowed = true;
    rc = index_single(st, name);
out:
    if (rc < 0) {
        ghc_st_free(st);
        st = NULL;
    }
    return st;
}

void ghc_st_free(ghc_st_t *st)
{
    if (!st)
        return;
    if (st->own_meta_arrays) {
        free(st->meta_key);
        free(st->meta_val);
    }
    for (int i = 0; i < st->n_own_meta; i++)
        free(st->own_meta[i]);
    free(st->own_meta);
    for (int i = 0; i < st->n_shards; i++)
        shard_release(&st->shards[i]);
    free(st->shards);
    free(st->index);
    free(st->path);
    free(st);
}

/* ---- queries ------------------------------------------------------------------------------ */

int ghc_st_count(const ghc_st_t *st) { return st->n; }

static void fill_info(const struct st_entry *e, struct ghc_st_info *out)
{
    out->name = e->name;
    out->dtype = e->dtype;
    out->ndim = e->ndim;
    out->shape = e->shape;
    out->offset = e->begin;
    out->nbytes = e->end - e->begin;
    out->file = e->shard->path;
}

bool ghc_st_info_at(const ghc_st_t *st, int i, struct ghc_st_info *out)
{
    if (i < 0 || i >= st->n)
        return false;
    fill_info(st->index[i], out);
    return true;
}

static const struct st_entry *find(const ghc_st_t *st, const char *name)
{
    struct st_entry key = { .name = (char *)name };
    const struct st_entry *kp = &key;
    struct st_entry **hit = bsearch(&kp, st->index, (size_t)st->n, sizeof(*st->index),
                                    cmp_index_name);
    return hit ? *hit : NULL;
}

bool ghc_st_find(const ghc_st_t *st, const char *name, struct ghc_st_info *out)
{
    const struct st_entry *e = find(st, name);
    if (e && out)
        fill_info(e, out);
    return e != NULL;
}

/* True when the tensor's bytes are present (always, except in a header-only prefix). */
static bool present(const struct st_entry *e)
{
    const struct st_shard *sh = e->shard;
    return (uint64_t)(sh->data - sh->map) + e->end <= sh->avail;
}

const void *ghc_st_raw(const ghc_st_t *st, const char *name)
{
    const struct st_entry *e = find(st, name);
    return e && present(e) ? e->shard->data + e->begin : NULL;
}

const char *ghc_st_metadata(const ghc_st_t *st, const char *key)
{
    for (int i = 0; i < st->n_meta; i++)
        if (strcmp(st->meta_key[i], key) == 0)
            return st->meta_val[i];
    return NULL;
}

bool ghc_st_metadata_at(const ghc_st_t *st, int i, const char **key, const char **value)
{
    if (i < 0 || i >= st->n_meta)
        return false;
    *key = st->meta_key[i];
    *value = st->meta_val[i];
    return true;
}

/* ---- loading ------------------------------------------------------------------------------ */

static int check_convert(ghc_st_t *st, const struct st_entry *e, enum ghc_dtype to)
{
    char nbuf[128];
    if (e->dtype == to || (ghc_dtype_is_float(e->dtype) && ghc_dtype_is_float(to)))
        return 0;
    return ghc_error_set(st->core, GHC_EINVAL, "%s: cannot load tensor \"%s\" (%s) as %s",
                         st->path, ghc_st_esc(e->name, nbuf, sizeof(nbuf)), ghc_dtype_name(e->dtype),
                         ghc_dtype_name(to));
}

static int not_found(ghc_st_t *st, const char *name)
{
    char nbuf[128];
    return ghc_error_set(st->core, GHC_ENOTFOUND, "%s: no tensor \"%s\"", st->path,
                         ghc_st_esc(name, nbuf, sizeof(nbuf)));
}

int ghc_st_load_into(ghc_st_t *st, const char *name, ghc_tensor_t *dst)
{
    int rc = 0;
    void *aligned = NULL;
    ghc_tensor_t *src = NULL;
    char nbuf[128];
    const struct st_entry *e = find(st, name);
    if (!e) {
        rc = not_found(st, name);
        goto out;
    }
    enum ghc_dtype to = ghc_tensor_dtype(dst);
    if ((rc = check_convert(st, e, to)) < 0)
        goto out;
    if (!present(e)) {
        rc = ghc_error_set(st->core, GHC_EINVAL, "%s: tensor \"%s\" lies past the %zu bytes read "
                           "(a header-only view)", st->path, ghc_st_esc(e->name, nbuf, sizeof(nbuf)),
                           e->shard->avail);
        goto out;
    }
    int64_t numel;
    ghc_shape_numel(e->ndim, e->shape, &numel);
    if (ghc_tensor_device(dst) != GHC_DEVICE_CPU || ghc_tensor_numel(dst) != numel) {
        rc = ghc_error_set(st->core, GHC_EINVAL, "%s: tensor \"%s\" (%" PRId64 " elements) "
                           "cannot load into a %s tensor of %" PRId64 " elements", st->path,
                           ghc_st_esc(e->name, nbuf, sizeof(nbuf)),
                           numel, ghc_tensor_device(dst) == GHC_DEVICE_CPU ? "CPU" : "device",
                           ghc_tensor_numel(dst));
        goto out;
    }
    const uint8_t *raw = e->shard->data + e->begin;
    size_t nbytes = (size_t)(e->end - e->begin);
    if (nbytes == 0)
        goto out;
    if (to == e->dtype) {
        memcpy(ghc_tensor_data(dst), raw, nbytes);
        goto out;
    }
    /* Offsets need not be aligned for the dtype: the converter reads typed elements. */
    size_t esz = ghc_dtype_size(e->dtype);
    if ((uintptr_t)raw % esz) {
        if (!(aligned = malloc(nbytes))) {
            rc = ghc_error_set(st->core, GHC_ENOMEM, "%s: out of memory for tensor \"%s\"",
                               st->path, ghc_st_esc(e->name, nbuf, sizeof(nbuf)));
            goto out;
        }
        memcpy(aligned, raw, nbytes);
        raw = aligned;
    }
    int64_t flat[1] = { numel };
    if (!(src = ghc_tensor_wrap(st->core, e->dtype, 1, flat, GHC_DEVICE_CPU, (void *)raw))) {
        rc = ghc_error_code(st->core) ? ghc_error_code(st->core) : GHC_ENOMEM;
        goto out;
    }
    rc = ghc_tensor_convert_cpu(dst, src, 1.0f);
out:
    ghc_tensor_free(src);
    free(aligned);
    return rc;
}

ghc_tensor_t *ghc_st_load(ghc_st_t *st, const char *name, enum ghc_dtype dtype,
                          enum ghc_mem_role role)
{
    ghc_tensor_t *t = NULL;
    const struct st_entry *e = find(st, name);
    if (!e) {
        not_found(st, name);
        goto out;
    }
    if (check_convert(st, e, dtype) < 0)
        goto out;
    if (!(t = ghc_tensor_init(st->core, dtype, e->ndim, e->shape, GHC_DEVICE_CPU, role)))
        goto out;
    if (ghc_st_load_into(st, name, t) < 0) {
        ghc_tensor_free(t);
        t = NULL;
    }
out:
    return t;
}
