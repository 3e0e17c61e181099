/* model.c: the core wrappers of the run's model instance (model.h): each calls the member of
 * the same name, checks the expert index first, and gives a failure without a message one
 * that names the model. The adapter hook a model gets through ghc_model_set_hook() is the
 * core's: each of its members calls the hook as given and does the same for it, so a model
 * passes on a hook's failure as it is. The plugin-level members (estimate, merge_names) need
 * no instance: their wrappers load the plugin by name. */
#include <config.h>

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "core_impl.h"

#define M_INST(m) ((struct ghc_instance *)(m))
#define M_OPS(m)  ((const struct ghc_model_ops *)M_INST(m)->ops)
#define M_SELF(m) (M_INST(m)->self)
#define M_NAME(m) (M_OPS(m)->name)

/* A wrapper's call starts here: the error buffer cleared (a successful call leaves it empty);
 * returns the point from which the member's own message counts (ghc_error_member). */
static uint64_t begin(ghc_model_t *m)
{
    ghc_error_clear(M_INST(m)->core);
    return ghc_error_seq(M_INST(m)->core);
}

static int failed(ghc_model_t *m, uint64_t seq, int rc, const char *what)
{
    return ghc_error_member(M_INST(m)->core, seq, rc, "model", M_NAME(m), what, NULL);
}

static int check_expert(ghc_model_t *m, int32_t expert, const char *what)
{
    int32_t n = M_OPS(m)->experts(M_SELF(m));
    if (expert < 0 || expert >= n)
        return ghc_error_set(M_INST(m)->core, GHC_EINVAL, "model \"%s\": %s: expert %d out of range (the model has %d)",
                             M_NAME(m), what, (int)expert, (int)n);
    return 0;
}

int32_t ghc_model_experts(ghc_model_t *m)
{
    return M_OPS(m)->experts(M_SELF(m));
}

int32_t ghc_model_expert_for(ghc_model_t *m, float t)
{
    return M_OPS(m)->expert_for(M_SELF(m), t);
}

int ghc_model_targets(ghc_model_t *m, const struct ghc_model_target **out, int32_t *n)
{
    uint64_t seq = begin(m);
    return failed(m, seq, M_OPS(m)->targets(M_SELF(m), out, n), "targets");
}

/* ---- the adapter hook ------------------------------------------------------------------------ */

/* The hook as given to ghc_model_set_hook(), behind the one the model gets. */
struct hook {
    struct ghc_instance    *model;
    struct ghc_adapter_hook inner;
    char                    name[64];   /* the run's network, "" without one */
};

/* A failure of hook member `member` on `target` without a message gets one naming the run's
 * network (the hook's usual source), the member and the target. */
static int hook_failed(struct hook *h, uint64_t seq, int rc, const char *member, int32_t target)
{
    ghc_core_t *core = h->model->core;
    if (rc >= 0 || (ghc_error_seq(core) != seq && *ghc_error_message(core)))
        return rc;   /* success, or the hook said why */
    const struct ghc_model_target *t = NULL;
    int32_t n = 0;
    char on[160], what[80];
    if (M_OPS(h->model)->targets(h->model->self, &t, &n) == 0 && t && target >= 0 && target < n)
        snprintf(on, sizeof(on), "on %s", t[target].name);
    else
        snprintf(on, sizeof(on), "on target %d", (int)target);
    snprintf(what, sizeof(what), "hook %s", member);
    return ghc_error_member(core, ghc_error_seq(core), rc, *h->name ? "network" : "adapter", *h->name ? h->name : NULL,
                            what, on);
}

