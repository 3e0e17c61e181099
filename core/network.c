/* network.c: the core wrappers of the run's network instance (network.h): each calls the
 * member of the same name, checks the expert index first, and gives a failure without a
 * message one that names the network; and those of the plugin-level members, which need no
 * instance: an adapter file opened for merging, the estimate. */
#include <config.h>

#include <stdlib.h>
#include <string.h>

#include "core_impl.h"

#define N_INST(n) ((struct ghc_instance *)(n))
#define N_OPS(n)  ((const struct ghc_network_ops *)N_INST(n)->ops)
#define N_SELF(n) (N_INST(n)->self)
#define N_NAME(n) (N_OPS(n)->name)

static int failed(ghc_network_t *n, uint64_t seq, int rc, const char *what)
{
    return ghc_error_member(N_INST(n)->core, seq, rc, "network", N_NAME(n), what, NULL);
}

/* 0 <= expert, and below the model's expert count when the run has a model. On success the
 * error buffer is left empty for the member that follows. */
static int check_expert(ghc_network_t *n, int32_t expert, const char *what)
{
    ghc_core_t *core = N_INST(n)->core;
    ghc_model_t *model = ghc_model_get(core);
    int32_t have = model ? ghc_model_experts(model) : INT32_MAX;
    if (expert < 0 || expert >= have)
        return ghc_error_set(core, GHC_EINVAL, "network \"%s\": %s: expert %d out of range (the model has %d)",
                             N_NAME(n), what, (int)expert, (int)have);
    ghc_error_clear(core);
    return 0;
}

int ghc_network_attach(ghc_network_t *n, int32_t expert, const struct ghc_model_target *targets, int32_t count)
{
    int rc = check_expert(n, expert, "attach");
    if (rc < 0)
        return rc;
    if (count < 0 || (count > 0 && !targets))
        return ghc_error_set(N_INST(n)->core, GHC_EINVAL, "network \"%s\": attach: %d targets at %p",
                             N_NAME(n), (int)count, (const void *)targets);
    uint64_t seq = ghc_error_seq(N_INST(n)->core);
    return failed(n, seq, N_OPS(n)->attach(N_SELF(n), expert, targets, count), "attach");
}

int ghc_network_hook(ghc_network_t *n, int32_t expert, struct ghc_adapter_hook *out)
{
    int rc = check_expert(n, expert, "hook");
    if (rc < 0)
        return rc;
    memset(out, 0, sizeof(*out));   /* members a plugin does not set stay NULL */
    uint64_t seq = ghc_error_seq(N_INST(n)->core);
    return failed(n, seq, N_OPS(n)->hook(N_SELF(n), expert, out), "hook");
}

int ghc_network_params(ghc_network_t *n, int32_t expert, struct ghc_param **out, int32_t *count)
{
    int rc = check_expert(n, expert, "params");
    if (rc < 0)
        return rc;
    uint64_t seq = ghc_error_seq(N_INST(n)->core);
    return failed(n, seq, N_OPS(n)->params(N_SELF(n), expert, out, count), "params");
}

int ghc_network_save(ghc_network_t *n, int32_t expert, const char *path)
{
    int rc = check_expert(n, expert, "save");
    if (rc < 0)
        return rc;
    uint64_t seq = ghc_error_seq(N_INST(n)->core);
    return failed(n, seq, N_OPS(n)->save(N_SELF(n), expert, path), "save");
}

int ghc_network_load(ghc_network_t *n, int32_t expert, const char *path)
{
    int rc = check_expert(n, expert, "load");
    if (rc < 0)
        return rc;
    if (!N_OPS(n)->load)
        return ghc_error_set(N_INST(n)->core, GHC_EUNSUPPORTED, "network \"%s\": cannot load adapter files (%s)",
                             N_NAME(n), path);
    uint64_t seq = ghc_error_seq(N_INST(n)->core);
    return failed(n, seq, N_OPS(n)->load(N_SELF(n), expert, path), "load");
}

int ghc_network_begin_step(ghc_network_t *n, int64_t step)
{
    if (!N_OPS(n)->begin_step)
        return 0;
    ghc_error_clear(N_INST(n)->core);
    uint64_t seq = ghc_error_seq(N_INST(n)->core);
    return failed(n, seq, N_OPS(n)->begin_step(N_SELF(n), step), "begin_step");
}

/* ---- plugin-level members (no instance) -------------------------------------------------------- */

struct ghc_merge {
    ghc_core_t                   *core;
    const struct ghc_network_ops *ops;       /* the registered copy */
    const char                   *name;      /* the network's, borrowed from ops */
    void                         *adapter;   /* the plugin's */
};

