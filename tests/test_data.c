/* test_data.c: the dataset (core/dataset.c) with the `local` backend, the in_memory backend
 * and the disk cache: musubi-tuner, ai-toolkit and gh200core fixtures read as they are
 * (tests/fixtures/make_data_fixtures.py), buckets, shuffling, repeats and weights, seek/tell,
 * text dropout, round trips through every compression, the memory limit, and each bad input. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gh200core/gh200core.h>
#include <gh200core/safetensors.h>

#include "testutil.h"
#include "../plugins/in_memory/codec.h"   /* defines: ghz_encode (to write .ghz files) */

#define D 32   /* the fixtures' text width */

/* ---- helpers -------------------------------------------------------------------------------- */

static char *fixture_dir(void)
{
    char *d = malloc(4096);
    ck_assert_ptr_nonnull(d);
    snprintf(d, 4096, "%s/tests/fixtures/data", tu_env("GHC_TOP_SRCDIR"));
    return d;
}

/* A core with `cfg` loaded (relative paths against `dir`) and its run created. */
static ghc_core_t *core_with(const char *cfg, const char *dir)
{
    ghc_core_t *core = ghc_core_init();
    ck_assert_ptr_nonnull(core);
    ck_assert_int_eq(ghc_plugin_add_path(core, tu_env("GHC_BUILD_PLUGINS")), 0);
    int rc = ghc_config_load_string(core, cfg, "t.cfg", dir, NULL, 0);
    ck_assert_msg(rc == 0, "config: %s", ghc_error_message(core));
    rc = ghc_run_init(core);
    ck_assert_msg(rc == 0, "run: %s", ghc_error_message(core));
    return core;
}

/* test_bad_unreadable: root reads anything, so the dataset is opened with the effective ids
 * of nobody (switched back after: the plugins and the build tree, which may sit in a folder
 * only root can enter, are loaded as root). */
static bool open_as_nobody;

static int dataset_open(ghc_core_t *core, ghc_dataset_t **ds)
{
    bool drop = open_as_nobody && geteuid() == 0;
    if (drop) {
        ck_assert_int_eq(setegid(65534), 0);
        ck_assert_int_eq(seteuid(65534), 0);
    }
    int rc = ghc_dataset_open(core, ds);
    if (drop) {
        ck_assert_int_eq(seteuid(0), 0);
        ck_assert_int_eq(setegid(0), 0);
    }
    return rc;
}

static ghc_dataset_t *open_ok(ghc_core_t *core)
{
    ghc_dataset_t *ds = NULL;
    int rc = dataset_open(core, &ds);
    ck_assert_msg(rc == 0, "open: %s", ghc_error_message(core));
    return ds;
}

/* Open expecting failure; returns the message (static copy). */
static const char *open_fails(ghc_core_t *core, int want)
{
    static char msg[1100];
    ghc_dataset_t *ds = NULL;
    int rc = dataset_open(core, &ds);
    ck_assert_ptr_null(ds);
    snprintf(msg, sizeof(msg), "%s", ghc_error_message(core));
    ck_assert_msg(rc == want, "open gave %d (%s), expected %d", rc, msg, want);
    return msg;
}

/* The fixtures' sample numbers (make_data_fixtures.py): latent and text value offsets. */
static int latent_s(const char *file)
{
    static const struct { const char *part; int s; } m[] = {
        { "img01_", 1 }, { "vid_00000", 2 }, { "vid_00005", 3 }, { "cat_", 5 }, { "dog_", 6 },
        { "/a.latent", 7 }, { "/b.latent", 8 }, { "/c.latent", 9 },
    };
    for (size_t i = 0; i < sizeof(m) / sizeof(m[0]); i++)
        if (strstr(file, m[i].part))
            return m[i].s;
    ck_abort_msg("unknown fixture %s", file);
    return -1;
}

static int text_s(const char *file)
{
    int s = latent_s(file);
    return s == 2 || s == 3 ? 4 : s;   /* the two clips share the video's text */
}

static float elem(const ghc_tensor_t *t, int64_t i)
{
    const void *p = ghc_tensor_cdata(t);
    switch (ghc_tensor_dtype(t)) {
    case GHC_DTYPE_BF16: return ghc_bf16_to_f32(((const uint16_t *)p)[i]);
    case GHC_DTYPE_F32:  return ((const float *)p)[i];
    default: ck_abort_msg("dtype %s", ghc_dtype_name(ghc_tensor_dtype(t))); return 0;
    }
}

/* Write a project-format sample stem.{latent,text}.safetensors into dir. */
static void write_native(ghc_core_t *core, const char *dir, const char *stem, enum ghc_dtype ldt, int lnd,
                         const int64_t *lshape, int64_t L, int64_t width, float base)
{
    char path[4200];
    int64_t n = 1;
    for (int i = 0; i < lnd; i++)
        n *= lshape[i];
    size_t esz = ghc_dtype_size(ldt);
    uint8_t *buf = calloc((size_t)(n > L * width ? n : L * width) + 1, 4);
    for (int64_t i = 0; i < n; i++) {
        if (ldt == GHC_DTYPE_BF16)
            ((uint16_t *)buf)[i] = ghc_f32_to_bf16(base + (float)(i % 8));
        else if (ldt == GHC_DTYPE_F32)
            ((float *)buf)[i] = base + (float)(i % 8);
        else
            memset(buf + i * esz, 1, esz);
    }
    ghc_st_writer_t *w = ghc_st_writer_init(core);
    ck_assert_int_eq(ghc_st_writer_add_raw(w, "latent", ldt, lnd, lshape, buf), 0);
    snprintf(path, sizeof(path), "%s/%s.latent.safetensors", dir, stem);
    ck_assert_msg(ghc_st_writer_finish(w, path) == 0, "%s", ghc_error_message(core));
    ghc_st_writer_free(w);
    if (L > 0) {
        for (int64_t i = 0; i < L * width; i++)
            ((uint16_t *)buf)[i] = ghc_f32_to_bf16(base - (float)(i % 4));
        int64_t ts[2] = { L, width };
        w = ghc_st_writer_init(core);
        ck_assert_int_eq(ghc_st_writer_add_raw(w, "text_embed", GHC_DTYPE_BF16, 2, ts, buf), 0);
        snprintf(path, sizeof(path), "%s/%s.text.safetensors", dir, stem);
        ck_assert_int_eq(ghc_st_writer_finish(w, path), 0);
        ghc_st_writer_free(w);
    }
    free(buf);
}

