/* tcache.c: the decoded-tensor table of the disk and unified_memory caches (tcache.h).
 * Decoding runs outside the lock; two threads that miss the same tensor both decode and the
 * second copy is dropped. Evicted tensors are freed only when unpinned. */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gh200core/safetensors.h>

#include "tcache.h"

#define K GHC_SAMPLE_KIND_COUNT

struct slot {
    ghc_tensor_t *t;
    int32_t       pins;
    int64_t       prev, next;    /* LRU list of held slots (-1 ends) */
};

struct tcache {
    ghc_core_t      *core;
    const char      *name;
    uint64_t         budget;
    char            *persist;
    bool             advise;
    ghc_backend_t   *backend;
    char           **file, **key;   /* [n * K] */
    int64_t          n;
    struct slot     *slot;          /* [n * K] */
    int64_t          head, tail;    /* most, least recently used */
    pthread_mutex_t  lock;
    struct ghc_cache_stats st;
};

struct tcache *tcache_init(ghc_core_t *core, const char *name, uint64_t budget, const char *persist, bool advise)
{
    struct tcache *tc = calloc(1, sizeof(*tc));
    if (!tc || (persist && !(tc->persist = strdup(persist)))) {
        free(tc);
        ghc_error_set(core, GHC_ENOMEM, "%s: out of memory", name);
        return NULL;
    }
    if (tc->persist && mkdir(tc->persist, 0755) != 0 && errno != EEXIST) {
        ghc_error_set(core, GHC_EIO, "%s: persistent_cache %s: cannot create: %s", name, tc->persist, strerror(errno));
        free(tc->persist);
        free(tc);
        return NULL;
    }
    tc->core = core;
    tc->name = name;
    tc->budget = budget;
    tc->advise = advise;
    tc->head = tc->tail = -1;
    pthread_mutex_init(&tc->lock, NULL);
    return tc;
}

static void unbind(struct tcache *tc)
{
    for (int64_t i = 0; i < tc->n * K; i++) {
        free(tc->file[i]);
        free(tc->key[i]);
        if (tc->slot)
            ghc_tensor_free(tc->slot[i].t);
    }
    free(tc->file);
    free(tc->key);
    free(tc->slot);
    tc->file = tc->key = NULL;
    tc->slot = NULL;
    tc->n = 0;
    tc->head = tc->tail = -1;
    tc->st.held_bytes = 0;
}

void tcache_free(struct tcache *tc)
{
    if (!tc)
        return;
    unbind(tc);
    pthread_mutex_destroy(&tc->lock);
    free(tc->persist);
    free(tc);
}

int tcache_bind(struct tcache *tc, ghc_backend_t *b, const struct ghc_sample_ref *s, int64_t n)
{
    unbind(tc);
    tc->backend = b;
    tc->file = calloc((size_t)(n * K + 1), sizeof(*tc->file));
    tc->key = calloc((size_t)(n * K + 1), sizeof(*tc->key));
    tc->slot = calloc((size_t)(n * K + 1), sizeof(*tc->slot));
    if (!tc->file || !tc->key || !tc->slot)
        goto nomem;
    tc->n = n;
    for (int64_t i = 0; i < n; i++)
        for (int k = 0; k < K; k++) {
            tc->slot[i * K + k].prev = tc->slot[i * K + k].next = -1;
            if (!s[i].file[k])
                continue;
            if (!(tc->file[i * K + k] = strdup(s[i].file[k])) || !(tc->key[i * K + k] = strdup(s[i].key[k])))
                goto nomem;
        }
    return 0;
nomem:
    unbind(tc);
    return ghc_error_set(tc->core, GHC_ENOMEM, "%s: out of memory for %lld samples", tc->name, (long long)n);
}

int64_t tcache_count(struct tcache *tc) { return tc->n; }

/* ---- the LRU list (under the lock) ------------------------------------------------------------ */

static void lru_unlink(struct tcache *tc, int64_t i)
{
    struct slot *s = &tc->slot[i];
    if (s->prev >= 0) tc->slot[s->prev].next = s->next; else tc->head = s->next;
    if (s->next >= 0) tc->slot[s->next].prev = s->prev; else tc->tail = s->prev;
    s->prev = s->next = -1;
}

