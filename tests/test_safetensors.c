/* test_safetensors.c: the safetensors reader and writer against files Python's `safetensors`
 * wrote (tests/fixtures, made by make_safetensors_fixtures.py): every dtype with known bit
 * patterns, conversion on load against numpy/ml_dtypes rounding, a sharded checkpoint, the
 * writer byte for byte against Python's output, atomic replacement, the broken-file corpus
 * (tests/data/broken, made by make_broken_corpus.py) and `inspect`'s output. */
#include <dirent.h>
#include <math.h>
#include <sys/stat.h>

#include <gh200core/gh200core.h>
#include <gh200core/safetensors.h>

#include "../core/cli.h"
#include "testutil.h"

/* ---- helpers ------------------------------------------------------------------------------ */

static char *fixture(const char *name)
{
    const char *top = tu_env("GHC_TOP_SRCDIR");
    char *p = malloc(strlen(top) + strlen(name) + 32);
    ck_assert_ptr_nonnull(p);
    sprintf(p, "%s/tests/fixtures/%s", top, name);
    return p;
}

static ghc_st_t *open_ok(ghc_core_t *core, const char *path)
{
    ghc_st_t *st = ghc_st_open(core, path);
    ck_assert_msg(st != NULL, "open %s: %s", path, ghc_error_message(core));
    return st;
}

static void expect_msg(ghc_core_t *core, const char *what)
{
    const char *msg = ghc_error_message(core);
    ck_assert_msg(strstr(msg, what) != NULL, "message lacks '%s': %s", what, msg);
    ck_assert_msg(strchr(msg, '\n') == NULL, "message is not one line: %s", msg);
}

static void expect_info(ghc_st_t *st, const char *name, enum ghc_dtype dt, int ndim,
                        const int64_t *shape, uint64_t nbytes)
{
    struct ghc_st_info in;
    ck_assert_msg(ghc_st_find(st, name, &in), "no tensor %s", name);
    ck_assert_str_eq(in.name, name);
    ck_assert_msg(in.dtype == dt, "%s: dtype %s", name, ghc_dtype_name(in.dtype));
    ck_assert_int_eq(in.ndim, ndim);
    for (int i = 0; i < ndim; i++)
        ck_assert_int_eq(in.shape[i], shape[i]);
    ck_assert_uint_eq(in.nbytes, nbytes);
}

/* Bytes of a file (caller frees), length in *len. */
static unsigned char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot read %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)n + 1);
    ck_assert_ptr_nonnull(buf);
    ck_assert_uint_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static void write_bytes(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    ck_assert_msg(f != NULL, "cannot write %s", path);
    ck_assert_uint_eq(fwrite(data, 1, n, f), n);
    fclose(f);
}

