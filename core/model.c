/* model.c: the core wrappers of the run's model instance (model.h): each calls the member of
 * the same name, checks the expert index first, and turns a failure without a message into
 * one that names the model. */
#include <config.h>

#include <string.h>

#include "core_impl.h"

#define M_INST(m) ((struct ghc_instance *)(m))
#define M_OPS(m)  ((const struct ghc_model_ops *)M_INST(m)->ops)
#define M_SELF(m) (M_INST(m)->self)
#define M_NAME(m) (M_OPS(m)->name)

/* A message for a failure the plugin did not explain. */
static int failed(ghc_model_t *m, int rc, const char *what)
{
    ghc_core_t *core = M_INST(m)->core;
    if (rc < 0 && !*ghc_error_message(core))
        ghc_error_set(core, rc, "model \"%s\": %s failed: %s", M_NAME(m), what, ghc_status_string(rc));
    return rc;
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
    ghc_error_clear(M_INST(m)->core);
    return failed(m, M_OPS(m)->targets(M_SELF(m), out, n), "targets");
}

int ghc_model_set_hook(ghc_model_t *m, const struct ghc_adapter_hook *hook)
{
    ghc_error_clear(M_INST(m)->core);
    return failed(m, M_OPS(m)->set_hook(M_SELF(m), hook), "set_hook");
}

int ghc_model_forward(ghc_model_t *m, int32_t expert, const struct ghc_model_batch *batch, ghc_tensor_t *out,
                      bool keep, void *stream)
{
    int rc = check_expert(m, expert, "forward");
    if (rc < 0)
        return rc;
    ghc_error_clear(M_INST(m)->core);
    return failed(m, M_OPS(m)->forward(M_SELF(m), expert, batch, out, keep, stream), "forward");
}

int ghc_model_backward(ghc_model_t *m, int32_t expert, const ghc_tensor_t *dout, ghc_tensor_t *dnoisy, void *stream)
{
    int rc = check_expert(m, expert, "backward");
    if (rc < 0)
        return rc;
    ghc_error_clear(M_INST(m)->core);
    return failed(m, M_OPS(m)->backward(M_SELF(m), expert, dout, dnoisy, stream), "backward");
}

int ghc_model_activate(ghc_model_t *m, int32_t expert)
{
    int rc = check_expert(m, expert, "activate");
    if (rc < 0 || !M_OPS(m)->activate)
        return rc;
    ghc_error_clear(M_INST(m)->core);
    return failed(m, M_OPS(m)->activate(M_SELF(m), expert), "activate");
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
    ghc_error_clear(M_INST(m)->core);
    *b = NULL;
    *w_scale = 1.0f;
    return failed(m, M_OPS(m)->target_weight(M_SELF(m), expert, target, w, w_scale, b), "target_weight");
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
    ghc_error_clear(M_INST(m)->core);
    int rc = failed(m, M_OPS(m)->input_spec(M_SELF(m), out), "input_spec");
    out->struct_size = size;
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