static void lru_front(struct tcache *tc, int64_t i)
{
    struct slot *s = &tc->slot[i];
    s->next = tc->head;
    s->prev = -1;
    if (tc->head >= 0)
        tc->slot[tc->head].prev = i;
    tc->head = i;
    if (tc->tail < 0)
        tc->tail = i;
}

/* Free least recently used unpinned tensors until the budget holds. */
static void evict(struct tcache *tc)
{
    int64_t i = tc->tail;
    while (tc->budget && tc->st.held_bytes > tc->budget && i >= 0) {
        int64_t prev = tc->slot[i].prev;
        if (tc->slot[i].pins == 0) {
            tc->st.held_bytes -= ghc_tensor_nbytes(tc->slot[i].t);
            ghc_tensor_free(tc->slot[i].t);
            tc->slot[i].t = NULL;
            lru_unlink(tc, i);
            tc->st.evictions++;
        }
        i = prev;
    }
}

/* ---- decoding -------------------------------------------------------------------------------- */

/* Two 64-bit lanes over the bytes of a source file: the persistent cache's key. Not
 * cryptographic: it tells files apart, it does not defend against crafted collisions. */
static void content_hash(const uint8_t *p, size_t n, uint64_t h[2])
{
    uint64_t a = 0x9e3779b97f4a7c15ull ^ n, b = 0xc2b2ae3d27d4eb4full + n;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        a = (a ^ w) * 0xff51afd7ed558ccdull;
        a ^= a >> 32;
        b = (b + w) * 0xc4ceb9fe1a85ec53ull;
        b ^= b >> 29;
    }
    for (; i < n; i++) {
        a = (a ^ p[i]) * 0x100000001b3ull;
        b = (b + p[i]) * 0xff51afd7ed558ccdull;
    }
    h[0] = a ^ (b >> 17);
    h[1] = b ^ (a >> 23);
}

/* The persistent file of a slot whose source bytes are `data`: named by their content and the
 * tensor's key, never by the entry's name (another dataset, or the same file changed, has other
 * bytes): "<32 hex digits>#<key>.safetensors", '/' in the key as '@'. */
static void persist_path(struct tcache *tc, int64_t i, const void *data, size_t len, char *buf, size_t n)
{
    uint64_t h[2];
    content_hash(data, len, h);
    int w = snprintf(buf, n, "%s/%016llx%016llx#", tc->persist, (unsigned long long)h[0], (unsigned long long)h[1]);
    for (const char *p = tc->key[i]; *p && w > 0 && (size_t)w + 2 < n; p++)
        buf[w++] = *p == '/' ? '@' : *p;
    snprintf(buf + w, n - (size_t)w, ".safetensors");
}

/* The slot's tensor: from its persistent file when one is there, else decoded from the source
 * (read once: its bytes name the persistent file and are decoded), then persisted. */
static int decode(struct tcache *tc, int64_t i, enum ghc_sample_kind kind, ghc_tensor_t **out)
{
    char path[8192];
    enum ghc_mem_role role = ghc_sample_kind_role(kind);
    int rc;
    if (!tc->persist) {
        if ((rc = ghc_cache_decode(tc->core, tc->backend, tc->file[i], tc->key[i], role, out)) < 0)
            return rc;
        goto placed;
    }
    const void *data;
    void *owned;
    size_t len;
    uint64_t size;
    if ((rc = ghc_backend_fetch(tc->backend, tc->file[i], 0, &data, &owned, &len, &size)) < 0)
        return rc;
    persist_path(tc, i, data, len, path, sizeof(path));
    if (access(path, R_OK) == 0) {
        ghc_st_t *st = ghc_st_open(tc->core, path);
        struct ghc_st_info info;
        if (st && ghc_st_find(st, tc->key[i], &info) && (*out = ghc_st_load(st, tc->key[i], info.dtype, role))) {
            ghc_st_free(st);
            free(owned);
            __atomic_add_fetch(&tc->st.persist_hits, 1, __ATOMIC_RELAXED);
            goto placed;
        }
        ghc_st_free(st);
        ghc_log(tc->core, GHC_LOG_WARN, "%s: %s: unusable, decoding again: %s", tc->name, path, ghc_error_message(tc->core));
        ghc_error_clear(tc->core);
    }
    rc = ghc_cache_decode_bytes(tc->core, tc->file[i], data, len, size, tc->key[i], role, out);
    free(owned);
    if (rc < 0)
        return rc;
    ghc_st_writer_t *w = ghc_st_writer_init(tc->core);
    if (!w || ghc_st_writer_add(w, tc->key[i], *out) < 0 || ghc_st_writer_finish(w, path) < 0) {
        ghc_log(tc->core, GHC_LOG_WARN, "%s: cannot write %s: %s", tc->name, path, ghc_error_message(tc->core));
        ghc_error_clear(tc->core);
    } else {
        __atomic_add_fetch(&tc->st.persisted, 1, __ATOMIC_RELAXED);
    }
    ghc_st_writer_free(w);
placed:
    if (tc->advise) {
        ghc_mempolicy_t *mp = ghc_mempolicy_get(tc->core);
        if (mp && ghc_mem_advise(mp, ghc_tensor_data(*out), ghc_tensor_nbytes(*out), role) < 0) {
            ghc_log(tc->core, GHC_LOG_DEBUG, "%s: advise: %s", tc->name, ghc_error_message(tc->core));
            ghc_error_clear(tc->core);
        }
    }
    return 0;
}

