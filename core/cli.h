/* cli.h: subcommands of the gh200core CLI that live outside main.c. Each returns 0 or a
 * GHC_E* status with the reason in ghc_error_message(core); main() maps it to an exit code. */
#ifndef GHC_CLI_H
#define GHC_CLI_H

#include <stdio.h>

#include <gh200core/gh200core.h>

/* `gh200core inspect FILE`: the header of a safetensors file (or sharded index): metadata,
 * a table of tensors (name, dtype, shape, bytes), and totals per dtype, printed to `out`. */
int ghc_cli_inspect(ghc_core_t *core, const char *path, FILE *out);

#endif /* GHC_CLI_H */
