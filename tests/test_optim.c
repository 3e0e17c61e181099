/* test_optim.c: the adamw and automagic optimizers on the CPU: golden trajectories against
 * torch.optim.AdamW and ai-toolkit's Automagic (tests/fixtures/optim), exact resume, group
 * settings and filtering, bad configs and bad state files. */
#include <config.h>

#include "optim_cases.h"

static ghc_core_t *oc_core(const char *section)
{
    ghc_core_t *core = ghc_core_init();
    ck_assert_ptr_nonnull(core);
    ck_assert_int_eq(ghc_plugin_add_path(core, tu_env("GHC_BUILD_PLUGINS")), 0);
    ck_assert_msg(ghc_config_load_string(core, section, "t.cfg", NULL, NULL, 0) == 0, "%s", ghc_error_message(core));
    ck_assert_msg(ghc_run_init(core) == 0, "%s", ghc_error_message(core));
    return core;
}

/* The error of a config that must not start a run. */
static char *config_error(const char *section)
{
    ghc_core_t *core = ghc_core_init();
    ck_assert_int_eq(ghc_plugin_add_path(core, tu_env("GHC_BUILD_PLUGINS")), 0);
    ck_assert_int_eq(ghc_config_load_string(core, section, "t.cfg", NULL, NULL, 0), 0);
    ck_assert_int_lt(ghc_run_init(core), 0);
    char *msg = strdup(ghc_error_message(core));
    ghc_core_free(core);
    return msg;
}

START_TEST(adamw_golden) { oc_adamw_golden(GHC_DEVICE_CPU, 1e-6); }
END_TEST

/* Tolerance 2e-6 relative: PyTorch sums the second-moment means and the update's norm in its
 * own vectorised order, this code in f64; the mask and polarity must still agree exactly. */
START_TEST(automagic_golden) { oc_automagic_golden(GHC_DEVICE_CPU, 2e-6); }
END_TEST

START_TEST(resume_adamw) { oc_resume(GHC_DEVICE_CPU, oc_adamw_cfg, GHC_DTYPE_F32, 0); }
END_TEST

START_TEST(resume_adamw_bf16) { oc_resume(GHC_DEVICE_CPU, oc_adamw_cfg, GHC_DTYPE_BF16, -1); }
END_TEST

START_TEST(resume_automagic)
{
    char cfg[1024];
    snprintf(cfg, sizeof(cfg), oc_automagic_cfg, "");
    oc_resume(GHC_DEVICE_CPU, cfg, GHC_DTYPE_F32, 1);
    snprintf(cfg, sizeof(cfg), oc_automagic_cfg, "lr_mask = \"f32\"; seed = 7;");
    oc_resume(GHC_DEVICE_CPU, cfg, GHC_DTYPE_F32, 0);
    oc_resume(GHC_DEVICE_CPU, cfg, GHC_DTYPE_BF16, -1);
}
END_TEST

/* bf16 params: the rounding is stochastic (not always to nearest) and seeded (two runs agree,
 * another seed differs). */
START_TEST(bf16_rounding_seeded)
{
    char cfg[1024];
    void *out[3][OC_NP];
    size_t len[OC_NP];
    for (int k = 0; k < 3; k++) {
        snprintf(cfg, sizeof(cfg), oc_automagic_cfg, k == 2 ? "seed = 99;" : "seed = 5;");
        struct oc_run r;
        oc_open(&r, cfg, GHC_DEVICE_CPU, GHC_DTYPE_BF16, 0, NULL);
        ghc_st_t *fx = oc_fixture(r.core);
        oc_steps(&r, fx, 1, 20, 0);
        for (int i = 0; i < OC_NP; i++) {
            len[i] = ghc_tensor_nbytes(r.value[i]);
            out[k][i] = malloc(len[i]);
            ck_assert_ptr_nonnull(out[k][i]);
            memcpy(out[k][i], ghc_tensor_cdata(r.value[i]), len[i]);
        }
        ghc_st_free(fx);
        oc_close(&r);
    }
    bool same01 = true, same02 = true;
    for (int i = 0; i < OC_NP; i++) {
        same01 &= !memcmp(out[0][i], out[1][i], len[i]);
        same02 &= !memcmp(out[0][i], out[2][i], len[i]);
    }
    ck_assert_msg(same01, "the same seed gave different bf16 params");
    ck_assert_msg(!same02, "another seed gave the same bf16 params");
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < OC_NP; i++)
            free(out[k][i]);
}
END_TEST