static void write_plain(ghc_core_t *core, const char *dir, const char *stem, float base)
{
    int64_t ls[4] = { 4, 1, 2, 2 };
    write_native(core, dir, stem, GHC_DTYPE_BF16, 4, ls, 3, D, base);
}

/* A config reading `n` datasets; extra goes inside data = { ... }. */
static char *cfg_for(const char *extra, const char *sets)
{
    char *c = malloc(8192);
    ck_assert_ptr_nonnull(c);
    snprintf(c, 8192, "data = { %s datasets = ( %s ); };", extra, sets);
    return c;
}

/* ---- formats ---------------------------------------------------------------------------------- */

START_TEST(test_formats_read_as_they_are)
{
    char *dir = fixture_dir();
    char *cfg = cfg_for("shuffle = false;",
                        "{ path = \"native\"; }, { path = \"musubi\"; }, { path = \"aitk\"; }");
    ghc_core_t *core = core_with(cfg, dir);
    ghc_dataset_t *ds = open_ok(core);
    ck_assert_int_eq(ghc_dataset_samples(ds), 8);
    ck_assert_int_eq(ghc_dataset_size(ds), 8);
    int seen[3] = { 0 };
    for (int64_t i = 0; i < ghc_dataset_samples(ds); i++) {
        struct ghc_data_sample_info si;
        ck_assert(ghc_dataset_sample_at(ds, i, &si));
        seen[si.format]++;
        ck_assert_int_eq(si.latent_shape[0], 16);
        ck_assert_int_eq(si.latent_dtype, GHC_DTYPE_BF16);
        ck_assert_int_eq(si.text_dim, D);
        if (si.format == GHC_DATA_FORMAT_MUSUBI) {
            ck_assert_int_eq(si.dataset, 1);
            ck_assert_msg(strncmp(si.latent_key, "latents_", 8) == 0, "%s", si.latent_key);
            ck_assert_str_eq(si.text_key, "varlen_t5_bfloat16");
            ck_assert_int_eq(si.text_len, strstr(si.latent_file, "vid_") ? 7 : 5);
            if (strstr(si.latent_file, "vid_"))
                ck_assert_msg(strstr(si.text_file, "vid_wan_te"), "clip paired with %s", si.text_file);
        } else if (si.format == GHC_DATA_FORMAT_AITK) {
            ck_assert_int_eq(si.dataset, 2);
            ck_assert_str_eq(si.latent_key, "latent");
            ck_assert_int_eq(si.text_len, 512);          /* padded rows kept as they are */
            ck_assert_ptr_nonnull(si.caption_file);
            ck_assert_msg(strstr(si.text_file, "_t_e_cache/") &&
                          strncmp(strrchr(si.text_file, '/') + 1, strrchr(si.latent_file, '/') + 1, 3) == 0,
                          "%s paired with %s", si.latent_file, si.text_file);
        } else {
            ck_assert_int_eq(si.dataset, 0);
            ck_assert_int_eq(si.has_noise, strstr(si.latent_file, "/a.") != NULL);
            ck_assert_int_eq(si.has_timestep, strstr(si.latent_file, "/a.") != NULL);
        }
    }
    ck_assert_int_eq(seen[GHC_DATA_FORMAT_NATIVE], 3);
    ck_assert_int_eq(seen[GHC_DATA_FORMAT_MUSUBI], 3);
    ck_assert_int_eq(seen[GHC_DATA_FORMAT_AITK], 2);

    /* every sample once per epoch, values as the script wrote them */
    int count[8] = { 0 };
    for (int b = 0; b < 8; b++) {
        struct ghc_data_batch bt;
        ck_assert_msg(ghc_dataset_next(ds, GHC_DEVICE_CPU, NULL, &bt) == 0, "%s", ghc_error_message(core));
        ck_assert_int_eq(bt.n, 1);
        ck_assert_int_eq(bt.epoch, 0);
        ck_assert_int_eq(bt.cursor, b);
        struct ghc_data_sample_info si;
        ghc_dataset_sample_at(ds, bt.index[0], &si);
        count[bt.index[0]]++;
        int s = latent_s(si.latent_file), ts = text_s(si.latent_file);
        ck_assert_int_eq(ghc_tensor_ndim(bt.latents), 5);
        ck_assert_int_eq(ghc_tensor_dim(bt.latents, 0), 1);
        for (int k = 0; k < 4; k++)
            ck_assert_int_eq(ghc_tensor_dim(bt.latents, k + 1), si.latent_shape[k]);
        for (int64_t k = 0; k < ghc_tensor_numel(bt.latents); k++)
            ck_assert_msg(elem(bt.latents, k) == (float)(k % 64) / 8 - 4 + s, "%s [%lld]", si.latent_file, (long long)k);
        ck_assert_int_eq(ghc_tensor_dim(bt.text_embed, 1), si.text_len);
        ck_assert_int_eq(ghc_tensor_dim(bt.text_embed, 2), D);
        int64_t L = si.format == GHC_DATA_FORMAT_AITK ? (s == 5 ? 4 : 9) : si.text_len;
        for (int64_t k = 0; k < si.text_len * D; k++) {
            float want = k < L * D ? (float)(k % 32) / 4 - ts : 0.0f;
            ck_assert_msg(elem(bt.text_embed, k) == want, "%s [%lld]: %g vs %g", si.text_file, (long long)k,
                          elem(bt.text_embed, k), want);
        }
        for (int64_t r = 0; r < si.text_len; r++)
            ck_assert(elem(bt.text_mask, r) == 1.0f);
        if (si.has_noise) {
            ck_assert_ptr_nonnull(bt.noise);
            ck_assert_ptr_nonnull(bt.timesteps);
            for (int64_t k = 0; k < ghc_tensor_numel(bt.noise); k++)
                ck_assert(elem(bt.noise, k) == -(float)((k % 16) / 4) - s);
            ck_assert(elem(bt.timesteps, 0) == 250.0f);
        } else {
            ck_assert_ptr_null(bt.noise);
            ck_assert_ptr_null(bt.timesteps);
        }
        ghc_data_batch_release(ds, &bt);
    }
    for (int i = 0; i < 8; i++)
        ck_assert_int_eq(count[i], 1);
    int64_t e, c;
    ghc_dataset_tell(ds, &e, &c);
    ck_assert_int_eq(e, 1);
    ck_assert_int_eq(c, 0);
    ghc_dataset_free(ds);
    ghc_core_free(core);
    free(cfg);
    free(dir);
}
END_TEST

