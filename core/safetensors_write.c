/* safetensors_write.c: the atomic safetensors writer (ghc_st_writer_*). Tensors and metadata are
 * copied in as they are added, then laid out the way Python's safetensors lays them out (by
 * dtype, widest first, then by name; the header padded with spaces to a multiple of 8), so that
 * every tensor is aligned to its element size and the bytes equal Python's for the same tensors,
 * and written to a temporary file that is synced and renamed over the target, so a reader never
 * sees half a file. It shares only the format (safetensors.c describes it) and the escaping of
 * names in messages with the reader, hence a file of its own. */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include <gh200core/safetensors.h>

#include "core_impl.h"   /* defines: ghc_strdup, ghc_st_esc */

/* ---- writing ------------------------------------------------------------------------------ */

struct st_wentry {
    char           *name;
    enum ghc_dtype  dtype;
    int             ndim;
    int64_t         shape[GHC_TENSOR_MAX_DIMS];
    size_t          nbytes;
    void           *data;
};

struct ghc_st_writer {
    ghc_core_t        *core;
    struct st_wentry  *t;
    int                n, cap;
    char             **meta_key, **meta_val;
    int                n_meta, cap_meta;
};

ghc_st_writer_t *ghc_st_writer_init(ghc_core_t *core)
{
    ghc_st_writer_t *w = calloc(1, sizeof(*w));
    if (!w) {
        ghc_error_set(core, GHC_ENOMEM, "safetensors writer: out of memory");
        return NULL;
    }
    w->core = core;
    return w;
}

void ghc_st_writer_free(ghc_st_writer_t *w)
{
    if (!w)
        return;
    for (int i = 0; i < w->n; i++) {
        free(w->t[i].name);
        free(w->t[i].data);
    }
    free(w->t);
    for (int i = 0; i < w->n_meta; i++) {
        free(w->meta_key[i]);
        free(w->meta_val[i]);
    }
    free(w->meta_key);
    free(w->meta_val);
    free(w);
}

/* True when s is valid UTF-8 (jansson refuses anything else as a JSON string). */
static bool utf8_ok(const char *s)
{
    json_t *j = json_string(s);
    json_decref(j);
    return j != NULL;
}

int ghc_st_writer_add_raw(ghc_st_writer_t *w, const char *name, enum ghc_dtype dtype, int ndim,
                          const int64_t *shape, const void *data)
{
    int rc = 0;
    char nbuf[128];
    struct st_wentry e = { 0 };
    int64_t numel;
    if (!name || !utf8_ok(name) || strcmp(name, "__metadata__") == 0) {
        rc = ghc_error_set(w->core, GHC_EINVAL, "safetensors writer: invalid tensor name \"%s\"",
                           name ? ghc_st_esc(name, nbuf, sizeof(nbuf)) : "(null)");
        goto out;
    }
    if ((unsigned)dtype >= GHC_DTYPE_COUNT || ndim < 0 || ndim > GHC_TENSOR_MAX_DIMS ||
        (ndim && !shape) || !ghc_shape_numel(ndim, shape, &numel) ||
        (uint64_t)numel > SIZE_MAX / 8 || (numel && !data)) {
        rc = ghc_error_set(w->core, GHC_EINVAL, "safetensors writer: tensor \"%s\": invalid "
                           "dtype, shape or data", ghc_st_esc(name, nbuf, sizeof(nbuf)));
        goto out;
    }
    for (int i = 0; i < w->n; i++)
        if (strcmp(w->t[i].name, name) == 0) {
            rc = ghc_error_set(w->core, GHC_EINVAL, "safetensors writer: duplicate tensor "
                               "name \"%s\"", ghc_st_esc(name, nbuf, sizeof(nbuf)));
            goto out;
        }
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 16;
        struct st_wentry *t = realloc(w->t, (size_t)cap * sizeof(*t));
        if (!t)
            goto out_nomem;
        w->t = t;
        w->cap = cap;
    }
    e.dtype = dtype;
    e.ndim = ndim;
    for (int i = 0; i < ndim; i++)
        e.shape[i] = shape[i];
    e.nbytes = (size_t)numel * ghc_dtype_size(dtype);
    if (!(e.name = ghc_strdup(name)) || !(e.data = malloc(e.nbytes ? e.nbytes : 1)))
        goto out_nomem;
    if (e.nbytes)
        memcpy(e.data, data, e.nbytes);
    w->t[w->n++] = e;
    goto out;
