/* saved_cuda.c: the CUDA io of the saved-activation ring (saved.h) for offload and gh200_uvm:
 * events without timing, one non-blocking copy stream for both directions (a unit's copy home
 * and its copy back are then in order without an event between them), the ring's buffers from
 * the policy's pool. */
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "saved.h"

struct saved_cuda {
    ghc_core_t   *core;
    int           device;
    cudaStream_t  copy;
    int         (*buf_alloc)(void *, size_t, void **);
    void        (*buf_free)(void *, void *);
    void         *buf_ctx;
};

static int sc_fail(struct saved_cuda *c, cudaError_t e, const char *what)
{
    cudaGetLastError();
    return ghc_error_set(c->core, e == cudaErrorMemoryAllocation ? GHC_ENOMEM : GHC_ECUDA,
                         "saved activations: %s on cuda:%d: %s", what, c->device, cudaGetErrorString(e));
}

static int sc_buf_alloc(void *ctx, size_t n, void **buf)
{
    struct saved_cuda *c = ctx;
    return c->buf_alloc(c->buf_ctx, n, buf);
}

static void sc_buf_free(void *ctx, void *buf)
{
    struct saved_cuda *c = ctx;
    c->buf_free(c->buf_ctx, buf);
}

static int sc_event_make(void *ctx, void **ev)
{
    cudaEvent_t e;
    cudaError_t s = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    if (s != cudaSuccess)
        return sc_fail(ctx, s, "cudaEventCreate");
    *ev = e;
    return 0;
}

static void sc_event_free(void *ctx, void *ev)
{
    (void)ctx;
    cudaEventDestroy((cudaEvent_t)ev);
    cudaGetLastError();
}

static void sc_record(void *ctx, void *ev, void *stream)
{
    (void)ctx;
    cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)stream);
}

static void sc_wait(void *ctx, void *stream, void *ev)
{
    (void)ctx;
    cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)ev, 0);   /* never recorded: no wait */
}

static int sc_copy(void *ctx, void *dst, const void *src, size_t n, bool to_ring, void *after, void *done)
{
    struct saved_cuda *c = ctx;
    cudaError_t e = cudaSuccess;
    if (after)
        e = cudaStreamWaitEvent(c->copy, (cudaEvent_t)after, 0);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(dst, src, n, to_ring ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, c->copy);
    if (e == cudaSuccess && done)
        e = cudaEventRecord((cudaEvent_t)done, c->copy);
    return e == cudaSuccess ? 0 : sc_fail(c, e, to_ring ? "copying a saved unit back" : "copying a saved unit home");
}

static void sc_sync(void *ctx)
{
    (void)ctx;
    cudaDeviceSynchronize();
    cudaGetLastError();
}

int saved_cuda_io(ghc_core_t *core, int device, int (*buf_alloc)(void *, size_t, void **),
                  void (*buf_free)(void *, void *), void *buf_ctx, struct saved_io *io)
{
    struct saved_cuda *c = calloc(1, sizeof(*c));
    if (!c)
        return ghc_error_set(core, GHC_ENOMEM, "saved activations: out of memory");
    *c = (struct saved_cuda){ .core = core, .device = device, .buf_alloc = buf_alloc, .buf_free = buf_free,
                              .buf_ctx = buf_ctx };
    cudaError_t e = cudaStreamCreateWithFlags(&c->copy, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        int rc = sc_fail(c, e, "creating the copy stream");
        free(c);
        return rc;
    }
    *io = (struct saved_io){ .ctx = c, .buf_alloc = sc_buf_alloc, .buf_free = sc_buf_free, .event_make = sc_event_make,
                             .event_free = sc_event_free, .record = sc_record, .wait = sc_wait, .copy = sc_copy,
                             .sync = sc_sync };
    return 0;
}

void saved_cuda_io_free(struct saved_io *io)
{
    struct saved_cuda *c = io->ctx;
    if (!c)
        return;
    cudaStreamDestroy(c->copy);
    cudaGetLastError();
    free(c);
    io->ctx = NULL;
}
