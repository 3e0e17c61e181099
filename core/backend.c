/* backend.c: the core wrappers of the run's backend instance (backend.h), private instances
 * for the dataset's fallback, and the `local` backend itself: dataset directories read with
 * pread(), entries named "<root index>/<relative path>". The `local` plugin registers the
 * table defined here, and the dataset uses it directly when no backend is configured. */
#include <config.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core_impl.h"

#define B_INST(b) ((struct ghc_instance *)(b))
#define B_OPS(b)  ((const struct ghc_backend_ops *)B_INST(b)->ops)
#define B_SELF(b) (B_INST(b)->self)

/* ---- compression names ---------------------------------------------------------------------- */

static const char *const compression_names[GHC_COMPRESSION_COUNT] = { "none", "lz4", "zlib", "snappy" };

const char *ghc_compression_name(enum ghc_compression c)
{
    return (unsigned)c < GHC_COMPRESSION_COUNT ? compression_names[c] : "?";
}

bool ghc_compression_from_name(const char *name, enum ghc_compression *out)
{
    for (int i = 0; i < GHC_COMPRESSION_COUNT; i++)
        if (strcmp(name, compression_names[i]) == 0) {
            *out = (enum ghc_compression)i;
            return true;
        }
    return false;
}

/* ---- wrappers ------------------------------------------------------------------------------- */

/* A wrapper's call starts here: the error buffer cleared (a successful call leaves it empty);
 * returns the point from which the member's own message counts (ghc_error_member). */
static uint64_t begin(ghc_backend_t *b)
{
    ghc_error_clear(B_INST(b)->core);
    return ghc_error_seq(B_INST(b)->core);
}

static int failed(ghc_backend_t *b, uint64_t seq, int rc, const char *what, const char *name)
{
    return ghc_error_member(B_INST(b)->core, seq, rc, "backend", B_OPS(b)->name, what, name);
}

const char *ghc_backend_name(const ghc_backend_t *b) { return B_OPS(b)->name; }

int ghc_backend_mount(ghc_backend_t *b, const struct ghc_backend_root *roots, int32_t n)
{
    uint64_t seq = begin(b);
    return failed(b, seq, B_OPS(b)->mount(B_SELF(b), roots, n), "mount", NULL);
}

int ghc_backend_list(ghc_backend_t *b, const char *prefix, ghc_backend_visit_fn visit, void *user)
{
    uint64_t seq = begin(b);
    return failed(b, seq, B_OPS(b)->list(B_SELF(b), prefix, visit, user), "list", prefix);
}

int ghc_backend_stat(ghc_backend_t *b, const char *name, uint64_t *size)
{
    uint64_t seq = begin(b);
    return failed(b, seq, B_OPS(b)->stat(B_SELF(b), name, size), "stat", name);
}

int ghc_backend_read(ghc_backend_t *b, const char *name, uint64_t offset, void *buf, size_t len,
                     size_t *got)
{
    uint64_t seq = begin(b);
    return failed(b, seq, B_OPS(b)->read(B_SELF(b), name, offset, buf, len, got), "read", name);
}

/* GHC_EUNSUPPORTED, with or without a message, is no failure: the entry is to be read. */
int ghc_backend_map(ghc_backend_t *b, const char *name, const void **data, uint64_t *size)
{
    if (!B_OPS(b)->map)
        return GHC_EUNSUPPORTED;
    uint64_t seq = ghc_error_seq(B_INST(b)->core);
    int rc = B_OPS(b)->map(B_SELF(b), name, data, size);
    return rc == GHC_EUNSUPPORTED ? rc : failed(b, seq, rc, "map", name);
}

int ghc_backend_write(ghc_backend_t *b, const char *name, const void *buf, size_t len)
{
    if (!B_OPS(b)->write)
        return ghc_error_set(B_INST(b)->core, GHC_EUNSUPPORTED, "backend \"%s\" is read-only: cannot write %s",
                             B_OPS(b)->name, name);
    uint64_t seq = begin(b);
    return failed(b, seq, B_OPS(b)->write(B_SELF(b), name, buf, len), "write", name);
}

int ghc_backend_stats(ghc_backend_t *b, struct ghc_backend_stats *out)
{
    memset(out, 0, sizeof(*out));
    out->struct_size = sizeof(*out);
    if (!B_OPS(b)->stats)
        return 0;
    uint64_t seq = ghc_error_seq(B_INST(b)->core);
    return failed(b, seq, B_OPS(b)->stats(B_SELF(b), out), "stats", NULL);
}