/* ---- buckets, shuffle, repeats, weights, seek --------------------------------------------------- */

struct rec {
    int64_t epoch, cursor;
    int32_t n;
    int64_t index[4];
    bool    dropped[4];
};

static void record(ghc_dataset_t *ds, struct rec *r, int n)
{
    for (int i = 0; i < n; i++) {
        struct ghc_data_batch bt;
        ck_assert_int_eq(ghc_dataset_next(ds, GHC_DEVICE_CPU, NULL, &bt), 0);
        r[i] = (struct rec){ .epoch = bt.epoch, .cursor = bt.cursor, .n = bt.n };
        ck_assert_int_le(bt.n, 4);
        for (int j = 0; j < bt.n; j++) {
            r[i].index[j] = bt.index[j];
            r[i].dropped[j] = bt.text_dropped[j];
        }
        /* one bucket per batch */
        struct ghc_data_sample_info a, b;
        ghc_dataset_sample_at(ds, bt.index[0], &a);
        for (int j = 1; j < bt.n; j++) {
            ghc_dataset_sample_at(ds, bt.index[j], &b);
            ck_assert_int_eq(a.bucket, b.bucket);
            ck_assert(memcmp(a.latent_shape, b.latent_shape, sizeof(a.latent_shape)) == 0);
        }
        ck_assert_int_eq(ghc_tensor_dim(bt.latents, 0), bt.n);
        ghc_data_batch_release(ds, &bt);
    }
}

static bool same(const struct rec *a, const struct rec *b, int n)
{
    for (int i = 0; i < n; i++)
        if (a[i].epoch != b[i].epoch || a[i].cursor != b[i].cursor || a[i].n != b[i].n ||
            memcmp(a[i].index, b[i].index, (size_t)a[i].n * sizeof(int64_t)) != 0 ||
            memcmp(a[i].dropped, b[i].dropped, (size_t)a[i].n) != 0)
            return false;
    return true;
}

START_TEST(test_buckets_shuffle_determinism)
{
    char *dir = fixture_dir();
    const char *sets = "{ path = \"native\"; repeats = 3; }, { path = \"musubi\"; }, { path = \"aitk\"; }";
    char *c1 = cfg_for("batch_size = 2; seed = 7; text_dropout = 0.3;", sets);
    char *c2 = cfg_for("batch_size = 2; seed = 8; text_dropout = 0.3;", sets);
    ghc_core_t *k1 = core_with(c1, dir), *k2 = core_with(c1, dir), *k3 = core_with(c2, dir);
    ghc_dataset_t *a = open_ok(k1), *b = open_ok(k2), *c = open_ok(k3);
    ck_assert_int_eq(ghc_dataset_size(a), 9 + 3 + 2);
    enum { N = 30 };
    struct rec ra[N], rb[N], rc[N];
    record(a, ra, N);
    record(b, rb, N);
    record(c, rc, N);
    ck_assert(same(ra, rb, N));          /* same seed: same batches, same dropout */
    ck_assert(!same(ra, rc, N));         /* another seed: another order */
    /* each epoch holds every sample repeats times: count epoch 1 */
    int cnt[8] = { 0 }, total = 0;
    for (int i = 0; i < N; i++)
        if (ra[i].epoch == 1)
            for (int j = 0; j < ra[i].n; j++) {
                cnt[ra[i].index[j]]++;
                total++;
            }
    ck_assert_int_eq(total, 14);
    for (int64_t i = 0; i < 8; i++) {
        struct ghc_data_sample_info si;
        ghc_dataset_sample_at(a, i, &si);
        ck_assert_int_eq(cnt[i], si.dataset == 0 ? 3 : 1);
    }
    /* epochs differ in order */
    struct rec *e0 = NULL, *e1 = NULL;
    for (int i = 0; i < N; i++) {
        if (!e0 && ra[i].epoch == 0) e0 = &ra[i];
        if (!e1 && ra[i].epoch == 1) e1 = &ra[i];
    }
    ck_assert_ptr_nonnull(e1);
    ghc_dataset_free(a);
    ghc_dataset_free(b);
    ghc_dataset_free(c);
    ghc_core_free(k1);
    ghc_core_free(k2);
    ghc_core_free(k3);
    free(c1);
    free(c2);
    free(dir);
}
END_TEST

START_TEST(test_weights)
{
    char *dir = fixture_dir();
    char *cfg = cfg_for("seed = 3;", "{ path = \"native\"; repeats = 2; weight = 0.5; }, { path = \"musubi\"; weight = 2.5; }");
    ghc_core_t *core = core_with(cfg, dir);
    ghc_dataset_t *ds = open_ok(core);
    ck_assert_int_eq(ghc_dataset_size(ds), 3 + 8);   /* round(3*2*0.5) + round(3*2.5) */
    enum { N = 11 * 6 };
    struct rec r[N];
    record(ds, r, N);
    int per_epoch[6][8];
    memset(per_epoch, 0, sizeof(per_epoch));
    for (int i = 0; i < N; i++)
        per_epoch[r[i].epoch][r[i].index[0]]++;
    bool picks_differ = false;
    for (int e = 0; e < 6; e++) {
        int nat = 0, mus = 0;
        for (int64_t s = 0; s < 6; s++) {
            struct ghc_data_sample_info si;
            ghc_dataset_sample_at(ds, s, &si);
            if (si.dataset == 0) {
                nat += per_epoch[e][s];
                ck_assert_int_eq(per_epoch[e][s], 1);
            } else {
                mus += per_epoch[e][s];
                ck_assert(per_epoch[e][s] == 2 || per_epoch[e][s] == 3);   /* 2 each + 2 picked */
            }
        }
        ck_assert_int_eq(nat, 3);
        ck_assert_int_eq(mus, 8);
        if (e && memcmp(per_epoch[e], per_epoch[0], sizeof(per_epoch[0])) != 0)
            picks_differ = true;
    }
    ck_assert_msg(picks_differ, "the weighted picks are the same in every epoch");
    ghc_dataset_free(ds);
    ghc_core_free(core);
    free(cfg);
    free(dir);
}
END_TEST

