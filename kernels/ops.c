/* kernels/ops.c: the ghc_op_* entry points of ops.h. Each one checks its arguments (NULLs,
 * dtypes, shapes, broadcasting, one device for all tensors) and then dispatches by device:
 * the CPU reference in kernels/cpu/, or the CUDA kernels of kernels/cuda/ when the build has
 * CUDA. Kernels therefore only compute; every error message is written here, naming the op
 * and the offending tensor. */
#include <config.h>

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <gh200core/ops.h>

#include "cpu/cpu.h"       /* defines: ghc_cpu_* */
#ifdef GHC_HAVE_CUDA
#include "cuda/kernels.h"  /* defines: ghc_k_*, ghc_k_error_string */
#endif

/* ---- argument checking ------------------------------------------------------------------- */

/* One op call: its name, the core that gets the error (of the first tensor argument) and the
 * device every tensor must be on (also of the first tensor). */
struct op_ctx {
    const char *op;
    ghc_core_t *core;
    int         device;
    bool        views;   /* check_tensor lets column views (ghc_tensor_view_cols) through */
};

#define DT(d) (1u << (d))
#define DT_F32       DT(GHC_DTYPE_F32)
#define DT_F32_BF16  (DT(GHC_DTYPE_F32) | DT(GHC_DTYPE_BF16))
#define DT_FLOAT     (DT(GHC_DTYPE_F32) | DT(GHC_DTYPE_BF16) | DT(GHC_DTYPE_F16) | \
                      DT(GHC_DTYPE_F8_E4M3) | DT(GHC_DTYPE_F8_E5M2))

/* The context of an op whose tensors are `ts` (the first non-NULL one decides core and
 * device). */
static struct op_ctx op_ctx(const char *op, int n, const ghc_tensor_t *const *ts)
{
    struct op_ctx c = { op, NULL, GHC_DEVICE_CPU, false };
    for (int i = 0; i < n; i++)
        if (ts[i]) {
            c.core = ghc_tensor_core(ts[i]);
            c.device = ghc_tensor_device(ts[i]);
            break;
        }
    return c;
}
#define OP_CTX(name, ...) \
    op_ctx(name, (int)(sizeof((const ghc_tensor_t *[]){ __VA_ARGS__ }) / sizeof(ghc_tensor_t *)), \
           (const ghc_tensor_t *const[]){ __VA_ARGS__ })

/* "op: tensor 'name' is [2, 3] BF16 cpu, expected <what>". Returns GHC_EINVAL. */
static int bad(const struct op_ctx *c, const char *name, const ghc_tensor_t *t, const char *fmt, ...)
    GHC_PRINTF(4, 5);
static int bad(const struct op_ctx *c, const char *name, const ghc_tensor_t *t, const char *fmt, ...)
{
    char desc[160], want[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(want, sizeof(want), fmt, ap);
    va_end(ap);
    if (!t)
        return ghc_error_set(c->core, GHC_EINVAL, "%s: tensor '%s' is NULL, expected %s", c->op, name, want);
    return ghc_error_set(c->core, GHC_EINVAL, "%s: tensor '%s' is %s, expected %s", c->op, name,
                         ghc_tensor_describe(t, desc, sizeof(desc)), want);
}

/* "f32 or bf16" for a dtype mask. */
static const char *dtypes_text(unsigned mask, char *buf, size_t len)
{
    size_t n = 0;
    int count = 0, total = 0;
    for (int d = 0; d < GHC_DTYPE_COUNT; d++)
        total += (mask >> d) & 1;
    buf[0] = '\0';
    for (int d = 0; d < GHC_DTYPE_COUNT; d++) {
        if (!(mask & DT(d)))
            continue;
        count++;
        const char *sep = count == 1 ? "" : count == total ? " or " : ", ";
        n += (size_t)snprintf(buf + n, len > n ? len - n : 0, "%s%s", sep, ghc_dtype_name((enum ghc_dtype)d));
    }
    return buf;
}

/* t's rows are its last dimension's size apart (not a column view). */
static bool dense(const ghc_tensor_t *t) { return ghc_tensor_row_stride(t) == ghc_tensor_dim(t, -1); }

/* t present (unless optional), on the op's device, with a dtype in `mask`. */
static int check_tensor(const struct op_ctx *c, const char *name, const ghc_tensor_t *t, unsigned mask,
                        bool optional)
{
    char buf[96];
    if (!t)
        return optional ? 0 : bad(c, name, t, "a tensor");
    if (ghc_tensor_device(t) != c->device) {
        if (c->device == GHC_DEVICE_CPU)
            return bad(c, name, t, "on the cpu like the first tensor");
        return bad(c, name, t, "on cuda:%d like the first tensor", c->device);
    }
    if (!(mask & DT(ghc_tensor_dtype(t))))
        return bad(c, name, t, "dtype %s", dtypes_text(mask, buf, sizeof(buf)));
    if (!c->views && !dense(t))
        return bad(c, name, t, "a dense tensor (%s takes no column views)", c->op);
    return 0;
}
#define CHECK(expr) do { int rc_ = (expr); if (rc_ < 0) return rc_; } while (0)
#define NEED(c, name, t, mask) CHECK(check_tensor(c, name, t, mask, false))
#define MAYBE(c, name, t, mask) CHECK(check_tensor(c, name, t, mask, true))

/* check_tensor for an operand that may be a column view. */
static int check_view(const struct op_ctx *c, const char *name, const ghc_tensor_t *t, unsigned mask)
{
    struct op_ctx cv = *c;
    cv.views = true;
    return check_tensor(&cv, name, t, mask, false);
}
#define NEED_VIEW(c, name, t, mask) CHECK(check_view(c, name, t, mask))

/* Where either of a and b (equal numel) is a column view: the same last dimension, so the
 * same rows, element i of one being element i of the other. */
static int check_view_rows(const struct op_ctx *c, const char *name, const ghc_tensor_t *a, const char *bname,
                           const ghc_tensor_t *b)
{
    char buf[160];
    if ((!dense(a) || !dense(b)) && (ghc_tensor_ndim(a) < 1 || ghc_tensor_ndim(b) < 1 ||
                                     ghc_tensor_dim(a, -1) != ghc_tensor_dim(b, -1)))
        return bad(c, name, a, "the last dimension of '%s' %s (a column view is copied row by row)", bname,
                   ghc_tensor_describe(b, buf, sizeof(buf)));
    return 0;
}

static const char *shape_text(int ndim, const int64_t *shape, char *buf, size_t len)
{
    size_t n = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim; i++)
        n += (size_t)snprintf(buf + n, len > n ? len - n : 0, "%s%lld", i ? ", " : "", (long long)shape[i]);
    snprintf(buf + n, len > n ? len - n : 0, "]");
    return buf;
}

static bool has_shape(const ghc_tensor_t *t, int ndim, const int64_t *shape)
{
    if (ghc_tensor_ndim(t) != ndim)
        return false;
    for (int i = 0; i < ndim; i++)
        if (ghc_tensor_dim(t, i) != shape[i])
            return false;
    return true;
}

/* t has exactly `shape` (t may be NULL: nothing to check). */
static int check_shape(const struct op_ctx *c, const char *name, const ghc_tensor_t *t, int ndim,
                       const int64_t *shape)
{
    char buf[128];
    if (t && !has_shape(t, ndim, shape))
        return bad(c, name, t, "shape %s", shape_text(ndim, shape, buf, sizeof(buf)));
    return 0;
}
#define SHAPE(c, name, t, ...) \
    CHECK(check_shape(c, name, t, (int)(sizeof((int64_t[]){ __VA_ARGS__ }) / sizeof(int64_t)), \
                      (const int64_t[]){ __VA_ARGS__ }))

/* t has ref's shape. */
static int check_like(const struct op_ctx *c, const char *name, const ghc_tensor_t *t, const ghc_tensor_t *ref)
{
    return check_shape(c, name, t, ghc_tensor_ndim(ref), ghc_tensor_shape(ref));
}
#define LIKE(c, name, t, ref) CHECK(check_like(c, name, t, ref))

/* ndim >= 1 (an op over the last dim). */
static int check_rows(const struct op_ctx *c, const char *name, const ghc_tensor_t *t)
{
    if (ghc_tensor_ndim(t) < 1)
        return bad(c, name, t, "at least 1 dimension");
    return 0;
}

/* The broadcasting rule of ops.h: b has a's shape, or is [D] (a's last dim), or is [B, D]
 * for a of [B, ..., D] with 3 or more dims. b may be NULL. */
static int check_bcast(const struct op_ctx *c, const char *name, const ghc_tensor_t *b,
                       const char *aname, const ghc_tensor_t *a)
{
    if (!b)
        return 0;
    int nd = ghc_tensor_ndim(a);
    int64_t D = ghc_tensor_dim(a, -1);
    if (ghc_tensor_same_shape(a, b))
        return 0;
    if (nd >= 1 && ghc_tensor_ndim(b) == 1 && ghc_tensor_dim(b, 0) == D)
        return 0;
    if (nd >= 3 && ghc_tensor_ndim(b) == 2 && ghc_tensor_dim(b, 0) == ghc_tensor_dim(a, 0) &&
        ghc_tensor_dim(b, 1) == D)
        return 0;
    char ab[160], shp[96];
    shape_text(nd, ghc_tensor_shape(a), shp, sizeof(shp));
    if (nd >= 3)
        return bad(c, name, b, "%s, [%lld] or [%lld, %lld] to broadcast over '%s' %s", shp, (long long)D,
                   (long long)ghc_tensor_dim(a, 0), (long long)D, aname, ghc_tensor_describe(a, ab, sizeof(ab)));
    if (nd == 2)
        return bad(c, name, b, "%s or [%lld] to broadcast over '%s' %s", shp, (long long)D, aname,
                   ghc_tensor_describe(a, ab, sizeof(ab)));
    return bad(c, name, b, "%s like '%s' %s", shp, aname, ghc_tensor_describe(a, ab, sizeof(ab)));
}
#define BCAST(c, name, b, aname, a) CHECK(check_bcast(c, name, b, aname, a))

/* ---- dispatch ----------------------------------------------------------------------------- */

#ifdef GHC_HAVE_CUDA
static int cuda_status(const struct op_ctx *c, int err)
{
    if (err)
        return ghc_error_set(c->core, GHC_ECUDA, "%s: %s", c->op, ghc_k_error_string(err));
    return 0;
}
#define DISPATCH(c, cpu_call, cuda_call) \
    ((c)->device == GHC_DEVICE_CPU ? (cpu_call) : cuda_status((c), (cuda_call)))
#else
static int no_cuda(const struct op_ctx *c)
{
    return ghc_error_set(c->core, GHC_EUNSUPPORTED, "%s: this build has no CUDA", c->op);
}
#define DISPATCH(c, cpu_call, cuda_call) ((c)->device == GHC_DEVICE_CPU ? (cpu_call) : no_cuda(c))
#endif

/* ---- memory ------------------------------------------------------------------------------- */