/* step(group) touches only that group's params, and only those whose grad is set. */
START_TEST(group_filter)
{
    char cfg[1024];
    snprintf(cfg, sizeof(cfg), oc_automagic_cfg, "");
    const char *sections[2] = { oc_adamw_cfg, cfg };
    for (int o = 0; o < 2; o++) {
        struct oc_run r;
        oc_open(&r, sections[o], GHC_DEVICE_CPU, GHC_DTYPE_F32, 0, NULL);
        r.params[1].group = 1;        /* b: the other expert */
        r.params[2].grad = NULL;      /* c: no gradient this step */
        ghc_tensor_t *before[OC_NP];
        for (int i = 0; i < OC_NP; i++) {
            before[i] = oc_host(r.core, r.value[i]);
            ck_assert_int_eq(ghc_op_fill(r.grad[i], 0.25, NULL), 0);
        }
        ck_assert_int_eq(ghc_optimizer_step(r.opt, 0, 0, 1.0f, NULL), 0);
        ck_assert_msg(memcmp(ghc_tensor_cdata(before[0]), ghc_tensor_cdata(r.value[0]), ghc_tensor_nbytes(before[0])),
                      "group 0's param did not move");
        ck_assert_msg(!memcmp(ghc_tensor_cdata(before[1]), ghc_tensor_cdata(r.value[1]), ghc_tensor_nbytes(before[1])),
                      "group 1's param moved on a group 0 step");
        ck_assert_msg(!memcmp(ghc_tensor_cdata(before[2]), ghc_tensor_cdata(r.value[2]), ghc_tensor_nbytes(before[2])),
                      "a param without grad moved");
        ck_assert_int_eq(ghc_optimizer_step(r.opt, 1, 0, 1.0f, NULL), 0);
        ck_assert_msg(memcmp(ghc_tensor_cdata(before[1]), ghc_tensor_cdata(r.value[1]), ghc_tensor_nbytes(before[1])),
                      "group 1's param did not move");
        for (int i = 0; i < OC_NP; i++)
            ghc_tensor_free(before[i]);
        r.params[2].grad = r.grad[2];
        oc_close(&r);
    }
}
END_TEST

START_TEST(stage_lr_fallback)
{
    char cfg[1024];
    snprintf(cfg, sizeof(cfg), oc_automagic_cfg, "");
    struct oc_run r;
    oc_open(&r, cfg, GHC_DEVICE_CPU, GHC_DTYPE_F32, 0, NULL);
    /* before any step the reported lr is the group's initial lr */
    ck_assert_float_eq_tol(ghc_optimizer_lr(r.opt, 1), 5e-5f, 1e-12f);
    ck_assert_float_eq_tol(ghc_optimizer_lr(r.opt, 0), 2e-4f, 1e-12f);
    ck_assert_float_eq_tol(ghc_optimizer_lr(r.opt, 5), 1e-4f, 1e-12f);
    oc_close(&r);
}
END_TEST

START_TEST(bad_config)
{
    char *m = config_error("optimizer = { plugin = \"automagic\"; lr = 2e-3; };");
    ck_assert_msg(strstr(m, "t.cfg:1") && strstr(m, "lr"), "%s", m);
    free(m);
    m = config_error("optimizer = { plugin = \"automagic\"; lr = 1e-4; high_noise_min_lr = 2e-4; };");
    ck_assert_msg(strstr(m, "high_noise_min_lr <= high_noise_lr") != NULL, "%s", m);
    free(m);
    m = config_error("optimizer = { plugin = \"adamw\"; low_noise_beta1 = 0.5; };");
    ck_assert_msg(strstr(m, "low_noise_beta1") != NULL, "%s", m);
    free(m);
    m = config_error("optimizer = { plugin = \"automagic\"; lr_mask = \"int4\"; };");
    ck_assert_msg(strstr(m, "lr_mask") != NULL, "%s", m);
    free(m);
}
END_TEST

