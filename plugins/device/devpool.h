/* devpool.h: the caching device pool shared by the device and offload policies: each CUDA
 * device's default stream-ordered pool with the release threshold at UINT64_MAX (6 us instead
 * of 236 us per alloc/free, doc/memory.md), allocations ordered on the legacy stream the
 * ops use, a retry after trimming when it runs out. Compiled into each plugin; not installed. */
#ifndef GHC_DEVPOOL_H
#define GHC_DEVPOOL_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#define DEVPOOL_MAX 64   /* CUDA ordinals with a pool */

struct devpool {
    cudaMemPool_t pool[DEVPOOL_MAX];   /* set up on first use */
};

/* n bytes on `device` into *ptr; after cudaErrorMemoryAllocation the pools are synchronised
 * and trimmed and it is tried once more. Returns the CUDA status. */
cudaError_t devpool_alloc(struct devpool *p, int device, size_t n, void **ptr);
/* Back to the pool, after the work queued on the legacy stream. */
void devpool_release(void *ptr);
/* Give every pool's cached blocks back; `sync` first waits for the device. */
void devpool_trim(struct devpool *p, int sync);

#endif /* GHC_DEVPOOL_H */