START_TEST(test_seek_tell_resume)
{
    char *dir = fixture_dir();
    char *cfg = cfg_for("batch_size = 2; text_dropout = 0.5;",
                        "{ path = \"native\"; repeats = 2; }, { path = \"musubi\"; }, { path = \"aitk\"; }");
    ghc_core_t *core = core_with(cfg, dir);
    ghc_dataset_t *ds = open_ok(core);
    enum { N = 20, K = 7 };
    struct rec r[N], again[N - K];
    int64_t e, c;
    record(ds, r, K);
    ck_assert_int_eq(ghc_dataset_tell(ds, &e, &c), 0);
    record(ds, r + K, N - K);
    ck_assert_int_eq(r[K].epoch, e);
    ck_assert_int_eq(r[K].cursor, c);
    /* the same instance */
    ck_assert_int_eq(ghc_dataset_seek(ds, e, c), 0);
    record(ds, again, N - K);
    ck_assert(same(r + K, again, N - K));
    /* a fresh one, as after a restart from a checkpoint */
    ghc_core_t *core2 = core_with(cfg, dir);
    ghc_dataset_t *ds2 = open_ok(core2);
    ck_assert_int_eq(ghc_dataset_seek(ds2, e, c), 0);
    record(ds2, again, N - K);
    ck_assert(same(r + K, again, N - K));
    /* from the middle of a later epoch */
    ck_assert_int_eq(ghc_dataset_seek(ds2, r[15].epoch, r[15].cursor), 0);
    record(ds2, again, N - 15);
    ck_assert(same(r + 15, again, N - 15));
    /* the end of an epoch is the start of the next */
    ck_assert_int_eq(ghc_dataset_seek(ds2, 0, ghc_dataset_size(ds2)), 0);
    ghc_dataset_tell(ds2, &e, &c);
    ck_assert_int_eq(e, 1);
    ck_assert_int_eq(c, 0);
    /* a cursor inside a batch (batches of 2 start at even cursors) */
    int64_t odd = -1;
    for (int i = 0; i < N && odd < 0; i++)
        if (r[i].n == 2)
            odd = r[i].cursor + 1, e = r[i].epoch;
    ck_assert_int_eq(ghc_dataset_seek(ds2, e, odd), GHC_EINVAL);
    ck_assert_msg(strstr(ghc_error_message(core2), "not the start of a batch"), "%s", ghc_error_message(core2));
    ck_assert_int_eq(ghc_dataset_seek(ds2, -1, 0), GHC_EINVAL);
    ghc_dataset_free(ds);
    ghc_dataset_free(ds2);
    ghc_core_free(core);
    ghc_core_free(core2);
    free(cfg);
    free(dir);
}
END_TEST

/* ---- text dropout ------------------------------------------------------------------------------ */

static void dropout_rate(bool with_empty)
{
    char *dir = fixture_dir();
    char *cfg = cfg_for(with_empty ? "text_dropout = 0.25; empty_prompt = \"empty_prompt.safetensors\";"
                                   : "text_dropout = 0.25;",
                        "{ path = \"native\"; repeats = 700; }");
    ghc_core_t *core = core_with(cfg, dir);
    ghc_dataset_t *ds = open_ok(core);
    int64_t n = ghc_dataset_size(ds), dropped = 0;
    ck_assert_int_eq(n, 2100);
    for (int64_t i = 0; i < n; i++) {
        struct ghc_data_batch bt;
        ck_assert_int_eq(ghc_dataset_next(ds, GHC_DEVICE_CPU, NULL, &bt), 0);
        struct ghc_data_sample_info si;
        ghc_dataset_sample_at(ds, bt.index[0], &si);
        if (bt.text_dropped[0]) {
            dropped++;
            int64_t L = with_empty ? 1 : si.text_len;
            ck_assert_int_eq(ghc_tensor_dim(bt.text_embed, 1), L);
            for (int64_t k = 0; k < L * D; k++)
                ck_assert(elem(bt.text_embed, k) == (with_empty ? (float)(k % D) / 8 + 0.5f : 0.0f));
            ck_assert(elem(bt.text_mask, 0) == 1.0f);
        } else {
            ck_assert_int_eq(ghc_tensor_dim(bt.text_embed, 1), si.text_len);
            ck_assert(elem(bt.text_embed, 1) == 0.25f - text_s(si.latent_file));
        }
        ghc_data_batch_release(ds, &bt);
    }
    double rate = (double)dropped / (double)n;
    /* binomial(2100, 0.25): sd 0.0095; 4 sd */
    ck_assert_msg(fabs(rate - 0.25) < 0.038, "dropout rate %g, configured 0.25", rate);
    struct ghc_data_stats st = { .struct_size = sizeof(st) };
    ck_assert_int_eq(ghc_dataset_stats(ds, &st), 0);
    ck_assert_int_eq(st.text_dropped, dropped);
    ck_assert_int_eq(st.batches, n);
    ghc_dataset_free(ds);
    ghc_core_free(core);
    free(cfg);
    free(dir);
}

START_TEST(test_text_dropout_empty_prompt) { dropout_rate(true); }
END_TEST
START_TEST(test_text_dropout_zeros) { dropout_rate(false); }
END_TEST

