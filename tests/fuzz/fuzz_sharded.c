/* fuzz_sharded.c: libFuzzer target for a sharded checkpoint's .safetensors.index.json. The
 * input is the index, written beside copies of the two fixture shards
 * (tests/fixtures/sharded); it is opened with ghc_st_open and every tensor it maps is read
 * back. Any input: a handle, or one line of message (a shard name that leaves the folder is
 * refused, never opened). */
#include "fuzz.h"

#include <gh200core/safetensors.h>

static ghc_core_t *core;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    core = fuzz_core_init();
    char from[4096];
    static const char *const shards[] = { "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors" };
    for (int i = 0; i < 2; i++) {
        snprintf(from, sizeof(from), "%s/tests/fixtures/sharded/%s", fuzz_srcdir(), shards[i]);
        fuzz_copy(from, fuzz_dir(), shards[i]);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[4096];
    fuzz_file(fuzz_dir(), "model.safetensors.index.json", data, size, path);
    ghc_error_clear(core);
    ghc_st_t *st = ghc_st_open(core, path);
    if (!st) {
        fuzz_check(core, ghc_error_code(core) ? ghc_error_code(core) : -1);
        return 0;
    }
    struct ghc_st_info in;
    for (int i = 0; ghc_st_info_at(st, i, &in); i++) {
        const uint8_t *raw = ghc_st_raw(st, in.name);
        volatile uint8_t sink = 0;
        if (in.nbytes)
            sink = (uint8_t)(raw[0] ^ raw[in.nbytes - 1]);
        (void)sink;
    }
    const char *k, *v;
    for (int i = 0; ghc_st_metadata_at(st, i, &k, &v); i++)
        if (!ghc_st_metadata(st, k))
            abort();
    ghc_st_free(st);
    return 0;
}
