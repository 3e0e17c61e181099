/* test_in_memory.c: the in_memory backend on hostile .ghz files (plugins/in_memory): every size
 * field of the frame is checked without overflow, so a header that lies about its raw size or
 * its blocks is refused at staging with a message naming the file, and never read past.
 * The dataset-level tests of the backend are in test_data.c. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gh200core/gh200core.h>

#include "testutil.h"
#include "../plugins/in_memory/codec.h"   /* defines: ghz_encode, GHZ_HEAD */

static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }

static void write_bytes(const char *dir, const char *name, const void *p, size_t n)
{
    char path[4200];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(p, 1, n, f), n);
    fclose(f);
}

/* The run's in_memory backend with `dir` mounted as root 0. */
static ghc_core_t *mounted(const char *dir, ghc_backend_t **out)
{
    ghc_core_t *core = ghc_core_init();
    ck_assert_ptr_nonnull(core);
    ck_assert_int_eq(ghc_plugin_add_path(core, tu_env("GHC_BUILD_PLUGINS")), 0);
    int rc = ghc_config_load_string(core, "backend = { plugin = \"in_memory\"; num_workers = 2; progress_seconds = 0.0; };",
                                    "t.cfg", dir, NULL, 0);
    ck_assert_msg(rc == 0, "config: %s", ghc_error_message(core));
    rc = ghc_run_init(core);
    ck_assert_msg(rc == 0, "run: %s", ghc_error_message(core));
    ghc_backend_t *b = ghc_backend_get(core);
    ck_assert_ptr_nonnull(b);
    ck_assert_str_eq(ghc_backend_name(b), "in_memory");
    struct ghc_backend_root root = { .path = dir, .compression = GHC_COMPRESSION_NONE };
    rc = ghc_backend_mount(b, &root, 1);
    ck_assert_msg(rc == 0, "mount: %s", ghc_error_message(core));   /* a bad file is reported when read */
    *out = b;
    return core;
}

/* `name` (without .ghz) is refused by stat and read with GHC_EFORMAT and a message naming the
 * file and containing `what`; nothing is read. */
static void refused(ghc_core_t *core, ghc_backend_t *b, const char *name, const char *what)
{
    char entry[256];
    snprintf(entry, sizeof(entry), "0/%s", name);
    uint64_t size = 12345;
    int rc = ghc_backend_stat(b, entry, &size);
    ck_assert_msg(rc == GHC_EFORMAT, "stat %s: rc %d, size %llu (%s)", entry, rc, (unsigned long long)size,
                  ghc_error_message(core));
    const char *msg = ghc_error_message(core);
    ck_assert_msg(strstr(msg, name) && strstr(msg, ".ghz") && strstr(msg, what), "stat %s: %s", entry, msg);
    static uint8_t buf[1 << 16];
    size_t got = 7;
    rc = ghc_backend_read(b, entry, 0, buf, sizeof(buf), &got);
    ck_assert_msg(rc == GHC_EFORMAT, "read %s: rc %d, got %zu (%s)", entry, rc, got, ghc_error_message(core));
    ck_assert_uint_eq(got, 0);
    msg = ghc_error_message(core);
    ck_assert_msg(strstr(msg, name) && strstr(msg, what), "read %s: %s", entry, msg);
}

/* The file: 32 bytes, raw size 2^64-1, no blocks: raw + block - 1 wrapped to a block
 * count of 0, the header passed and im_read wrote past its buffer. */
