/* gemm.cu: ghc_k_gemm through cuBLASLt (see ops.h for the contract).
 *
 * ops.h is row-major: C[M, N] = op(A)[M, K] op(B)[K, N]. cuBLASLt is column-major, and a
 * row-major matrix is the column-major view of its transpose, so we ask cuBLASLt for
 * C^T[N, M] = op(B)^T op(A)^T: its "A" is our B and its "B" is our A, with the transposes
 * carried over. The bias [N] is then a column vector of C^T, which is exactly what
 * CUBLASLT_EPILOGUE_BIAS broadcasts.
 *
 * Batches: a 3-D operand steps by its matrix size, a 2-D one is shared (stride 0). The common
 * case of a shared weight B with a batched, untransposed A folds into one GEMM of batch*M
 * rows.
 *
 * fp8 (e4m3): Hopper's fp8 kernels need the "TN" layout (cuBLASLt's A transposed, B not),
 * i.e. our trans_b = true, trans_a = false: the nn.Linear layout y = x W^T. Other layouts
 * are refused with a message. The scales are host floats in struct ghc_gemm; they are folded
 * into alpha (alpha scale_a scale_b op(A) op(B) is the same product in fp32), so no device
 * scalar has to be written per call and no call races another on a shared scalar.
 *
 * Epilogues run fused in cuBLASLt (BIAS, GELU_BIAS, GELU_AUX_BIAS for pre_gelu) when the
 * bias dtype matches what cuBLASLt takes and the pre_gelu leading dimension is a multiple
 * of 8; otherwise the product runs plain and a small kernel adds the bias and applies GELU.
 *
 * State: one cuBLASLt handle per device and one 32 MiB workspace per (device, stream),
 * created at first use under a lock; heuristic results are cached by shape, dtypes, flags
 * and alignment. Nothing here synchronises with the host after the first call of a shape. */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <mutex>
#include <stdint.h>
#include <string.h>

#include "common.cuh"   /* defines: ghc_k_device_guard; includes kernels.h */

namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;
constexpr int kMaxDevices = 64;
constexpr int kMaxWorkspaces = 32;
constexpr int kAlgoCacheSize = 256;

std::mutex g_lock;
cublasLtHandle_t g_handle[kMaxDevices];

struct workspace {
    int device;
    cudaStream_t stream;
    void *ptr;
};
workspace g_ws[kMaxWorkspaces];
int g_nws;

struct algo_key {
    int device;
    int64_t m, n, k, batch;      /* cuBLASLt's view (m = our N, n = our M) */
    int64_t stride_a, stride_b;  /* 0 = shared */
    int64_t lda, ldb, ldc;       /* leading dimensions (column views: their row strides) */
    int ta, tb;                  /* cuBLASLt's transposes */
    int dt_ab, dt_c;             /* cudaDataType */
    int epilogue;                /* cublasLtEpilogue_t */
    int beta_nz;
    int align_a, align_b, align_c, align_bias, align_aux;
};

struct algo_entry {
    algo_key key;
    cublasLtMatmulAlgo_t algo;
    bool used;
};
algo_entry g_algo[kAlgoCacheSize];
unsigned g_algo_next;


int cuda_of_cublas(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return cudaSuccess;
    case CUBLAS_STATUS_NOT_SUPPORTED: return cudaErrorNotSupported;
    case CUBLAS_STATUS_ALLOC_FAILED: return cudaErrorMemoryAllocation;
    case CUBLAS_STATUS_INVALID_VALUE: return cudaErrorInvalidValue;
    case CUBLAS_STATUS_ARCH_MISMATCH: return cudaErrorNoKernelImageForDevice;
    default: return cudaErrorUnknown;
    }
}

/* The handle of `dev` and the workspace of (dev, stream), made on first use. */
int get_state(int dev, cudaStream_t stream, cublasLtHandle_t *handle, void **ws)
{
    std::lock_guard<std::mutex> lk(g_lock);
    if (dev < 0 || dev >= kMaxDevices)
        return cudaErrorInvalidDevice;
    if (!g_handle[dev]) {
        cublasStatus_t s = cublasLtCreate(&g_handle[dev]);
        if (s != CUBLAS_STATUS_SUCCESS) {
            g_handle[dev] = NULL;
            return cuda_of_cublas(s);
        }
    }
    *handle = g_handle[dev];
    for (int i = 0; i < g_nws; i++)
        if (g_ws[i].device == dev && g_ws[i].stream == stream) {
            *ws = g_ws[i].ptr;
            return 0;
        }
    if (g_nws == kMaxWorkspaces) {     /* many streams: run those beyond without workspace */
        *ws = NULL;
        return 0;
    }
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, kWorkspaceBytes);
    if (e != cudaSuccess)
        return e;
    g_ws[g_nws++] = workspace{ dev, stream, p };
    *ws = p;
    return 0;
}

