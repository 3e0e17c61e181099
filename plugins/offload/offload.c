/* offload.c: the `offload` memory policy: base weights (either expert) in pinned host memory,
 * streamed block by block into a ring of device buffers on a copy stream, overlapped with the
 * compute on the legacy stream, in forward order and in backward order; every other role in
 * device memory from the caching pool. The way past HBM on discrete GPUs, where managed memory
 * must not oversubscribe the device (gh200_uvm caps it there). The model declares each block's
 * weights once (group(), id expert x blocks + block) and asks map() for the device address of
 * a weight between BLOCK_BEGIN and BLOCK_END; any other weight is read in place from pinned
 * memory (zero-copy), so results never depend on the streaming. mode "direct" reads every
 * weight in place (GH200: over NVLink-C2C). `resident` keeps N blocks of each expert on the
 * device (copied once, never streamed), spread evenly over the blocks so that the copy of the
 * next streamed block overlaps the compute of the resident ones before it. Saved activations
 * (GHC_ROLE_SAVED) live in pinned host memory too (saved = "host"), moved through a ring of
 * device buffers on a copy stream of their own (saved.h): copied home as each block's forward
 * ends, back ahead of its backward. */
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include <gh200core/mempolicy.h>

#include "../device/devpool.h"
#include "saved.h"

#define OFF_ALIGN 256
#define OFF_TIMED 32               /* copies timed with events, not yet read back */

enum off_at { OFF_DEVICE = 0, OFF_PINNED };

struct off_block {
    void             *ptr;
    size_t            bytes;
    enum ghc_mem_role role;
    enum off_at       at;
    struct off_block *next;
};

struct off_group {                 /* one block's weights: where they live and their place in a slot */
    void  **ptrs;
    size_t *bytes, *offs;
    int     n;
    size_t  total;
    int     slot;                  /* ring slot holding a copy, or -1 */
    bool    resident;              /* its slot is its own, past the ring, never evicted */
};

struct off_slot {
    void       *buf;
    int64_t     group;             /* -1: empty */
    cudaEvent_t ready;             /* the copy into it is done (copy stream) */
    cudaEvent_t done;              /* the compute that read it is done (legacy stream) */
    uint64_t    used;              /* last use, for LRU */
};

struct off {
    ghc_core_t       *core;
    int               device, ring, resident, n_slots;   /* n_slots: the ring's + the resident groups' */
    bool              direct;
    struct devpool    pools;
    pthread_mutex_t   lock;
    cudaStream_t      copy;
    struct off_block *blocks;
    struct off_group *groups;
    int64_t           n_groups, n_blocks, expert, base, cur;
    int               dir;
    struct off_slot  *slots;
    size_t            slot_bytes;
    uint64_t          clock;
    uint64_t          role[GHC_ROLE_MAX], role_peak[GHC_ROLE_MAX], live, live_dev, live_pinned, peak, streamed;
    /* each block copy between two timing events on the copy stream: a FIFO of event pairs,
     * read back (without waiting) when a pair is needed again and in stats() */
    cudaEvent_t       t_begin[OFF_TIMED], t_end[OFF_TIMED];
    int               t_head, t_count;
    uint64_t          stream_ns;
    bool              saved_host;     /* saved activations pinned on the host, through `saved` */
    struct saved_ring saved;
};

static const struct ghc_cfg_key off_keys[] = {
    { "device", GHC_CFG_INT, "0", "0 to 63", NULL },
    { "ring", GHC_CFG_INT, "2", "2 to 64", NULL },                /* device buffers in the ring */
    { "resident", GHC_CFG_INT, "0", "0 to 100000", NULL },        /* blocks per expert kept on the device */
    { "mode", GHC_CFG_STRING, "copy", "copy, direct", NULL },
    { "saved", GHC_CFG_STRING, "host", "host, device", NULL },    /* where saved activations live */
    { "saved_ring", GHC_CFG_INT, "3", "2 to 64", NULL },          /* their device buffers */
    { "saved_ahead", GHC_CFG_INT, "2", "0 to 63", NULL },         /* units the backward copies in ahead */
    { NULL, 0, NULL, NULL, NULL }
};

