/* in_memory.c: the `in_memory` backend: every file of every dataset staged into RAM at mount
 * by a pool of threads, kept as it is (compression "none", mappable) or in independently
 * compressed blocks (lz4, zlib, snappy per dataset) that reads decode on demand. A file
 * "<name>.ghz" (codec.h) is a file stored compressed on disk: staged as it is after every
 * block is checked, listed as <name>. The memory limit is checked against an estimate before
 * anything is staged. Reads are thread-safe: staged data never changes after mount.
 *
 * Worker threads make no core calls (the core's error buffer is not thread-safe): they
 * record a failure as text in the entry, and the mount or the read reports it. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <gh200core/backend.h>

#include "codec.h"

struct im_entry {
    char                 *name;       /* exposed: "<root>/<path>" without ".ghz" */
    char                 *path;       /* on disk */
    uint64_t              file_size;  /* on disk */
    uint64_t              raw;        /* the entry's bytes */
    enum ghc_compression  codec;
    bool                  ghz;
    uint32_t              block;      /* raw bytes per block (compressed entries) */
    uint32_t              nb;
    uint64_t             *boff;       /* [nb + 1] offsets of the blocks in data */
    uint8_t              *data;
    uint64_t              stored;
    char                 *err;        /* staging failed: why (reads report it) */
    int                   err_code;
};

struct im_root {
    char                 *path;
    enum ghc_compression  compression;
};

struct im {
    ghc_core_t      *core;
    ghc_cfg_t       *cfg;
    int64_t          workers;
    double           limit;          /* bytes, 0 = none */
    uint32_t         block;
    double           progress_s;
    struct im_root  *roots;
    int32_t          n_roots;
    struct im_entry *e;              /* by name */
    size_t           n;
    uint64_t         raw, stored;
    double           stage_s;
    uint64_t         reads, read_bytes;
    /* staging */
    size_t           next;           /* the next entry a worker takes */
    size_t           done;
    uint64_t         done_bytes;
};

static const struct ghc_cfg_key im_keys[] = {
    { "num_workers",      GHC_CFG_INT,   "(cores, at most 72)", "1 to 4096", NULL },
    { "memory_limit_gb",  GHC_CFG_FLOAT, "0.0",                 "0 to 1e9",  NULL },   /* 0: none */
    { "block_kib",        GHC_CFG_INT,   "1024",                "1 to 2^20", NULL },
    { "progress_seconds", GHC_CFG_FLOAT, "5.0",                 "0 to 1e6",  NULL },   /* 0: none */
    { NULL, 0, NULL, NULL, NULL }
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int im_init(ghc_core_t *core, ghc_cfg_t *cfg, void **self)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int64_t workers = cores < 1 ? 1 : cores > 72 ? 72 : cores, block_kib = 1024;
    double limit_gb = 0, progress = 5;
    int rc;
    if (cfg && ((rc = ghc_cfg_get_int(cfg, "num_workers", workers, 1, 4096, &workers)) < 0 ||
                (rc = ghc_cfg_get_float(cfg, "memory_limit_gb", 0.0, 0.0, 1e9, &limit_gb)) < 0 ||
                (rc = ghc_cfg_get_int(cfg, "block_kib", 1024, 1, 1 << 20, &block_kib)) < 0 ||
                (rc = ghc_cfg_get_float(cfg, "progress_seconds", 5.0, 0.0, 1e6, &progress)) < 0))
        return rc;
    struct im *m = calloc(1, sizeof(*m));
    if (!m)
        return ghc_error_set(core, GHC_ENOMEM, "in_memory: out of memory");
    m->core = core;
    m->cfg = cfg;
    m->workers = workers;
    m->limit = limit_gb * 1073741824.0;
    m->block = (uint32_t)(block_kib * 1024);
    m->progress_s = progress;
    *self = m;
    return 0;
}