int ghc_backend_fetch(ghc_backend_t *b, const char *name, uint64_t max, const void **data,
                      void **owned, size_t *len, uint64_t *size)
{
    *data = NULL;
    *owned = NULL;
    *len = 0;
    const void *m;
    uint64_t sz;
    int rc = ghc_backend_map(b, name, &m, &sz);
    if (rc == 0) {
        *data = m;
        *size = sz;
        *len = (size_t)(max && max < sz ? max : sz);
        return 0;
    }
    if (rc != GHC_EUNSUPPORTED)
        return rc;
    if ((rc = ghc_backend_stat(b, name, &sz)) < 0)
        return rc;
    uint64_t want = max && max < sz ? max : sz;
    if (want > SIZE_MAX - 1)
        return ghc_error_set(B_INST(b)->core, GHC_ENOMEM, "%s: %" PRIu64 " bytes is too large", name, sz);
    void *buf = malloc(want ? (size_t)want : 1);
    if (!buf)
        return ghc_error_set(B_INST(b)->core, GHC_ENOMEM, "%s: out of memory for %" PRIu64 " bytes", name, want);
    size_t got = 0;
    if ((rc = ghc_backend_read(b, name, 0, buf, (size_t)want, &got)) < 0) {
        free(buf);
        return rc;
    }
    if (got != want) {
        free(buf);
        return ghc_error_set(B_INST(b)->core, GHC_EIO, "%s: read %zu of %" PRIu64 " bytes (changed while reading?)",
                             name, got, want);
    }
    *data = buf;
    *owned = buf;
    *len = got;
    *size = sz;
    return 0;
}

/* ---- private instances ------------------------------------------------------------------------ */

ghc_backend_t *ghc_backend_init(ghc_core_t *core, const struct ghc_backend_ops *ops, ghc_cfg_t *cfg)
{
    struct ghc_instance *in = calloc(1, sizeof(*in));
    if (!in) {
        ghc_error_set(core, GHC_ENOMEM, "backend: out of memory");
        return NULL;
    }
    *in = (struct ghc_instance){ .core = core, .kind = GHC_KIND_BACKEND, .ops = ops, .cfg = cfg,
                                 .free = ops->free };
    ghc_error_clear(core);
    uint64_t seq = ghc_error_seq(core);
    int rc = ops->init(core, cfg, &in->self);
    if (rc < 0) {
        ghc_error_member(core, seq, rc, "backend", ops->name, "init", NULL);
        free(in);
        return NULL;
    }
    return (ghc_backend_t *)in;
}

void ghc_backend_free(ghc_backend_t *b)
{
    if (!b)
        return;
    if (B_INST(b)->free)
        B_INST(b)->free(B_SELF(b));
    free(b);
}

/* ---- the `local` backend ------------------------------------------------------------------------ */

struct local {
    ghc_core_t *core;
    char      **roots;
    int32_t     n_roots;
    /* counters, updated without a lock: statistics, not accounting */
    uint64_t    reads, read_bytes;
};

struct local_entry {
    char    *name;
    uint64_t size;
};

struct local_list {
    struct local_entry *e;
    size_t              n, cap;
};

static int local_init(ghc_core_t *core, ghc_cfg_t *cfg, void **self)
{
    (void)cfg;
    struct local *l = calloc(1, sizeof(*l));
    if (!l)
        return ghc_error_set(core, GHC_ENOMEM, "local: out of memory");
    l->core = core;
    *self = l;
    return 0;
}

static void local_free(void *self)
{
    struct local *l = self;
    if (!l)
        return;
    for (int32_t i = 0; i < l->n_roots; i++)
        free(l->roots[i]);
    free(l->roots);
    free(l);
}

static int local_mount(void *self, const struct ghc_backend_root *roots, int32_t n)
{
    struct local *l = self;
    if (l->roots)
        return ghc_error_set(l->core, GHC_EINVAL, "local: mounted twice");
    if (!(l->roots = calloc(n > 0 ? (size_t)n : 1, sizeof(*l->roots))))
        return ghc_error_set(l->core, GHC_ENOMEM, "local: out of memory");
    for (int32_t i = 0; i < n; i++) {
        struct stat st;
        if (stat(roots[i].path, &st) != 0)
            return ghc_error_set(l->core, GHC_EIO, "local: dataset %d: %s: %s", (int)i, roots[i].path, strerror(errno));
        if (!S_ISDIR(st.st_mode))
            return ghc_error_set(l->core, GHC_EIO, "local: dataset %d: %s: not a directory", (int)i, roots[i].path);
        if (!(l->roots[i] = ghc_strdup(roots[i].path)))
            return ghc_error_set(l->core, GHC_ENOMEM, "local: out of memory");
        l->n_roots = i + 1;
    }
    return 0;
}

