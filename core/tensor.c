/* tensor.c: tensors (shape, dtype, device, memory by role through the mempolicy) and the
 * exact scalar conversions between f32 and the narrow float formats. */
#include <config.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core_impl.h"
#include "elem.h"   /* defines: ghc_cpu_load, ghc_cpu_store */

#include <gh200core/tensor.h>

/* ---- dtypes ------------------------------------------------------------------------------- */

static const struct {
    const char *name;
    size_t      size;
    bool        is_float;
} dtypes[GHC_DTYPE_COUNT] = {
    [GHC_DTYPE_F32]     = { "F32", 4, true },
    [GHC_DTYPE_BF16]    = { "BF16", 2, true },
    [GHC_DTYPE_F16]     = { "F16", 2, true },
    [GHC_DTYPE_F8_E4M3] = { "F8_E4M3", 1, true },
    [GHC_DTYPE_F8_E5M2] = { "F8_E5M2", 1, true },
    [GHC_DTYPE_I64]     = { "I64", 8, false },
    [GHC_DTYPE_I32]     = { "I32", 4, false },
    [GHC_DTYPE_U8]      = { "U8", 1, false },
    [GHC_DTYPE_BOOL]    = { "BOOL", 1, false },
};

size_t ghc_dtype_size(enum ghc_dtype dt)
{
    return (unsigned)dt < GHC_DTYPE_COUNT ? dtypes[dt].size : 0;
}

const char *ghc_dtype_name(enum ghc_dtype dt)
{
    return (unsigned)dt < GHC_DTYPE_COUNT ? dtypes[dt].name : "?";
}

bool ghc_dtype_from_name(const char *name, enum ghc_dtype *out)
{
    for (int i = 0; i < GHC_DTYPE_COUNT; i++)
        if (strcmp(dtypes[i].name, name) == 0) {
            *out = (enum ghc_dtype)i;
            return true;
        }
    return false;
}

bool ghc_dtype_is_float(enum ghc_dtype dt)
{
    return (unsigned)dt < GHC_DTYPE_COUNT && dtypes[dt].is_float;
}

/* ---- scalar conversions ------------------------------------------------------------------- */

static uint32_t f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static float bits_f32(uint32_t u)
{
    float x;
    memcpy(&x, &u, 4);
    return x;
}

uint16_t ghc_f32_to_bf16(float x)
{
    uint32_t u = f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)          /* NaN: keep it quiet and a NaN */
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);               /* round to nearest, ties to even */
    return (uint16_t)(u >> 16);
}

float ghc_bf16_to_f32(uint16_t x) { return bits_f32((uint32_t)x << 16); }

/* A generic round-to-nearest-even encoder for small IEEE-like formats with `ebits` exponent
 * and `mbits` mantissa bits and bias 2^(ebits-1)-1. Returns the magnitude bits (no sign);
 * `max_bits` is the largest finite encoding, `inf_bits` what overflow gives. */
static uint32_t encode_small(float ax, int ebits, int mbits, uint32_t max_bits, uint32_t inf_bits,
                             float max_finite)
{
    int bias = (1 << (ebits - 1)) - 1;
    if (ax == 0.0f)
        return 0;
    int e;
    frexpf(ax, &e);                                /* ax = m 2^e, m in [0.5, 1) */
    int exp = e - 1;                               /* ax = (2m) 2^exp, 2m in [1, 2) */
    int min_exp = 1 - bias;
    double scaled;
    uint32_t q;
    if (exp < min_exp) {                           /* subnormal: units of 2^(min_exp - mbits) */
        scaled = ldexp((double)ax, mbits - min_exp);
        q = (uint32_t)nearbyint(scaled);           /* FE_TONEAREST: ties to even */
        return q;                                  /* q == 2^mbits rolls into the first normal */
    }
    scaled = ldexp((double)ax, mbits - exp);       /* in [2^mbits, 2^(mbits+1)) */
    q = (uint32_t)nearbyint(scaled);
    if (q == (1u << (mbits + 1))) {                /* rounded up to the next binade */
        q >>= 1;
        exp++;
    }
    if (ax > max_finite) {
        /* Round-to-nearest overflow: values at or beyond max + half an ulp overflow. */
        double ulp = ldexp(1.0, (int)((max_bits >> mbits)) - bias - mbits);
        if ((double)ax >= (double)max_finite + ulp / 2)
            return inf_bits;
        return max_bits;
    }
    uint32_t bits = ((uint32_t)(exp + bias) << mbits) | (q & ((1u << mbits) - 1));
    if (bits > max_bits)
        return inf_bits;
    return bits;
}

