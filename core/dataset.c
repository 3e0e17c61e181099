/* dataset.c: the training data (dataset.h): the `data` section, sample discovery and format
 * detection (with ai-toolkit's caption hashes, which pick its text files), header checks,
 * buckets, the epoch order, text dropout, batches (f16 served as f32) and the position.
 *
 * Determinism: every random choice is a counter-based hash of (seed, epoch, purpose, index)
 * (splitmix64), never a generator that carries state from batch to batch; so the order of an
 * epoch, the weighted picks and the dropout decision of the sample at position p are pure
 * functions of (seed, epoch, p), and seek() needs nothing but (epoch, cursor). */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <gh200core/dataset.h>
#include <gh200core/safetensors.h>

#include "core_impl.h"

#define HEADER_PROBE (64u * 1024)   /* first read of a header; longer headers read again */

/* ---- counter-based random numbers ------------------------------------------------------------ */

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Purposes, so that two decisions never share a stream. */
enum { R_PICK = 1, R_BUCKET, R_BATCHES, R_DROPOUT };

static uint64_t rnd(uint64_t seed, int64_t epoch, uint64_t purpose, uint64_t a, uint64_t b)
{
    return mix64(mix64(mix64(mix64(seed ^ 0x6768633230306461ull) ^ (uint64_t)epoch) ^ purpose) ^ a) ^ mix64(b);
}

/* Uniform in [0, n) (multiply-shift; n < 2^63). */
static uint64_t below(uint64_t r, uint64_t n) { return (uint64_t)(((unsigned __int128)r * n) >> 64); }

/* Fisher-Yates over v[0..n) with the stream (seed, epoch, purpose, a). */
static void shuffle(int64_t *v, int64_t n, uint64_t seed, int64_t epoch, uint64_t purpose, uint64_t a)
{
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)below(rnd(seed, epoch, purpose, a, (uint64_t)i), (uint64_t)i + 1);
        int64_t t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
}

/* ---- the data structures ---------------------------------------------------------------------- */

struct dset {                    /* one entry of data.datasets */
    char                 *path;  /* absolute */
    int64_t               repeats;
    double                weight;
    enum ghc_compression  compression;
    int64_t               first, n;   /* its samples: [first, first + n) */
    int64_t               slots;      /* per epoch: round(n * repeats * weight) */
    char                 *trigger_word;    /* ai-toolkit's, for its caption hash; NULL: none */
    char                 *default_caption; /* ai-toolkit's, likewise; NULL: none */
    char                 *blank_file;      /* an ai-toolkit dropout-caption embedding, or NULL */
    char                 *blank_caption;   /* the caption it was made from */
    ghc_tensor_t         *empty;           /* blank_file's embedding [L, D] f32, or NULL */
};

struct sample {
    int32_t              ds;
    enum ghc_data_format format;
    char                *file[GHC_SAMPLE_KIND_COUNT];
    char                *key[GHC_SAMPLE_KIND_COUNT];
    char                *caption;
    enum ghc_dtype       lat_dtype, txt_dtype;
    int64_t              lat_shape[4];
    int64_t              txt_len, txt_dim;
    int32_t              bucket;
};

struct bucket {
    enum ghc_dtype dtype;            /* as served (served_dtype) */
    int64_t        shape[4];
    int64_t        count;            /* samples */
};

struct order_batch {
    int64_t start;                   /* offset into order[] == cursor of the first sample */
    int32_t n;
};

struct ghc_dataset {
    ghc_core_t        *core;
    ghc_backend_t     *backend;      /* the run's, or own_backend */
    ghc_backend_t     *own_backend;
    ghc_cache_t       *cache;        /* the run's, or NULL: decode on each use */
    ghc_tensor_copy_fn copy;

    int64_t            batch_size;
    uint64_t           seed;
    double             text_dropout;
    bool               skip_bad, shuffle;
    ghc_tensor_t      *empty;        /* the empty prompt's embedding [L, D], or NULL: zeros */
    int64_t            text_dim;

    struct dset       *sets;
    int32_t            n_sets;
    struct sample     *samples;
    int64_t            n_samples, cap_samples;
    struct bucket     *buckets;
    int32_t            n_buckets;
    int64_t            epoch_size;

    /* the order of epoch `order_epoch` */
    int64_t            order_epoch;  /* -1: none yet */
    int64_t           *order;        /* [epoch_size] sample indices */
    struct order_batch*batches;
    int64_t            n_batches;

    /* the position: the next batch is batches[pos_batch] of epoch pos_epoch */
    int64_t            pos_epoch, pos_batch;

    struct ghc_data_stats st;
};

/* ---- small helpers ------------------------------------------------------------------------------ */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static bool ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && memcmp(s + a - b, suf, b) == 0;
}

