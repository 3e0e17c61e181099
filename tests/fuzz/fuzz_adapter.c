/* fuzz_adapter.c: libFuzzer target for the adapter loader (the lycoris network's load: LoRA,
 * LoHa, LoKr, DoRA keys, shapes, alphas, ComfyUI names). A run is set up once as
 * test_lycoris sets it up (the wan22 fixture model, lora rank 4 on all its targets, the
 * plugins of tests/fuzz/plugins, instrumented); each input is an adapter file loaded into expert 0.
 * FUZZ_SEED_OUT=FILE: save the network's own adapter there first (a seed). Any input: loaded,
 * or one line of message. */
#include "fuzz.h"

#include <gh200core/model.h>
#include <gh200core/network.h>
#include <gh200core/run.h>

static ghc_core_t *core;
static ghc_network_t *net;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    char cfg[8192];
    snprintf(cfg, sizeof(cfg),
             "mempolicy = { plugin = \"host\"; };\n"
             "model = { plugin = \"wan22\"; checkpoint = \"%s/tests/fixtures/wan22/weights_official.safetensors\"; "
             "heads = 2; dtype = \"f32\"; device = -1; };\n"
             "network = { plugin = \"lycoris\"; algo = \"lora\"; rank = 4; alpha = 2.0; };\n", fuzz_srcdir());
    core = fuzz_run_init(cfg);
    const struct ghc_model_target *tg;
    int32_t ntg;
    net = ghc_network_get(core);
    fuzz_must(core, ghc_model_targets(ghc_model_get(core), &tg, &ntg), "targets");
    fuzz_must(core, ghc_network_attach(net, 0, tg, ntg), "attach");
    const char *seed;
    if (fuzz_seed_out(&seed))
        fuzz_must(core, ghc_network_save(net, 0, seed), "seed");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[4096];
    fuzz_file(fuzz_dir(), "adapter.safetensors", data, size, path);
    ghc_error_clear(core);
    fuzz_check(core, ghc_network_load(net, 0, path));
    return 0;
}
