/* device.cu: CUDA device queries and a smoke kernel (see device.h). */
#include <cuda_runtime.h>

#include "device.h"

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
    return cudaGetErrorString((cudaError_t)err);
}