uint16_t ghc_f32_to_f16(float x)
{
    uint32_t u = f32_bits(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    float ax = fabsf(x);
    if (isnan(x))
        return (uint16_t)(sign | 0x7e00u);
    if (isinf(x))
        return (uint16_t)(sign | 0x7c00u);
    return (uint16_t)(sign | encode_small(ax, 5, 10, 0x7bffu, 0x7c00u, 65504.0f));
}

float ghc_f16_to_f32(uint16_t x)
{
    uint32_t sign = (uint32_t)(x & 0x8000u) << 16;
    int e = (x >> 10) & 0x1f;
    uint32_t m = x & 0x3ffu;
    float v;
    if (e == 0)
        v = ldexpf((float)m, -24);
    else if (e == 31)
        v = m ? NAN : INFINITY;
    else
        v = ldexpf((float)(m | 0x400u), e - 25);
    return bits_f32(f32_bits(v) | sign);
}

uint8_t ghc_f32_to_e4m3(float x)
{
    uint8_t sign = (uint8_t)((f32_bits(x) >> 24) & 0x80u);
    if (isnan(x))
        return (uint8_t)(sign | 0x7fu);
    float ax = fabsf(x);
    if (ax >= 448.0f)                               /* saturate: e4m3fn has no inf */
        return (uint8_t)(sign | 0x7eu);
    return (uint8_t)(sign | encode_small(ax, 4, 3, 0x7eu, 0x7eu, 448.0f));
}

float ghc_e4m3_to_f32(uint8_t x)
{
    int e = (x >> 3) & 0xf;
    uint32_t m = x & 0x7u;
    float v;
    if (e == 15 && m == 7)
        v = NAN;
    else if (e == 0)
        v = ldexpf((float)m, -9);
    else
        v = ldexpf((float)(m | 0x8u), e - 10);
    return (x & 0x80u) ? -v : v;
}

uint8_t ghc_f32_to_e5m2(float x)
{
    uint8_t sign = (uint8_t)((f32_bits(x) >> 24) & 0x80u);
    if (isnan(x))
        return (uint8_t)(sign | 0x7eu);
    if (isinf(x))
        return (uint8_t)(sign | 0x7cu);
    return (uint8_t)(sign | encode_small(fabsf(x), 5, 2, 0x7bu, 0x7cu, 57344.0f));
}

float ghc_e5m2_to_f32(uint8_t x)
{
    return ghc_f16_to_f32((uint16_t)((uint16_t)x << 8));
}

/* ---- tensors ------------------------------------------------------------------------------ */

struct ghc_tensor {
    ghc_core_t        *core;
    enum ghc_dtype     dtype;
    int                ndim;
    int64_t            shape[GHC_TENSOR_MAX_DIMS];
    int64_t            numel;
    int                device;
    enum ghc_mem_role  role;
    int64_t            ld;         /* elements between the starts of consecutive rows (lines of
                                    * the last dimension); 0: dense (the last dimension's size) */
    void              *data;
    bool               owned;      /* memory is ours to release */
    bool               from_policy; /* ... through the mempolicy (else free()) */
};

bool ghc_shape_numel(int ndim, const int64_t *shape, int64_t *out)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return false;
        if (shape[i] && n > INT64_MAX / shape[i])
            return false;
        n *= shape[i];
    }
    *out = n;
    return true;
}

static ghc_tensor_t *tensor_new(ghc_core_t *core, enum ghc_dtype dtype, int ndim, const int64_t *shape,
                                int device)
{
    if ((unsigned)dtype >= GHC_DTYPE_COUNT) {
        ghc_error_set(core, GHC_EINVAL, "tensor: dtype %d out of range", dtype);
        return NULL;
    }
    if (ndim < 0 || ndim > GHC_TENSOR_MAX_DIMS) {
        ghc_error_set(core, GHC_EINVAL, "tensor: %d dimensions (0 to %d allowed)", ndim, GHC_TENSOR_MAX_DIMS);
        return NULL;
    }
    int64_t numel;
    if (!ghc_shape_numel(ndim, shape, &numel) || numel > INT64_MAX / 8) {
        ghc_error_set(core, GHC_EINVAL, "tensor: shape has a negative size or overflows");
        return NULL;
    }
    if (device < GHC_DEVICE_CPU) {
        ghc_error_set(core, GHC_EINVAL, "tensor: device %d invalid", device);
        return NULL;
    }
    ghc_tensor_t *t = calloc(1, sizeof(*t));
    if (!t) {
        ghc_error_set(core, GHC_ENOMEM, "tensor: out of memory");
        return NULL;
    }
    t->core = core;
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        t->shape[i] = shape[i];
    t->numel = numel;
    t->device = device;
    return t;
}