START_TEST(test_ghz_raw_size_overflow)
{
    char *dir = tu_tmpdir();
    uint8_t h[GHZ_HEAD] = { 0 };
    memcpy(h, GHZ_MAGIC, 4);
    for (int c = 0; c < GHC_COMPRESSION_COUNT; c++) {
        char name[64];
        h[4] = (uint8_t)c;
        put32(h + 8, 4096);
        put64(h + 12, UINT64_MAX);
        put32(h + 20, 0);
        snprintf(name, sizeof(name), "huge%d.bin.ghz", c);
        write_bytes(dir, name, h, sizeof(h));
        /* a block of 2^31: the same wrap with one block of 2^32 - 1 */
        put32(h + 8, 1u << 31);
        snprintf(name, sizeof(name), "bigblock%d.bin.ghz", c);
        write_bytes(dir, name, h, sizeof(h));
        /* no block at all */
        put32(h + 8, 0);
        put64(h + 12, 16);
        snprintf(name, sizeof(name), "zeroblock%d.bin.ghz", c);
        write_bytes(dir, name, h, sizeof(h));
    }
    ghc_backend_t *b;
    ghc_core_t *core = mounted(dir, &b);
    for (int c = 0; c < GHC_COMPRESSION_COUNT; c++) {
        char name[64];
        snprintf(name, sizeof(name), "huge%d.bin", c);
        refused(core, b, name, "inconsistent .ghz header");
        snprintf(name, sizeof(name), "bigblock%d.bin", c);
        refused(core, b, name, "inconsistent .ghz header");
        snprintf(name, sizeof(name), "zeroblock%d.bin", c);
        refused(core, b, name, "inconsistent .ghz header");
    }
    struct ghc_backend_stats st = { .struct_size = sizeof(st) };
    ck_assert_int_eq(ghc_backend_stats(b, &st), 0);
    ck_assert_msg(st.raw_bytes == 0, "raw bytes %llu: a refused header's size was believed",
                  (unsigned long long)st.raw_bytes);
    ghc_core_free(core);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* A block table that cannot hold the raw size: more blocks than the raw size needs, a table
 * past the end of the file, a block that claims more than its codec can expand to. */
START_TEST(test_ghz_bad_tables)
{
    char *dir = tu_tmpdir();
    uint8_t f[GHZ_HEAD + 8 + 16] = { 0 };
    memcpy(f, GHZ_MAGIC, 4);
    /* 2^32 - 1 blocks of a table that is not in the file */
    f[4] = GHC_COMPRESSION_NONE;
    put32(f + 8, 1);
    put64(f + 12, UINT32_MAX);
    put32(f + 20, UINT32_MAX);
    write_bytes(dir, "table.bin.ghz", f, GHZ_HEAD);
    /* 3 blocks for 16 bytes in blocks of 16 */
    put32(f + 8, 16);
    put64(f + 12, 16);
    put32(f + 20, 3);
    write_bytes(dir, "count.bin.ghz", f, GHZ_HEAD);
    /* one lz4 block of 1 byte claiming 1 MiB */
    f[4] = GHC_COMPRESSION_LZ4;
    put32(f + 8, 1u << 20);
    put64(f + 12, 1u << 20);
    put32(f + 20, 1);
    put32(f + GHZ_HEAD, 1);
    write_bytes(dir, "ratio.bin.ghz", f, GHZ_HEAD + 8 + 1);
    /* a block size over the 1 GiB bound */
    f[4] = GHC_COMPRESSION_NONE;
    put32(f + 8, 0xffffffffu);
    put64(f + 12, 16);
    put32(f + 20, 1);
    put32(f + GHZ_HEAD, 16);
    write_bytes(dir, "block.bin.ghz", f, GHZ_HEAD + 8 + 16);
    ghc_backend_t *b;
    ghc_core_t *core = mounted(dir, &b);
    refused(core, b, "table.bin", "inconsistent .ghz header");
    refused(core, b, "count.bin", "inconsistent .ghz header");
    refused(core, b, "ratio.bin", "more than lz4 can give");
    refused(core, b, "block.bin", "inconsistent .ghz header");
    ghc_core_free(core);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* Good files of every codec still read back, whole and in pieces across blocks. */
START_TEST(test_ghz_round_trip)
{
    char *dir = tu_tmpdir();
    enum { N = 5000 };
    static uint8_t raw[N];
    for (int i = 0; i < N; i++)
        raw[i] = (uint8_t)(i * 7 / 13);
    for (int c = 0; c < GHC_COMPRESSION_COUNT; c++) {
        void *z;
        size_t zl;
        char name[64];
        ck_assert_int_eq(ghz_encode((enum ghc_compression)c, 1024, raw, N, &z, &zl), 0);
        snprintf(name, sizeof(name), "good%d.bin.ghz", c);
        write_bytes(dir, name, z, zl);
        free(z);
    }
    void *z = NULL;
    size_t zl = 0;
    ck_assert_int_eq(ghz_encode(GHC_COMPRESSION_LZ4, 0, raw, N, &z, &zl), -1);
    ck_assert_int_eq(ghz_encode(GHC_COMPRESSION_LZ4, 0xffffffffu, raw, N, &z, &zl), -1);
    ghc_backend_t *b;
    ghc_core_t *core = mounted(dir, &b);
    for (int c = 0; c < GHC_COMPRESSION_COUNT; c++) {
        char entry[64];
        snprintf(entry, sizeof(entry), "0/good%d.bin", c);
        uint64_t size = 0;
        ck_assert_msg(ghc_backend_stat(b, entry, &size) == 0, "%s", ghc_error_message(core));
        ck_assert_uint_eq(size, N);
        static uint8_t got_buf[N + 100];
        size_t got = 0;
        ck_assert_msg(ghc_backend_read(b, entry, 0, got_buf, sizeof(got_buf), &got) == 0, "%s", ghc_error_message(core));
        ck_assert_uint_eq(got, N);
        ck_assert(memcmp(got_buf, raw, N) == 0);
        ck_assert_int_eq(ghc_backend_read(b, entry, 1000, got_buf, 2000, &got), 0);
        ck_assert_uint_eq(got, 2000);
        ck_assert(memcmp(got_buf, raw + 1000, 2000) == 0);
    }
    ghc_core_free(core);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("in_memory");
    TCase *tc = tcase_create("ghz");
    tcase_add_test(tc, test_ghz_raw_size_overflow);
    tcase_add_test(tc, test_ghz_bad_tables);
    tcase_add_test(tc, test_ghz_round_trip);
    tcase_set_timeout(tc, 60);
    suite_add_tcase(s, tc);
    return tu_run_suite(s, false);
}