bool find_algo(const algo_key &k, cublasLtMatmulAlgo_t *out)
{
    std::lock_guard<std::mutex> lk(g_lock);
    for (int i = 0; i < kAlgoCacheSize; i++)
        if (g_algo[i].used && memcmp(&g_algo[i].key, &k, sizeof(k)) == 0) {
            *out = g_algo[i].algo;
            return true;
        }
    return false;
}

void put_algo(const algo_key &k, const cublasLtMatmulAlgo_t &a)
{
    std::lock_guard<std::mutex> lk(g_lock);
    algo_entry &e = g_algo[g_algo_next++ % kAlgoCacheSize];
    e.key = k;
    e.algo = a;
    e.used = true;
}

/* Largest power of two (<= 256) dividing the address and the batch stride in bytes. */
int alignment(const void *p, int64_t stride_bytes)
{
    uint64_t v = (uint64_t)(uintptr_t)p | (uint64_t)stride_bytes | 256u;
    return (int)(v & (~v + 1));
}

cudaDataType cuda_type(enum ghc_dtype dt)
{
    switch (dt) {
    case GHC_DTYPE_F32: return CUDA_R_32F;
    case GHC_DTYPE_BF16: return CUDA_R_16BF;
    case GHC_DTYPE_F16: return CUDA_R_16F;
    case GHC_DTYPE_F8_E4M3: return CUDA_R_8F_E4M3;
    case GHC_DTYPE_F8_E5M2: return CUDA_R_8F_E5M2;
    default: return (cudaDataType)-1;
    }
}

__device__ __forceinline__ float load_f(const float *p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load_f(const __nv_bfloat16 *p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void store_f(float *p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store_f(__nv_bfloat16 *p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }

__device__ __forceinline__ float gelu_tanh(float z)
{
    const float k = 0.7978845608028654f;   /* sqrt(2/pi) */
    return 0.5f * z * (1.0f + tanhf(k * (z + 0.044715f * z * z * z)));
}

/* The unfused epilogue: c[r, j] (+ bias[j]) -> pre_gelu, then gelu. rows x n elements; c's rows
 * ldc apart (a column view), pre's n. */
template <typename TC, typename TB>
__global__ void epilogue_kernel(TC *c, const TB *bias, TC *pre, int64_t total, int64_t n, int64_t ldc, bool gelu)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t ic = ldc == n ? i : i / n * ldc + i % n;
        float v = load_f(c, ic);
        if (bias)
            v += load_f(bias, i % n);
        if (pre)
            store_f(pre, i, v);
        store_f(c, ic, gelu ? gelu_tanh(v) : v);
    }
}

template <typename TC>
int launch_epilogue_tc(TC *c, const void *bias, enum ghc_dtype bias_dt, TC *pre, int64_t total, int64_t n,
                       int64_t ldc, bool gelu, cudaStream_t st)
{
    int64_t blocks = (total + 255) / 256;
    if (blocks > 65536)
        blocks = 65536;
    if (blocks < 1)
        return 0;
    if (!bias || bias_dt == GHC_DTYPE_F32)
        epilogue_kernel<TC, float><<<(unsigned)blocks, 256, 0, st>>>(c, (const float *)bias, pre, total, n, ldc, gelu);
    else
        epilogue_kernel<TC, __nv_bfloat16><<<(unsigned)blocks, 256, 0, st>>>(c, (const __nv_bfloat16 *)bias, pre,
                                                                             total, n, ldc, gelu);
    return (int)cudaGetLastError();
}

struct lt_objects {
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    ~lt_objects()
    {
        if (pref) cublasLtMatmulPreferenceDestroy(pref);
        if (lc) cublasLtMatrixLayoutDestroy(lc);
        if (lb) cublasLtMatrixLayoutDestroy(lb);
        if (la) cublasLtMatrixLayoutDestroy(la);
        if (op) cublasLtMatmulDescDestroy(op);
    }
};

#define LT(expr)                                                                                    \
    do {                                                                                            \
        cublasStatus_t s_ = (expr);                                                                 \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                          \
            ghc_log(core, GHC_LOG_ERROR, "gemm: %s failed: %s (%s:%d)", #expr,                      \
                    cublasLtGetStatusString(s_), __FILE__, __LINE__);                               \
            return cuda_of_cublas(s_);                                                              \
        }                                                                                           \
    } while (0)