static void entries_free(struct im *m)
{
    for (size_t i = 0; i < m->n; i++) {
        free(m->e[i].name);
        free(m->e[i].path);
        free(m->e[i].boff);
        free(m->e[i].data);
        free(m->e[i].err);
    }
    free(m->e);
    m->e = NULL;
    m->n = 0;
    for (int32_t r = 0; r < m->n_roots; r++)
        free(m->roots[r].path);
    free(m->roots);
    m->roots = NULL;
    m->n_roots = 0;
    m->raw = m->stored = 0;
}

static void im_free(void *self)
{
    struct im *m = self;
    if (!m)
        return;
    entries_free(m);
    free(m);
}

/* ---- staging (worker threads: no core calls) ---------------------------------------------- */

static void fail(struct im_entry *e, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fail(struct im_entry *e, int code, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    free(e->err);
    e->err = strdup(buf);
    e->err_code = code;
}

static uint8_t *read_file(struct im_entry *e)
{
    int fd = open(e->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fail(e, GHC_EIO, "%s: cannot open: %s", e->path, strerror(errno));
        return NULL;
    }
    uint8_t *buf = malloc(e->file_size ? e->file_size : 1);
    size_t done = 0;
    while (buf && done < e->file_size) {
        ssize_t k = pread(fd, buf + done, e->file_size - done, (off_t)done);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            fail(e, GHC_EIO, "%s: cannot read: %s", e->path, k < 0 ? strerror(errno) : "shorter than listed");
            free(buf);
            buf = NULL;
        } else {
            done += (size_t)k;
        }
    }
    if (!buf && !e->err)
        fail(e, GHC_ENOMEM, "%s: out of memory for %" PRIu64 " bytes", e->path, e->file_size);
    close(fd);
    return buf;
}

static uint32_t get32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }

