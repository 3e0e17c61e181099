/* bench_data.c: staging throughput of the in_memory backend per compression against plain
 * sequential reads (open, read, close: what `cat` does) of the same files in the same run,
 * and the read throughput out of RAM afterwards.
 *
 *     bench/bench_data [FILES [MIB_PER_FILE [DIR]]]      (defaults: 2000 files of 1 MiB)
 *
 * The files hold bf16-like data (random mantissas, a few exponents), so they compress about
 * as real latents do. They are written first, so every pass reads them from the page cache:
 * the figures compare the backends' own costs, not the disk. Needs GHC_PLUGIN_PATH (or
 * --plugin-path semantics: the build's plugins/.libs). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <gh200core/gh200core.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

int main(int argc, char **argv)
{
    int files = argc > 1 ? atoi(argv[1]) : 2000;
    size_t size = (size_t)(argc > 2 ? atof(argv[2]) : 1.0) * 1048576;
    char dir[4096];
    snprintf(dir, sizeof(dir), "%s", argc > 3 ? argv[3] : "/tmp/ghc-bench-data-XXXXXX");
    if (argc <= 3 && !mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    const char *plugins = getenv("GHC_BUILD_PLUGINS") ? getenv("GHC_BUILD_PLUGINS") : "plugins/.libs";
    uint16_t *buf = malloc(size);
    for (int f = 0; f < files; f++) {
        for (size_t i = 0; i < size / 2; i++) {   /* bf16: sign, exponent 120..127, random mantissa */
            uint64_t r = next_rand();
            buf[i] = (uint16_t)(((r >> 8) & 1) << 15 | (120 + (r >> 9) % 8) << 7 | (r & 0x7f));
        }
        char p[4200];
        snprintf(p, sizeof(p), "%s/f%05d.bin", dir, f);
        FILE *o = fopen(p, "wb");
        if (!o || fwrite(buf, 1, size, o) != size) {
            perror(p);
            return 1;
        }
        fclose(o);
    }
    double total = (double)files * (double)size;
    /* sequential reads, cat-like */
    double t0 = now_s();
    for (int f = 0; f < files; f++) {
        char p[4200];
        snprintf(p, sizeof(p), "%s/f%05d.bin", dir, f);
        int fd = open(p, O_RDONLY);
        size_t done = 0;
        ssize_t k;
        while (fd >= 0 && (k = read(fd, (char *)buf + done, size - done)) > 0)
            done += (size_t)k;
        if (fd >= 0)
            close(fd);
    }
    double seq = now_s() - t0;
    printf("files: %d x %.2f MiB = %.2f GiB in %s (page cache warm)\n", files, (double)size / 1048576, total / 1073741824, dir);
    printf("%-28s %10s %10s %8s %12s\n", "pass", "seconds", "GB/s", "ratio", "read GB/s");
    printf("%-28s %10.3f %10.2f %8s %12s\n", "sequential read (1 thread)", seq, total / seq / 1e9, "-", "-");
    static const char *const comps[] = { "none", "lz4", "zlib", "snappy" };
    int rc = 0;
    for (int c = 0; c < 4; c++) {
        ghc_core_t *core = ghc_core_init();
        char cfg[8400];
        snprintf(cfg, sizeof(cfg), "backend = { plugin = \"in_memory\"; progress_seconds = 0.0; };");
        enum ghc_compression comp;
        ghc_compression_from_name(comps[c], &comp);
        struct ghc_backend_root root = { .path = dir, .compression = comp };
        if (ghc_plugin_add_path(core, plugins) || ghc_config_load_string(core, cfg, "bench.cfg", NULL, NULL, 0) ||
            ghc_run_init(core) || ghc_backend_mount(ghc_backend_get(core), &root, 1)) {
            fprintf(stderr, "bench_data: %s\n", ghc_error_message(core));
            ghc_core_free(core);
            rc = 1;
            break;
        }
        struct ghc_backend_stats st;
        ghc_backend_stats(ghc_backend_get(core), &st);
        double r0 = now_s();
        for (int f = 0; f < files; f++) {
            char name[64];
            size_t got;
            snprintf(name, sizeof(name), "0/f%05d.bin", f);
            ghc_backend_read(ghc_backend_get(core), name, 0, buf, size, &got);
        }
        double rd = now_s() - r0;
        char label[64];
        snprintf(label, sizeof(label), "in_memory %s (staging)", comps[c]);
        printf("%-28s %10.3f %10.2f %8.3f %12.2f\n", label, st.stage_seconds, total / st.stage_seconds / 1e9,
               (double)st.stored_bytes / (double)st.raw_bytes, total / rd / 1e9);
        ghc_core_free(core);
    }
    if (argc <= 3) {
        char cmd[4200];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
        if (system(cmd) != 0)
            rc = 1;
    }
    free(buf);
    return rc;
}
