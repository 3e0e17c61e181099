/* test_data.c: the dataset (core/dataset.c, data_*.c) with the `local` backend, the in_memory backend
 * and the disk cache: musubi-tuner, ai-toolkit and gh200core fixtures read as they are
 * (tests/fixtures/make_data_fixtures.py), buckets, shuffling, repeats and weights, seek/tell,
 * text dropout, round trips through every compression, the memory limit, and each bad input;
 * f16 caches written by the peers' own code (make_peer_cache_fixtures.py) served as f32, and
 * ai-toolkit's text files picked by the hash of the caption. */
#define _GNU_SOURCE   /* RTLD_NEXT */
#include <check.h>
#include <dlfcn.h>
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

/* A sample stem.{latent,text}.safetensors of f32 values with stored noise and timestep: element
 * 1 of tensor `spoil` (element 0 of "timestep"; NULL: none) is v. */
static void write_valued(ghc_core_t *w, const char *dir, const char *stem, const char *spoil, float v)
{
    static const char *const names[] = { "latent", "noise", "timestep", "text_embed" };
    static const int64_t shapes[][4] = { { 4, 1, 2, 2 }, { 4, 1, 2, 2 }, { 1 }, { 3, D } };
    static const int nd[] = { 4, 4, 1, 2 };
    static const float fill[] = { 1.0f, 0.5f, 500.0f, 0.25f };
    static float buf[3 * D];
    char path[4200];
    ghc_st_writer_t *lw = ghc_st_writer_init(w), *tw = ghc_st_writer_init(w);
    for (int k = 0; k < 4; k++) {
        int64_t n = 1;
        for (int i = 0; i < nd[k]; i++)
            n *= shapes[k][i];
        for (int64_t i = 0; i < n; i++)
            buf[i] = fill[k];
        if (spoil && !strcmp(spoil, names[k]))
            buf[n > 1] = v;
        ck_assert_int_eq(ghc_st_writer_add_raw(k == 3 ? tw : lw, names[k], GHC_DTYPE_F32, nd[k], shapes[k], buf), 0);
    }
    snprintf(path, sizeof(path), "%s/%s.latent.safetensors", dir, stem);
    ck_assert_int_eq(ghc_st_writer_finish(lw, path), 0);
    snprintf(path, sizeof(path), "%s/%s.text.safetensors", dir, stem);
    ck_assert_int_eq(ghc_st_writer_finish(tw, path), 0);
    ghc_st_writer_free(lw);
    ghc_st_writer_free(tw);
}

/* A NaN or an infinity in a sample's latent, noise or text embedding, or a stored timestep that
 * is NaN, negative or huge: the batch that loads it fails naming the file and the tensor, or
 * with skip_bad_samples leaves the sample out, counted (it used to reach the forward: a
 * non-finite loss every epoch naming no sample, or exit 5 naming no file). */