int ghc_op_copy(ghc_tensor_t *dst, const ghc_tensor_t *src, void *stream)
{
    struct op_ctx c = OP_CTX("copy", dst, src);
    char buf[160];
    if (!dst)
        return bad(&c, "dst", dst, "a tensor");
    if (!src)
        return bad(&c, "src", src, "a tensor");
    if (ghc_tensor_dtype(dst) != ghc_tensor_dtype(src) || ghc_tensor_numel(dst) != ghc_tensor_numel(src))
        return bad(&c, "dst", dst, "the dtype and element count of 'src' %s",
                   ghc_tensor_describe(src, buf, sizeof(buf)));
    CHECK(check_view_rows(&c, "dst", dst, "src", src));
    if (ghc_tensor_numel(dst) == 0)
        return 0;
    if (ghc_tensor_device(dst) == GHC_DEVICE_CPU && ghc_tensor_device(src) == GHC_DEVICE_CPU) {
        if (dense(dst) && dense(src)) {
            if (ghc_tensor_data(dst) != ghc_tensor_cdata(src))
                memmove(ghc_tensor_data(dst), ghc_tensor_cdata(src), ghc_tensor_nbytes(dst));
            return 0;
        }
        /* column views: row by row */
        const size_t es = ghc_dtype_size(ghc_tensor_dtype(src));
        const int64_t D = ghc_tensor_dim(src, -1), rows = ghc_tensor_numel(src) / D;
        const int64_t ldd = ghc_tensor_row_stride(dst), lds = ghc_tensor_row_stride(src);
        char *d = ghc_tensor_data(dst);
        const char *s = ghc_tensor_cdata(src);
        for (int64_t r = 0; r < rows; r++)
            memmove(d + (size_t)(r * ldd) * es, s + (size_t)(r * lds) * es, (size_t)D * es);
        return 0;
    }
#ifdef GHC_HAVE_CUDA
    return cuda_status(&c, ghc_k_copy(dst, src, stream));
#else
    return ghc_error_set(c.core, GHC_EUNSUPPORTED, "copy: this build has no CUDA");
#endif
}

int ghc_op_fill(ghc_tensor_t *t, double value, void *stream)
{
    struct op_ctx c = OP_CTX("fill", t);
    NEED(&c, "t", t, DT_FLOAT);
    if (ghc_tensor_numel(t) == 0)
        return 0;
    return DISPATCH(&c, ghc_cpu_fill(t, value), ghc_k_fill(t, value, stream));
}

int ghc_op_sync(ghc_core_t *core, int device, void *stream)
{
    if (device == GHC_DEVICE_CPU)
        return 0;
    if (device < 0)
        return ghc_error_set(core, GHC_EINVAL, "sync: device %d is neither the cpu (-1) nor a CUDA ordinal",
                             device);
#ifdef GHC_HAVE_CUDA
    int err = ghc_k_sync(device, stream);
    if (err)
        return ghc_error_set(core, GHC_ECUDA, "sync: %s", ghc_k_error_string(err));
    return 0;
#else
    return ghc_error_set(core, GHC_EUNSUPPORTED, "sync: this build has no CUDA");
#endif
}

int ghc_op_device_memory(ghc_core_t *core, int device, uint64_t *free_bytes, uint64_t *total_bytes)
{
    *free_bytes = *total_bytes = 0;
#ifdef GHC_HAVE_CUDA
    int major, minor;
    size_t fr = 0, tot = 0;
    int err = device < 0 ? 0 : ghc_k_device_info(device, NULL, 0, &major, &minor, &fr, &tot);
    if (device < 0 || err)
        return ghc_error_set(core, GHC_ECUDA, "device memory: CUDA device %d: %s", device,
                             device < 0 ? "not a CUDA ordinal" : ghc_k_error_string(err));
    *free_bytes = fr;
    *total_bytes = tot;
    return 0;
#else
    return ghc_error_set(core, GHC_EUNSUPPORTED, "device memory: device %d: this build has no CUDA", device);
#endif
}

int ghc_op_device_speed(ghc_core_t *core, int device, double *flops, double *h2d_bytes)
{
    *flops = *h2d_bytes = 0;
#ifdef GHC_HAVE_CUDA
    int err = device < 0 ? 0 : ghc_k_device_speed(core, device, flops, h2d_bytes);
    if (device < 0 || err)
        return ghc_error_set(core, GHC_ECUDA, "device speed: CUDA device %d: %s", device,
                             device < 0 ? "not a CUDA ordinal" : ghc_k_error_string(err));
    return 0;
#else
    return ghc_error_set(core, GHC_EUNSUPPORTED, "device speed: device %d: this build has no CUDA", device);
#endif
}

int ghc_op_profile_start(ghc_core_t *core, int device)
{
#ifdef GHC_HAVE_CUDA
    if (device >= 0 && ghc_k_profile_start(device) == 0)
        return 0;
    return ghc_error_set(core, GHC_EUNSUPPORTED, "profile: CUDA device %d: %s", device,
                         device < 0 ? "not a CUDA ordinal" : ghc_k_profile_why());
#else
    return ghc_error_set(core, GHC_EUNSUPPORTED, "profile: device %d: this build has no CUDA", device);
#endif
}

int ghc_op_profile_stop(ghc_core_t *core, int device, FILE *out, int32_t steps, const char *title)
{
#ifdef GHC_HAVE_CUDA
    int rc = device < 0 ? -1 : ghc_k_profile_stop(device, out, steps, title);
    if (rc == -2)
        return ghc_error_set(core, GHC_EIO, "profile: writing the report failed");
    if (rc < 0)
        return ghc_error_set(core, GHC_EUNSUPPORTED, "profile: CUDA device %d: %s", device,
                             device < 0 ? "not a CUDA ordinal" : ghc_k_profile_why());
    return 0;
#else
    (void)out, (void)steps, (void)title;
    return ghc_error_set(core, GHC_EUNSUPPORTED, "profile: device %d: this build has no CUDA", device);
#endif
}

/* ---- casts and random numbers ------------------------------------------------------------- */

int ghc_op_cast(ghc_tensor_t *dst, const ghc_tensor_t *src, float scale, const struct ghc_rng *rng,
                void *stream)
{
    struct op_ctx c = OP_CTX("cast", dst, src);
    char buf[160];
    NEED_VIEW(&c, "dst", dst, DT_FLOAT);
    NEED_VIEW(&c, "src", src, DT_FLOAT);
    if (ghc_tensor_numel(dst) != ghc_tensor_numel(src))
        return bad(&c, "dst", dst, "the element count of 'src' %s", ghc_tensor_describe(src, buf, sizeof(buf)));
    CHECK(check_view_rows(&c, "dst", dst, "src", src));
    if (rng && ghc_tensor_dtype(dst) != GHC_DTYPE_BF16)
        return bad(&c, "dst", dst, "dtype BF16 for stochastic rounding (rng given)");
    if (rng && !dense(dst))
        return bad(&c, "dst", dst, "a dense tensor for stochastic rounding (rng given; column views round to nearest)");
    if (rng && !dense(src))
        return bad(&c, "src", src, "a dense tensor for stochastic rounding (rng given; column views round to nearest)");
    if (ghc_tensor_numel(dst) == 0)
        return 0;
    return DISPATCH(&c, ghc_cpu_cast(dst, src, scale, rng), ghc_k_cast(dst, src, scale, rng, stream));
}

int ghc_op_rand_uniform(ghc_tensor_t *t, const struct ghc_rng *rng, void *stream)
{
    struct op_ctx c = OP_CTX("rand_uniform", t);
    NEED(&c, "t", t, DT_F32_BF16);
    if (!rng)
        return ghc_error_set(c.core, GHC_EINVAL, "rand_uniform: rng is NULL");
    if (ghc_tensor_numel(t) == 0)
        return 0;
    return DISPATCH(&c, ghc_cpu_rand_uniform(t, rng), ghc_k_rand_uniform(t, rng, stream));
}

int ghc_op_rand_normal(ghc_tensor_t *t, const struct ghc_rng *rng, void *stream)
{
    struct op_ctx c = OP_CTX("rand_normal", t);
    NEED(&c, "t", t, DT_F32_BF16);
    if (!rng)
        return ghc_error_set(c.core, GHC_EINVAL, "rand_normal: rng is NULL");
    if (ghc_tensor_numel(t) == 0)
        return 0;
    return DISPATCH(&c, ghc_cpu_rand_normal(t, rng), ghc_k_rand_normal(t, rng, stream));
}

/* ---- GEMM --------------------------------------------------------------------------------- */

int ghc_op_gemm(ghc_tensor_t *c_, const ghc_tensor_t *a, const ghc_tensor_t *b,
                const struct ghc_gemm *args, void *stream)
{
    static const struct ghc_gemm plain = { 0 };
    struct op_ctx c = OP_CTX("gemm", c_, a, b);
    char buf[160];
    if (!args)
        args = &plain;
    c.views = true;   /* a, b and c (not bias or pre_gelu) may be column views */
    NEED(&c, "c", c_, DT_F32_BF16);
    NEED(&c, "a", a, DT_F32_BF16 | DT(GHC_DTYPE_F8_E4M3));
    NEED(&c, "b", b, DT(ghc_tensor_dtype(a)));
    c.views = false;
    bool fp8 = ghc_tensor_dtype(a) == GHC_DTYPE_F8_E4M3;
    const ghc_tensor_t *ops3[3] = { a, b, c_ };
    static const char *const names3[3] = { "a", "b", "c" };
    for (int k = 0; k < 3; k++) {   /* column views: bf16 or f32 (C with any epilogue since API 20) */
        if (dense(ops3[k]))
            continue;
        if (fp8)
            return bad(&c, names3[k], ops3[k], "a dense tensor (gemm takes column views only in bf16 or f32)");
    }
    if (!fp8 && ((args->scale_a != 0.0f && args->scale_a != 1.0f) || (args->scale_b != 0.0f && args->scale_b != 1.0f)))
        return bad(&c, "a", a, "F8_E4M3 operands for scale_a = %g, scale_b = %g (scales apply to fp8 only)",
                   (double)args->scale_a, (double)args->scale_b);

    int nda = ghc_tensor_ndim(a), ndb = ghc_tensor_ndim(b), ndc = ghc_tensor_ndim(c_);
    if (nda != 2 && nda != 3)
        return bad(&c, "a", a, "2 or 3 dimensions");
    if (ndb != 2 && ndb != 3)
        return bad(&c, "b", b, "2 or 3 dimensions");
    if (ndc != 2 && ndc != 3)
        return bad(&c, "c", c_, "2 or 3 dimensions");
    if (ndc == 2 && (nda == 3 || ndb == 3))
        return bad(&c, "c", c_, "3 dimensions [batch, M, N] since an operand is batched");
    int64_t batch = ndc == 3 ? ghc_tensor_dim(c_, 0) : 1;
    if (nda == 3 && ghc_tensor_dim(a, 0) != batch)
        return bad(&c, "a", a, "batch %lld like 'c'", (long long)batch);
    if (ndb == 3 && ghc_tensor_dim(b, 0) != batch)
        return bad(&c, "b", b, "batch %lld like 'c'", (long long)batch);

    int64_t M = ghc_tensor_dim(a, args->trans_a ? -1 : -2);
    int64_t K = ghc_tensor_dim(a, args->trans_a ? -2 : -1);
    int64_t Kb = ghc_tensor_dim(b, args->trans_b ? -1 : -2);
    int64_t N = ghc_tensor_dim(b, args->trans_b ? -2 : -1);
    if (Kb != K)
        return bad(&c, "b", b, "K = %lld (%s) to match 'a' %s%s", (long long)K,
                   args->trans_b ? "stored [N, K]" : "stored [K, N]",
                   ghc_tensor_describe(a, buf, sizeof(buf)), args->trans_a ? " (trans_a)" : "");
    if (ndc == 3)
        SHAPE(&c, "c", c_, batch, M, N);
    else
        SHAPE(&c, "c", c_, M, N);

    switch (args->epilogue) {
    case GHC_EPI_NONE:
        if (args->bias)
            return bad(&c, "bias", args->bias, "NULL with epilogue NONE");
        if (args->pre_gelu)
            return bad(&c, "pre_gelu", args->pre_gelu, "NULL without the BIAS_GELU epilogue");
        break;
    case GHC_EPI_BIAS:
    case GHC_EPI_BIAS_GELU:
        NEED(&c, "bias", args->bias, DT_F32_BF16);
        SHAPE(&c, "bias", args->bias, N);
        if (args->epilogue == GHC_EPI_BIAS_GELU) {
            if (args->beta != 0.0f)
                return ghc_error_set(c.core, GHC_EINVAL, "gemm: beta must be 0 with the BIAS_GELU epilogue, got %g",
                                     (double)args->beta);
            MAYBE(&c, "pre_gelu", args->pre_gelu, DT(ghc_tensor_dtype(c_)));
            LIKE(&c, "pre_gelu", args->pre_gelu, c_);
        } else if (args->pre_gelu) {
            return bad(&c, "pre_gelu", args->pre_gelu, "NULL without the BIAS_GELU epilogue");
        }
        break;
    default:
        return ghc_error_set(c.core, GHC_EINVAL, "gemm: unknown epilogue %d", (int)args->epilogue);
    }
    if (ghc_tensor_numel(c_) == 0)
        return 0;
    return DISPATCH(&c, ghc_cpu_gemm(c_, a, b, args), ghc_k_gemm(c_, a, b, args, stream));
}