/* A .ghz file: check the frame and every block, keep the blocks. */
static void stage_ghz(struct im_entry *e, uint8_t *f)
{
    uint64_t fs = e->file_size;
    if (fs < GHZ_HEAD || memcmp(f, GHZ_MAGIC, 4) != 0 || f[4] >= GHC_COMPRESSION_COUNT) {
        fail(e, GHC_EFORMAT, "%s: not a .ghz file (magic \"GHZ1\" and a known codec expected)", e->path);
        goto out;
    }
    e->codec = (enum ghc_compression)f[4];
    e->block = get32(f + 8);
    e->raw = get64(f + 12);
    e->nb = get32(f + 20);
    /* every size field checked without overflow: the block count from raw / block rounded up
     * (never raw + block - 1), the block table against the file before anything is read */
    uint64_t want_nb = e->block ? e->raw / e->block + (e->raw % e->block != 0) : 0;
    if (!e->block || e->block > GHZ_MAX_BLOCK || e->raw > SIZE_MAX || (uint64_t)e->nb != want_nb ||
        (uint64_t)e->nb > (fs - GHZ_HEAD) / 8) {
        fail(e, GHC_EFORMAT, "%s: inconsistent .ghz header (%" PRIu64 " bytes in %u blocks of %u; blocks of 1 to %u "
             "bytes, as many as the raw size needs, and a block table inside the file expected)", e->path,
             e->raw, e->nb, e->block, (unsigned)GHZ_MAX_BLOCK);
        goto out;
    }
    if (!(e->boff = calloc((size_t)e->nb + 1, sizeof(*e->boff)))) {
        fail(e, GHC_ENOMEM, "%s: out of memory", e->path);
        goto out;
    }
    uint64_t at = 0;
    for (uint32_t b = 0; b < e->nb; b++) {
        uint32_t csz = get32(f + GHZ_HEAD + (uint64_t)b * 8);
        uint64_t braw = b + 1 < e->nb ? e->block : e->raw - (uint64_t)b * e->block;
        /* a block cannot decode to more than its codec can expand csz bytes to */
        if (braw > codec_max_raw(e->codec, csz)) {
            fail(e, GHC_EFORMAT, "%s: block %u of %u claims %" PRIu64 " raw bytes from %u compressed bytes, more than "
                 "%s can give (corrupt or hostile .ghz header)", e->path, b, e->nb, braw, csz,
                 ghc_compression_name(e->codec));
            goto out;
        }
        e->boff[b] = at;
        at += csz;   /* at most 2^32 blocks of < 2^32 bytes: no overflow */
    }
    e->boff[e->nb] = at;
    uint64_t data_at = GHZ_HEAD + (uint64_t)e->nb * 8;
    if (at != fs - data_at) {
        fail(e, GHC_EFORMAT, "%s: .ghz blocks cover %" PRIu64 " bytes, the file has %" PRIu64 " after the header (truncated?)",
             e->path, at, fs - data_at);
        goto out;
    }
    uint8_t *tmp = malloc(e->block);
    for (uint32_t b = 0; tmp && b < e->nb; b++) {
        size_t raw = (size_t)(b + 1 < e->nb ? e->block : e->raw - (uint64_t)b * e->block);
        const uint8_t *src = f + data_at + e->boff[b];
        if (codec_decompress(e->codec, src, (size_t)(e->boff[b + 1] - e->boff[b]), tmp, raw) < 0) {
            fail(e, GHC_EFORMAT, "%s: block %u of %u is corrupt (%s: cannot decode)", e->path, b, e->nb,
                 ghc_compression_name(e->codec));
            break;
        }
        if (codec_crc(tmp, raw) != get32(f + GHZ_HEAD + b * 8 + 4)) {
            fail(e, GHC_EFORMAT, "%s: block %u of %u is corrupt (CRC-32 mismatch)", e->path, b, e->nb);
            break;
        }
    }
    if (!tmp)
        fail(e, GHC_ENOMEM, "%s: out of memory", e->path);
    free(tmp);
    if (e->err)
        goto out;
    memmove(f, f + data_at, (size_t)at);
    e->data = realloc(f, at ? (size_t)at : 1);
    if (!e->data)
        e->data = f;
    e->stored = at;
    return;
out:
    e->raw = 0;   /* a rejected header's sizes are not believed anywhere (stats, reads) */
    free(f);
}

static void stage_one(struct im *m, struct im_entry *e)
{
    uint8_t *f = read_file(e);
    if (!f)
        return;
    if (e->ghz) {
        stage_ghz(e, f);
        return;
    }
    e->raw = e->file_size;
    if (e->codec == GHC_COMPRESSION_NONE) {
        e->data = f;
        e->stored = e->raw;
        return;
    }
    e->block = m->block;
    if (e->raw / e->block >= UINT32_MAX) {
        fail(e, GHC_EFORMAT, "%s: too large to stage compressed (%" PRIu64 " bytes, over 2^32 blocks of %u)", e->path,
             e->raw, e->block);
        free(f);
        return;
    }
    e->nb = (uint32_t)(e->raw / e->block + (e->raw % e->block != 0));
    size_t bound = codec_bound(e->codec, e->block);
    uint8_t *out = malloc((size_t)e->nb * bound + 1);
    e->boff = calloc((size_t)e->nb + 1, sizeof(*e->boff));
    if (!out || !e->boff) {
        fail(e, GHC_ENOMEM, "%s: out of memory", e->path);
        free(out);
        free(f);
        return;
    }
    uint64_t at = 0;
    for (uint32_t b = 0; b < e->nb; b++) {
        size_t off = (size_t)b * e->block, k = (size_t)(e->raw - off < e->block ? e->raw - off : e->block), got;
        e->boff[b] = at;
        if (codec_compress(e->codec, f + off, k, out + at, bound, &got) < 0) {
            fail(e, GHC_EINTERNAL, "%s: %s compression failed", e->path, ghc_compression_name(e->codec));
            free(out);
            free(f);
            return;
        }
        at += got;
    }
    e->boff[e->nb] = at;
    free(f);
    e->data = realloc(out, at ? (size_t)at : 1);
    if (!e->data)
        e->data = out;
    e->stored = at;
}