/* Entries of a folder other than . and .., for "nothing left behind". */
static int dir_entries(const char *dir)
{
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

static bool same_bits_f32(float a, float b) { return memcmp(&a, &b, sizeof(a)) == 0; }

/* ---- reading the Python-written fixture ----------------------------------------------------- */

static const char *const all_names[] = {
    "bf16", "bool", "conv_bf16", "conv_e4m3", "conv_e5m2", "conv_f16", "conv_src", "empty",
    "f16", "f32", "f8_e4m3", "f8_e5m2", "i32", "i64", "scalar", "u8",
};
#define N_ALL ((int)(sizeof(all_names) / sizeof(all_names[0])))

static const uint16_t bf16_bits[] = { 0x3F80, 0xC000, 0x3EAB, 0x7F7F, 0x0001, 0x8000 };
static const uint16_t f16_bits[] = { 0x3C00, 0xC000, 0x3555, 0x7BFF, 0x0001 };
static const uint8_t e4m3_bits[] = { 0x00, 0x38, 0xB8, 0x7E, 0x01, 0x44 };
static const uint8_t e5m2_bits[] = { 0x00, 0x3C, 0xBC, 0x7B, 0x01, 0x7C };

START_TEST(fixture_all_dtypes)
{
    ghc_core_t *core = ghc_core_init();
    char *path = fixture("all_dtypes.safetensors");
    ghc_st_t *st = open_ok(core, path);
    ck_assert_int_eq(ghc_st_count(st), N_ALL);
    struct ghc_st_info in;
    ck_assert(ghc_st_info_at(st, 0, &in));
    const char *base = (const char *)ghc_st_raw(st, in.name) - in.offset;   /* data section */
    for (int i = 0; i < N_ALL; i++) {
        ck_assert(ghc_st_info_at(st, i, &in));
        ck_assert_str_eq(in.name, all_names[i]);   /* name order */
        ck_assert_str_eq(in.file, path);
        ck_assert_ptr_eq((const char *)ghc_st_raw(st, in.name) - in.offset, base);
    }
    ck_assert(!ghc_st_info_at(st, N_ALL, &in));
    ck_assert(!ghc_st_info_at(st, -1, &in));
    ck_assert(!ghc_st_find(st, "nope", &in));
    ck_assert_ptr_null(ghc_st_raw(st, "nope"));

    expect_info(st, "f32", GHC_DTYPE_F32, 2, (int64_t[]){ 2, 3 }, 24);
    expect_info(st, "f16", GHC_DTYPE_F16, 1, (int64_t[]){ 5 }, 10);
    expect_info(st, "bf16", GHC_DTYPE_BF16, 2, (int64_t[]){ 2, 3 }, 12);
    expect_info(st, "f8_e4m3", GHC_DTYPE_F8_E4M3, 1, (int64_t[]){ 6 }, 6);
    expect_info(st, "f8_e5m2", GHC_DTYPE_F8_E5M2, 1, (int64_t[]){ 6 }, 6);
    expect_info(st, "i64", GHC_DTYPE_I64, 1, (int64_t[]){ 3 }, 24);
    expect_info(st, "i32", GHC_DTYPE_I32, 2, (int64_t[]){ 2, 2 }, 16);
    expect_info(st, "u8", GHC_DTYPE_U8, 1, (int64_t[]){ 4 }, 4);
    expect_info(st, "bool", GHC_DTYPE_BOOL, 1, (int64_t[]){ 3 }, 3);
    expect_info(st, "scalar", GHC_DTYPE_F32, 0, NULL, 4);
    expect_info(st, "empty", GHC_DTYPE_F32, 2, (int64_t[]){ 0, 3 }, 0);

    /* raw bytes, exactly as Python wrote them */
    const float f32[] = { 0.0f, 1.0f, -2.5f, 3.25f, 1e-3f, 65504.0f };
    ck_assert_mem_eq(ghc_st_raw(st, "f32"), f32, sizeof(f32));
    ck_assert_mem_eq(ghc_st_raw(st, "f16"), f16_bits, sizeof(f16_bits));
    ck_assert_mem_eq(ghc_st_raw(st, "bf16"), bf16_bits, sizeof(bf16_bits));
    ck_assert_mem_eq(ghc_st_raw(st, "f8_e4m3"), e4m3_bits, sizeof(e4m3_bits));
    ck_assert_mem_eq(ghc_st_raw(st, "f8_e5m2"), e5m2_bits, sizeof(e5m2_bits));
    const int64_t i64[] = { -1, INT64_C(1) << 40, INT64_MAX };
    ck_assert_mem_eq(ghc_st_raw(st, "i64"), i64, sizeof(i64));
    const int32_t i32[] = { INT32_MIN, -1, 0, INT32_MAX };
    ck_assert_mem_eq(ghc_st_raw(st, "i32"), i32, sizeof(i32));
    const uint8_t u8[] = { 0, 1, 127, 255 }, b8[] = { 1, 0, 1 };
    ck_assert_mem_eq(ghc_st_raw(st, "u8"), u8, sizeof(u8));
    ck_assert_mem_eq(ghc_st_raw(st, "bool"), b8, sizeof(b8));

    /* loads without conversion */
    ghc_tensor_t *t = ghc_st_load(st, "i64", GHC_DTYPE_I64, GHC_ROLE_WEIGHTS);
    ck_assert_msg(t != NULL, "%s", ghc_error_message(core));
    ck_assert_int_eq(ghc_tensor_ndim(t), 1);
    ck_assert_int_eq(ghc_tensor_dim(t, 0), 3);
    ck_assert_int_eq(ghc_tensor_role(t), GHC_ROLE_WEIGHTS);
    ck_assert_mem_eq(ghc_tensor_data(t), i64, sizeof(i64));
    ghc_tensor_free(t);
    t = ghc_st_load(st, "f32", GHC_DTYPE_F32, GHC_ROLE_WEIGHTS);
    ck_assert_mem_eq(ghc_tensor_data(t), f32, sizeof(f32));
    ghc_tensor_free(t);
    t = ghc_st_load(st, "scalar", GHC_DTYPE_F32, GHC_ROLE_WEIGHTS);
    ck_assert_int_eq(ghc_tensor_ndim(t), 0);
    ck_assert_int_eq(ghc_tensor_numel(t), 1);
    ck_assert(*(float *)ghc_tensor_data(t) == 42.5f);
    ghc_tensor_free(t);
    t = ghc_st_load(st, "empty", GHC_DTYPE_BF16, GHC_ROLE_WEIGHTS);
    ck_assert_msg(t != NULL, "%s", ghc_error_message(core));
    ck_assert_int_eq(ghc_tensor_numel(t), 0);
    ck_assert_int_eq(ghc_tensor_dim(t, 1), 3);
    ghc_tensor_free(t);

    ghc_st_free(st);
    ghc_st_free(NULL);
    free(path);
    ghc_core_free(core);
}
END_TEST

START_TEST(fixture_metadata)
{
    ghc_core_t *core = ghc_core_init();
    char *path = fixture("all_dtypes.safetensors");
    ghc_st_t *st = open_ok(core, path);
    ck_assert_str_eq(ghc_st_metadata(st, "format"), "pt");
    ck_assert_str_eq(ghc_st_metadata(st, "source"), "gh200core fixture");
    ck_assert_ptr_null(ghc_st_metadata(st, "absent"));
    const char *k, *v;
    int n = 0;
    while (ghc_st_metadata_at(st, n, &k, &v)) {
        ck_assert_str_eq(ghc_st_metadata(st, k), v);
        n++;
    }
    ck_assert_int_eq(n, 2);   /* Python's order of the two keys is not fixed */
    ck_assert(!ghc_st_metadata_at(st, -1, &k, &v));
    ghc_st_free(st);
    free(path);
    ghc_core_free(core);
}
END_TEST

/* ---- conversion on load ----------------------------------------------------------------------- */

static float *load_f32(ghc_core_t *core, ghc_st_t *st, const char *name, ghc_tensor_t **keep)
{
    *keep = ghc_st_load(st, name, GHC_DTYPE_F32, GHC_ROLE_WEIGHTS);
    ck_assert_msg(*keep != NULL, "load %s: %s", name, ghc_error_message(core));
    return ghc_tensor_data(*keep);
}

START_TEST(convert_to_f32)
{
    ghc_core_t *core = ghc_core_init();
    char *path = fixture("all_dtypes.safetensors");
    ghc_st_t *st = open_ok(core, path);
    ghc_tensor_t *t;

    /* bf16 -> f32: exact, equal to the scalar conversion of the known bit patterns */
    float *v = load_f32(core, st, "bf16", &t);
    const float bf16_want[] = { 1.0f, -2.0f, 0.333984375f, 3.38953139e38f, 9.18354962e-41f,
                                -0.0f };
    for (int i = 0; i < 6; i++) {
        ck_assert_msg(same_bits_f32(v[i], ghc_bf16_to_f32(bf16_bits[i])), "bf16[%d] %g", i, v[i]);
        ck_assert_msg(same_bits_f32(v[i], bf16_want[i]), "bf16[%d] %g vs %g", i, v[i],
                      bf16_want[i]);
    }
    ck_assert_int_eq(ghc_tensor_ndim(t), 2);
    ghc_tensor_free(t);

    v = load_f32(core, st, "f16", &t);
    const float f16_want[] = { 1.0f, -2.0f, 0.333251953125f, 65504.0f, 5.96046448e-8f };
    for (int i = 0; i < 5; i++) {
        ck_assert_msg(same_bits_f32(v[i], f16_want[i]), "f16[%d] %g", i, v[i]);
        ck_assert(same_bits_f32(v[i], ghc_f16_to_f32(f16_bits[i])));
    }
    ghc_tensor_free(t);

    v = load_f32(core, st, "f8_e4m3", &t);
    const float e4m3_want[] = { 0.0f, 1.0f, -1.0f, 448.0f, 0x1p-9f, 3.0f };
    for (int i = 0; i < 6; i++)
        ck_assert_msg(same_bits_f32(v[i], e4m3_want[i]), "e4m3[%d] %g", i, v[i]);
    ghc_tensor_free(t);

    v = load_f32(core, st, "f8_e5m2", &t);
    const float e5m2_want[] = { 0.0f, 1.0f, -1.0f, 57344.0f, 0x1p-16f, INFINITY };
    for (int i = 0; i < 6; i++)
        ck_assert_msg(same_bits_f32(v[i], e5m2_want[i]), "e5m2[%d] %g", i, v[i]);
    ghc_tensor_free(t);

    ghc_st_free(st);
    free(path);
    ghc_core_free(core);
}
END_TEST

/* f32 -> each narrow format must round exactly as numpy / ml_dtypes did in the fixture. */
START_TEST(convert_from_f32)
{
    ghc_core_t *core = ghc_core_init();
    char *path = fixture("all_dtypes.safetensors");
    ghc_st_t *st = open_ok(core, path);
    static const struct { const char *ref; enum ghc_dtype dt; } cases[] = {
        { "conv_bf16", GHC_DTYPE_BF16 }, { "conv_f16", GHC_DTYPE_F16 },
        { "conv_e4m3", GHC_DTYPE_F8_E4M3 }, { "conv_e5m2", GHC_DTYPE_F8_E5M2 },
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        ghc_tensor_t *t = ghc_st_load(st, "conv_src", cases[c].dt, GHC_ROLE_WEIGHTS);
        ck_assert_msg(t != NULL, "%s", ghc_error_message(core));
        struct ghc_st_info in;
        ck_assert(ghc_st_find(st, cases[c].ref, &in));
        ck_assert_uint_eq(ghc_tensor_nbytes(t), in.nbytes);
        const uint8_t *got = ghc_tensor_data(t), *want = ghc_st_raw(st, cases[c].ref);
        for (uint64_t i = 0; i < in.nbytes; i++)
            ck_assert_msg(got[i] == want[i], "%s: byte %d: 0x%02x, Python 0x%02x", cases[c].ref,
                          (int)i, got[i], want[i]);
        ghc_tensor_free(t);
    }
    /* bf16 -> f16 goes through f32; into an existing tensor of another shape, same numel */
    int64_t shape[1] = { 6 };
    ghc_tensor_t *dst = ghc_tensor_init(core, GHC_DTYPE_F16, 1, shape, GHC_DEVICE_CPU,
                                        GHC_ROLE_WORKSPACE);
    ck_assert_int_eq(ghc_st_load_into(st, "bf16", dst), 0);
    const uint16_t *h = ghc_tensor_data(dst);
    ck_assert_uint_eq(h[0], 0x3C00);
    ck_assert_uint_eq(h[1], 0xC000);
    ck_assert_uint_eq(h[3], 0x7C00);   /* bf16 max overflows f16: inf */
    ck_assert_uint_eq(h[5], 0x8000);
    ghc_tensor_free(dst);
    ghc_st_free(st);
    free(path);
    ghc_core_free(core);
}
END_TEST

START_TEST(load_errors)
{
    ghc_core_t *core = ghc_core_init();
    char *path = fixture("all_dtypes.safetensors");
    ghc_st_t *st = open_ok(core, path);
    ck_assert_ptr_null(ghc_st_load(st, "absent", GHC_DTYPE_F32, GHC_ROLE_WEIGHTS));
    ck_assert_int_eq(ghc_error_code(core), GHC_ENOTFOUND);
    expect_msg(core, "no tensor \"absent\"");
    ck_assert_ptr_null(ghc_st_load(st, "i64", GHC_DTYPE_F32, GHC_ROLE_WEIGHTS));
    ck_assert_int_eq(ghc_error_code(core), GHC_EINVAL);
    expect_msg(core, "cannot load tensor \"i64\" (I64) as F32");
    ck_assert_ptr_null(ghc_st_load(st, "f32", GHC_DTYPE_I32, GHC_ROLE_WEIGHTS));
    ck_assert_int_eq(ghc_error_code(core), GHC_EINVAL);
    int64_t shape[1] = { 5 };
    ghc_tensor_t *dst = ghc_tensor_init(core, GHC_DTYPE_F32, 1, shape, GHC_DEVICE_CPU,
                                        GHC_ROLE_WORKSPACE);
    ck_assert_int_eq(ghc_st_load_into(st, "f32", dst), GHC_EINVAL);
    expect_msg(core, "(6 elements) cannot load into a CPU tensor of 5 elements");
    ck_assert_int_eq(ghc_st_load_into(st, "absent", dst), GHC_ENOTFOUND);
    ghc_tensor_free(dst);
    ghc_st_free(st);
    free(path);
    ghc_core_free(core);
}
END_TEST

/* Offsets need not be aligned for the dtype: a bf16 tensor at an odd offset converts too. */
START_TEST(unaligned_offsets)
{
    ghc_core_t *core = ghc_core_init();
    char *dir = tu_tmpdir();
    char header[] = "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                    "\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[1,5]}}";
    size_t hl = strlen(header), padded = (hl + 7) / 8 * 8;
    unsigned char buf[256] = { 0 };
    buf[0] = (unsigned char)padded;
    memcpy(buf + 8, header, hl);
    memset(buf + 8 + hl, ' ', padded - hl);
    unsigned char data[5] = { 7, 0x80, 0x3F, 0x40, 0x40 };   /* u8 7; bf16 1.0, 3.0 */
    memcpy(buf + 8 + padded, data, sizeof(data));
    char *path = tu_write(dir, "odd.safetensors", "");
    write_bytes(path, buf, 8 + padded + sizeof(data));

    ghc_st_t *st = open_ok(core, path);
    ck_assert_uint_eq((uintptr_t)ghc_st_raw(st, "b") % 2, 1);
    ghc_tensor_t *t = ghc_st_load(st, "b", GHC_DTYPE_F32, GHC_ROLE_WEIGHTS);
    ck_assert_msg(t != NULL, "%s", ghc_error_message(core));
    ck_assert(((float *)ghc_tensor_data(t))[0] == 1.0f);
    ck_assert(((float *)ghc_tensor_data(t))[1] == 3.0f);
    ghc_tensor_free(t);
    t = ghc_st_load(st, "b", GHC_DTYPE_BF16, GHC_ROLE_WEIGHTS);
    ck_assert_uint_eq(((uint16_t *)ghc_tensor_data(t))[1], 0x4040);
    ghc_tensor_free(t);
    ghc_st_free(st);
    free(path);
    tu_rm_rf(dir);
    free(dir);
    ghc_core_free(core);
}
END_TEST

