/* device.cu: CUDA device queries and a smoke kernel (see device.h), and the memory entries
 * of kernels.h: copies between any two devices (column views as 2-D copies), stream
 * synchronisation and the ops' scratch memory per (device, stream). */
#include <cstring>
#include <mutex>

#include <cuda_runtime.h>

#include "device.h"
#include "kernels.h"   /* defines: ghc_k_copy, ghc_k_sync, ghc_tensor_t */

extern "C" int ghc_k_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();   /* clear the sticky "no device" error */
        return 0;
    }
    return n;
}

extern "C" int ghc_k_device_info(int dev, char *name, size_t name_len, int *major, int *minor,
                                 size_t *free_bytes, size_t *total_bytes)
{
    cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, dev);
    if (e != cudaSuccess)
        return (int)e;
    if (name && name_len) {
        size_t i = 0;
        for (; i + 1 < name_len && p.name[i]; i++)
            name[i] = p.name[i];
        name[i] = '\0';
    }
    *major = p.major;
    *minor = p.minor;
    if ((e = cudaSetDevice(dev)) != cudaSuccess)
        return (int)e;
    return (int)cudaMemGetInfo(free_bytes, total_bytes);
}

static __global__ void axpy_f32(float *y, const float *x, float a, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = a * x[i] + y[i];
}

extern "C" int ghc_k_axpy_f32(float *y, const float *x, float a, size_t n, void *stream)
{
    if (n == 0)
        return 0;
    unsigned blocks = (unsigned)((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096);
    axpy_f32<<<blocks, 256, 0, (cudaStream_t)stream>>>(y, x, a, n);
    return (int)cudaGetLastError();
}

extern "C" const char *ghc_k_error_string(int err)
{
    /* The runtime says "CUDA driver version is insufficient for CUDA runtime version" also
     * where no driver is installed at all (a machine without a GPU): tell the two apart. */
    if (err == cudaErrorInsufficientDriver) {
        int drv = 0;
        if (cudaDriverGetVersion(&drv) != cudaSuccess || drv == 0)
            return "no NVIDIA driver is installed (libcuda.so.1 not found): this machine has no usable GPU";
        return "the NVIDIA driver is older than the CUDA runtime gh200core was built with: update the driver";
    }
    if (err == cudaErrorNoDevice)
        return "no NVIDIA GPU is visible (the driver is loaded: check nvidia-smi and CUDA_VISIBLE_DEVICES)";
    return cudaGetErrorString((cudaError_t)err);
}

/* ---- copies and synchronisation (kernels.h) ----------------------------------------------- */

/* Make `dev` current while in scope (a CUDA ordinal; the CPU, -1, changes nothing). */
struct dev_scope {
    int prev = -1;
    explicit dev_scope(int dev)
    {
        if (dev < 0 || cudaGetDevice(&prev) != cudaSuccess || prev == dev || cudaSetDevice(dev) != cudaSuccess)
            prev = -1;
    }
    ~dev_scope()
    {
        if (prev >= 0)
            cudaSetDevice(prev);
    }
};

extern "C" int ghc_k_copy(ghc_tensor_t *dst, const ghc_tensor_t *src, void *stream)
{
    size_t n = ghc_tensor_nbytes(src);
    void *d = ghc_tensor_data(dst);
    const void *s = ghc_tensor_cdata(src);
    const int64_t D = ghc_tensor_dim(src, -1), ldd = ghc_tensor_row_stride(dst), lds = ghc_tensor_row_stride(src);
    const bool views = ldd != ghc_tensor_dim(dst, -1) || lds != D;   /* ops.c: then both last dims are D */
    if (n == 0 || (d == s && !views))
        return 0;
    /* the stream belongs to the GPU side (the destination's when both are GPUs); unified
     * addressing tells cudaMemcpyDefault the direction */
    int dev = ghc_tensor_device(dst) >= 0 ? ghc_tensor_device(dst) : ghc_tensor_device(src);
    dev_scope scope(dev);
    if (views) {   /* rows of D elements */
        size_t es = ghc_dtype_size(ghc_tensor_dtype(src));
        return (int)cudaMemcpy2DAsync(d, (size_t)ldd * es, s, (size_t)lds * es, (size_t)D * es, n / ((size_t)D * es),
                                      cudaMemcpyDefault, (cudaStream_t)stream);
    }
    return (int)cudaMemcpyAsync(d, s, n, cudaMemcpyDefault, (cudaStream_t)stream);
}

extern "C" int ghc_k_sync(int device, void *stream)
{
    dev_scope scope(device);
    return (int)cudaStreamSynchronize((cudaStream_t)stream);
}

/* ---- scratch ------------------------------------------------------------------------------ */

namespace {
struct scratch {
    int device;
    cudaStream_t stream;
    void *ptr;
    size_t bytes;
};
std::mutex g_scratch_lock;
scratch g_scratch[32];
int g_nscratch;
}   /* namespace */

extern "C" int ghc_k_scratch(int dev, void *stream, size_t bytes, void **out)
{
    cudaStream_t st = (cudaStream_t)stream;
    std::lock_guard<std::mutex> lk(g_scratch_lock);
    scratch *s = NULL;
    for (int i = 0; i < g_nscratch; i++)
        if (g_scratch[i].device == dev && g_scratch[i].stream == st)
            s = &g_scratch[i];
    if (!s) {
        if (g_nscratch == 32)
            return (int)cudaErrorMemoryAllocation;
        s = &g_scratch[g_nscratch++];
        *s = scratch{ dev, st, NULL, 0 };
    }
    if (s->bytes < bytes) {
        cudaError_t e;
        if (s->ptr) {
            /* the old buffer may still be in use by work queued on this stream */
            if ((e = cudaStreamSynchronize(st)) != cudaSuccess)
                return (int)e;
            cudaFree(s->ptr);
            s->ptr = NULL;
            s->bytes = 0;
        }
        size_t grow = bytes + bytes / 8;
        if ((e = cudaMalloc(&s->ptr, grow)) != cudaSuccess) {
            cudaGetLastError();
            if ((e = cudaMalloc(&s->ptr, bytes)) != cudaSuccess)
                return (int)e;
            grow = bytes;
        }
        s->bytes = grow;
    }
    *out = s->ptr;
    return 0;
}

/* ---- the speed probe of ghc_op_device_speed ------------------------------------------------ */

/* The median of n timings (n <= 8). */
static double median_ms(float *ms, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && ms[j] < ms[j - 1]; j--) {
            float t = ms[j];
            ms[j] = ms[j - 1];
            ms[j - 1] = t;
        }
    return n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
}

