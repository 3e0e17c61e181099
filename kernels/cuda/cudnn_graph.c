/* cudnn_graph.c: cuDNN loaded at run time (dlopen of libcudnn.so.9, so a build with cuDNN's
 * headers runs where the library is absent) and the helpers of cudnn_impl.h that build
 * backend-API graphs and plans, for the attention (attention_cudnn.c) and the convolution
 * (conv_cudnn.c). */
#include <config.h>

#include "kernels.h"

#ifndef GHC_HAVE_CUDNN

int ghc_k_cudnn_version(void) { return 0; }

#else /* GHC_HAVE_CUDNN */

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudnn_impl.h"

struct ghc_dnn_lib ghc_dnn;
pthread_mutex_t ghc_dnn_lock = PTHREAD_MUTEX_INITIALIZER;
static cudnnHandle_t g_handle[64];

bool ghc_dnn_load(void)
{
    if (ghc_dnn.loaded)
        return ghc_dnn.loaded > 0;
    ghc_dnn.loaded = -1;
    void *h = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return false;
#define SYM(field, name)                                   \
    do {                                                   \
        *(void **)&ghc_dnn.field = dlsym(h, name);         \
        if (!ghc_dnn.field) {                              \
            dlclose(h);                                    \
            return false;                                  \
        }                                                  \
    } while (0)
    SYM(version, "cudnnGetVersion");
    SYM(create, "cudnnCreate");
    SYM(set_stream, "cudnnSetStream");
    SYM(create_desc, "cudnnBackendCreateDescriptor");
    SYM(destroy_desc, "cudnnBackendDestroyDescriptor");
    SYM(finalize, "cudnnBackendFinalize");
    SYM(set_attr, "cudnnBackendSetAttribute");
    SYM(get_attr, "cudnnBackendGetAttribute");
    SYM(execute, "cudnnBackendExecute");
    SYM(error_string, "cudnnGetErrorString");
    SYM(last_error, "cudnnGetLastErrorString");
#undef SYM
    const size_t v = ghc_dnn.version();
    if (v < 90000 || v >= 100000) { /* the backend API of cuDNN 9 */
        dlclose(h);
        return false;
    }
    ghc_dnn.version_num = (int)v;
    ghc_dnn.loaded = 1;
    return true;
}

int ghc_k_cudnn_version(void)
{
    pthread_mutex_lock(&ghc_dnn_lock);
    const int v = ghc_dnn_load() ? ghc_dnn.version_num : 0;
    pthread_mutex_unlock(&ghc_dnn_lock);
    return v;
}

cudnnHandle_t ghc_dnn_handle(int dev)
{
    if (!ghc_dnn_load() || dev < 0 || dev >= 64)
        return NULL;
    if (!g_handle[dev] && ghc_dnn.create(&g_handle[dev]) != CUDNN_STATUS_SUCCESS)
        g_handle[dev] = NULL;
    return g_handle[dev];
}

cudnnBackendDescriptor_t ghc_dnn_mk(struct ghc_dnn_build *b, cudnnBackendDescriptorType_t type)
{
    if (b->st || b->n == GHC_DNN_MAX_DESC) {
        b->st = b->st ? b->st : CUDNN_STATUS_INTERNAL_ERROR;
        return NULL;
    }
    cudnnBackendDescriptor_t d = NULL;
    if ((b->st = ghc_dnn.create_desc(type, &d)) != CUDNN_STATUS_SUCCESS) {
        b->line = -(int)type;
        return NULL;
    }
    return b->d[b->n++] = d;
}

void ghc_dnn_set(struct ghc_dnn_build *b, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                 cudnnBackendAttributeType_t type, int64_t count, const void *value, int line)
{
    if (!b->st && (b->st = ghc_dnn.set_attr(d, name, type, count, value)))
        b->line = line;
}

void ghc_dnn_fin(struct ghc_dnn_build *b, cudnnBackendDescriptor_t d, int line)
{
    if (!b->st && (b->st = ghc_dnn.finalize(d)))
        b->line = line;
}

void ghc_dnn_free(struct ghc_dnn_build *b)
{
    for (int i = b->n - 1; i >= 0; i--)
        if (b->d[i]) /* NULL: dropped (ghc_dnn_drop) */
            ghc_dnn.destroy_desc(b->d[i]);
    b->n = 0;
}

