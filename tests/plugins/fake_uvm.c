/* fake_uvm.c: a stand-in for the gh200_uvm plugin's machine probe, for `gh200core diag`'s
 * test on any machine: it reports what the CUDA runtime says where it finds no GPU. The
 * driver's CUDA version comes from $GHC_FAKE_CUDA_DRIVER (default 0: no driver installed);
 * the runtime's is 12.8, and the runtime's message is the one it gives either way. */
#include <math.h>
#include <stdlib.h>

#include <gh200core/mempolicy.h>

static int fake_init(ghc_core_t *core, ghc_cfg_t *cfg, void **self)
{
    (void)cfg;
    *self = NULL;
    return ghc_error_set(core, GHC_EUNSUPPORTED, "gh200_uvm (fake): only the probe is here");
}

static int fake_alloc(void *self, size_t bytes, enum ghc_mem_role role, int device, void **ptr)
{
    (void)self, (void)bytes, (void)role, (void)device;
    *ptr = NULL;
    return GHC_ENOMEM;
}

static void fake_release(void *self, void *ptr)
{
    (void)self, (void)ptr;
}

static int fake_probe(ghc_core_t *core, const struct ghc_probe_opts *opts, struct ghc_probe *out)
{
    (void)core, (void)opts;
    const char *env = getenv("GHC_FAKE_CUDA_DRIVER");
    int drv = env ? atoi(env) : 0, rt = 12080;
    ghc_probe_add(out, "env", "cuda_runtime", GHC_PROBE_INFO, rt, "", "%d.%d", rt / 1000, rt % 1000 / 10);
    ghc_probe_add(out, "env", "cuda_driver_api", GHC_PROBE_INFO, drv, "", "%d.%d", drv / 1000, drv % 1000 / 10);
    ghc_probe_add(out, "gpu", "devices", GHC_PROBE_FAIL, 0, "", "no CUDA device (%s)",
                  drv >= rt ? "no CUDA-capable device is detected"
                            : "CUDA driver version is insufficient for CUDA runtime version");
    ghc_probe_add(out, "gpu", "platform", GHC_PROBE_INFO, NAN, "", "none");
    return 0;
}

static const struct ghc_mempolicy_ops fake_ops = {
    .struct_size = sizeof(struct ghc_mempolicy_ops),
    .name = "gh200_uvm",
    .init = fake_init,
    .alloc = fake_alloc,
    .release = fake_release,
    .probe = fake_probe,
};

static int fake_plugin_init(ghc_core_t *core)
{
    return ghc_register_mempolicy(core, &fake_ops);
}

GHC_PLUGIN_EXPORT const struct ghc_plugin ghc_plugin_gh200_uvm = {
    .abi = GHC_PLUGIN_ABI,
    .api = GHC_API_VERSION,
    .struct_size = sizeof(struct ghc_plugin),
    .kinds = GHC_KIND_BIT(GHC_KIND_MEMPOLICY),
    .name = "gh200_uvm",
    .version = "0",
    .description = "test: the machine probe of a machine without a GPU",
    .init = fake_plugin_init,
};
