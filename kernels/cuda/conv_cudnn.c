/* conv_cudnn.c: cuDNN's convolution as the fast path behind ghc_op_conv3d (the contract in
 * ops.h; vae.cu chooses, our implicit GEMM otherwise).
 *
 * bf16 activations only (f32 ones run on our exact fp32 kernel). cuDNN is fastest with
 * channels-last tensors on tensor cores, so one call is:
 *   1. pack the padded sequence [zero frames, cache frames, x] (NCDHW) into one channels-last
 *      bf16 buffer [B, pad_t + T, Hp, Wp, Cip] (vae.cu's k_pack_x: a tiled transpose that also
 *      writes the causal zero frames and the spatial zero padding, so that cuDNN sees a
 *      convolution without padding, whatever asymmetric padding Wan uses; the channels padded to
 *      Cip, a multiple of 8, with zeros, so that RGB's 3 channels meet the tensor cores'
 *      alignment), and the weight into [Cop, kT, kH, kW, Cip] bf16 (the output channels padded
 *      likewise);
 *   2. one convolution-forward graph: bf16 in, fp32 accumulation (compute type FLOAT), no
 *      padding, output channels-last in bf16 (fp32 where cuDNN declines that);
 *   3. unpack to y (NCDHW) adding the bias in fp32, and conv3d_add's residual (k_unpack_y).
 * With GHC_CUDNN_TUNE on (the default) a new problem's plan is the fastest of the candidates
 * cuDNN's heuristics offer, timed on its first call's operands (tune, below; doc/vae.md).
 * Plans are built once per problem (shapes, paddings, device) and cached; a problem cuDNN
 * declines is remembered and runs on our kernel. The packed buffers and cuDNN's workspace come
 * from the stream's scratch (ghc_k_scratch). */
#include <config.h>

#include "kernels.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef GHC_HAVE_CUDNN

const char *ghc_k_cudnn_conv_why(void) { return "built without cuDNN's headers"; }

void ghc_k_cudnn_conv_tune_stats(struct ghc_k_cudnn_tune *out) { memset(out, 0, sizeof *out); }

int ghc_k_cudnn_conv3d(ghc_tensor_t *y, const ghc_tensor_t *x, const ghc_tensor_t *cache, const ghc_tensor_t *w,
                       const ghc_tensor_t *bias, const ghc_tensor_t *residual, const struct ghc_conv3d *a, void *stream)
{
    (void)y, (void)x, (void)cache, (void)w, (void)bias, (void)residual, (void)a, (void)stream;
    return -1;
}

#else /* GHC_HAVE_CUDNN */

#include "cudnn_impl.h"

static char g_why[512] = "";

const char *ghc_k_cudnn_conv_why(void) { return g_why; }

/* Tuning: at most TUNE_MAX candidate plans per problem, none with more than TUNE_WS bytes of
 * workspace (the heuristics' first excepted); a later candidate replaces the best so far only
 * when it is TUNE_MARGIN faster (timing noise does not flip the choice between equal plans). */
enum { TUNE_MAX = 12 };
#define TUNE_WS ((int64_t)64 << 20)
#define TUNE_MARGIN 0.98f

struct conv_key {
    int64_t dev, B, Cip, Tin, H, W, Cop, kT, kH, kW, To, Ho, Wo; /* Tin, H, W: the padded input's */
    int64_t stride[3];
};

struct conv_plan {
    struct conv_key key;
    struct ghc_dnn_build b; /* owns every descriptor; NULL plan: cuDNN declined this problem */
    cudnnBackendDescriptor_t plan;
    int64_t workspace;
    bool y_bf16; /* cuDNN writes bf16 (else f32) */
    /* the candidates, until the first call times them (plan = cand[0] until then) */
    int ncand;
    cudnnBackendDescriptor_t cand[TUNE_MAX];
    int64_t cand_ws[TUNE_MAX];
    double build_ms; /* building the candidates took */
};

enum { U_X = 1, U_W, U_Y };

static struct ghc_k_cudnn_tune g_tune;

#define MAX_PLANS 128
static struct conv_plan *g_plans[MAX_PLANS];
static int g_next;

