/* dist.c: the rank of this process, the TCP rendezvous and its control channel (dist.h). POSIX
 * sockets only.
 *
 * The channel is a star: rank 0 holds one connection to every other rank. A message is a type
 * byte, three zero bytes and a 32-bit big-endian length, then the payload:
 *   'H' hello (rank -> 0): magic, version, rank, world (u32 each), fingerprint (u64)
 *   'K' the blob (0 -> rank), 'D' data of a collective, 'A' abort with its reason as text.
 * A closed connection is read as the death of the rank at the other end and reported. */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <gh200core/run.h>

#include "dist.h"

/* ---- ranks from the environment ----------------------------------------------------------- */

static const char *env_get(const char *const *envp, const char *name)
{
    size_t n = strlen(name);
    for (; envp && *envp; envp++)
        if (strncmp(*envp, name, n) == 0 && (*envp)[n] == '=')
            return *envp + n + 1;
    return NULL;
}

/* A decimal integer in [lo, hi] from variable `name`. */
static int env_int(ghc_core_t *core, const char *const *envp, const char *name, const char *launcher, long lo,
                   long hi, int *v)
{
    const char *s = env_get(envp, name);
    char *end;
    errno = 0;
    long x = s && *s >= '0' && *s <= '9' ? strtol(s, &end, 10) : -1;
    if (!s || x < 0 || errno || *end)
        return ghc_error_set(core, GHC_EINVAL, "dist: %s=%s%s%s (%s): expected a whole number", name, s ? "'" : "",
                             s ? s : "(unset)", s ? "'" : "", launcher);
    if (x < lo || x > hi)
        return ghc_error_set(core, GHC_EINVAL, "dist: %s=%ld (%s): expected %ld to %ld", name, x, launcher, lo, hi);
    *v = (int)x;
    return 0;
}

int ghc_dist_first_host(const char *nodelist, char *out, size_t len)
{
    size_t k = 0;
    bool in = false, skip = false;
    for (const char *c = nodelist; *c; c++) {
        if (!in && *c == ',')
            break;
        if (*c == '[') {
            if (in)
                return -1;
            in = true, skip = false;
            continue;
        }
        if (*c == ']') {
            if (!in)
                return -1;
            in = skip = false;
            continue;
        }
        if (in && (*c == '-' || *c == ','))
            skip = true;   /* the first number of the range is the first host's */
        if (skip)
            continue;
        if (k + 1 >= len)
            return -1;
        out[k++] = *c;
    }
    if (in || k == 0)
        return -1;
    out[k] = '\0';
    return 0;
}

/* rank 0's address: MASTER_ADDR, else (Slurm) the first node of the job. */
static int env_addr(ghc_core_t *core, const char *const *envp, struct ghc_dist *d)
{
    const char *a = env_get(envp, "MASTER_ADDR");
    if (a && *a) {
        if (strlen(a) >= sizeof(d->addr))
            return ghc_error_set(core, GHC_EINVAL, "dist: MASTER_ADDR is longer than %zu characters",
                                 sizeof(d->addr) - 1);
        snprintf(d->addr, sizeof(d->addr), "%s", a);
        return 0;
    }
    if (strcmp(d->launcher, "Slurm") == 0) {
        const char *name = env_get(envp, "SLURM_JOB_NODELIST") ? "SLURM_JOB_NODELIST" : "SLURM_NODELIST";
        const char *list = env_get(envp, name);
        if (!list)
            return ghc_error_set(core, GHC_EINVAL, "dist: SLURM_NTASKS=%d but neither MASTER_ADDR nor "
                                 "SLURM_JOB_NODELIST names rank 0's host", d->world);
        if (ghc_dist_first_host(list, d->addr, sizeof(d->addr)) < 0)
            return ghc_error_set(core, GHC_EINVAL, "dist: %s='%s': cannot read its first host; set MASTER_ADDR",
                                 name, list);
        return 0;
    }
    return ghc_error_set(core, GHC_EINVAL, "dist: %s gives %d ranks but MASTER_ADDR is not set (rank 0's host%s)",
                         d->launcher, d->world,
                         strcmp(d->launcher, "Open MPI") == 0 ? ", e.g. mpirun -x MASTER_ADDR=$(hostname)" : "");
}

