/* fuzz_optimizer.c: libFuzzer target for an optimizer state file (optimizer.safetensors of a
 * checkpoint: adamw's exp_avg / exp_avg_sq per param, step counts, metadata), loaded into an
 * adamw instance (tests/fuzz/plugins, instrumented) holding two params, "a" [2, 3] and "b"
 * [4]. FUZZ_SEED_OUT=FILE: save the instance's own state there first (a seed). Any input:
 * loaded (all or nothing), or one line of message. */
#include "fuzz.h"

#include <gh200core/network.h>
#include <gh200core/optimizer.h>
#include <gh200core/run.h>
#include <gh200core/tensor.h>

static ghc_core_t *core;
static ghc_optimizer_t *opt;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    core = fuzz_run_init("mempolicy = { plugin = \"host\"; };\noptimizer = { plugin = \"adamw\"; };\n");
    if (!(opt = ghc_optimizer_get(core)))
        abort();
    static struct ghc_param params[2];
    static const int64_t sa[2] = { 2, 3 }, sb[1] = { 4 };
    static const char *const names[2] = { "a", "b" };
    for (int i = 0; i < 2; i++) {
        int nd = i ? 1 : 2;
        const int64_t *sh = i ? sb : sa;
        params[i] = (struct ghc_param){ names[i],
            ghc_tensor_init(core, GHC_DTYPE_F32, nd, sh, GHC_DEVICE_CPU, GHC_ROLE_ADAPTER),
            ghc_tensor_init(core, GHC_DTYPE_F32, nd, sh, GHC_DEVICE_CPU, GHC_ROLE_GRADS), 0 };
        if (!params[i].value || !params[i].grad)
            abort();
    }
    fuzz_must(core, ghc_optimizer_add_params(opt, params, 2), "add_params");
    const char *seed;
    if (fuzz_seed_out(&seed))
        fuzz_must(core, ghc_optimizer_save(opt, seed), "seed");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[4096];
    fuzz_file(fuzz_dir(), "optimizer.safetensors", data, size, path);
    ghc_error_clear(core);
    fuzz_check(core, ghc_optimizer_load(opt, path));
    return 0;
}