/* ---- sharded checkpoints ---------------------------------------------------------------------- */

START_TEST(sharded_load)
{
    ghc_core_t *core = ghc_core_init();
    char *path = fixture("sharded/model.safetensors.index.json");
    ghc_st_t *st = open_ok(core, path);
    ck_assert_int_eq(ghc_st_count(st), 4);
    static const char *const names[] = { "a.weight", "b.bias", "c.weight", "d.scale" };
    static const char *const files[] = { "model-00001-of-00002.safetensors",
                                         "model-00001-of-00002.safetensors",
                                         "model-00002-of-00002.safetensors",
                                         "model-00002-of-00002.safetensors" };
    struct ghc_st_info in;
    for (int i = 0; i < 4; i++) {
        ck_assert(ghc_st_info_at(st, i, &in));
        ck_assert_str_eq(in.name, names[i]);
        const char *slash = strrchr(in.file, '/');
        ck_assert_str_eq(slash ? slash + 1 : in.file, files[i]);
    }
    ghc_tensor_t *t;
    float *v = load_f32(core, st, "a.weight", &t);
    ck_assert(v[0] == 1.0f && v[1] == 2.0f && v[2] == 3.0f && v[3] == 4.0f);
    ghc_tensor_free(t);
    v = load_f32(core, st, "b.bias", &t);
    ck_assert(v[0] == 0.5f && v[1] == -0.5f);
    ghc_tensor_free(t);
    v = load_f32(core, st, "c.weight", &t);
    ck_assert(v[0] == 1.0f && v[1] == 2.0f && v[2] == 3.0f);
    ghc_tensor_free(t);
    v = load_f32(core, st, "d.scale", &t);
    ck_assert(v[0] == 0.25f);
    ghc_tensor_free(t);
    ck_assert_str_eq(ghc_st_metadata(st, "total_size"), "30");   /* a number in the index */
    ck_assert_str_eq(ghc_st_metadata(st, "format"), "np");       /* from the shards */
    ghc_st_free(st);
    free(path);
    ghc_core_free(core);
}
END_TEST

