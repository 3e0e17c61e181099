/* devpool.c: the caching device pool of the device and offload policies (devpool.h). */
#include <stdint.h>

#include "devpool.h"

static cudaError_t devpool_get(struct devpool *p, int device, cudaMemPool_t *out)
{
    if (device < 0 || device >= DEVPOOL_MAX)
        return cudaErrorInvalidDevice;
    if (!p->pool[device]) {
        cudaMemPool_t pool;
        uint64_t keep = UINT64_MAX;
        cudaError_t e = cudaDeviceGetDefaultMemPool(&pool, device);
        if (e == cudaSuccess)
            e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
        if (e != cudaSuccess)
            return e;
        p->pool[device] = pool;
    }
    *out = p->pool[device];
    return cudaSuccess;
}

cudaError_t devpool_alloc(struct devpool *p, int device, size_t n, void **ptr)
{
    cudaMemPool_t pool;
    cudaError_t e = devpool_get(p, device, &pool);
    if (e != cudaSuccess)
        return e;
    if ((e = cudaMallocFromPoolAsync(ptr, n, pool, NULL)) != cudaErrorMemoryAllocation)
        return e;
    cudaGetLastError();
    devpool_trim(p, 1);
    return cudaMallocFromPoolAsync(ptr, n, pool, NULL);
}

void devpool_release(void *ptr)
{
    cudaFreeAsync(ptr, NULL);
}

void devpool_trim(struct devpool *p, int sync)
{
    if (sync)
        cudaDeviceSynchronize();
    for (int i = 0; i < DEVPOOL_MAX; i++)
        if (p->pool[i])
            cudaMemPoolTrimTo(p->pool[i], 0);
    cudaGetLastError();
}
