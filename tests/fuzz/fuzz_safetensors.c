/* fuzz_safetensors.c: libFuzzer target for the safetensors header parser. Each input is a
 * whole file: it goes to a memfd (a file with no name on disk), is opened with ghc_st_open
 * (mapping and full header validation), every entry is read back and `inspect` prints it to
 * /dev/null. Any input must give a handle or a one-line GHC_EFORMAT, never a crash, leak or
 * out-of-bounds read. Build and run: tests/fuzz/README.md. */
#define FUZZ_PLAIN_INIT
#include "fuzz.h"

#include <gh200core/safetensors.h>

#include "core/cli.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static FILE *devnull;
    if (!devnull && !(devnull = fopen("/dev/null", "w")))
        abort();
    char path[64];
    int fd = fuzz_memfd(data, size, path);

    ghc_error_clear(core);
    ghc_st_t *st = ghc_st_open(core, path);
    if (st) {
        struct ghc_st_info in;
        for (int i = 0; ghc_st_info_at(st, i, &in); i++) {
            const uint8_t *raw = ghc_st_raw(st, in.name);
            volatile uint8_t sink = 0;
            if (in.nbytes)                       /* first and last byte are inside the map */
                sink = (uint8_t)(raw[0] ^ raw[in.nbytes - 1]);
            (void)sink;
            if (ghc_dtype_is_float(in.dtype) && in.nbytes <= (1u << 16)) {
                ghc_tensor_t *t = ghc_st_load(st, in.name, GHC_DTYPE_F32, GHC_ROLE_WORKSPACE);
                ghc_tensor_free(t);
            }
        }
        const char *k, *v;
        for (int i = 0; ghc_st_metadata_at(st, i, &k, &v); i++)
            if (ghc_st_metadata(st, k) == NULL)
                abort();
        ghc_st_free(st);
    } else {
        const char *msg = ghc_error_message(core);
        int code = ghc_error_code(core);
        if ((code != GHC_EFORMAT && code != GHC_ENOMEM) || strchr(msg, '\n') || !*msg)
            abort();                              /* every bad input: one line of EFORMAT */
    }
    ghc_cli_inspect(core, path, devnull);
    close(fd);
    return 0;
}