/* Split "3/a/b" into root 3 and "a/b"; false for a malformed name or one that would leave the
 * root (empty, "." or ".." components, a leading '/'). */
static bool split_name(const char *name, int32_t n_roots, int32_t *root, const char **rel)
{
    char *end;
    errno = 0;
    long r = strtol(name, &end, 10);
    if (end == name || *end != '/' || errno || r < 0 || r >= n_roots || name[0] == '+' || name[0] == '-')
        return false;
    const char *p = end + 1;
    for (const char *c = p;;) {
        const char *slash = strchr(c, '/');
        size_t len = slash ? (size_t)(slash - c) : strlen(c);
        if (len == 0 || (c[0] == '.' && (len == 1 || (len == 2 && c[1] == '.'))))
            return false;
        if (!slash)
            break;
        c = slash + 1;
    }
    *root = (int32_t)r;
    *rel = p;
    return true;
}

static int local_path(struct local *l, const char *name, char *buf, size_t n)
{
    int32_t root;
    const char *rel;
    if (!split_name(name, l->n_roots, &root, &rel))
        return ghc_error_set(l->core, GHC_ENOTFOUND, "local: %s: not an entry name (\"<dataset index>/<path>\", %d datasets)",
                             name, (int)l->n_roots);
    if ((size_t)snprintf(buf, n, "%s/%s", l->roots[root], rel) >= n)
        return ghc_error_set(l->core, GHC_EINVAL, "local: %s: path too long", name);
    return 0;
}

static int list_add(struct local *l, struct local_list *ls, const char *name, uint64_t size)
{
    if (ls->n == ls->cap) {
        size_t cap = ls->cap ? ls->cap * 2 : 256;
        struct local_entry *e = realloc(ls->e, cap * sizeof(*e));
        if (!e)
            return ghc_error_set(l->core, GHC_ENOMEM, "local: out of memory listing");
        ls->e = e;
        ls->cap = cap;
    }
    if (!(ls->e[ls->n].name = ghc_strdup(name)))
        return ghc_error_set(l->core, GHC_ENOMEM, "local: out of memory listing");
    ls->e[ls->n++].size = size;
    return 0;
}

/* Every regular file under dir (path on disk) as "<name prefix>/<relative path>". */
static int walk(struct local *l, struct local_list *ls, const char *dir, const char *name, int depth)
{
    if (depth > 32)
        return ghc_error_set(l->core, GHC_EIO, "local: %s: folders nested deeper than 32", dir);
    DIR *d = opendir(dir);
    if (!d)
        return ghc_error_set(l->core, GHC_EIO, "local: %s: cannot list: %s", dir, strerror(errno));
    int rc = 0;
    struct dirent *de;
    char path[4096], ename[4096];
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, de->d_name) >= sizeof(path) ||
            (size_t)snprintf(ename, sizeof(ename), "%s/%s", name, de->d_name) >= sizeof(ename)) {
            rc = ghc_error_set(l->core, GHC_EINVAL, "local: %s/%s: path too long", dir, de->d_name);
            break;
        }
        struct stat st;
        if (stat(path, &st) != 0) {
            rc = ghc_error_set(l->core, GHC_EIO, "local: %s: cannot stat: %s", path, strerror(errno));
            break;
        }
        if (S_ISDIR(st.st_mode))
            rc = walk(l, ls, path, ename, depth + 1);
        else if (S_ISREG(st.st_mode))
            rc = list_add(l, ls, ename, (uint64_t)st.st_size);
        if (rc < 0)
            break;
    }
    closedir(d);
    return rc;
}

static int cmp_entry(const void *a, const void *b)
{
    return strcmp(((const struct local_entry *)a)->name, ((const struct local_entry *)b)->name);
}

static int local_list(void *self, const char *prefix, ghc_backend_visit_fn visit, void *user)
{
    struct local *l = self;
    struct local_list ls = { 0 };
    int rc = 0;
    for (int32_t r = 0; r < l->n_roots && rc == 0; r++) {
        char rname[16];
        snprintf(rname, sizeof(rname), "%d", (int)r);
        size_t rl = strlen(rname), pl = strlen(prefix);
        /* the root's names start "r/": skip roots the prefix excludes */
        if (pl && strncmp(prefix, rname, pl < rl ? pl : rl) != 0)
            continue;
        if (pl > rl && prefix[rl] != '/')
            continue;
        rc = walk(l, &ls, l->roots[r], rname, 0);
    }
    if (rc == 0 && ls.n)   /* nothing listed: e is NULL, and qsort(NULL, 0, ...) is undefined */
        qsort(ls.e, ls.n, sizeof(*ls.e), cmp_entry);
    size_t pl = strlen(prefix);
    for (size_t i = 0; i < ls.n && rc == 0; i++)
        if (strncmp(ls.e[i].name, prefix, pl) == 0)
            rc = visit(user, ls.e[i].name, ls.e[i].size);
    for (size_t i = 0; i < ls.n; i++)
        free(ls.e[i].name);
    free(ls.e);
    return rc;
}

