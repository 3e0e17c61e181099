/* tcache.h: the table of decoded sample tensors that the disk and unified_memory caches share:
 * bind, pinned get/release, an optional byte budget with LRU eviction of unpinned tensors, an
 * optional persistent folder of decoded tensors, statistics. Thread-safe. Not installed. */
#ifndef GHC_TCACHE_H
#define GHC_TCACHE_H

#include <gh200core/cache.h>

struct tcache;

/* `budget` bytes of held tensors (0: no limit, nothing is evicted); `persist`: a folder for
 * decoded tensors (NULL: none); `advise`: call ghc_mem_advise with the kind's role on each
 * tensor decoded (placement hints). NULL on failure (message set). */
struct tcache *tcache_init(ghc_core_t *core, const char *name, uint64_t budget, const char *persist, bool advise);
void tcache_free(struct tcache *tc);
int tcache_bind(struct tcache *tc, ghc_backend_t *b, const struct ghc_sample_ref *s, int64_t n);
int64_t tcache_count(struct tcache *tc);
int tcache_get(struct tcache *tc, int64_t index, enum ghc_sample_kind kind, ghc_tensor_t **out);
void tcache_release(struct tcache *tc, int64_t index, enum ghc_sample_kind kind, ghc_tensor_t *t);
/* Decode the sample's tensors now (when absent); with device >= 0 also prefetch them there
 * through the mempolicy on `stream`. */
int tcache_prefetch(struct tcache *tc, int64_t index, int device, void *stream);
int tcache_stats(struct tcache *tc, struct ghc_cache_stats *out);

#endif /* GHC_TCACHE_H */