START_TEST(sharded_errors)
{
    ghc_core_t *core = ghc_core_init();
    char *dir = tu_tmpdir();
    char *shard = fixture("sharded/model-00001-of-00002.safetensors");
    char cmd[8192];
    snprintf(cmd, sizeof(cmd), "cp '%s' '%s/s1.safetensors'", shard, dir);
    ck_assert_int_eq(system(cmd), 0);
    static const struct { const char *text; int code; const char *msg; } cases[] = {
        { "{\"weight_map\": {\"a.weight\": \"s1.safetensors\", \"zz\": \"s1.safetensors\"}}",
          GHC_EFORMAT, "weight_map names shard \"s1.safetensors\", which has no such tensor "
          "(tensor \"zz\")" },
        { "{\"weight_map\": {\"a.weight\": \"missing.safetensors\"}}", GHC_EIO,
          "missing.safetensors: cannot open" },
        { "{\"metadata\": {}}", GHC_EFORMAT, "index has no \"weight_map\" object" },
        { "{\"weight_map\": {\"a.weight\": 3}}", GHC_EFORMAT, "not a file name in the index's" },
        { "{\"weight_map\": {\"a.weight\": \"/etc/passwd\"}}", GHC_EFORMAT,
          "weight_map value is not a file name in the index's folder (no '/', not \".\" or "
          "\"..\") (tensor \"a.weight\")" },
        /* shard names are plain file names: no way out of the index's folder, nor into a
         * subfolder; an empty name, "." and ".." are folders */
        { "{\"weight_map\": {\"a.weight\": \"../../etc/passwd\"}}", GHC_EFORMAT,
          "not a file name in the index's folder" },
        { "{\"weight_map\": {\"a.weight\": \"sub/s1.safetensors\"}}", GHC_EFORMAT,
          "not a file name in the index's folder" },
        { "{\"weight_map\": {\"a.weight\": \"..\"}}", GHC_EFORMAT,
          "not a file name in the index's folder" },
        { "{\"weight_map\": {\"a.weight\": \"\"}}", GHC_EFORMAT,
          "not a file name in the index's folder" },
        { "{\"weight_map\": {}, \"metadata\": {\"x\": [1]}}", GHC_EFORMAT,
          "metadata value of \"x\" is not a string or number" },
        { "{\"weight_map\": {}, \"metadata\": 5}", GHC_EFORMAT, "\"metadata\" is not an object" },
        { "{\"weight_map\": {", GHC_EFORMAT, "index is not valid JSON" },
        { "[]", GHC_EFORMAT, "index has no \"weight_map\" object" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *idx = tu_write(dir, "m.safetensors.index.json", cases[i].text);
        ck_assert_ptr_null(ghc_st_open(core, idx));
        ck_assert_msg(ghc_error_code(core) == cases[i].code, "case %zu: code %d: %s", i,
                      ghc_error_code(core), ghc_error_message(core));
        expect_msg(core, cases[i].msg);
        free(idx);
    }
    /* an empty weight map is a valid, empty checkpoint */
    char *idx = tu_write(dir, "m.safetensors.index.json", "{\"weight_map\": {}}");
    ghc_st_t *st = open_ok(core, idx);
    ck_assert_int_eq(ghc_st_count(st), 0);
    ghc_st_free(st);
    free(idx);
    snprintf(cmd, sizeof(cmd), "%s/none.safetensors.index.json", dir);
    ck_assert_ptr_null(ghc_st_open(core, cmd));
    ck_assert_int_eq(ghc_error_code(core), GHC_EIO);
    free(shard);
    tu_rm_rf(dir);
    free(dir);
    ghc_core_free(core);
}
END_TEST

/* ---- the writer -------------------------------------------------------------------------------- */

/* The tensors of writer_ref() in make_safetensors_fixtures.py. */
static ghc_st_writer_t *writer_ref(ghc_core_t *core)
{
    ghc_st_writer_t *w = ghc_st_writer_init(core);
    ck_assert_ptr_nonnull(w);
    int64_t s23[2] = { 2, 3 }, s3[1] = { 3 }, s2[1] = { 2 }, s4[1] = { 4 }, s0[1] = { 0 };
    ghc_tensor_t *t = ghc_tensor_init(core, GHC_DTYPE_F32, 2, s23, GHC_DEVICE_CPU,
                                      GHC_ROLE_ADAPTER);
    float *f = ghc_tensor_data(t);
    for (int i = 0; i < 6; i++)
        f[i] = (float)i * 0.5f - 1.0f;
    ck_assert_int_eq(ghc_st_writer_add(w, "layer.0.weight", t), 0);
    ghc_tensor_free(t);   /* copied by add */
    const uint16_t bias[3] = { 0x3F80, 0x4000, 0xBF80 }, emb[2] = { 0x3C00, 0x4200 };
    const int64_t step = 1234;
    const uint8_t mask[4] = { 1, 0, 0, 1 }, q[2] = { 0x38, 0x40 };
    const int32_t ids[3] = { 7, -8, 9 };
    ck_assert_int_eq(ghc_st_writer_add_raw(w, "z", GHC_DTYPE_U8, 1, s0, NULL), 0);
    ck_assert_int_eq(ghc_st_writer_add_raw(w, "layer.0.bias", GHC_DTYPE_BF16, 1, s3, bias), 0);
    ck_assert_int_eq(ghc_st_writer_add_raw(w, "emb", GHC_DTYPE_F16, 1, s2, emb), 0);
    ck_assert_int_eq(ghc_st_writer_add_raw(w, "step", GHC_DTYPE_I64, 0, NULL, &step), 0);
    ck_assert_int_eq(ghc_st_writer_add_raw(w, "mask", GHC_DTYPE_BOOL, 1, s4, mask), 0);
    ck_assert_int_eq(ghc_st_writer_add_raw(w, "ids", GHC_DTYPE_I32, 1, s3, ids), 0);
    ck_assert_int_eq(ghc_st_writer_add_raw(w, "q", GHC_DTYPE_F8_E4M3, 1, s2, q), 0);
    ck_assert_int_eq(ghc_st_writer_metadata(w, "ss_network", "first"), 0);
    ck_assert_int_eq(ghc_st_writer_metadata(w, "ss_network", "lora"), 0);   /* replaces */
    return w;
}

START_TEST(writer_round_trip)
{
    ghc_core_t *core = ghc_core_init();
    char *dir = tu_tmpdir();
    char path[4200];
    snprintf(path, sizeof(path), "%s/out.safetensors", dir);
    ghc_st_writer_t *w = writer_ref(core);
    ck_assert_msg(ghc_st_writer_finish(w, path) == 0, "%s", ghc_error_message(core));
    ghc_st_writer_free(w);
    ck_assert_int_eq(dir_entries(dir), 1);   /* no temporary file left */

    /* The same bytes as Python's safetensors wrote for the same tensors. */
    char *ref = fixture("writer_ref.safetensors");
    size_t n_got, n_ref;
    unsigned char *got = slurp(path, &n_got), *want = slurp(ref, &n_ref);
    ck_assert_uint_eq(n_got, n_ref);
    ck_assert_msg(memcmp(got, want, n_got) == 0, "bytes differ from %s", ref);
    ck_assert_uint_eq((got[0] | got[1] << 8) % 8, 0);   /* header padded to 8 */
    free(got);
    free(want);
    free(ref);
    /* GHC_ST_WRITE_OUT=FILE keeps a copy for `make_safetensors_fixtures.py --verify FILE`. */
    const char *keep = getenv("GHC_ST_WRITE_OUT");
    if (keep && *keep) {
        w = writer_ref(core);
        ck_assert_int_eq(ghc_st_writer_finish(w, keep), 0);
        ghc_st_writer_free(w);
    }

    /* and what it means, read back */
    ghc_st_t *st = open_ok(core, path);
    ck_assert_int_eq(ghc_st_count(st), 8);
    ck_assert_str_eq(ghc_st_metadata(st, "ss_network"), "lora");
    const char *k, *v;
    ck_assert(ghc_st_metadata_at(st, 0, &k, &v));
    ck_assert(!ghc_st_metadata_at(st, 1, &k, &v));
    expect_info(st, "layer.0.weight", GHC_DTYPE_F32, 2, (int64_t[]){ 2, 3 }, 24);
    expect_info(st, "step", GHC_DTYPE_I64, 0, NULL, 8);
    expect_info(st, "z", GHC_DTYPE_U8, 1, (int64_t[]){ 0 }, 0);
    const float *f = ghc_st_raw(st, "layer.0.weight");
    ck_assert(f[0] == -1.0f && f[5] == 1.5f);
    struct ghc_st_info in;
    for (int i = 0; ghc_st_info_at(st, i, &in); i++)   /* every tensor aligned */
        ck_assert_msg(in.offset % ghc_dtype_size(in.dtype) == 0, "%s at %d", in.name,
                      (int)in.offset);
    ghc_st_free(st);

    /* finishing again replaces the file */
    w = ghc_st_writer_init(core);
    ck_assert_int_eq(ghc_st_writer_add_raw(w, "only", GHC_DTYPE_U8, 1, (int64_t[]){ 1 }, "x"), 0);
    ck_assert_int_eq(ghc_st_writer_finish(w, path), 0);
    ghc_st_writer_free(w);
    st = open_ok(core, path);
    ck_assert_int_eq(ghc_st_count(st), 1);
    ck_assert_ptr_null(ghc_st_metadata(st, "ss_network"));
    ghc_st_free(st);
    /* an empty file is valid: "{}" padded */
    w = ghc_st_writer_init(core);
    ck_assert_int_eq(ghc_st_writer_finish(w, path), 0);
    ghc_st_writer_free(w);
    st = open_ok(core, path);
    ck_assert_int_eq(ghc_st_count(st), 0);
    ghc_st_free(st);
    ghc_st_writer_free(NULL);
    tu_rm_rf(dir);
    free(dir);
    ghc_core_free(core);
}
END_TEST

START_TEST(writer_errors)
{
    ghc_core_t *core = ghc_core_init();
    ghc_st_writer_t *w = ghc_st_writer_init(core);
    int64_t s1[1] = { 1 }, bad[1] = { -1 }, s6[6] = { 1, 1, 1, 1, 1, 1 };
    ck_assert_int_eq(ghc_st_writer_add_raw(w, "a", GHC_DTYPE_U8, 1, s1, "x"), 0);
    ck_assert_int_eq(ghc_st_writer_add_raw(w, "a", GHC_DTYPE_U8, 1, s1, "x"), GHC_EINVAL);
    expect_msg(core, "duplicate tensor name \"a\"");
    ck_assert_int_eq(ghc_st_writer_add_raw(w, "__metadata__", GHC_DTYPE_U8, 1, s1, "x"),
                     GHC_EINVAL);
    ck_assert_int_eq(ghc_st_writer_add_raw(w, "bad\xff", GHC_DTYPE_U8, 1, s1, "x"), GHC_EINVAL);
    expect_msg(core, "invalid tensor name");
    ck_assert_int_eq(ghc_st_writer_add_raw(w, "n", GHC_DTYPE_U8, 1, bad, "x"), GHC_EINVAL);
    ck_assert_int_eq(ghc_st_writer_add_raw(w, "n", GHC_DTYPE_U8, 6, s6, "x"), GHC_EINVAL);
    ck_assert_int_eq(ghc_st_writer_add_raw(w, "n", GHC_DTYPE_COUNT, 1, s1, "x"), GHC_EINVAL);
    ck_assert_int_eq(ghc_st_writer_metadata(w, "k", "\xc3"), GHC_EINVAL);
    ghc_st_writer_free(w);
    ghc_core_free(core);
}
END_TEST

/* A failed finish leaves the target as it was and no temporary file behind. */
START_TEST(writer_atomic)
{
    ghc_core_t *core = ghc_core_init();
    char *dir = tu_tmpdir();
    char path[4200];
    ghc_st_writer_t *w = writer_ref(core);

    /* into a folder that does not exist */
    snprintf(path, sizeof(path), "%s/missing/out.safetensors", dir);
    ck_assert_int_eq(ghc_st_writer_finish(w, path), GHC_EIO);
    expect_msg(core, "missing/out.safetensors: cannot create a temporary file");
    ck_assert_int_eq(dir_entries(dir), 0);

    /* the rename fails (the target is a non-empty folder): the folder stays, no temp file */
    snprintf(path, sizeof(path), "%s/target.safetensors", dir);
    ck_assert_int_eq(mkdir(path, 0755), 0);
    char *inside = tu_write(path, "keep", "x");
    ck_assert_int_eq(ghc_st_writer_finish(w, path), GHC_EIO);
    expect_msg(core, "cannot rename the temporary file");
    ck_assert_int_eq(dir_entries(dir), 1);
    ck_assert_int_eq(dir_entries(path), 1);
    free(inside);

    /* an existing file is replaced only by a complete new one */
    snprintf(path, sizeof(path), "%s/old.safetensors", dir);
    char *old = tu_write(dir, "old.safetensors", "old contents");
    ck_assert_int_eq(ghc_st_writer_finish(w, path), 0);
    ghc_st_t *st = open_ok(core, path);
    ck_assert_int_eq(ghc_st_count(st), 8);
    ghc_st_free(st);
    ck_assert_int_eq(dir_entries(dir), 2);
    free(old);
    ghc_st_writer_free(w);
    tu_rm_rf(dir);
    free(dir);
    ghc_core_free(core);
}
END_TEST

/* ---- the broken-file corpus ------------------------------------------------------------------ */

static const struct {
    const char *file;
    const char *msg;
} corpus[] = {
    { "short_file", "file is 3 bytes, shorter than the 8-byte header length" },
    { "truncated_header", "runs past the end of the file" },
    { "truncated_data", "outside the data section (5 bytes) (tensor \"a\")" },
    { "huge_header_len", "header length 1099511627776 exceeds the limit" },
    { "header_len_0", "header length 0 is too small" },
    { "header_len_1", "header length 1 is too small" },
    { "not_json", "header is not valid JSON" },
    { "json_array", "header is not a JSON object" },
    { "non_utf8_name", "header is not valid UTF-8" },
    { "duplicate_names", "duplicate name in the header" },
    { "bad_dtype", "unknown dtype \"F33\" (tensor \"a\")" },
    { "entry_not_object", "entry is not an object (tensor \"a\")" },
    { "missing_dtype", "missing \"dtype\" (tensor \"a\")" },
    { "unknown_member", "unknown member \"extra\"" },
    { "negative_dim", "shape[0] = -1 is negative (tensor \"a\")" },
    { "float_dim", "shape[0] is not an integer (tensor \"a\")" },
    { "shape_overflow", "shape product overflows int64 (tensor \"a\")" },
    { "bytes_overflow", "shape product overflows int64 (tensor \"a\")" },
    { "too_many_dims", "shape has 6 dimensions, more than 5 (tensor \"a\")" },
    { "offsets_out_of_file", "data_offsets [0, 1000] outside the data section (8 bytes)" },
    { "offsets_reversed", "data_offsets [8, 0] end before begin" },
    { "offsets_not_pair", "\"data_offsets\" is not [begin, end]" },
    { "size_mismatch", "data_offsets span 8 bytes, but F32 x 3 elements is 12 bytes" },
    { "overlap", "data_offsets [4, 12] overlap tensor \"a\" [0, 8] (tensor \"b\")" },
    { "hole", "hole in the data section: bytes [4, 8) belong to no tensor (tensor \"b\")" },
    { "trailing_bytes", "data section has 4 bytes after the last tensor" },
    { "metadata_non_string", "__metadata__ value of \"k\" is not a string" },
    { "metadata_not_object", "__metadata__ is not an object" },
};
#define N_CORPUS ((int)(sizeof(corpus) / sizeof(corpus[0])))

START_TEST(broken_corpus)
{
    ghc_core_t *core = ghc_core_init();
    const char *data = tu_env("GHC_TEST_DATA");
    char path[4200];
    int i = _i;
    snprintf(path, sizeof(path), "%s/broken/%s.safetensors", data, corpus[i].file);
    ghc_error_clear(core);
    ghc_st_t *st = ghc_st_open(core, path);
    ck_assert_msg(st == NULL, "%s opened", corpus[i].file);
    ck_assert_msg(ghc_error_code(core) == GHC_EFORMAT, "%s: code %d: %s", corpus[i].file,
                  ghc_error_code(core), ghc_error_message(core));
    expect_msg(core, corpus[i].msg);
    ck_assert_msg(strncmp(ghc_error_message(core), path, strlen(path)) == 0,
                  "message does not start with the path: %s", ghc_error_message(core));
    /* inspect gives the same error and prints nothing */
    char *buf = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&buf, &len);
    ck_assert_int_eq(ghc_cli_inspect(core, path, out), GHC_EFORMAT);
    fclose(out);
    ck_assert_uint_eq(len, 0);
    free(buf);
    ghc_core_free(core);
}
END_TEST

