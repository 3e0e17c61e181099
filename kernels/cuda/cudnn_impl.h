/* cudnn_impl.h: what the cuDNN paths (attention_cudnn.c, conv_cudnn.c) share, from
 * cudnn_graph.c: libcudnn.so.9 loaded at run time (dlopen; no link dependency), one handle per
 * device, and the helpers that build a backend-API graph and its execution plan. Host C, only
 * with cuDNN's headers (GHC_HAVE_CUDNN). Everything that touches the library or the handles
 * runs under ghc_dnn_lock. */
#ifndef GHC_KERNELS_CUDNN_IMPL_H
#define GHC_KERNELS_CUDNN_IMPL_H

#ifdef GHC_HAVE_CUDNN
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>
#include <cudnn_graph.h>
#include <pthread.h>

/* The library's entry points (valid once ghc_dnn_load() returned true). */
struct ghc_dnn_lib {
    size_t (*version)(void);
    cudnnStatus_t (*create)(cudnnHandle_t *);
    cudnnStatus_t (*set_stream)(cudnnHandle_t, cudaStream_t);
    cudnnStatus_t (*create_desc)(cudnnBackendDescriptorType_t, cudnnBackendDescriptor_t *);
    cudnnStatus_t (*destroy_desc)(cudnnBackendDescriptor_t);
    cudnnStatus_t (*finalize)(cudnnBackendDescriptor_t);
    cudnnStatus_t (*set_attr)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t, cudnnBackendAttributeType_t,
                              int64_t, const void *);
    cudnnStatus_t (*get_attr)(cudnnBackendDescriptor_t const, cudnnBackendAttributeName_t,
                              cudnnBackendAttributeType_t, int64_t, int64_t *, void *);
    cudnnStatus_t (*execute)(cudnnHandle_t, cudnnBackendDescriptor_t, cudnnBackendDescriptor_t);
    const char *(*error_string)(cudnnStatus_t);
    void (*last_error)(char *, size_t);
    int loaded; /* 0 not tried, 1 loaded, -1 absent */
    int version_num;
};
extern struct ghc_dnn_lib ghc_dnn;
extern pthread_mutex_t ghc_dnn_lock;

/* Load cuDNN 9 once (true when usable). Under ghc_dnn_lock. */
bool ghc_dnn_load(void);
/* The handle of device dev (made at first use), NULL when it cannot be made. Under the lock. */
cudnnHandle_t ghc_dnn_handle(int dev);

#define GHC_DNN_MAX_DESC 160
#define GHC_DNN_MAX_PLANS 16 /* candidates of ghc_dnn_make_plans */

/* A graph under construction: every descriptor it made (destroyed with it), its operations,
 * the first failure and the line that set it. */
struct ghc_dnn_build {
    cudnnBackendDescriptor_t d[GHC_DNN_MAX_DESC];
    int n;
    cudnnBackendDescriptor_t ops[32];
    int nops;
    cudnnStatus_t st;
    int line;
};

cudnnBackendDescriptor_t ghc_dnn_mk(struct ghc_dnn_build *b, cudnnBackendDescriptorType_t type);
/* Set an attribute / finalize a descriptor unless the build failed already (line: the caller's). */
void ghc_dnn_set(struct ghc_dnn_build *b, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                 cudnnBackendAttributeType_t type, int64_t count, const void *value, int line);
void ghc_dnn_fin(struct ghc_dnn_build *b, cudnnBackendDescriptor_t d, int line);
#define set(b, d, name, type, count, value) ghc_dnn_set(b, d, name, type, count, value, __LINE__)
#define fin(b, d) ghc_dnn_fin(b, d, __LINE__)
/* Destroy every descriptor of b. */
void ghc_dnn_free(struct ghc_dnn_build *b);
/* A tensor of nd dims (4 or 5): uid > 0 a real one (variant pack), 0 a virtual one, < 0 a
 * scalar by value with uid -uid. 16-byte aligned. */
cudnnBackendDescriptor_t ghc_dnn_tensor(struct ghc_dnn_build *b, int64_t uid, cudnnDataType_t dt, int nd,
                                        const int64_t *dim, const int64_t *str);
/* Finalize an operation and append it to the graph. */
void ghc_dnn_add_op(struct ghc_dnn_build *b, cudnnBackendDescriptor_t op);
/* The operation graph of b's operations, the heuristics' engine configurations in order, and
 * the first plan that finalizes (its workspace bytes in *workspace); NULL with b->st set. */
cudnnBackendDescriptor_t ghc_dnn_make_plan(struct ghc_dnn_build *b, cudnnHandle_t handle, int64_t *workspace);
/* For tuning (conv_cudnn.c; the attention keeps ghc_dnn_make_plan): the execution plans of up to
 * max (<= GHC_DNN_MAX_PLANS) engine configurations that finalize, from heuristics mode A (its
 * first 12), then B (12) and FALLBACK (4), in that order, into plans[] with their workspace
 * bytes in workspaces[]. plans[0] is ghc_dnn_make_plan's plan. The others leave out duplicates
 * (equal JSON forms), plans of more than max_workspace bytes of workspace, nondeterministic
 * engines, engines that sum in reduced precision and, unless rtc, engines that compile at run
 * time (seconds per plan). How many (0
 * with b->st set, as ghc_dnn_make_plan's NULL). */
int ghc_dnn_make_plans(struct ghc_dnn_build *b, cudnnHandle_t handle, bool rtc, int64_t max_workspace, int max,
                       cudnnBackendDescriptor_t *plans, int64_t *workspaces);
/* Destroy descriptor d of b now (a plan not kept); ghc_dnn_free skips it. */
void ghc_dnn_drop(struct ghc_dnn_build *b, cudnnBackendDescriptor_t d);
/* Run a plan on `stream` with the variant pack (uids, ptrs) and workspace. 0 or a cudaError_t. */
int ghc_dnn_execute(cudnnHandle_t h, cudnnBackendDescriptor_t plan, void *stream, int n, const int64_t *uids,
                    void **ptrs, void *workspace);
/* "<status> at <file>:<line>[: cuDNN's last message]" into buf. */
void ghc_dnn_why(char *buf, size_t len, const struct ghc_dnn_build *b, const char *file);

static inline bool ghc_dnn_aligned(const void *p) { return p && ((uintptr_t)p & 15) == 0; }
static inline size_t ghc_dnn_round256(size_t n) { return (n + 255) & ~(size_t)255; }
#endif /* GHC_HAVE_CUDNN */

#endif /* GHC_KERNELS_CUDNN_IMPL_H */
