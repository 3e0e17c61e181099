/* tensor.h: tensors: a dtype, up to 5 dimensions (row-major, contiguous), a device, and
 * memory taken through the run's memory policy with a role. Also the scalar conversions
 * between the float formats (bf16, f16, fp8 e4m3/e5m2) that files and kernels use. */
#ifndef GHC_TENSOR_H
#define GHC_TENSOR_H

#include <gh200core/mempolicy.h>   /* defines: enum ghc_mem_role, GHC_DEVICE_CPU */

GHC_BEGIN_DECLS

/* ---- dtypes ------------------------------------------------------------------------------- */

enum ghc_dtype {
    GHC_DTYPE_F32 = 0,
    GHC_DTYPE_BF16,
    GHC_DTYPE_F16,
    GHC_DTYPE_F8_E4M3,    /* OCP e4m3fn: no inf, max 448, NaN = 0x7f/0xff */
    GHC_DTYPE_F8_E5M2,    /* OCP e5m2: IEEE-like, max 57344 */
    GHC_DTYPE_I64,
    GHC_DTYPE_I32,
    GHC_DTYPE_U8,
    GHC_DTYPE_BOOL,
    GHC_DTYPE_COUNT
};

#define GHC_TENSOR_MAX_DIMS 5

/* Bytes per element (1, 2, 4 or 8); 0 for an out-of-range value. */
GHC_API size_t ghc_dtype_size(enum ghc_dtype dt);
/* The safetensors name: "F32", "BF16", "F16", "F8_E4M3", "F8_E5M2", "I64", "I32", "U8",
 * "BOOL". Static; "?" when out of range. */
GHC_API const char *ghc_dtype_name(enum ghc_dtype dt);
/* The dtype of a safetensors name. Returns false for an unknown name. */
GHC_API bool ghc_dtype_from_name(const char *name, enum ghc_dtype *out);
/* True for the five floating-point dtypes. */
GHC_API bool ghc_dtype_is_float(enum ghc_dtype dt);

/* ---- scalar conversions (exact, the same on CPU and GPU) -------------------------------------- */

/* f32 -> narrower formats round to nearest, ties to even. NaN stays NaN. Overflow: bf16 and
 * f16 give inf; e4m3 saturates to +-448 (it has no inf); e5m2 gives inf. */
GHC_API uint16_t ghc_f32_to_bf16(float x);
GHC_API float    ghc_bf16_to_f32(uint16_t x);
GHC_API uint16_t ghc_f32_to_f16(float x);
GHC_API float    ghc_f16_to_f32(uint16_t x);
GHC_API uint8_t  ghc_f32_to_e4m3(float x);
GHC_API float    ghc_e4m3_to_f32(uint8_t x);
GHC_API uint8_t  ghc_f32_to_e5m2(float x);
GHC_API float    ghc_e5m2_to_f32(uint8_t x);

/* ---- tensors ------------------------------------------------------------------------------ */

/* A tensor of `dtype` and `shape` (ndim 0..5; 0 is a scalar of one element) on `device`
 * (GHC_DEVICE_CPU or a CUDA ordinal). Memory comes from the run's memory policy
 * (ghc_mempolicy_get) with `role`; without one, CPU memory comes from the C library and a
 * CUDA tensor is GHC_EUNSUPPORTED. The contents are undefined. Returns NULL on error (message
 * in ghc_error_message(core)). Free with ghc_tensor_free(). */
GHC_API ghc_tensor_t *ghc_tensor_init(ghc_core_t *core, enum ghc_dtype dtype, int ndim,
                                      const int64_t *shape, int device, enum ghc_mem_role role);
/* A tensor over memory the caller owns (`data`, at least numel * dtype size bytes on
 * `device`), which must outlive it; ghc_tensor_free() frees only the handle. NULL on error. */
GHC_API ghc_tensor_t *ghc_tensor_wrap(ghc_core_t *core, enum ghc_dtype dtype, int ndim,
                                      const int64_t *shape, int device, void *data);