/* The saved ring's buffers come from the caching pool (ordered on the legacy stream). */
static int off_buf_alloc(void *ctx, size_t n, void **buf)
{
    struct off *o = ctx;
    cudaError_t e = devpool_alloc(&o->pools, o->device, n, buf);
    if (e == cudaSuccess)
        return 0;
    cudaGetLastError();
    return ghc_error_set(o->core, GHC_ENOMEM, "offload: cannot make a saved-activation buffer of %.1f MiB on cuda:%d: "
                         "%s (fewer buffers: saved_ring; or saved = \"device\")", n / 1048576.0, o->device,
                         cudaGetErrorString(e));
}

static void off_buf_free(void *ctx, void *buf)
{
    (void)ctx;
    devpool_release(buf);
}

static int off_init(ghc_core_t *core, ghc_cfg_t *cfg, void **self)
{
    int64_t device, ring, sring, sahead, resident;
    const char *mode, *saved;
    int rc, n = 0;
    if ((rc = ghc_cfg_get_int(cfg, "device", 0, 0, DEVPOOL_MAX - 1, &device)) < 0 ||
        (rc = ghc_cfg_get_int(cfg, "ring", 2, 2, 64, &ring)) < 0 ||
        (rc = ghc_cfg_get_int(cfg, "resident", 0, 0, 100000, &resident)) < 0 ||
        (rc = ghc_cfg_get_string(cfg, "mode", "copy", &mode)) < 0 ||
        (rc = ghc_cfg_get_string(cfg, "saved", "host", &saved)) < 0 ||
        (rc = ghc_cfg_get_int(cfg, "saved_ring", 3, 2, 64, &sring)) < 0 ||
        (rc = ghc_cfg_get_int(cfg, "saved_ahead", 2, 0, 63, &sahead)) < 0)
        return rc;
    if (strcmp(mode, "copy") != 0 && strcmp(mode, "direct") != 0)
        return ghc_error_set(core, GHC_ECONFIG, "%s: offload: mode '%s' is unknown; expected \"copy\" (stream into "
                             "device buffers) or \"direct\" (read in place)", ghc_cfg_where(cfg, "mode"), mode);
    if (strcmp(saved, "host") != 0 && strcmp(saved, "device") != 0)
        return ghc_error_set(core, GHC_ECONFIG, "%s: offload: saved '%s' is unknown; expected \"host\" (saved "
                             "activations in pinned host memory, through a ring of device buffers) or \"device\"",
                             ghc_cfg_where(cfg, "saved"), saved);
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n < 1) {
        cudaGetLastError();
        return ghc_error_set(core, GHC_EUNSUPPORTED, "%s: offload: no CUDA device (%s); use mempolicy \"host\" on a "
                             "machine without a GPU", ghc_cfg_where(cfg, NULL),
                             e != cudaSuccess ? cudaGetErrorString(e) : "count 0");
    }
    if (device >= n)
        return ghc_error_set(core, GHC_ECONFIG, "%s: offload: device %lld, but there are %d CUDA devices",
                             ghc_cfg_where(cfg, "device"), (long long)device, n);
    struct off *o = calloc(1, sizeof(*o));
    if (!o)
        return ghc_error_set(core, GHC_ENOMEM, "offload: out of memory");
    *o = (struct off){ .core = core, .device = (int)device, .ring = (int)ring, .resident = (int)resident,
                       .direct = strcmp(mode, "direct") == 0, .cur = -1, .dir = 1,
                       .saved_host = strcmp(saved, "host") == 0 };
    pthread_mutex_init(&o->lock, NULL);
    struct saved_io io = { 0 };
    if ((e = cudaSetDevice(o->device)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&o->copy, cudaStreamNonBlocking)) != cudaSuccess) {
        cudaGetLastError();
        pthread_mutex_destroy(&o->lock);
        free(o);
        return ghc_error_set(core, GHC_ECUDA, "offload: setting up device %lld: %s", (long long)device,
                             cudaGetErrorString(e));
    }
    if ((rc = saved_cuda_io(core, o->device, off_buf_alloc, off_buf_free, o, &io)) < 0) {
        cudaStreamDestroy(o->copy);
        pthread_mutex_destroy(&o->lock);
        free(o);
        return rc;
    }
    saved_ring_init(&o->saved, core, "offload", &io, (int)sring, (int)sahead, false);
    ghc_log(core, GHC_LOG_INFO, "offload: weights in pinned host memory, %s on cuda:%d; saved activations %s",
            o->direct ? "read in place" : "streamed per block through a ring of device buffers", o->device,
            o->saved_host ? "in pinned host memory" : "on the device");
    *self = o;
    return 0;
}