out_nomem:
    free(e.name);
    free(e.data);
    rc = ghc_error_set(w->core, GHC_ENOMEM, "safetensors writer: out of memory for \"%s\"",
                       ghc_st_esc(name, nbuf, sizeof(nbuf)));
out:
    return rc;
}

int ghc_st_writer_add(ghc_st_writer_t *w, const char *name, const ghc_tensor_t *t)
{
    char nbuf[128];
    if (!t || ghc_tensor_device(t) != GHC_DEVICE_CPU)
        return ghc_error_set(w->core, GHC_EINVAL, "safetensors writer: tensor \"%s\" is not "
                             "on the CPU", name ? ghc_st_esc(name, nbuf, sizeof(nbuf)) : "(null)");
    return ghc_st_writer_add_raw(w, name, ghc_tensor_dtype(t), ghc_tensor_ndim(t),
                                 ghc_tensor_shape(t), ghc_tensor_cdata(t));
}

int ghc_st_writer_metadata(ghc_st_writer_t *w, const char *key, const char *value)
{
    char kbuf[64];
    if (!key || !value || !utf8_ok(key) || !utf8_ok(value))
        return ghc_error_set(w->core, GHC_EINVAL, "safetensors writer: metadata \"%s\": key "
                             "and value must be UTF-8 strings",
                             key ? ghc_st_esc(key, kbuf, sizeof(kbuf)) : "(null)");
    for (int i = 0; i < w->n_meta; i++)
        if (strcmp(w->meta_key[i], key) == 0) {
            char *v = ghc_strdup(value);
            if (!v)
                return ghc_error_set(w->core, GHC_ENOMEM, "safetensors writer: out of memory");
            free(w->meta_val[i]);
            w->meta_val[i] = v;
            return 0;
        }
    if (w->n_meta == w->cap_meta) {
        int cap = w->cap_meta ? 2 * w->cap_meta : 8;
        char **k = realloc(w->meta_key, (size_t)cap * sizeof(*k));
        if (k)
            w->meta_key = k;
        char **v = realloc(w->meta_val, (size_t)cap * sizeof(*v));
        if (v)
            w->meta_val = v;
        if (!k || !v)
            return ghc_error_set(w->core, GHC_ENOMEM, "safetensors writer: out of memory");
        w->cap_meta = cap;
    }
    char *k = ghc_strdup(key), *v = ghc_strdup(value);
    if (!k || !v) {
        free(k);
        free(v);
        return ghc_error_set(w->core, GHC_ENOMEM, "safetensors writer: out of memory");
    }
    w->meta_key[w->n_meta] = k;
    w->meta_val[w->n_meta++] = v;
    return 0;
}

/* Python's safetensors lays tensors out by dtype, widest first (its Dtype enum in reverse),
 * then by name; we do the same so that every tensor is aligned to its element size and the
 * bytes match what Python writes for the same tensors. */
static int dtype_rank(enum ghc_dtype dt)
{
    switch (dt) {
    case GHC_DTYPE_I64:     return 0;
    case GHC_DTYPE_F32:     return 1;
    case GHC_DTYPE_I32:     return 2;
    case GHC_DTYPE_BF16:    return 3;
    case GHC_DTYPE_F16:     return 4;
    case GHC_DTYPE_F8_E4M3: return 5;
    case GHC_DTYPE_F8_E5M2: return 6;
    case GHC_DTYPE_U8:      return 7;
    case GHC_DTYPE_BOOL:    return 8;
    default:                return 9;
    }
}

