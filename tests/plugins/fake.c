/* fake.c: test plugins for the loader. Built several times with -DFAKE_NAME=<name> and one
 * FAKE_* switch each, so that every loader failure has a real .so that provokes it. The
 * default build is a well-formed scheduler whose init reads every getter type. */
#include <stdlib.h>
#include <string.h>

#include <gh200core/mempolicy.h>
#include <gh200core/optimizer.h>
#include <gh200core/scheduler.h>

#ifndef FAKE_NAME
#error "FAKE_NAME must name the plugin"
#endif
#define STR_(x) #x
#define STR(x) STR_(x)
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)

struct fake {
    int64_t depth;
    double  alpha;
};

static const struct ghc_cfg_key sub_keys[] = { { "width", GHC_CFG_INT }, { NULL, 0 } };
static const struct ghc_cfg_key fake_keys[] = {
    { "alpha", GHC_CFG_FLOAT }, { "depth", GHC_CFG_INT }, { "label", GHC_CFG_STRING },
    { "enabled", GHC_CFG_BOOL }, { "mode", GHC_CFG_STRING }, { "tags", GHC_CFG_LIST },
    { "weights", GHC_CFG_LIST }, { "sub", GHC_CFG_GROUP }, { NULL, 0 }
};

static int fake_init(ghc_core_t *core, ghc_cfg_t *cfg, void **self)
{
    static const char *const modes[] = { "fast", "exact", NULL };
    struct fake f;
    const char *label;
    bool enabled;
    int mode, n, rc;
    ghc_cfg_t *sub;
    if ((rc = ghc_cfg_get_float(cfg, "alpha", 0.5, 0.0, 1.0, &f.alpha)) < 0 ||
        (rc = ghc_cfg_get_int(cfg, "depth", 4, 1, 64, &f.depth)) < 0 ||
        (rc = ghc_cfg_get_string(cfg, "label", "none", &label)) < 0 ||
        (rc = ghc_cfg_get_bool(cfg, "enabled", true, &enabled)) < 0 ||
        (rc = ghc_cfg_get_choice(cfg, "mode", 0, modes, &mode)) < 0 ||
        (rc = ghc_cfg_list_len(cfg, "tags", &n)) < 0)
        return rc;
    for (int i = 0; i < n; i++) {
        const char *t;
        if ((rc = ghc_cfg_list_string(cfg, "tags", i, &t)) < 0)
            return rc;
    }
    if ((rc = ghc_cfg_list_len(cfg, "weights", &n)) < 0)
        return rc;
    for (int i = 0; i < n; i++) {
        double w;
        if ((rc = ghc_cfg_list_float(cfg, "weights", i, &w)) < 0)
            return rc;
    }
    if ((rc = ghc_cfg_get_group(cfg, "sub", sub_keys, &sub)) < 0)
        return rc;
    if (sub) {
        int64_t width;
        if ((rc = ghc_cfg_get_int(sub, "width", 8, 1, 1024, &width)) < 0)
            return rc;
    }
#ifdef FAKE_INSTANCE_FAIL
    return ghc_error_set(core, GHC_EINVAL, "%s: " STR(FAKE_NAME) ": refusing on purpose", ghc_cfg_where(cfg, NULL));
#endif
    struct fake *p = malloc(sizeof(*p));
    if (!p)
        return ghc_error_set(core, GHC_ENOMEM, "fake: out of memory");
    *p = f;
    *self = p;
    return 0;
}

static int32_t fake_micro_batches(void *self, int64_t step)
{
    return (int32_t)(((struct fake *)self)->depth + step);
}

__attribute__((unused)) static float fake_lr_factor(void *self, int64_t step)
{
    (void)step;
    return (float)((struct fake *)self)->alpha;
}

static void fake_free(void *self) { free(self); }

#ifdef FAKE_BIG_OPS
struct big_ops { struct ghc_scheduler_ops base; void *extra; };
static const struct big_ops big = { .base = { .struct_size = sizeof(struct big_ops), .name = STR(FAKE_NAME),
    .init = fake_init, .micro_batches = fake_micro_batches, .lr_factor = fake_lr_factor } };
#endif

