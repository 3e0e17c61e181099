/* fuzz_cache.c: libFuzzer target for the persistent cache (the persistent_cache folder of the
 * unified_memory cache, whose table plugins/disk/tcache.c the disk cache shares:
 * one safetensors file per decoded tensor, read back instead of decoding again). A run
 * of one sample of the native fixture dataset (tests/fixtures/data/native, `a`: each batch
 * reads both its tensors, and the prefetch of the next sample finds them held; a second
 * sample would double every input's work and not touch the input) with that cache persisting
 * to a folder (in memory: fuzz_dir) is set up once and reads a batch, which fills the folder;
 * each input then replaces the first file there, and the dataset is opened again (binding
 * the cache drops what it held) and a batch read: the file is used, or found unusable and
 * decoded again. FUZZ_SEED_OUT=FILE: copy that first file there (a seed).
 * Any input: a batch, or one line of message. */
#include "fuzz.h"

#include <dirent.h>
#include <sys/stat.h>

#include <gh200core/dataset.h>

static ghc_core_t *core;
static char target[4400];

static int one_batch(void)
{
    ghc_dataset_t *ds = NULL;
    int rc = ghc_dataset_open(core, &ds);
    if (rc == 0) {
        struct ghc_data_batch b;
        if ((rc = ghc_dataset_next(ds, GHC_DEVICE_CPU, NULL, &b)) == 0)
            ghc_data_batch_release(ds, &b);
    }
    ghc_dataset_free(ds);
    return rc;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    char data[4200], from[4200], cfg[12000];
    snprintf(data, sizeof(data), "%s/data", fuzz_dir());
    mkdir(data, 0700);
    static const char *const files[] = { "a.latent.safetensors", "a.text.safetensors" };
    for (size_t i = 0; i < sizeof(files) / sizeof(*files); i++) {
        snprintf(from, sizeof(from), "%s/tests/fixtures/data/native/%s", fuzz_srcdir(), files[i]);
        fuzz_copy(from, data, files[i]);
    }
    snprintf(cfg, sizeof(cfg), "mempolicy = { plugin = \"host\"; };\n"
             "cache = { plugin = \"unified_memory\"; persistent_cache = \"%s/persist\"; };\n"
             "data = { batch_size = 1; shuffle = false; datasets = ( { path = \"%s\"; } ); };\n", fuzz_dir(), data);
    core = fuzz_run_init(cfg);
    fuzz_must(core, one_batch(), "setup");
    char persist[4200];
    snprintf(persist, sizeof(persist), "%s/persist", fuzz_dir());
    struct dirent **names;
    int n = scandir(persist, &names, NULL, alphasort);
    for (int i = 0; i < n; i++) {
        if (!target[0] && names[i]->d_name[0] != '.')
            snprintf(target, sizeof(target), "%s/%s", persist, names[i]->d_name);
        free(names[i]);
    }
    free(names);
    if (!target[0]) {
        fprintf(stderr, "fuzz: setup: nothing persisted in %s\n", persist);
        abort();
    }
    const char *seed;
    if (fuzz_seed_out(&seed)) {
        char dir[4200];
        snprintf(dir, sizeof(dir), "%s", seed);
        char *slash = strrchr(dir, '/');
        if (!slash)
            abort();
        *slash = '\0';
        fuzz_copy(target, dir, slash + 1);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char dir[4400];
    snprintf(dir, sizeof(dir), "%s", target);
    char *slash = strrchr(dir, '/');
    *slash = '\0';
    char path[4096];
    fuzz_file(dir, slash + 1, data, size, path);
    ghc_error_clear(core);
    fuzz_check(core, one_batch());
    return 0;
}