int ghc_dist_from_env(ghc_core_t *core, const char *const *envp, struct ghc_dist *d)
{
    static const struct {
        const char *launcher, *rank, *world, *local;
    } srcs[] = {
        { "torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK" },
        { "Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK" },
        { "Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID" },
    };
    *d = (struct ghc_dist){ .world = 1, .port = GHC_DIST_PORT, .launcher = "none", .timeout = GHC_DIST_TIMEOUT };
    int rc, i, n = (int)(sizeof(srcs) / sizeof(srcs[0]));
    for (i = 0; i < n; i++)
        if (env_get(envp, srcs[i].rank) || env_get(envp, srcs[i].world))
            break;
    if (i == n)
        return 0;
    d->launcher = srcs[i].launcher;
    if ((rc = env_int(core, envp, srcs[i].world, d->launcher, 1, 1 << 20, &d->world)) < 0 ||
        (rc = env_int(core, envp, srcs[i].rank, d->launcher, 0, 1 << 20, &d->rank)) < 0)
        return rc;
    if (d->rank >= d->world)
        return ghc_error_set(core, GHC_EINVAL, "dist: %s=%d is not below %s=%d (%s)", srcs[i].rank, d->rank,
                             srcs[i].world, d->world, d->launcher);
    d->local_rank = d->rank;   /* one node, when the launcher does not say */
    if (env_get(envp, srcs[i].local) &&
        (rc = env_int(core, envp, srcs[i].local, d->launcher, 0, d->world - 1, &d->local_rank)) < 0)
        return rc;
    if (env_get(envp, "MASTER_PORT") && (rc = env_int(core, envp, "MASTER_PORT", d->launcher, 1, 65535, &d->port)) < 0)
        return rc;
    const char *t = env_get(envp, "GHC_DIST_TIMEOUT");
    if (t) {
        char *end;
        d->timeout = strtod(t, &end);
        if (end == t || *end || !(d->timeout > 0.0 && d->timeout <= 1e6))
            return ghc_error_set(core, GHC_EINVAL, "dist: GHC_DIST_TIMEOUT='%s': expected seconds > 0", t);
    }
    return d->world > 1 ? env_addr(core, envp, d) : 0;
}

/* ---- fingerprint ------------------------------------------------------------------------------ */

uint64_t ghc_dist_hash(const void *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ ((const unsigned char *)p)[i]) * 0x100000001b3ull;
    return h;
}

int ghc_dist_config_fingerprint(ghc_core_t *core, uint64_t *fp)
{
    char path[] = "/tmp/ghc-fingerprint-XXXXXX";
    int fd = mkstemp(path), rc = 0;
    if (fd < 0)
        return ghc_error_set(core, GHC_EIO, "dist: cannot write a temporary file for the configuration's "
                             "fingerprint: %s", strerror(errno));
    close(fd);
    if ((rc = ghc_config_write(core, path)) == 0) {
        FILE *f = fopen(path, "rb");
        char buf[65536];
        size_t n;
        uint64_t h = 0;
        while (f && (n = fread(buf, 1, sizeof(buf), f)) > 0)
            h = ghc_dist_hash(buf, n) ^ (h * 31);
        if (!f)
            rc = ghc_error_set(core, GHC_EIO, "dist: %s: %s", path, strerror(errno));
        else
            fclose(f);
        *fp = h;
    }
    unlink(path);
    return rc;
}

/* ---- messages ------------------------------------------------------------------------------- */

#define PROTO_MAGIC   0x47484344u   /* "GHCD" */
#define PROTO_VERSION 1u
#define MSG_MAX (1u << 20)

