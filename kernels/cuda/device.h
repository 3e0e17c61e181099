/* device.h: CUDA device queries for plugins and tests (plain C; no CUDA types).
 * Built into libghc_cuda.la, which only CUDA plugins and GPU tests link. */
#ifndef GHC_KERNELS_DEVICE_H
#define GHC_KERNELS_DEVICE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Number of usable CUDA devices; 0 when there is no driver or no device. Never fails. */
int ghc_k_device_count(void);

/* Name, compute capability and memory of device `dev`. Returns 0 or a cudaError_t. */
int ghc_k_device_info(int dev, char *name, size_t name_len, int *major, int *minor,
                      size_t *free_bytes, size_t *total_bytes);

/* y[i] = a * x[i] + y[i] on device memory, on `stream` (a cudaStream_t, NULL = default).
 * A smoke kernel: proves that code built by nvcc through libtool runs. Returns 0 or a
 * cudaError_t. */
int ghc_k_axpy_f32(float *y, const float *x, float a, size_t n, void *stream);

/* cudaGetErrorString() of a code from the functions above. Static. */
const char *ghc_k_error_string(int err);

#ifdef __cplusplus
}
#endif

#endif /* GHC_KERNELS_DEVICE_H */