int layout(ghc_core_t *core, cublasLtMatrixLayout_t *l, cudaDataType t, int64_t rows, int64_t cols, int64_t ld,
           int64_t batch, int64_t stride)
{
    LT(cublasLtMatrixLayoutCreate(l, t, (uint64_t)rows, (uint64_t)cols, ld));
    if (batch > 1) {
        int32_t bc = (int32_t)batch;
        LT(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof(bc)));
        LT(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
    }
    return 0;
}

/* One cublasLtMatmul. epi is CUBLASLT_EPILOGUE_DEFAULT, _BIAS, _GELU_BIAS or _GELU_AUX_BIAS.
 * Returns 0, a cudaError_t, or -1 when cuBLASLt has no algorithm for it (the caller may
 * then fall back to the unfused epilogue). */
int lt_matmul(ghc_core_t *core, int dev, cudaStream_t st, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
              int64_t batch, cudaDataType t_ab, cudaDataType t_c, const void *pa, int64_t lda, int64_t stride_a,
              const void *pb, int64_t ldb, int64_t stride_b, void *pc, int64_t ldc, int64_t stride_c, float alpha,
              float beta, cublasLtEpilogue_t epi, const void *bias, void *aux, int64_t aux_ld)
{
    cublasLtHandle_t handle;
    void *ws;
    int rc = get_state(dev, st, &handle, &ws);
    if (rc)
        return rc;
    lt_objects o;
    LT(cublasLtMatmulDescCreate(&o.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT(cublasLtMatmulDescSetAttribute(o.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
    LT(cublasLtMatmulDescSetAttribute(o.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
    LT(cublasLtMatmulDescSetAttribute(o.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    if (epi != CUBLASLT_EPILOGUE_DEFAULT) {
        LT(cublasLtMatmulDescSetAttribute(o.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
        if (t_ab == CUDA_R_8F_E4M3 || t_ab == CUDA_R_8F_E5M2) {
            cudaDataType bt = CUDA_R_16BF;
            LT(cublasLtMatmulDescSetAttribute(o.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
        }
    }
    if (epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
        LT(cublasLtMatmulDescSetAttribute(o.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
        LT(cublasLtMatmulDescSetAttribute(o.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
        const int64_t stride_aux = n * aux_ld;   /* dense, C a column view or not */
        if (batch > 1)
            LT(cublasLtMatmulDescSetAttribute(o.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, &stride_aux,
                                              sizeof(stride_aux)));
    }
    /* op(A) is m x k, op(B) is k x n, C is m x n (column-major). */
    if ((rc = layout(core, &o.la, t_ab, ta ? k : m, ta ? m : k, lda, batch, stride_a)))
        return rc;
    if ((rc = layout(core, &o.lb, t_ab, tb ? n : k, tb ? k : n, ldb, batch, stride_b)))
        return rc;
    if ((rc = layout(core, &o.lc, t_c, m, n, ldc, batch, stride_c)))
        return rc;

    size_t es_ab = t_ab == CUDA_R_32F ? 4 : (t_ab == CUDA_R_16BF || t_ab == CUDA_R_16F) ? 2 : 1;
    size_t es_c = t_c == CUDA_R_32F ? 4 : 2;
    algo_key key;
    memset(&key, 0, sizeof(key));   /* padding too: the key is compared with memcmp */
    key.device = dev;
    key.m = m;
    key.n = n;
    key.k = k;
    key.batch = batch;
    key.stride_a = stride_a;
    key.stride_b = stride_b;
    key.lda = lda;
    key.ldb = ldb;
    key.ldc = ldc;
    key.ta = ta;
    key.tb = tb;
    key.dt_ab = t_ab;
    key.dt_c = t_c;
    key.epilogue = epi;
    key.beta_nz = beta != 0.0f;
    key.align_a = alignment(pa, (stride_a * (int64_t)es_ab) | (lda * (int64_t)es_ab));   /* rows too */
    key.align_b = alignment(pb, (stride_b * (int64_t)es_ab) | (ldb * (int64_t)es_ab));
    key.align_c = alignment(pc, (stride_c * (int64_t)es_c) | (ldc * (int64_t)es_c));
    key.align_bias = bias ? alignment(bias, 0) : 0;
    key.align_aux = aux ? alignment(aux, stride_c * (int64_t)es_c) : 0;

    cublasLtMatmulAlgo_t algo;
    if (!find_algo(key, &algo)) {
        LT(cublasLtMatmulPreferenceCreate(&o.pref));
        uint64_t wsb = ws ? kWorkspaceBytes : 0;
        LT(cublasLtMatmulPreferenceSetAttribute(o.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb)));
        uint32_t al_a = (uint32_t)key.align_a, al_b = (uint32_t)key.align_b, al_c = (uint32_t)key.align_c;
        LT(cublasLtMatmulPreferenceSetAttribute(o.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)));
        LT(cublasLtMatmulPreferenceSetAttribute(o.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)));
        LT(cublasLtMatmulPreferenceSetAttribute(o.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c)));
        LT(cublasLtMatmulPreferenceSetAttribute(o.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof(al_c)));
        cublasLtMatmulHeuristicResult_t res;
        int found = 0;
        cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(handle, o.op, o.la, o.lb, o.lc, o.lc, o.pref, 1, &res, &found);
        if (s == CUBLAS_STATUS_NOT_SUPPORTED || (s == CUBLAS_STATUS_SUCCESS && found == 0))
            return -1;
        LT(s);
        algo = res.algo;
        put_algo(key, algo);
    }
    /* beta = 0: cuBLASLt does not read C, so C may hold anything (NaN included). */
    LT(cublasLtMatmul(handle, o.op, &alpha, pa, o.la, pb, o.lb, &beta, pc, o.lc, pc, o.lc, &algo, ws,
                      ws ? kWorkspaceBytes : 0, st));
    return 0;
}

}   /* namespace */

extern "C" int ghc_k_gemm(ghc_tensor_t *c, const ghc_tensor_t *a, const ghc_tensor_t *b, const struct ghc_gemm *args,
                          void *stream)
{
    ghc_core_t *core = ghc_tensor_core(c);
    cudaStream_t st = (cudaStream_t)stream;
    struct ghc_gemm g;
    if (args)
        g = *args;
    else
        memset(&g, 0, sizeof(g));
    float alpha = g.alpha == 0.0f ? 1.0f : g.alpha;
    float beta = g.beta;

    int nda = ghc_tensor_ndim(a), ndb = ghc_tensor_ndim(b), ndc = ghc_tensor_ndim(c);
    int64_t batch = ndc == 3 ? ghc_tensor_dim(c, 0) : 1;
    int64_t M = ghc_tensor_dim(c, -2), N = ghc_tensor_dim(c, -1);
    int64_t K = g.trans_a ? ghc_tensor_dim(a, -2) : ghc_tensor_dim(a, -1);
    bool a_batched = nda == 3, b_batched = ndb == 3;
    enum ghc_dtype dt_ab = ghc_tensor_dtype(a), dt_c = ghc_tensor_dtype(c);
    bool fp8 = dt_ab == GHC_DTYPE_F8_E4M3 || dt_ab == GHC_DTYPE_F8_E5M2;

    if (M == 0 || N == 0)
        return 0;
    if (fp8) {
        if (g.trans_a || !g.trans_b) {
            ghc_log(core, GHC_LOG_ERROR,
                    "gemm: fp8 operands need trans_a = false and trans_b = true on this GPU (the x W^T layout); "
                    "got trans_a = %d, trans_b = %d", (int)g.trans_a, (int)g.trans_b);
            return cudaErrorNotSupported;
        }
        alpha *= (g.scale_a == 0.0f ? 1.0f : g.scale_a) * (g.scale_b == 0.0f ? 1.0f : g.scale_b);
    }
    if (K == 0) {   /* an empty sum: C = beta C (+ bias, gelu): run the epilogue kernel alone */
        ghc_log(core, GHC_LOG_ERROR, "gemm: K = 0 is not supported on CUDA");
        return cudaErrorNotSupported;
    }

    /* Row strides (a column view's rows are its parent's apart; a matrix of a batch starts rows
     * x stride after the previous one). */
    const int64_t rs_a = ghc_tensor_row_stride(a), rs_b = ghc_tensor_row_stride(b), rs_c = ghc_tensor_row_stride(c);
    /* A shared weight with a batched, untransposed A: one GEMM of batch*M rows. */
    int64_t Mg = M, bg = batch;
    if (batch > 1 && a_batched && !b_batched && !g.trans_a) {
        Mg = M * batch;
        bg = 1;
        a_batched = false;
    }
    /* cuBLASLt view: C^T (N x Mg) = op(B)^T (N x K) * op(A)^T (K x Mg). */
    bool lt_ta = g.trans_b;                      /* B stored [N, K]: its column-major view is K x N */
    int64_t lda = rs_b;
    bool lt_tb = g.trans_a;                      /* A stored [K, M]: column-major view M x K */
    int64_t ldb = rs_a;
    int64_t stride_lt_a = b_batched ? ghc_tensor_dim(b, -2) * rs_b : 0;
    int64_t stride_lt_b = a_batched ? ghc_tensor_dim(a, -2) * rs_a : 0;
    int64_t stride_c = M * rs_c;

    const void *bias = NULL;
    enum ghc_dtype bias_dt = GHC_DTYPE_F32;
    if (g.epilogue != GHC_EPI_NONE && g.bias) {
        bias = ghc_tensor_cdata(g.bias);
        bias_dt = ghc_tensor_dtype(g.bias);
    }
    void *pre = g.epilogue == GHC_EPI_BIAS_GELU && g.pre_gelu ? ghc_tensor_data(g.pre_gelu) : NULL;
    bool gelu = g.epilogue == GHC_EPI_BIAS_GELU;
    if (pre && ghc_tensor_dtype(g.pre_gelu) != dt_c) {
        ghc_log(core, GHC_LOG_ERROR, "gemm: pre_gelu must have C's dtype on CUDA");
        return cudaErrorNotSupported;
    }

    ghc_k_device_guard dg(c);
    if (dg.err != cudaSuccess)
        return dg.err;

    cudaDataType t_ab = cuda_type(dt_ab), t_c = cuda_type(dt_c);
    enum ghc_dtype native_bias = fp8 ? GHC_DTYPE_BF16 : dt_c;
    bool fuse = g.epilogue == GHC_EPI_NONE ||
                ((!bias || bias_dt == native_bias) &&
                 (!pre || (ghc_tensor_dtype(g.pre_gelu) == dt_c && N % 8 == 0)));
    int rc = -1;
    if (fuse && bias) {
        cublasLtEpilogue_t epi = !gelu ? CUBLASLT_EPILOGUE_BIAS : pre ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                                                      : CUBLASLT_EPILOGUE_GELU_BIAS;
        rc = lt_matmul(core, ghc_tensor_device(c), st, lt_ta, lt_tb, N, Mg, K, bg, t_ab, t_c, ghc_tensor_cdata(b), lda,
                       stride_lt_a, ghc_tensor_cdata(a), ldb, stride_lt_b, ghc_tensor_data(c), rs_c, stride_c, alpha,
                       gelu ? 0.0f : beta, epi, bias, pre, N);
        if (rc >= 0)
            return rc;
    }
    if (fuse && g.epilogue == GHC_EPI_BIAS_GELU && !bias && !pre) {
        rc = lt_matmul(core, ghc_tensor_device(c), st, lt_ta, lt_tb, N, Mg, K, bg, t_ab, t_c, ghc_tensor_cdata(b), lda,
                       stride_lt_a, ghc_tensor_cdata(a), ldb, stride_lt_b, ghc_tensor_data(c), rs_c, stride_c, alpha, 0.0f,
                       CUBLASLT_EPILOGUE_GELU, NULL, NULL, 0);
        if (rc >= 0)
            return rc;
    }
    /* The plain product, then (when needed) the unfused epilogue. */
    rc = lt_matmul(core, ghc_tensor_device(c), st, lt_ta, lt_tb, N, Mg, K, bg, t_ab, t_c, ghc_tensor_cdata(b), lda,
                   stride_lt_a, ghc_tensor_cdata(a), ldb, stride_lt_b, ghc_tensor_data(c), rs_c, stride_c, alpha,
                   gelu ? 0.0f : beta, CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, 0);
    if (rc < 0) {
        ghc_log(core, GHC_LOG_ERROR, "gemm: cuBLASLt has no algorithm for M=%lld N=%lld K=%lld batch=%lld %s x %s -> %s "
                "(trans_a=%d trans_b=%d)", (long long)M, (long long)N, (long long)K, (long long)batch,
                ghc_dtype_name(dt_ab), ghc_dtype_name(dt_ab), ghc_dtype_name(dt_c), (int)g.trans_a, (int)g.trans_b);
        return cudaErrorNotSupported;
    }
    if (rc || g.epilogue == GHC_EPI_NONE || (!bias && !gelu))
        return rc;
    int64_t total = batch * M * N;
    if (dt_c == GHC_DTYPE_F32)
        return launch_epilogue_tc((float *)ghc_tensor_data(c), bias, bias_dt, (float *)pre, total, N, rs_c, gelu, st);
    return launch_epilogue_tc((__nv_bfloat16 *)ghc_tensor_data(c), bias, bias_dt, (__nv_bfloat16 *)pre, total, N, rs_c,
                              gelu, st);
}
