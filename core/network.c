/* network.c: the core wrappers of the run's network instance (network.h): each calls the
 * member of the same name, checks the expert index first, and gives a failure without a
 * message one that names the network. */
#include <config.h>

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
