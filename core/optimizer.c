/* optimizer.c: the core wrappers of the run's optimizer instance (optimizer.h): each calls the
 * member of the same name; a NULL optional member is a successful no-op (lr: 0); a failure
 * without a message gets one that names the optimizer. */
#include <config.h>

#include "core_impl.h"

#define O_INST(o) ((struct ghc_instance *)(o))
#define O_OPS(o)  ((const struct ghc_optimizer_ops *)O_INST(o)->ops)
#define O_SELF(o) (O_INST(o)->self)
#define O_NAME(o) (O_OPS(o)->name)

/* A wrapper's call starts here: the error buffer cleared (a successful call leaves it empty);
 * returns the point from which the member's own message counts (ghc_error_member). */
static uint64_t begin(ghc_optimizer_t *o)
{
    ghc_error_clear(O_INST(o)->core);
    return ghc_error_seq(O_INST(o)->core);
}

static int failed(ghc_optimizer_t *o, uint64_t seq, int rc, const char *what)
{
    return ghc_error_member(O_INST(o)->core, seq, rc, "optimizer", O_NAME(o), what, NULL);
}

int ghc_optimizer_add_params(ghc_optimizer_t *o, struct ghc_param *params, int32_t n)
{
    if (n < 0 || (n > 0 && !params))
        return ghc_error_set(O_INST(o)->core, GHC_EINVAL, "optimizer \"%s\": add_params: %d params at %p", O_NAME(o),
                             (int)n, (void *)params);
    uint64_t seq = begin(o);
    return failed(o, seq, O_OPS(o)->add_params(O_SELF(o), params, n), "add_params");
}

int ghc_optimizer_step(ghc_optimizer_t *o, int32_t group, int64_t step, float lr_factor, void *stream)
{
    uint64_t seq = begin(o);
    return failed(o, seq, O_OPS(o)->step(O_SELF(o), group, step, lr_factor, stream), "step");
}

float ghc_optimizer_lr(ghc_optimizer_t *o, int32_t group)
{
    return O_OPS(o)->lr ? O_OPS(o)->lr(O_SELF(o), group) : 0.0f;
}

int ghc_optimizer_save(ghc_optimizer_t *o, const char *path)
{
    if (!O_OPS(o)->save)
        return 0;
    uint64_t seq = begin(o);
    return failed(o, seq, O_OPS(o)->save(O_SELF(o), path), "save");
}

int ghc_optimizer_load(ghc_optimizer_t *o, const char *path)
{
    if (!O_OPS(o)->load)
        return 0;
    uint64_t seq = begin(o);
    return failed(o, seq, O_OPS(o)->load(O_SELF(o), path), "load");
}
