/* fuzz_dataset.c: libFuzzer target for dataset discovery and the header of each cache format
 * (native, musubi-tuner, ai-toolkit: file names, pairs, captions, each latent's and text
 * embedding's header against its format). The input is a small archive of files, each record a
 * name (NUL-terminated; '/' allowed for ai-toolkit's cache folders, "." and ".." parts not),
 * a 16-bit little-endian length and that many bytes. They are written to a fresh folder,
 * opened as a dataset (batch of 1, through the core's local backend) and up to 4 batches read.
 * Any input: a dataset, or one line of message. */
#define FUZZ_PLAIN_INIT
#include "fuzz.h"

#include <ftw.h>
#include <sys/stat.h>

#include <gh200core/dataset.h>
#include <gh200core/run.h>

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
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
    char dir[4096], path[4096];
    snprintf(dir, sizeof(dir), "%s/data", fuzz_dir());
    nftw(dir, rm_one, 8, FTW_DEPTH | FTW_PHYS);
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
    ghc_core_t *run = fuzz_core_init();   /* a fresh core per input: one configuration each */
    char cfg[4400];
    snprintf(cfg, sizeof(cfg), "data = { batch_size = 1; datasets = ( { path = \"%s\"; } ); };", dir);
    int rc = ghc_config_load_string(run, cfg, "fuzz.cfg", NULL, NULL, 0);
    if (rc == 0)
        rc = ghc_run_init(run);
    ghc_dataset_t *ds = NULL;
    if (rc == 0)
        rc = ghc_dataset_open(run, &ds);
    fuzz_check(run, rc);
    for (int i = 0; ds && i < 4; i++) {
        struct ghc_data_batch b;
        rc = ghc_dataset_next(ds, GHC_DEVICE_CPU, NULL, &b);
        fuzz_check(run, rc);
        if (rc < 0)
            break;
        ghc_data_batch_release(ds, &b);
    }
    ghc_dataset_free(ds);
    ghc_core_free(run);
    return 0;
}
