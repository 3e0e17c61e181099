/* fuzz_dataset.c: libFuzzer target for dataset discovery and the header of each cache format
 * (native, musubi-tuner, ai-toolkit: file names, pairs, captions, each latent's and text
 * embedding's header against its format). The input is a small archive of files, each record a
 * name (NUL-terminated; '/' allowed for ai-toolkit's cache folders, "." and ".." parts not),
 * a 16-bit little-endian length and that many bytes. They are written to a folder emptied
 * first, opened as a dataset (batch of 1, through a local backend of the dataset's own) and up
 * to 4 batches read. The configuration naming that folder is loaded once: a dataset holds
 * nothing of the core's after ghc_dataset_free (no backend or cache instance is configured,
 * ghc_dataset_open makes and frees its own backend, and reads the configuration only).
 * Any input: a dataset, or one line of message. */
#include "fuzz.h"

#include <sys/stat.h>

#include <gh200core/dataset.h>
#include <gh200core/run.h>

static ghc_core_t *core;
static char dir[4096];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    snprintf(dir, sizeof(dir), "%s/data", fuzz_dir());
    if (mkdir(dir, 0700) < 0)
        abort();
    core = fuzz_core_init();
    char cfg[4400];
    snprintf(cfg, sizeof(cfg), "data = { batch_size = 1; datasets = ( { path = \"%s\"; } ); };", dir);
    fuzz_must(core, ghc_config_load_string(core, cfg, "fuzz.cfg", NULL, NULL, 0), "configuration");
    fuzz_must(core, ghc_run_init(core), "run");
    return 0;
}

/* "a/b" with safe parts only: no "", ".", ".." and at most one '/'. */
static bool safe_name(const char *n)
{
    int slashes = 0;
    for (const char *p = n;; p++) {
        const char *e = strchr(p, '/');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (!len || (len == 1 && p[0] == '.') || (len == 2 && p[0] == '.' && p[1] == '.'))
            return false;
        if (!e)
            return true;
        if (++slashes > 1)
            return false;
        p = e;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[4096];
    fuzz_rm_tree(dir);
    if (mkdir(dir, 0700) < 0)
        abort();
    for (size_t at = 0; at < size;) {
        const uint8_t *nul = memchr(data + at, 0, size - at);
        if (!nul || (size_t)(nul - data) + 3 > size)
            break;
        const char *name = (const char *)data + at;
        size_t len = (size_t)nul[1] | (size_t)nul[2] << 8, start = (size_t)(nul - data) + 3;
        if (len > size - start)
            len = size - start;
        at = start + len;
        if (strlen(name) > 200 || !safe_name(name))
            continue;
        const char *slash = strchr(name, '/');
        if (slash) {
            snprintf(path, sizeof(path), "%s/%.*s", dir, (int)(slash - name), name);
            mkdir(path, 0700);
        }
        FILE *f;
        snprintf(path, sizeof(path), "%s/%s", dir, name);
        if ((f = fopen(path, "wb"))) {
            if (len)
                fwrite(data + start, 1, len, f);
            fclose(f);
        }
    }
    ghc_error_clear(core);
    ghc_dataset_t *ds = NULL;
    int rc = ghc_dataset_open(core, &ds);
    fuzz_check(core, rc);
    for (int i = 0; ds && i < 4; i++) {
        struct ghc_data_batch b;
        rc = ghc_dataset_next(ds, GHC_DEVICE_CPU, NULL, &b);
        fuzz_check(core, rc);
        if (rc < 0)
            break;
        ghc_data_batch_release(ds, &b);
    }
    ghc_dataset_free(ds);
    return 0;
}
