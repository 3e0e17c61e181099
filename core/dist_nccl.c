/* dist_nccl.c: the gradient all-reduce of several ranks on CUDA devices, through NCCL (dist.h).
 * Built with --with-nccl only. The communicator is made on the first all-reduce, on the device
 * the model computes on, from the unique id rank 0 handed out in the rendezvous. */
#include <config.h>

#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "dist.h"

struct ghc_nccl {
    ncclUniqueId id;
    ncclComm_t   comm;
    int          device;   /* -1 until the communicator exists */
};

int ghc_nccl_id(ghc_core_t *core, void *blob, size_t len)
{
    ncclUniqueId id;
    if (len < sizeof(id))
        return ghc_error_set(core, GHC_EINTERNAL, "dist: the rendezvous blob (%zu bytes) cannot hold NCCL's id (%zu)",
                             len, sizeof(id));
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess)
        return ghc_error_set(core, GHC_EIO, "dist: ncclGetUniqueId: %s", ncclGetErrorString(r));
    memcpy(blob, &id, sizeof(id));
    return 0;
}

int ghc_nccl_new(ghc_core_t *core, const void *blob, size_t len, struct ghc_nccl **out)
{
    struct ghc_nccl *n = calloc(1, sizeof(*n));
    if (!n)
        return ghc_error_set(core, GHC_ENOMEM, "dist: out of memory");
    if (len < sizeof(n->id)) {
        free(n);
        return ghc_error_set(core, GHC_EINTERNAL, "dist: the rendezvous blob is smaller than NCCL's id");
    }
    memcpy(&n->id, blob, sizeof(n->id));
    n->device = -1;
    *out = n;
    return 0;
}

int ghc_nccl_allreduce(ghc_core_t *core, struct ghc_nccl *n, int rank, int world, float *buf, int64_t count,
                       int device, void *stream)
{
    ncclResult_t r;
    if (n->device < 0) {
        cudaError_t ce = cudaSetDevice(device);
        if (ce != cudaSuccess)
            return ghc_error_set(core, GHC_EIO, "dist: cudaSetDevice(%d): %s", device, cudaGetErrorString(ce));
        if ((r = ncclCommInitRank(&n->comm, world, n->id, rank)) != ncclSuccess)
            return ghc_error_set(core, GHC_EIO, "dist: rank %d of %d: ncclCommInitRank on CUDA device %d: %s", rank,
                                 world, device, ncclGetErrorString(r));
        n->device = device;
    } else if (device != n->device) {
        return ghc_error_set(core, GHC_EINTERNAL, "dist: an all-reduce on CUDA device %d, the communicator is on %d",
                             device, n->device);
    }
    r = ncclAllReduce(buf, buf, (size_t)count, ncclFloat32, ncclSum, n->comm, (cudaStream_t)stream);
    if (r != ncclSuccess)
        return ghc_error_set(core, GHC_EIO, "dist: ncclAllReduce of %lld floats: %s (%s)", (long long)count,
                             ncclGetErrorString(r), ncclGetLastError(n->comm));
    return 0;
}

void ghc_nccl_free(struct ghc_nccl *n)
{
    if (!n)
        return;
    if (n->device >= 0)
        ncclCommDestroy(n->comm);
    free(n);
}
