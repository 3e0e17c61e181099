/* fuzz_trainer_state.c: libFuzzer target for a checkpoint's trainer.json, read as a resume
 * reads it (read_state of core/checkpoint.c, compiled in: it is static) into a trainer of one
 * adapter in the first mode. Any input: read, or one line of message. */
#define FUZZ_PLAIN_INIT
#include "fuzz.h"

#include "core/checkpoint.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[4096];
    fuzz_file(fuzz_dir(), "trainer.json", data, size, path);
    static struct ghc_trainer tr;
    memset(&tr, 0, sizeof(tr));
    tr.core = core;
    tr.n_adapters = 1;
    tr.c.steps = INT64_C(1) << 40;   /* a step range wide enough to reach the other fields */
    ghc_error_clear(core);
    fuzz_check(core, read_state(&tr, fuzz_dir(), path));   /* not a checkpoint-N folder: no name check */
    return 0;
}