/* dims [n, c, d, h, w] with channels-last strides. */
static void ndhwc(int64_t dim[5], int64_t str[5], int64_t n, int64_t c, int64_t d, int64_t h, int64_t w)
{
    dim[0] = n, dim[1] = c, dim[2] = d, dim[3] = h, dim[4] = w;
    str[1] = 1, str[4] = c, str[3] = w * c, str[2] = h * w * c, str[0] = d * h * w * c;
}

static void build(struct ghc_dnn_build *b, const struct conv_key *k, bool y_bf16)
{
    const cudnnDataType_t bf = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;
    int64_t dim[5], str[5];
    ndhwc(dim, str, k->B, k->Cip, k->Tin, k->H, k->W);
    cudnnBackendDescriptor_t x = ghc_dnn_tensor(b, U_X, bf, 5, dim, str);
    ndhwc(dim, str, k->Cop, k->Cip, k->kT, k->kH, k->kW);
    cudnnBackendDescriptor_t w = ghc_dnn_tensor(b, U_W, bf, 5, dim, str);
    ndhwc(dim, str, k->B, k->Cop, k->To, k->Ho, k->Wo);
    cudnnBackendDescriptor_t y = ghc_dnn_tensor(b, U_Y, y_bf16 ? bf : f32, 5, dim, str);
    const cudnnDataType_t prec = f32;
    const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    const int64_t nd = 3, dil[3] = {1, 1, 1}, pad[3] = {0, 0, 0};
    cudnnBackendDescriptor_t conv = ghc_dnn_mk(b, CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
    set(b, conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    set(b, conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
    set(b, conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &nd);
    set(b, conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 3, dil);
    set(b, conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 3, k->stride);
    set(b, conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 3, pad);
    set(b, conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 3, pad);
    fin(b, conv);
    const float alpha = 1.0f, beta = 0.0f;
    cudnnBackendDescriptor_t op = ghc_dnn_mk(b, CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
    set(b, op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    set(b, op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &w);
    set(b, op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    set(b, op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &conv);
    set(b, op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha);
    set(b, op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &beta);
    ghc_dnn_add_op(b, op);
}

static void note_why(const struct ghc_dnn_build *b, const struct conv_key *k)
{
    char why[400];
    ghc_dnn_why(why, sizeof why, b, "conv_cudnn.c");
    snprintf(g_why, sizeof g_why, "conv3d B%lld Ci%lld T%lld %lldx%lld -> Co%lld k%lldx%lldx%lld: %s",
             (long long)k->B, (long long)k->Cip, (long long)k->Tin, (long long)k->H, (long long)k->W,
             (long long)k->Cop, (long long)k->kT, (long long)k->kH, (long long)k->kW, why);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* GHC_CUDNN_TUNE, read when a problem's plan is built: 0 the heuristics' first plan, 1 (unset:
 * the default) time the candidates, 2 also those of engines that compile at run time. */
static int tune_level(void)
{
    const char *e = getenv("GHC_CUDNN_TUNE");
    return !e || !*e ? 1 : e[0] == '0' ? 0 : e[0] == '2' ? 2 : 1;
}

/* The plan for a problem (built at first use; NULL when cuDNN is absent or declines it). With
 * tuning on, the candidates wait in p->cand for the first call (tune). Under the lock. */
static struct conv_plan *get_plan(const struct conv_key *key)
{
    cudnnHandle_t handle = ghc_dnn_handle((int)key->dev);
    if (!handle)
        return NULL;
    for (int i = 0; i < MAX_PLANS; i++)
        if (g_plans[i] && !memcmp(&g_plans[i]->key, key, sizeof *key))
            return g_plans[i]->plan ? g_plans[i] : NULL;
    struct conv_plan *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->key = *key;
    const int level = tune_level();
    const double t0 = now_ms();
    for (int pass = 0; pass < 2 && !p->plan; pass++) { /* bf16 output, else f32 */
        ghc_dnn_free(&p->b);
        memset(&p->b, 0, sizeof p->b);
        p->y_bf16 = pass == 0;
        build(&p->b, key, p->y_bf16);
        if (p->b.st)
            p->ncand = 0;
        else if (level == 0)
            p->ncand = (p->cand[0] = ghc_dnn_make_plan(&p->b, handle, &p->cand_ws[0])) != NULL;
        else
            p->ncand = ghc_dnn_make_plans(&p->b, handle, level == 2, TUNE_WS, TUNE_MAX, p->cand, p->cand_ws);
        p->plan = p->ncand ? p->cand[0] : NULL;
        p->workspace = p->ncand ? p->cand_ws[0] : 0;
        if (!p->plan)
            note_why(&p->b, key);
    }
    p->build_ms = now_ms() - t0;
    if (!p->plan)
        ghc_dnn_free(&p->b);
    else if (level > 0) { /* tune fills in the timings */
        g_tune = (struct ghc_k_cudnn_tune){.problems = g_tune.problems + 1, .candidates = p->ncand,
                                           .tune_ms = p->build_ms};
    }
    struct conv_plan **slot = &g_plans[g_next];
    g_next = (g_next + 1) % MAX_PLANS;
    if (*slot) {
        ghc_dnn_free(&(*slot)->b);
        free(*slot);
    }
    *slot = p;
    return p->plan ? p : NULL;
}

/* p's plan becomes candidate k (while candidates wait); the others are destroyed. */
static void keep_only(struct conv_plan *p, int k)
{
    if (!p->ncand)
        return;
    for (int i = 0; i < p->ncand; i++)
        if (i != k)
            ghc_dnn_drop(&p->b, p->cand[i]);
    p->plan = p->cand[k];
    p->workspace = p->cand_ws[k];
    p->ncand = 0;
}

/* Time p's candidates on this call's operands (the variant pack ptrs, the workspace ws: room
 * for the largest), one warm-up and two timed runs each, and keep the fastest as p->plan (the
 * others are destroyed). Where the timing cannot run (events fail, the stream is being captured),
 * the heuristics' first stays. Then the caller runs p->plan for this call's output. */
static void tune(struct conv_plan *p, cudnnHandle_t h, void *stream, void **ptrs, void *ws, ghc_core_t *core)
{
    static const int64_t uids[] = {U_X, U_W, U_Y};
    const double t0 = now_ms();
    cudaStream_t st = (cudaStream_t)stream;
    enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    cudaEvent_t e0 = NULL, e1 = NULL;
    int best = 0, timed = 0;
    float best_ms = 0.0f, first_ms = 0.0f;
    if (cudaStreamIsCapturing(st, &cap) == cudaSuccess && cap == cudaStreamCaptureStatusNone &&
        cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess) {
        for (int i = 0; i < p->ncand; i++) {
            float ms = 0.0f;
            bool ok = !ghc_dnn_execute(h, p->cand[i], stream, 3, uids, ptrs, ws) && !cudaEventRecord(e0, st);
            for (int r = 0; r < 2 && ok; r++)
                ok = !ghc_dnn_execute(h, p->cand[i], stream, 3, uids, ptrs, ws);
            ok = ok && !cudaEventRecord(e1, st) && !cudaEventSynchronize(e1) && !cudaEventElapsedTime(&ms, e0, e1);
            if (!ok) { /* this plan does not run here: the next */
                cudaGetLastError();
                continue;
            }
            ms /= 2;
            if (i == 0)
                first_ms = ms;
            if (!timed++ || ms < best_ms * TUNE_MARGIN)
                best = i, best_ms = ms;
        }
    }
    if (e0)
        cudaEventDestroy(e0);
    if (e1)
        cudaEventDestroy(e1);
    cudaGetLastError();
    g_tune.timed = timed;
    g_tune.chosen = best;
    g_tune.best_ms = best_ms;
    g_tune.first_ms = first_ms;
    g_tune.tune_ms = p->build_ms + (now_ms() - t0);
    const struct conv_key *k = &p->key;
    ghc_log(core, GHC_LOG_DEBUG,
            "conv_cudnn: B%lld Ci%lld T%lld %lldx%lld -> Co%lld k%lldx%lldx%lld: %d plans, %d timed, #%d "
            "%.3f ms (the heuristics' first %.3f ms); building and timing %.0f ms",
            (long long)k->B, (long long)k->Cip, (long long)k->Tin, (long long)k->H, (long long)k->W,
            (long long)k->Cop, (long long)k->kT, (long long)k->kH, (long long)k->kW, p->ncand, timed, best,
            (double)best_ms, (double)first_ms, g_tune.tune_ms);
    keep_only(p, best);
}

void ghc_k_cudnn_conv_tune_stats(struct ghc_k_cudnn_tune *out)
{
    pthread_mutex_lock(&ghc_dnn_lock);
    *out = g_tune;
    pthread_mutex_unlock(&ghc_dnn_lock);
}

int ghc_k_cudnn_conv3d(ghc_tensor_t *y, const ghc_tensor_t *x, const ghc_tensor_t *cache, const ghc_tensor_t *w,
                       const ghc_tensor_t *bias, const ghc_tensor_t *residual, const struct ghc_conv3d *a, void *stream)
{
    if (ghc_tensor_dtype(x) != GHC_DTYPE_BF16)
        return -1;
    struct conv_key key;
    memset(&key, 0, sizeof key); /* compared with memcmp */
    key.dev = ghc_tensor_device(y);
    key.B = ghc_tensor_dim(x, 0);
    key.Cip = (ghc_tensor_dim(x, 1) + 7) / 8 * 8;
    key.Tin = a->pad_t + ghc_tensor_dim(x, 2);
    key.H = a->pad_top + ghc_tensor_dim(x, 3) + a->pad_bottom;
    key.W = a->pad_left + ghc_tensor_dim(x, 4) + a->pad_right;
    key.Cop = (ghc_tensor_dim(w, 0) + 7) / 8 * 8;
    key.kT = ghc_tensor_dim(w, 2);
    key.kH = ghc_tensor_dim(w, 3);
    key.kW = ghc_tensor_dim(w, 4);
    key.To = ghc_tensor_dim(y, 2);
    key.Ho = ghc_tensor_dim(y, 3);
    key.Wo = ghc_tensor_dim(y, 4);
    key.stride[0] = a->stride_t, key.stride[1] = a->stride_h, key.stride[2] = a->stride_w;
    const size_t kvol = (size_t)(key.kT * key.kH * key.kW);
    const size_t xb = (size_t)(key.B * key.Tin * key.H * key.W * key.Cip) * 2, wb = (size_t)key.Cop * kvol * key.Cip * 2;
    const size_t yel = (size_t)(key.B * key.To * key.Ho * key.Wo * key.Cop);
    pthread_mutex_lock(&ghc_dnn_lock);
    struct conv_plan *p = get_plan(&key);
    int rc = -1;
    if (p) {
        size_t o_x, o_w, o_y;
        char *scr = NULL;
        for (;;) {
            int64_t ws = p->workspace; /* room for every candidate while they wait to be timed */
            for (int i = 0; i < p->ncand; i++)
                ws = p->cand_ws[i] > ws ? p->cand_ws[i] : ws;
            o_x = ghc_dnn_round256((size_t)ws), o_w = o_x + ghc_dnn_round256(xb), o_y = o_w + ghc_dnn_round256(wb);
            rc = ghc_k_scratch((int)key.dev, stream, o_y + yel * (p->y_bf16 ? 2 : 4), (void **)&scr);
            if (!rc || p->ncand <= 1)
                break;
            cudaGetLastError();
            keep_only(p, 0); /* no room to time them all: the heuristics' first */
        }
        if (!rc)
            rc = ghc_k_conv_pack_x(scr + o_x, x, cache, a, key.Cip, stream);
        if (!rc)
            rc = ghc_k_conv_pack_w(scr + o_w, w, key.Cop, key.Cip, stream);
        if (!rc) {
            static const int64_t uids[] = {U_X, U_W, U_Y};
            void *ptrs[] = {scr + o_x, scr + o_w, scr + o_y};
            if (p->ncand > 1)
                tune(p, ghc_dnn_handle((int)key.dev), stream, ptrs, scr, ghc_tensor_core(y));
            keep_only(p, 0); /* one candidate: nothing to time */
            rc = ghc_dnn_execute(ghc_dnn_handle((int)key.dev), p->plan, stream, 3, uids, ptrs, scr);
            if (rc) { /* cuDNN failed to run its plan: say why, and our kernel runs instead */
                char msg[256] = "";
                ghc_dnn.last_error(msg, sizeof msg);
                snprintf(g_why, sizeof g_why, "conv3d: executing the plan failed: %s", msg);
                rc = -1;
            }
        }
        if (!rc)
            rc = ghc_k_conv_unpack_y(y, scr + o_y, p->y_bf16, key.Cop, bias, residual, stream);
    }
    pthread_mutex_unlock(&ghc_dnn_lock);
    return rc;
}

#endif /* GHC_HAVE_CUDNN */
