/* data_aitk.c: ai-toolkit's cache layout: which of its files are latents and text embeddings,
 * and which text embedding belongs to a latent.
 *
 * ai-toolkit names a cached text embedding `<stem>_<hash>.safetensors`, hash = base64url, '='
 * removed, of the MD5 of Python's json.dumps({"caption": ..., "text_embedding_space_version":
 * <model arch>, "text_embedding_version": 1}, sort_keys=True); with caption dropout it writes a
 * second file per item, made from the dropout caption. The stem cannot tell these apart, nor a
 * file left over from an edited caption; the hash of the caption can, so the caption is
 * rebuilt here exactly as ai-toolkit builds it (toolkit/dataloader_mixins.py: load_caption,
 * get_caption, get_dropout_caption, _build_text_embedding_path; toolkit/prompt_utils.py:
 * inject_trigger_into_prompt), with Python's reading of a text file and its json escaping. */
#include <config.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataset_impl.h"

/* ---- Python's strings ------------------------------------------------------------------------ */

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

bool ghc_utf8_valid(const char *s)
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

/* ---- the hash in a name ---------------------------------------------------------------------- */

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

/* ---- the files ------------------------------------------------------------------------------- */

/* "<dir>/<cache_dir><stem>_<hash>.safetensors": 1 with the stem "<dir>/<stem>", 0 if name is not
 * such a file, GHC_ENOMEM. */
static int aitk_stem(const char *name, const char *cache_dir, char **stem)
{
    const char *c = strstr(name, cache_dir);
    if (!c || (c != name && c[-1] != '/') || !ghc_data_ends_with(name, ".safetensors"))
        return 0;
    const char *base = c + strlen(cache_dir);
    if (strchr(base, '/'))
        return 0;
    /* the hash is 22 characters of base64url (which may hold '_'): cut exactly that when it
     * fits, else at the last '_' */
    size_t blen = strlen(base) - strlen(".safetensors");
    const char *us = blen > 23 && base[blen - 23] == '_' ? base + blen - 23 : strrchr(base, '_');
    if (!us || us == base)
        return 0;
    size_t dl = (size_t)(c - name), bl = (size_t)(us - base);
    char *s = malloc(dl + bl + 1);
    if (!s)
        return GHC_ENOMEM;
    memcpy(s, name, dl);
    memcpy(s + dl, base, bl);
    s[dl + bl] = '\0';
    *stem = s;
    return 1;
}

/* Latents in "_latent_cache/", text embeddings in "_t_e_cache/". */
int ghc_aitk_classify(const char *name, enum ghc_sample_kind *kind, char **stem)
{
    int rc = aitk_stem(name, "_latent_cache/", stem);
    *kind = GHC_SAMPLE_LATENT;
    if (rc == 0) {
        rc = aitk_stem(name, "_t_e_cache/", stem);
        *kind = GHC_SAMPLE_TEXT_EMBED;
    }
    return rc;
}

/* ---- which text file is a latent's ----------------------------------------------------------- */

#define CAPTION_MAX (1u << 20)     /* a caption file longer than this is not a caption */

/* The caption and the dropout caption ai-toolkit encodes for an item with caption file `cap`
 * (NULL: none) in dataset `set`: load_caption reads the file (default_caption stands in for
 * a missing or blank one), get_caption and get_dropout_caption add the trigger word. Both
 * malloc'ed. Returns 0, 1 (a bad sample, skipped) or GHC_E*. */