START_TEST(test_bad_values)
{
    static const struct { const char *tensor; float v; const char *file, *what; } cases[] = {
        { "latent", NAN, "bad.latent.safetensors", "\"latent\": element 1 is nan" },
        { "latent", -INFINITY, "bad.latent.safetensors", "\"latent\": element 1 is -inf" },
        { "noise", INFINITY, "bad.latent.safetensors", "\"noise\": element 1 is inf" },
        { "text_embed", NAN, "bad.text.safetensors", "\"text_embed\": element 1 is nan" },
        { "timestep", NAN, "bad.latent.safetensors", "\"timestep\": element 0 is nan" },
        { "timestep", -5000.0f, "bad.latent.safetensors", "\"timestep\" is -5000: a stored timestep is in (0, 1000]" },
        { "timestep", 1e30f, "bad.latent.safetensors", "\"timestep\" is 1e+30" },
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        char *tmp = tu_tmpdir(), full[4300];
        ghc_core_t *w = ghc_core_init();
        write_valued(w, tmp, "g1", NULL, 0.0f);
        write_valued(w, tmp, "g2", NULL, 0.0f);
        write_valued(w, tmp, "g3", NULL, 0.0f);
        write_valued(w, tmp, "bad", cases[c].tensor, cases[c].v);
        ghc_core_free(w);
        snprintf(full, sizeof(full), "%s/%s", tmp, cases[c].file);
        for (int skip = 0; skip < 2; skip++) {
            char *cfg = cfg_for(skip ? "skip_bad_samples = true; shuffle = false; text_dropout = 0.0;"
                                     : "shuffle = false; text_dropout = 0.0;", "{ path = \".\"; }");
            ghc_core_t *core = core_with(cfg, tmp);
            ghc_dataset_t *ds = open_ok(core);
            int rc = 0, got = 0;
            struct ghc_data_stats st = { .struct_size = sizeof(st) };
            while (got + st.skipped < 4 && rc == 0) {   /* one epoch */
                struct ghc_data_batch bt;
                if ((rc = ghc_dataset_next(ds, GHC_DEVICE_CPU, NULL, &bt)) == 0) {
                    got += bt.n;
                    ghc_data_batch_release(ds, &bt);
                }
                ghc_dataset_stats(ds, &st);
            }
            if (!skip) {
                const char *msg = ghc_error_message(core);
                ck_assert_msg(rc == GHC_EFORMAT && strstr(msg, full) && strstr(msg, cases[c].what),
                              "case %zu: %d: %s", c, rc, msg);
            } else {
                ck_assert_msg(rc == 0 && st.skipped == 1 && got == 3, "case %zu: %d, %lld skipped, %d served: %s", c,
                              rc, (long long)st.skipped, got, ghc_error_message(core));
            }
            ghc_dataset_free(ds);
            ghc_core_free(core);
            free(cfg);
        }
        tu_rm_rf(tmp);
        free(tmp);
    }
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

/* The first latent value of one epoch's first batch through a unified_memory cache persisted
 * in `pc`, of the dataset in `dir`. */
static float persisted_first(const char *dir, const char *pc)
{
    char cfg[8400];
    snprintf(cfg, sizeof(cfg), "mempolicy = { plugin = \"host\"; };\ncache = { plugin = \"unified_memory\"; "
             "persistent_cache = \"%s\"; };\ndata = { shuffle = false; datasets = ( { path = \".\"; } ); };", pc);
    ghc_core_t *core = core_with(cfg, dir);
    ghc_dataset_t *ds = open_ok(core);
    struct ghc_data_batch bt;
    ck_assert_msg(ghc_dataset_next(ds, GHC_DEVICE_CPU, NULL, &bt) == 0, "%s", ghc_error_message(core));
    float v = elem(bt.latents, 0);
    ghc_data_batch_release(ds, &bt);
    ghc_dataset_free(ds);
    ghc_core_free(core);
    return v;
}

/* The persistent cache is keyed by the content of each source file, not by its name: another
 * dataset with the same file names, or a file rewritten in place with other values of the same
 * shape, is decoded anew (both used to be served the first dataset's tensors). */
START_TEST(test_persistent_cache_keyed)
{
    char *tmp = tu_tmpdir(), a[4200], b[4200], pc[4200];
    snprintf(a, sizeof(a), "%s/a", tmp);
    snprintf(b, sizeof(b), "%s/b", tmp);
    snprintf(pc, sizeof(pc), "%s/pc", tmp);
    ck_assert_int_eq(mkdir(a, 0755), 0);
    ck_assert_int_eq(mkdir(b, 0755), 0);
    ghc_core_t *w = ghc_core_init();
    write_plain(w, a, "s", 1.0f);
    write_plain(w, b, "s", 2.0f);
    ck_assert(persisted_first(a, pc) == 1.0f);
    ck_assert(persisted_first(a, pc) == 1.0f);   /* read back */
    ck_assert_msg(persisted_first(b, pc) == 2.0f, "dataset b was served dataset a's latent");
    write_plain(w, a, "s", 3.0f);
    ck_assert_msg(persisted_first(a, pc) == 3.0f, "a rewritten file was served its old latent");
    ghc_core_free(w);
    tu_rm_rf(tmp);
    free(tmp);
}
END_TEST

/* ---- caches of ai-toolkit and musubi-tuner in f16 (make_peer_cache_fixtures.py) ------------------ */

/* The script's values (exact in f16; README "data/peers"). t is the sample's number. */
static float peer_latent(int t, int64_t k)
{
    k %= 64;
    if (k == 62)
        return -65504.0f;                  /* f16's largest */
    if (k == 63)
        return 0x1p-24f;                   /* f16's least subnormal */
    return (float)(k - 32) / 1024.0f + (float)t / 8.0f;
}

static float peer_text(int t, int64_t l, int64_t d) { return (float)((l * 32 + d) % 64 - 32) / 256.0f + (float)t / 4.0f; }

static float peer_blank(bool trigger, int64_t l, int64_t d)
{
    return l < 2 ? -(float)((l * 32 + d) % 64 + 1) / 128.0f - (trigger ? 1.0f : 0.0f) : 0.0f;
}

/* Sample number and caption-embedding length by latent file. */
static int peer_t(const char *file, int64_t *len)
{
    static const struct { const char *part; int t; int64_t len; } m[] = {
        { "/img1_rwPigEyyEu0FO0Py8W0ypw.", 1, 6 }, { "/img2_UKNhAllWKre76tMA92B2LQ.", 2, 5 }, { "/t1_", 3, 4 },
        { "/t2_", 4, 3 }, { "/m1_", 5, 2 }, { "/img1_0016x0016_wan.", 7, 5 },
    };
    for (size_t i = 0; i < sizeof(m) / sizeof(m[0]); i++)
        if (strstr(file, m[i].part)) {
            *len = m[i].len;
            return m[i].t;
        }
    ck_abort_msg("unknown peer fixture %s", file);
    return -1;
}

/* ai-toolkit pads its texts (to 512 rows; the fixtures to 8) */
#define PEER_ROWS 8

/* A fresh, writable folder holding a copy of data/peers/<name> (the source tree may be
 * read-only, as under `make distcheck`); the caller frees the string. */
static char *peer_copy(const char *name)
{
    char *dir = fixture_dir(), *tmp = tu_tmpdir(), cmd[8400];
    snprintf(cmd, sizeof(cmd), "cp -R '%s/peers/%s/.' '%s' && chmod -R u+w '%s'", dir, name, tmp, tmp);
    ck_assert_int_eq(system(cmd), 0);
    free(dir);
    return tmp;
}

/* Warnings and infos a dataset logs while it opens. */
struct logcap {
    char text[16384];
    int  warns;
};

static void logcap_sink(void *user, enum ghc_log_level lvl, const char *msg)
{
    struct logcap *c = user;
    if (lvl == GHC_LOG_WARN)
        c->warns++;
    size_t n = strlen(c->text);
    snprintf(c->text + n, sizeof(c->text) - n, "%s\n", msg);
}

/* Check batch bt: f32 latents and texts with the script's values; a dropped text is the
 * blank embedding (blank_rows rows, trigger: the trigger word's) or zeros of its own length
 * (blank_rows 0). */
static void check_peer_batch(ghc_dataset_t *ds, const struct ghc_data_batch *bt, int blank_rows, bool trigger)
{
    /* the trainer's ops take f32 and bf16: f16 caches are served as f32 */
    ck_assert_msg(ghc_tensor_dtype(bt->latents) == GHC_DTYPE_F32, "latents %s", ghc_dtype_name(ghc_tensor_dtype(bt->latents)));
    ck_assert_msg(ghc_tensor_dtype(bt->text_embed) == GHC_DTYPE_F32, "text %s", ghc_dtype_name(ghc_tensor_dtype(bt->text_embed)));
    ck_assert_int_eq(ghc_tensor_dtype(bt->text_mask), GHC_DTYPE_F32);
    int64_t L = ghc_tensor_dim(bt->text_embed, 1);
    for (int i = 0; i < bt->n; i++) {
        struct ghc_data_sample_info si;
        ck_assert(ghc_dataset_sample_at(ds, bt->index[i], &si));
        ck_assert_int_eq(si.latent_dtype, GHC_DTYPE_F16);        /* as stored */
        ck_assert_int_eq(si.text_dtype, GHC_DTYPE_F16);
        int64_t len;
        int t = peer_t(si.latent_file, &len);
        for (int64_t k = 0; k < 64; k++)
            ck_assert_msg(elem(bt->latents, i * 64 + k) == peer_latent(t, k), "%s [%lld]: %a vs %a", si.latent_file,
                          (long long)k, (double)elem(bt->latents, i * 64 + k), (double)peer_latent(t, k));
        bool aitk = si.format == GHC_DATA_FORMAT_AITK;
        int64_t rows = bt->text_dropped[i] ? (blank_rows ? blank_rows : si.text_len) : si.text_len;
        ck_assert_int_eq(si.text_len, aitk ? PEER_ROWS : len);
        for (int64_t l = 0; l < L; l++) {
            ck_assert(elem(bt->text_mask, i * L + l) == (l < rows ? 1.0f : 0.0f));
            for (int64_t d = 0; d < D; d++) {
                float want = 0.0f;
                if (bt->text_dropped[i] && blank_rows)
                    want = l < rows ? peer_blank(trigger, l, d) : 0.0f;
                else if (!bt->text_dropped[i])
                    want = l < len ? peer_text(t, l, d) : 0.0f;
                ck_assert_msg(elem(bt->text_embed, (i * L + l) * D + d) == want, "%s row %lld col %lld: %g vs %g%s",
                              si.latent_file, (long long)l, (long long)d, elem(bt->text_embed, (i * L + l) * D + d),
                              want, bt->text_dropped[i] ? " (dropped)" : "");
            }
        }
    }
}

/* f16 latents and texts of ai-toolkit (`latent`, `text_embed`) and musubi-tuner
 * (`latents_1x2x2_float16`, `varlen_t5_float16`) come out as f32 with the exact values, read
 * in place, through the in_memory backend, and through the disk and unified_memory caches. */
START_TEST(test_peer_f16_served_as_f32)
{
    char *dir = fixture_dir();
    static const char *const sections[] = {
        "",
        "backend = { plugin = \"in_memory\"; };",
        "mempolicy = { plugin = \"host\"; }; cache = { plugin = \"disk\"; };",
        "mempolicy = { plugin = \"host\"; }; cache = { plugin = \"unified_memory\"; };",
    };
    for (size_t c = 0; c < sizeof(sections) / sizeof(sections[0]); c++) {
        char *c0 = cfg_for("shuffle = false; batch_size = 3;", "{ path = \"peers/aitk\"; compression = \"lz4\"; }, "
                           "{ path = \"peers/musubi\"; }");
        char *cfg = malloc(strlen(c0) + strlen(sections[c]) + 2);
        sprintf(cfg, "%s\n%s", sections[c], c0);
        ghc_core_t *core = core_with(cfg, dir);
        ghc_dataset_t *ds = open_ok(core);
        ck_assert_int_eq(ghc_dataset_samples(ds), 3);
        for (int e = 0; e < 2; e++) {   /* the second epoch from the caches' copies */
            struct ghc_data_batch bt;
            ck_assert_msg(ghc_dataset_next(ds, GHC_DEVICE_CPU, NULL, &bt) == 0, "%s", ghc_error_message(core));
            ck_assert_int_eq(bt.n, 3);   /* f16 of both formats: one bucket */
            ck_assert_int_eq(ghc_tensor_dim(bt.text_embed, 1), PEER_ROWS);
            check_peer_batch(ds, &bt, 0, false);
            ghc_data_batch_release(ds, &bt);
        }
        ghc_dataset_free(ds);
        ghc_core_free(core);
        free(cfg);
        free(c0);
    }
    free(dir);
}
END_TEST

/* f16 noise and an f32 sample of the same shape: one bucket, all served as f32; its bf16 text
 * beside an f16 one: f32, so that neither is rounded */
START_TEST(test_f16_native_noise)
{
    char *tmp = tu_tmpdir(), path[4200];
    ghc_core_t *w = ghc_core_init();
    int64_t ls[4] = { 4, 1, 2, 2 }, ts[2] = { 3, D }, one[1] = { 1 };
    uint16_t lat[16], noi[16], txt[3 * D], txt16[3 * D];
    float lat32[16], t = 500.0f;
    for (int k = 0; k < 16; k++) {
        lat[k] = ghc_f32_to_f16(1.0f + (float)k / 1024.0f);   /* 11 significant bits: not bf16 */
        noi[k] = ghc_f32_to_f16(-0x1p-20f * (float)(k + 1));  /* f16 subnormals */
        lat32[k] = 2.0f + (float)k / 4096.0f;
    }
    for (int k = 0; k < 3 * D; k++) {
        txt[k] = ghc_f32_to_f16(0.5f - (float)k / 2048.0f);
        txt16[k] = ghc_f32_to_bf16(0.25f + (float)k);
    }
    ghc_st_writer_t *sw = ghc_st_writer_init(w);
    ck_assert_int_eq(ghc_st_writer_add_raw(sw, "latent", GHC_DTYPE_F16, 4, ls, lat), 0);
    ck_assert_int_eq(ghc_st_writer_add_raw(sw, "noise", GHC_DTYPE_F16, 4, ls, noi), 0);
    ck_assert_int_eq(ghc_st_writer_add_raw(sw, "timestep", GHC_DTYPE_F32, 1, one, &t), 0);
    snprintf(path, sizeof(path), "%s/h.latent.safetensors", tmp);
    ck_assert_int_eq(ghc_st_writer_finish(sw, path), 0);
    ghc_st_writer_free(sw);
    sw = ghc_st_writer_init(w);
    ck_assert_int_eq(ghc_st_writer_add_raw(sw, "text_embed", GHC_DTYPE_F16, 2, ts, txt), 0);
    snprintf(path, sizeof(path), "%s/h.text.safetensors", tmp);
    ck_assert_int_eq(ghc_st_writer_finish(sw, path), 0);
    ghc_st_writer_free(sw);
    /* an f32 sample with noise, the same shape */
    sw = ghc_st_writer_init(w);
    ck_assert_int_eq(ghc_st_writer_add_raw(sw, "latent", GHC_DTYPE_F32, 4, ls, lat32), 0);
    ck_assert_int_eq(ghc_st_writer_add_raw(sw, "noise", GHC_DTYPE_F32, 4, ls, lat32), 0);
    ck_assert_int_eq(ghc_st_writer_add_raw(sw, "timestep", GHC_DTYPE_F32, 1, one, &t), 0);
    snprintf(path, sizeof(path), "%s/s.latent.safetensors", tmp);
    ck_assert_int_eq(ghc_st_writer_finish(sw, path), 0);
    ghc_st_writer_free(sw);
    sw = ghc_st_writer_init(w);
    ck_assert_int_eq(ghc_st_writer_add_raw(sw, "text_embed", GHC_DTYPE_BF16, 2, ts, txt16), 0);
    snprintf(path, sizeof(path), "%s/s.text.safetensors", tmp);
    ck_assert_int_eq(ghc_st_writer_finish(sw, path), 0);
    ghc_st_writer_free(sw);
    char *cfg = cfg_for("batch_size = 2;", "{ path = \".\"; }");
    ghc_core_t *core = core_with(cfg, tmp);
    ghc_dataset_t *ds = open_ok(core);
    struct ghc_data_batch bt;
    ck_assert_int_eq(ghc_dataset_next(ds, GHC_DEVICE_CPU, NULL, &bt), 0);
    ck_assert_int_eq(bt.n, 2);
    ck_assert_ptr_nonnull(bt.noise);
    ck_assert_int_eq(ghc_tensor_dtype(bt.latents), GHC_DTYPE_F32);
    ck_assert_int_eq(ghc_tensor_dtype(bt.noise), GHC_DTYPE_F32);
    ck_assert_int_eq(ghc_tensor_dtype(bt.text_embed), GHC_DTYPE_F32);
    for (int i = 0; i < 2; i++) {
        struct ghc_data_sample_info si;
        ghc_dataset_sample_at(ds, bt.index[i], &si);
        bool h = strstr(si.latent_file, "/h.") != NULL;
        for (int k = 0; k < 16; k++) {
            ck_assert(elem(bt.latents, i * 16 + k) == (h ? ghc_f16_to_f32(lat[k]) : lat32[k]));
            ck_assert(elem(bt.noise, i * 16 + k) == (h ? ghc_f16_to_f32(noi[k]) : lat32[k]));
        }
        for (int k = 0; k < 3 * D; k++)
            ck_assert(elem(bt.text_embed, i * 3 * D + k) == (h ? ghc_f16_to_f32(txt[k]) : ghc_bf16_to_f32(txt16[k])));
        ck_assert(elem(bt.timesteps, i) == 500.0f);
    }
    ck_assert(elem(bt.latents, 1) == 1.0f + 1.0f / 1024.0f || elem(bt.latents, 16 + 1) == 1.0f + 1.0f / 1024.0f);
    ghc_data_batch_release(ds, &bt);
    ghc_dataset_free(ds);
    ghc_core_free(core);
    ghc_core_free(w);
    free(cfg);
    tu_rm_rf(tmp);
    free(tmp);
}
END_TEST

/* ai-toolkit's names, as its own _build_text_embedding_path made them (the script's output):
 * a caption with Chinese, an emoji, a quote, a backslash, a tab, commas, CRLF and a lone CR
 * hashes as Python does, "[trigger]" goes without a trigger word, and with trigger_word it
 * is put in or in front. */
START_TEST(test_peer_aitk_caption_hash)
{
    static const struct { const char *latent, *text; } want[] = {
        { "/img1_", "_t_e_cache/img1_C--dGgcpNRKIHWbBKb4tXg.safetensors" },
        { "/img2_", "_t_e_cache/img2_F7iAhZLrVHWbGOr6RUpGmA.safetensors" },
        { "/t1_", "_t_e_cache/t1_UecAKBHZ1g81Nl23Du29eQ.safetensors" },
        { "/t2_", "_t_e_cache/t2_Gk-lnzA2cNAtepY4pMH9Gw.safetensors" },
    };
    char *dir = fixture_dir();
    char *cfg = cfg_for("", "{ path = \"peers/aitk\"; }, { path = \"peers/aitk_trigger\"; trigger_word = \"ohwx\"; }");
    ghc_core_t *core = core_with(cfg, dir);
    ghc_dataset_t *ds = open_ok(core);
    ck_assert_int_eq(ghc_dataset_samples(ds), 4);
    for (int64_t i = 0; i < 4; i++) {
        struct ghc_data_sample_info si;
        ghc_dataset_sample_at(ds, i, &si);
        size_t j = 0;
        while (j < 4 && !strstr(si.latent_file, want[j].latent))
            j++;
        ck_assert_msg(j < 4, "%s", si.latent_file);
        char full[4400];
        snprintf(full, sizeof(full), "%d/%s", (int)si.dataset, want[j].text);
        ck_assert_msg(strcmp(si.text_file, full) == 0, "%s paired with %s, expected %s", si.latent_file,
                      si.text_file, full);
        ck_assert_ptr_nonnull(si.caption_file);
    }
    ghc_dataset_free(ds);
    ghc_core_free(core);
    free(cfg);
    /* without the trigger word no file of aitk_trigger was made from its caption */
    cfg = cfg_for("", "{ path = \"peers/aitk_trigger\"; }");
    core = core_with(cfg, dir);
    const char *msg = open_fails(core, GHC_ENOTFOUND);
    ck_assert_msg(strstr(msg, "none of its text embeddings was made from its caption") && strstr(msg, "t1.txt"), "%s", msg);
    ghc_core_free(core);
    free(cfg);
    free(dir);
}
END_TEST

/* Caption dropout cached: every sample gets its caption's embedding, never the blank one; a
 * dropped text gets the blank one (ai-toolkit's dropout caption), per dataset; a configured
 * empty_prompt wins. */
START_TEST(test_peer_aitk_blank_is_the_empty_prompt)
{
    char *dir = fixture_dir();
    for (int pass = 0; pass < 3; pass++) {
        char *cfg = cfg_for(pass == 0 ? "shuffle = false; batch_size = 3;" :
                            pass == 1 ? "shuffle = false; batch_size = 3; text_dropout = 1.0;" :
                            "shuffle = false; batch_size = 3; text_dropout = 1.0; empty_prompt = \"empty_prompt.safetensors\";",
                            "{ path = \"peers/aitk\"; }, { path = \"peers/musubi\"; }, "
                            "{ path = \"peers/aitk_trigger\"; trigger_word = \"ohwx\"; }");
        ghc_core_t *core = core_with(cfg, dir);
        struct logcap lc = { .text = "" };
        ghc_log_set_sink(core, logcap_sink, &lc);
        ghc_dataset_t *ds = open_ok(core);
        ck_assert_int_eq(ghc_dataset_samples(ds), 5);
        if (pass < 2) {
            ck_assert_msg(strstr(lc.text, "dataset 0") && strstr(lc.text, "img1_KQ5WuCSNPf_BcsxOVLjJ7Q.safetensors") &&
                          strstr(lc.text, "one serves every item"), "%s", lc.text);
            ck_assert_msg(strstr(lc.text, "dropout caption \"ohwx \""), "%s", lc.text);
        }
        ck_assert_int_eq(lc.warns, 0);
        int seen = 0;
        while (seen < 5) {
            struct ghc_data_batch bt;
            ck_assert_msg(ghc_dataset_next(ds, GHC_DEVICE_CPU, NULL, &bt) == 0, "%s", ghc_error_message(core));
            struct ghc_data_sample_info si;
            ghc_dataset_sample_at(ds, bt.index[0], &si);
            bool trig = strstr(si.latent_file, "/t1_") || strstr(si.latent_file, "/t2_");
            for (int i = 0; i < bt.n; i++)
                ck_assert_int_eq(bt.text_dropped[i], pass > 0);
            if (pass < 2) {
                /* musubi's dataset has no blank embedding: zeros; every batch is one dataset's here */
                bool musubi = si.format == GHC_DATA_FORMAT_MUSUBI;
                bool mixed = false;
                for (int i = 1; i < bt.n; i++) {
                    struct ghc_data_sample_info sj;
                    ghc_dataset_sample_at(ds, bt.index[i], &sj);
                    mixed |= sj.dataset != si.dataset;
                }
                if (!mixed)
                    check_peer_batch(ds, &bt, pass == 1 && !musubi ? PEER_ROWS : 0, trig);
                else
                    for (int i = 0; i < bt.n; i++) {
                        struct ghc_data_sample_info sj;
                        ghc_dataset_sample_at(ds, bt.index[i], &sj);
                        int64_t L = ghc_tensor_dim(bt.text_embed, 1);
                        bool tj = strstr(sj.latent_file, "/t1_") || strstr(sj.latent_file, "/t2_");
                        int64_t len;
                        int t = peer_t(sj.latent_file, &len);
                        for (int64_t d = 0; d < D; d++) {
                            float want = pass == 0 ? peer_text(t, 0, d) :
                                         sj.format == GHC_DATA_FORMAT_MUSUBI ? 0.0f : peer_blank(tj, 0, d);
                            ck_assert_msg(elem(bt.text_embed, i * L * D + d) == want, "%s col %lld: %g vs %g",
                                          sj.latent_file, (long long)d, elem(bt.text_embed, i * L * D + d), want);
                        }
                    }
            } else {
                for (int i = 0; i < bt.n; i++)
                    for (int64_t d = 0; d < D; d++)
                        ck_assert(elem(bt.text_embed, i * ghc_tensor_dim(bt.text_embed, 1) * D + d) ==
                                  (float)d / 8 + 0.5f);
            }
            seen += bt.n;
            ghc_data_batch_release(ds, &bt);
        }
        ghc_dataset_free(ds);
        ghc_core_free(core);
        free(cfg);
    }
    free(dir);
}
END_TEST

/* An edited caption: only the file of the old caption is there. A bad sample that names the
 * latent, the caption and the stale file; with skip_bad_samples skipped, and the stale file
 * named once in a warning. */
START_TEST(test_peer_aitk_stale_caption)
{
    char *tmp = peer_copy("aitk");
    free(tu_write(tmp, "img2.txt", "[trigger]a dog,running fast\n"));
    char lat[4400], cap[4400], stale[4400];
    snprintf(lat, sizeof(lat), "%s/_latent_cache/img2_UKNhAllWKre76tMA92B2LQ.safetensors", tmp);
    snprintf(cap, sizeof(cap), "%s/img2.txt", tmp);
    snprintf(stale, sizeof(stale), "%s/_t_e_cache/img2_F7iAhZLrVHWbGOr6RUpGmA.safetensors", tmp);
    for (int skip = 0; skip < 2; skip++) {
        char *cfg = cfg_for(skip ? "skip_bad_samples = true;" : "", "{ path = \".\"; }");
        ghc_core_t *core = core_with(cfg, tmp);
        struct logcap lc = { .text = "" };
        ghc_log_set_sink(core, logcap_sink, &lc);
        if (!skip) {
            const char *msg = open_fails(core, GHC_ENOTFOUND);
            ck_assert_msg(strstr(msg, lat) && strstr(msg, cap) && strstr(msg, stale) &&
                          strstr(msg, "none of its text embeddings was made from its caption") &&
                          strstr(msg, "re-cache"), "%s", msg);
        } else {
            ghc_dataset_t *ds = open_ok(core);
            struct ghc_data_stats st = { .struct_size = sizeof(st) };
            ghc_dataset_stats(ds, &st);
            ck_assert_int_eq(st.samples, 1);
            ck_assert_int_eq(st.skipped, 1);
            /* the skip, and one line for the stale file */
            ck_assert_msg(lc.warns == 2, "%d warnings:\n%s", lc.warns, lc.text);
            const char *line = strstr(lc.text, "made from no caption");
            ck_assert_msg(line && strstr(line, stale) && strstr(line, "stale"), "%s", lc.text);
            struct ghc_data_batch bt;
            ck_assert_int_eq(ghc_dataset_next(ds, GHC_DEVICE_CPU, NULL, &bt), 0);
            struct ghc_data_sample_info si;
            ghc_dataset_sample_at(ds, bt.index[0], &si);
            ck_assert_msg(strstr(si.latent_file, "img1_"), "%s", si.latent_file);
            check_peer_batch(ds, &bt, 0, false);
            ghc_data_batch_release(ds, &bt);
            ghc_dataset_free(ds);
        }
        ghc_core_free(core);
        free(cfg);
    }
    tu_rm_rf(tmp);
    free(tmp);
}
END_TEST

/* Two files that could each be the text: an error naming both, never a guess. Made from its
 * caption for two models; or, without a caption file, made from nothing we can hash. A single
 * such file without a caption file is taken. */
START_TEST(test_peer_aitk_two_candidates)
{
    static const char *const files[2] = { "_t_e_cache/m1_YU7dvy1YmdZi72wgkQG__w.safetensors",
                                          "_t_e_cache/m1_z6uE51HcKYYEBBJkf6JQwA.safetensors" };
    char *tmp = peer_copy("aitk_multi"), a[4400], b[4400], p[4400];
    snprintf(a, sizeof(a), "%s/%s", tmp, files[0]);
    snprintf(b, sizeof(b), "%s/%s", tmp, files[1]);
    for (int pass = 0; pass < 3; pass++) {
        if (pass == 1) {
            snprintf(p, sizeof(p), "%s/m1.txt", tmp);
            ck_assert_int_eq(unlink(p), 0);
        }
        if (pass == 2)
            ck_assert_int_eq(unlink(b), 0);
        char *cfg = cfg_for("", "{ path = \".\"; }");
        ghc_core_t *core = core_with(cfg, tmp);
        if (pass < 2) {
            const char *msg = open_fails(core, pass == 0 ? GHC_EFORMAT : GHC_ENOTFOUND);
            ck_assert_msg(strstr(msg, a) && strstr(msg, b) && strstr(msg, "expected"), "pass %d: %s", pass, msg);
            ck_assert_msg(pass == 0 ? strstr(msg, "were made from its caption") != NULL
                                    : strstr(msg, "without a caption file") != NULL, "pass %d: %s", pass, msg);
        } else {
            ghc_dataset_t *ds = open_ok(core);
            struct ghc_data_sample_info si;
            ghc_dataset_sample_at(ds, 0, &si);
            ck_assert_msg(strstr(si.text_file, files[0]), "%s", si.text_file);
            ghc_dataset_free(ds);
        }
        ghc_core_free(core);
        free(cfg);
    }
    tu_rm_rf(tmp);
    free(tmp);
}
END_TEST

/* No caption file: ai-toolkit's caption is its default_caption, else "" (then the file made from
 * "" is the text, and the caption's own file is stale). A blank caption file counts as none. */
START_TEST(test_peer_aitk_default_caption)
{
    char *tmp = peer_copy("aitk"), p[4400];
    snprintf(p, sizeof(p), "%s/img2.txt", tmp);
    for (int pass = 0; pass < 3; pass++) {
        if (pass == 0)
            ck_assert_int_eq(unlink(p), 0);
        else if (pass == 2)
            free(tu_write(tmp, "img2.txt", " \n\t"));
        char *cfg = cfg_for("", pass == 1 ? "{ path = \".\"; }"
                                          : "{ path = \".\"; default_caption = \"[trigger]a dog,running\\n\"; }");
        ghc_core_t *core = core_with(cfg, tmp);
        struct logcap lc = { .text = "" };
        ghc_log_set_sink(core, logcap_sink, &lc);
        ghc_dataset_t *ds = open_ok(core);
        ck_assert_int_eq(ghc_dataset_samples(ds), 2);
        for (int64_t i = 0; i < 2; i++) {
            struct ghc_data_sample_info si;
            ghc_dataset_sample_at(ds, i, &si);
            if (strstr(si.latent_file, "/img2_"))
                ck_assert_msg(strstr(si.text_file, pass == 1 ? "img2_KQ5WuCSNPf_BcsxOVLjJ7Q" : "img2_F7iAhZLrVHWbGOr6RUpGmA"),
                              "pass %d: %s", pass, si.text_file);
        }
        ck_assert_msg(lc.warns == (pass == 1) && (pass != 1 || strstr(lc.text, "img2_F7iAhZLrVHWbGOr6RUpGmA")),
                      "pass %d: %s", pass, lc.text);
        ghc_dataset_free(ds);
        ghc_core_free(core);
        free(cfg);
    }
    tu_rm_rf(tmp);
    free(tmp);
}
END_TEST

/* ---- an empty folder: no qsort(NULL, 0, ...) -------------------------------------------------- */

/* qsort as the library and the backends call it (this definition interposes glibc's): a NULL
 * base is undefined behaviour even with no elements (glibc declares it nonnull), so such calls
 * are counted, and the rest forwarded. */
static int qsort_null_calls;

void qsort(void *base, size_t n, size_t size, int (*cmp)(const void *, const void *))
{
    static void (*real)(void *, size_t, size_t, int (*)(const void *, const void *));
    void *volatile b = base;   /* glibc's nonnull: a plain test of base is optimised away */
    if (!b) {
        qsort_null_calls++;
        return;
    }
    if (!real)
        *(void **)&real = dlsym(RTLD_NEXT, "qsort");
    ck_assert_ptr_nonnull(real);
    real(base, n, size, cmp);
}

START_TEST(test_empty_folder)
{
    char *dir = tu_tmpdir(), p[4200];
    snprintf(p, sizeof(p), "%s/empty", dir);
    ck_assert_int_eq(mkdir(p, 0755), 0);
    qsort_null_calls = 0;
    ghc_core_t *core = ghc_core_init();
    ck_assert_int_eq(ghc_plugin_add_path(core, tu_env("GHC_BUILD_PLUGINS")), 0);
    ck_assert_int_eq(ghc_config_load_string(core, "data = { datasets = ( { path = \"empty\"; } ); };", "t.cfg", dir, NULL, 0), 0);
    ck_assert_int_eq(ghc_run_init(core), 0);
    ghc_dataset_t *ds = NULL;
    int rc = ghc_dataset_open(core, &ds);
    ck_assert_msg(rc < 0 && !ds, "an empty folder opened (%d)", rc);
    ck_assert_msg(strstr(ghc_error_message(core), "empty"), "%s", ghc_error_message(core));
    ck_assert_msg(qsort_null_calls == 0, "qsort(NULL, ...) called %d times (%s)", qsort_null_calls, ghc_error_message(core));
    ghc_core_free(core);
    tu_rm_rf(dir);
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
    TCase *empty = tcase_create("empty");
    tcase_add_test(empty, test_empty_folder);
    suite_add_tcase(s, empty);
    TCase *bad = tcase_create("bad_input");
    tcase_add_test(bad, test_bad_missing_text);
    tcase_add_test(bad, test_bad_missing_latent);
    tcase_add_test(bad, test_bad_shape);
    tcase_add_test(bad, test_bad_dtype);
    tcase_add_test(bad, test_bad_text_width);
    tcase_add_test(bad, test_bad_truncated);
    tcase_add_test(bad, test_bad_unreadable);
    tcase_add_test(bad, test_bad_corrupt_block);
    tcase_add_test(bad, test_bad_values);
    suite_add_tcase(s, bad);
    TCase *im = tcase_create("in_memory");
    tcase_set_timeout(im, 60);
    tcase_add_test(im, test_compression_round_trip);
    tcase_add_test(im, test_in_memory_reads);
    tcase_add_test(im, test_memory_limit);
    tcase_add_test(im, test_caches);
    tcase_add_test(im, test_persistent_cache_keyed);
    suite_add_tcase(s, im);
    TCase *peers = tcase_create("peers");
    tcase_set_timeout(peers, 60);
    tcase_add_test(peers, test_peer_f16_served_as_f32);
    tcase_add_test(peers, test_f16_native_noise);
    tcase_add_test(peers, test_peer_aitk_caption_hash);
    tcase_add_test(peers, test_peer_aitk_blank_is_the_empty_prompt);
    tcase_add_test(peers, test_peer_aitk_stale_caption);
    tcase_add_test(peers, test_peer_aitk_two_candidates);
    tcase_add_test(peers, test_peer_aitk_default_caption);
    suite_add_tcase(s, peers);
    return s;
}

int main(void) { return tu_run_suite(data_suite(), false); }
