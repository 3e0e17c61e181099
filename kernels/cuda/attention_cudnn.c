/* attention_cudnn.c: cuDNN's fused flash attention as a second path behind ghc_op_attention_fwd
 * and ghc_op_attention_bwd (the contract in ops.h; attention.cu chooses).
 *
 * cuDNN is loaded at run time (cudnn_graph.c: dlopen of libcudnn.so.9), so a build with cuDNN's
 * headers runs where the library is absent: our own kernels then run. The graphs are the ones cuDNN's
 * frontend builds for its SDPA node, written against the backend API in C (cuDNN fuses the
 * pattern into one flash-attention kernel each way):
 *   forward:  S = Q K^T; S *= scale; M = rowmax S; E = exp(S - M); Z = rowsum E;
 *             lse = M + log Z; P = E / Z (bf16); O = P V
 *   backward: Dsum = rowsum(dO * O); S = scale Q K^T; P = exp(S - lse); dV = P^T dO;
 *             dS = scale P (dO V^T - Dsum); dK = dS^T Q; dQ = dS K (accumulated in fp32 in a
 *             buffer we give, then cast)
 * Tensors keep our layout through strides: q, k, v, dq, dk, dv [B, L, H, Dh] seen as
 * [B, H, L, Dh]; o with its token stride ldo (dO like q); lse [B, H, Lq] f32.
 *
 * Plans are built once per problem (shape, o's token stride, device) and cached; a problem
 * cuDNN declines is remembered too, and runs on our kernels. The fp32 dQ accumulator, the row
 * sums and cuDNN's own workspace come from the stream's scratch (ghc_k_scratch), as for our
 * kernels: the same footprint. */
#include <config.h>

#include "kernels.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef GHC_HAVE_CUDNN
#include "cudnn_impl.h"   /* the library, handles and graph helpers (cudnn_graph.c) */
#endif

static int g_impl = GHC_K_ATTN_AUTO;
static const char *g_last = "none";

int ghc_k_attention_impl(int impl)
{
    const int prev = g_impl;
    if (impl >= GHC_K_ATTN_AUTO && impl <= GHC_K_ATTN_CUDNN)
        g_impl = impl;
    return prev;
}

const char *ghc_k_attention_last(void) { return g_last; }

void ghc_k_attention_note(const char *path) { g_last = path; }

#ifndef GHC_HAVE_CUDNN

const char *ghc_k_cudnn_why(void) { return "built without cuDNN's headers"; }

int ghc_k_cudnn_attention_fwd(ghc_tensor_t *o, ghc_tensor_t *lse, const ghc_tensor_t *q, const ghc_tensor_t *k,
                              const ghc_tensor_t *v, int64_t ldo, float scale, void *stream)
{
    (void)o, (void)lse, (void)q, (void)k, (void)v, (void)ldo, (void)scale, (void)stream;
    return -1;
}

int ghc_k_cudnn_attention_bwd(ghc_tensor_t *dq, ghc_tensor_t *dk, ghc_tensor_t *dv, const ghc_tensor_t *dout,
                              const ghc_tensor_t *q, const ghc_tensor_t *k, const ghc_tensor_t *v,
                              const ghc_tensor_t *o, int64_t ldo, const ghc_tensor_t *lse, float scale,
                              void *stream)
{
    (void)dq, (void)dk, (void)dv, (void)dout, (void)q, (void)k, (void)v, (void)o, (void)ldo, (void)lse;
    (void)scale, (void)stream;
    return -1;
}

#else /* GHC_HAVE_CUDNN */

/* ---- graph pieces -------------------------------------------------------------------------- */

static char g_why[512] = ""; /* why cuDNN declined the last problem it declined */

/* A 4-D tensor (see ghc_dnn_tensor). */
static cudnnBackendDescriptor_t tensor(struct ghc_dnn_build *b, int64_t uid, cudnnDataType_t dt, const int64_t dim[4],
                                       const int64_t str[4])
{
    return ghc_dnn_tensor(b, uid, dt, 4, dim, str);
}

/* y = x (mode) [x2], in fp32. */
static void pointwise(struct ghc_dnn_build *b, cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x,
                      cudnnBackendDescriptor_t x2, cudnnBackendDescriptor_t y)
{
    const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    const float alpha = 1.0f;
    cudnnBackendDescriptor_t pw = ghc_dnn_mk(b, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    set(b, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    set(b, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    fin(b, pw);
    cudnnBackendDescriptor_t op = ghc_dnn_mk(b, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw);
    set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    if (x2)
        set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x2);
    set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &alpha);
    set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &alpha);
    ghc_dnn_add_op(b, op);
}