/* Load `path` into a fresh run of `section` with params of `dt`, param b reshaped to `bshape`
 * (NULL: as the fixture) and param c left out when `drop_c`; expect failure with `needles`
 * in the message and the state unchanged. */
static void expect_bad_load(const char *section, const char *path, const int64_t *bshape, bool drop_c,
                            const char *const *needles)
{
    struct oc_run r;
    char *dir = tu_tmpdir(), before[4200], after[4200];
    oc_open(&r, section, GHC_DEVICE_CPU, GHC_DTYPE_F32, 0, NULL);
    (void)bshape;
    (void)drop_c;
    snprintf(before, sizeof(before), "%s/before.safetensors", dir);
    snprintf(after, sizeof(after), "%s/after.safetensors", dir);
    ck_assert_int_eq(ghc_optimizer_save(r.opt, before), 0);
    int rc = ghc_optimizer_load(r.opt, path);
    const char *msg = ghc_error_message(r.core);
    ck_assert_int_lt(rc, 0);
    for (int i = 0; needles[i]; i++)
        ck_assert_msg(strstr(msg, needles[i]) != NULL, "message \"%s\" lacks \"%s\"", msg, needles[i]);
    ck_assert_int_eq(ghc_optimizer_save(r.opt, after), 0);
    size_t l1, l2;
    char *s1 = oc_slurp(before, &l1), *s2 = oc_slurp(after, &l2);
    ck_assert_msg(l1 == l2 && !memcmp(s1, s2, l1), "a failed load changed the state");
    free(s1);
    free(s2);
    oc_close(&r);
    tu_rm_rf(dir);
    free(dir);
}

/* Rewrite a state file through the writer: drop `drop`, or give `reshape` a new shape. */
static void rewrite(ghc_core_t *core, const char *src, const char *dst, const char *drop, const char *reshape,
                    const char *opt_name)
{
    ghc_st_t *st = ghc_st_open(core, src);
    ck_assert_ptr_nonnull(st);
    ghc_st_writer_t *w = ghc_st_writer_init(core);
    for (int i = 0; i < ghc_st_count(st); i++) {
        struct ghc_st_info in;
        ck_assert(ghc_st_info_at(st, i, &in));
        if (drop && !strcmp(in.name, drop))
            continue;
        int64_t sh[GHC_TENSOR_MAX_DIMS];
        int nd = in.ndim;
        memcpy(sh, in.shape, sizeof(int64_t) * (size_t)nd);
        if (reshape && !strcmp(in.name, reshape)) {   /* same bytes, [n] -> [n/2, 2] */
            nd = 2;
            sh[1] = 2;
            sh[0] = in.shape[0] / 2;
        }
        ck_assert_int_eq(ghc_st_writer_add_raw(w, in.name, in.dtype, nd, sh, ghc_st_raw(st, in.name)), 0);
    }
    const char *k, *v;
    for (int i = 0; ghc_st_metadata_at(st, i, &k, &v); i++)
        ck_assert_int_eq(ghc_st_writer_metadata(w, k, !strcmp(k, "optimizer") && opt_name ? opt_name : v), 0);
    ck_assert_int_eq(ghc_st_writer_finish(w, dst), 0);
    ghc_st_writer_free(w);
    ghc_st_free(st);
}