static int aitk_captions(ghc_dataset_t *ds, const struct data_set *set, const char *cap, char **caption, char **dropout)
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
        ghc_data_disk_name(ds, cap, disk, sizeof(disk));
        if (ghc_backend_fetch(ds->backend, cap, CAPTION_MAX, &data, &owned, &len, &size) < 0) {
            rc = ghc_data_bad_sample(ds, ghc_error_code(ds->core), "%s", ghc_error_message(ds->core));
            goto out;
        }
        bool text = size == len && (raw.n = 0, py_text(data, len, &raw));
        free(owned);
        if (raw.oom) {
            rc = ghc_error_set(ds->core, GHC_ENOMEM, "data: out of memory");
            goto out;
        }
        if (!text) {
            rc = ghc_data_bad_sample(ds, GHC_EFORMAT, "%s: %s, so its ai-toolkit text embedding cannot be found by the "
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
int ghc_aitk_pair(ghc_dataset_t *ds, struct data_listing *ls, const struct data_found *f, const struct data_found **t)
{
    struct data_set *set = &ds->sets[ls->ds];
    size_t lo, hi;
    *t = NULL;
    if (!ghc_data_listing_range(ls, ghc_data_class(GHC_DATA_FORMAT_AITK, GHC_SAMPLE_TEXT_EMBED), f->stem, &lo, &hi))
        return 0;
    const struct data_found *cap = ghc_data_listing_find(ls, GHC_DATA_CLASS_CAPTION, f->stem);
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
        struct data_found *c = &ls->f[i];
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
    ghc_data_disk_name(ds, f->name, lat, sizeof(lat));
    if (n_match == 0 && !cap && n_other == 1) {
        ghc_log(ds->core, GHC_LOG_WARN, "data: %s: no caption file to hash, and its only text embedding %s was "
                "not made from the caption \"%s\": taken all the same", lat,
                ghc_data_disk_name(ds, ls->f[other[0]].name, a, sizeof(a)), caption);
        match[0] = other[0];
        n_match = 1;
        ls->f[other[0]].used = true;
    }
    if (n_match == 1) {
        *t = &ls->f[match[0]];
    } else if (n_match > 1) {
        rc = ghc_data_bad_sample(ds, GHC_EFORMAT, "%s: %zu text embeddings were made from its caption, %s and "
                                 "%s (caches of two models?); expected one: remove the others", lat, n_match,
                                 ghc_data_disk_name(ds, ls->f[match[0]].name, a, sizeof(a)),
                                 ghc_data_disk_name(ds, ls->f[match[1]].name, b, sizeof(b)));
    } else {
        aitk_text_name(f->stem, hc[0], b, sizeof(b));
        ghc_data_disk_name(ds, b, want, sizeof(want));
        if (!cap && n_other > 1) {
            rc = ghc_data_bad_sample(ds, GHC_ENOTFOUND, "%s: without a caption file its text embedding is the one "
                                     "made from the caption \"%s\" (%s for wan21), which is not there, and %zu "
                                     "others could each be it, %s and %s: expected that one or a single other",
                                     lat, caption, want, n_other,
                                     ghc_data_disk_name(ds, ls->f[other[0]].name, a, sizeof(a)),
                                     ghc_data_disk_name(ds, ls->f[other[1]].name, b, sizeof(b)));
        } else {
            char from[4400];
            size_t named = n_other ? other[0] : blank;
            if (cap)
                ghc_data_disk_name(ds, cap->name, from, sizeof(from));
            else
                snprintf(from, sizeof(from), "\"%s\" (no caption file)", caption);
            rc = ghc_data_bad_sample(ds, GHC_ENOTFOUND, "%s: none of its text embeddings was made from its caption "
                                     "%s (expected %s for wan21, or the same stem with the hash for another Wan "
                                     "model); %s%s is from %s: re-cache the text embeddings with ai-toolkit",
                                     lat, from, want, ghc_data_disk_name(ds, ls->f[named].name, a, sizeof(a)),
                                     hi - lo > 1 ? " (and others)" : "",
                                     named == blank ? "the dropout caption"
                                                    : "another caption or other settings (stale)");
        }
    }
    if (blank != SIZE_MAX && !set->blank_file &&
        (!(set->blank_file = strdup(ls->f[blank].name)) || !(set->blank_caption = strdup(dropout))))
        rc = ghc_error_set(ds->core, GHC_ENOMEM, "data: out of memory");
out:
    free(caption);
    free(dropout);
    return rc;
}


/* One warning line for the ai-toolkit text embeddings of dataset d that no caption of
 * theirs hashes to (left over from an edited caption, or made with other settings): never
 * used, so a dataset that still trains says why some of its files do not count. */
void ghc_aitk_report(ghc_dataset_t *ds, int32_t d, const struct data_listing *ls)
{
    struct sbuf names = { 0 };
    size_t n = 0;
    for (size_t i = 0; i < ls->n; i++) {
        const struct data_found *f = &ls->f[i];
        if (f->cls != ghc_data_class(GHC_DATA_FORMAT_AITK, GHC_SAMPLE_TEXT_EMBED) || !f->stale || f->used)
            continue;
        if (n++ < 8) {
            char disk[4400];
            sb_str(&names, n > 1 ? ", " : "");
            sb_str(&names, ghc_data_disk_name(ds, f->name, disk, sizeof(disk)));
        }
    }
    if (n)
        ghc_log(ds->core, GHC_LOG_WARN, "data: dataset %d (%s): %zu ai-toolkit text embedding%s made from no caption "
                "of %s, ignored (stale after a caption edit, or other settings): %s%s", (int)d, ds->sets[d].path, n,
                n == 1 ? "" : "s", n == 1 ? "its item" : "their items", names.oom ? "?" : names.p,
                n > 8 ? " and more" : "");
    free(names.p);
}