static void *worker(void *arg)
{
    struct im *m = arg;
    for (;;) {
        size_t i = __atomic_fetch_add(&m->next, 1, __ATOMIC_RELAXED);
        if (i >= m->n)
            break;
        stage_one(m, &m->e[i]);
        __atomic_add_fetch(&m->done_bytes, m->e[i].file_size, __ATOMIC_RELAXED);
        __atomic_add_fetch(&m->done, 1, __ATOMIC_RELEASE);
    }
    return NULL;
}

/* ---- mount ---------------------------------------------------------------------------------- */

struct collect {
    struct im *m;
    int        rc;
};

static int collect_visit(void *user, const char *name, uint64_t size)
{
    struct collect *c = user;
    struct im *m = c->m;
    struct im_entry *ne = realloc(m->e, (m->n + 1) * sizeof(*ne));
    if (!ne)
        return ghc_error_set(m->core, GHC_ENOMEM, "in_memory: out of memory listing");
    m->e = ne;
    struct im_entry *e = &m->e[m->n];
    memset(e, 0, sizeof(*e));
    char *slash = strchr(name, '/');
    int32_t r = (int32_t)strtol(name, NULL, 10);
    size_t nl = strlen(name);
    e->ghz = nl > 4 && strcmp(name + nl - 4, ".ghz") == 0;
    e->name = strndup(name, e->ghz ? nl - 4 : nl);
    size_t pl = strlen(m->roots[r].path) + strlen(slash) + 1;
    e->path = malloc(pl);
    if (!e->name || !e->path) {
        free(e->name);
        free(e->path);
        return ghc_error_set(m->core, GHC_ENOMEM, "in_memory: out of memory listing");
    }
    snprintf(e->path, pl, "%s%s", m->roots[r].path, slash);
    e->file_size = size;
    e->codec = m->roots[r].compression;
    m->n++;
    return 0;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(((const struct im_entry *)a)->name, ((const struct im_entry *)b)->name);
}

/* Bytes the staged entries will take: raw for "none" and .ghz files as they are; compressed
 * roots from the ratio of the first files' first block. */
static double estimate(struct im *m, double *ratio_out)
{
    double total = 0;
    double ratio[GHC_COMPRESSION_COUNT] = { 1, 1, 1, 1 };
    for (int c = 1; c < GHC_COMPRESSION_COUNT; c++) {
        uint64_t in = 0, out = 0;
        int probes = 0;
        for (size_t i = 0; i < m->n && probes < 8; i++) {
            struct im_entry *e = &m->e[i];
            if (e->ghz || e->codec != (enum ghc_compression)c || !e->file_size)
                continue;
            size_t k = (size_t)(e->file_size < m->block ? e->file_size : m->block);
            uint8_t *buf = malloc(k), *cbuf = malloc(codec_bound(e->codec, k));
            int fd = open(e->path, O_RDONLY | O_CLOEXEC);
            size_t got = 0;
            if (buf && cbuf && fd >= 0) {
                ssize_t r = pread(fd, buf, k, 0);
                if (r > 0 && codec_compress(e->codec, buf, (size_t)r, cbuf, codec_bound(e->codec, k), &got) == 0) {
                    in += (uint64_t)r;
                    out += got;
                    probes++;
                }
            }
            if (fd >= 0)
                close(fd);
            free(buf);
            free(cbuf);
        }
        if (in)
            ratio[c] = (double)out / (double)in;
    }
    double worst = 1;
    for (size_t i = 0; i < m->n; i++) {
        const struct im_entry *e = &m->e[i];
        double r = e->ghz ? 1.0 : ratio[e->codec];
        total += (double)e->file_size * r * (e->codec && !e->ghz ? 1.05 : 1.0) + sizeof(*e) + 64;
        if (!e->ghz && e->codec)
            worst = ratio[e->codec] < worst ? ratio[e->codec] : worst;
    }
    *ratio_out = worst;
    return total;
}