/* The network ops of plugin `name` (loaded if needed). */
static int network_ops(ghc_core_t *core, const char *name, const struct ghc_network_ops **ops)
{
    const void *o;
    int rc = ghc_plugin_ops(core, GHC_KIND_NETWORK, name, &o);
    *ops = o;
    return rc;
}

ghc_merge_t *ghc_merge_open(ghc_core_t *core, const char *network, const char *path)
{
    const struct ghc_network_ops *ops;
    if (network_ops(core, network, &ops) < 0)
        return NULL;
    if (!ops->merge_open || !ops->merge_count || !ops->merge_module || !ops->merge_apply) {
        ghc_error_set(core, GHC_EUNSUPPORTED, "network \"%s\": cannot merge adapter files (the plugin lacks the "
                      "members merge_open, merge_count, merge_module and merge_apply of struct ghc_network_ops, "
                      "since API 13)", network);
        return NULL;
    }
    ghc_merge_t *m = calloc(1, sizeof(*m));
    if (!m) {
        ghc_error_set(core, GHC_ENOMEM, "merge: out of memory");
        return NULL;
    }
    *m = (ghc_merge_t){ .core = core, .ops = ops, .name = ops->name };
    uint64_t seq = ghc_error_seq(core);
    if (ghc_error_member(core, seq, ops->merge_open(core, path, &m->adapter), "network", network, "merge_open",
                         path) < 0) {
        free(m);
        return NULL;
    }
    return m;
}

int32_t ghc_merge_count(const ghc_merge_t *m)
{
    return m->ops->merge_count(m->adapter);
}

int ghc_merge_module(ghc_merge_t *m, int32_t i, struct ghc_merge_module *out)
{
    uint32_t size = out->struct_size;
    if (size < sizeof(out->struct_size))
        return ghc_error_set(m->core, GHC_EINVAL, "network \"%s\": merge_module: struct_size %u is too small",
                             m->name, size);
    memset((char *)out + sizeof(out->struct_size), 0, size - sizeof(out->struct_size));
    if (i < 0 || i >= ghc_merge_count(m))
        return ghc_error_set(m->core, GHC_EINVAL, "network \"%s\": merge_module: module %d out of range (the file "
                             "has %d)", m->name, (int)i, (int)ghc_merge_count(m));
    uint64_t seq = ghc_error_seq(m->core);
    int rc = ghc_error_member(m->core, seq, m->ops->merge_module(m->adapter, i, out), "network", m->name,
                              "merge_module", NULL);
    out->struct_size = size;
    return rc;
}

int ghc_merge_apply(ghc_merge_t *m, int32_t i, ghc_tensor_t *w, float multiplier)
{
    if (i < 0 || i >= ghc_merge_count(m))
        return ghc_error_set(m->core, GHC_EINVAL, "network \"%s\": merge_apply: module %d out of range (the file "
                             "has %d)", m->name, (int)i, (int)ghc_merge_count(m));
    uint64_t seq = ghc_error_seq(m->core);
    return ghc_error_member(m->core, seq, m->ops->merge_apply(m->adapter, i, w, multiplier), "network", m->name,
                            "merge_apply", NULL);
}

const char *ghc_merge_skipped(ghc_merge_t *m, int32_t i)
{
    return m->ops->merge_skipped && i >= 0 ? m->ops->merge_skipped(m->adapter, i) : NULL;
}

void ghc_merge_free(ghc_merge_t *m)
{
    if (!m)
        return;
    if (m->ops->merge_free)
        m->ops->merge_free(m->adapter);
    free(m);
}

int ghc_network_estimate(ghc_core_t *core, const char *network, ghc_cfg_t *cfg, const struct ghc_model_memory *model,
                         struct ghc_network_memory *out)
{
    const struct ghc_network_ops *ops;
    uint32_t size = out->struct_size;
    int rc;
    if (size < sizeof(out->struct_size))
        return ghc_error_set(core, GHC_EINVAL, "network: estimate: struct_size %u is too small", size);
    memset((char *)out + sizeof(out->struct_size), 0, size - sizeof(out->struct_size));
    if ((rc = network_ops(core, network, &ops)) < 0)
        return rc;
    if (!ops->estimate)
        return ghc_error_set(core, GHC_EUNSUPPORTED, "network \"%s\": cannot estimate its memory (the plugin lacks "
                             "the member estimate of struct ghc_network_ops, since API 13)", network);
    uint64_t seq = ghc_error_seq(core);
    rc = ghc_error_member(core, seq, ops->estimate(core, cfg, model, out), "network", network, "estimate", NULL);
    out->struct_size = size;
    return rc;
}