/* Release the tensor and, unless wrapped, its memory. NULL is a no-op. */
GHC_API void ghc_tensor_free(ghc_tensor_t *t);

GHC_API enum ghc_dtype ghc_tensor_dtype(const ghc_tensor_t *t);
GHC_API int            ghc_tensor_ndim(const ghc_tensor_t *t);
/* Size of dimension `i`; negative i counts from the end (-1 is the last). 1 out of range. */
GHC_API int64_t        ghc_tensor_dim(const ghc_tensor_t *t, int i);
/* The shape array (ndim entries). Borrowed; valid while t lives and is not reshaped. */
GHC_API const int64_t *ghc_tensor_shape(const ghc_tensor_t *t);
GHC_API int64_t        ghc_tensor_numel(const ghc_tensor_t *t);
GHC_API size_t         ghc_tensor_nbytes(const ghc_tensor_t *t);
GHC_API int            ghc_tensor_device(const ghc_tensor_t *t);
GHC_API enum ghc_mem_role ghc_tensor_role(const ghc_tensor_t *t);
/* The first element. Borrowed; valid while t lives. */
GHC_API void          *ghc_tensor_data(ghc_tensor_t *t);
GHC_API const void    *ghc_tensor_cdata(const ghc_tensor_t *t);
GHC_API ghc_core_t    *ghc_tensor_core(const ghc_tensor_t *t);
/* Give the same elements a new shape (same numel). Returns 0 or GHC_EINVAL. */
GHC_API int ghc_tensor_reshape(ghc_tensor_t *t, int ndim, const int64_t *shape);
/* True when a and b have the same ndim and sizes. */
GHC_API bool ghc_tensor_same_shape(const ghc_tensor_t *a, const ghc_tensor_t *b);
/* "[2, 3, 4] bf16 cuda:0" into buf. Returns buf. */
GHC_API const char *ghc_tensor_describe(const ghc_tensor_t *t, char *buf, size_t len);
/* Product of shape[0..ndim) into *out; false on a negative size or int64 overflow. */
GHC_API bool ghc_shape_numel(int ndim, const int64_t *shape, int64_t *out);

/* Column views (since API 6). A tensor's rows are the lines of its last dimension, all leading
 * dimensions flattened; a dense tensor's rows are that dimension's size apart, a column view's
 * are its parent's row stride apart. A view of columns [col0, col0 + ncols) of t's last
 * dimension (every other dimension kept), over t's memory (which must outlive it; free the
 * view with ghc_tensor_free). NULL on error (out of range). ghc_op_gemm takes column views
 * (ops.h), and since API 7 ghc_op_cast, ghc_op_copy, the outputs of ghc_op_layernorm_fwd and
 * ghc_op_gelu_tanh and attention's o (ops.h says how); every other op, ghc_tensor_convert_cpu
 * and a reshape that changes the last dimension refuse them (GHC_EINVAL). */
GHC_API ghc_tensor_t *ghc_tensor_view_cols(const ghc_tensor_t *t, int64_t col0, int64_t ncols);
/* Elements between the starts of consecutive rows: the last dimension's size unless t is a
 * column view (since API 6). */
GHC_API int64_t ghc_tensor_row_stride(const ghc_tensor_t *t);

/* CPU conversion between any two float dtypes (or a copy for equal dtypes), element by
 * element with the rounding above: dst = src * scale. Both tensors on the CPU with equal
 * numel. Returns 0 or GHC_EINVAL. (On any device: ghc_op_cast in ops.h.) */
GHC_API int ghc_tensor_convert_cpu(ghc_tensor_t *dst, const ghc_tensor_t *src, float scale);
/* (since API 15) The index of the first NaN or infinite element of a dense float tensor on the
 * CPU, for the checks of what a file held; -1 when every element is finite (or t is not such a
 * tensor). */
GHC_API int64_t ghc_tensor_find_nonfinite(const ghc_tensor_t *t);

GHC_END_DECLS

#endif /* GHC_TENSOR_H */