/* ---- alloc / release ------------------------------------------------------------------------- */

static bool off_pinned_role(const struct off *o, enum ghc_mem_role role)
{
    return role == GHC_ROLE_WEIGHTS || role == GHC_ROLE_WEIGHTS_INACTIVE || (role == GHC_ROLE_SAVED && o->saved_host);
}

static int off_alloc(void *self, size_t bytes, enum ghc_mem_role role, int device, void **ptr)
{
    struct off *o = self;
    struct off_block *b = calloc(1, sizeof(*b));
    size_t n = bytes ? bytes : 1;
    cudaError_t e;
    if (!b)
        return ghc_error_set(o->core, GHC_ENOMEM, "offload: out of memory");
    if (device != GHC_DEVICE_CPU && device != o->device) {
        free(b);
        return ghc_error_set(o->core, GHC_EUNSUPPORTED, "offload: %s asked for on cuda:%d, but the policy manages "
                             "cuda:%d", ghc_mem_role_name(role), device, o->device);
    }
    b->at = device == GHC_DEVICE_CPU || off_pinned_role(o, role) ? OFF_PINNED : OFF_DEVICE;
    e = b->at == OFF_PINNED ? cudaMallocHost(&b->ptr, n) : devpool_alloc(&o->pools, o->device, n, &b->ptr);
    if (e != cudaSuccess) {
        cudaGetLastError();
        char use[512];
        uint64_t by_role[GHC_ROLE_MAX];
        bool pinned = b->at == OFF_PINNED;
        pthread_mutex_lock(&o->lock);
        memcpy(by_role, o->role, sizeof(by_role));
        pthread_mutex_unlock(&o->lock);
        free(b);
        return ghc_error_set(o->core, GHC_ENOMEM, "offload: out of memory: %zu bytes (%.2f GiB) of %s in %s: %s; in "
                             "use by role: %s", bytes, bytes / 1073741824.0, ghc_mem_role_name(role),
                             pinned ? "pinned host memory" : "device memory", cudaGetErrorString(e),
                             ghc_mem_usage_text(by_role, GHC_ROLE_MAX, use, sizeof(use)));
    }
    b->bytes = bytes;
    b->role = role;
    pthread_mutex_lock(&o->lock);
    if (role == GHC_ROLE_SAVED && b->at == OFF_PINNED && device != GHC_DEVICE_CPU &&
        saved_ring_add(&o->saved, b->ptr, bytes) < 0) {
        pthread_mutex_unlock(&o->lock);
        cudaFreeHost(b->ptr);
        free(b);
        return GHC_ENOMEM;   /* message set */
    }
    b->next = o->blocks;
    o->blocks = b;
    if ((o->role[role] += bytes) > o->role_peak[role])
        o->role_peak[role] = o->role[role];
    o->live += bytes;
    if (b->at == OFF_PINNED)
        o->live_pinned += bytes;
    else
        o->live_dev += bytes;
    if (o->live > o->peak)
        o->peak = o->live;
    pthread_mutex_unlock(&o->lock);
    *ptr = b->ptr;
    return 0;
}

static void off_release(void *self, void *ptr)
{
    struct off *o = self;
    struct off_block *b = NULL;
    pthread_mutex_lock(&o->lock);
    for (struct off_block **p = &o->blocks; *p; p = &(*p)->next)
        if ((*p)->ptr == ptr) {
            b = *p;
            *p = b->next;
            o->role[b->role] -= b->bytes;
            o->live -= b->bytes;
            if (b->at == OFF_PINNED)
                o->live_pinned -= b->bytes;
            else
                o->live_dev -= b->bytes;
            if (b->role == GHC_ROLE_SAVED)
                saved_ring_drop(&o->saved, ptr);
            break;
        }
    pthread_mutex_unlock(&o->lock);
    if (!b) {
        ghc_log(o->core, GHC_LOG_ERROR, "offload: release of %p, which it did not allocate", ptr);
        return;
    }
    if (b->at == OFF_PINNED) {
        cudaDeviceSynchronize();   /* a copy or a zero-copy read may still use it */
        cudaFreeHost(ptr);
    } else {
        devpool_release(ptr);
    }
    cudaGetLastError();
    free(b);
}