struct ghc_dist_comm {
    ghc_core_t *core;
    int         rank, world;
    int        *fd;   /* rank 0: fd[r] to rank r (fd[0] unused); others: fd[0] to rank 0 */
    /* the watch (ghc_dist_watch): a thread, and the pipe that ends it */
    pthread_t   watcher;
    int         wake[2];
    bool        watching;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Milliseconds to `deadline` for poll (-1: none). */
static int ms_left(double deadline)
{
    if (deadline < 0)
        return -1;
    double ms = (deadline - now_s()) * 1e3;
    return ms <= 0 ? 0 : ms > 1e9 ? 1000000000 : (int)ms + 1;
}

/* 0, -1 (errno; EPIPE when the peer closed), or -2 (deadline passed). */
static int io_full(int fd, void *buf, size_t n, bool out, double deadline)
{
    char *p = buf;
    while (n) {
        struct pollfd pf = { .fd = fd, .events = out ? POLLOUT : POLLIN };
        int r = poll(&pf, 1, ms_left(deadline));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -1;
        if (r == 0)
            return -2;
        ssize_t k = out ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (k <= 0) {
            if (k == 0 || errno == ECONNRESET)
                errno = EPIPE;
            return -1;
        }
        p += k, n -= (size_t)k;
    }
    return 0;
}

static void put32(unsigned char *b, uint32_t v)
{
    b[0] = (unsigned char)(v >> 24), b[1] = (unsigned char)(v >> 16), b[2] = (unsigned char)(v >> 8);
    b[3] = (unsigned char)v;
}

static uint32_t get32(const unsigned char *b)
{
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
}

static int msg_send(int fd, char type, const void *p, size_t n)
{
    unsigned char h[8] = { (unsigned char)type };
    put32(h + 4, (uint32_t)n);
    return io_full(fd, h, 8, true, -1) < 0 || (n && io_full(fd, (void *)p, n, true, -1) < 0) ? -1 : 0;
}

/* A message of at most cap bytes (the rest of a longer one is dropped: -3). 0, -1 (errno), -2
 * (deadline), -3 (too long). */
static int msg_recv(int fd, char *type, void *p, size_t cap, size_t *n, double deadline)
{
    unsigned char h[8];
    int rc = io_full(fd, h, 8, false, deadline);
    if (rc < 0)
        return rc;
    uint32_t len = get32(h + 4);
    if (len > MSG_MAX)
        return -3;
    *type = (char)h[0];
    *n = len < cap ? len : cap;
    if ((rc = io_full(fd, p, *n, false, deadline)) < 0)
        return rc;
    for (uint32_t k = (uint32_t)*n; k < len; k++) {
        unsigned char c;
        if ((rc = io_full(fd, &c, 1, false, deadline)) < 0)
            return rc;
    }
    return len > cap ? -3 : 0;
}

/* ---- the rendezvous ------------------------------------------------------------------------- */

static ghc_dist_comm_t *comm_new(ghc_core_t *core, const struct ghc_dist *d)
{
    ghc_dist_comm_t *c = calloc(1, sizeof(*c));
    if (c && !(c->fd = malloc((size_t)d->world * sizeof(int)))) {
        free(c);
        c = NULL;
    }
    if (!c) {
        ghc_error_set(core, GHC_ENOMEM, "dist: out of memory");
        return NULL;
    }
    c->core = core, c->rank = d->rank, c->world = d->world;
    for (int r = 0; r < d->world; r++)
        c->fd[r] = -1;
    return c;
}

void ghc_dist_comm_free(ghc_dist_comm_t *c)
{
    if (!c)
        return;
    ghc_dist_watch(c, false);
    for (int r = 0; r < c->world; r++)
        if (c->fd[r] >= 0)
            close(c->fd[r]);
    free(c->fd);
    free(c);
}

/* Rank 0 tells every connected rank that the rendezvous is off, and why. */
static void give_up(ghc_dist_comm_t *c, const char *reason)
{
    for (int r = 1; r < c->world; r++)
        if (c->fd[r] >= 0)
            msg_send(c->fd[r], 'A', reason, strlen(reason));
}

static int listen_on(ghc_core_t *core, const struct ghc_dist *d, int *out)
{
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE }, *res;
    char port[16];
    snprintf(port, sizeof(port), "%d", d->port);
    int e = getaddrinfo(NULL, port, &hints, &res), fd = -1, err = 0;
    if (e)
        return ghc_error_set(core, GHC_EIO, "dist: rank 0: port %s: %s", port, gai_strerror(e));
    /* IPv4 first: the wildcard of the family most clusters route */
    for (int pass = 0; pass < 2 && fd < 0; pass++)
        for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
            if ((a->ai_family == AF_INET) != (pass == 0))
                continue;
            int one = 1;
            fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
            if (fd >= 0 && (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
                            bind(fd, a->ai_addr, a->ai_addrlen) < 0 || listen(fd, 128) < 0)) {
                err = errno;
                close(fd);
                fd = -1;
            }
        }
    freeaddrinfo(res);
    if (fd < 0)
        return ghc_error_set(core, GHC_EIO, "dist: rank 0 cannot listen on port %d: %s (another run there? set "
                             "MASTER_PORT)", d->port, strerror(err));
    *out = fd;
    return 0;
}