/* batch_size 3 with texts of different L: zero padding and the mask */
START_TEST(test_padding_and_mask)
{
    char *tmp = tu_tmpdir();
    ghc_core_t *w = ghc_core_init();
    int64_t ls[4] = { 4, 1, 2, 2 };
    write_native(w, tmp, "s1", GHC_DTYPE_BF16, 4, ls, 2, D, 1.0f);
    write_native(w, tmp, "s2", GHC_DTYPE_BF16, 4, ls, 5, D, 2.0f);
    write_native(w, tmp, "s3", GHC_DTYPE_BF16, 4, ls, 3, D, 3.0f);
    char *cfg = cfg_for("batch_size = 3;", "{ path = \".\"; }");
    ghc_core_t *core = core_with(cfg, tmp);
    ghc_dataset_t *ds = open_ok(core);
    struct ghc_data_batch bt;
    ck_assert_int_eq(ghc_dataset_next(ds, GHC_DEVICE_CPU, NULL, &bt), 0);
    ck_assert_int_eq(bt.n, 3);
    ck_assert_int_eq(ghc_tensor_dim(bt.text_embed, 1), 5);
    for (int i = 0; i < 3; i++) {
        struct ghc_data_sample_info si;
        ghc_dataset_sample_at(ds, bt.index[i], &si);
        float base = (float)(si.latent_file[strlen(si.latent_file) - strlen(".latent.safetensors") - 1] - '0');
        for (int64_t r = 0; r < 5; r++) {
            ck_assert(elem(bt.text_mask, i * 5 + r) == (r < si.text_len ? 1.0f : 0.0f));
            for (int64_t d = 0; d < D; d++) {
                float want = r < si.text_len ? base - (float)((r * D + d) % 4) : 0.0f;
                ck_assert(elem(bt.text_embed, (i * 5 + r) * D + d) == want);
            }
        }
        ck_assert(elem(bt.latents, i * 16) == base);
    }
    ghc_data_batch_release(ds, &bt);
    ghc_dataset_free(ds);
    ghc_core_free(core);
    ghc_core_free(w);
    tu_rm_rf(tmp);
    free(tmp);
    free(cfg);
}
END_TEST

/* ---- bad input ------------------------------------------------------------------------------------ */

/* A temp dataset with 3 good samples and one bad one made by `spoil`: the error names
 * `culprit` and says `what`; with skip_bad_samples exactly that sample is skipped. */
static void bad_check_in(void (*spoil)(ghc_core_t *w, const char *dir), int code, const char *culprit,
                         const char *what, const char *backend)
{
    char *tmp = tu_tmpdir();
    ck_assert_int_eq(chmod(tmp, 0755), 0);
    ghc_core_t *w = ghc_core_init();
    write_plain(w, tmp, "g1", 1.0f);
    write_plain(w, tmp, "g2", 2.0f);
    write_plain(w, tmp, "g3", 3.0f);
    spoil(w, tmp);
    char full[4300];
    snprintf(full, sizeof(full), "%s/%s", tmp, culprit);
    for (int skip = 0; skip < 2; skip++) {
        char *c0 = cfg_for(skip ? "skip_bad_samples = true;" : "", "{ path = \".\"; compression = \"lz4\"; }");
        char *cfg = malloc(strlen(c0) + strlen(backend) + 2);
        sprintf(cfg, "%s\n%s", backend, c0);
        free(c0);
        ghc_core_t *core = core_with(cfg, tmp);
        if (!skip) {
            const char *msg = open_fails(core, code);
            ck_assert_msg(strstr(msg, full), "the message does not name %s: %s", full, msg);
            ck_assert_msg(strstr(msg, what), "the message lacks \"%s\": %s", what, msg);
        } else {
            ghc_dataset_t *ds = open_ok(core);
            struct ghc_data_stats st = { .struct_size = sizeof(st) };
            ghc_dataset_stats(ds, &st);
            ck_assert_int_eq(st.skipped, 1);
            ck_assert_int_eq(st.samples, 3);
            ghc_dataset_free(ds);
        }
        ghc_core_free(core);
        free(cfg);
    }
    ghc_core_free(w);
    tu_rm_rf(tmp);
    free(tmp);
}

static void bad_check(void (*spoil)(ghc_core_t *w, const char *dir), int code, const char *culprit,
                      const char *what)
{
    bad_check_in(spoil, code, culprit, what, "");
    bad_check_in(spoil, code, culprit, what, "backend = { plugin = \"in_memory\"; num_workers = 2; };");
}

static void spoil_missing_text(ghc_core_t *w, const char *dir)
{
    int64_t ls[4] = { 4, 1, 2, 2 };
    write_native(w, dir, "bad", GHC_DTYPE_BF16, 4, ls, 0, D, 0.0f);   /* no text file */
}
static void spoil_missing_latent(ghc_core_t *w, const char *dir)
{
    char p[4200];
    write_plain(w, dir, "bad", 0.0f);
    snprintf(p, sizeof(p), "%s/bad.latent.safetensors", dir);
    ck_assert_int_eq(unlink(p), 0);
}
static void spoil_shape(ghc_core_t *w, const char *dir)
{
    int64_t ls[3] = { 4, 2, 2 };
    write_native(w, dir, "bad", GHC_DTYPE_BF16, 3, ls, 3, D, 0.0f);
}
static void spoil_dtype(ghc_core_t *w, const char *dir)
{
    int64_t ls[4] = { 4, 1, 2, 2 };
    write_native(w, dir, "bad", GHC_DTYPE_I32, 4, ls, 3, D, 0.0f);
}
static void spoil_width(ghc_core_t *w, const char *dir)
{
    int64_t ls[4] = { 4, 1, 2, 2 };
    write_native(w, dir, "bad", GHC_DTYPE_BF16, 4, ls, 3, D + 1, 0.0f);
}
static void spoil_truncated(ghc_core_t *w, const char *dir)
{
    char p[4200];
    write_plain(w, dir, "bad", 0.0f);
    snprintf(p, sizeof(p), "%s/bad.latent.safetensors", dir);
    ck_assert_int_eq(truncate(p, 60), 0);
}

START_TEST(test_bad_missing_text)
{ bad_check(spoil_missing_text, GHC_ENOTFOUND, "bad.latent.safetensors", "text embedding is missing"); }
END_TEST
START_TEST(test_bad_missing_latent)
{ bad_check(spoil_missing_latent, GHC_ENOTFOUND, "bad.text.safetensors", "latent"); }
END_TEST
START_TEST(test_bad_shape)
{ bad_check(spoil_shape, GHC_EFORMAT, "bad.latent.safetensors", "expected [C, F, H, W]"); }
END_TEST
START_TEST(test_bad_dtype)
{ bad_check(spoil_dtype, GHC_EFORMAT, "bad.latent.safetensors", "I32"); }
END_TEST
START_TEST(test_bad_text_width)
{ bad_check(spoil_width, GHC_EFORMAT, "bad.text.safetensors", "has width 33, but"); }
END_TEST
START_TEST(test_bad_truncated)
{ bad_check(spoil_truncated, GHC_EFORMAT, "bad.latent.safetensors", "truncated"); }
END_TEST