/* The optional side copy of the LoRA ops: dst and src both given or both NULL; dst a [rows,
 * cols] view or dense tensor (f32 or bf16), src the same shape, dense, f32 or `dt`. */
static int check_side(const struct op_ctx *c, const char *dname, const ghc_tensor_t *dst, const char *sname,
                      const ghc_tensor_t *src, enum ghc_dtype dt, int64_t rows, int64_t cols)
{
    if (!dst && !src)
        return 0;
    if (!dst || !src)
        return bad(c, dst ? sname : dname, dst ? src : dst, "a tensor, since '%s' is given", dst ? dname : sname);
    CHECK(check_view(c, dname, dst, DT_F32_BF16));
    CHECK(check_tensor(c, sname, src, DT_F32 | DT(dt), false));
    if (ghc_tensor_ndim(dst) != 2 || ghc_tensor_dim(dst, 0) != rows || ghc_tensor_dim(dst, 1) != cols)
        return bad(c, dname, dst, "[%lld, %lld]", (long long)rows, (long long)cols);
    SHAPE(c, sname, src, rows, cols);
    return 0;
}

/* x (or g) [.., K] with N rows and h-like [.., r] tensors of N rows. */
static int check_rows_of(const struct op_ctx *c, const char *name, const ghc_tensor_t *t, int64_t N, int64_t r,
                         const char *why)
{
    if (ghc_tensor_ndim(t) < 1 || ghc_tensor_dim(t, -1) != r || ghc_tensor_numel(t) != N * r)
        return bad(c, name, t, "%lld rows of %lld (%s)", (long long)N, (long long)r, why);
    return 0;
}

int ghc_op_lora_fwd(ghc_tensor_t *h, ghc_tensor_t *keep, const ghc_tensor_t *x, const ghc_tensor_t *a, float scale,
                    ghc_tensor_t *wcols, const ghc_tensor_t *b, void *stream)
{
    struct op_ctx c = OP_CTX("lora_fwd", h, keep, x, a, wcols, b);
    NEED_VIEW(&c, "h", h, DT_F32_BF16);
    const enum ghc_dtype dt = ghc_tensor_dtype(h);
    MAYBE(&c, "keep", keep, DT(dt));
    if (ghc_tensor_ndim(h) < 1)
        return bad(&c, "h", h, "at least 1 dimension");
    const int64_t r = ghc_tensor_dim(h, -1), N = r > 0 ? ghc_tensor_numel(h) / r : 0;
    if (keep && ghc_tensor_numel(keep) != ghc_tensor_numel(h))
        return bad(&c, "keep", keep, "%lld elements like 'h'", (long long)ghc_tensor_numel(h));
    if (!x && !keep)
        return bad(&c, "x", x, "a tensor (or 'keep' to copy h from)");
    if (r < 1)
        return bad(&c, "h", h, "[.., r] with r at least 1");
    if (x) {
        NEED_VIEW(&c, "x", x, DT(dt));
        NEED(&c, "a", a, DT(dt) | DT_F32);
        if (ghc_tensor_ndim(a) != 2 || ghc_tensor_dim(a, 0) != r)
            return bad(&c, "a", a, "[%lld, K] (h's r rows)", (long long)r);
        if (ghc_tensor_dim(a, 1) < 1)   /* (r >= 1: checked above) */
            return bad(&c, "a", a, "[r, K] with r and K at least 1");
        CHECK(check_rows_of(&c, "x", x, N, ghc_tensor_dim(a, 1), "h's rows, a's columns"));
    }
    if (wcols || b) {
        const ghc_tensor_t *t = wcols ? wcols : b;
        CHECK(check_side(&c, "wcols", wcols, "b", b, dt, ghc_tensor_ndim(t) == 2 ? ghc_tensor_dim(t, 0) : -1, r));
    }
    return DISPATCH(&c, ghc_cpu_lora_fwd(h, keep, x, a, scale, wcols, b),
                    ghc_k_lora_fwd(h, keep, x, a, scale, wcols, b, stream));
}

int ghc_op_lora_cast_bwd(ghc_tensor_t *g, ghc_tensor_t *dh, ghc_tensor_t *db, const ghc_tensor_t *dy,
                         const ghc_tensor_t *h, const ghc_tensor_t *b, float scale, ghc_tensor_t *wrows,
                         const ghc_tensor_t *a, void *stream)
{
    struct op_ctx c = OP_CTX("lora_cast_bwd", g, dh, db, dy, h, b, wrows, a);
    char buf[160];
    NEED_VIEW(&c, "g", g, DT_F32_BF16);
    const enum ghc_dtype gdt = ghc_tensor_dtype(g);
    NEED_VIEW(&c, "dy", dy, DT_F32_BF16);
    NEED_VIEW(&c, "h", h, DT(gdt));
    NEED_VIEW(&c, "dh", dh, DT(gdt));
    NEED(&c, "b", b, DT(gdt) | DT_F32);
    NEED(&c, "db", db, DT_F32);
    if (ghc_tensor_ndim(g) < 1 || ghc_tensor_ndim(b) != 2)
        return bad(&c, ghc_tensor_ndim(g) < 1 ? "g" : "b", ghc_tensor_ndim(g) < 1 ? g : b,
                   ghc_tensor_ndim(g) < 1 ? "at least 1 dimension" : "[M, r] (2 dimensions)");
    const int64_t M = ghc_tensor_dim(g, -1), r = ghc_tensor_dim(b, 1);
    const int64_t N = M > 0 ? ghc_tensor_numel(g) / M : 0;
    if (ghc_tensor_ndim(dy) < 1 || ghc_tensor_dim(dy, -1) != M || ghc_tensor_numel(dy) != ghc_tensor_numel(g))
        return bad(&c, "dy", dy, "the shape of 'g' %s (rows of M = %lld)", ghc_tensor_describe(g, buf, sizeof(buf)),
                   (long long)M);
    SHAPE(&c, "b", b, M, r);
    SHAPE(&c, "db", db, M, r);
    if (M < 1 || r < 1)
        return bad(&c, "b", b, "[M, r] with M and r at least 1");
    CHECK(check_rows_of(&c, "h", h, N, r, "g's rows, b's columns"));
    CHECK(check_rows_of(&c, "dh", dh, N, r, "g's rows, b's columns"));
    if (wrows || a) {
        const ghc_tensor_t *t = wrows ? wrows : a;
        CHECK(check_side(&c, "wrows", wrows, "a", a, gdt, r, ghc_tensor_ndim(t) == 2 ? ghc_tensor_dim(t, 1) : -1));
    }
    return DISPATCH(&c, ghc_cpu_lora_cast_bwd(g, dh, db, dy, h, b, scale, wrows, a),
                    ghc_k_lora_cast_bwd(g, dh, db, dy, h, b, scale, wrows, a, stream));
}

/* ---- attention ---------------------------------------------------------------------------- */

/* q [B, Lq, H, Dh], k and v [B, Lk, H, Dh] of one dtype (f32 or bf16), Dh even and <= 256,
 * lse [B, H, Lq] f32. */
static int check_qkv(const struct op_ctx *c, const ghc_tensor_t *q, const ghc_tensor_t *k,
                     const ghc_tensor_t *v, const ghc_tensor_t *lse)
{
    CHECK(check_tensor(c, "q", q, DT_F32_BF16, false));
    unsigned dt = DT(ghc_tensor_dtype(q));
    CHECK(check_tensor(c, "k", k, dt, false));
    CHECK(check_tensor(c, "v", v, dt, false));
    CHECK(check_tensor(c, "lse", lse, DT_F32, false));
    if (ghc_tensor_ndim(q) != 4)
        return bad(c, "q", q, "4 dimensions [B, Lq, H, Dh]");
    int64_t B = ghc_tensor_dim(q, 0), Lq = ghc_tensor_dim(q, 1), H = ghc_tensor_dim(q, 2);
    int64_t Dh = ghc_tensor_dim(q, 3);
    if (Dh % 2 != 0 || Dh > 256 || Dh < 2)
        return bad(c, "q", q, "an even head dim Dh in [2, 256]");
    if (ghc_tensor_ndim(k) != 4)
        return bad(c, "k", k, "4 dimensions [B, Lk, H, Dh]");
    int64_t Lk = ghc_tensor_dim(k, 1);
    CHECK(check_shape(c, "k", k, 4, (const int64_t[]){ B, Lk, H, Dh }));
    CHECK(check_shape(c, "v", v, 4, (const int64_t[]){ B, Lk, H, Dh }));
    CHECK(check_shape(c, "lse", lse, 3, (const int64_t[]){ B, H, Lq }));
    return 0;
}

/* o of q's dtype: like q [B, Lq, H, Dh], or [B, Lq, H Dh] (its rows the tokens; dense or a
 * column view). */
static int check_attn_o(const struct op_ctx *c, const ghc_tensor_t *o, const ghc_tensor_t *q)
{
    char buf[128];
    NEED_VIEW(c, "o", o, DT(ghc_tensor_dtype(q)));
    const int64_t B = ghc_tensor_dim(q, 0), Lq = ghc_tensor_dim(q, 1), HD = ghc_tensor_dim(q, 2) * ghc_tensor_dim(q, 3);
    if (ghc_tensor_ndim(o) == 3)
        return check_shape(c, "o", o, 3, (const int64_t[]){ B, Lq, HD });
    if (!has_shape(o, 4, ghc_tensor_shape(q)))
        return bad(c, "o", o, "shape %s or [%lld, %lld, %lld]", shape_text(4, ghc_tensor_shape(q), buf, sizeof(buf)),
                   (long long)B, (long long)Lq, (long long)HD);
    if (!dense(o))
        return bad(c, "o", o, "a dense tensor (a column view o is 3-D [B, Lq, H Dh])");
    return 0;
}

int ghc_op_attention_fwd(ghc_tensor_t *o, ghc_tensor_t *lse, const ghc_tensor_t *q,
                         const ghc_tensor_t *k, const ghc_tensor_t *v, float scale, void *stream)
{
    struct op_ctx c = OP_CTX("attention_fwd", o, lse, q, k, v);
    NEED_VIEW(&c, "o", o, DT_F32_BF16);
    CHECK(check_qkv(&c, q, k, v, lse));
    CHECK(check_attn_o(&c, o, q));
    if (ghc_tensor_numel(o) == 0)
        return 0;
    return DISPATCH(&c, ghc_cpu_attention_fwd(o, lse, q, k, v, scale),
                    ghc_k_attention_fwd(o, lse, q, k, v, scale, stream));
}