static int off_advise(void *self, void *ptr, size_t bytes, enum ghc_mem_role role)
{
    struct off *o = self;
    (void)bytes;
    pthread_mutex_lock(&o->lock);
    for (struct off_block *b = o->blocks; b; b = b->next)
        if (b->ptr == ptr) {
            o->role[b->role] -= b->bytes;
            if ((o->role[role] += b->bytes) > o->role_peak[role])
                o->role_peak[role] = o->role[role];
            b->role = role;   /* the expert switch: both experts' weights stay pinned */
            break;
        }
    pthread_mutex_unlock(&o->lock);
    return 0;
}

/* ---- groups and the ring ----------------------------------------------------------------------- */

static int off_group(void *self, int64_t group, void *const *ptrs, const size_t *bytes, int n)
{
    struct off *o = self;
    if (group < 0 || group > (1 << 20) || n < 0)
        return ghc_error_set(o->core, GHC_EINVAL, "offload: group %lld out of range", (long long)group);
    if (o->slots)
        return ghc_error_set(o->core, GHC_EINVAL, "offload: group %lld declared after streaming began", (long long)group);
    if (group >= o->n_groups) {
        struct off_group *g = realloc(o->groups, (size_t)(group + 1) * sizeof(*g));
        if (!g)
            return ghc_error_set(o->core, GHC_ENOMEM, "offload: out of memory");
        for (int64_t i = o->n_groups; i <= group; i++)
            g[i] = (struct off_group){ .slot = -1 };
        o->groups = g;
        o->n_groups = group + 1;
    }
    struct off_group *g = &o->groups[group];
    free(g->ptrs);
    free(g->bytes);
    free(g->offs);
    *g = (struct off_group){ .slot = -1, .n = n, .ptrs = malloc((size_t)n * sizeof(void *) + 1),
                             .bytes = malloc((size_t)n * sizeof(size_t) + 1), .offs = malloc((size_t)n * sizeof(size_t) + 1) };
    if (!g->ptrs || !g->bytes || !g->offs)
        return ghc_error_set(o->core, GHC_ENOMEM, "offload: out of memory");
    for (int k = 0; k < n; k++) {
        g->ptrs[k] = ptrs[k];
        g->bytes[k] = bytes[k];
        g->offs[k] = g->total;
        g->total += (bytes[k] + OFF_ALIGN - 1) / OFF_ALIGN * OFF_ALIGN;
    }
    return 0;
}

/* Block b of n kept on the device by `resident = r`: r of the n, spread evenly. */
static bool off_resident_block(int64_t b, int64_t n, int64_t r)
{
    return r >= n || (n > 0 && (b * r) / n != ((b + 1) * r) / n);
}

/* A slot's buffer and events. */
static int off_slot_make(struct off *o, struct off_slot *sl, size_t bytes)
{
    cudaError_t e;
    sl->group = -1;
    if ((e = devpool_alloc(&o->pools, o->device, bytes, &sl->buf)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&sl->ready, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&sl->done, cudaEventDisableTiming)) != cudaSuccess) {
        cudaGetLastError();
        return ghc_error_set(o->core, GHC_ENOMEM, "offload: cannot make a device buffer of %.1f MiB on cuda:%d: %s "
                             "(fewer buffers: ring, resident)", bytes / 1048576.0, o->device, cudaGetErrorString(e));
    }
    o->live_dev += bytes;   /* in bytes_device, not in the per-role counts of allocations */
    return 0;
}

static void off_copy_in(struct off *o, struct off_slot *sl, int64_t g);

/* The ring: `ring` device buffers of the largest group, made when streaming begins (the model
 * has declared its groups and said its blocks per expert); then a buffer of its own for each
 * resident group, filled once on the copy stream. */