static int local_stat(void *self, const char *name, uint64_t *size)
{
    struct local *l = self;
    char path[4096];
    int rc = local_path(l, name, path, sizeof(path));
    if (rc < 0)
        return rc;
    struct stat st;
    if (stat(path, &st) != 0)
        return ghc_error_set(l->core, errno == ENOENT ? GHC_ENOTFOUND : GHC_EIO, "local: %s: %s", path,
                             strerror(errno));
    if (!S_ISREG(st.st_mode))
        return ghc_error_set(l->core, GHC_EIO, "local: %s: not a regular file", path);
    *size = (uint64_t)st.st_size;
    return 0;
}

static int local_read(void *self, const char *name, uint64_t offset, void *buf, size_t len, size_t *got)
{
    struct local *l = self;
    char path[4096];
    *got = 0;
    int rc = local_path(l, name, path, sizeof(path));
    if (rc < 0)
        return rc;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ghc_error_set(l->core, errno == ENOENT ? GHC_ENOTFOUND : GHC_EIO, "local: %s: cannot open: %s",
                             path, strerror(errno));
    size_t done = 0;
    while (done < len) {
        ssize_t k = pread(fd, (char *)buf + done, len - done, (off_t)(offset + done));
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            rc = ghc_error_set(l->core, GHC_EIO, "local: %s: cannot read: %s", path, strerror(errno));
            break;
        }
        if (k == 0)
            break;
        done += (size_t)k;
    }
    close(fd);
    __atomic_add_fetch(&l->reads, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&l->read_bytes, done, __ATOMIC_RELAXED);
    *got = done;
    return rc;
}

static int local_write(void *self, const char *name, const void *buf, size_t len)
{
    struct local *l = self;
    char path[4096], tmp[4200];
    int rc = local_path(l, name, path, sizeof(path));
    if (rc < 0)
        return rc;
    /* create missing folders below the root */
    int32_t root;
    const char *rel;
    split_name(name, l->n_roots, &root, &rel);
    for (char *s = strchr(path + strlen(l->roots[root]) + 1, '/'); s; s = strchr(s + 1, '/')) {
        *s = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            rc = ghc_error_set(l->core, GHC_EIO, "local: %s: cannot create: %s", path, strerror(errno));
        *s = '/';
        if (rc < 0)
            return rc;
    }
    snprintf(tmp, sizeof(tmp), "%s.tmp.XXXXXX", path);
    int fd = mkstemp(tmp);
    if (fd < 0)
        return ghc_error_set(l->core, GHC_EIO, "local: %s: cannot create: %s", tmp, strerror(errno));
    size_t done = 0;
    while (done < len && rc == 0) {
        ssize_t k = write(fd, (const char *)buf + done, len - done);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            rc = ghc_error_set(l->core, GHC_EIO, "local: %s: cannot write: %s", tmp, strerror(errno));
        else
            done += (size_t)k;
    }
    if (rc == 0 && fchmod(fd, 0644) != 0)
        rc = ghc_error_set(l->core, GHC_EIO, "local: %s: %s", tmp, strerror(errno));
    if (close(fd) != 0 && rc == 0)
        rc = ghc_error_set(l->core, GHC_EIO, "local: %s: cannot write: %s", tmp, strerror(errno));
    if (rc == 0 && rename(tmp, path) != 0)
        rc = ghc_error_set(l->core, GHC_EIO, "local: %s: cannot rename to %s: %s", tmp, path, strerror(errno));
    if (rc < 0)
        unlink(tmp);
    return rc;
}

static int local_stats(void *self, struct ghc_backend_stats *out)
{
    struct local *l = self;
    out->reads = __atomic_load_n(&l->reads, __ATOMIC_RELAXED);
    out->read_bytes = __atomic_load_n(&l->read_bytes, __ATOMIC_RELAXED);
    return 0;
}

static const struct ghc_backend_ops local_ops = {
    .struct_size = sizeof(struct ghc_backend_ops),
    .name = "local",
    .init = local_init,
    .mount = local_mount,
    .list = local_list,
    .stat = local_stat,
    .read = local_read,
    .write = local_write,
    .stats = local_stats,
    .free = local_free,
};

const struct ghc_backend_ops *ghc_backend_local_ops(void) { return &local_ops; }