/* The ranks that have not come, as "2, 5, 7" (the first 16, then a count). */
static void missing_list(const ghc_dist_comm_t *c, char *buf, size_t len)
{
    size_t at = 0;
    int n = 0;
    buf[0] = '\0';
    for (int r = 1; r < c->world; r++)
        if (c->fd[r] < 0 && ++n <= 16 && at < len)
            at += (size_t)snprintf(buf + at, len - at, "%s%d", n > 1 ? ", " : "", r);
    if (n > 16 && at < len)
        snprintf(buf + at, len - at, " and %d more", n - 16);
}

/* Read one hello and check it against rank 0's own; a rank taken into c->fd. 1: a stray
 * connection (dropped); 0 taken; <0 the rendezvous fails (rank 0's message set). */
static int take_hello(ghc_dist_comm_t *c, int fd, uint64_t fp, double deadline)
{
    ghc_core_t *core = c->core;
    unsigned char h[24];
    char type;
    size_t n;
    double d10 = now_s() + 10.0;
    if (msg_recv(fd, &type, h, sizeof(h), &n, d10 < deadline ? d10 : deadline) < 0 || type != 'H' || n != 24 ||
        get32(h) != PROTO_MAGIC)
        return 1;
    uint32_t version = get32(h + 4), rank = get32(h + 8), world = get32(h + 12);
    uint64_t theirs = (uint64_t)get32(h + 16) << 32 | get32(h + 20);
    int rc = 0;
    if (version != PROTO_VERSION)
        rc = ghc_error_set(core, GHC_EINVAL, "dist: rank %u speaks rendezvous version %u, rank 0 %u (two builds of "
                           "gh200core?)", rank, version, PROTO_VERSION);
    else if ((int)world != c->world)
        rc = ghc_error_set(core, GHC_EINVAL, "dist: rank %u says the world size is %u, rank 0 says %d: every rank "
                           "needs the same WORLD_SIZE", rank, world, c->world);
    else if (rank < 1 || (int)rank >= c->world)
        rc = ghc_error_set(core, GHC_EINVAL, "dist: a process says it is rank %u of %d", rank, c->world);
    else if (c->fd[rank] >= 0)
        rc = ghc_error_set(core, GHC_EINVAL, "dist: two processes say they are rank %u (a rank started twice?)", rank);
    else if (theirs != fp)
        rc = ghc_error_set(core, GHC_EINVAL, "dist: rank %u's configuration differs from rank 0's (fingerprint "
                           "%016llx, rank 0 %016llx): every rank must run the same configuration and --set",
                           rank, (unsigned long long)theirs, (unsigned long long)fp);
    if (rc < 0) {
        const char *m = ghc_error_message(core) + 6;   /* without "dist: " */
        msg_send(fd, 'A', m, strlen(m));
        return rc;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    c->fd[rank] = fd;
    return 0;
}

static int rendezvous_root(ghc_dist_comm_t *c, const struct ghc_dist *d, uint64_t fp, const void *blob,
                           size_t blob_len)
{
    ghc_core_t *core = c->core;
    int lfd = -1, rc, got = 0;
    if ((rc = listen_on(core, d, &lfd)) < 0)
        return rc;
    double deadline = now_s() + d->timeout;
    while (got < c->world - 1) {
        struct pollfd pf = { .fd = lfd, .events = POLLIN };
        int r = poll(&pf, 1, ms_left(deadline));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            char miss[256];
            missing_list(c, miss, sizeof(miss));
            rc = ghc_error_set(core, GHC_EIO, "dist: rank%s %s never came to %s:%d within %g s (%d of %d ranks came)",
                               c->world - 1 - got > 1 ? "s" : "", miss, d->addr, d->port, d->timeout, got + 1, c->world);
            give_up(c, ghc_error_message(core) + 6);
            break;
        }
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0)
            continue;
        if ((rc = take_hello(c, fd, fp, deadline)) != 0) {
            close(fd);
            if (rc < 0) {
                give_up(c, ghc_error_message(core) + 6);
                break;
            }
            rc = 0;
            continue;
        }
        got++;
    }
    close(lfd);
    for (int r = 1; r < c->world && rc == 0; r++)
        if (msg_send(c->fd[r], 'K', blob, blob_len) < 0)
            rc = ghc_error_set(core, GHC_EIO, "dist: rank %d closed its connection during the rendezvous", r);
    return rc;
}