/* Every file in tests/data/broken is in the table above (a new one needs its message). */
START_TEST(corpus_complete)
{
    char dir[4200];
    snprintf(dir, sizeof(dir), "%s/broken", tu_env("GHC_TEST_DATA"));
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        bool known = false;
        for (int i = 0; i < N_CORPUS && !known; i++)
            known = strncmp(e->d_name, corpus[i].file, strlen(corpus[i].file)) == 0 &&
                    strcmp(e->d_name + strlen(corpus[i].file), ".safetensors") == 0;
        ck_assert_msg(known, "%s/%s has no expected message in test_safetensors.c", dir,
                      e->d_name);
        n++;
    }
    closedir(d);
    ck_assert_int_eq(n, N_CORPUS);
}
END_TEST

START_TEST(unreadable)
{
    ghc_core_t *core = ghc_core_init();
    char *dir = tu_tmpdir();
    char path[4200];
    snprintf(path, sizeof(path), "%s/absent.safetensors", dir);
    ck_assert_ptr_null(ghc_st_open(core, path));
    ck_assert_int_eq(ghc_error_code(core), GHC_EIO);
    expect_msg(core, "absent.safetensors: cannot open: No such file or directory");
    ck_assert_ptr_null(ghc_st_open(core, dir));
    ck_assert_int_eq(ghc_error_code(core), GHC_EIO);
    expect_msg(core, ": not a regular file");
    /* an empty file is a format error, not an I/O one */
    char *empty = tu_write(dir, "empty.safetensors", "");
    ck_assert_ptr_null(ghc_st_open(core, empty));
    ck_assert_int_eq(ghc_error_code(core), GHC_EFORMAT);
    free(empty);
    /* a name with a newline cannot break the one-line message */
    char *nl = tu_write(dir, "nl.safetensors", "");
    const char hdr[] = "{\"a\\nb\":{\"dtype\":\"X\",\"shape\":[],\"data_offsets\":[0,0]}}";
    unsigned char buf[128] = { sizeof(hdr) - 1 };
    memcpy(buf + 8, hdr, sizeof(hdr) - 1);
    write_bytes(nl, buf, 8 + sizeof(hdr) - 1);
    ck_assert_ptr_null(ghc_st_open(core, nl));
    expect_msg(core, "unknown dtype \"X\" (tensor \"a?b\")");
    free(nl);
    tu_rm_rf(dir);
    free(dir);
    ghc_core_free(core);
}
END_TEST