static int cmp_layout(const void *a, const void *b)
{
    const struct st_wentry *x = *(const struct st_wentry *const *)a;
    const struct st_wentry *y = *(const struct st_wentry *const *)b;
    int rx = dtype_rank(x->dtype), ry = dtype_rank(y->dtype);
    if (rx != ry)
        return rx - ry;
    return strcmp(x->name, y->name);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The header JSON, padded with spaces to a multiple of 8. NULL on ENOMEM. */
static char *build_header(ghc_st_writer_t *w, struct st_wentry **order, size_t *len)
{
    char *text = NULL, *padded = NULL;
    const char **keys = NULL;
    json_t *root = json_object();
    if (!root)
        goto out;
    if (w->n_meta) {
        json_t *md = json_object();
        if (!md || json_object_set_new(root, "__metadata__", md) < 0)
            goto out;
        if (!(keys = malloc((size_t)w->n_meta * sizeof(*keys))))
            goto out;
        for (int i = 0; i < w->n_meta; i++)
            keys[i] = w->meta_key[i];
        qsort(keys, (size_t)w->n_meta, sizeof(*keys), cmp_str);
        for (int i = 0; i < w->n_meta; i++) {
            int k = 0;
            while (strcmp(w->meta_key[k], keys[i]))
                k++;
            if (json_object_set_new(md, keys[i], json_string(w->meta_val[k])) < 0)
                goto out;
        }
    }
    uint64_t pos = 0;
    for (int i = 0; i < w->n; i++) {
        const struct st_wentry *e = order[i];
        json_t *ent = json_object(), *shape = json_array();
        if (json_object_set_new(root, e->name, ent) < 0 ||
            json_object_set_new(ent, "dtype", json_string(ghc_dtype_name(e->dtype))) < 0 ||
            json_object_set_new(ent, "shape", shape) < 0)
            goto out;   /* set_new releases the value on failure; ent is in root */
        for (int d = 0; d < e->ndim; d++)
            if (json_array_append_new(shape, json_integer(e->shape[d])) < 0)
                goto out;
        json_t *off = json_pack("[II]", (json_int_t)pos, (json_int_t)(pos + e->nbytes));
        if (json_object_set_new(ent, "data_offsets", off) < 0)
            goto out;
        pos += e->nbytes;
    }
    if (!(text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER)))
        goto out;
    size_t n = strlen(text), padn = (n + 7) / 8 * 8;
    if (!(padded = malloc(padn + 1)))
        goto out;
    memcpy(padded, text, n);
    memset(padded + n, ' ', padn - n);
    padded[padn] = '\0';
    *len = padn;
out:
    free(keys);
    free(text);
    json_decref(root);
    return padded;
}

static int write_all(int fd, const void *buf, size_t n)
{
    const uint8_t *p = buf;
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

int ghc_st_writer_finish(ghc_st_writer_t *w, const char *path)
{
    int rc = 0, fd = -1;
    char *tmp = NULL, *header = NULL;
    struct st_wentry **order = malloc((size_t)(w->n ? w->n : 1) * sizeof(*order));
    if (!order) {
        rc = ghc_error_set(w->core, GHC_ENOMEM, "%s: out of memory", path);
        goto out;
    }
    for (int i = 0; i < w->n; i++)
        order[i] = &w->t[i];
    qsort(order, (size_t)w->n, sizeof(*order), cmp_layout);
    size_t hlen = 0;
    if (!(header = build_header(w, order, &hlen))) {
        rc = ghc_error_set(w->core, GHC_ENOMEM, "%s: out of memory for the header", path);
        goto out;
    }
    if (hlen > GHC_ST_MAX_HEADER) {
        rc = ghc_error_set(w->core, GHC_EINVAL, "%s: header of %zu bytes exceeds the limit of "
                           "%u", path, hlen, GHC_ST_MAX_HEADER);
        goto out;
    }
    if (!(tmp = malloc(strlen(path) + sizeof(".tmp.XXXXXX")))) {
        rc = ghc_error_set(w->core, GHC_ENOMEM, "%s: out of memory", path);
        goto out;
    }
    sprintf(tmp, "%s.tmp.XXXXXX", path);
    if ((fd = mkstemp(tmp)) < 0) {
        rc = ghc_error_set(w->core, GHC_EIO, "%s: cannot create a temporary file: %s", path,
                           strerror(errno));
        free(tmp);
        tmp = NULL;
        goto out;
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    int bad = fchmod(fd, 0644) < 0 || write_all(fd, len8, 8) < 0 ||
              write_all(fd, header, hlen) < 0;
    for (int i = 0; i < w->n && !bad; i++)
        bad = write_all(fd, order[i]->data, order[i]->nbytes) < 0;
    if (bad || fsync(fd) < 0) {
        rc = ghc_error_set(w->core, GHC_EIO, "%s: cannot write %s: %s", path, tmp,
                           strerror(errno));
        goto out_unlink;
    }
    int cr = close(fd);
    fd = -1;
    if (cr < 0 || rename(tmp, path) < 0) {
        rc = ghc_error_set(w->core, GHC_EIO, "%s: cannot %s: %s", path,
                           cr < 0 ? "close the temporary file" : "rename the temporary file",
                           strerror(errno));
        goto out_unlink;
    }
    /* Make the rename itself durable: fsync the folder (best effort). */
    char *slash = strrchr(tmp, '/');
    if (slash)
        slash[slash == tmp ? 1 : 0] = '\0';
    int dfd = open(slash ? tmp : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    goto out;
out_unlink:
    if (fd >= 0)
        close(fd);
    fd = -1;
    unlink(tmp);
out:
    free(tmp);
    free(header);
    free(order);
    return rc;
}