static int im_mount(void *self, const struct ghc_backend_root *roots, int32_t n)
{
    struct im *m = self;
    ghc_core_t *core = m->core;
    int rc = 0;
    /* the same roots again (a second dataset on this run): nothing to do */
    if (m->roots && n == m->n_roots) {
        bool same = true;
        for (int32_t i = 0; i < n && same; i++)
            same = strcmp(roots[i].path, m->roots[i].path) == 0 && roots[i].compression == m->roots[i].compression;
        if (same)
            return 0;
    }
    entries_free(m);
    if (!(m->roots = calloc(n > 0 ? (size_t)n : 1, sizeof(*m->roots))))
        return ghc_error_set(core, GHC_ENOMEM, "in_memory: out of memory");
    for (int32_t i = 0; i < n; i++) {
        if (!(m->roots[i].path = strdup(roots[i].path)))
            return ghc_error_set(core, GHC_ENOMEM, "in_memory: out of memory");
        m->roots[i].compression = roots[i].compression;
        m->n_roots = i + 1;
    }
    /* list through the local backend (same names, same rules) */
    ghc_backend_t *lb = ghc_backend_init(core, ghc_backend_local_ops(), NULL);
    if (!lb)
        return ghc_error_code(core);
    struct collect c = { .m = m };
    if ((rc = ghc_backend_mount(lb, roots, n)) == 0)
        rc = ghc_backend_list(lb, "", collect_visit, &c);
    ghc_backend_free(lb);
    if (rc < 0)
        return rc;
    if (m->n > 0)   /* (m->e may be NULL: qsort wants a pointer even for 0) */
        qsort(m->e, m->n, sizeof(*m->e), cmp_name);
    for (size_t i = 1; i < m->n; i++)
        if (strcmp(m->e[i].name, m->e[i - 1].name) == 0)
            return ghc_error_set(core, GHC_EINVAL, "in_memory: %s and %s.ghz both exist: keep one", m->e[i].path,
                                 m->e[i].name);
    uint64_t files_bytes = 0;
    for (size_t i = 0; i < m->n; i++)
        files_bytes += m->e[i].file_size;
    double ratio;
    double est = estimate(m, &ratio);
    if (m->limit > 0 && est > m->limit)
        return ghc_error_set(core, GHC_ENOMEM, "%s: in_memory: staging %zu files (%.3f GiB on disk) needs an estimated "
                             "%.3f GiB (compression ratio %.2f), over memory_limit_gb = %g; raise the limit, "
                             "compress (lz4, zlib, snappy) or use the local backend",
                             m->cfg ? ghc_cfg_where(m->cfg, "memory_limit_gb") : "backend", m->n,
                             (double)files_bytes / 1073741824.0, est / 1073741824.0, ratio, m->limit / 1073741824.0);
    ghc_log(core, GHC_LOG_INFO, "in_memory: staging %zu files (%.3f GiB, estimated %.3f GiB in memory) with %lld threads",
            m->n, (double)files_bytes / 1073741824.0, est / 1073741824.0, (long long)m->workers);

    double t0 = now_s(), last = t0;
    m->next = m->done = 0;
    m->done_bytes = 0;
    int nw = (int)(m->workers < (int64_t)m->n ? m->workers : (int64_t)m->n);
    pthread_t *th = calloc(nw > 0 ? (size_t)nw : 1, sizeof(*th));
    if (!th)
        return ghc_error_set(core, GHC_ENOMEM, "in_memory: out of memory");
    int started = 0;
    for (; started < nw; started++)
        if (pthread_create(&th[started], NULL, worker, m) != 0)
            break;
    if (nw > 0 && started == 0) {
        free(th);
        return ghc_error_set(core, GHC_EINTERNAL, "in_memory: cannot start a staging thread");
    }
    while (__atomic_load_n(&m->done, __ATOMIC_ACQUIRE) < m->n) {
        struct timespec ts = { 0, 20 * 1000 * 1000 };
        nanosleep(&ts, NULL);
        double t = now_s();
        if (m->progress_s > 0 && t - last >= m->progress_s) {
            uint64_t b = __atomic_load_n(&m->done_bytes, __ATOMIC_RELAXED);
            ghc_log(core, GHC_LOG_INFO, "in_memory: staged %zu of %zu files, %.2f GiB, %.2f GB/s",
                    __atomic_load_n(&m->done, __ATOMIC_RELAXED), m->n, (double)b / 1073741824.0, (double)b / (t - t0) / 1e9);
            last = t;
        }
    }
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    free(th);
    m->stage_s = now_s() - t0;
    size_t bad = 0;
    for (size_t i = 0; i < m->n; i++) {
        m->raw += m->e[i].raw ? m->e[i].raw : (m->e[i].ghz ? 0 : m->e[i].file_size);
        m->stored += m->e[i].stored;
        if (m->e[i].err) {
            bad++;
            /* an unreadable or corrupt file: the dataset names it when it reads it, and
             * skips it when skip_bad_samples is set */
            ghc_log(core, GHC_LOG_WARN, "in_memory: %s", m->e[i].err);
            if (m->e[i].err_code == GHC_ENOMEM || m->e[i].err_code == GHC_EINTERNAL)
                return ghc_error_set(core, m->e[i].err_code, "in_memory: %s", m->e[i].err);
        }
    }
    if (m->limit > 0 && (double)m->stored > m->limit)
        return ghc_error_set(core, GHC_ENOMEM, "%s: in_memory: the staged data takes %.3f GiB, over memory_limit_gb = %g",
                             m->cfg ? ghc_cfg_where(m->cfg, "memory_limit_gb") : "backend",
                             (double)m->stored / 1073741824.0, m->limit / 1073741824.0);
    ghc_log(core, GHC_LOG_INFO, "in_memory: %zu files, %.3f GiB raw, %.3f GiB stored (ratio %.3f), %.2f s, %.2f GB/s%s",
            m->n, (double)m->raw / 1073741824.0, (double)m->stored / 1073741824.0,
            m->raw ? (double)m->stored / (double)m->raw : 1.0, m->stage_s,
            m->stage_s > 0 ? (double)files_bytes / m->stage_s / 1e9 : 0.0, bad ? " (some files bad)" : "");
    return 0;
}