static void spoil_unreadable(ghc_core_t *w, const char *dir)
{
    char p[4200];
    write_plain(w, dir, "bad", 0.0f);
    snprintf(p, sizeof(p), "%s/bad.latent.safetensors", dir);
    ck_assert_int_eq(chmod(p, 0), 0);
}

START_TEST(test_bad_unreadable)
{
    open_as_nobody = true;
    bad_check(spoil_unreadable, GHC_EIO, "bad.latent.safetensors", "Permission denied");
    open_as_nobody = false;
}
END_TEST

/* a .ghz file (stored compressed) with one byte flipped in its first block */
static void spoil_corrupt_block(ghc_core_t *w, const char *dir)
{
    char p[4200];
    write_plain(w, dir, "bad", 0.0f);
    snprintf(p, sizeof(p), "%s/bad.latent.safetensors", dir);
    FILE *f = fopen(p, "rb");
    static uint8_t raw[4096];
    size_t n = fread(raw, 1, sizeof(raw), f);
    fclose(f);
    unlink(p);
    void *z;
    size_t zl;
    ck_assert_int_eq(ghz_encode(GHC_COMPRESSION_LZ4, 64, raw, n, &z, &zl), 0);
    ((uint8_t *)z)[GHZ_HEAD + 8 * ((n + 63) / 64) + 3] ^= 0x5a;
    strcat(p, ".ghz");
    f = fopen(p, "wb");
    fwrite(z, 1, zl, f);
    fclose(f);
    free(z);
}

START_TEST(test_bad_corrupt_block)
{
    bad_check_in(spoil_corrupt_block, GHC_EFORMAT, "bad.latent.safetensors.ghz", "block 0 of",
                 "backend = { plugin = \"in_memory\"; };");
}
END_TEST

/* ---- the in_memory backend -------------------------------------------------------------------- */

/* All batches of one epoch of the fixtures, unshuffled, as bytes. */
static void epoch_bytes(const char *backend, const char *sets, uint8_t **out, size_t *len,
                        struct ghc_backend_stats *bst)
{
    char *dir = fixture_dir();
    char *c0 = cfg_for("shuffle = false; batch_size = 2;", sets);
    char *cfg = malloc(strlen(c0) + strlen(backend) + 2);
    sprintf(cfg, "%s\n%s", backend, c0);
    ghc_core_t *core = core_with(cfg, dir);
    ghc_dataset_t *ds = open_ok(core);
    size_t cap = 1 << 20, n = 0;
    uint8_t *buf = malloc(cap);
    int64_t e = 0;
    while (e == 0) {
        struct ghc_data_batch bt;
        ck_assert_msg(ghc_dataset_next(ds, GHC_DEVICE_CPU, NULL, &bt) == 0, "%s", ghc_error_message(core));
        ghc_tensor_t *ts[3] = { bt.latents, bt.text_embed, bt.text_mask };
        for (int i = 0; i < 3; i++) {
            size_t k = ghc_tensor_nbytes(ts[i]);
            ck_assert(n + k <= cap);
            memcpy(buf + n, ghc_tensor_cdata(ts[i]), k);
            n += k;
        }
        ghc_data_batch_release(ds, &bt);
        int64_t c;
        ghc_dataset_tell(ds, &e, &c);
    }
    memset(bst, 0, sizeof(*bst));
    if (ghc_backend_get(core))
        ghc_backend_stats(ghc_backend_get(core), bst);
    ghc_dataset_free(ds);
    ghc_core_free(core);
    free(c0);
    free(cfg);
    free(dir);
    *out = buf;
    *len = n;
}

START_TEST(test_compression_round_trip)
{
    static const char *const comps[] = { "none", "lz4", "zlib", "snappy" };
    const char *plain = "{ path = \"native\"; }, { path = \"musubi\"; }, { path = \"aitk\"; }";
    uint8_t *ref;
    size_t ref_len;
    struct ghc_backend_stats st;
    epoch_bytes("", plain, &ref, &ref_len, &st);
    ck_assert_uint_gt(ref_len, 60000);
    for (int c = 0; c < 5; c++) {
        char sets[512];
        if (c < 4)
            snprintf(sets, sizeof(sets), "{ path = \"native\"; compression = \"%s\"; }, { path = \"musubi\"; compression = \"%s\"; }, "
                     "{ path = \"aitk\"; compression = \"%s\"; }", comps[c], comps[c], comps[c]);
        else   /* one compression per dataset */
            snprintf(sets, sizeof(sets), "{ path = \"native\"; compression = \"lz4\"; }, { path = \"musubi\"; compression = \"zlib\"; }, "
                     "{ path = \"aitk\"; compression = \"snappy\"; }");
        uint8_t *got;
        size_t got_len;
        /* 1 KiB blocks: reads cross block boundaries */
        epoch_bytes("backend = { plugin = \"in_memory\"; num_workers = 3; block_kib = 1; };", sets, &got, &got_len, &st);
        ck_assert_uint_eq(got_len, ref_len);
        ck_assert_msg(memcmp(got, ref, ref_len) == 0, "%s: batches differ from the local backend's", c < 4 ? comps[c] : "mixed");
        ck_assert_uint_eq(st.files, 18);   /* 15 .safetensors + 3 captions */
        ck_assert_uint_gt(st.raw_bytes, 60000);
        if (c == 0)
            ck_assert_uint_eq(st.stored_bytes, st.raw_bytes);
        else   /* the zero-padded ai-toolkit texts compress well */
            ck_assert_msg(st.stored_bytes < st.raw_bytes / 2, "%s: %llu of %llu bytes", c < 4 ? comps[c] : "mixed",
                          (unsigned long long)st.stored_bytes, (unsigned long long)st.raw_bytes);
        free(got);
    }
    free(ref);
}
END_TEST