int ghc_op_attention_bwd(ghc_tensor_t *dq, ghc_tensor_t *dk, ghc_tensor_t *dv,
                         const ghc_tensor_t *dout, const ghc_tensor_t *q, const ghc_tensor_t *k,
                         const ghc_tensor_t *v, const ghc_tensor_t *o, const ghc_tensor_t *lse,
                         float scale, void *stream)
{
    struct op_ctx c = OP_CTX("attention_bwd", dq, dk, dv, dout, q, k, v, o, lse);
    CHECK(check_qkv(&c, q, k, v, lse));
    unsigned dt = DT(ghc_tensor_dtype(q));
    NEED(&c, "dout", dout, dt);
    LIKE(&c, "dout", dout, q);
    CHECK(check_attn_o(&c, o, q));
    MAYBE(&c, "dq", dq, dt);
    LIKE(&c, "dq", dq, q);
    MAYBE(&c, "dk", dk, dt);
    LIKE(&c, "dk", dk, k);
    MAYBE(&c, "dv", dv, dt);
    LIKE(&c, "dv", dv, k);
    if (!dq && !dk && !dv)
        return 0;
    if (ghc_tensor_numel(q) == 0 && ghc_tensor_numel(k) == 0)
        return 0;
    return DISPATCH(&c, ghc_cpu_attention_bwd(dq, dk, dv, dout, q, k, v, o, lse, scale),
                    ghc_k_attention_bwd(dq, dk, dv, dout, q, k, v, o, lse, scale, stream));
}

/* ---- normalisation ------------------------------------------------------------------------ */

int ghc_op_layernorm_fwd(ghc_tensor_t *y, ghc_tensor_t *stats, const ghc_tensor_t *x,
                         const ghc_tensor_t *weight, const ghc_tensor_t *bias,
                         const ghc_tensor_t *shift, const ghc_tensor_t *scale, float eps,
                         void *stream)
{
    struct op_ctx c = OP_CTX("layernorm_fwd", y, stats, x, weight, bias, shift, scale);
    NEED_VIEW(&c, "y", y, DT_F32_BF16);
    MAYBE(&c, "stats", stats, DT_F32);
    NEED(&c, "x", x, DT_F32_BF16);
    MAYBE(&c, "weight", weight, DT_F32_BF16);
    MAYBE(&c, "bias", bias, DT_F32_BF16);
    MAYBE(&c, "shift", shift, DT_F32_BF16);
    MAYBE(&c, "scale", scale, DT_F32_BF16);
    CHECK(check_rows(&c, "x", x));
    LIKE(&c, "y", y, x);
    int64_t D = ghc_tensor_dim(x, -1), rows = D ? ghc_tensor_numel(x) / D : 0;
    SHAPE(&c, "weight", weight, D);
    SHAPE(&c, "bias", bias, D);
    BCAST(&c, "shift", shift, "x", x);
    BCAST(&c, "scale", scale, "x", x);
    SHAPE(&c, "stats", stats, rows, 2);
    if (ghc_tensor_numel(x) == 0)
        return 0;
    return DISPATCH(&c, ghc_cpu_layernorm_fwd(y, stats, x, weight, bias, shift, scale, eps),
                    ghc_k_layernorm_fwd(y, stats, x, weight, bias, shift, scale, eps, stream));
}

int ghc_op_layernorm_bwd(ghc_tensor_t *dx, const ghc_tensor_t *dy, const ghc_tensor_t *x,
                         const ghc_tensor_t *stats, const ghc_tensor_t *weight,
                         const ghc_tensor_t *scale, bool accumulate, void *stream)
{
    struct op_ctx c = OP_CTX("layernorm_bwd", dx, dy, x, stats, weight, scale);
    NEED(&c, "dx", dx, DT_F32_BF16);
    NEED(&c, "dy", dy, DT_F32_BF16);
    NEED(&c, "x", x, DT_F32_BF16);
    NEED(&c, "stats", stats, DT_F32);
    MAYBE(&c, "weight", weight, DT_F32_BF16);
    MAYBE(&c, "scale", scale, DT_F32_BF16);
    CHECK(check_rows(&c, "x", x));
    LIKE(&c, "dx", dx, x);
    LIKE(&c, "dy", dy, x);
    int64_t D = ghc_tensor_dim(x, -1), rows = D ? ghc_tensor_numel(x) / D : 0;
    SHAPE(&c, "stats", stats, rows, 2);
    SHAPE(&c, "weight", weight, D);
    BCAST(&c, "scale", scale, "x", x);
    if (ghc_tensor_numel(x) == 0)
        return 0;
    return DISPATCH(&c, ghc_cpu_layernorm_bwd(dx, dy, x, stats, weight, scale, accumulate),
                    ghc_k_layernorm_bwd(dx, dy, x, stats, weight, scale, accumulate, stream));
}

/* x [B, L, D] with D = heads Dh, Dh even, L = f h w (ghc_op_rmsnorm_rope_*). */
static int check_rope_rows(const struct op_ctx *c, const ghc_tensor_t *x, int64_t heads, int64_t f, int64_t h,
                           int64_t w)
{
    if (ghc_tensor_ndim(x) != 3)
        return bad(c, "x", x, "3 dimensions [B, L, D]");
    const int64_t L = ghc_tensor_dim(x, 1), D = ghc_tensor_dim(x, 2);
    if (heads < 1 || D % heads != 0 || (D / heads) % 2 != 0)
        return bad(c, "x", x, "D = %lld heads of an even head dim", (long long)heads);
    if (f < 1 || h < 1 || w < 1 || L / f / h != w || f * h * w != L)
        return bad(c, "x", x, "L = f h w = %lld x %lld x %lld tokens", (long long)f, (long long)h, (long long)w);
    return 0;
}

/* RMSNorm forward, with rope followed by RoPE over (f, h, w) of `heads` (op: the name in
 * messages). */
static int rmsnorm_fwd(const char *op, ghc_tensor_t *y, ghc_tensor_t *rstd, const ghc_tensor_t *x,
                       const ghc_tensor_t *weight, float eps, bool rope, int64_t heads, int64_t f, int64_t h,
                       int64_t w, void *stream)
{
    struct op_ctx c = OP_CTX(op, y, rstd, x, weight);
    NEED(&c, "y", y, DT_F32_BF16);
    MAYBE(&c, "rstd", rstd, DT_F32);
    NEED(&c, "x", x, DT_F32_BF16);
    NEED(&c, "weight", weight, DT_F32_BF16);
    CHECK(rope ? check_rope_rows(&c, x, heads, f, h, w) : check_rows(&c, "x", x));
    LIKE(&c, "y", y, x);
    int64_t D = ghc_tensor_dim(x, -1), rows = D ? ghc_tensor_numel(x) / D : 0;
    SHAPE(&c, "weight", weight, D);
    SHAPE(&c, "rstd", rstd, rows);
    if (ghc_tensor_numel(x) == 0)
        return 0;
    if (rope)
        return DISPATCH(&c, ghc_cpu_rmsnorm_rope_fwd(y, rstd, x, weight, eps, heads, h, w),
                        ghc_k_rmsnorm_rope_fwd(y, rstd, x, weight, eps, heads, h, w, stream));
    return DISPATCH(&c, ghc_cpu_rmsnorm_fwd(y, rstd, x, weight, eps),
                    ghc_k_rmsnorm_fwd(y, rstd, x, weight, eps, stream));
}

/* Its backward, with rope through RoPE's inverse first. */
static int rmsnorm_bwd(const char *op, ghc_tensor_t *dx, const ghc_tensor_t *dy, const ghc_tensor_t *x,
                       const ghc_tensor_t *rstd, const ghc_tensor_t *weight, bool rope, int64_t heads, int64_t f,
                       int64_t h, int64_t w, void *stream)
{
    struct op_ctx c = OP_CTX(op, dx, dy, x, rstd, weight);
    NEED(&c, "dx", dx, DT_F32_BF16);
    NEED(&c, "dy", dy, DT_F32_BF16);
    NEED(&c, "x", x, DT_F32_BF16);
    NEED(&c, "rstd", rstd, DT_F32);
    NEED(&c, "weight", weight, DT_F32_BF16);
    CHECK(rope ? check_rope_rows(&c, x, heads, f, h, w) : check_rows(&c, "x", x));
    LIKE(&c, "dx", dx, x);
    LIKE(&c, "dy", dy, x);
    int64_t D = ghc_tensor_dim(x, -1), rows = D ? ghc_tensor_numel(x) / D : 0;
    SHAPE(&c, "rstd", rstd, rows);
    SHAPE(&c, "weight", weight, D);
    if (ghc_tensor_numel(x) == 0)
        return 0;
    if (rope)
        return DISPATCH(&c, ghc_cpu_rmsnorm_rope_bwd(dx, dy, x, rstd, weight, heads, h, w),
                        ghc_k_rmsnorm_rope_bwd(dx, dy, x, rstd, weight, heads, h, w, stream));
    return DISPATCH(&c, ghc_cpu_rmsnorm_bwd(dx, dy, x, rstd, weight),
                    ghc_k_rmsnorm_bwd(dx, dy, x, rstd, weight, stream));
}

int ghc_op_rmsnorm_fwd(ghc_tensor_t *y, ghc_tensor_t *rstd, const ghc_tensor_t *x,
                       const ghc_tensor_t *weight, float eps, void *stream)
{
    return rmsnorm_fwd("rmsnorm_fwd", y, rstd, x, weight, eps, false, 0, 0, 0, 0, stream);
}

int ghc_op_rmsnorm_bwd(ghc_tensor_t *dx, const ghc_tensor_t *dy, const ghc_tensor_t *x,
                       const ghc_tensor_t *rstd, const ghc_tensor_t *weight, void *stream)
{
    return rmsnorm_bwd("rmsnorm_bwd", dx, dy, x, rstd, weight, false, 0, 0, 0, 0, stream);
}

int ghc_op_rmsnorm_rope_fwd(ghc_tensor_t *y, ghc_tensor_t *rstd, const ghc_tensor_t *x, const ghc_tensor_t *weight,
                            float eps, int64_t heads, int64_t f, int64_t h, int64_t w, void *stream)
{
    return rmsnorm_fwd("rmsnorm_rope_fwd", y, rstd, x, weight, eps, true, heads, f, h, w, stream);
}

int ghc_op_rmsnorm_rope_bwd(ghc_tensor_t *dx, const ghc_tensor_t *dy, const ghc_tensor_t *x, const ghc_tensor_t *rstd,
                            const ghc_tensor_t *weight, int64_t heads, int64_t f, int64_t h, int64_t w, void *stream)
{
    return rmsnorm_bwd("rmsnorm_rope_bwd", dx, dy, x, rstd, weight, true, heads, f, h, w, stream);
}

/* ---- position ----------------------------------------------------------------------------- */

int ghc_op_rope(ghc_tensor_t *y, const ghc_tensor_t *x, int64_t f, int64_t h, int64_t w, bool inverse,
                void *stream)
{
    struct op_ctx c = OP_CTX("rope", y, x);
    NEED(&c, "y", y, DT_F32_BF16);
    NEED(&c, "x", x, DT_F32_BF16);
    if (ghc_tensor_ndim(x) != 4)
        return bad(&c, "x", x, "4 dimensions [B, L, H, Dh]");
    if (f < 1 || h < 1 || w < 1 || ghc_tensor_dim(x, 1) / f / h != w || f * h * w != ghc_tensor_dim(x, 1))
        return bad(&c, "x", x, "L = f h w = %lld x %lld x %lld tokens", (long long)f, (long long)h, (long long)w);
    if (ghc_tensor_dim(x, 3) % 2 != 0)
        return bad(&c, "x", x, "an even head dim");
    LIKE(&c, "y", y, x);
    if (ghc_tensor_numel(x) == 0)
        return 0;
    return DISPATCH(&c, ghc_cpu_rope(y, x, f, h, w, inverse), ghc_k_rope(y, x, f, h, w, inverse, stream));
}