/* ---- reads ------------------------------------------------------------------------------------ */

static struct im_entry *find(struct im *m, const char *name)
{
    struct im_entry key = { .name = (char *)name };
    return bsearch(&key, m->e, m->n, sizeof(*m->e), cmp_name);
}

static int im_list(void *self, const char *prefix, ghc_backend_visit_fn visit, void *user)
{
    struct im *m = self;
    size_t pl = strlen(prefix);
    for (size_t i = 0; i < m->n; i++)
        if (strncmp(m->e[i].name, prefix, pl) == 0) {
            int rc = visit(user, m->e[i].name, m->e[i].raw);
            if (rc)
                return rc;
        }
    return 0;
}

static int lookup(struct im *m, const char *name, struct im_entry **out)
{
    struct im_entry *e = find(m, name);
    if (!e)
        return ghc_error_set(m->core, GHC_ENOTFOUND, "in_memory: %s: no such entry", name);
    if (e->err)
        return ghc_error_set(m->core, e->err_code, "in_memory: %s", e->err);
    *out = e;
    return 0;
}

static int im_stat(void *self, const char *name, uint64_t *size)
{
    struct im_entry *e;
    int rc = lookup(self, name, &e);
    if (rc == 0)
        *size = e->raw;
    return rc;
}

static int im_read(void *self, const char *name, uint64_t offset, void *buf, size_t len, size_t *got)
{
    struct im *m = self;
    struct im_entry *e;
    *got = 0;
    int rc = lookup(m, name, &e);
    if (rc < 0)
        return rc;
    if (offset >= e->raw)
        return 0;
    if (len > e->raw - offset)
        len = (size_t)(e->raw - offset);
    if (!e->boff) {
        memcpy(buf, e->data + offset, len);
    } else {
        uint8_t *tmp = NULL;
        size_t done = 0;
        while (done < len) {
            uint64_t at = offset + done;
            uint32_t b = (uint32_t)(at / e->block);
            uint64_t bstart = (uint64_t)b * e->block;
            size_t braw = (size_t)(e->raw - bstart < e->block ? e->raw - bstart : e->block);
            size_t in = (size_t)(at - bstart), k = braw - in < len - done ? braw - in : len - done;
            uint8_t *dst = (uint8_t *)buf + done;
            bool whole = in == 0 && k == braw;
            if (!whole && !tmp && !(tmp = malloc(e->block)))
                return ghc_error_set(m->core, GHC_ENOMEM, "in_memory: out of memory");
            if (codec_decompress(e->codec, e->data + e->boff[b], (size_t)(e->boff[b + 1] - e->boff[b]),
                                 whole ? dst : tmp, braw) < 0) {
                free(tmp);
                return ghc_error_set(m->core, GHC_EFORMAT, "in_memory: %s: block %u of %u is corrupt (%s: cannot decode)",
                                     e->path, b, e->nb, ghc_compression_name(e->codec));
            }
            if (!whole)
                memcpy(dst, tmp + in, k);
            done += k;
        }
        free(tmp);
    }
    __atomic_add_fetch(&m->reads, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&m->read_bytes, len, __ATOMIC_RELAXED);
    *got = len;
    return 0;
}