/* Connect to rank 0, retrying until the deadline. */
static int connect_root(ghc_core_t *core, const struct ghc_dist *d, double deadline, int *out)
{
    char port[16], why[256] = "no attempt";
    snprintf(port, sizeof(port), "%d", d->port);
    for (;;) {
        struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM }, *res;
        int e = getaddrinfo(d->addr, port, &hints, &res);
        if (e)
            snprintf(why, sizeof(why), "%s", gai_strerror(e));
        for (struct addrinfo *a = e ? NULL : res; a; a = a->ai_next) {
            int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
            if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
                freeaddrinfo(res);
                *out = fd;
                return 0;
            }
            snprintf(why, sizeof(why), "%s", strerror(errno));
            if (fd >= 0)
                close(fd);
        }
        if (!e)
            freeaddrinfo(res);
        if (now_s() >= deadline)
            return ghc_error_set(core, GHC_EIO, "dist: rank %d could not reach rank 0 at %s:%d within %g s (%s): is "
                                 "rank 0 running, MASTER_ADDR and MASTER_PORT right?", d->rank, d->addr, d->port,
                                 d->timeout, why);
        nanosleep(&(struct timespec){ .tv_nsec = 100 * 1000 * 1000 }, NULL);
    }
}

static int rendezvous_rank(ghc_dist_comm_t *c, const struct ghc_dist *d, uint64_t fp, void *blob, size_t blob_len)
{
    ghc_core_t *core = c->core;
    double t0 = now_s();
    int rc, fd = -1;
    if ((rc = connect_root(core, d, t0 + d->timeout, &fd)) < 0)
        return rc;
    c->fd[0] = fd;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    unsigned char h[24];
    put32(h, PROTO_MAGIC), put32(h + 4, PROTO_VERSION), put32(h + 8, (uint32_t)d->rank), put32(h + 12, (uint32_t)d->world);
    put32(h + 16, (uint32_t)(fp >> 32)), put32(h + 20, (uint32_t)fp);
    if (msg_send(fd, 'H', h, sizeof(h)) < 0)
        return ghc_error_set(core, GHC_EIO, "dist: rank 0 closed the connection during the rendezvous");
    /* rank 0 waits up to its own timeout for the last rank: wait longer than that */
    double wait = 2.0 * d->timeout + 30.0;
    char type = 0, *tmp = malloc(blob_len > 1024 ? blob_len : 1024);
    size_t n = 0;
    if (!tmp)
        return ghc_error_set(core, GHC_ENOMEM, "dist: out of memory");
    rc = msg_recv(fd, &type, tmp, blob_len > 1024 ? blob_len : 1024, &n, t0 + wait);
    if (rc == 0 && type == 'K' && n == blob_len)
        memcpy(blob, tmp, blob_len);
    else if ((rc == 0 || rc == -3) && type == 'A')
        rc = ghc_error_set(core, GHC_EIO, "dist: rank 0 gave up: %.*s", (int)(n < 1000 ? n : 1000), tmp);
    else if (rc == -2)
        rc = ghc_error_set(core, GHC_EIO, "dist: rank %d: rank 0 did not answer within %g s", d->rank, wait);
    else
        rc = ghc_error_set(core, GHC_EIO, "dist: rank 0 closed the connection during the rendezvous (it stopped "
                           "or failed)");
    free(tmp);
    return rc;
}

int ghc_dist_rendezvous(ghc_core_t *core, const struct ghc_dist *d, uint64_t fingerprint, void *blob,
                        size_t blob_len, ghc_dist_comm_t **out)
{
    *out = NULL;
    ghc_dist_comm_t *c = comm_new(core, d);
    if (!c)
        return GHC_ENOMEM;
    int rc = d->world == 1 ? 0 : d->rank == 0 ? rendezvous_root(c, d, fingerprint, blob, blob_len)
                                              : rendezvous_rank(c, d, fingerprint, blob, blob_len);
    if (rc < 0)
        ghc_dist_comm_free(c);
    else
        *out = c;
    return rc;
}

