/* fuzz_wan22.c: libFuzzer target for the wan22 plugin's detection of a checkpoint's layout,
 * prefix, variant and dimensions from its tensor list (wan22_detect, and the block-index
 * parser under it). The input is a safetensors file's size as 8 bytes (little-endian), then
 * its beginning: the header-length word and the header (the data is not needed to detect);
 * it is opened as a backend's prefix is (ghc_st_open_memory), then detected with the head
 * count derived and with 2 heads. Any input: detected, or one line of message. */
#define FUZZ_PLAIN_INIT
#include "fuzz.h"

#include <gh200core/safetensors.h>

#include "plugins/wan22/wan22_impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 8)
        return 0;
    uint64_t file_size = 0;
    for (int i = 7; i >= 0; i--)
        file_size = file_size << 8 | data[i];
    ghc_error_clear(core);
    ghc_st_t *st = ghc_st_open_memory(core, "fuzz.safetensors", data + 8, size - 8, file_size);
    if (!st) {
        fuzz_check(core, ghc_error_code(core) ? ghc_error_code(core) : -1);
        return 0;
    }
    int n = ghc_st_count(st);
    struct wan22_tensor_desc *desc = calloc((size_t)n + 1, sizeof(*desc));
    struct ghc_st_info *info = calloc((size_t)n + 1, sizeof(*info));
    if (!desc || !info)
        abort();
    for (int i = 0; i < n && ghc_st_info_at(st, i, &info[i]); i++)
        desc[i] = (struct wan22_tensor_desc){ .name = info[i].name, .ndim = info[i].ndim, .shape = info[i].shape };
    for (int heads = 0; heads <= 2; heads += 2) {
        struct wan22_detected det;
        ghc_error_clear(core);
        fuzz_check(core, wan22_detect(core, "fuzz.safetensors", desc, n, heads, &det));
    }
    free(desc);
    free(info);
    ghc_st_free(st);
    return 0;
}