static int im_map(void *self, const char *name, const void **data, uint64_t *size)
{
    struct im *m = self;
    struct im_entry *e;
    int rc = lookup(m, name, &e);
    if (rc < 0)
        return rc;
    if (e->boff)
        return GHC_EUNSUPPORTED;
    __atomic_add_fetch(&m->reads, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&m->read_bytes, e->raw, __ATOMIC_RELAXED);
    *data = e->data;
    *size = e->raw;
    return 0;
}

static int im_stats(void *self, struct ghc_backend_stats *out)
{
    struct im *m = self;
    out->files = m->n;
    out->raw_bytes = m->raw;
    out->stored_bytes = m->stored;
    out->stage_seconds = m->stage_s;
    out->reads = __atomic_load_n(&m->reads, __ATOMIC_RELAXED);
    out->read_bytes = __atomic_load_n(&m->read_bytes, __ATOMIC_RELAXED);
    return 0;
}

static const struct ghc_backend_ops im_ops = {
    .struct_size = sizeof(struct ghc_backend_ops),
    .name = "in_memory",
    .keys = im_keys,
    .init = im_init,
    .mount = im_mount,
    .list = im_list,
    .stat = im_stat,
    .read = im_read,
    .map = im_map,
    .stats = im_stats,
    .free = im_free,
};

static int im_plugin_init(ghc_core_t *core) { return ghc_register_backend(core, &im_ops); }

GHC_PLUGIN_EXPORT const struct ghc_plugin ghc_plugin_in_memory = {
    .abi = GHC_PLUGIN_ABI,
    .api = GHC_API_VERSION,
    .struct_size = sizeof(struct ghc_plugin),
    .kinds = GHC_KIND_BIT(GHC_KIND_BACKEND),
    .name = "in_memory",
    .version = GHC_VERSION,
    .description = "stages every dataset file into RAM (threads; none, lz4, zlib or snappy per dataset)",
    .init = im_plugin_init,
};