/* ---- patches ------------------------------------------------------------------------------ */

/* lat [B, C, F, H, W] with H, W even (dim 1 not checked: C is free); rows [B, F (H/2) (W/2), 4 row_ch]
 * (row_ch < 0: any multiple of 4 columns). */
static int check_patch(const struct op_ctx *c, const char *lname, const ghc_tensor_t *lat, const char *rname,
                       const ghc_tensor_t *rows, int64_t row_ch)
{
    if (ghc_tensor_ndim(lat) != 5 || ghc_tensor_dim(lat, 3) % 2 || ghc_tensor_dim(lat, 4) % 2)
        return bad(c, lname, lat, "5 dimensions [B, C, F, H, W] with H and W even (2x2 patches)");
    int64_t B = ghc_tensor_dim(lat, 0), L = ghc_tensor_dim(lat, 2) * (ghc_tensor_dim(lat, 3) / 2) *
                                             (ghc_tensor_dim(lat, 4) / 2);
    if (row_ch >= 0) {
        SHAPE(c, rname, rows, B, L, 4 * row_ch);
    } else if (ghc_tensor_ndim(rows) != 3 || ghc_tensor_dim(rows, 0) != B || ghc_tensor_dim(rows, 1) != L ||
               ghc_tensor_dim(rows, 2) % 4) {
        return bad(c, rname, rows, "shape [%lld, %lld, 4 C]", (long long)B, (long long)L);
    }
    return 0;
}

int ghc_op_patchify(ghc_tensor_t *rows, const ghc_tensor_t *lat, const ghc_tensor_t *cond, void *stream)
{
    struct op_ctx c = OP_CTX("patchify", rows, lat, cond);
    NEED(&c, "rows", rows, DT_F32_BF16);
    NEED(&c, "lat", lat, DT_FLOAT);
    MAYBE(&c, "cond", cond, DT_FLOAT);
    int64_t Cc = 0;
    CHECK(check_patch(&c, "lat", lat, "rows", rows, -1));
    if (cond) {
        if (ghc_tensor_ndim(cond) != 5 || ghc_tensor_dim(cond, 0) != ghc_tensor_dim(lat, 0) ||
            ghc_tensor_dim(cond, 2) != ghc_tensor_dim(lat, 2) || ghc_tensor_dim(cond, 3) != ghc_tensor_dim(lat, 3) ||
            ghc_tensor_dim(cond, 4) != ghc_tensor_dim(lat, 4))
            return bad(&c, "cond", cond, "[B, Cc, F, H, W] like 'lat' but for the channels");
        Cc = ghc_tensor_dim(cond, 1);
    }
    CHECK(check_patch(&c, "lat", lat, "rows", rows, ghc_tensor_dim(lat, 1) + Cc));
    if (ghc_tensor_numel(rows) == 0)
        return 0;
    return DISPATCH(&c, ghc_cpu_patchify(rows, lat, cond), ghc_k_patchify(rows, lat, cond, stream));
}

int ghc_op_patchify_bwd(ghc_tensor_t *dlat, const ghc_tensor_t *drows, void *stream)
{
    struct op_ctx c = OP_CTX("patchify_bwd", dlat, drows);
    NEED(&c, "dlat", dlat, DT_F32_BF16);
    NEED(&c, "drows", drows, DT_FLOAT);
    CHECK(check_patch(&c, "dlat", dlat, "drows", drows, -1));
    if (ghc_tensor_dim(drows, 2) / 4 < ghc_tensor_dim(dlat, 1))
        return bad(&c, "drows", drows, "at least 4 x %lld columns (the channels of 'dlat')",
                   (long long)ghc_tensor_dim(dlat, 1));
    if (ghc_tensor_numel(dlat) == 0)
        return 0;
    return DISPATCH(&c, ghc_cpu_patchify_bwd(dlat, drows), ghc_k_patchify_bwd(dlat, drows, stream));
}

int ghc_op_unpatchify(ghc_tensor_t *out, const ghc_tensor_t *rows, void *stream)
{
    struct op_ctx c = OP_CTX("unpatchify", out, rows);
    NEED(&c, "out", out, DT_F32_BF16);
    NEED(&c, "rows", rows, DT_FLOAT);
    CHECK(check_patch(&c, "out", out, "rows", rows, -1));
    CHECK(check_patch(&c, "out", out, "rows", rows, ghc_tensor_dim(out, 1)));
    if (ghc_tensor_numel(out) == 0)
        return 0;
    return DISPATCH(&c, ghc_cpu_unpatchify(out, rows), ghc_k_unpatchify(out, rows, stream));
}

int ghc_op_unpatchify_bwd(ghc_tensor_t *drows, const ghc_tensor_t *dout, void *stream)
{
    struct op_ctx c = OP_CTX("unpatchify_bwd", drows, dout);
    NEED(&c, "drows", drows, DT_F32_BF16);
    NEED(&c, "dout", dout, DT_FLOAT);
    CHECK(check_patch(&c, "dout", dout, "drows", drows, -1));
    CHECK(check_patch(&c, "dout", dout, "drows", drows, ghc_tensor_dim(dout, 1)));
    if (ghc_tensor_numel(dout) == 0)
        return 0;
    return DISPATCH(&c, ghc_cpu_unpatchify_bwd(drows, dout), ghc_k_unpatchify_bwd(drows, dout, stream));
}

/* ---- activations -------------------------------------------------------------------------- */

/* y like x; both f32 or bf16. */
static int check_unary(const struct op_ctx *c, const ghc_tensor_t *y, const ghc_tensor_t *x)
{
    CHECK(check_tensor(c, "y", y, DT_F32_BF16, false));
    CHECK(check_tensor(c, "x", x, DT_F32_BF16, false));
    return check_like(c, "y", y, x);
}

/* dx, dy like x; all f32 or bf16. */
static int check_unary_bwd(const struct op_ctx *c, const ghc_tensor_t *dx, const ghc_tensor_t *dy,
                           const ghc_tensor_t *x)
{
    CHECK(check_tensor(c, "dx", dx, DT_F32_BF16, false));
    CHECK(check_tensor(c, "dy", dy, DT_F32_BF16, false));
    CHECK(check_tensor(c, "x", x, DT_F32_BF16, false));
    CHECK(check_like(c, "dx", dx, x));
    return check_like(c, "dy", dy, x);
}

int ghc_op_gelu_tanh(ghc_tensor_t *y, const ghc_tensor_t *x, void *stream)
{
    struct op_ctx c = OP_CTX("gelu_tanh", y, x);
    NEED_VIEW(&c, "y", y, DT_F32_BF16);
    NEED(&c, "x", x, DT_F32_BF16);
    LIKE(&c, "y", y, x);
    if (!dense(y) && ghc_tensor_numel(x) > 0) {   /* in place only when dense: a view must not overlap x */
        const int64_t D = ghc_tensor_dim(y, -1), rows = ghc_tensor_numel(y) / D;
        const uintptr_t y0 = (uintptr_t)ghc_tensor_data(y), x0 = (uintptr_t)ghc_tensor_cdata(x);
        const uintptr_t y1 = y0 + (uintptr_t)((rows - 1) * ghc_tensor_row_stride(y) + D) *
                                      ghc_dtype_size(ghc_tensor_dtype(y));
        if (y0 < x0 + ghc_tensor_nbytes(x) && x0 < y1)
            return bad(&c, "y", y, "memory apart from 'x' (gelu_tanh runs in place only on dense tensors)");
    }
    if (ghc_tensor_numel(x) == 0)
        return 0;
    return DISPATCH(&c, ghc_cpu_gelu_tanh(y, x), ghc_k_gelu_tanh(y, x, stream));
}

int ghc_op_gelu_tanh_bwd(ghc_tensor_t *dx, const ghc_tensor_t *dy, const ghc_tensor_t *x, void *stream)
{
    struct op_ctx c = OP_CTX("gelu_tanh_bwd", dx, dy, x);
    CHECK(check_unary_bwd(&c, dx, dy, x));
    if (ghc_tensor_numel(x) == 0)
        return 0;
    return DISPATCH(&c, ghc_cpu_gelu_tanh_bwd(dx, dy, x), ghc_k_gelu_tanh_bwd(dx, dy, x, stream));
}

int ghc_op_silu(ghc_tensor_t *y, const ghc_tensor_t *x, void *stream)
{
    struct op_ctx c = OP_CTX("silu", y, x);
    CHECK(check_unary(&c, y, x));
    if (ghc_tensor_numel(x) == 0)
        return 0;
    return DISPATCH(&c, ghc_cpu_silu(y, x), ghc_k_silu(y, x, stream));
}

int ghc_op_silu_bwd(ghc_tensor_t *dx, const ghc_tensor_t *dy, const ghc_tensor_t *x, void *stream)
{
    struct op_ctx c = OP_CTX("silu_bwd", dx, dy, x);
    CHECK(check_unary_bwd(&c, dx, dy, x));
    if (ghc_tensor_numel(x) == 0)
        return 0;
    return DISPATCH(&c, ghc_cpu_silu_bwd(dx, dy, x), ghc_k_silu_bwd(dx, dy, x, stream));
}

/* ---- elementwise -------------------------------------------------------------------------- */

/* y like a, b broadcast over a; all f32 or bf16. */
static int check_binary(const struct op_ctx *c, const ghc_tensor_t *y, const ghc_tensor_t *a,
                        const ghc_tensor_t *b)
{
    CHECK(check_tensor(c, "y", y, DT_F32_BF16, false));
    CHECK(check_tensor(c, "a", a, DT_F32_BF16, false));
    CHECK(check_tensor(c, "b", b, DT_F32_BF16, false));
    CHECK(check_like(c, "y", y, a));
    return check_bcast(c, "b", b, "a", a);
}

int ghc_op_add(ghc_tensor_t *y, const ghc_tensor_t *a, const ghc_tensor_t *b, float alpha, float beta,
               void *stream)
{
    struct op_ctx c = OP_CTX("add", y, a, b);
    CHECK(check_binary(&c, y, a, b));
    if (ghc_tensor_numel(a) == 0)
        return 0;
    return DISPATCH(&c, ghc_cpu_add(y, a, b, alpha, beta), ghc_k_add(y, a, b, alpha, beta, stream));
}

int ghc_op_mul(ghc_tensor_t *y, const ghc_tensor_t *a, const ghc_tensor_t *b, void *stream)
{
    struct op_ctx c = OP_CTX("mul", y, a, b);
    CHECK(check_binary(&c, y, a, b));
    if (ghc_tensor_numel(a) == 0)
        return 0;
    return DISPATCH(&c, ghc_cpu_mul(y, a, b), ghc_k_mul(y, a, b, stream));
}

int ghc_op_gated_residual_to(ghc_tensor_t *out, const ghc_tensor_t *x, const ghc_tensor_t *y,
                             const ghc_tensor_t *gate, void *stream)
{
    struct op_ctx c = OP_CTX("gated_residual", out, x, y, gate);
    NEED(&c, "x", x, DT_F32);
    NEED(&c, "out", out, DT_F32);
    NEED(&c, "y", y, DT_F32_BF16);
    MAYBE(&c, "gate", gate, DT_F32_BF16);
    LIKE(&c, "x", x, out);
    LIKE(&c, "y", y, out);
    BCAST(&c, "gate", gate, "x", x);
    if (ghc_tensor_numel(out) == 0)
        return 0;
    return DISPATCH(&c, ghc_cpu_gated_residual(out, x, y, gate), ghc_k_gated_residual(out, x, y, gate, stream));
}