/* read() at every offset and length class against the file on disk */
START_TEST(test_in_memory_reads)
{
    char *dir = fixture_dir();
    char *cfg = cfg_for("", "{ path = \"aitk\"; compression = \"zlib\"; }");
    char *full = malloc(strlen(cfg) + 200);
    sprintf(full, "backend = { plugin = \"in_memory\"; block_kib = 2; };\n%s", cfg);
    ghc_core_t *core = core_with(full, dir);
    ghc_dataset_t *ds = open_ok(core);
    ghc_backend_t *b = ghc_backend_get(core);
    struct ghc_data_sample_info si;
    ghc_dataset_sample_at(ds, 0, &si);
    char path[4200];
    snprintf(path, sizeof(path), "%s/aitk/%s", dir, strchr(si.text_file, '/') + 1);
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    static uint8_t disk[40000], mem[40000];
    size_t n = fread(disk, 1, sizeof(disk), f);
    fclose(f);
    uint64_t size;
    ck_assert_int_eq(ghc_backend_stat(b, si.text_file, &size), 0);
    ck_assert_uint_eq(size, n);
    static const size_t offs[] = { 0, 1, 2047, 2048, 2049, 5000, 32000 };
    static const size_t lens[] = { 1, 7, 2048, 4097, 40000 };
    for (size_t i = 0; i < sizeof(offs) / sizeof(offs[0]); i++)
        for (size_t j = 0; j < sizeof(lens) / sizeof(lens[0]); j++) {
            size_t got;
            ck_assert_int_eq(ghc_backend_read(b, si.text_file, offs[i], mem, lens[j], &got), 0);
            size_t want = offs[i] >= n ? 0 : (n - offs[i] < lens[j] ? n - offs[i] : lens[j]);
            ck_assert_uint_eq(got, want);
            ck_assert(memcmp(mem, disk + offs[i], got) == 0);
        }
    const void *m;
    ck_assert_int_eq(ghc_backend_map(b, si.text_file, &m, &size), GHC_EUNSUPPORTED);   /* compressed */
    ck_assert_int_eq(ghc_backend_stat(b, "0/absent", &size), GHC_ENOTFOUND);
    ghc_dataset_free(ds);
    ghc_core_free(core);
    free(cfg);
    free(full);
    free(dir);
}
END_TEST

START_TEST(test_memory_limit)
{
    char *dir = fixture_dir();
    char *c0 = cfg_for("", "{ path = \"aitk\"; compression = \"lz4\"; }, { path = \"musubi\"; }");
    char *cfg = malloc(strlen(c0) + 200);
    sprintf(cfg, "backend = {\n plugin = \"in_memory\";\n memory_limit_gb = 0.000002; };\n%s", c0);
    ghc_core_t *core = core_with(cfg, dir);
    const char *msg = open_fails(core, GHC_ENOMEM);
    ck_assert_msg(strstr(msg, "t.cfg:3: in_memory: staging 11 files") && strstr(msg, "needs an estimated") &&
                  strstr(msg, "over memory_limit_gb = 2e-06"), "%s", msg);
    ghc_core_free(core);
    /* a limit that fits */
    sprintf(cfg, "backend = { plugin = \"in_memory\"; memory_limit_gb = 0.001; };\n%s", c0);
    core = core_with(cfg, dir);
    ghc_dataset_t *ds = open_ok(core);
    ghc_dataset_free(ds);
    ghc_core_free(core);
    free(c0);
    free(cfg);
    free(dir);
}
END_TEST

/* ---- caches ------------------------------------------------------------------------------------ */

/* Two epochs through `sections`; the bytes of epoch 0 and the cache's statistics. */
static void cached_epochs(const char *sections, const char *dir, uint8_t **out, size_t *len, struct ghc_cache_stats *cst,
                          struct ghc_mem_stats *mst)
{
    char *c0 = cfg_for("shuffle = false; batch_size = 2;",
                       "{ path = \"native\"; }, { path = \"musubi\"; }, { path = \"aitk\"; }");
    char *cfg = malloc(strlen(c0) + strlen(sections) + 2);
    sprintf(cfg, "%s\n%s", sections, c0);
    ghc_core_t *core = core_with(cfg, dir);
    ghc_dataset_t *ds = open_ok(core);
    size_t cap = 1 << 20, n = 0;
    uint8_t *buf = malloc(cap);
    for (int i = 0; i < 12; i++) {   /* 6 batches per epoch */
        struct ghc_data_batch bt;
        ck_assert_msg(ghc_dataset_next(ds, GHC_DEVICE_CPU, NULL, &bt) == 0, "%s", ghc_error_message(core));
        ghc_tensor_t *ts[3] = { bt.latents, bt.text_embed, bt.text_mask };
        for (int j = 0; j < 3 && bt.epoch == 0; j++) {
            size_t k = ghc_tensor_nbytes(ts[j]);
            memcpy(buf + n, ghc_tensor_cdata(ts[j]), k);
            n += k;
        }
        ghc_data_batch_release(ds, &bt);
    }
    ghc_cache_t *c = ghc_cache_get(core);
    ck_assert_ptr_nonnull(c);
    ck_assert_int_eq(ghc_cache_count(c), 8);
    ghc_cache_stats(c, cst);
    memset(mst, 0, sizeof(*mst));
    mst->struct_size = sizeof(*mst);
    ghc_mem_stats(ghc_mempolicy_get(core), mst);
    ghc_dataset_free(ds);
    ghc_core_free(core);
    free(c0);
    free(cfg);
    *out = buf;
    *len = n;
}