/* ---- inspect ------------------------------------------------------------------------------ */

static char *inspect(ghc_core_t *core, const char *path)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&buf, &len);
    ck_assert_ptr_nonnull(out);
    int rc = ghc_cli_inspect(core, path, out);
    fclose(out);
    ck_assert_msg(rc == 0, "inspect %s: %d %s", path, rc, ghc_error_message(core));
    return buf;
}

static void expect_out(const char *out, const char *what)
{
    ck_assert_msg(strstr(out, what) != NULL, "output lacks '%s':\n%s", what, out);
}

START_TEST(inspect_output)
{
    ghc_core_t *core = ghc_core_init();
    char *path = fixture("all_dtypes.safetensors");
    char *out = inspect(core, path), line[4300];
    snprintf(line, sizeof(line), "file: %s\n", path);
    ck_assert_msg(strncmp(out, line, strlen(line)) == 0, "first line: %s", out);
    expect_out(out, "\nmetadata:\n");
    expect_out(out, "\n  format = pt\n");
    expect_out(out, "\n  source = gh200core fixture\n");
    expect_out(out, "\nNAME       DTYPE    SHAPE   BYTES\n");
    expect_out(out, "\nf32        F32      [2, 3]  24\n");
    expect_out(out, "\nscalar     F32      []      4\n");
    expect_out(out, "\nempty      F32      [0, 3]  0\n");
    expect_out(out, "\nf8_e4m3    F8_E4M3  [6]     6\n");
    expect_out(out, "\ntotals:\n");
    expect_out(out, "\n  F32      4 tensors, 15 parameters, 60 bytes\n");
    expect_out(out, "\n  BOOL     1 tensor, 3 parameters, 3 bytes\n");
    expect_out(out, "\n16 tensors, 84 parameters, 189 bytes (0.00 GiB)\n");
    ck_assert_ptr_null(strstr(out, "shards:"));
    free(out);
    free(path);

    path = fixture("sharded/model.safetensors.index.json");
    out = inspect(core, path);
    expect_out(out, "\nshards:\n");
    expect_out(out, "model-00001-of-00002.safetensors\n");
    expect_out(out, "model-00002-of-00002.safetensors\n");
    expect_out(out, "\n  total_size = 30\n");
    expect_out(out, "\nb.bias    BF16     [2]     4\n");
    expect_out(out, "\n4 tensors, 10 parameters, 30 bytes (0.00 GiB)\n");
    free(out);
    free(path);

    /* long metadata values are shortened, control characters escaped */
    char *dir = tu_tmpdir();
    char file[4200], longv[301];
    snprintf(file, sizeof(file), "%s/long.safetensors", dir);
    memset(longv, 'v', 300);
    longv[300] = '\0';
    ghc_st_writer_t *w = ghc_st_writer_init(core);
    ck_assert_int_eq(ghc_st_writer_metadata(w, "long", longv), 0);
    ck_assert_int_eq(ghc_st_writer_metadata(w, "multi", "a\nb"), 0);
    ck_assert_int_eq(ghc_st_writer_finish(w, file), 0);
    ghc_st_writer_free(w);
    out = inspect(core, file);
    char want[320];
    snprintf(want, sizeof(want), "\n  long = %.200s...\n", longv);
    expect_out(out, want);
    expect_out(out, "\n  multi = a\\nb\n");
    expect_out(out, "\n0 tensors, 0 parameters, 0 bytes (0.00 GiB)\n");
    free(out);
    tu_rm_rf(dir);
    free(dir);
    ghc_core_free(core);
}
END_TEST