__attribute__((unused)) static const struct ghc_scheduler_ops fake_ops = {
    .struct_size = sizeof(struct ghc_scheduler_ops),
#ifdef FAKE_OPS_NAME
    .name = FAKE_OPS_NAME,
#else
    .name = STR(FAKE_NAME),
#endif
    .keys = fake_keys,
    .init = fake_init,
    .micro_batches = fake_micro_batches,
#ifndef FAKE_NO_REQUIRED
    .lr_factor = fake_lr_factor,
#endif
    .free = fake_free,
};

#ifdef FAKE_SILENT
/* A memory policy whose members fail without a message (breaking the contract): the core's
 * wrappers must give every such failure one. */
static int silent_init(ghc_core_t *core, ghc_cfg_t *cfg, void **self)
{
    (void)core, (void)cfg;
    *self = NULL;
    return 0;
}
static int silent_alloc(void *self, size_t bytes, enum ghc_mem_role role, int device, void **ptr)
{
    (void)self, (void)bytes, (void)role, (void)device, (void)ptr;
    return GHC_ENOMEM;
}
static void silent_release(void *self, void *ptr) { (void)self, (void)ptr; }
static int silent_phase(void *self, enum ghc_mem_phase phase, int64_t index)
{
    (void)self, (void)phase, (void)index;
    return GHC_EIO;
}
static const struct ghc_mempolicy_ops silent_ops = {
    .struct_size = sizeof(struct ghc_mempolicy_ops),
    .name = STR(FAKE_NAME),
    .init = silent_init,
    .alloc = silent_alloc,
    .release = silent_release,
    .phase = silent_phase,
};
#endif

#ifdef FAKE_UNDEFINED
extern int ghc_test_no_such_function(void);   /* never defined: dlopen(RTLD_NOW) must fail */
#endif

static int fake_plugin_init(ghc_core_t *core)
{
#ifdef FAKE_UNDEFINED
    if (ghc_test_no_such_function())
        return -1;
#endif
#ifdef FAKE_INIT_FAIL
    /* a message over several lines, as a plugin might write one: the core folds it */
    return ghc_error_set(core, GHC_EINVAL, "cannot start: no widget attached\n  tried /dev/widget0\n"
                         "  tried /dev/widget1\n");
#elif defined(FAKE_BIG_OPS)
    return ghc_register_scheduler(core, &big.base);
#elif defined(FAKE_SILENT)
    return ghc_register_mempolicy(core, &silent_ops);
#elif defined(FAKE_REGISTER_OPTIMIZER)
    static const struct ghc_optimizer_ops opt = { .struct_size = sizeof(opt), .name = STR(FAKE_NAME) };
    return ghc_register_optimizer(core, &opt);
#else
    return ghc_register_scheduler(core, &fake_ops);
#endif
}

#ifdef FAKE_TINY_SYMBOL
/* a 4-byte object under the descriptor's name (its value the ABI, so that reading on past it
 * would look plausible); the real descriptor is exported as FAKE_SYMBOL */
GHC_PLUGIN_EXPORT const uint32_t CAT(ghc_plugin_, FAKE_NAME) = GHC_PLUGIN_ABI;
#endif

#ifdef FAKE_SYMBOL
#define SYMBOL FAKE_SYMBOL
#else
#define SYMBOL CAT(ghc_plugin_, FAKE_NAME)
#endif

GHC_PLUGIN_EXPORT const struct ghc_plugin SYMBOL = {
#ifdef FAKE_ABI
    .abi = FAKE_ABI,
#else
    .abi = GHC_PLUGIN_ABI,
#endif
#ifdef FAKE_API
    .api = FAKE_API,
#else
    .api = GHC_API_VERSION,
#endif
    .struct_size = sizeof(struct ghc_plugin),
#ifdef FAKE_KINDS
    .kinds = FAKE_KINDS,
#else
    .kinds = GHC_KIND_BIT(GHC_KIND_SCHEDULER),
#endif
#ifdef FAKE_DESC_NAME
    .name = FAKE_DESC_NAME,
#else
    .name = STR(FAKE_NAME),
#endif
    .version = "9.9.9",
    .description = "test plugin " STR(FAKE_NAME),
    .init = fake_plugin_init,
};
