/* fuzz_config.c: libFuzzer target for the configuration parser and --set. The input is the
 * configuration text up to the first NUL, then NUL-separated --set arguments (KEY=VALUE). A
 * configuration that loads is written back (resolved.cfg) and its output_dir resolved. Any
 * input: 0, or one line of message with its status. */
#define FUZZ_PLAIN_INIT
#include "fuzz.h"

#include <gh200core/run.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fuzz_text(data, size);
    const char *sets[8];
    int n = 0;
    for (size_t at = strlen(text) + 1; at <= size && n < 8; at += strlen(text + at) + 1)
        sets[n++] = text + at;
    ghc_core_t *run = fuzz_core_init();   /* a fresh core per input: one configuration each */
    int rc = ghc_config_load_string(run, text, "fuzz.cfg", fuzz_dir(), sets, n);
    fuzz_check(run, rc);
    if (rc == 0) {
        char out[4200];
        snprintf(out, sizeof(out), "%s/resolved.cfg", fuzz_dir());
        fuzz_check(run, ghc_config_resolve_output_dir(run));
        fuzz_check(run, ghc_config_write(run, out));
    }
    ghc_core_free(run);
    free(text);
    return 0;
}
