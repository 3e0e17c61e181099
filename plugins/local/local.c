/* local.c: the `local` backend plugin: dataset directories read in place with pread(). The
 * table lives in the core (core/backend.c), which also falls back to it when a run
 * configures no backend; this plugin makes it selectable as backend = { plugin = "local"; }. */
#include <gh200core/backend.h>

static int local_plugin_init(ghc_core_t *core) { return ghc_register_backend(core, ghc_backend_local_ops()); }

GHC_PLUGIN_EXPORT const struct ghc_plugin ghc_plugin_local = {
    .abi = GHC_PLUGIN_ABI,
    .api = GHC_API_VERSION,
    .struct_size = sizeof(struct ghc_plugin),
    .kinds = GHC_KIND_BIT(GHC_KIND_BACKEND),
    .name = "local",
    .version = GHC_VERSION,
    .description = "dataset directories read in place (pread), entries \"<dataset>/<path>\"",
    .init = local_plugin_init,
};