static int off_ring_make(struct off *o)
{
    size_t most = 0;
    int n_res = 0;
    for (int64_t i = 0; i < o->n_groups; i++) {
        if (o->groups[i].total > most)
            most = o->groups[i].total;
        o->groups[i].resident = o->groups[i].n && o->resident > 0 && o->n_blocks > 0 &&
                                off_resident_block(i % o->n_blocks, o->n_blocks, o->resident);
        n_res += o->groups[i].resident;
    }
    if (!most)
        return 0;
    if (!(o->slots = calloc((size_t)(o->ring + n_res), sizeof(*o->slots))))
        return ghc_error_set(o->core, GHC_ENOMEM, "offload: out of memory");
    int rc;
    for (int s = 0; s < o->ring; s++, o->n_slots++)
        if ((rc = off_slot_make(o, &o->slots[s], most)) < 0)
            return rc;
    for (int i = 0; i < OFF_TIMED; i++) {
        cudaError_t e;
        if ((e = cudaEventCreate(&o->t_begin[i])) != cudaSuccess || (e = cudaEventCreate(&o->t_end[i])) != cudaSuccess) {
            cudaGetLastError();
            return ghc_error_set(o->core, GHC_ECUDA, "offload: cannot make timing events on cuda:%d: %s", o->device,
                                 cudaGetErrorString(e));
        }
    }
    o->slot_bytes = most;
    size_t res_bytes = 0;
    for (int64_t g = 0; g < o->n_groups; g++) {
        if (!o->groups[g].resident)
            continue;
        struct off_slot *sl = &o->slots[o->n_slots];
        if ((rc = off_slot_make(o, sl, o->groups[g].total)) < 0)
            return rc;
        o->n_slots++;
        off_copy_in(o, sl, g);
        o->groups[g].slot = (int)(sl - o->slots);
        res_bytes += o->groups[g].total;
    }
    ghc_log(o->core, GHC_LOG_DEBUG, "offload: ring of %d x %.1f MiB for %lld groups; %d resident (%.1f MiB)", o->ring,
            most / 1048576.0, (long long)o->n_groups, n_res, res_bytes / 1048576.0);
    return 0;
}

/* Add the copy times of the timed copies that have completed, oldest first; with `wait`, wait
 * for the oldest one (the FIFO is full). */
static void off_timed_read(struct off *o, bool wait)
{
    while (o->t_count > 0) {
        int i = o->t_head;
        float ms = 0;
        if (wait && o->t_count == OFF_TIMED)
            cudaEventSynchronize(o->t_end[i]);
        if (cudaEventQuery(o->t_end[i]) != cudaSuccess) {
            cudaGetLastError();   /* cudaErrorNotReady: later copies are not done either */
            break;
        }
        if (cudaEventElapsedTime(&ms, o->t_begin[i], o->t_end[i]) == cudaSuccess)
            o->stream_ns += (uint64_t)((double)ms * 1e6);
        cudaGetLastError();
        o->t_head = (i + 1) % OFF_TIMED;
        o->t_count--;
    }
}

/* Start the copy of group g into the least recently used slot other than the current group's,
 * after the compute that last read that slot. */
static void off_fetch(struct off *o, int64_t g)
{
    if (g < 0 || g >= o->n_groups || !o->groups[g].n || o->groups[g].slot >= 0 || !o->slots)
        return;
    int pick = -1;
    for (int s = 0; s < o->ring; s++) {
        if (o->cur >= 0 && o->slots[s].group == o->cur)
            continue;
        if (pick < 0 || o->slots[s].used < o->slots[pick].used)
            pick = s;
    }
    struct off_slot *sl = &o->slots[pick];
    if (sl->group >= 0)
        o->groups[sl->group].slot = -1;
    off_copy_in(o, sl, g);
    o->groups[g].slot = pick;
}

/* Copy group g's weights into slot sl on the copy stream, after the compute that last read the
 * slot, timed; sl->ready when done. */
static void off_copy_in(struct off *o, struct off_slot *sl, int64_t g)
{
    cudaStreamWaitEvent(o->copy, sl->done, 0);   /* never recorded: no wait */
    off_timed_read(o, true);
    int t = (o->t_head + o->t_count) % OFF_TIMED;
    cudaEventRecord(o->t_begin[t], o->copy);      /* after the wait: the copy alone is timed */
    struct off_group *gr = &o->groups[g];
    for (int k = 0; k < gr->n; k++)
        cudaMemcpyAsync((char *)sl->buf + gr->offs[k], gr->ptrs[k], gr->bytes[k], cudaMemcpyHostToDevice, o->copy);
    cudaEventRecord(o->t_end[t], o->copy);
    o->t_count++;
    cudaEventRecord(sl->ready, o->copy);
    sl->group = g;
    sl->used = ++o->clock;
    o->streamed += gr->total;
}