ghc_tensor_t *ghc_tensor_init(ghc_core_t *core, enum ghc_dtype dtype, int ndim, const int64_t *shape,
                              int device, enum ghc_mem_role role)
{
    ghc_tensor_t *t = tensor_new(core, dtype, ndim, shape, device);
    if (!t)
        return NULL;
    t->role = role;
    size_t bytes = ghc_tensor_nbytes(t);
    ghc_mempolicy_t *mp = ghc_mempolicy_get(core);
    if (mp) {
        if (ghc_mem_alloc(mp, bytes, role, device, &t->data) < 0) {
            free(t);
            return NULL;
        }
        t->from_policy = true;
    } else if (device == GHC_DEVICE_CPU) {
        t->data = aligned_alloc(256, (bytes + 255) / 256 * 256 + (bytes == 0) * 256);
        if (!t->data) {
            ghc_error_set(core, GHC_ENOMEM, "tensor: cannot allocate %zu bytes of %s", bytes, ghc_mem_role_name(role));
            free(t);
            return NULL;
        }
    } else {
        ghc_error_set(core, GHC_EUNSUPPORTED,
                      "tensor: a CUDA tensor needs a memory policy; configure mempolicy = { plugin = \"device\"; }");
        free(t);
        return NULL;
    }
    t->owned = true;
    return t;
}

ghc_tensor_t *ghc_tensor_wrap(ghc_core_t *core, enum ghc_dtype dtype, int ndim, const int64_t *shape,
                              int device, void *data)
{
    ghc_tensor_t *t = tensor_new(core, dtype, ndim, shape, device);
    if (t) {
        t->data = data;
        t->role = GHC_ROLE_WORKSPACE;
    }
    return t;
}

void ghc_tensor_free(ghc_tensor_t *t)
{
    if (!t)
        return;
    if (t->owned) {
        if (t->from_policy)
            ghc_mem_release(ghc_mempolicy_get(t->core), t->data);
        else
            free(t->data);
    }
    free(t);
}

enum ghc_dtype ghc_tensor_dtype(const ghc_tensor_t *t) { return t->dtype; }
int ghc_tensor_ndim(const ghc_tensor_t *t) { return t->ndim; }
const int64_t *ghc_tensor_shape(const ghc_tensor_t *t) { return t->shape; }
int64_t ghc_tensor_numel(const ghc_tensor_t *t) { return t->numel; }
size_t ghc_tensor_nbytes(const ghc_tensor_t *t) { return (size_t)t->numel * ghc_dtype_size(t->dtype); }
int ghc_tensor_device(const ghc_tensor_t *t) { return t->device; }
enum ghc_mem_role ghc_tensor_role(const ghc_tensor_t *t) { return t->role; }
void *ghc_tensor_data(ghc_tensor_t *t) { return t->data; }
const void *ghc_tensor_cdata(const ghc_tensor_t *t) { return t->data; }
ghc_core_t *ghc_tensor_core(const ghc_tensor_t *t) { return t->core; }

int64_t ghc_tensor_row_stride(const ghc_tensor_t *t)
{
    return t->ld ? t->ld : t->ndim ? t->shape[t->ndim - 1] : 1;
}

ghc_tensor_t *ghc_tensor_view_cols(const ghc_tensor_t *t, int64_t col0, int64_t ncols)
{
    char buf[128];
    const int64_t last = t->ndim ? t->shape[t->ndim - 1] : 0;
    if (t->ndim < 1 || col0 < 0 || ncols < 0 || col0 > last - ncols) {
        ghc_error_set(t->core, GHC_EINVAL, "tensor: columns [%lld, %lld) of %s: out of range (a tensor of 1 dim or more)",
                      (long long)col0, (long long)(col0 + ncols), ghc_tensor_describe(t, buf, sizeof(buf)));
        return NULL;
    }
    int64_t shape[GHC_TENSOR_MAX_DIMS];
    memcpy(shape, t->shape, sizeof(shape));
    shape[t->ndim - 1] = ncols;
    ghc_tensor_t *v = tensor_new(t->core, t->dtype, t->ndim, shape, t->device);
    if (v) {
        v->data = (char *)t->data + (size_t)col0 * ghc_dtype_size(t->dtype);
        v->role = t->role;
        v->ld = ghc_tensor_row_stride(t) == ncols ? 0 : ghc_tensor_row_stride(t);
    }
    return v;
}