int ghc_op_gated_residual(ghc_tensor_t *x, const ghc_tensor_t *y, const ghc_tensor_t *gate, void *stream)
{
    return ghc_op_gated_residual_to(x, x, y, gate, stream);
}

int ghc_op_scale(ghc_tensor_t *y, const ghc_tensor_t *x, float alpha, void *stream)
{
    struct op_ctx c = OP_CTX("scale", y, x);
    CHECK(check_unary(&c, y, x));
    if (ghc_tensor_numel(x) == 0)
        return 0;
    return DISPATCH(&c, ghc_cpu_scale(y, x, alpha), ghc_k_scale(y, x, alpha, stream));
}

/* ---- reductions and losses ---------------------------------------------------------------- */

/* out: one f32 element. */
static int check_scalar_out(const struct op_ctx *c, const char *name, const ghc_tensor_t *out)
{
    CHECK(check_tensor(c, name, out, DT_F32, false));
    if (ghc_tensor_numel(out) != 1)
        return bad(c, name, out, "one element");
    return 0;
}

static int op_sum(const char *op, ghc_tensor_t *out, const ghc_tensor_t *x, bool mean, void *stream)
{
    struct op_ctx c = OP_CTX(op, out, x);
    CHECK(check_scalar_out(&c, "out", out));
    NEED(&c, "x", x, DT_F32_BF16);
    return DISPATCH(&c, ghc_cpu_sum(out, x, mean), ghc_k_sum(out, x, mean, stream));
}

int ghc_op_sum(ghc_tensor_t *out, const ghc_tensor_t *x, void *stream)
{
    return op_sum("sum", out, x, false, stream);
}

int ghc_op_mean(ghc_tensor_t *out, const ghc_tensor_t *x, void *stream)
{
    return op_sum("mean", out, x, true, stream);
}

int ghc_op_sum_rows(ghc_tensor_t *out, const ghc_tensor_t *x, void *stream)
{
    struct op_ctx c = OP_CTX("sum_rows", out, x);
    NEED(&c, "out", out, DT_F32_BF16);
    NEED(&c, "x", x, DT_F32_BF16);
    CHECK(check_rows(&c, "x", x));
    SHAPE(&c, "out", out, ghc_tensor_dim(x, -1));
    if (ghc_tensor_numel(out) == 0)
        return 0;
    return DISPATCH(&c, ghc_cpu_sum_rows(out, x), ghc_k_sum_rows(out, x, stream));
}

int ghc_op_mse_loss(ghc_tensor_t *loss, ghc_tensor_t *grad, const ghc_tensor_t *pred,
                    const ghc_tensor_t *target, void *stream)
{
    struct op_ctx c = OP_CTX("mse_loss", loss, grad, pred, target);
    CHECK(check_scalar_out(&c, "loss", loss));
    MAYBE(&c, "grad", grad, DT_F32_BF16);
    NEED(&c, "pred", pred, DT_F32_BF16);
    NEED(&c, "target", target, DT_F32_BF16);
    LIKE(&c, "target", target, pred);
    LIKE(&c, "grad", grad, pred);
    return DISPATCH(&c, ghc_cpu_mse_loss(loss, grad, pred, target),
                    ghc_k_mse_loss(loss, grad, pred, target, stream));
}

/* ---- model inputs (since API 14) ------------------------------------------------------------ */

int ghc_op_timestep_embedding(ghc_tensor_t *out, const ghc_tensor_t *t, bool cos_first, double max_period,
                              void *stream)
{
    struct op_ctx c = OP_CTX("timestep_embedding", out, t);
    NEED(&c, "out", out, DT_F32);
    NEED(&c, "t", t, DT_FLOAT);
    if (ghc_tensor_ndim(out) != 2)
        return bad(&c, "out", out, "2 dimensions [B, dim]");
    if (ghc_tensor_numel(t) != ghc_tensor_dim(out, 0))
        return bad(&c, "t", t, "%lld elements (one per row of 'out')", (long long)ghc_tensor_dim(out, 0));
    if (!(max_period > 0.0) || max_period > 1e300)
        return ghc_error_set(c.core, GHC_EINVAL, "timestep_embedding: max_period %g is not a positive finite number",
                             max_period);
    if (ghc_tensor_numel(out) == 0)
        return 0;
    return DISPATCH(&c, ghc_cpu_timestep_embedding(out, t, cos_first, max_period),
                    ghc_k_timestep_embedding(out, t, cos_first, max_period, stream));
}

int ghc_op_pad_rows(ghc_tensor_t *y, const ghc_tensor_t *x, const ghc_tensor_t *mask, void *stream)
{
    struct op_ctx c = OP_CTX("pad_rows", y, x, mask);
    NEED(&c, "y", y, DT_F32_BF16);
    NEED(&c, "x", x, DT_FLOAT);
    MAYBE(&c, "mask", mask, DT_FLOAT);
    if (ghc_tensor_ndim(y) != 3)
        return bad(&c, "y", y, "3 dimensions [B, Ly, D]");
    if (ghc_tensor_ndim(x) != 3 || ghc_tensor_dim(x, 0) != ghc_tensor_dim(y, 0) ||
        ghc_tensor_dim(x, 1) > ghc_tensor_dim(y, 1) || ghc_tensor_dim(x, 2) != ghc_tensor_dim(y, 2))
        return bad(&c, "x", x, "[%lld, <= %lld, %lld] (the rows of 'y')", (long long)ghc_tensor_dim(y, 0),
                   (long long)ghc_tensor_dim(y, 1), (long long)ghc_tensor_dim(y, 2));
    if (mask && ghc_tensor_numel(mask) != ghc_tensor_dim(x, 0) * ghc_tensor_dim(x, 1))
        return bad(&c, "mask", mask, "%lld elements (one per row of 'x')",
                   (long long)(ghc_tensor_dim(x, 0) * ghc_tensor_dim(x, 1)));
    if (ghc_tensor_numel(y) == 0)
        return 0;
    return DISPATCH(&c, ghc_cpu_pad_rows(y, x, mask), ghc_k_pad_rows(y, x, mask, stream));
}

/* ==== text encoder (umT5) ======================================================================= */

int ghc_op_embedding(ghc_tensor_t *y, const ghc_tensor_t *table, const ghc_tensor_t *ids, void *stream)
{
    struct op_ctx c = OP_CTX("embedding", y, table, ids);
    NEED(&c, "y", y, DT_F32_BF16);
    NEED(&c, "table", table, DT_FLOAT);
    NEED(&c, "ids", ids, DT(GHC_DTYPE_I32) | DT(GHC_DTYPE_I64));
    if (ghc_tensor_ndim(table) != 2)
        return bad(&c, "table", table, "2 dimensions [V, D]");
    const int64_t V = ghc_tensor_dim(table, 0), D = ghc_tensor_dim(table, 1), n = ghc_tensor_numel(ids);
    CHECK(check_rows_of(&c, "y", y, n, D, "one row of the table per id"));
    if (n == 0 || D == 0)
        return 0;
    if (c.device == GHC_DEVICE_CPU)
        for (int64_t i = 0; i < n; i++) {
            const int64_t id = ghc_tensor_dtype(ids) == GHC_DTYPE_I32 ? ((const int32_t *)ghc_tensor_cdata(ids))[i]
                                                                       : ((const int64_t *)ghc_tensor_cdata(ids))[i];
            if (id < 0 || id >= V)
                return bad(&c, "ids", ids, "ids in [0, %lld) (the rows of 'table'); element %lld is %lld",
                           (long long)V, (long long)i, (long long)id);
        }
    return DISPATCH(&c, ghc_cpu_embedding(y, table, ids), ghc_k_embedding(y, table, ids, stream));
}

int32_t ghc_rel_pos_bucket(int64_t r, int32_t num_buckets, int32_t max_distance, bool bidirectional)
{
    int32_t nb = num_buckets, base = 0;
    int64_t n;
    if (bidirectional) {
        nb /= 2;
        base = r > 0 ? nb : 0;
        n = r < 0 ? -r : r;
    } else {
        n = r < 0 ? -r : 0;
    }
    const int32_t exact = nb / 2;
    if (n < exact)
        return base + (int32_t)n;
    /* f32 as PyTorch: log of the f32 quotient, divided by the f32-rounded log of the ratio */
    const float ratio = logf((float)n / (float)exact) / (float)log((double)max_distance / exact);
    const float big = (float)exact + truncf(ratio * (float)(nb - exact));
    return base + (big > (float)(nb - 1) ? nb - 1 : (int32_t)big);
}

int ghc_op_rel_pos_bias(ghc_tensor_t *bias, const ghc_tensor_t *table, int32_t num_buckets, int32_t max_distance,
                        bool bidirectional, void *stream)
{
    struct op_ctx c = OP_CTX("rel_pos_bias", bias, table);
    NEED(&c, "bias", bias, DT_F32);
    NEED(&c, "table", table, DT_FLOAT);
    if (ghc_tensor_ndim(bias) != 3)
        return bad(&c, "bias", bias, "3 dimensions [H, Lq, Lk]");
    if (num_buckets < (bidirectional ? 4 : 2) || max_distance < 1)
        return ghc_error_set(c.core, GHC_EINVAL, "rel_pos_bias: num_buckets %d (>= %d) or max_distance %d (>= 1) "
                             "out of range", num_buckets, bidirectional ? 4 : 2, max_distance);
    SHAPE(&c, "table", table, num_buckets, ghc_tensor_dim(bias, 0));
    if (ghc_tensor_numel(bias) == 0)
        return 0;
    return DISPATCH(&c, ghc_cpu_rel_pos_bias(bias, table, num_buckets, max_distance, bidirectional),
                    ghc_k_rel_pos_bias(bias, table, num_buckets, max_distance, bidirectional, stream));
}

int ghc_op_attention_bias_fwd(ghc_tensor_t *o, const ghc_tensor_t *q, const ghc_tensor_t *k, const ghc_tensor_t *v,
                              const ghc_tensor_t *bias, const ghc_tensor_t *key_mask, float scale, void *stream)
{
    struct op_ctx c = OP_CTX("attention_bias_fwd", o, q, k, v, bias, key_mask);
    NEED(&c, "q", q, DT_F32_BF16);
    const unsigned dt = DT(ghc_tensor_dtype(q));
    NEED(&c, "k", k, dt);
    NEED(&c, "v", v, dt);
    NEED(&c, "o", o, dt);
    MAYBE(&c, "bias", bias, DT_F32);
    MAYBE(&c, "key_mask", key_mask, DT_FLOAT);
    if (ghc_tensor_ndim(q) != 4)
        return bad(&c, "q", q, "4 dimensions [B, Lq, H, Dh]");
    const int64_t B = ghc_tensor_dim(q, 0), Lq = ghc_tensor_dim(q, 1), H = ghc_tensor_dim(q, 2),
                  Dh = ghc_tensor_dim(q, 3), Lk = ghc_tensor_ndim(k) == 4 ? ghc_tensor_dim(k, 1) : -1;
    if (Dh < 1)
        return bad(&c, "q", q, "a head dim Dh >= 1");
    SHAPE(&c, "k", k, B, Lk, H, Dh);
    SHAPE(&c, "v", v, B, Lk, H, Dh);
    if (!(ghc_tensor_ndim(o) == 3 && has_shape(o, 3, (const int64_t[]){ B, Lq, H * Dh })))
        LIKE(&c, "o", o, q);
    SHAPE(&c, "bias", bias, H, Lq, Lk);
    if (key_mask && ghc_tensor_numel(key_mask) != B * Lk)
        return bad(&c, "key_mask", key_mask, "%lld elements (B Lk)", (long long)(B * Lk));
    if (ghc_tensor_numel(o) == 0)
        return 0;
    const uintptr_t o0 = (uintptr_t)ghc_tensor_cdata(o), o1 = o0 + ghc_tensor_nbytes(o);
    const ghc_tensor_t *ins[] = { q, k, v, bias, key_mask };
    for (size_t i = 0; i < sizeof(ins) / sizeof(ins[0]); i++) {
        const uintptr_t a = ins[i] ? (uintptr_t)ghc_tensor_cdata(ins[i]) : 0;
        if (ins[i] && a < o1 && o0 < a + ghc_tensor_nbytes(ins[i]))
            return bad(&c, "o", o, "memory apart from the inputs");
    }
    return DISPATCH(&c, ghc_cpu_attention_bias_fwd(o, q, k, v, bias, key_mask, scale),
                    ghc_k_attention_bias_fwd(o, q, k, v, bias, key_mask, scale, stream));
}