START_TEST(test_caches)
{
    char *dir = fixture_dir();
    uint8_t *ref, *got;
    size_t ref_len, got_len;
    struct ghc_backend_stats bst;
    struct ghc_cache_stats cst;
    struct ghc_mem_stats mst;
    epoch_bytes("", "{ path = \"native\"; }, { path = \"musubi\"; }, { path = \"aitk\"; }", &ref, &ref_len, &bst);
    /* disk, room for everything: the second epoch hits */
    cached_epochs("mempolicy = { plugin = \"host\"; }; cache = { plugin = \"disk\"; };", dir, &got, &got_len, &cst, &mst);
    ck_assert_uint_eq(got_len, ref_len);
    ck_assert(memcmp(got, ref, ref_len) == 0);
    ck_assert_uint_eq(cst.misses, 18);           /* 8 latents + 8 texts + noise and t of a, once */
    ck_assert_uint_ge(cst.hits, 18);
    ck_assert_uint_eq(cst.evictions, 0);
    free(got);
    /* disk, 20 KB: the 33 KB ai-toolkit texts cannot stay */
    cached_epochs("mempolicy = { plugin = \"host\"; }; backend = { plugin = \"in_memory\"; };\n"
                  "cache = { plugin = \"disk\"; max_mb = 0.02; };", dir, &got, &got_len, &cst, &mst);
    ck_assert(memcmp(got, ref, ref_len) == 0);
    ck_assert_uint_gt(cst.evictions, 0);
    ck_assert_uint_le(cst.held_bytes, 20972);
    ck_assert_uint_gt(cst.misses, 18);
    free(got);
    /* unified_memory: held through the mempolicy with their roles; persisted, then read back */
    char *tmp = tu_tmpdir(), sec[4600];
    snprintf(sec, sizeof(sec), "mempolicy = { plugin = \"host\"; };\ncache = { plugin = \"unified_memory\"; persistent_cache = \"%s/pc\"; };", tmp);
    cached_epochs(sec, dir, &got, &got_len, &cst, &mst);
    ck_assert(memcmp(got, ref, ref_len) == 0);
    ck_assert_uint_eq(cst.persisted, 17);        /* 18 decoded; the two clips share one text file */
    ck_assert_uint_eq(cst.persist_hits, 1);
    ck_assert_uint_gt(mst.bytes_role[GHC_ROLE_LATENTS], 0);
    ck_assert_uint_gt(mst.bytes_role[GHC_ROLE_TEXT_EMBEDS], 65536);
    free(got);
    cached_epochs(sec, dir, &got, &got_len, &cst, &mst);
    ck_assert(memcmp(got, ref, ref_len) == 0);
    ck_assert_uint_eq(cst.persist_hits, 18);
    ck_assert_uint_eq(cst.persisted, 0);
    free(got);
    tu_rm_rf(tmp);
    free(tmp);
    free(ref);
    free(dir);
}
END_TEST

/* ---- configuration -------------------------------------------------------------------------------- */

START_TEST(test_config_errors)
{
    char *dir = fixture_dir();
    static const struct { const char *cfg; const char *want; } cases[] = {
        { "data = {\n batch_sise = 2;\n datasets = ( { path = \"native\"; } ); };", "t.cfg:2: data: unknown key 'batch_sise' (did you mean 'batch_size'?)" },
        { "data = { datasets = ( { path = \"native\"; },\n { path = \"aitk\";\n repeat = 2; } ); };", "t.cfg:3: data.datasets[1]: unknown key 'repeat'" },
        { "data = { datasets = ( { path = \"native\";\n compression = \"zstd\"; } ); };", "t.cfg:2: data.datasets[0].compression = \"zstd\" is not one of" },
        { "data = {\n batch_size = 0; datasets = ( { path = \"native\"; } ); };", "t.cfg:2: data.batch_size = 0 is out of range" },
        { "data = { datasets = ( { repeats = 2; } ); };", "missing key 'path'" },
        { "data = { batch_size = 1; };", "no datasets" },
        { "data = {\n text_dropout = 1.5; datasets = ( { path = \"native\"; } ); };", "t.cfg:2: data.text_dropout = 1.5 is out of range" },
        { "data = { datasets = ( { path = \"nowhere\"; } ); };", "nowhere: No such file or directory" },
        { "data = { datasets = ( { path = \"musubi\"; } ); empty_prompt = \"absent.safetensors\"; };", "absent.safetensors" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        ghc_core_t *core = ghc_core_init();
        ck_assert_int_eq(ghc_config_load_string(core, cases[i].cfg, "t.cfg", dir, NULL, 0), 0);
        ghc_dataset_t *ds = NULL;
        ck_assert_int_lt(ghc_dataset_open(core, &ds), 0);
        ck_assert_ptr_null(ds);
        ck_assert_msg(strstr(ghc_error_message(core), cases[i].want), "case %zu: \"%s\" lacks \"%s\"", i,
                      ghc_error_message(core), cases[i].want);
        ghc_core_free(core);
    }
    /* the top-level section is declared: a typo there is caught at load */
    ghc_core_t *core = ghc_core_init();
    ck_assert_int_eq(ghc_config_load_string(core, "dta = { };", "t.cfg", dir, NULL, 0), GHC_ECONFIG);
    ck_assert_msg(strstr(ghc_error_message(core), "did you mean 'data'"), "%s", ghc_error_message(core));
    ghc_core_free(core);
    free(dir);
}
END_TEST

/* ---- the suite ------------------------------------------------------------------------------------- */

static Suite *data_suite(void)
{
    Suite *s = suite_create("data");
    TCase *tc = tcase_create("dataset");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_formats_read_as_they_are);
    tcase_add_test(tc, test_buckets_shuffle_determinism);
    tcase_add_test(tc, test_weights);
    tcase_add_test(tc, test_seek_tell_resume);
    tcase_add_test(tc, test_text_dropout_empty_prompt);
    tcase_add_test(tc, test_text_dropout_zeros);
    tcase_add_test(tc, test_padding_and_mask);
    tcase_add_test(tc, test_config_errors);
    suite_add_tcase(s, tc);
    TCase *bad = tcase_create("bad_input");
    tcase_add_test(bad, test_bad_missing_text);
    tcase_add_test(bad, test_bad_missing_latent);
    tcase_add_test(bad, test_bad_shape);
    tcase_add_test(bad, test_bad_dtype);
    tcase_add_test(bad, test_bad_text_width);
    tcase_add_test(bad, test_bad_truncated);
    tcase_add_test(bad, test_bad_unreadable);
    tcase_add_test(bad, test_bad_corrupt_block);
    suite_add_tcase(s, bad);
    TCase *im = tcase_create("in_memory");
    tcase_set_timeout(im, 60);
    tcase_add_test(im, test_compression_round_trip);
    tcase_add_test(im, test_in_memory_reads);
    tcase_add_test(im, test_memory_limit);
    tcase_add_test(im, test_caches);
    suite_add_tcase(s, im);
    return s;
}

int main(void) { return tu_run_suite(data_suite(), false); }