static char *strndup_or_null(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

/* The dtype a stored tensor has in a batch: f16 is widened to f32 (exactly), because the
 * trainer's ops take f32 and bf16 only; bf16 and f32 stay as they are. */
static enum ghc_dtype served_dtype(enum ghc_dtype dt) { return dt == GHC_DTYPE_F16 ? GHC_DTYPE_F32 : dt; }

const char *ghc_data_format_name(enum ghc_data_format f)
{
    switch (f) {
    case GHC_DATA_FORMAT_NATIVE: return "gh200core";
    case GHC_DATA_FORMAT_MUSUBI: return "musubi-tuner";
    case GHC_DATA_FORMAT_AITK:   return "ai-toolkit";
    }
    return "?";
}

/* The file on disk behind an entry, for messages: "/data/set/a.latent.safetensors". */
static const char *disk_name(const ghc_dataset_t *ds, const char *entry, char *buf, size_t n)
{
    char *end;
    long r = strtol(entry, &end, 10);
    if (end != entry && *end == '/' && r >= 0 && r < ds->n_sets)
        snprintf(buf, n, "%s/%s", ds->sets[r].path, end + 1);
    else
        snprintf(buf, n, "%s", entry);
    return buf;
}

/* A bad sample: an error, or with skip_bad_samples a warning and a count (returns 1). The
 * message so far (if any) is kept as the reason. */
static int bad_sample(ghc_dataset_t *ds, int rc, const char *fmt, ...) GHC_PRINTF(3, 4);
static int bad_sample(ghc_dataset_t *ds, int rc, const char *fmt, ...)
{
    char msg[GHC_ERRMSG_MAX];
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

/* ---- ai-toolkit's text-embedding names ----------------------------------------------------------
 *
 * ai-toolkit names a cached text embedding `<stem>_<hash>.safetensors`, hash = base64url, '='
 * removed, of the MD5 of Python's json.dumps({"caption": ..., "text_embedding_space_version":
 * <model arch>, "text_embedding_version": 1}, sort_keys=True); with caption dropout it writes a
 * second file per item, made from the dropout caption. The stem cannot tell these apart, nor a
 * file left over from an edited caption; the hash of the caption can, so the caption is
 * rebuilt here exactly as ai-toolkit builds it (toolkit/dataloader_mixins.py: load_caption,
 * get_caption, get_dropout_caption, _build_text_embedding_path; toolkit/prompt_utils.py:
 * inject_trigger_into_prompt). */

/* A growing NUL-terminated string; `oom` sticks once an allocation failed. */
struct sbuf {
    char  *p;
    size_t n, cap;
    bool   oom;
};

static void sb_add(struct sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void sb_str(struct sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

/* The code point at s[0..n) as Python's strict UTF-8 decoder reads it (no overlong forms, no
 * surrogates, at most U+10FFFF), its length in *len; -1 (and *len 1) where none starts. */
static int32_t utf8_next(const uint8_t *s, size_t n, size_t *len)
{
    uint8_t c = s[0];
    uint8_t lo = 0x80, hi = 0xbf;
    uint32_t cp;
    size_t k;
    *len = 1;
    if (c < 0x80)
        return c;
    if (c >= 0xc2 && c <= 0xdf) {
        k = 1;
        cp = c & 0x1fu;
    } else if (c >= 0xe0 && c <= 0xef) {
        k = 2;
        cp = c & 0x0fu;
        lo = c == 0xe0 ? 0xa0 : 0x80;
        hi = c == 0xed ? 0x9f : 0xbf;
    } else if (c >= 0xf0 && c <= 0xf4) {
        k = 3;
        cp = c & 0x07u;
        lo = c == 0xf0 ? 0x90 : 0x80;
        hi = c == 0xf4 ? 0x8f : 0xbf;
    } else {
        return -1;
    }
    if (n < k + 1)
        return -1;
    for (size_t i = 1; i <= k; i++) {
        if (s[i] < (i == 1 ? lo : 0x80) || s[i] > (i == 1 ? hi : 0xbf))
            return -1;
        cp = (cp << 6) | (s[i] & 0x3fu);
    }
    *len = k + 1;
    return (int32_t)cp;
}

static bool utf8_valid(const char *s)
{
    size_t n = strlen(s), len;
    for (size_t i = 0; i < n; i += len)
        if (utf8_next((const uint8_t *)s + i, n - i, &len) < 0)
            return false;
    return true;
}

/* Python's str.isspace() for one code point. */
static bool py_isspace(int32_t c)
{
    return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

/* s.strip() == '' in Python (s valid UTF-8). */
static bool py_blank(const char *s)
{
    size_t n = strlen(s), len;
    for (size_t i = 0; i < n; i += len)
        if (!py_isspace(utf8_next((const uint8_t *)s + i, n - i, &len)))
            return false;
    return true;
}

/* A caption file's bytes as Python's open(path, 'r', encoding='utf-8').read() gives them:
 * strict UTF-8 with universal newlines ("\r\n" and a lone "\r" become "\n"). False for bytes
 * that are not UTF-8 (Python raises, so ai-toolkit cached nothing for them) and for a NUL
 * byte, which a C string cannot carry. */
static bool py_text(const uint8_t *s, size_t n, struct sbuf *out)
{
    sb_add(out, "", 0);
    for (size_t i = 0, len; i < n; i += len) {
        if (s[i] == '\r') {
            sb_add(out, "\n", 1);
            len = i + 1 < n && s[i + 1] == '\n' ? 2 : 1;
            continue;
        }
        if (s[i] == '\0' || utf8_next(s + i, n - i, &len) < 0)
            return false;
        sb_add(out, (const char *)s + i, len);
    }
    return !out->oom;
}

/* Python's s.replace(pat, rep) (both valid UTF-8, so bytes match where code points do). */
static void py_replace(struct sbuf *out, const char *s, const char *pat, const char *rep)
{
    size_t pl = strlen(pat);
    out->n = 0;
    sb_add(out, "", 0);
    for (const char *hit; (hit = strstr(s, pat)); s = hit + pl) {
        sb_add(out, s, (size_t)(hit - s));
        sb_str(out, rep);
    }
    sb_str(out, s);
}

/* The caption ai-toolkit encodes for the raw text of a caption file (get_caption with its
 * default settings: ', '.join(raw.split(',')), then inject_trigger_into_prompt): "[name]"
 * and "[trigger]" become the trigger word (nothing without one), and a trigger word the
 * caption lacks goes in front, "<trigger> <caption>". ai-toolkit replaces the two tokens in
 * a set's order, which changes from run to run; it only matters for a caption that nests
 * one token in the other. The dropout caption is the caption of "". */
static void aitk_caption(struct sbuf *out, const char *raw, const char *trigger)
{
    struct sbuf a = { 0 }, b = { 0 };
    const char *tw = trigger ? trigger : "";
    sb_add(&a, "", 0);
    for (const char *p = raw; *p; p++)
        sb_add(&a, *p == ',' ? ", " : p, *p == ',' ? 2 : 1);
    py_replace(&b, a.oom ? "" : a.p, "[name]", tw);
    py_replace(&a, b.oom ? "" : b.p, "[trigger]", tw);
    out->n = 0;
    sb_add(out, "", 0);
    if (!py_blank(tw) && !strstr(a.p ? a.p : "", tw)) {
        sb_str(out, tw);
        sb_str(out, " ");
    }
    sb_str(out, a.p ? a.p : "");
    out->oom |= a.oom || b.oom;
    free(a.p);
    free(b.p);
}

/* Python's json.dumps(s) for a valid UTF-8 string, ensure_ascii as by default: printable
 * ASCII as it is, the short escapes \" \\ \n \r \t \b \f, everything else \uXXXX (lower-case
 * hex; beyond the BMP a surrogate pair). */
static void py_json_str(struct sbuf *b, const char *s)
{
    size_t n = strlen(s), len;
    sb_add(b, "\"", 1);
    for (size_t i = 0; i < n; i += len) {
        int32_t c = utf8_next((const uint8_t *)s + i, n - i, &len);
        char e[16];
        switch (c) {
        case '"':  sb_str(b, "\\\""); continue;
        case '\\': sb_str(b, "\\\\"); continue;
        case '\n': sb_str(b, "\\n"); continue;
        case '\r': sb_str(b, "\\r"); continue;
        case '\t': sb_str(b, "\\t"); continue;
        case '\b': sb_str(b, "\\b"); continue;
        case '\f': sb_str(b, "\\f"); continue;
        default: break;
        }
        if (c >= 0x20 && c <= 0x7e) {
            e[0] = (char)c;
            sb_add(b, e, 1);
        } else if (c >= 0x10000) {
            c -= 0x10000;
            snprintf(e, sizeof(e), "\\u%04x\\u%04x", (unsigned)(0xd800 + (c >> 10)), (unsigned)(0xdc00 + (c & 0x3ff)));
            sb_str(b, e);
        } else if (c >= 0) {
            snprintf(e, sizeof(e), "\\u%04x", (unsigned)c);
            sb_str(b, e);
        }
    }
    sb_add(b, "\"", 1);
}

/* MD5 (RFC 1321): one 64-byte block into the state h. */
static void md5_block(uint32_t h[4], const uint8_t *p)
{
    static const uint32_t K[64] = {
        0xd76aa478, 0xe8c7b756, 0x242070db, 0xc1bdceee, 0xf57c0faf, 0x4787c62a, 0xa8304613, 0xfd469501,
        0x698098d8, 0x8b44f7af, 0xffff5bb1, 0x895cd7be, 0x6b901122, 0xfd987193, 0xa679438e, 0x49b40821,
        0xf61e2562, 0xc040b340, 0x265e5a51, 0xe9b6c7aa, 0xd62f105d, 0x02441453, 0xd8a1e681, 0xe7d3fbc8,
        0x21e1cde6, 0xc33707d6, 0xf4d50d87, 0x455a14ed, 0xa9e3e905, 0xfcefa3f8, 0x676f02d9, 0x8d2a4c8a,
        0xfffa3942, 0x8771f681, 0x6d9d6122, 0xfde5380c, 0xa4beea44, 0x4bdecfa9, 0xf6bb4b60, 0xbebfbc70,
        0x289b7ec6, 0xeaa127fa, 0xd4ef3085, 0x04881d05, 0xd9d4d039, 0xe6db99e5, 0x1fa27cf8, 0xc4ac5665,
        0xf4292244, 0x432aff97, 0xab9423a7, 0xfc93a039, 0x655b59c3, 0x8f0ccc92, 0xffeff47d, 0x85845dd1,
        0x6fa87e4f, 0xfe2ce6e0, 0xa3014314, 0x4e0811a1, 0xf7537e82, 0xbd3af235, 0x2ad7d2bb, 0xeb86d391,
    };
    static const uint8_t R[4][4] = { { 7, 12, 17, 22 }, { 5, 9, 14, 20 }, { 4, 11, 16, 23 }, { 6, 10, 15, 21 } };
    uint32_t w[16], a = h[0], b = h[1], c = h[2], d = h[3];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 | (uint32_t)p[4 * i + 2] << 16 | (uint32_t)p[4 * i + 3] << 24;
    for (int i = 0; i < 64; i++) {
        uint32_t f;
        int g;
        switch (i / 16) {
        case 0:  f = (b & c) | (~b & d); g = i; break;
        case 1:  f = (d & b) | (~d & c); g = (5 * i + 1) % 16; break;
        case 2:  f = b ^ c ^ d;          g = (3 * i + 5) % 16; break;
        default: f = c ^ (b | ~d);       g = (7 * i) % 16; break;
        }
        uint32_t x = a + f + K[i] + w[g];
        int r = R[i / 16][i % 4];
        a = d;
        d = c;
        c = b;
        b += (x << r) | (x >> (32 - r));
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
}

static void md5(const void *data, size_t n, uint8_t out[16])
{
    uint32_t h[4] = { 0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476 };
    const uint8_t *p = data;
    size_t i = 0;
    for (; n - i >= 64; i += 64)
        md5_block(h, p + i);
    uint8_t tail[128] = { 0 };
    size_t r = n - i, tl = r + 9 <= 64 ? 64 : 128;
    memcpy(tail, p + i, r);
    tail[r] = 0x80;
    for (int k = 0; k < 8; k++)
        tail[tl - 8 + (size_t)k] = (uint8_t)(((uint64_t)n * 8) >> (8 * k));
    md5_block(h, tail);
    if (tl == 128)
        md5_block(h, tail + 64);
    for (int k = 0; k < 16; k++)
        out[k] = (uint8_t)(h[k / 4] >> (8 * (k % 4)));
}

#define AITK_HASH_LEN 22           /* base64 of 16 bytes without its "==" */

/* The hash in the name of ai-toolkit's text embedding of `caption` for model `arch`. Returns
 * false out of memory. */
static bool aitk_hash(const char *caption, const char *arch, char out[AITK_HASH_LEN + 1])
{
    static const char b64url[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    struct sbuf j = { 0 };
    sb_str(&j, "{\"caption\": ");
    py_json_str(&j, caption);
    sb_str(&j, ", \"text_embedding_space_version\": ");
    py_json_str(&j, arch);
    sb_str(&j, ", \"text_embedding_version\": 1}");
    if (j.oom) {
        free(j.p);
        return false;
    }
    uint8_t d[18] = { 0 };
    md5(j.p, j.n, d);
    free(j.p);
    for (int i = 0; i < 6; i++) {   /* 6 groups of 3 bytes; the last holds one byte and padding */
        uint32_t v = (uint32_t)d[3 * i] << 16 | (uint32_t)d[3 * i + 1] << 8 | d[3 * i + 2];
        for (int k = 0; k < 4 && 4 * i + k < AITK_HASH_LEN; k++)
            out[4 * i + k] = b64url[(v >> (18 - 6 * k)) & 63];
    }
    out[AITK_HASH_LEN] = '\0';
    return true;
}

/* ---- configuration ------------------------------------------------------------------------------- */

static const struct ghc_cfg_key data_keys[] = {
    { "batch_size",       GHC_CFG_INT,    "1",     "1 to 2^20", NULL },
    { "seed",             GHC_CFG_INT,    "(the top-level seed, else 42)", "0 to 2^63-1", NULL },
    { "shuffle",          GHC_CFG_BOOL,   "true",  NULL, NULL },
    { "text_dropout",     GHC_CFG_FLOAT,  "0.0",   "0 to 1", NULL },
    { "empty_prompt",     GHC_CFG_STRING, NULL,    "(a safetensors file: text_embed or varlen_t5_<dtype>)", NULL },
    { "skip_bad_samples", GHC_CFG_BOOL,   "false", NULL, NULL },
    { "datasets",         GHC_CFG_LIST,   NULL,    "(groups with the keys of `data datasets`)", NULL },
    { NULL, 0, NULL, NULL, NULL }
};

static const struct ghc_cfg_key set_keys[] = {
    { "path",            GHC_CFG_STRING, NULL,   "(a directory; required)", NULL },
    { "repeats",         GHC_CFG_INT,    "1",    "1 to 1000000", NULL },
    { "weight",          GHC_CFG_FLOAT,  "1.0",  "0 to 1e6", NULL },
    { "compression",     GHC_CFG_STRING, "none", "none, lz4, zlib, snappy", NULL },
    { "trigger_word",    GHC_CFG_STRING, NULL,   "(ai-toolkit's, for the names of its text caches)", NULL },
    { "default_caption", GHC_CFG_STRING, NULL,   "(ai-toolkit's, for the names of its text caches)", NULL },
    { NULL, 0, NULL, NULL, NULL }
};

const struct ghc_cfg_key *ghc_dataset_keys(bool entry) { return entry ? set_keys : data_keys; }

/* `p` made absolute against the configuration file's folder. */
static char *resolve_path(ghc_core_t *core, const char *p)
{
    char buf[8200];
    if (p[0] == '/')
        snprintf(buf, sizeof(buf), "%s", p);
    else
        snprintf(buf, sizeof(buf), "%s/%s", core->config->dir, p);
    char real[PATH_MAX];
    return ghc_strdup(realpath(buf, real) ? real : buf);
}

static int read_config(ghc_dataset_t *ds, ghc_cfg_t *cfg)
{
    ghc_core_t *core = ds->core;
    int rc;
    if ((rc = ghc_cfg_check_keys(cfg, data_keys, NULL, "data")) < 0)
        return rc;
    int64_t top_seed = 42, seed, bs;
    bool has_top = ghc_cfg_has(core->config->root, "seed");
    if (has_top && (rc = ghc_cfg_get_int(core->config->root, "seed", 42, 0, INT64_MAX, &top_seed)) < 0)
        return rc;
    const char *empty = NULL;
    if ((rc = ghc_cfg_get_int(cfg, "batch_size", 1, 1, 1 << 20, &bs)) < 0 ||
        (rc = ghc_cfg_get_int(cfg, "seed", top_seed, 0, INT64_MAX, &seed)) < 0 ||
        (rc = ghc_cfg_get_bool(cfg, "shuffle", true, &ds->shuffle)) < 0 ||
        (rc = ghc_cfg_get_float(cfg, "text_dropout", 0.0, 0.0, 1.0, &ds->text_dropout)) < 0 ||
        (rc = ghc_cfg_get_string(cfg, "empty_prompt", NULL, &empty)) < 0 ||
        (rc = ghc_cfg_get_bool(cfg, "skip_bad_samples", false, &ds->skip_bad)) < 0)
        return rc;
    ds->batch_size = bs;
    ds->seed = (uint64_t)seed;

    config_setting_t *list = config_setting_get_member(cfg->s, "datasets");
    int n = list ? config_setting_length(list) : 0;
    if (n == 0)
        return ghc_error_set(core, GHC_ECONFIG, "%s: data: no datasets (datasets = ( { path = \"...\"; } );)",
                             ghc_cfg_where(cfg, list ? "datasets" : NULL));
    if (!(ds->sets = calloc((size_t)n, sizeof(*ds->sets))))
        return ghc_error_set(core, GHC_ENOMEM, "data: out of memory");
    ds->n_sets = n;
    for (int i = 0; i < n; i++) {
        config_setting_t *e = config_setting_get_elem(list, (unsigned)i);
        char what[64];
        snprintf(what, sizeof(what), "data.datasets[%d]", i);
        ghc_cfg_t tmp = { .core = core, .s = e, .path = what };
        if (config_setting_type(e) != CONFIG_TYPE_GROUP)
            return ghc_error_set(core, GHC_ECONFIG, "%s: %s: expected a group { path = \"...\"; }",
                                 ghc_cfg_where(&tmp, NULL), what);
        ghc_cfg_t *g = ghc_cfg_wrap(core, e);
        if (!g)
            return GHC_ENOMEM;
        if ((rc = ghc_cfg_check_keys(g, set_keys, NULL, what)) < 0)
            return rc;
        const char *path, *comp, *trigger, *defcap;
        struct dset *d = &ds->sets[i];
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
        if (trigger && !utf8_valid(trigger))
            return ghc_error_set(core, GHC_ECONFIG, "%s: %s.trigger_word is not UTF-8", ghc_cfg_where(g, "trigger_word"), what);
        if (defcap && !utf8_valid(defcap))
            return ghc_error_set(core, GHC_ECONFIG, "%s: %s.default_caption is not UTF-8",
                                 ghc_cfg_where(g, "default_caption"), what);
        /* "" is no trigger word to ai-toolkit either */
        if ((trigger && *trigger && !(d->trigger_word = ghc_strdup(trigger))) ||
            (defcap && !(d->default_caption = ghc_strdup(defcap))))
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

/* ---- discovery ---------------------------------------------------------------------------------- */

enum cls { C_NONE, C_NATIVE_LAT, C_NATIVE_TXT, C_MUSUBI_LAT, C_MUSUBI_TXT, C_AITK_LAT, C_AITK_TXT, C_CAPTION };

struct found {                   /* one listed entry with its class and pairing stem */
    char    *name;               /* the backend entry */
    enum cls cls;
    char    *stem;               /* "<dataset>/<stem>" */
    bool     used, stale;        /* ai-toolkit texts: matched a caption hash / matched none */
};

struct listing {
    struct found *f;
    size_t        n, cap;
    int32_t       ds;
};

/* "_1280x0720_wan.safetensors" at the end of s: where it starts, or NULL. */
static const char *musubi_size_suffix(const char *s)
{
    if (!ends_with(s, "_wan.safetensors"))
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

/* ai-toolkit: "<dir>/_latent_cache/<stem>_<hash>.safetensors": the stem "<dir>/<stem>". */
static char *aitk_stem(const char *name, const char *cache_dir)
{
    const char *c = strstr(name, cache_dir);
    if (!c || (c != name && c[-1] != '/') || !ends_with(name, ".safetensors"))
        return NULL;
    const char *base = c + strlen(cache_dir);
    if (strchr(base, '/'))
        return NULL;
    /* the hash is 22 characters of base64url (which may hold '_'): cut exactly that when it
     * fits, else at the last '_' */
    size_t blen = strlen(base) - strlen(".safetensors");
    const char *us = blen > 23 && base[blen - 23] == '_' ? base + blen - 23 : strrchr(base, '_');
    if (!us || us == base)
        return NULL;
    size_t dl = (size_t)(c - name), bl = (size_t)(us - base);
    char *s = malloc(dl + bl + 1);
    if (s) {
        memcpy(s, name, dl);
        memcpy(s + dl, base, bl);
        s[dl + bl] = '\0';
    }
    return s;
}

static int visit_entry(void *user, const char *name, uint64_t size)
{
    (void)size;
    struct listing *ls = user;
    enum cls cls = C_NONE;
    char *stem = NULL;
    if (ends_with(name, ".latent.safetensors")) {
        cls = C_NATIVE_LAT;
        stem = strndup_or_null(name, strlen(name) - strlen(".latent.safetensors"));
    } else if (ends_with(name, ".text.safetensors")) {
        cls = C_NATIVE_TXT;
        stem = strndup_or_null(name, strlen(name) - strlen(".text.safetensors"));
    } else if ((stem = aitk_stem(name, "_latent_cache/"))) {
        cls = C_AITK_LAT;
    } else if ((stem = aitk_stem(name, "_t_e_cache/"))) {
        cls = C_AITK_TXT;
    } else if (ends_with(name, "_wan_te.safetensors")) {
        cls = C_MUSUBI_TXT;
        stem = strndup_or_null(name, strlen(name) - strlen("_wan_te.safetensors"));
    } else if (musubi_size_suffix(name)) {
        cls = C_MUSUBI_LAT;
        stem = strndup_or_null(name, (size_t)(musubi_size_suffix(name) - name));
    } else if (ends_with(name, ".txt")) {
        cls = C_CAPTION;
        stem = strndup_or_null(name, strlen(name) - 4);
    } else {
        return 0;
    }
    if (!stem)
        return GHC_ENOMEM;
    if (ls->n == ls->cap) {
        size_t cap = ls->cap ? ls->cap * 2 : 256;
        struct found *f = realloc(ls->f, cap * sizeof(*f));
        if (!f) {
            free(stem);
            return GHC_ENOMEM;
        }
        ls->f = f;
        ls->cap = cap;
    }
    char *nm = ghc_strdup(name);
    if (!nm) {
        free(stem);
        return GHC_ENOMEM;
    }
    ls->f[ls->n++] = (struct found){ .name = nm, .cls = cls, .stem = stem };
    return 0;
}

static int cmp_found(const void *a, const void *b)
{
    const struct found *x = a, *y = b;
    int c = strcmp(x->stem, y->stem);
    return c ? c : (int)x->cls - (int)y->cls;
}

static const struct found *find_stem(const struct listing *ls, enum cls cls, const char *stem)
{
    struct found key = { .stem = (char *)stem, .cls = cls };
    return bsearch(&key, ls->f, ls->n, sizeof(*ls->f), cmp_found);
}

/* The entries of class `cls` and stem `stem`: [*lo, *hi) of the sorted listing. */
static bool find_range(const struct listing *ls, enum cls cls, const char *stem, size_t *lo, size_t *hi)
{
    const struct found *f = find_stem(ls, cls, stem);
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

#define CAPTION_MAX (1u << 20)     /* a caption file longer than this is not a caption */

/* The caption and the dropout caption ai-toolkit encodes for an item with caption file `cap`
 * (NULL: none) in dataset `set`: load_caption reads the file (default_caption stands in for
 * a missing or blank one), get_caption and get_dropout_caption add the trigger word. Both
 * malloc'ed. Returns 0, 1 (a bad sample, skipped) or GHC_E*. */
static int aitk_captions(ghc_dataset_t *ds, const struct dset *set, const char *cap, char **caption, char **dropout)
{
    struct sbuf raw = { 0 }, c = { 0 }, d = { 0 };
    char disk[4400];
    int rc = 0;
    *caption = *dropout = NULL;
    sb_add(&raw, "", 0);
    if (cap) {
        const void *data;
        void *owned = NULL;
        size_t len;
        uint64_t size;
        disk_name(ds, cap, disk, sizeof(disk));
        if (ghc_backend_fetch(ds->backend, cap, CAPTION_MAX, &data, &owned, &len, &size) < 0) {
            rc = bad_sample(ds, ghc_error_code(ds->core), "%s", ghc_error_message(ds->core));
            goto out;
        }
        bool text = size == len && (raw.n = 0, py_text(data, len, &raw));
        free(owned);
        if (raw.oom) {
            rc = ghc_error_set(ds->core, GHC_ENOMEM, "data: out of memory");
            goto out;
        }
        if (!text) {
            rc = bad_sample(ds, GHC_EFORMAT, "%s: %s, so its ai-toolkit text embedding cannot be found by the "
                            "hash of the caption", disk, size > len ? "longer than 1 MiB" : "not UTF-8 text");
            goto out;
        }
    }
    aitk_caption(&c, set->default_caption && py_blank(raw.p) ? set->default_caption : raw.p, set->trigger_word);
    aitk_caption(&d, "", set->trigger_word);
    if (c.oom || d.oom) {
        rc = ghc_error_set(ds->core, GHC_ENOMEM, "data: out of memory");
        goto out;
    }
    *caption = c.p;
    *dropout = d.p;
    c.p = d.p = NULL;
out:
    free(raw.p);
    free(c.p);
    free(d.p);
    return rc;
}

/* ai-toolkit's model architectures that use Wan's text encoder (`arch` of each model class):
 * the text_embedding_space_version its hash covers. */
static const char *const aitk_archs[] = { "wan21", "wan21_i2v", "wan22_14b", "wan22_14b_i2v", "wan22_5b" };
enum { N_AITK_ARCHS = sizeof(aitk_archs) / sizeof(aitk_archs[0]) };

/* Whether ai-toolkit cache entry `name` ("..._<hash>.safetensors") carries hash h. */
static bool has_hash(const char *name, const char *h)
{
    size_t n = strlen(name), k = strlen(".safetensors");
    return n > k + AITK_HASH_LEN && name[n - k - AITK_HASH_LEN - 1] == '_' &&
           memcmp(name + n - k - AITK_HASH_LEN, h, AITK_HASH_LEN) == 0;
}

/* The cache entry ai-toolkit would name for stem "<dir>/<base>" and hash h. */
static void aitk_text_name(const char *stem, const char *h, char *buf, size_t n)
{
    const char *slash = strrchr(stem, '/');
    int dl = slash ? (int)(slash - stem + 1) : 0;
    snprintf(buf, n, "%.*s_t_e_cache/%s_%s.safetensors", dl, stem, stem + dl, h);
}

/* Which of the _t_e_cache files of ai-toolkit latent f is its text embedding, by
 * ai-toolkit's rule: the one named with the hash of its caption (for any Wan arch). A file
 * named with the hash of the dropout caption is the item's blank embedding; the dataset's
 * first one is kept for text dropout. A file of neither is marked stale. Without a caption
 * file to hash (ai-toolkit may have had the caption from elsewhere), a single file that
 * matches nothing is taken. Two that could both be it are an error: never a guess.
 * Returns 0 (*t NULL: no file at all), 1 (a bad sample, skipped) or GHC_E*. */
static int aitk_text(ghc_dataset_t *ds, struct listing *ls, const struct found *f, const struct found **t)
{
    struct dset *set = &ds->sets[ls->ds];
    size_t lo, hi;
    *t = NULL;
    if (!find_range(ls, C_AITK_TXT, f->stem, &lo, &hi))
        return 0;
    const struct found *cap = find_stem(ls, C_CAPTION, f->stem);
    char *caption, *dropout;
    int rc = aitk_captions(ds, set, cap ? cap->name : NULL, &caption, &dropout);
    if (rc != 0)
        return rc;
    char hc[N_AITK_ARCHS][AITK_HASH_LEN + 1], hd[N_AITK_ARCHS][AITK_HASH_LEN + 1];
    for (int a = 0; a < N_AITK_ARCHS; a++)
        if (!aitk_hash(caption, aitk_archs[a], hc[a]) || !aitk_hash(dropout, aitk_archs[a], hd[a])) {
            rc = ghc_error_set(ds->core, GHC_ENOMEM, "data: out of memory");
            goto out;
        }
    size_t match[2] = { 0 }, n_match = 0, blank = SIZE_MAX, other[2] = { 0 }, n_other = 0;
    for (size_t i = lo; i < hi; i++) {
        struct found *c = &ls->f[i];
        bool is_cap = false, is_drop = false;
        for (int a = 0; a < N_AITK_ARCHS; a++) {
            is_cap |= has_hash(c->name, hc[a]);
            is_drop |= has_hash(c->name, hd[a]);
        }
        if (is_cap && n_match < 2)
            match[n_match] = i;
        n_match += is_cap;
        if (is_drop && blank == SIZE_MAX)
            blank = i;
        if (!is_cap && !is_drop && n_other < 2)
            other[n_other] = i;
        n_other += !is_cap && !is_drop;
        c->used |= is_cap || is_drop;
        c->stale |= !is_cap && !is_drop;
    }
    char lat[4400], a[4400], b[4400], want[4400];
    disk_name(ds, f->name, lat, sizeof(lat));
    if (n_match == 0 && !cap && n_other == 1) {
        ghc_log(ds->core, GHC_LOG_WARN, "data: %s: no caption file to hash, and its only text embedding %s was "
                "not made from the caption \"%s\": taken all the same", lat,
                disk_name(ds, ls->f[other[0]].name, a, sizeof(a)), caption);
        match[0] = other[0];
        n_match = 1;
        ls->f[other[0]].used = true;
    }
    if (n_match == 1) {
        *t = &ls->f[match[0]];
    } else if (n_match > 1) {
        rc = bad_sample(ds, GHC_EFORMAT, "%s: %zu text embeddings were made from its caption, %s and %s (caches "
                        "of two models?); expected one: remove the others", lat, n_match,
                        disk_name(ds, ls->f[match[0]].name, a, sizeof(a)), disk_name(ds, ls->f[match[1]].name, b, sizeof(b)));
    } else {
        aitk_text_name(f->stem, hc[0], b, sizeof(b));
        disk_name(ds, b, want, sizeof(want));
        if (!cap && n_other > 1) {
            rc = bad_sample(ds, GHC_ENOTFOUND, "%s: without a caption file its text embedding is the one made "
                            "from the caption \"%s\" (%s for wan21), which is not there, and %zu others could "
                            "each be it, %s and %s: expected that one or a single other", lat, caption, want, n_other,
                            disk_name(ds, ls->f[other[0]].name, a, sizeof(a)),
                            disk_name(ds, ls->f[other[1]].name, b, sizeof(b)));
        } else {
            char from[4400];
            size_t named = n_other ? other[0] : blank;
            if (cap)
                disk_name(ds, cap->name, from, sizeof(from));
            else
                snprintf(from, sizeof(from), "\"%s\" (no caption file)", caption);
            rc = bad_sample(ds, GHC_ENOTFOUND, "%s: none of its text embeddings was made from its caption %s "
                            "(expected %s for wan21, or the same stem with the hash for another Wan model); %s%s "
                            "is from %s: re-cache the text embeddings with ai-toolkit", lat, from, want,
                            disk_name(ds, ls->f[named].name, a, sizeof(a)), hi - lo > 1 ? " (and others)" : "",
                            named == blank ? "the dropout caption" : "another caption or other settings (stale)");
        }
    }
    if (blank != SIZE_MAX && !set->blank_file &&
        (!(set->blank_file = ghc_strdup(ls->f[blank].name)) || !(set->blank_caption = ghc_strdup(dropout))))
        rc = ghc_error_set(ds->core, GHC_ENOMEM, "data: out of memory");
out:
    free(caption);
    free(dropout);
    return rc;
}

/* A safetensors header through the backend, header-only. *owned (the caller frees it after
 * ghc_st_free) may hold the bytes the handle borrows. */
static ghc_st_t *read_header(ghc_dataset_t *ds, const char *entry, char *disk, size_t dn, void **owned_out)
{
    const void *data;
    void *owned;
    size_t len;
    uint64_t size;
    disk_name(ds, entry, disk, dn);
    if (ghc_backend_fetch(ds->backend, entry, HEADER_PROBE, &data, &owned, &len, &size) < 0)
        return NULL;
    if (len >= 8) {
        uint64_t hlen = 0;
        for (int i = 7; i >= 0; i--)
            hlen = (hlen << 8) | ((const uint8_t *)data)[i];
        if (hlen <= GHC_ST_MAX_HEADER && 8 + hlen > len && 8 + hlen <= size) {
            free(owned);
            if (ghc_backend_fetch(ds->backend, entry, 8 + hlen, &data, &owned, &len, &size) < 0)
                return NULL;
        }
    }
    *owned_out = owned;
    return ghc_st_open_memory(ds->core, disk, data, len, size);
}

static enum ghc_dtype torch_dtype(const char *name, bool *ok)
{
    *ok = true;
    if (strcmp(name, "bfloat16") == 0) return GHC_DTYPE_BF16;
    if (strcmp(name, "float16") == 0)  return GHC_DTYPE_F16;
    if (strcmp(name, "float32") == 0)  return GHC_DTYPE_F32;
    *ok = false;
    return GHC_DTYPE_F32;
}

/* Check the latent file's header and fill the sample's latent fields (1: skipped). */
static int check_latent(ghc_dataset_t *ds, struct sample *s)
{
    char disk[4400];
    int rc = 0;
    void *owned = NULL;
    ghc_st_t *st = read_header(ds, s->file[GHC_SAMPLE_LATENT], disk, sizeof(disk), &owned);
    if (!st) {
        free(owned);
        return bad_sample(ds, ghc_error_code(ds->core), "%s", ghc_error_message(ds->core));
    }
    struct ghc_st_info info = { 0 };
    const char *key = NULL;
    if (s->format == GHC_DATA_FORMAT_MUSUBI) {
        for (int i = 0; i < ghc_st_count(st) && !key; i++) {
            ghc_st_info_at(st, i, &info);
            if (strncmp(info.name, "latents_", 8) == 0 && info.name[8] >= '0' && info.name[8] <= '9')
                key = info.name;
        }
    } else if (ghc_st_find(st, "latent", &info)) {
        key = info.name;
    }
    if (!key) {
        rc = bad_sample(ds, GHC_EFORMAT, "%s: no latent tensor (expected %s)", disk,
                        s->format == GHC_DATA_FORMAT_MUSUBI ? "\"latents_<F>x<H>x<W>_<dtype>\"" : "\"latent\"");
        goto out;
    }
    if (info.ndim != 4 || !ghc_dtype_is_float(info.dtype) || info.dtype == GHC_DTYPE_F8_E4M3 ||
        info.dtype == GHC_DTYPE_F8_E5M2) {
        char sh[80] = "";
        for (int i = 0; i < info.ndim; i++)
            snprintf(sh + strlen(sh), sizeof(sh) - strlen(sh), "%s%lld", i ? ", " : "", (long long)info.shape[i]);
        rc = bad_sample(ds, GHC_EFORMAT, "%s: \"%s\" is [%s] %s, expected [C, F, H, W] of bf16, f16 or f32",
                        disk, key, sh, ghc_dtype_name(info.dtype));
        goto out;
    }
    if (s->format == GHC_DATA_FORMAT_MUSUBI) {
        long long f, h, w;
        char dt[32];
        bool ok;
        if (sscanf(key, "latents_%lldx%lldx%lld_%31s", &f, &h, &w, dt) != 4 ||
            f != info.shape[1] || h != info.shape[2] || w != info.shape[3] ||
            torch_dtype(dt, &ok) != info.dtype || !ok) {
            rc = bad_sample(ds, GHC_EFORMAT, "%s: \"%s\" holds [%lld, %lld, %lld, %lld] %s, which its name contradicts",
                            disk, key, (long long)info.shape[0], (long long)info.shape[1],
                            (long long)info.shape[2], (long long)info.shape[3], ghc_dtype_name(info.dtype));
            goto out;
        }
    }
    s->lat_dtype = info.dtype;
    memcpy(s->lat_shape, info.shape, sizeof(s->lat_shape));
    if (!(s->key[GHC_SAMPLE_LATENT] = ghc_strdup(key))) {
        rc = ghc_error_set(ds->core, GHC_ENOMEM, "data: out of memory");
        goto out;
    }
    /* optional stored noise and timestep (any format; the project's writes them) */
    struct ghc_st_info ni;
    if (ghc_st_find(st, "noise", &ni)) {
        if (ni.dtype != info.dtype || ni.ndim != 4 || memcmp(ni.shape, info.shape, 4 * sizeof(int64_t)) != 0) {
            rc = bad_sample(ds, GHC_EFORMAT, "%s: \"noise\" must have the latent's shape and dtype (%s)",
                            disk, ghc_dtype_name(info.dtype));
            goto out;
        }
        if (!(s->file[GHC_SAMPLE_NOISE] = ghc_strdup(s->file[GHC_SAMPLE_LATENT])) ||
            !(s->key[GHC_SAMPLE_NOISE] = ghc_strdup("noise"))) {
            rc = ghc_error_set(ds->core, GHC_ENOMEM, "data: out of memory");
            goto out;
        }
    }
    if (ghc_st_find(st, "timestep", &ni)) {
        int64_t numel = 1;
        for (int i = 0; i < ni.ndim; i++)
            numel *= ni.shape[i];
        if (numel != 1 || !ghc_dtype_is_float(ni.dtype)) {
            rc = bad_sample(ds, GHC_EFORMAT, "%s: \"timestep\" must be one float, got %lld elements of %s",
                            disk, (long long)numel, ghc_dtype_name(ni.dtype));
            goto out;
        }
        if (!(s->file[GHC_SAMPLE_TIMESTEP] = ghc_strdup(s->file[GHC_SAMPLE_LATENT])) ||
            !(s->key[GHC_SAMPLE_TIMESTEP] = ghc_strdup("timestep"))) {
            rc = ghc_error_set(ds->core, GHC_ENOMEM, "data: out of memory");
            goto out;
        }
    }
out:
    ghc_st_free(st);
    free(owned);
    return rc;
}

static int check_text(ghc_dataset_t *ds, struct sample *s)
{
    char disk[4400];
    int rc = 0;
    void *owned = NULL;
    ghc_st_t *st = read_header(ds, s->file[GHC_SAMPLE_TEXT_EMBED], disk, sizeof(disk), &owned);
    if (!st) {
        free(owned);
        return bad_sample(ds, ghc_error_code(ds->core), "%s", ghc_error_message(ds->core));
    }
    struct ghc_st_info info = { 0 };
    const char *key = NULL;
    if (s->format == GHC_DATA_FORMAT_MUSUBI) {
        for (int i = 0; i < ghc_st_count(st) && !key; i++) {
            ghc_st_info_at(st, i, &info);
            if (strncmp(info.name, "varlen_t5_", 10) == 0)
                key = info.name;
        }
    } else if (ghc_st_find(st, "text_embed", &info)) {
        key = info.name;
    }
    if (!key) {
        rc = bad_sample(ds, GHC_EFORMAT, "%s: no text embedding (expected %s)", disk,
                        s->format == GHC_DATA_FORMAT_MUSUBI ? "\"varlen_t5_<dtype>\"" : "\"text_embed\"");
        goto out;
    }
    bool shape_ok = (info.ndim == 2 || (info.ndim == 3 && info.shape[0] == 1)) && info.shape[info.ndim - 2] >= 1;
    if (!shape_ok || !ghc_dtype_is_float(info.dtype) || info.dtype == GHC_DTYPE_F8_E4M3 ||
        info.dtype == GHC_DTYPE_F8_E5M2) {
        char sh[80] = "";
        for (int i = 0; i < info.ndim; i++)
            snprintf(sh + strlen(sh), sizeof(sh) - strlen(sh), "%s%lld", i ? ", " : "", (long long)info.shape[i]);
        rc = bad_sample(ds, GHC_EFORMAT, "%s: \"%s\" is [%s] %s, expected [L, D] or [1, L, D] (L >= 1) of bf16, f16 or f32",
                        disk, key, sh, ghc_dtype_name(info.dtype));
        goto out;
    }
    int64_t D = info.shape[info.ndim - 1];
    if (s->format == GHC_DATA_FORMAT_MUSUBI) {
        bool ok;
        if (torch_dtype(key + 10, &ok) != info.dtype || !ok) {
            rc = bad_sample(ds, GHC_EFORMAT, "%s: \"%s\" holds %s, which its name contradicts", disk, key,
                            ghc_dtype_name(info.dtype));
            goto out;
        }
    }
    s->txt_dim = D;
    s->txt_dtype = info.dtype;
    s->txt_len = info.shape[info.ndim - 2];
    if (!(s->key[GHC_SAMPLE_TEXT_EMBED] = ghc_strdup(key)))
        rc = ghc_error_set(ds->core, GHC_ENOMEM, "data: out of memory");
out:
    ghc_st_free(st);
    free(owned);
    return rc;
}

static void sample_clear(struct sample *s)
{
    for (int k = 0; k < GHC_SAMPLE_KIND_COUNT; k++) {
        free(s->file[k]);
        free(s->key[k]);
    }
    free(s->caption);
    memset(s, 0, sizeof(*s));
}

/* One warning line for the ai-toolkit text embeddings of dataset d that no caption of
 * theirs hashes to (left over from an edited caption, or made with other settings): never
 * used, so a dataset that still trains says why some of its files do not count. */
static void report_stale(ghc_dataset_t *ds, int32_t d, const struct listing *ls)
{
    struct sbuf names = { 0 };
    size_t n = 0;
    for (size_t i = 0; i < ls->n; i++) {
        const struct found *f = &ls->f[i];
        if (f->cls != C_AITK_TXT || !f->stale || f->used)
            continue;
        if (n++ < 8) {
            char disk[4400];
            sb_str(&names, n > 1 ? ", " : "");
            sb_str(&names, disk_name(ds, f->name, disk, sizeof(disk)));
        }
    }
    if (n)
        ghc_log(ds->core, GHC_LOG_WARN, "data: dataset %d (%s): %zu ai-toolkit text embedding%s made from no caption "
                "of %s, ignored (stale after a caption edit, or other settings): %s%s", (int)d, ds->sets[d].path, n,
                n == 1 ? "" : "s", n == 1 ? "its item" : "their items", names.oom ? "?" : names.p,
                n > 8 ? " and more" : "");
    free(names.p);
}

/* The samples of dataset d: pair latents with texts (and captions), check headers. */
static int discover(ghc_dataset_t *ds, int32_t d)
{
    struct listing ls = { .ds = d };
    char prefix[24], disk[4400];
    snprintf(prefix, sizeof(prefix), "%d/", (int)d);
    int rc = ghc_backend_list(ds->backend, prefix, visit_entry, &ls);
    if (rc == GHC_ENOMEM && !*ghc_error_message(ds->core))
        rc = ghc_error_set(ds->core, GHC_ENOMEM, "data: out of memory listing %s", ds->sets[d].path);
    if (rc < 0)
        goto out;
    qsort(ls.f, ls.n, sizeof(*ls.f), cmp_found);
    ds->sets[d].first = ds->n_samples;
    int formats = 0;
    for (size_t i = 0; i < ls.n; i++) {
        const struct found *f = &ls.f[i];
        enum cls want;
        enum ghc_data_format fmt;
        switch (f->cls) {
        case C_NATIVE_LAT: want = C_NATIVE_TXT; fmt = GHC_DATA_FORMAT_NATIVE; break;
        case C_MUSUBI_LAT: want = C_MUSUBI_TXT; fmt = GHC_DATA_FORMAT_MUSUBI; break;
        case C_AITK_LAT:   want = C_AITK_TXT;   fmt = GHC_DATA_FORMAT_AITK; break;
        case C_NATIVE_TXT:
            /* a project-format text without its latent is a sample missing a file */
            if (!find_stem(&ls, C_NATIVE_LAT, f->stem)) {
                char txt[4400];
                disk_name(ds, f->name, txt, sizeof(txt));
                if ((rc = bad_sample(ds, GHC_ENOTFOUND, "%s: its latent %s.latent.safetensors is missing",
                                     txt, disk_name(ds, f->stem, disk, sizeof(disk)))) < 0)
                    goto out;
                rc = 0;
            }
            continue;
        default:
            continue;
        }
        formats |= 1 << fmt;
        const struct found *t = NULL;
        if (fmt == GHC_DATA_FORMAT_AITK) {
            if ((rc = aitk_text(ds, &ls, f, &t)) < 0)
                goto out;
            if (rc > 0) {
                rc = 0;
                continue;
            }
        } else {
            t = find_stem(&ls, want, f->stem);
        }
        if (!t && fmt == GHC_DATA_FORMAT_MUSUBI) {
            /* video clips "<stem>_<start:05d>-<frames:03d>" share the video's text cache */
            size_t sl = strlen(f->stem);
            char base[4096];
            if (sl > 10 && sl < sizeof(base) && f->stem[sl - 10] == '_' && f->stem[sl - 4] == '-') {
                memcpy(base, f->stem, sl - 10);
                base[sl - 10] = '\0';
                t = find_stem(&ls, want, base);
            }
        }
        if (!t) {
            char lat[4400];
            disk_name(ds, f->name, lat, sizeof(lat));
            const char *expect = fmt == GHC_DATA_FORMAT_NATIVE ? ".text.safetensors" :
                                 fmt == GHC_DATA_FORMAT_MUSUBI ? "_wan_te.safetensors" : "_<hash>.safetensors in _t_e_cache/";
            if ((rc = bad_sample(ds, GHC_ENOTFOUND, "%s: its text embedding is missing (expected %s%s)", lat,
                                 disk_name(ds, f->stem, disk, sizeof(disk)), expect)) < 0)
                goto out;
            rc = 0;
            continue;
        }
        if (ds->n_samples == ds->cap_samples) {
            int64_t cap = ds->cap_samples ? ds->cap_samples * 2 : 256;
            struct sample *ns = realloc(ds->samples, (size_t)cap * sizeof(*ns));
            if (!ns) {
                rc = ghc_error_set(ds->core, GHC_ENOMEM, "data: out of memory");
                goto out;
            }
            ds->samples = ns;
            ds->cap_samples = cap;
        }
        struct sample *s = &ds->samples[ds->n_samples];
        memset(s, 0, sizeof(*s));
        s->ds = d;
        s->format = fmt;
        const struct found *cap = find_stem(&ls, C_CAPTION, f->stem);
        if (!(s->file[GHC_SAMPLE_LATENT] = ghc_strdup(f->name)) ||
            !(s->file[GHC_SAMPLE_TEXT_EMBED] = ghc_strdup(t->name)) ||
            (cap && !(s->caption = ghc_strdup(cap->name)))) {
            sample_clear(s);
            rc = ghc_error_set(ds->core, GHC_ENOMEM, "data: out of memory");
            goto out;
        }
        if ((rc = check_latent(ds, s)) == 0)
            rc = check_text(ds, s);
        if (rc != 0) {
            sample_clear(s);
            if (rc < 0)
                goto out;
            rc = 0;
            continue;
        }
        ds->n_samples++;
    }
    ds->sets[d].n = ds->n_samples - ds->sets[d].first;
    report_stale(ds, d, &ls);
    if ((formats & (1 << GHC_DATA_FORMAT_MUSUBI)) && (formats & (1 << GHC_DATA_FORMAT_AITK)))
        ghc_log(ds->core, GHC_LOG_WARN, "data: dataset %d (%s) mixes musubi-tuner latents (posterior means) "
                "with ai-toolkit latents (posterior samples)", (int)d, ds->sets[d].path);
    ghc_log(ds->core, GHC_LOG_INFO, "data: dataset %d (%s): %lld samples%s%s%s", (int)d, ds->sets[d].path,
            (long long)ds->sets[d].n,
            formats & (1 << GHC_DATA_FORMAT_NATIVE) ? ", gh200core format" : "",
            formats & (1 << GHC_DATA_FORMAT_MUSUBI) ? ", musubi-tuner cache" : "",
            formats & (1 << GHC_DATA_FORMAT_AITK) ? ", ai-toolkit cache" : "");
out:
    for (size_t i = 0; i < ls.n; i++) {
        free(ls.f[i].name);
        free(ls.f[i].stem);
    }
    free(ls.f);
    return rc;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
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
    int64_t kept = 0;
    for (int32_t d = 0; d < ds->n_sets; d++) {
        struct dset *set = &ds->sets[d];
        int64_t first = kept;
        for (int64_t i = set->first; i < set->first + set->n; i++) {
            struct sample *s = &ds->samples[i];
            if (s->txt_dim != ds->text_dim) {
                char a[4400], b[4400];
                int rc = bad_sample(ds, GHC_EFORMAT, "%s: \"%s\" has width %lld, but %s has %lld",
                                    disk_name(ds, s->file[GHC_SAMPLE_TEXT_EMBED], a, sizeof(a)),
                                    s->key[GHC_SAMPLE_TEXT_EMBED], (long long)s->txt_dim,
                                    ref ? disk_name(ds, ref, b, sizeof(b)) : "data.empty_prompt",
                                    (long long)ds->text_dim);
                if (rc < 0)
                    return rc;
                sample_clear(s);
                continue;
            }
            ds->samples[kept++] = *s;
        }
        set->first = first;
        set->n = kept - first;
    }
    ds->n_samples = kept;
    return 0;
}

static int copy_rows(ghc_dataset_t *ds, ghc_tensor_t *dst, int64_t at, const ghc_tensor_t *src, int64_t n);

/* Each dataset's ai-toolkit blank embedding (aitk_text), for its dropped texts where
 * data.empty_prompt is not given. One file serves every item: ai-toolkit writes one per item,
 * each the encoder output of the same dropout caption. A file that cannot serve is a
 * warning: its dataset's dropped texts stay zeros. */
static int load_blanks(ghc_dataset_t *ds)
{
    for (int32_t d = 0; d < ds->n_sets; d++) {
        struct dset *set = &ds->sets[d];
        if (!set->blank_file || ds->empty)
            continue;
        char disk[4400], buf[96];
        ghc_tensor_t *raw = NULL;
        int rc = ghc_cache_decode(ds->core, ds->backend, set->blank_file, "text_embed", GHC_ROLE_TEXT_EMBEDS, &raw);
        disk_name(ds, set->blank_file, disk, sizeof(disk));
        if (rc == 0) {
            int nd = ghc_tensor_ndim(raw);
            int64_t sh[2] = { ghc_tensor_dim(raw, -2), ghc_tensor_dim(raw, -1) };
            if (!(nd == 2 || (nd == 3 && ghc_tensor_dim(raw, 0) == 1)) || sh[0] < 1 || sh[1] != ds->text_dim ||
                !ghc_dtype_is_float(ghc_tensor_dtype(raw)))
                rc = ghc_error_set(ds->core, GHC_EFORMAT, "\"text_embed\" is %s, expected [1, L, %lld]",
                                   ghc_tensor_describe(raw, buf, sizeof(buf)), (long long)ds->text_dim);
            else if (!(set->empty = ghc_tensor_init(ds->core, GHC_DTYPE_F32, 2, sh, GHC_DEVICE_CPU, GHC_ROLE_TEXT_EMBEDS)))
                rc = ghc_error_code(ds->core) ? ghc_error_code(ds->core) : GHC_ENOMEM;
            else
                rc = copy_rows(ds, set->empty, 0, raw, sh[0] * sh[1]);
        }
        ghc_tensor_free(raw);
        if (rc == GHC_ENOMEM)
            return rc;
        if (rc < 0) {
            ghc_log(ds->core, GHC_LOG_WARN, "data: dataset %d (%s): the blank-caption embedding %s cannot serve text "
                    "dropout (%s): dropped texts are zeros", (int)d, set->path, disk, ghc_error_message(ds->core));
            ghc_error_clear(ds->core);
            ghc_tensor_free(set->empty);
            set->empty = NULL;
            continue;
        }
        ghc_log(ds->core, GHC_LOG_INFO, "data: dataset %d (%s): dropped texts get ai-toolkit's embedding of the "
                "dropout caption \"%s\", %s (ai-toolkit writes one per item, all the same encoder output: one "
                "serves every item)", (int)d, set->path, set->blank_caption, disk);
    }
    return 0;
}

static int make_buckets(ghc_dataset_t *ds)
{
    for (int64_t i = 0; i < ds->n_samples; i++) {
        struct sample *s = &ds->samples[i];
        int32_t b;
        for (b = 0; b < ds->n_buckets; b++)
            if (ds->buckets[b].dtype == served_dtype(s->lat_dtype) && memcmp(ds->buckets[b].shape, s->lat_shape, sizeof(s->lat_shape)) == 0)
                break;
        if (b == ds->n_buckets) {
            struct bucket *nb = realloc(ds->buckets, (size_t)(b + 1) * sizeof(*nb));
            if (!nb)
                return ghc_error_set(ds->core, GHC_ENOMEM, "data: out of memory");
            ds->buckets = nb;
            ds->buckets[b] = (struct bucket){ .dtype = served_dtype(s->lat_dtype) };
            memcpy(ds->buckets[b].shape, s->lat_shape, sizeof(s->lat_shape));
            ds->n_buckets++;
        }
        ds->buckets[b].count++;
        s->bucket = b;
    }
    ds->epoch_size = 0;
    for (int32_t d = 0; d < ds->n_sets; d++) {
        struct dset *set = &ds->sets[d];
        set->slots = (int64_t)llround((double)set->n * (double)set->repeats * set->weight);
        ds->epoch_size += set->slots;
    }
    return 0;
}

/* ---- the order of an epoch ----------------------------------------------------------------------- */

static int build_order(ghc_dataset_t *ds, int64_t epoch)
{
    if (ds->order_epoch == epoch)
        return 0;
    int rc = 0;
    int64_t *slots = malloc((size_t)(ds->epoch_size ? ds->epoch_size : 1) * sizeof(*slots));
    int64_t *pick = NULL;
    int64_t *fill = calloc((size_t)ds->n_buckets + 1, sizeof(*fill));
    int64_t *bstart = calloc((size_t)ds->n_buckets + 1, sizeof(*bstart));
    int64_t nb_max = ds->epoch_size;   /* batches <= slots */
    struct order_batch *batches = malloc((size_t)(nb_max ? nb_max : 1) * sizeof(*batches));
    int64_t *border = malloc((size_t)(nb_max ? nb_max : 1) * sizeof(*border));
    int64_t max_n = 1;
    for (int32_t d = 0; d < ds->n_sets; d++)
        if (ds->sets[d].n > max_n)
            max_n = ds->sets[d].n;
    pick = malloc((size_t)max_n * sizeof(*pick));
    if (!slots || !fill || !bstart || !batches || !border || !pick) {
        rc = ghc_error_set(ds->core, GHC_ENOMEM, "data: out of memory for the order of %lld samples",
                           (long long)ds->epoch_size);
        goto out;
    }
    /* 1. slots per bucket: repeats, and the weighted remainder as a seeded pick */
    int64_t *count = fill;  /* first pass: samples per bucket */
    for (int32_t d = 0; d < ds->n_sets; d++) {
        struct dset *set = &ds->sets[d];
        if (!set->n)
            continue;
        int64_t full = set->slots / set->n, rem = set->slots % set->n;
        for (int64_t i = 0; i < set->n; i++)
            count[ds->samples[set->first + i].bucket] += full;
        for (int64_t i = 0; i < set->n; i++)
            pick[i] = set->first + i;
        shuffle(pick, set->n, ds->seed, epoch, R_PICK, (uint64_t)d);
        for (int64_t i = 0; i < rem; i++)
            count[ds->samples[pick[i]].bucket]++;
    }
    for (int32_t b = 0; b < ds->n_buckets; b++) {
        bstart[b + 1] = bstart[b] + count[b];
        count[b] = 0;
    }
    int64_t *pos = fill;    /* second pass: fill positions */
    for (int32_t d = 0; d < ds->n_sets; d++) {
        struct dset *set = &ds->sets[d];
        if (!set->n)
            continue;
        int64_t full = set->slots / set->n, rem = set->slots % set->n;
        for (int64_t r = 0; r < full; r++)
            for (int64_t i = 0; i < set->n; i++) {
                int32_t b = ds->samples[set->first + i].bucket;
                slots[bstart[b] + pos[b]++] = set->first + i;
            }
        for (int64_t i = 0; i < set->n; i++)
            pick[i] = set->first + i;
        shuffle(pick, set->n, ds->seed, epoch, R_PICK, (uint64_t)d);
        for (int64_t i = 0; i < rem; i++) {
            int32_t b = ds->samples[pick[i]].bucket;
            slots[bstart[b] + pos[b]++] = pick[i];
        }
    }
    /* 2. shuffle inside each bucket, cut into batches */
    int64_t nb = 0;
    for (int32_t b = 0; b < ds->n_buckets; b++) {
        int64_t n = bstart[b + 1] - bstart[b];
        if (ds->shuffle)
            shuffle(slots + bstart[b], n, ds->seed, epoch, R_BUCKET, (uint64_t)b);
        for (int64_t o = 0; o < n; o += ds->batch_size) {
            batches[nb].start = bstart[b] + o;
            batches[nb].n = (int32_t)(n - o < ds->batch_size ? n - o : ds->batch_size);
            nb++;
        }
    }
    /* 3. shuffle the batches; lay the samples out in that order */
    for (int64_t i = 0; i < nb; i++)
        border[i] = i;
    if (ds->shuffle)
        shuffle(border, nb, ds->seed, epoch, R_BATCHES, 0);
    free(ds->order);
    free(ds->batches);
    ds->order = malloc((size_t)(ds->epoch_size ? ds->epoch_size : 1) * sizeof(*ds->order));
    ds->batches = malloc((size_t)(nb ? nb : 1) * sizeof(*ds->batches));
    if (!ds->order || !ds->batches) {
        ds->order_epoch = -1;
        rc = ghc_error_set(ds->core, GHC_ENOMEM, "data: out of memory for the order");
        goto out;
    }
    int64_t at = 0;
    for (int64_t i = 0; i < nb; i++) {
        const struct order_batch *src = &batches[border[i]];
        memcpy(ds->order + at, slots + src->start, (size_t)src->n * sizeof(*ds->order));
        ds->batches[i] = (struct order_batch){ .start = at, .n = src->n };
        at += src->n;
    }
    ds->n_batches = nb;
    ds->order_epoch = epoch;
out:
    free(slots);
    free(pick);
    free(fill);
    free(bstart);
    free(batches);
    free(border);
    return rc;
}

static bool dropped(const ghc_dataset_t *ds, int64_t epoch, int64_t cursor)
{
    if (ds->text_dropout <= 0.0)
        return false;
    double u = (double)(rnd(ds->seed, epoch, R_DROPOUT, (uint64_t)cursor, 0) >> 11) * 0x1.0p-53;
    return u < ds->text_dropout;
}

/* ---- opening ------------------------------------------------------------------------------------- */

int ghc_dataset_open(ghc_core_t *core, ghc_dataset_t **out)
{
    return ghc_dataset_open_section(core, "data", out);
}

int ghc_dataset_open_section(ghc_core_t *core, const char *section, ghc_dataset_t **out)
{
    *out = NULL;
    double t0 = now_s();
    /* the run's backend and cache serve the training data; another section (held-out
     * validation data) reads its folders through a local backend of its own, uncached */
    bool main_data = strcmp(section, "data") == 0;
    ghc_cfg_t *cfg = ghc_config_section(core, section);
    if (!cfg)
        return ghc_error_set(core, GHC_ECONFIG, "%s: no `%s` section (%s = { datasets = ( { path = \"...\"; } ); })",
                             core->config ? core->config->file : "configuration", section, section);
    ghc_dataset_t *ds = calloc(1, sizeof(*ds));
    if (!ds)
        return ghc_error_set(core, GHC_ENOMEM, "data: out of memory");
    ds->core = core;
    ds->order_epoch = -1;
    int rc;
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
    for (int32_t d = 0; d < ds->n_sets; d++)
        if ((rc = discover(ds, d)) < 0)
            goto fail;
    if (ds->n_samples && ((rc = unify_text_dim(ds)) < 0 || (rc = load_blanks(ds)) < 0))
        goto fail;
    if (ds->n_samples == 0) {
        rc = ghc_error_set(core, GHC_ENOTFOUND, "data: no samples found in %s%s (expected <stem>.latent.safetensors + "
                           "<stem>.text.safetensors, musubi-tuner or ai-toolkit caches; doc/dataset.md)%s",
                           ds->sets[0].path, ds->n_sets > 1 ? " and the other datasets" : "",
                           ds->st.skipped ? ", all skipped as bad" : "");
        goto fail;
    }
    if ((rc = make_buckets(ds)) < 0)
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
                refs[i].file[k] = ds->samples[i].file[k];
                refs[i].key[k] = ds->samples[i].key[k];
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
    ds->st.open_seconds = now_s() - t0;
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
    for (int64_t i = 0; i < ds->n_samples; i++)
        sample_clear(&ds->samples[i]);
    free(ds->samples);
    for (int32_t d = 0; d < ds->n_sets; d++) {
        struct dset *set = &ds->sets[d];
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

void ghc_dataset_set_copy(ghc_dataset_t *ds, ghc_tensor_copy_fn copy) { ds->copy = copy; }

bool ghc_dataset_sample_at(ghc_dataset_t *ds, int64_t i, struct ghc_data_sample_info *out)
{
    if (i < 0 || i >= ds->n_samples)
        return false;
    const struct sample *s = &ds->samples[i];
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

/* ---- the position ---------------------------------------------------------------------------------- */

int ghc_dataset_tell(ghc_dataset_t *ds, int64_t *epoch, int64_t *cursor)
{
    *epoch = ds->pos_epoch;
    *cursor = 0;
    if (ds->pos_batch > 0) {          /* then the order of pos_epoch is built */
        int rc = build_order(ds, ds->pos_epoch);
        if (rc < 0)
            return rc;
        *cursor = ds->batches[ds->pos_batch].start;
    }
    return 0;
}

int ghc_dataset_seek(ghc_dataset_t *ds, int64_t epoch, int64_t cursor)
{
    if (epoch < 0 || cursor < 0 || cursor > ds->epoch_size)
        return ghc_error_set(ds->core, GHC_EINVAL, "data: seek to epoch %lld cursor %lld: out of range "
                             "(epochs from 0, cursors 0..%lld)", (long long)epoch, (long long)cursor,
                             (long long)ds->epoch_size);
    if (cursor == ds->epoch_size) {
        epoch++;
        cursor = 0;
    }
    int rc = build_order(ds, epoch);
    if (rc < 0)
        return rc;
    /* batches are laid out in order: binary search for the one starting at cursor */
    int64_t lo = 0, hi = ds->n_batches;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (ds->batches[mid].start < cursor)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo >= ds->n_batches || ds->batches[lo].start != cursor) {
        int64_t before = lo > 0 ? ds->batches[lo - 1].start : 0;
        int64_t after = lo < ds->n_batches ? ds->batches[lo].start : ds->epoch_size;
        return ghc_error_set(ds->core, GHC_EINVAL, "data: seek: cursor %lld is not the start of a batch of epoch %lld "
                             "(nearest: %lld and %lld); use a position from ghc_dataset_tell",
                             (long long)cursor, (long long)epoch, (long long)before, (long long)after);
    }
    ds->pos_epoch = epoch;
    ds->pos_batch = lo;
    return 0;
}

/* ---- batches --------------------------------------------------------------------------------------- */

/* One sample's tensor of `kind`: from the cache (pinned), else decoded now. *cached says
 * which, for put_tensor(). */
static int get_tensor(ghc_dataset_t *ds, int64_t idx, enum ghc_sample_kind kind, ghc_tensor_t **out)
{
    const struct sample *s = &ds->samples[idx];
    if (ds->cache)
        return ghc_cache_sample(ds->cache, idx, kind, out);
    return ghc_cache_decode(ds->core, ds->backend, s->file[kind], s->key[kind], ghc_sample_kind_role(kind), out);
}

static void put_tensor(ghc_dataset_t *ds, int64_t idx, enum ghc_sample_kind kind, ghc_tensor_t *t)
{
    if (!t)
        return;
    if (ds->cache)
        ghc_cache_release(ds->cache, idx, kind, t);
    else
        ghc_tensor_free(t);
}

/* Copy (converting when the dtypes differ) `rows` x `dim` elements from src into dst at
 * element offset `at`. Both CPU. */
static int copy_rows(ghc_dataset_t *ds, ghc_tensor_t *dst, int64_t at, const ghc_tensor_t *src, int64_t n)
{
    enum ghc_dtype dt = ghc_tensor_dtype(dst), st = ghc_tensor_dtype(src);
    size_t esz = ghc_dtype_size(dt);
    char *d = (char *)ghc_tensor_data(dst) + (size_t)at * esz;
    if (dt == st) {
        memcpy(d, ghc_tensor_cdata(src), (size_t)n * esz);
        return 0;
    }
    int64_t flat[1] = { n };
    ghc_tensor_t *dv = ghc_tensor_wrap(ds->core, dt, 1, flat, GHC_DEVICE_CPU, d);
    ghc_tensor_t *sv = ghc_tensor_wrap(ds->core, st, 1, flat, GHC_DEVICE_CPU, (void *)ghc_tensor_cdata(src));
    int rc = dv && sv ? ghc_tensor_convert_cpu(dv, sv, 1.0f) : GHC_ENOMEM;
    ghc_tensor_free(dv);
    ghc_tensor_free(sv);
    return rc;
}

struct batch_priv {               /* what a batch holds besides its tensors */
    int64_t *index;
    bool    *dropped;
};

/* The embedding a dropped text of sample idx gets: data.empty_prompt, else its dataset's
 * ai-toolkit blank embedding, else NULL (zeros of its own length). */
static const ghc_tensor_t *empty_for(const ghc_dataset_t *ds, int64_t idx)
{
    return ds->empty ? ds->empty : ds->sets[ds->samples[idx].ds].empty;
}

/* Check a decoded tensor against what the header said (the file may change after open). */
static int check_decoded(ghc_dataset_t *ds, int64_t idx, enum ghc_sample_kind kind, const ghc_tensor_t *t)
{
    const struct sample *s = &ds->samples[idx];
    char disk[4400], buf[96];
    bool ok;
    if (kind == GHC_SAMPLE_LATENT || kind == GHC_SAMPLE_NOISE)
        ok = ghc_tensor_ndim(t) == 4 && ghc_tensor_dtype(t) == s->lat_dtype &&
             memcmp(ghc_tensor_shape(t), s->lat_shape, sizeof(s->lat_shape)) == 0;
    else if (kind == GHC_SAMPLE_TEXT_EMBED)
        ok = ghc_tensor_dim(t, -2) == s->txt_len && ghc_tensor_dim(t, -1) == ds->text_dim;
    else
        ok = ghc_tensor_numel(t) == 1;
    if (ok)
        return 0;
    return ghc_error_set(ds->core, GHC_EFORMAT, "%s: \"%s\" is now %s, not what it was when the dataset was opened",
                         disk_name(ds, s->file[kind], disk, sizeof(disk)), s->key[kind],
                         ghc_tensor_describe(t, buf, sizeof(buf)));
}

/* Assemble batch `bi` of the current order on the CPU. */
static int assemble(ghc_dataset_t *ds, int64_t epoch, int64_t bi, struct ghc_data_batch *out)
{
    const struct order_batch *ob = &ds->batches[bi];
    int32_t n = ob->n;
    int rc = 0;
    ghc_tensor_t **lat = calloc((size_t)n, sizeof(*lat));
    ghc_tensor_t **txt = calloc((size_t)n, sizeof(*txt));
    ghc_tensor_t **noi = calloc((size_t)n, sizeof(*noi));
    ghc_tensor_t **tim = calloc((size_t)n, sizeof(*tim));
    int64_t *index = calloc((size_t)n, sizeof(*index));
    bool *drop = calloc((size_t)n, sizeof(*drop));
    memset(out, 0, sizeof(*out));
    if (!lat || !txt || !noi || !tim || !index || !drop) {
        rc = ghc_error_set(ds->core, GHC_ENOMEM, "data: out of memory");
        goto out;
    }
    /* fetch; a bad sample fails the batch or, with skip_bad_samples, leaves it */
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        int64_t idx = ds->order[ob->start + i];
        const struct sample *s = &ds->samples[idx];
        int r = get_tensor(ds, idx, GHC_SAMPLE_LATENT, &lat[m]);
        if (r == 0)
            r = check_decoded(ds, idx, GHC_SAMPLE_LATENT, lat[m]);
        bool drop_it = dropped(ds, epoch, ob->start + i);
        if (r == 0 && !(drop_it)) {
            r = get_tensor(ds, idx, GHC_SAMPLE_TEXT_EMBED, &txt[m]);
            if (r == 0)
                r = check_decoded(ds, idx, GHC_SAMPLE_TEXT_EMBED, txt[m]);
        }
        if (r == 0 && s->file[GHC_SAMPLE_NOISE] && (r = get_tensor(ds, idx, GHC_SAMPLE_NOISE, &noi[m])) == 0)
            r = check_decoded(ds, idx, GHC_SAMPLE_NOISE, noi[m]);
        if (r == 0 && s->file[GHC_SAMPLE_TIMESTEP] && (r = get_tensor(ds, idx, GHC_SAMPLE_TIMESTEP, &tim[m])) == 0)
            r = check_decoded(ds, idx, GHC_SAMPLE_TIMESTEP, tim[m]);
        if (r < 0) {
            char msg[GHC_ERRMSG_MAX];
            snprintf(msg, sizeof(msg), "%s", ghc_error_message(ds->core));
            put_tensor(ds, idx, GHC_SAMPLE_LATENT, lat[m]);
            put_tensor(ds, idx, GHC_SAMPLE_TEXT_EMBED, txt[m]);
            put_tensor(ds, idx, GHC_SAMPLE_NOISE, noi[m]);
            put_tensor(ds, idx, GHC_SAMPLE_TIMESTEP, tim[m]);
            lat[m] = txt[m] = noi[m] = tim[m] = NULL;
            if ((rc = bad_sample(ds, r, "%s", msg)) < 0)
                goto out_put;
            out->skipped++;
            continue;
        }
        index[m] = idx;
        drop[m] = drop_it;
        m++;
    }
    rc = 0;
    out->n = m;
    out->epoch = epoch;
    out->cursor = ob->start;
    out->index = index;
    out->text_dropped = drop;
    if (m == 0)
        goto out_put;
    /* the bucket's dtype as served: the samples' own (f16 and f32 ones widened) convert */
    const struct sample *s0 = &ds->samples[index[0]];
    enum ghc_dtype ldt = ds->buckets[s0->bucket].dtype;
    int64_t C = s0->lat_shape[0], F = s0->lat_shape[1], H = s0->lat_shape[2], W = s0->lat_shape[3];
    int64_t per = C * F * H * W;
    int64_t lshape[5] = { m, C, F, H, W };
    /* text: the longest L; bf16 when every embedding served is bf16, else f32, so that no
     * text is rounded (all dropped: the first sample's file's dtype, as served) */
    int64_t L = 1, D = ds->text_dim;
    enum ghc_dtype tdt = GHC_DTYPE_BF16;
    bool have_t = false;
    for (int32_t i = 0; i < m; i++) {
        const ghc_tensor_t *e = empty_for(ds, index[i]);
        int64_t l = drop[i] ? (e ? ghc_tensor_dim(e, 0) : ds->samples[index[i]].txt_len) : ghc_tensor_dim(txt[i], -2);
        if (l > L)
            L = l;
        if (!drop[i]) {
            have_t = true;
            if (ghc_tensor_dtype(txt[i]) != GHC_DTYPE_BF16)
                tdt = GHC_DTYPE_F32;
        }
    }
    if (!have_t)
        tdt = served_dtype(ds->samples[index[0]].txt_dtype);
    int64_t tshape[3] = { m, L, D }, mshape[2] = { m, L }, bshape[1] = { m };
    bool all_noise = true, all_t = true;
    for (int32_t i = 0; i < m; i++) {
        all_noise &= noi[i] != NULL;
        all_t &= tim[i] != NULL;
    }
    if (!(out->latents = ghc_tensor_init(ds->core, ldt, 5, lshape, GHC_DEVICE_CPU, GHC_ROLE_LATENTS)) ||
        !(out->text_embed = ghc_tensor_init(ds->core, tdt, 3, tshape, GHC_DEVICE_CPU, GHC_ROLE_TEXT_EMBEDS)) ||
        !(out->text_mask = ghc_tensor_init(ds->core, GHC_DTYPE_F32, 2, mshape, GHC_DEVICE_CPU, GHC_ROLE_MASKS)) ||
        (all_noise && !(out->noise = ghc_tensor_init(ds->core, ldt, 5, lshape, GHC_DEVICE_CPU, GHC_ROLE_LATENTS))) ||
        (all_t && !(out->timesteps = ghc_tensor_init(ds->core, GHC_DTYPE_F32, 1, bshape, GHC_DEVICE_CPU, GHC_ROLE_MASKS)))) {
        rc = ghc_error_code(ds->core) ? ghc_error_code(ds->core) : GHC_ENOMEM;
        goto out_put;
    }
    memset(ghc_tensor_data(out->text_embed), 0, ghc_tensor_nbytes(out->text_embed));
    float *mask = ghc_tensor_data(out->text_mask);
    memset(mask, 0, ghc_tensor_nbytes(out->text_mask));
    for (int32_t i = 0; i < m && rc == 0; i++) {
        rc = copy_rows(ds, out->latents, (int64_t)i * per, lat[i], per);
        if (all_noise && rc == 0)
            rc = copy_rows(ds, out->noise, (int64_t)i * per, noi[i], per);
        if (all_t && rc == 0) {
            ghc_tensor_t *one = NULL;
            int64_t sh1[1] = { 1 };
            one = ghc_tensor_wrap(ds->core, GHC_DTYPE_F32, 1, sh1, GHC_DEVICE_CPU,
                                  (float *)ghc_tensor_data(out->timesteps) + i);
            rc = one ? copy_rows(ds, one, 0, tim[i], 1) : GHC_ENOMEM;
            ghc_tensor_free(one);
        }
        int64_t l;
        const ghc_tensor_t *e = empty_for(ds, index[i]);
        if (!drop[i]) {
            l = ghc_tensor_dim(txt[i], -2);
            rc = rc ? rc : copy_rows(ds, out->text_embed, (int64_t)i * L * D, txt[i], l * D);
        } else if (e) {
            l = ghc_tensor_dim(e, 0);
            rc = rc ? rc : copy_rows(ds, out->text_embed, (int64_t)i * L * D, e, l * D);
        } else {
            l = ds->samples[index[i]].txt_len;   /* zeros, already there */
        }
        for (int64_t r = 0; r < l; r++)
            mask[(int64_t)i * L + r] = 1.0f;
        if (drop[i])
            ds->st.text_dropped++;
    }
out_put:
    for (int32_t i = 0; i < m; i++) {
        put_tensor(ds, index[i], GHC_SAMPLE_LATENT, lat[i]);
        put_tensor(ds, index[i], GHC_SAMPLE_TEXT_EMBED, txt[i]);
        put_tensor(ds, index[i], GHC_SAMPLE_NOISE, noi[i]);
        put_tensor(ds, index[i], GHC_SAMPLE_TIMESTEP, tim[i]);
    }
out:
    free(lat);
    free(txt);
    free(noi);
    free(tim);
    if (rc < 0 || !out->index) {
        ghc_tensor_free(out->latents);
        ghc_tensor_free(out->text_embed);
        ghc_tensor_free(out->text_mask);
        ghc_tensor_free(out->noise);
        ghc_tensor_free(out->timesteps);
        free(index);
        free(drop);
        memset(out, 0, sizeof(*out));
    }
    return rc;
}

/* The host side of a device batch, kept until release: the asynchronous copies read it. */
struct host_side {
    ghc_tensor_t *t[5];
};

/* Move a batch's tensors to `device` through the copy function. */
static int to_device(ghc_dataset_t *ds, struct ghc_data_batch *b, int device, void *stream)
{
    if (!ds->copy)
        return ghc_error_set(ds->core, GHC_EUNSUPPORTED, "data: batches on CUDA device %d need a copy function "
                             "(ghc_dataset_set_copy(ds, ghc_op_copy))", device);
    struct host_side *hs = calloc(1, sizeof(*hs));
    if (!hs)
        return ghc_error_set(ds->core, GHC_ENOMEM, "data: out of memory");
    b->priv = hs;
    ghc_tensor_t **slots[5] = { &b->latents, &b->text_embed, &b->text_mask, &b->noise, &b->timesteps };
    for (int i = 0; i < 5; i++) {
        ghc_tensor_t *h = *slots[i];
        if (!h)
            continue;
        ghc_tensor_t *d = ghc_tensor_init(ds->core, ghc_tensor_dtype(h), ghc_tensor_ndim(h), ghc_tensor_shape(h),
                                          device, ghc_tensor_role(h));
        if (!d)
            return ghc_error_code(ds->core) ? ghc_error_code(ds->core) : GHC_ENOMEM;
        int rc = ds->copy(d, h, stream);
        if (rc < 0) {
            ghc_tensor_free(d);
            return rc;
        }
        *slots[i] = d;
        hs->t[i] = h;
    }
    return 0;
}

int ghc_dataset_next(ghc_dataset_t *ds, int device, void *stream, struct ghc_data_batch *out)
{
    memset(out, 0, sizeof(*out));
    double t0 = now_s();
    int rc;
    for (;;) {
        if ((rc = build_order(ds, ds->pos_epoch)) < 0)
            return rc;
        if (ds->pos_batch >= ds->n_batches) {
            ds->pos_epoch++;
            ds->pos_batch = 0;
            continue;
        }
        int64_t bi = ds->pos_batch++, epoch = ds->pos_epoch;
        if (ds->pos_batch == ds->n_batches) {   /* the position is always a batch that exists */
            ds->pos_epoch++;
            ds->pos_batch = 0;
        }
        if ((rc = assemble(ds, epoch, bi, out)) < 0)
            return rc;
        if (out->n > 0)
            break;
        ghc_data_batch_release(ds, out);   /* every sample bad and skipped: the next batch */
    }
    if (device != GHC_DEVICE_CPU && (rc = to_device(ds, out, device, stream)) < 0) {
        ghc_data_batch_release(ds, out);
        return rc;
    }
    double w = now_s() - t0;
    ds->st.wait_seconds += w;
    if (w > ds->st.max_wait_seconds)
        ds->st.max_wait_seconds = w;
    ds->st.batches++;
    ds->st.bytes += ghc_tensor_nbytes(out->latents) + ghc_tensor_nbytes(out->text_embed);
    /* prefetch the following batch's samples through the cache */
    if (ds->cache && build_order(ds, ds->pos_epoch) == 0) {
        const struct order_batch *ob = &ds->batches[ds->pos_batch];
        for (int32_t i = 0; i < ob->n; i++)
            if (ghc_cache_prefetch(ds->cache, ds->order[ob->start + i], device, stream) < 0) {
                ghc_log(ds->core, GHC_LOG_DEBUG, "data: prefetch: %s", ghc_error_message(ds->core));
                ghc_error_clear(ds->core);
            }
    }
    return 0;
}

void ghc_data_batch_release(ghc_dataset_t *ds, struct ghc_data_batch *b)
{
    (void)ds;
    ghc_tensor_free(b->latents);
    ghc_tensor_free(b->text_embed);
    ghc_tensor_free(b->text_mask);
    ghc_tensor_free(b->noise);
    ghc_tensor_free(b->timesteps);
    free((void *)b->index);
    free((void *)b->text_dropped);
    struct host_side *hs = b->priv;
    if (hs) {
        /* the copies on the batch's stream have run by now: the caller released the batch
         * after the step that used it */
        for (int i = 0; i < 5; i++)
            ghc_tensor_free(hs->t[i]);
        free(hs);
    }
    memset(b, 0, sizeof(*b));
}