/* ==== convolution / VAE (since API 16) ========================================================== */


/* A video tensor: exactly 5 dimensions [B, C, T, H, W]. */
static int check_video(const struct op_ctx *c, const char *name, const ghc_tensor_t *t)
{
    if (ghc_tensor_ndim(t) != 5)
        return bad(c, name, t, "5 dimensions [B, C, T, H, W]");
    return 0;
}

/* x [B, C, ...] (2 to 5 dims) with a per-channel operand p of C elements (p may be NULL). */
static int check_channels(const struct op_ctx *c, const ghc_tensor_t *x, const char *pname, const ghc_tensor_t *p)
{
    if (ghc_tensor_ndim(x) < 2)
        return bad(c, "x", x, "2 to 5 dimensions [B, C, ...]");
    if (p && ghc_tensor_numel(p) != ghc_tensor_dim(x, 1))
        return bad(c, pname, p, "%lld elements (one per channel of 'x')", (long long)ghc_tensor_dim(x, 1));
    return 0;
}

/* conv3d, and with add conv3d_add (op: the name in messages). */
static int conv3d(const char *op, ghc_tensor_t *y, const ghc_tensor_t *x, const ghc_tensor_t *cache,
                  const ghc_tensor_t *w, const ghc_tensor_t *bias, bool add, const ghc_tensor_t *residual,
                  const struct ghc_conv3d *args, void *stream)
{
    static const struct ghc_conv3d plain = { 0 };
    struct op_ctx c = OP_CTX(op, y, x, cache, w, bias, residual);
    struct ghc_conv3d a = args ? *args : plain;
    NEED(&c, "y", y, DT_F32_BF16);
    NEED(&c, "x", x, DT_F32_BF16);
    MAYBE(&c, "cache", cache, DT_F32_BF16);
    NEED(&c, "w", w, DT_F32_BF16);
    MAYBE(&c, "bias", bias, DT_F32_BF16);
    CHECK(check_video(&c, "x", x));
    CHECK(check_video(&c, "y", y));
    a.stride_t = a.stride_t ? a.stride_t : 1;
    a.stride_h = a.stride_h ? a.stride_h : 1;
    a.stride_w = a.stride_w ? a.stride_w : 1;
    if (a.stride_t < 0 || a.stride_h < 0 || a.stride_w < 0 || a.pad_t < 0 || a.pad_top < 0 || a.pad_bottom < 0 ||
        a.pad_left < 0 || a.pad_right < 0)
        return ghc_error_set(c.core, GHC_EINVAL, "conv3d: negative stride or padding (stride %d, %d, %d; pad_t %d, "
                             "pad %d, %d, %d, %d)", a.stride_t, a.stride_h, a.stride_w, a.pad_t, a.pad_top,
                             a.pad_bottom, a.pad_left, a.pad_right);
    const int64_t B = ghc_tensor_dim(x, 0), Ci = ghc_tensor_dim(x, 1), T = ghc_tensor_dim(x, 2);
    const int64_t H = ghc_tensor_dim(x, 3), W = ghc_tensor_dim(x, 4);
    if (ghc_tensor_ndim(w) != 5 || ghc_tensor_dim(w, 1) != Ci)
        return bad(&c, "w", w, "[Co, %lld, kT, kH, kW] (x's %lld input channels)", (long long)Ci, (long long)Ci);
    const int64_t Co = ghc_tensor_dim(w, 0), kT = ghc_tensor_dim(w, 2), kH = ghc_tensor_dim(w, 3),
                  kW = ghc_tensor_dim(w, 4);
    if (cache) {
        CHECK(check_video(&c, "cache", cache));
        int64_t cf = ghc_tensor_dim(cache, 2);
        if (ghc_tensor_dim(cache, 0) != B || ghc_tensor_dim(cache, 1) != Ci || ghc_tensor_dim(cache, 3) != H ||
            ghc_tensor_dim(cache, 4) != W || cf > a.pad_t)
            return bad(&c, "cache", cache, "[%lld, %lld, c, %lld, %lld] with c <= pad_t = %d (x's frames)",
                       (long long)B, (long long)Ci, (long long)H, (long long)W, a.pad_t);
    }
    SHAPE(&c, "bias", bias, Co);
    const int64_t st = a.pad_t + T - kT, sh = H + a.pad_top + a.pad_bottom - kH, sw = W + a.pad_left + a.pad_right - kW;
    if (kT < 1 || kH < 1 || kW < 1 || st < 0 || sh < 0 || sw < 0)
        return bad(&c, "w", w, "a kernel no larger than the padded input (%lld frames, %lld x %lld)",
                   (long long)(a.pad_t + T), (long long)(H + a.pad_top + a.pad_bottom),
                   (long long)(W + a.pad_left + a.pad_right));
    SHAPE(&c, "y", y, B, Co, st / a.stride_t + 1, sh / a.stride_h + 1, sw / a.stride_w + 1);
    if (add) {
        NEED(&c, "residual", residual, DT(ghc_tensor_dtype(y)));
        LIKE(&c, "residual", residual, y);
        if (ghc_tensor_cdata(residual) == ghc_tensor_cdata(y))
            return bad(&c, "residual", residual, "a tensor other than 'y'");
    }
    if (ghc_tensor_numel(y) == 0)
        return 0;
    return DISPATCH(&c, ghc_cpu_conv3d(y, x, cache, w, bias, residual, &a),
                    ghc_k_conv3d(y, x, cache, w, bias, residual, &a, stream));
}

int ghc_op_conv3d(ghc_tensor_t *y, const ghc_tensor_t *x, const ghc_tensor_t *cache, const ghc_tensor_t *w,
                  const ghc_tensor_t *bias, const struct ghc_conv3d *args, void *stream)
{
    return conv3d("conv3d", y, x, cache, w, bias, false, NULL, args, stream);
}

int ghc_op_conv3d_add(ghc_tensor_t *y, const ghc_tensor_t *x, const ghc_tensor_t *cache, const ghc_tensor_t *w,
                      const ghc_tensor_t *bias, const ghc_tensor_t *residual, const struct ghc_conv3d *args,
                      void *stream)
{
    return conv3d("conv3d_add", y, x, cache, w, bias, true, residual, args, stream);
}

/* channel_rmsnorm, and with silu channel_rmsnorm_silu (op: the name in messages). */
static int channel_rmsnorm(const char *op, ghc_tensor_t *y, const ghc_tensor_t *x, const ghc_tensor_t *gamma, bool silu,
                           void *stream)
{
    struct op_ctx c = OP_CTX(op, y, x, gamma);
    NEED(&c, "y", y, DT_F32_BF16);
    NEED(&c, "x", x, DT_F32_BF16);
    NEED(&c, "gamma", gamma, DT_F32_BF16);
    CHECK(check_channels(&c, x, "gamma", gamma));
    LIKE(&c, "y", y, x);
    if (ghc_tensor_numel(y) == 0)
        return 0;
    return DISPATCH(&c, ghc_cpu_channel_rmsnorm(y, x, gamma, silu), ghc_k_channel_rmsnorm(y, x, gamma, silu, stream));
}

int ghc_op_channel_rmsnorm(ghc_tensor_t *y, const ghc_tensor_t *x, const ghc_tensor_t *gamma, void *stream)
{
    return channel_rmsnorm("channel_rmsnorm", y, x, gamma, false, stream);
}

int ghc_op_channel_rmsnorm_silu(ghc_tensor_t *y, const ghc_tensor_t *x, const ghc_tensor_t *gamma, void *stream)
{
    return channel_rmsnorm("channel_rmsnorm_silu", y, x, gamma, true, stream);
}

int ghc_op_channel_affine(ghc_tensor_t *y, const ghc_tensor_t *x, const ghc_tensor_t *scale, const ghc_tensor_t *shift,
                          void *stream)
{
    struct op_ctx c = OP_CTX("channel_affine", y, x, scale, shift);
    NEED(&c, "y", y, DT_F32_BF16);
    NEED(&c, "x", x, DT_F32_BF16);
    NEED(&c, "scale", scale, DT_F32_BF16);
    MAYBE(&c, "shift", shift, DT_F32_BF16);
    CHECK(check_channels(&c, x, "scale", scale));
    CHECK(check_channels(&c, x, "shift", shift));
    LIKE(&c, "y", y, x);
    if (ghc_tensor_numel(y) == 0)
        return 0;
    return DISPATCH(&c, ghc_cpu_channel_affine(y, x, scale, shift),
                    ghc_k_channel_affine(y, x, scale, shift, stream));
}

int ghc_op_upsample2x(ghc_tensor_t *y, const ghc_tensor_t *x, void *stream)
{
    struct op_ctx c = OP_CTX("upsample2x", y, x);
    NEED(&c, "y", y, DT_F32_BF16);
    NEED(&c, "x", x, DT_F32_BF16);
    CHECK(check_video(&c, "x", x));
    SHAPE(&c, "y", y, ghc_tensor_dim(x, 0), ghc_tensor_dim(x, 1), ghc_tensor_dim(x, 2), 2 * ghc_tensor_dim(x, 3),
          2 * ghc_tensor_dim(x, 4));
    if (ghc_tensor_numel(y) == 0)
        return 0;
    return DISPATCH(&c, ghc_cpu_upsample2x(y, x), ghc_k_upsample2x(y, x, stream));
}

int ghc_op_copy_frames(ghc_tensor_t *dst, int64_t dst_t, const ghc_tensor_t *src, int64_t src_t, int64_t n,
                       void *stream)
{
    struct op_ctx c = OP_CTX("copy_frames", dst, src);
    char buf[160];
    NEED(&c, "dst", dst, DT_FLOAT);
    NEED(&c, "src", src, DT(ghc_tensor_dtype(dst)));
    CHECK(check_video(&c, "dst", dst));
    CHECK(check_video(&c, "src", src));
    for (int d = 0; d < 5; d++)
        if (d != 2 && ghc_tensor_dim(src, d) != ghc_tensor_dim(dst, d))
            return bad(&c, "src", src, "the B, C, H and W of 'dst' %s", ghc_tensor_describe(dst, buf, sizeof(buf)));
    if (n < 0 || dst_t < 0 || src_t < 0 || dst_t + n > ghc_tensor_dim(dst, 2) || src_t + n > ghc_tensor_dim(src, 2))
        return ghc_error_set(c.core, GHC_EINVAL, "copy_frames: frames [%lld, %lld) of a %lld-frame src to [%lld, "
                             "%lld) of a %lld-frame dst are out of range", (long long)src_t, (long long)(src_t + n),
                             (long long)ghc_tensor_dim(src, 2), (long long)dst_t, (long long)(dst_t + n),
                             (long long)ghc_tensor_dim(dst, 2));
    if (n == 0 || ghc_tensor_numel(dst) == 0)
        return 0;
    return DISPATCH(&c, ghc_cpu_copy_frames(dst, dst_t, src, src_t, n),
                    ghc_k_copy_frames(dst, dst_t, src, src_t, n, stream));
}