int tcache_get(struct tcache *tc, int64_t index, enum ghc_sample_kind kind, ghc_tensor_t **out)
{
    int64_t i = index * K + kind;
    *out = NULL;
    if (!tc->file[i])
        return ghc_error_set(tc->core, GHC_ENOTFOUND, "%s: sample %lld has no %s", tc->name, (long long)index,
                             ghc_sample_kind_name(kind));
    pthread_mutex_lock(&tc->lock);
    if (tc->slot[i].t) {
        tc->slot[i].pins++;
        lru_unlink(tc, i);
        lru_front(tc, i);
        tc->st.hits++;
        *out = tc->slot[i].t;
        pthread_mutex_unlock(&tc->lock);
        return 0;
    }
    pthread_mutex_unlock(&tc->lock);
    ghc_tensor_t *t;
    int rc = decode(tc, i, kind, &t);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&tc->lock);
    if (tc->slot[i].t) {        /* decoded meanwhile by another thread */
        ghc_tensor_free(t);
        t = tc->slot[i].t;
        lru_unlink(tc, i);
    } else {
        tc->slot[i].t = t;
        tc->st.misses++;
        tc->st.decoded_bytes += ghc_tensor_nbytes(t);
        tc->st.held_bytes += ghc_tensor_nbytes(t);
    }
    tc->slot[i].pins++;
    lru_front(tc, i);
    evict(tc);
    *out = t;
    pthread_mutex_unlock(&tc->lock);
    return 0;
}

void tcache_release(struct tcache *tc, int64_t index, enum ghc_sample_kind kind, ghc_tensor_t *t)
{
    int64_t i = index * K + kind;
    pthread_mutex_lock(&tc->lock);
    if (tc->slot[i].t == t && tc->slot[i].pins > 0)
        tc->slot[i].pins--;
    evict(tc);
    pthread_mutex_unlock(&tc->lock);
}

int tcache_prefetch(struct tcache *tc, int64_t index, int device, void *stream)
{
    static const enum ghc_sample_kind kinds[] = { GHC_SAMPLE_LATENT, GHC_SAMPLE_TEXT_EMBED, GHC_SAMPLE_NOISE };
    ghc_mempolicy_t *mp = ghc_mempolicy_get(tc->core);
    for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
        if (!tc->file[index * K + kinds[k]])
            continue;
        ghc_tensor_t *t;
        int rc = tcache_get(tc, index, kinds[k], &t);
        if (rc < 0)
            return rc;
        if (device >= 0 && mp) {
            size_t bytes = ghc_tensor_nbytes(t);
            rc = ghc_mem_prefetch(mp, ghc_tensor_data(t), bytes, device, stream);
            if (rc == 0)
                __atomic_add_fetch(&tc->st.prefetched_bytes, bytes, __ATOMIC_RELAXED);
        }
        tcache_release(tc, index, kinds[k], t);
        if (rc < 0)
            return rc;
    }
    return 0;
}

int tcache_stats(struct tcache *tc, struct ghc_cache_stats *out)
{
    pthread_mutex_lock(&tc->lock);
    struct ghc_cache_stats s = tc->st;
    pthread_mutex_unlock(&tc->lock);
    s.struct_size = out->struct_size;
    *out = s;
    return 0;
}
