/* estimate.c: the network's estimate member (network.h): what the adapters of a training run
 * will take, for `gh200core estimate`, from the configuration alone (rank, or kohya's
 * linear_dim) and the shapes of the model's targets. Counted as LoRA's factors for every
 * algorithm: rank (in + out) f32 values per target and expert, as many gradients. */
#include <config.h>

#include <stdio.h>
#include <string.h>

#include "lycoris_impl.h"

int lyc_estimate(ghc_core_t *core, ghc_cfg_t *cfg, const struct ghc_model_memory *model,
                 struct ghc_network_memory *out)
{
    (void)core;
    int64_t rank = 16;
    int rc;
    if (cfg && ghc_cfg_has(cfg, "rank") && (rc = ghc_cfg_get_int(cfg, "rank", 16, 1, 65536, &rank)) < 0)
        return rc;
    if (cfg && ghc_cfg_has(cfg, "linear_dim") && (rc = ghc_cfg_get_int(cfg, "linear_dim", 16, 1, 65536, &rank)) < 0)
        return rc;
    uint64_t values = 0;   /* per expert */
    for (int32_t i = 0; i < model->n_shapes && i < GHC_MODEL_MEMORY_SHAPES; i++) {
        const struct ghc_target_shape *s = &model->shapes[i];
        values += (uint64_t)s->count * (uint64_t)rank * (uint64_t)(s->in_features + s->out_features);
    }
    struct ghc_network_memory m = { .struct_size = out->struct_size };
    m.params = values * 4 * (uint64_t)(model->experts > 0 ? model->experts : 1);
    m.grads = m.params;
    snprintf(m.summary, sizeof(m.summary), "rank %lld", (long long)rank);
    memcpy(out, &m, out->struct_size < sizeof(m) ? out->struct_size : sizeof(m));
    return 0;
}