/* ---- collectives ---------------------------------------------------------------------------- */

void ghc_dist_abort(ghc_dist_comm_t *c, const char *reason)
{
    if (!c)
        return;
    for (int r = c->rank == 0 ? 1 : 0; r < (c->rank == 0 ? c->world : 1); r++)
        if (c->fd[r] >= 0)
            msg_send(c->fd[r], 'A', reason, strlen(reason));
}

/* Rank 0 lost rank r (it closed its connection or aborted): every other rank hears why. */
static int root_lost(ghc_dist_comm_t *c, int r, const char *what)
{
    int rc = ghc_error_set(c->core, GHC_EIO, "dist: rank %d %s", r, what);
    const char *m = ghc_error_message(c->core) + 6;
    for (int k = 1; k < c->world; k++)
        if (k != r && c->fd[k] >= 0)
            msg_send(c->fd[k], 'A', m, strlen(m));
    return rc;
}

/* What a rank reads from rank 0 in a collective: 'D' of len bytes into buf, else the error. */
static int rank_recv(ghc_dist_comm_t *c, void *buf, size_t len)
{
    char type = 0, *tmp = malloc(len > 1024 ? len : 1024);
    size_t n = 0;
    if (!tmp)
        return ghc_error_set(c->core, GHC_ENOMEM, "dist: out of memory");
    int e = msg_recv(c->fd[0], &type, tmp, len > 1024 ? len : 1024, &n, -1), rc = 0;
    if (e == 0 && type == 'D' && n == len) {
        if (len)
            memcpy(buf, tmp, len);
    } else if ((e == 0 || e == -3) && type == 'A') {
        rc = ghc_error_set(c->core, GHC_EIO, "dist: rank 0 stopped the run: %.*s", (int)(n < 1000 ? n : 1000), tmp);
    } else if (e == -1 && errno == EPIPE) {
        rc = ghc_error_set(c->core, GHC_EIO, "dist: rank 0 closed its connection (it died or stopped)");
    } else {
        rc = ghc_error_set(c->core, GHC_EIO, "dist: rank %d: a bad message from rank 0 (%s)", c->rank,
                           e == -1 ? strerror(errno) : "unexpected type or length");
    }
    free(tmp);
    return rc;
}

int ghc_dist_gather(ghc_dist_comm_t *c, const void *mine, size_t len, void *all)
{
    if (c->world == 1) {
        if (len)
            memcpy(all, mine, len);
        return 0;
    }
    if (c->rank != 0)
        return msg_send(c->fd[0], 'D', mine, len) == 0
             ? 0 : ghc_error_set(c->core, GHC_EIO, "dist: rank 0 closed its connection (it died or stopped)");
    if (len)
        memcpy(all, mine, len);
    int left = c->world - 1;
    struct pollfd *pf = calloc((size_t)c->world, sizeof(*pf));
    bool *done = calloc((size_t)c->world, sizeof(*done));
    char *tmp = malloc(len > 1024 ? len : 1024);
    int rc = !pf || !done || !tmp ? ghc_error_set(c->core, GHC_ENOMEM, "dist: out of memory") : 0;
    while (left > 0 && rc == 0) {
        for (int r = 1; r < c->world; r++)
            pf[r] = (struct pollfd){ .fd = done[r] ? -1 : c->fd[r], .events = POLLIN };
        if (poll(pf + 1, (nfds_t)(c->world - 1), -1) < 0) {
            if (errno != EINTR)
                rc = ghc_error_set(c->core, GHC_EIO, "dist: rank 0: poll: %s", strerror(errno));
            continue;
        }
        for (int r = 1; r < c->world && rc == 0; r++) {
            if (done[r] || !pf[r].revents)
                continue;
            char type = 0;
            size_t n = 0;
            int e = msg_recv(c->fd[r], &type, tmp, len > 1024 ? len : 1024, &n, -1);
            if (e == 0 && type == 'D' && n == len) {
                if (len)
                    memcpy((char *)all + (size_t)r * len, tmp, len);
                done[r] = true, left--;
            } else if ((e == 0 || e == -3) && type == 'A') {
                char what[1100];
                snprintf(what, sizeof(what), "stopped the run: %.*s", (int)(n < 1000 ? n : 1000), tmp);
                rc = root_lost(c, r, what);
            } else {
                rc = root_lost(c, r, e == -1 && errno == EPIPE ? "closed its connection (it died or stopped)"
                                                                : "sent a bad message");
            }
        }
    }
    free(pf);
    free(done);
    free(tmp);
    return rc;
}