START_TEST(bad_state_files)
{
    char cfg[1024], *dir = tu_tmpdir(), good[4200], bad[4200], adam[4200], junk[4200];
    snprintf(cfg, sizeof(cfg), oc_automagic_cfg, "");
    snprintf(good, sizeof(good), "%s/good.safetensors", dir);
    snprintf(bad, sizeof(bad), "%s/bad.safetensors", dir);
    snprintf(adam, sizeof(adam), "%s/adam.safetensors", dir);
    struct oc_run r;
    oc_open(&r, cfg, GHC_DEVICE_CPU, GHC_DTYPE_F32, 0, NULL);
    ghc_st_t *fx = oc_fixture(r.core);
    oc_steps(&r, fx, 1, 3, 0);
    ck_assert_int_eq(ghc_optimizer_save(r.opt, good), 0);

    rewrite(r.core, good, bad, "b.lr_mask", NULL, NULL);
    expect_bad_load(cfg, bad, NULL, false, (const char *const[]){ bad, "missing tensor \"b.lr_mask\"", "'b'", NULL });
    rewrite(r.core, good, bad, NULL, "a.exp_avg_sq_col", NULL);
    expect_bad_load(cfg, bad, NULL, false,
                    (const char *const[]){ bad, "\"a.exp_avg_sq_col\" is [16, 2] F32, expected [32] F32", NULL });
    rewrite(r.core, good, bad, NULL, NULL, "adamw");
    expect_bad_load(cfg, bad, NULL, false, (const char *const[]){ bad, "\"adamw\"", "\"automagic\"", NULL });
    /* an extra entry: a file of a run with more params than this one */
    struct oc_run big;
    oc_open(&big, cfg, GHC_DEVICE_CPU, GHC_DTYPE_F32, 0, NULL);
    struct ghc_param extra = { "z.extra", big.value[2], big.grad[2], 0 };
    ck_assert_int_eq(ghc_optimizer_add_params(big.opt, &extra, 1), 0);
    ck_assert_int_eq(ghc_optimizer_save(big.opt, bad), 0);
    expect_bad_load(cfg, bad, NULL, false, (const char *const[]){ bad, "\"z.extra.", "no param", NULL });
    oc_close(&big);
    /* the f32-mask kind against an int8-mask file: the dtype is named */
    char cfg_f32[1024];
    snprintf(cfg_f32, sizeof(cfg_f32), oc_automagic_cfg, "lr_mask = \"f32\";");
    expect_bad_load(cfg_f32, good, NULL, false, (const char *const[]){ good, "\"a.lr_mask\" is [128] U8, expected [128] F32", NULL });
    /* another optimizer's file, a file that is not a state file, a file that does not exist */
    struct oc_run ad;
    oc_open(&ad, oc_adamw_cfg, GHC_DEVICE_CPU, GHC_DTYPE_F32, 0, NULL);
    ck_assert_int_eq(ghc_optimizer_save(ad.opt, adam), 0);
    oc_close(&ad);
    expect_bad_load(cfg, adam, NULL, false, (const char *const[]){ adam, "optimizer \"adamw\"", NULL });
    snprintf(junk, sizeof(junk), "%s/tests/fixtures/optim/trajectories.safetensors", tu_env("GHC_TOP_SRCDIR"));
    expect_bad_load(cfg, junk, NULL, false, (const char *const[]){ junk, "not an optimizer state file", NULL });
    snprintf(junk, sizeof(junk), "%s/none.safetensors", dir);
    expect_bad_load(cfg, junk, NULL, false, (const char *const[]){ junk, NULL });
    /* a duplicate param name is refused */
    struct ghc_param dup = { "a", r.value[0], r.grad[0], 0 };
    ck_assert_int_lt(ghc_optimizer_add_params(r.opt, &dup, 1), 0);
    ck_assert_msg(strstr(ghc_error_message(r.core), "'a' given twice") != NULL, "%s", ghc_error_message(r.core));
    ghc_st_free(fx);
    oc_close(&r);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("optim");
    TCase *tc = tcase_create("cpu");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, adamw_golden);
    tcase_add_test(tc, automagic_golden);
    tcase_add_test(tc, resume_adamw);
    tcase_add_test(tc, resume_adamw_bf16);
    tcase_add_test(tc, resume_automagic);
    tcase_add_test(tc, bf16_rounding_seeded);
    tcase_add_test(tc, group_filter);
    tcase_add_test(tc, stage_lr_fallback);
    tcase_add_test(tc, bad_config);
    tcase_add_test(tc, bad_state_files);
    suite_add_tcase(s, tc);
    return tu_run_suite(s, false);
}