/* The first block from b on, in direction dir, that is streamed (not resident); -1: none. */
static int64_t off_next_streamed(const struct off *o, int64_t b, int dir)
{
    for (; b >= 0 && b < o->n_blocks; b += dir)
        if (o->base + b >= o->n_groups || !o->groups[o->base + b].resident)
            return b;
    return -1;
}

static int off_phase(void *self, enum ghc_mem_phase phase, int64_t index)
{
    struct off *o = self;
    int rc = 0;
    if (o->direct)
        return 0;
    pthread_mutex_lock(&o->lock);
    switch (phase) {
    case GHC_PHASE_FORWARD_BEGIN:
    case GHC_PHASE_BACKWARD_BEGIN:
        o->n_blocks = index;
        o->base = o->expert * index;   /* groups are expert x blocks + block */
        o->dir = phase == GHC_PHASE_FORWARD_BEGIN ? 1 : -1;
        if (!o->slots && (rc = off_ring_make(o)) < 0)
            break;
        int64_t first = off_next_streamed(o, o->dir > 0 ? 0 : index - 1, o->dir);
        if (first >= 0)
            off_fetch(o, o->base + first);
        break;
    case GHC_PHASE_EXPERT_SWITCH:
        o->expert = index;
        break;
    case GHC_PHASE_BLOCK_BEGIN: {
        int64_t g = o->base + index;
        if (g >= o->n_groups || !o->groups[g].n || !o->slots)
            break;
        off_fetch(o, g);   /* not prefetched (first block, or an irregular order) */
        struct off_slot *sl = &o->slots[o->groups[g].slot];
        cudaStreamWaitEvent(NULL, sl->ready, 0);   /* the compute waits for its weights only */
        sl->used = ++o->clock;
        o->cur = g;
        int64_t next = off_next_streamed(o, index + o->dir, o->dir);
        if (next >= 0)
            off_fetch(o, o->base + next);   /* overlaps this block's compute (and the resident ones') */
        break;
    }
    case GHC_PHASE_BLOCK_END:
        if (o->cur >= 0 && o->groups[o->cur].slot >= 0)
            cudaEventRecord(o->slots[o->groups[o->cur].slot].done, NULL);
        o->cur = -1;
        break;
    default:
        break;
    }
    cudaError_t e = cudaGetLastError();
    pthread_mutex_unlock(&o->lock);
    if (rc == 0 && e != cudaSuccess)
        rc = ghc_error_set(o->core, GHC_ECUDA, "offload: streaming block %lld: %s", (long long)index,
                           cudaGetErrorString(e));
    return rc;
}

static void *off_map(void *self, void *ptr)
{
    struct off *o = self;
    void *at = ptr;
    pthread_mutex_lock(&o->lock);
    if (o->cur >= 0) {
        struct off_group *g = &o->groups[o->cur];
        for (int k = 0; k < g->n && g->slot >= 0; k++)
            if (g->ptrs[k] == ptr) {
                at = (char *)o->slots[g->slot].buf + g->offs[k];
                break;
            }
    }
    pthread_mutex_unlock(&o->lock);
    return at;
}

/* ---- saved activations ------------------------------------------------------------------------- */

static int off_saved_begin(void *self, void *ptr, size_t bytes, int64_t unit, bool write, void *stream, void **at)
{
    struct off *o = self;
    pthread_mutex_lock(&o->lock);
    int rc = saved_ring_begin(&o->saved, ptr, bytes, unit, write, stream, at);
    pthread_mutex_unlock(&o->lock);
    return rc;
}

static int off_saved_end(void *self, void *ptr, void *stream)
{
    struct off *o = self;
    pthread_mutex_lock(&o->lock);
    int rc = saved_ring_end(&o->saved, ptr, stream);
    pthread_mutex_unlock(&o->lock);
    return rc;
}