int64_t ghc_tensor_dim(const ghc_tensor_t *t, int i)
{
    if (i < 0)
        i += t->ndim;
    return i >= 0 && i < t->ndim ? t->shape[i] : 1;
}

int ghc_tensor_reshape(ghc_tensor_t *t, int ndim, const int64_t *shape)
{
    int64_t n;
    char buf[128];
    if (ndim < 0 || ndim > GHC_TENSOR_MAX_DIMS || !ghc_shape_numel(ndim, shape, &n) || n != t->numel)
        return ghc_error_set(t->core, GHC_EINVAL, "tensor: cannot reshape %s to %d dims of other numel",
                             ghc_tensor_describe(t, buf, sizeof(buf)), ndim);
    if (t->ld && (ndim < 1 || shape[ndim - 1] != t->shape[t->ndim - 1]))
        return ghc_error_set(t->core, GHC_EINVAL, "tensor: cannot reshape %s (a column view) to another last dimension",
                             ghc_tensor_describe(t, buf, sizeof(buf)));
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        t->shape[i] = shape[i];
    return 0;
}

bool ghc_tensor_same_shape(const ghc_tensor_t *a, const ghc_tensor_t *b)
{
    if (a->ndim != b->ndim)
        return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i])
            return false;
    return true;
}

const char *ghc_tensor_describe(const ghc_tensor_t *t, char *buf, size_t len)
{
    size_t n = 0;
    n += (size_t)snprintf(buf + n, len > n ? len - n : 0, "[");
    for (int i = 0; i < t->ndim; i++)
        n += (size_t)snprintf(buf + n, len > n ? len - n : 0, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (t->device == GHC_DEVICE_CPU)
        n += (size_t)snprintf(buf + n, len > n ? len - n : 0, "] %s cpu", ghc_dtype_name(t->dtype));
    else
        n += (size_t)snprintf(buf + n, len > n ? len - n : 0, "] %s cuda:%d", ghc_dtype_name(t->dtype), t->device);
    if (t->ld)
        snprintf(buf + n, len > n ? len - n : 0, ", rows %lld apart", (long long)t->ld);
    return buf;
}

/* ---- CPU conversion ------------------------------------------------------------------------- */

int ghc_tensor_convert_cpu(ghc_tensor_t *dst, const ghc_tensor_t *src, float scale)
{
    char a[96], b[96];
    if (dst->device != GHC_DEVICE_CPU || src->device != GHC_DEVICE_CPU || dst->numel != src->numel || dst->ld ||
        src->ld)
        return ghc_error_set(dst->core, GHC_EINVAL,
                             "tensor convert: %s from %s: both must be dense (not column views) on the CPU with equal numel",
                             ghc_tensor_describe(dst, a, sizeof(a)), ghc_tensor_describe(src, b, sizeof(b)));
    if (dst->dtype == src->dtype && scale == 1.0f) {
        memmove(dst->data, src->data, ghc_tensor_nbytes(src));
        return 0;
    }
    if (!ghc_dtype_is_float(dst->dtype) || !ghc_dtype_is_float(src->dtype))
        return ghc_error_set(dst->core, GHC_EINVAL, "tensor convert: %s from %s: only float dtypes convert",
                             ghc_tensor_describe(dst, a, sizeof(a)), ghc_tensor_describe(src, b, sizeof(b)));
    for (int64_t i = 0; i < src->numel; i++)
        ghc_cpu_store(dst->data, dst->dtype, i, ghc_cpu_load(src->data, src->dtype, i) * scale);
    return 0;
}

int64_t ghc_tensor_find_nonfinite(const ghc_tensor_t *t)
{
    if (t->device != GHC_DEVICE_CPU || t->ld || !ghc_dtype_is_float(t->dtype))
        return -1;
    for (int64_t i = 0; i < t->numel; i++)
        if (!isfinite(ghc_cpu_load(t->data, t->dtype, i)))
            return i;
    return -1;
}