int ghc_op_frame_attention(ghc_tensor_t *o, const ghc_tensor_t *qkv, float scale, void *stream)
{
    struct op_ctx c = OP_CTX("frame_attention", o, qkv);
    NEED(&c, "o", o, DT_F32_BF16);
    NEED(&c, "qkv", qkv, DT_F32_BF16);
    CHECK(check_video(&c, "qkv", qkv));
    if (ghc_tensor_dim(qkv, 1) % 3 != 0)
        return bad(&c, "qkv", qkv, "3 C channels (q, k, v)");
    SHAPE(&c, "o", o, ghc_tensor_dim(qkv, 0), ghc_tensor_dim(qkv, 1) / 3, ghc_tensor_dim(qkv, 2),
          ghc_tensor_dim(qkv, 3), ghc_tensor_dim(qkv, 4));
    if (!isfinite(scale))
        return ghc_error_set(c.core, GHC_EINVAL, "frame_attention: scale %g is not finite", (double)scale);
    if (ghc_tensor_numel(o) == 0)
        return 0;
    return DISPATCH(&c, ghc_cpu_frame_attention(o, qkv, scale), ghc_k_frame_attention(o, qkv, scale, stream));
}

int ghc_op_clamp(ghc_tensor_t *y, const ghc_tensor_t *x, float lo, float hi, void *stream)
{
    struct op_ctx c = OP_CTX("clamp", y, x);
    NEED(&c, "y", y, DT_F32_BF16);
    NEED(&c, "x", x, DT_F32_BF16);
    LIKE(&c, "y", y, x);
    if (!(lo <= hi))
        return ghc_error_set(c.core, GHC_EINVAL, "clamp: need lo <= hi, got %g, %g", (double)lo, (double)hi);
    if (ghc_tensor_numel(y) == 0)
        return 0;
    return DISPATCH(&c, ghc_cpu_clamp(y, x, lo, hi), ghc_k_clamp(y, x, lo, hi, stream));
}
int ghc_op_avg_down3d(ghc_tensor_t *y, const ghc_tensor_t *x, int32_t ft, int32_t fs, void *stream)
{
    struct op_ctx c = OP_CTX("avg_down3d", y, x);
    NEED(&c, "y", y, DT_F32_BF16);
    NEED(&c, "x", x, DT_F32_BF16);
    CHECK(check_video(&c, "x", x));
    CHECK(check_video(&c, "y", y));
    if (ft < 1 || fs < 1)
        return ghc_error_set(c.core, GHC_EINVAL, "avg_down3d: factors %d, %d must be >= 1", ft, fs);
    const int64_t Ci = ghc_tensor_dim(x, 1), Co = ghc_tensor_dim(y, 1), phi = (int64_t)ft * fs * fs;
    if (ghc_tensor_dim(x, 3) % fs || ghc_tensor_dim(x, 4) % fs)
        return bad(&c, "x", x, "a height and width that are multiples of %d", fs);
    if (Co < 1 || (Ci * phi) % Co)
        return bad(&c, "y", y, "a channel count dividing %lld (x's channels times %lld)", (long long)(Ci * phi),
                   (long long)phi);
    SHAPE(&c, "y", y, ghc_tensor_dim(x, 0), Co, (ghc_tensor_dim(x, 2) + ft - 1) / ft, ghc_tensor_dim(x, 3) / fs,
          ghc_tensor_dim(x, 4) / fs);
    if (ghc_tensor_numel(y) == 0)
        return 0;
    return DISPATCH(&c, ghc_cpu_avg_down3d(y, x, ft, fs), ghc_k_avg_down3d(y, x, ft, fs, stream));
}

int ghc_op_dup_up3d(ghc_tensor_t *y, const ghc_tensor_t *x, int32_t ft, int32_t fs, int32_t drop, void *stream)
{
    struct op_ctx c = OP_CTX("dup_up3d", y, x);
    NEED(&c, "y", y, DT_F32_BF16);
    NEED(&c, "x", x, DT_F32_BF16);
    CHECK(check_video(&c, "x", x));
    CHECK(check_video(&c, "y", y));
    if (ft < 1 || fs < 1 || drop < 0 || drop >= ft)
        return ghc_error_set(c.core, GHC_EINVAL, "dup_up3d: factors %d, %d must be >= 1 and drop %d in [0, %d)", ft,
                             fs, drop, ft);
    const int64_t Ci = ghc_tensor_dim(x, 1), Co = ghc_tensor_dim(y, 1), phi = (int64_t)ft * fs * fs;
    if (Co < 1 || (Co * phi) % Ci)
        return bad(&c, "y", y, "a channel count whose %lld-fold is a multiple of x's %lld channels", (long long)phi,
                   (long long)Ci);
    SHAPE(&c, "y", y, ghc_tensor_dim(x, 0), Co, ghc_tensor_dim(x, 2) * ft - drop, ghc_tensor_dim(x, 3) * fs,
          ghc_tensor_dim(x, 4) * fs);
    if (ghc_tensor_numel(y) == 0)
        return 0;
    return DISPATCH(&c, ghc_cpu_dup_up3d(y, x, ft, fs, drop), ghc_k_dup_up3d(y, x, ft, fs, drop, stream));
}

/* patchify (un = false) or unpatchify: y's shape from x's. */
static int vae_patch(const char *op, ghc_tensor_t *y, const ghc_tensor_t *x, int32_t p, bool un, void *stream)
{
    struct op_ctx c = OP_CTX(op, y, x);
    NEED(&c, "y", y, DT_F32_BF16);
    NEED(&c, "x", x, DT_F32_BF16);
    CHECK(check_video(&c, "x", x));
    if (p < 1)
        return ghc_error_set(c.core, GHC_EINVAL, "%s: patch size %d must be >= 1", op, p);
    const int64_t B = ghc_tensor_dim(x, 0), C = ghc_tensor_dim(x, 1), F = ghc_tensor_dim(x, 2);
    const int64_t H = ghc_tensor_dim(x, 3), W = ghc_tensor_dim(x, 4), pp = (int64_t)p * p;
    if (un) {
        if (C % pp)
            return bad(&c, "x", x, "a channel count that is a multiple of %lld", (long long)pp);
        SHAPE(&c, "y", y, B, C / pp, F, H * p, W * p);
    } else {
        if (H % p || W % p)
            return bad(&c, "x", x, "a height and width that are multiples of %d", p);
        SHAPE(&c, "y", y, B, C * pp, F, H / p, W / p);
    }
    if (ghc_tensor_numel(y) == 0)
        return 0;
    return DISPATCH(&c, ghc_cpu_vae_patch(y, x, p, un), ghc_k_vae_patch(y, x, p, un, stream));
}

int ghc_op_vae_patchify(ghc_tensor_t *y, const ghc_tensor_t *x, int32_t p, void *stream)
{
    return vae_patch("vae_patchify", y, x, p, false, stream);
}

int ghc_op_vae_unpatchify(ghc_tensor_t *y, const ghc_tensor_t *x, int32_t p, void *stream)
{
    return vae_patch("vae_unpatchify", y, x, p, true, stream);
}
/* ==== end convolution / VAE ==================================================================== */

/* ==== optimizer updates (the adamw and automagic plugins) ===================================== */

/* The shape a state tensor must have; numel only when ndim < 0. */
static int check_state(const struct op_ctx *c, const char *name, const ghc_tensor_t *t, unsigned mask,
                       int ndim, const int64_t *shape, int64_t numel)
{
    NEED(c, name, t, mask);
    if (ndim >= 0)
        return check_shape(c, name, t, ndim, shape);
    if (ghc_tensor_numel(t) != numel)
        return bad(c, name, t, "%lld elements", (long long)numel);
    return 0;
}

/* Param, grad and rng of tensor i; the context is tensor 0's. */
static int check_optim_tensor(const struct op_ctx *c, const struct ghc_optim_tensor *t)
{
    NEED(c, "param", t->param, DT_F32_BF16);
    NEED(c, "grad", t->grad, DT_F32_BF16);
    if (ghc_tensor_numel(t->grad) != ghc_tensor_numel(t->param))
        return bad(c, "grad", t->grad, "%lld elements like param", (long long)ghc_tensor_numel(t->param));
    return 0;
}

int ghc_op_adamw(struct ghc_optim_tensor *ts, int32_t n, const struct ghc_adamw_args *args, void *stream)
{
    if (n <= 0)
        return 0;
    struct op_ctx c = OP_CTX("adamw", ts[0].param);
    if (!args)
        return ghc_error_set(c.core, GHC_EINVAL, "adamw: args is NULL");
    for (int32_t i = 0; i < n; i++) {
        const ghc_tensor_t *p = ts[i].param;
        CHECK(check_optim_tensor(&c, &ts[i]));
        CHECK(check_state(&c, "exp_avg", ts[i].state[0], DT_F32, ghc_tensor_ndim(p), ghc_tensor_shape(p), 0));
        CHECK(check_state(&c, "exp_avg_sq", ts[i].state[1], DT_F32, ghc_tensor_ndim(p), ghc_tensor_shape(p), 0));
    }
    return DISPATCH(&c, ghc_cpu_adamw(ts, n, args), ghc_k_adamw(ts, n, args, stream));
}

int ghc_op_automagic(struct ghc_optim_tensor *ts, int32_t n, const struct ghc_automagic_args *args, void *stream)
{
    if (n <= 0)
        return 0;
    struct op_ctx c = OP_CTX("automagic", ts[0].param);
    if (!args)
        return ghc_error_set(c.core, GHC_EINVAL, "automagic: args is NULL");
    if (!(args->min_lr >= 0.0f) || !(args->max_lr >= args->min_lr))
        return ghc_error_set(c.core, GHC_EINVAL, "automagic: need 0 <= min_lr <= max_lr, got %g, %g",
                             (double)args->min_lr, (double)args->max_lr);
    for (int32_t i = 0; i < n; i++) {
        const ghc_tensor_t *p = ts[i].param;
        int nd = ghc_tensor_ndim(p);
        const int64_t *sh = ghc_tensor_shape(p);
        int64_t numel = ghc_tensor_numel(p), words = (numel + 31) / 32;
        CHECK(check_optim_tensor(&c, &ts[i]));
        if (nd >= 2) {
            int64_t col[GHC_TENSOR_MAX_DIMS];
            memcpy(col, sh, sizeof(int64_t) * (size_t)(nd - 2));
            col[nd - 2] = sh[nd - 1];
            CHECK(check_state(&c, "exp_avg_sq_row", ts[i].state[0], DT_F32, nd - 1, sh, 0));
            CHECK(check_state(&c, "exp_avg_sq_col", ts[i].state[1], DT_F32, nd - 1, col, 0));
        } else {
            CHECK(check_state(&c, "exp_avg_sq", ts[i].state[0], DT_F32, -1, NULL, numel));
        }
        CHECK(check_state(&c, "lr_mask", ts[i].state[2], DT(GHC_DTYPE_U8) | DT_F32, -1, NULL, numel));
        CHECK(check_state(&c, "lr_scale", ts[i].state[3], DT_F32, -1, NULL, 2));
        CHECK(check_state(&c, "last_polarity", ts[i].state[4], DT(GHC_DTYPE_I32), -1, NULL, words));
        CHECK(check_state(&c, "scratch", ts[i].state[5], DT(GHC_DTYPE_I32), -1, NULL, words));
    }
    return DISPATCH(&c, ghc_cpu_automagic(ts, n, args), ghc_k_automagic(ts, n, args, stream));
}
/* ==== end optimizer updates ==================================================================== */