/* A FIFO as a checkpoint (a single file, an index, or a shard an index names) used to block
 * in open() or jansson's fopen() until a writer came: refused at once. Nothing here opens the
 * FIFO, and the test case's timeout ends a hang. */
START_TEST(fifo_refused)
{
    ghc_core_t *core = ghc_core_init();
    char *dir = tu_tmpdir();
    static const char *const names[] = { "pipe.safetensors", "pipe.safetensors.index.json", "shard.safetensors" };
    char path[4200];
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        ck_assert_int_eq(mkfifo(path, 0600), 0);
    }
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        ck_assert_ptr_null(ghc_st_open(core, path));
        ck_assert_int_eq(ghc_error_code(core), GHC_EIO);
        char want[4400];
        snprintf(want, sizeof(want), "%s: not a regular file", path);
        expect_msg(core, want);
    }
    char *idx = tu_write(dir, "m.safetensors.index.json", "{\"weight_map\": {\"a\": \"shard.safetensors\"}}");
    ck_assert_ptr_null(ghc_st_open(core, idx));
    expect_msg(core, "shard.safetensors: not a regular file");
    free(idx);
    tu_rm_rf(dir);
    free(dir);
    ghc_core_free(core);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("safetensors");
    TCase *tc = tcase_create("read");
    tcase_add_test(tc, fixture_all_dtypes);
    tcase_add_test(tc, fixture_metadata);
    tcase_add_test(tc, convert_to_f32);
    tcase_add_test(tc, convert_from_f32);
    tcase_add_test(tc, load_errors);
    tcase_add_test(tc, unaligned_offsets);
    tcase_add_test(tc, sharded_load);
    tcase_add_test(tc, sharded_errors);
    suite_add_tcase(s, tc);
    tc = tcase_create("write");
    tcase_add_test(tc, writer_round_trip);
    tcase_add_test(tc, writer_errors);
    tcase_add_test(tc, writer_atomic);
    suite_add_tcase(s, tc);
    tc = tcase_create("broken");
    tcase_add_loop_test(tc, broken_corpus, 0, N_CORPUS);
    tcase_add_test(tc, corpus_complete);
    tcase_add_test(tc, unreadable);
    suite_add_tcase(s, tc);
    tc = tcase_create("fifo");
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, fifo_refused);
    suite_add_tcase(s, tc);
    tc = tcase_create("inspect");
    tcase_add_test(tc, inspect_output);
    suite_add_tcase(s, tc);
    return tu_run_suite(s, false);
}