int ghc_dist_broadcast(ghc_dist_comm_t *c, void *buf, size_t len)
{
    if (c->world == 1)
        return 0;
    if (c->rank != 0)
        return rank_recv(c, buf, len);
    for (int r = 1; r < c->world; r++)
        if (msg_send(c->fd[r], 'D', buf, len) < 0)
            return root_lost(c, r, "closed its connection (it died or stopped)");
    return 0;
}

int ghc_dist_barrier(ghc_dist_comm_t *c)
{
    int rc = ghc_dist_gather(c, NULL, 0, NULL);
    return rc < 0 ? rc : ghc_dist_broadcast(c, NULL, 0);
}

/* ---- the watch -------------------------------------------------------------------------------- */

/* The watcher: polls the connections for a hang-up only (never reads, so the collectives of the
 * main thread go on) and ends the process when one comes and the process does not end on its
 * own within GHC_DIST_GRACE_MS. */
static void *watch_main(void *arg)
{
    ghc_dist_comm_t *c = arg;
    int n = c->rank == 0 ? c->world : 2;
    struct pollfd *pf = calloc((size_t)n, sizeof(*pf));
    int *who = calloc((size_t)n, sizeof(*who));
    if (!pf || !who) {
        free(pf);
        free(who);
        return NULL;
    }
    pf[0] = (struct pollfd){ .fd = c->wake[0], .events = POLLIN };
    int k = 1;
    for (int r = c->rank == 0 ? 1 : 0; r < (c->rank == 0 ? c->world : 1); r++)
        if (c->fd[r] >= 0) {
            who[k] = r;
            pf[k++] = (struct pollfd){ .fd = c->fd[r], .events = POLLRDHUP };
        }
    for (;;) {
        if (poll(pf, (nfds_t)k, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (pf[0].revents)
            break;   /* ghc_dist_watch(c, false) */
        for (int i = 1; i < k; i++)
            if (pf[i].revents & (POLLRDHUP | POLLHUP | POLLERR)) {
                /* the training thread finds out in its next collective on the channel and
                 * stops the usual way (the output folder as a failed run leaves it); one that
                 * waits in a GPU collective for the dead rank never returns: after a grace
                 * period, one line and out */
                if (poll(pf, 1, GHC_DIST_GRACE_MS) != 0)
                    break;   /* watch off: the run ends on its own */
                char line[256];
                int len = c->rank == 0
                        ? snprintf(line, sizeof(line), "gh200core: error: dist: rank %d closed its connection (it "
                                   "died or stopped): rank 0 stops\n", who[i])
                        : snprintf(line, sizeof(line), "gh200core: error: dist: rank 0 closed its connection (it "
                                   "died or stopped, see its messages): rank %d stops\n", c->rank);
                if (write(STDERR_FILENO, line, (size_t)len) < 0) {
                    /* nothing more to say */
                }
                _exit(1);
            }
    }
    free(pf);
    free(who);
    return NULL;
}

int ghc_dist_watch(ghc_dist_comm_t *c, bool on)
{
    if (!c || c->world < 2 || c->watching == on)
        return 0;
    if (!on) {
        char b = 1;
        if (write(c->wake[1], &b, 1) < 0) {
            /* the thread is gone already */
        }
        pthread_join(c->watcher, NULL);
        close(c->wake[0]);
        close(c->wake[1]);
        c->watching = false;
        return 0;
    }
    if (pipe(c->wake) < 0)
        return ghc_error_set(c->core, GHC_EIO, "dist: pipe: %s", strerror(errno));
    int e = pthread_create(&c->watcher, NULL, watch_main, c);
    if (e) {
        close(c->wake[0]);
        close(c->wake[1]);
        return ghc_error_set(c->core, GHC_EIO, "dist: cannot start the watch thread: %s", strerror(e));
    }
    c->watching = true;
    return 0;
}