extern "C" int ghc_k_device_speed(ghc_core_t *core, int dev, double *flops, double *h2d)
{
    enum { N = 4096, REPS = 6 };
    const size_t mat = (size_t)N * N * 2, copy = (size_t)128 << 20;
    void *a = NULL, *b = NULL, *c = NULL, *dst = NULL, *src = NULL;
    cudaStream_t s = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    ghc_tensor_t *ta = NULL, *tb = NULL, *tc = NULL;
    float ms[REPS];
    int err = cudaSetDevice(dev);
    const int64_t shape[2] = { N, N };
    const struct ghc_rng rng = { 0x5eed, 0 };
    struct ghc_gemm nt = {};
    nt.trans_b = true;
    *flops = *h2d = 0;
#define TRY_K(x)                  \
    do {                          \
        if ((err = (int)(x)) != 0) \
            goto out;             \
    } while (0)
    TRY_K(err);
    TRY_K(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    TRY_K(cudaEventCreate(&e0));
    TRY_K(cudaEventCreate(&e1));
    TRY_K(cudaMalloc(&a, mat));
    TRY_K(cudaMalloc(&b, mat));
    TRY_K(cudaMalloc(&c, mat));
    TRY_K(cudaMalloc(&dst, copy));
    TRY_K(cudaMallocHost(&src, copy));
    memset(src, 0, copy);
    ta = ghc_tensor_wrap(core, GHC_DTYPE_BF16, 2, shape, dev, a);
    tb = ghc_tensor_wrap(core, GHC_DTYPE_BF16, 2, shape, dev, b);
    tc = ghc_tensor_wrap(core, GHC_DTYPE_BF16, 2, shape, dev, c);
    if (!ta || !tb || !tc) {
        err = (int)cudaErrorMemoryAllocation;
        goto out;
    }
    /* random operands: a product of zeros runs faster than the real thing */
    TRY_K(ghc_k_rand_normal(ta, &rng, s));
    TRY_K(ghc_k_rand_normal(tb, &rng, s));
    TRY_K(ghc_k_gemm(tc, ta, tb, &nt, s));   /* warm-up: the plan, the clocks */
    TRY_K(ghc_k_gemm(tc, ta, tb, &nt, s));
    for (int i = 0; i < REPS; i++) {
        TRY_K(cudaEventRecord(e0, s));
        TRY_K(ghc_k_gemm(tc, ta, tb, &nt, s));
        TRY_K(cudaEventRecord(e1, s));
        TRY_K(cudaEventSynchronize(e1));
        TRY_K(cudaEventElapsedTime(&ms[i], e0, e1));
    }
    *flops = 2.0 * N * N * (double)N / (median_ms(ms, REPS) * 1e-3);
    TRY_K(cudaMemcpyAsync(dst, src, copy, cudaMemcpyHostToDevice, s));
    for (int i = 0; i < REPS; i++) {
        TRY_K(cudaEventRecord(e0, s));
        TRY_K(cudaMemcpyAsync(dst, src, copy, cudaMemcpyHostToDevice, s));
        TRY_K(cudaEventRecord(e1, s));
        TRY_K(cudaEventSynchronize(e1));
        TRY_K(cudaEventElapsedTime(&ms[i], e0, e1));
    }
    *h2d = (double)copy / (median_ms(ms, REPS) * 1e-3);
out:
#undef TRY_K
    if (s)
        cudaStreamSynchronize(s);
    ghc_tensor_free(ta);
    ghc_tensor_free(tb);
    ghc_tensor_free(tc);
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
    cudaFree(dst);
    cudaFreeHost(src);
    if (e0)
        cudaEventDestroy(e0);
    if (e1)
        cudaEventDestroy(e1);
    if (s)
        cudaStreamDestroy(s);
    return err;
}