/* y = reduce(x) over the dims where y is 1, in fp32. */
static void reduction(struct ghc_dnn_build *b, cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x,
                      cudnnBackendDescriptor_t y)
{
    const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t r = ghc_dnn_mk(b, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    set(b, r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    set(b, r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
    fin(b, r);
    cudnnBackendDescriptor_t op = ghc_dnn_mk(b, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    set(b, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &r);
    set(b, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    set(b, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    ghc_dnn_add_op(b, op);
}

/* c = a b (batched over the first two dims), fp32 accumulation. */
static void matmul(struct ghc_dnn_build *b, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t bm,
                   cudnnBackendDescriptor_t c)
{
    const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t m = ghc_dnn_mk(b, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    set(b, m, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    fin(b, m);
    cudnnBackendDescriptor_t op = ghc_dnn_mk(b, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    set(b, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a);
    set(b, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &bm);
    set(b, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c);
    set(b, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &m);
    ghc_dnn_add_op(b, op);
}

/* y = x seen with other dims and strides (a transposition, for the graph). */
static void reshape(struct ghc_dnn_build *b, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y)
{
    cudnnBackendDescriptor_t op = ghc_dnn_mk(b, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    set(b, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    set(b, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    ghc_dnn_add_op(b, op);
}

/* ---- the plans ----------------------------------------------------------------------------- */

enum { U_Q = 1, U_K, U_V, U_O, U_LSE, U_DO, U_DQ, U_DK, U_DV, U_DSUM, U_DQACC, U_SCALE = 20, U_ONE };

struct plan_key {
    int dev, bwd, B, H, Lq, Lk, D;
    int64_t ldo;
};

static void note_why(const struct ghc_dnn_build *b, const struct plan_key *key)
{
    char why[400];
    ghc_dnn_why(why, sizeof why, b, "attention_cudnn.c");
    snprintf(g_why, sizeof g_why, "%s B%d H%d Lq%d Lk%d Dh%d: %s", key->bwd ? "backward" : "forward", key->B,
             key->H, key->Lq, key->Lk, key->D, why);
}

const char *ghc_k_cudnn_why(void) { return g_why; }

struct plan {
    struct plan_key key;
    struct ghc_dnn_build b; /* owns every descriptor; NULL plan: cuDNN declined this problem */
    cudnnBackendDescriptor_t plan;
    int64_t workspace;
};

#define MAX_PLANS 16
static struct plan *g_plans[MAX_PLANS];
static int g_next;

/* [B, L, H, Dh] seen as [B, H, L, Dh], its tokens ld elements apart; t: the last two swapped. */
static void bhld(int64_t dim[4], int64_t str[4], int B, int H, int L, int D, int64_t ld, bool t)
{
    dim[0] = B, dim[1] = H, dim[2] = t ? D : L, dim[3] = t ? L : D;
    str[0] = (int64_t)L * ld, str[1] = D, str[2] = t ? 1 : ld, str[3] = t ? ld : 1;
}

static void dense(int64_t dim[4], int64_t str[4], int64_t a, int64_t b, int64_t c, int64_t d)
{
    dim[0] = a, dim[1] = b, dim[2] = c, dim[3] = d;
    str[0] = b * c * d, str[1] = c * d, str[2] = d, str[3] = 1;
}

static void build_fwd(struct ghc_dnn_build *b, const struct plan_key *k)
{
    const int B = k->B, H = k->H, Lq = k->Lq, Lk = k->Lk, D = k->D;
    const int64_t ld = (int64_t)H * D;
    const cudnnDataType_t bf = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;
    int64_t dim[4], str[4];
    bhld(dim, str, B, H, Lq, D, ld, false);
    cudnnBackendDescriptor_t q = tensor(b, U_Q, bf, dim, str);
    bhld(dim, str, B, H, Lk, D, ld, true);
    cudnnBackendDescriptor_t kt = tensor(b, U_K, bf, dim, str);
    bhld(dim, str, B, H, Lk, D, ld, false);
    cudnnBackendDescriptor_t v = tensor(b, U_V, bf, dim, str);
    bhld(dim, str, B, H, Lq, D, k->ldo, false);
    cudnnBackendDescriptor_t o = tensor(b, U_O, bf, dim, str);
    cudnnBackendDescriptor_t scale = tensor(b, -U_SCALE, f32, NULL, NULL);
    dense(dim, str, B, H, Lq, Lk);
    cudnnBackendDescriptor_t s = tensor(b, 0, f32, dim, str), ss = tensor(b, 0, f32, dim, str);
    cudnnBackendDescriptor_t sub = tensor(b, 0, f32, dim, str), e = tensor(b, 0, f32, dim, str);
    cudnnBackendDescriptor_t p = tensor(b, 0, bf, dim, str);
    dense(dim, str, B, H, Lq, 1);
    cudnnBackendDescriptor_t m = tensor(b, 0, f32, dim, str), z = tensor(b, 0, f32, dim, str);
    cudnnBackendDescriptor_t logz = tensor(b, 0, f32, dim, str), lse = tensor(b, U_LSE, f32, dim, str);
    matmul(b, q, kt, s);
    pointwise(b, CUDNN_POINTWISE_MUL, s, scale, ss);
    reduction(b, CUDNN_REDUCE_TENSOR_MAX, ss, m);
    pointwise(b, CUDNN_POINTWISE_SUB, ss, m, sub);
    pointwise(b, CUDNN_POINTWISE_EXP, sub, NULL, e);
    reduction(b, CUDNN_REDUCE_TENSOR_ADD, e, z);
    pointwise(b, CUDNN_POINTWISE_LOG, z, NULL, logz);
    pointwise(b, CUDNN_POINTWISE_ADD, m, logz, lse);
    pointwise(b, CUDNN_POINTWISE_DIV, e, z, p);
    matmul(b, p, v, o);
}

static void build_bwd(struct ghc_dnn_build *b, const struct plan_key *k)
{
    const int B = k->B, H = k->H, Lq = k->Lq, Lk = k->Lk, D = k->D;
    const int64_t ld = (int64_t)H * D;
    const cudnnDataType_t bf = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;
    int64_t dim[4], str[4];
    bhld(dim, str, B, H, Lq, D, ld, false);
    cudnnBackendDescriptor_t q = tensor(b, U_Q, bf, dim, str), dq = tensor(b, U_DQ, bf, dim, str);
    cudnnBackendDescriptor_t dout = tensor(b, U_DO, bf, dim, str), t_do_o = tensor(b, 0, f32, dim, str);
    bhld(dim, str, B, H, Lk, D, ld, true);
    cudnnBackendDescriptor_t kt = tensor(b, U_K, bf, dim, str), vt = tensor(b, U_V, bf, dim, str);
    bhld(dim, str, B, H, Lk, D, ld, false);
    cudnnBackendDescriptor_t dk = tensor(b, U_DK, bf, dim, str), dv = tensor(b, U_DV, bf, dim, str);
    cudnnBackendDescriptor_t kr = tensor(b, 0, bf, dim, str);
    bhld(dim, str, B, H, Lq, D, k->ldo, false);
    cudnnBackendDescriptor_t o = tensor(b, U_O, bf, dim, str);
    dense(dim, str, B, H, Lq, D);
    cudnnBackendDescriptor_t dqacc = tensor(b, U_DQACC, f32, dim, str);
    cudnnBackendDescriptor_t scale = tensor(b, -U_SCALE, f32, NULL, NULL), one = tensor(b, -U_ONE, f32, NULL, NULL);
    dense(dim, str, B, H, Lq, 1);
    cudnnBackendDescriptor_t rs = tensor(b, 0, f32, dim, str), dsum = tensor(b, U_DSUM, f32, dim, str);
    cudnnBackendDescriptor_t lse = tensor(b, U_LSE, f32, dim, str);
    dense(dim, str, B, H, Lq, Lk);
    cudnnBackendDescriptor_t s = tensor(b, 0, f32, dim, str), ss = tensor(b, 0, f32, dim, str);
    cudnnBackendDescriptor_t sub = tensor(b, 0, f32, dim, str), p = tensor(b, 0, f32, dim, str);
    cudnnBackendDescriptor_t dp = tensor(b, 0, f32, dim, str), t1 = tensor(b, 0, f32, dim, str);
    cudnnBackendDescriptor_t t2 = tensor(b, 0, f32, dim, str), ds = tensor(b, 0, f32, dim, str);
    /* P^T and dS^T: [B, H, Lk, Lq] over the same elements */
    dim[0] = B, dim[1] = H, dim[2] = Lk, dim[3] = Lq;
    str[0] = (int64_t)H * Lq * Lk, str[1] = (int64_t)Lq * Lk, str[2] = 1, str[3] = Lk;
    cudnnBackendDescriptor_t pt = tensor(b, 0, bf, dim, str), dst = tensor(b, 0, bf, dim, str);

    pointwise(b, CUDNN_POINTWISE_MUL, dout, o, t_do_o);
    reduction(b, CUDNN_REDUCE_TENSOR_ADD, t_do_o, rs);
    pointwise(b, CUDNN_POINTWISE_MUL, rs, one, dsum);
    matmul(b, q, kt, s);
    pointwise(b, CUDNN_POINTWISE_MUL, s, scale, ss);
    pointwise(b, CUDNN_POINTWISE_SUB, ss, lse, sub);
    pointwise(b, CUDNN_POINTWISE_EXP, sub, NULL, p);
    reshape(b, p, pt);
    matmul(b, pt, dout, dv);
    matmul(b, dout, vt, dp);
    pointwise(b, CUDNN_POINTWISE_SUB, dp, dsum, t1);
    pointwise(b, CUDNN_POINTWISE_MUL, t1, p, t2);
    pointwise(b, CUDNN_POINTWISE_MUL, t2, scale, ds);
    reshape(b, ds, dst);
    matmul(b, dst, q, dk);
    reshape(b, kt, kr);
    matmul(b, ds, kr, dqacc);
    pointwise(b, CUDNN_POINTWISE_IDENTITY, dqacc, NULL, dq);
}

/* The plan for a problem (built at first use; NULL when cuDNN is absent or declines it). Under
 * ghc_dnn_lock. */
static struct plan *get_plan(const struct plan_key *key)
{
    cudnnHandle_t handle = ghc_dnn_handle(key->dev);
    if (!handle)
        return NULL;
    for (int i = 0; i < MAX_PLANS; i++)
        if (g_plans[i] && !memcmp(&g_plans[i]->key, key, sizeof *key))
            return g_plans[i]->plan ? g_plans[i] : NULL;
    struct plan *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->key = *key;
    if (key->bwd)
        build_bwd(&p->b, key);
    else
        build_fwd(&p->b, key);
    p->plan = p->b.st ? NULL : ghc_dnn_make_plan(&p->b, handle, &p->workspace);
    if (!p->plan) {
        note_why(&p->b, key);
        ghc_dnn_free(&p->b);
    }
    struct plan **slot = &g_plans[g_next];
    g_next = (g_next + 1) % MAX_PLANS;
    if (*slot) {
        ghc_dnn_free(&(*slot)->b);
        free(*slot);
    }
    *slot = p;
    return p->plan ? p : NULL;
}

static int execute(struct plan *p, void *stream, int n, const int64_t *uids, void **ptrs, void *workspace)
{
    return ghc_dnn_execute(ghc_dnn_handle(p->key.dev), p->plan, stream, n, uids, ptrs, workspace);
}

/* Whether cuDNN may take the problem: bf16, Dh a multiple of 8 up to 128, 16-byte aligned rows
 * (the callers checked the dtypes and shapes against each other). */
static bool takes(const ghc_tensor_t *q, const ghc_tensor_t *k, int64_t ldo)
{
    const int64_t D = ghc_tensor_dim(q, 3);
    return g_impl != GHC_K_ATTN_OWN && ghc_tensor_dtype(q) == GHC_DTYPE_BF16 && D % 8 == 0 && D <= 128 &&
           ldo % 8 == 0 && ghc_tensor_dim(k, 1) > 0 && ghc_tensor_dim(q, 0) <= INT32_MAX &&
           ghc_tensor_dim(q, 1) <= INT32_MAX && ghc_tensor_dim(k, 1) <= INT32_MAX;
}

static struct plan_key key_of(const ghc_tensor_t *q, const ghc_tensor_t *k, int64_t ldo, int bwd)
{
    struct plan_key key;
    memset(&key, 0, sizeof key); /* compared with memcmp */
    key.dev = ghc_tensor_device(q);
    key.bwd = bwd;
    key.B = (int)ghc_tensor_dim(q, 0);
    key.Lq = (int)ghc_tensor_dim(q, 1);
    key.H = (int)ghc_tensor_dim(q, 2);
    key.D = (int)ghc_tensor_dim(q, 3);
    key.Lk = (int)ghc_tensor_dim(k, 1);
    key.ldo = ldo;
    return key;
}

int ghc_k_cudnn_attention_fwd(ghc_tensor_t *o, ghc_tensor_t *lse, const ghc_tensor_t *q, const ghc_tensor_t *k,
                              const ghc_tensor_t *v, int64_t ldo, float scale, void *stream)
{
    if (!takes(q, k, ldo) || !ghc_dnn_aligned(ghc_tensor_cdata(q)) || !ghc_dnn_aligned(ghc_tensor_cdata(k)) ||
        !ghc_dnn_aligned(ghc_tensor_cdata(v)) || !ghc_dnn_aligned(ghc_tensor_data(o)))
        return -1;
    const struct plan_key key = key_of(q, k, ldo, 0);
    pthread_mutex_lock(&ghc_dnn_lock);
    struct plan *p = get_plan(&key);
    int rc = -1;
    if (p) {
        void *ws = NULL;
        rc = p->workspace ? ghc_k_scratch(key.dev, stream, (size_t)p->workspace, &ws) : 0;
        if (!rc) {
            static const int64_t uids[] = {U_Q, U_K, U_V, U_O, U_LSE, U_SCALE};
            void *ptrs[] = {(void *)ghc_tensor_cdata(q), (void *)ghc_tensor_cdata(k), (void *)ghc_tensor_cdata(v),
                            ghc_tensor_data(o), ghc_tensor_data(lse), &scale};
            rc = execute(p, stream, 6, uids, ptrs, ws);
        }
    }
    pthread_mutex_unlock(&ghc_dnn_lock);
    return rc;
}

int ghc_k_cudnn_attention_bwd(ghc_tensor_t *dq, ghc_tensor_t *dk, ghc_tensor_t *dv, const ghc_tensor_t *dout,
                              const ghc_tensor_t *q, const ghc_tensor_t *k, const ghc_tensor_t *v,
                              const ghc_tensor_t *o, int64_t ldo, const ghc_tensor_t *lse, float scale,
                              void *stream)
{
    if (!takes(q, k, ldo) || !ghc_dnn_aligned(ghc_tensor_cdata(q)) || !ghc_dnn_aligned(ghc_tensor_cdata(k)) ||
        !ghc_dnn_aligned(ghc_tensor_cdata(v)) || !ghc_dnn_aligned(ghc_tensor_cdata(o)) || !ghc_dnn_aligned(ghc_tensor_cdata(dout)) ||
        (dq && !ghc_dnn_aligned(ghc_tensor_data(dq))) || (dk && !ghc_dnn_aligned(ghc_tensor_data(dk))) ||
        (dv && !ghc_dnn_aligned(ghc_tensor_data(dv))))
        return -1;
    const struct plan_key key = key_of(q, k, ldo, 1);
    pthread_mutex_lock(&ghc_dnn_lock);
    struct plan *p = get_plan(&key);
    int rc = -1;
    if (p) {
        /* scratch: cuDNN's workspace, the row sums, the fp32 dQ accumulator, and the gradients
         * the caller does not want (cuDNN writes all three) */
        const size_t rows = (size_t)key.B * key.H * key.Lq;
        const size_t kv = (size_t)key.B * key.Lk * key.H * key.D * 2;
        const size_t o_ws = 0, o_sum = ghc_dnn_round256((size_t)p->workspace), o_acc = o_sum + ghc_dnn_round256(rows * 4);
        const size_t o_dq = o_acc + ghc_dnn_round256(rows * key.D * 4), o_dk = o_dq + (dq ? 0 : ghc_dnn_round256(rows * key.D * 2));
        const size_t o_dv = o_dk + (dk ? 0 : ghc_dnn_round256(kv)), total = o_dv + (dv ? 0 : ghc_dnn_round256(kv));
        char *scr = NULL;
        rc = ghc_k_scratch(key.dev, stream, total, (void **)&scr);
        if (!rc && ghc_dnn.version_num < 90600) /* older cuDNN wants the accumulator zeroed */
            rc = (int)cudaMemsetAsync(scr + o_acc, 0, rows * key.D * 4, (cudaStream_t)stream);
        if (!rc) {
            static const int64_t uids[] = {U_Q,  U_K,  U_V,    U_O,     U_LSE,   U_DO,
                                           U_DQ, U_DK, U_DV,   U_DSUM,  U_DQACC, U_SCALE, U_ONE};
            float one = 1.0f;
            void *ptrs[] = {(void *)ghc_tensor_cdata(q),
                            (void *)ghc_tensor_cdata(k),
                            (void *)ghc_tensor_cdata(v),
                            (void *)ghc_tensor_cdata(o),
                            (void *)ghc_tensor_cdata(lse),
                            (void *)ghc_tensor_cdata(dout),
                            dq ? ghc_tensor_data(dq) : scr + o_dq,
                            dk ? ghc_tensor_data(dk) : scr + o_dk,
                            dv ? ghc_tensor_data(dv) : scr + o_dv,
                            scr + o_sum,
                            scr + o_acc,
                            &scale,
                            &one};
            rc = execute(p, stream, 13, uids, ptrs, scr + o_ws);
        }
    }
    pthread_mutex_unlock(&ghc_dnn_lock);
    return rc;
}

#endif /* GHC_HAVE_CUDNN */