/* The body of each hook member. */
#define HOOK_CALL(member, ...)                                                                  \
    struct hook *h = user;                                                                      \
    uint64_t seq = ghc_error_seq(h->model->core);                                               \
    return hook_failed(h, seq, h->inner.member(h->inner.user, target, __VA_ARGS__), #member, target)

static int hook_plan(void *user, int32_t target, struct ghc_adapter_plan *out)
{
    HOOK_CALL(plan, out);
}

static int hook_forward(void *user, int32_t target, const ghc_tensor_t *x, ghc_tensor_t *y, bool write, void *stream)
{
    HOOK_CALL(forward, x, y, write, stream);
}

static int hook_backward(void *user, int32_t target, const ghc_tensor_t *x, const ghc_tensor_t *dy,
                         const ghc_tensor_t *g, ghc_tensor_t *dx, bool accumulate, void *stream)
{
    HOOK_CALL(backward, x, dy, g, dx, accumulate, stream);
}

static int hook_fold(void *user, int32_t target, const ghc_tensor_t *w, ghc_tensor_t *wf, void *stream)
{
    HOOK_CALL(fold, w, wf, stream);
}

static int hook_grads(void *user, int32_t target, const ghc_tensor_t *x, const ghc_tensor_t *g, void *stream)
{
    HOOK_CALL(grads, x, g, stream);
}

static int hook_concat_forward(void *user, int32_t target, const ghc_tensor_t *x, ghc_tensor_t *hc,
                               ghc_tensor_t *wcols, bool again, void *stream)
{
    HOOK_CALL(concat_forward, x, hc, wcols, again, stream);
}

static int hook_concat_backward(void *user, int32_t target, const ghc_tensor_t *x, const ghc_tensor_t *hc,
                                const ghc_tensor_t *dy, ghc_tensor_t *g, ghc_tensor_t *dh, ghc_tensor_t *wrows,
                                void *stream)
{
    HOOK_CALL(concat_backward, x, hc, dy, g, dh, wrows, stream);
}

#undef HOOK_CALL

/* The model keeps a copy of the hook it gets (set_hook: "Copied"), so the one it held before
 * can go once it took the new one; if it refuses the new one, it keeps the old. */
int ghc_model_set_hook(ghc_model_t *m, const struct ghc_adapter_hook *hook)
{
    struct hook *h = NULL;
    struct ghc_adapter_hook own;
    if (hook) {
        /* members are only ever appended: a smaller hook lacks the later (optional) ones */
        const size_t need = offsetof(struct ghc_adapter_hook, backward) + sizeof(hook->backward);
        if (hook->struct_size < need || hook->struct_size > sizeof(struct ghc_adapter_hook) || !hook->plan ||
            !hook->forward || !hook->backward)
            return ghc_error_set(M_INST(m)->core, GHC_EINVAL, "model \"%s\": set_hook: an adapter hook of %u bytes "
                                 "(struct_size; expected %zu to %zu) or without plan, forward or backward", M_NAME(m),
                                 (unsigned)hook->struct_size, need, sizeof(struct ghc_adapter_hook));
        if (!(h = calloc(1, sizeof(*h))))
            return ghc_error_set(M_INST(m)->core, GHC_ENOMEM, "model \"%s\": set_hook: out of memory", M_NAME(m));
        const struct ghc_instance *net = M_INST(m)->core->inst[GHC_KIND_NETWORK];
        h->model = M_INST(m);
        memcpy(&h->inner, hook, hook->struct_size);
        h->inner.struct_size = sizeof(h->inner);
        if (net)
            snprintf(h->name, sizeof(h->name), "%s", ((const struct ghc_ops_head *)net->ops)->name);
#define OWN(member) own.member = h->inner.member ? hook_##member : NULL
        own = (struct ghc_adapter_hook){ .struct_size = sizeof(own), .user = h };
        OWN(plan);
        OWN(forward);
        OWN(backward);
        OWN(fold);
        OWN(grads);
        OWN(concat_forward);
        OWN(concat_backward);
#undef OWN
    }
    uint64_t seq = begin(m);
    int rc = failed(m, seq, M_OPS(m)->set_hook(M_SELF(m), hook ? &own : NULL), "set_hook");
    if (rc < 0) {
        free(h);
        return rc;
    }
    free(M_INST(m)->hook);
    M_INST(m)->hook = h;
    return 0;
}

/* ---- forward, backward and the rest ---------------------------------------------------------- */

int ghc_model_forward(ghc_model_t *m, int32_t expert, const struct ghc_model_batch *batch, ghc_tensor_t *out,
                      bool keep, void *stream)
{
    int rc = check_expert(m, expert, "forward");
    if (rc < 0)
        return rc;
    uint64_t seq = begin(m);
    return failed(m, seq, M_OPS(m)->forward(M_SELF(m), expert, batch, out, keep, stream), "forward");
}

int ghc_model_backward(ghc_model_t *m, int32_t expert, const ghc_tensor_t *dout, ghc_tensor_t *dnoisy, void *stream)
{
    int rc = check_expert(m, expert, "backward");
    if (rc < 0)
        return rc;
    uint64_t seq = begin(m);
    return failed(m, seq, M_OPS(m)->backward(M_SELF(m), expert, dout, dnoisy, stream), "backward");
}

int ghc_model_activate(ghc_model_t *m, int32_t expert)
{
    int rc = check_expert(m, expert, "activate");
    if (rc < 0 || !M_OPS(m)->activate)
        return rc;
    uint64_t seq = begin(m);
    return failed(m, seq, M_OPS(m)->activate(M_SELF(m), expert), "activate");
}

int ghc_model_device(ghc_model_t *m)
{
    return M_OPS(m)->device ? M_OPS(m)->device(M_SELF(m)) : GHC_DEVICE_CPU;
}

int ghc_model_target_weight(ghc_model_t *m, int32_t expert, int32_t target, const ghc_tensor_t **w, float *w_scale,
                            const ghc_tensor_t **b)
{
    int rc = check_expert(m, expert, "target_weight");
    if (rc < 0)
        return rc;
    if (!M_OPS(m)->target_weight)
        return ghc_error_set(M_INST(m)->core, GHC_EUNSUPPORTED, "model \"%s\": target_weight: the model does not "
                             "hand out its frozen weights (needed by DoRA)", M_NAME(m));
    uint64_t seq = begin(m);
    *b = NULL;
    *w_scale = 1.0f;
    return failed(m, seq, M_OPS(m)->target_weight(M_SELF(m), expert, target, w, w_scale, b), "target_weight");
}

int ghc_model_input_spec(ghc_model_t *m, struct ghc_model_input *out)
{
    uint32_t size = out->struct_size;
    if (size < sizeof(out->struct_size))
        return ghc_error_set(M_INST(m)->core, GHC_EINVAL, "model \"%s\": input_spec: struct_size %u is too small",
                             M_NAME(m), size);
    memset((char *)out + sizeof(out->struct_size), 0, size - sizeof(out->struct_size));
    if (!M_OPS(m)->input_spec)
        return ghc_error_set(M_INST(m)->core, GHC_EUNSUPPORTED, "model \"%s\": input_spec: the model does not say "
                             "what it takes (the data is checked at the first forward)", M_NAME(m));
    uint64_t seq = begin(m);
    int rc = failed(m, seq, M_OPS(m)->input_spec(M_SELF(m), out), "input_spec");
    out->struct_size = size;
    return rc;
}

const char *ghc_model_expert_name(ghc_model_t *m, int32_t expert)
{
    struct ghc_instance *in = M_INST(m);
    if (expert < 0 || expert >= M_OPS(m)->experts(M_SELF(m)) || expert >= GHC_EXPERT_NAMES)
        return "";
    char *buf = in->expert_name[expert];
    const char *n = M_OPS(m)->expert_name ? M_OPS(m)->expert_name(M_SELF(m), expert) : NULL;
    size_t len = n ? strlen(n) : 0;
    bool ok = len > 0 && len < sizeof(in->expert_name[0]) && strspn(n, "abcdefghijklmnopqrstuvwxyz0123456789_") == len;
    if (n && !ok && !in->expert_name_told++)
        ghc_log(in->core, GHC_LOG_WARN, "model \"%s\": expert_name(%d) is \"%.80s\", not 1 to %zu of [a-z0-9_]: "
                "using \"expert%d\"", M_NAME(m), (int)expert, n, sizeof(in->expert_name[0]) - 1, (int)expert);
    if (ok)
        snprintf(buf, sizeof(in->expert_name[0]), "%s", n);
    else
        snprintf(buf, sizeof(in->expert_name[0]), "expert%d", (int)expert);
    return buf;
}

const char *ghc_model_architecture(ghc_model_t *m)
{
    const char *a = M_OPS(m)->architecture ? M_OPS(m)->architecture(M_SELF(m)) : NULL;
    return a && *a ? a : NULL;
}

/* ---- plugin-level members (no instance) -------------------------------------------------------- */

/* The model ops of plugin `name`, the plugin loaded if needed. */
static int model_ops(ghc_core_t *core, const char *name, const struct ghc_model_ops **ops)
{
    const void *o;
    int rc = ghc_plugin_ops(core, GHC_KIND_MODEL, name, &o);
    *ops = o;
    return rc;
}

/* A plugin-level member the model lacks: what it cannot do, and the member. Returns
 * GHC_EUNSUPPORTED. */
static int lacks(ghc_core_t *core, const char *name, const char *member, const char *cannot)
{
    return ghc_error_set(core, GHC_EUNSUPPORTED, "model \"%s\": cannot %s (the plugin lacks the member %s of struct "
                         "ghc_model_ops, since API 13)", name, cannot, member);
}

int ghc_model_estimate(ghc_core_t *core, const char *model, ghc_cfg_t *cfg, int64_t batch, int64_t tokens,
                       struct ghc_model_memory *out)
{
    const struct ghc_model_ops *ops;
    uint32_t size = out->struct_size;
    int rc;
    if (size < sizeof(out->struct_size))
        return ghc_error_set(core, GHC_EINVAL, "model: estimate: struct_size %u is too small", size);
    memset((char *)out + sizeof(out->struct_size), 0, size - sizeof(out->struct_size));
    if ((rc = model_ops(core, model, &ops)) < 0)
        return rc;
    if (!ops->estimate)
        return lacks(core, model, "estimate", "estimate its memory");
    if (batch < 1 || tokens < 1)
        return ghc_error_set(core, GHC_EINVAL, "model \"%s\": estimate: %lld samples of %lld tokens", model,
                             (long long)batch, (long long)tokens);
    uint64_t seq = ghc_error_seq(core);
    rc = ghc_error_member(core, seq, ops->estimate(core, cfg, batch, tokens, out), "model", model, "estimate", NULL);
    out->struct_size = size;
    return rc;
}

int ghc_model_merge_names(ghc_core_t *core, const char *model, const char *tensor, int32_t ndim,
                          const int64_t *shape, struct ghc_merge_names *out)
{
    const struct ghc_model_ops *ops;
    uint32_t size = out->struct_size;
    int rc;
    if (size < offsetof(struct ghc_merge_names, n) + sizeof(out->n))
        return ghc_error_set(core, GHC_EINVAL, "model: merge_names: struct_size %u is too small", size);
    memset((char *)out + sizeof(out->struct_size), 0, size - sizeof(out->struct_size));
    if ((rc = model_ops(core, model, &ops)) < 0)
        return rc;
    if (!ops->merge_names)
        return lacks(core, model, "merge_names", "name a base checkpoint's modules for merging");
    uint64_t seq = ghc_error_seq(core);
    rc = ghc_error_member(core, seq, ops->merge_names(core, tensor, ndim, shape, out), "model", model, "merge_names",
                          tensor);
    out->struct_size = size;
    if (rc == 0 && (out->n < 0 || out->n > GHC_MERGE_NAMES_MAX))
        rc = ghc_error_set(core, GHC_EINTERNAL, "model \"%s\": merge_names: %d names for '%s' (at most %d)", model,
                           (int)out->n, tensor, GHC_MERGE_NAMES_MAX);
    return rc;
}

int ghc_mem_default_device(ghc_core_t *core)
{
#ifdef GHC_HAVE_CUDA
    ghc_tensor_t *t = ghc_tensor_init(core, GHC_DTYPE_F32, 1, (const int64_t[]){ 1 }, 0, GHC_ROLE_WORKSPACE);
    if (t) {
        ghc_tensor_free(t);
        return 0;
    }
    ghc_error_clear(core);
#else
    (void)core;
#endif
    return GHC_DEVICE_CPU;
}