cudnnBackendDescriptor_t ghc_dnn_tensor(struct ghc_dnn_build *b, int64_t uid, cudnnDataType_t dt, int nd,
                                        const int64_t *dim, const int64_t *str)
{
    static const int64_t one[5] = {1, 1, 1, 1, 1}; /* a scalar: the backend wants every operand nd-D */
    cudnnBackendDescriptor_t t = ghc_dnn_mk(b, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const bool virt = uid == 0, byval = uid < 0;
    const int64_t id = virt ? 1000 + b->n : byval ? -uid : uid, align = 16;
    set(b, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
    set(b, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, nd, byval ? one : dim);
    set(b, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, nd, byval ? one : str);
    set(b, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &id);
    set(b, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    if (virt)
        set(b, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt);
    if (byval)
        set(b, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &byval);
    fin(b, t);
    return t;
}

void ghc_dnn_add_op(struct ghc_dnn_build *b, cudnnBackendDescriptor_t op)
{
    fin(b, op);
    if (!b->st)
        b->ops[b->nops++] = op;
}

/* The operation graph of b's operations (NULL with b->st set). */
static cudnnBackendDescriptor_t op_graph(struct ghc_dnn_build *b, cudnnHandle_t handle)
{
    cudnnBackendDescriptor_t g = ghc_dnn_mk(b, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    set(b, g, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    set(b, g, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, b->nops, b->ops);
    fin(b, g);
    return b->st ? NULL : g;
}

/* The first (at most max) engine configurations of heuristics `mode` for graph g into cfg, in
 * their order; how many (0 with b->st set when the heuristics fail). */
static int64_t heur_cfgs(struct ghc_dnn_build *b, cudnnBackendDescriptor_t g, cudnnBackendHeurMode_t mode, int64_t max,
                         cudnnBackendDescriptor_t *cfg)
{
    cudnnBackendDescriptor_t heur = ghc_dnn_mk(b, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    set(b, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g);
    set(b, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    fin(b, heur);
    if (b->st)
        return 0;
    int64_t count = 0;
    if ((b->st = ghc_dnn.get_attr(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, NULL))) {
        b->line = __LINE__;
        return 0;
    }
    if (count > max)
        count = max;
    for (int64_t i = 0; i < count; i++)
        cfg[i] = ghc_dnn_mk(b, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    int64_t got = 0;
    if (b->st || (b->st = ghc_dnn.get_attr(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count,
                                       &got, cfg))) {
        b->line = b->line ? b->line : __LINE__;
        return 0;
    }
    return got;
}

/* The execution plan of engine configuration cfg (its workspace bytes in *workspace); NULL
 * with b->st set. */
static cudnnBackendDescriptor_t plan_of(struct ghc_dnn_build *b, cudnnHandle_t handle, cudnnBackendDescriptor_t cfg,
                                        int64_t *workspace)
{
    cudnnBackendDescriptor_t plan = ghc_dnn_mk(b, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    set(b, plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    set(b, plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg);
    fin(b, plan);
    int64_t n = 0;
    if (!b->st && !(b->st = ghc_dnn.get_attr(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n,
                                         workspace)))
        return plan;
    b->line = b->line ? b->line : __LINE__;
    return NULL;
}

cudnnBackendDescriptor_t ghc_dnn_make_plan(struct ghc_dnn_build *b, cudnnHandle_t handle, int64_t *workspace)
{
    cudnnBackendDescriptor_t cfg[8];
    const int64_t got = heur_cfgs(b, op_graph(b, handle), CUDNN_HEUR_MODE_A, 8, cfg);
    for (int64_t i = 0; i < got; i++) {
        cudnnBackendDescriptor_t plan = plan_of(b, handle, cfg[i], workspace);
        if (plan)
            return plan;
        if (b->n == GHC_DNN_MAX_DESC || i + 1 == got)
            break; /* the last engine's reason stays */
        b->st = CUDNN_STATUS_SUCCESS; /* this engine declined: the next */
    }
    if (!b->st) {
        b->st = CUDNN_STATUS_NOT_SUPPORTED;
        b->line = __LINE__;
    }
    return NULL;
}

/* ---- candidates for tuning ------------------------------------------------------------------ */

/* Whether the engine of cfg compiles kernels at run time (seconds per plan), and whether it is
 * nondeterministic or sums in less than the graph's compute precision (either: *inexact); an
 * engine whose notes cannot be read is none of these. */
static void cfg_notes(struct ghc_dnn_build *b, cudnnBackendDescriptor_t cfg, bool *rtc, bool *inexact)
{
    *rtc = *inexact = false;
    cudnnBackendDescriptor_t eng = ghc_dnn_mk(b, CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    int64_t n = 0;
    if (!eng) {
        b->st = CUDNN_STATUS_SUCCESS; /* no descriptor left: the caller stops, the build stands */
        return;
    }
    if (ghc_dnn.get_attr(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &eng))
        return;
    cudnnBackendBehaviorNote_t bn[CUDNN_BEHAVIOR_NOTE_TYPE_COUNT];
    if (!ghc_dnn.get_attr(eng, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE, CUDNN_BEHAVIOR_NOTE_TYPE_COUNT,
                          &n, bn))
        for (int64_t i = 0; i < n && i < CUDNN_BEHAVIOR_NOTE_TYPE_COUNT; i++)
            *rtc = *rtc || bn[i] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION;
    cudnnBackendNumericalNote_t nn[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    if (!ghc_dnn.get_attr(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                          CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n, nn))
        for (int64_t i = 0; i < n && i < CUDNN_NUMERICAL_NOTE_TYPE_COUNT; i++)
            *inexact = *inexact || nn[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC ||
                       nn[i] == CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION;
}

/* FNV-1a of the plan's JSON form (engine, knobs, graph): equal plans hash alike; 0 where cuDNN
 * cannot serialise it (never taken for a duplicate). */
static uint64_t plan_hash(cudnnBackendDescriptor_t plan)
{
    int64_t n = 0;
    if (ghc_dnn.get_attr(plan, CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, 0, &n, NULL) || n <= 0)
        return 0;
    char *json = malloc((size_t)n + 1);
    uint64_t h = 0;
    if (json && !ghc_dnn.get_attr(plan, CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, n, &n, json)) {
        h = 1469598103934665603ull;
        for (int64_t i = 0; i < n && json[i]; i++)
            h = (h ^ (unsigned char)json[i]) * 1099511628211ull;
    }
    free(json);
    return h;
}

int ghc_dnn_make_plans(struct ghc_dnn_build *b, cudnnHandle_t handle, bool rtc, int64_t max_workspace, int max,
                       cudnnBackendDescriptor_t *plans, int64_t *workspaces)
{
    static const struct {
        cudnnBackendHeurMode_t mode;
        int64_t cfgs;
    } modes[] = { { CUDNN_HEUR_MODE_A, 12 }, { CUDNN_HEUR_MODE_B, 12 }, { CUDNN_HEUR_MODE_FALLBACK, 4 } };
    uint64_t hash[GHC_DNN_MAX_PLANS];
    int np = 0;
    cudnnBackendDescriptor_t g = op_graph(b, handle);
    if (max > GHC_DNN_MAX_PLANS)
        max = GHC_DNN_MAX_PLANS;
    for (size_t m = 0; g && m < sizeof modes / sizeof modes[0] && np < max; m++) {
        cudnnBackendDescriptor_t cfg[12];
        const int64_t got = heur_cfgs(b, g, modes[m].mode, modes[m].cfgs, cfg);
        if (!got && np) { /* B or FALLBACK gave nothing: the plans so far stand */
            b->st = CUDNN_STATUS_SUCCESS;
            continue;
        }
        for (int64_t i = 0; i < got && np < max && b->n + 2 < GHC_DNN_MAX_DESC; i++) {
            bool is_rtc = false, inexact = false;
            if (np) { /* the first that builds is ghc_dnn_make_plan's, whatever its notes */
                cfg_notes(b, cfg[i], &is_rtc, &inexact);
                if ((is_rtc && !rtc) || inexact)
                    continue;
            }
            int64_t ws = 0;
            cudnnBackendDescriptor_t plan = plan_of(b, handle, cfg[i], &ws);
            if (!plan) {
                if (!np && (b->n == GHC_DNN_MAX_DESC || (m == 0 && i + 1 == got)))
                    return 0; /* as ghc_dnn_make_plan: the last engine's reason stays */
                b->st = CUDNN_STATUS_SUCCESS; /* this engine declined: the next */
                continue;
            }
            const uint64_t h = plan_hash(plan);
            bool drop = np && ws > max_workspace; /* too large a workspace, or a plan we have */
            for (int j = 0; j < np && !drop && h; j++)
                drop = hash[j] == h;
            if (drop) {
                ghc_dnn_drop(b, plan);
                continue;
            }
            hash[np] = h, workspaces[np] = ws, plans[np++] = plan;
        }
        if (!np)
            break; /* mode A built nothing: cuDNN declines the problem */
    }
    if (!np && !b->st) {
        b->st = CUDNN_STATUS_NOT_SUPPORTED;
        b->line = __LINE__;
    }
    return np;
}

void ghc_dnn_drop(struct ghc_dnn_build *b, cudnnBackendDescriptor_t d)
{
    for (int i = 0; d && i < b->n; i++)
        if (b->d[i] == d) {
            ghc_dnn.destroy_desc(d);
            b->d[i] = NULL;
        }
}

int ghc_dnn_execute(cudnnHandle_t h, cudnnBackendDescriptor_t plan, void *stream, int n, const int64_t *uids,
                    void **ptrs, void *workspace)
{
    if (ghc_dnn.set_stream(h, (cudaStream_t)stream) != CUDNN_STATUS_SUCCESS)
        return (int)cudaErrorUnknown;
    struct ghc_dnn_build b = {0};
    cudnnBackendDescriptor_t vp = ghc_dnn_mk(&b, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    set(&b, vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
    set(&b, vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
    set(&b, vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
    fin(&b, vp);
    if (!b.st)
        b.st = ghc_dnn.execute(h, plan, vp);
    ghc_dnn_free(&b);
    return b.st ? (int)cudaErrorUnknown : 0;
}

void ghc_dnn_why(char *buf, size_t len, const struct ghc_dnn_build *b, const char *file)
{
    char msg[256] = "";
    ghc_dnn.last_error(msg, sizeof msg);
    snprintf(buf, len, "%s at %s:%d%s%s", ghc_dnn.error_string(b->st), file, b->line, *msg ? ": " : "", msg);
}

#endif /* GHC_HAVE_CUDNN */