static int off_trim(void *self, bool hard)
{
    devpool_trim(&((struct off *)self)->pools, hard);
    return 0;
}

static int off_stats(void *self, struct ghc_mem_stats *out)
{
    struct off *o = self;
    if (out->struct_size < offsetof(struct ghc_mem_stats, stream_ns))
        return ghc_error_set(o->core, GHC_EINVAL, "offload: stats struct_size %u too small", out->struct_size);
    pthread_mutex_lock(&o->lock);
    off_timed_read(o, false);
    if (out->struct_size >= offsetof(struct ghc_mem_stats, saved_out_bytes))
        out->stream_ns = o->stream_ns;
    memcpy(out->bytes_role, o->role, sizeof(o->role));
    out->bytes_host = o->live_pinned;
    out->bytes_pinned = o->live_pinned;
    out->bytes_device = o->live_dev + saved_ring_bytes(&o->saved);
    out->bytes_peak = o->peak;
    out->streamed_bytes = o->streamed;
    if (out->struct_size >= offsetof(struct ghc_mem_stats, bytes_role_peak) + sizeof(out->bytes_role_peak))
        memcpy(out->bytes_role_peak, o->role_peak, sizeof(o->role_peak));
    if (out->struct_size >= offsetof(struct ghc_mem_stats, saved_ring_bytes) + sizeof(uint64_t)) {
        out->saved_out_bytes = o->saved.out_bytes;
        out->saved_in_bytes = o->saved.in_bytes;
        out->saved_hits = o->saved.hits;
        out->saved_ring_bytes = saved_ring_bytes(&o->saved);
    }
    pthread_mutex_unlock(&o->lock);
    return 0;
}

static void off_free(void *self)
{
    struct off *o = self;
    if (!o)
        return;
    if (o->live)
        ghc_log(o->core, GHC_LOG_WARN, "offload: %llu bytes still allocated at exit", (unsigned long long)o->live);
    cudaDeviceSynchronize();
    saved_ring_free(&o->saved);
    saved_cuda_io_free(&o->saved.io);
    for (int s = 0; o->slots && s < o->n_slots; s++) {
        if (o->slots[s].buf)
            devpool_release(o->slots[s].buf);
        if (o->slots[s].ready)
            cudaEventDestroy(o->slots[s].ready);
        if (o->slots[s].done)
            cudaEventDestroy(o->slots[s].done);
    }
    free(o->slots);
    for (int i = 0; i < OFF_TIMED; i++) {
        if (o->t_begin[i])
            cudaEventDestroy(o->t_begin[i]);
        if (o->t_end[i])
            cudaEventDestroy(o->t_end[i]);
    }
    for (int64_t i = 0; i < o->n_groups; i++) {
        free(o->groups[i].ptrs);
        free(o->groups[i].bytes);
        free(o->groups[i].offs);
    }
    free(o->groups);
    while (o->blocks) {
        struct off_block *b = o->blocks;
        o->blocks = b->next;
        free(b);   /* the memory itself goes with the CUDA context */
    }
    cudaStreamDestroy(o->copy);
    cudaGetLastError();
    pthread_mutex_destroy(&o->lock);
    free(o);
}

static const struct ghc_mempolicy_ops off_ops = {
    .struct_size = sizeof(struct ghc_mempolicy_ops),
    .name = "offload",
    .keys = off_keys,
    .init = off_init,
    .alloc = off_alloc,
    .release = off_release,
    .advise = off_advise,
    .phase = off_phase,
    .stats = off_stats,
    .free = off_free,
    .trim = off_trim,
    .map = off_map,
    .group = off_group,
    .saved_begin = off_saved_begin,
    .saved_end = off_saved_end,
};

static int off_plugin_init(ghc_core_t *core) { return ghc_register_mempolicy(core, &off_ops); }

GHC_PLUGIN_EXPORT const struct ghc_plugin ghc_plugin_offload = {
    .abi = GHC_PLUGIN_ABI,
    .api = GHC_API_VERSION,
    .struct_size = sizeof(struct ghc_plugin),
    .kinds = GHC_KIND_BIT(GHC_KIND_MEMPOLICY),
    .name = "offload",
    .version = GHC_VERSION,
    .description = "base weights in pinned host memory, streamed per block into a ring of device buffers",
    .init = off_plugin_init,
};
