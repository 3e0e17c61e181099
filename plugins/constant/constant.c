/* constant.c: the `constant` scheduler: a fixed number of micro-batches per optimizer step
 * and the shared lr factor schedule (linear warmup, then constant or cosine decay). */
#include <stdlib.h>

#include <gh200core/scheduler.h>

struct constant {
    int32_t micro_batches;
    struct ghc_lr_schedule lr;
};

static const struct ghc_cfg_key constant_keys[] = {
    { "micro_batches", GHC_CFG_INT, "1", "1 to 65536", NULL },
    GHC_LR_SCHEDULE_KEYS,
    { NULL, 0, NULL, NULL, NULL }
};

static int constant_init(ghc_core_t *core, ghc_cfg_t *cfg, void **self)
{
    int64_t mb;
    struct ghc_lr_schedule lr;
    int rc;
    if ((rc = ghc_cfg_get_int(cfg, "micro_batches", 1, 1, 65536, &mb)) < 0 ||
        (rc = ghc_lr_schedule_read(cfg, &lr)) < 0)
        return rc;
    struct constant *c = malloc(sizeof(*c));
    if (!c)
        return ghc_error_set(core, GHC_ENOMEM, "constant: out of memory");
    c->micro_batches = (int32_t)mb;
    c->lr = lr;
    *self = c;
    return 0;
}

static int32_t constant_micro_batches(void *self, int64_t step)
{
    (void)step;
    return ((struct constant *)self)->micro_batches;
}

static float constant_lr_factor(void *self, int64_t step)
{
    return ghc_lr_schedule_factor(&((const struct constant *)self)->lr, step);
}

static void constant_free(void *self) { free(self); }

static const struct ghc_scheduler_ops constant_ops = {
    .struct_size = sizeof(struct ghc_scheduler_ops),
    .name = "constant",
    .keys = constant_keys,
    .init = constant_init,
    .micro_batches = constant_micro_batches,
    .lr_factor = constant_lr_factor,
    .free = constant_free,
};

static int constant_plugin_init(ghc_core_t *core) { return ghc_register_scheduler(core, &constant_ops); }

GHC_PLUGIN_EXPORT const struct ghc_plugin ghc_plugin_constant = {
    .abi = GHC_PLUGIN_ABI,
    .api = GHC_API_VERSION,
    .struct_size = sizeof(struct ghc_plugin),
    .kinds = GHC_KIND_BIT(GHC_KIND_SCHEDULER),
    .name = "constant",
    .version = GHC_VERSION,
    .description = "fixed micro-batches per step, lr warmup then constant or cosine",
    .init = constant_plugin_init,
};
