/* optim_cases.h: the optimizer test cases shared by the CPU suite (test_optim.c) and the GPU
 * suite (test_optim_cuda.c): golden trajectories from tests/fixtures/optim (made by
 * make_optim_fixtures.py with torch and ai-toolkit), exact resume, bad state files. Each case
 * takes the device of the params (GHC_DEVICE_CPU or 0); `oc_core()` (defined by the suite)
 * gives a core whose run has the given optimizer section. */
#ifndef GHC_TEST_OPTIM_CASES_H
#define GHC_TEST_OPTIM_CASES_H

#include <math.h>

#include <gh200core/ops.h>
#include <gh200core/optimizer.h>
#include <gh200core/safetensors.h>

#include "testutil.h"

#define OC_NP 3
static const char *const oc_names[OC_NP] = { "a", "b", "c" };
static const char *const oc_groups[3] = { "high", "low", "other" };
static const int32_t oc_group_ids[3] = { 0, 1, -1 };

static const char oc_adamw_cfg[] =
    "optimizer = { plugin = \"adamw\"; lr = 1e-3; weight_decay = 0.01; high_noise_lr = 2e-3;"
    " high_noise_weight_decay = 0.1; low_noise_lr = 5e-4; };";
static const char oc_automagic_cfg[] =
    "optimizer = { plugin = \"automagic\"; lr = 1e-4; min_lr = 1e-5; max_lr = 1e-3; lr_bump = 2e-5;"
    " weight_decay = 0.01; high_noise_lr = 2e-4; high_noise_min_lr = 2e-5; high_noise_max_lr = 5e-4;"
    " high_noise_lr_bump = 5e-5; low_noise_lr = 5e-5; low_noise_lr_bump = 1e-5; %s };";

static ghc_core_t *oc_core(const char *optimizer_section);

/* A run's params on `dev`, from the fixture's init.* (or `from`, same layout, when given). */
struct oc_run {
    ghc_core_t      *core;
    ghc_optimizer_t *opt;
    ghc_tensor_t    *value[OC_NP], *grad[OC_NP];
    struct ghc_param params[OC_NP];
    int              dev;
};

static ghc_st_t *oc_fixture(ghc_core_t *core)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/tests/fixtures/optim/trajectories.safetensors", tu_env("GHC_TOP_SRCDIR"));
    ghc_st_t *st = ghc_st_open(core, path);
    ck_assert_msg(st != NULL, "%s", ghc_error_message(core));
    return st;
}

/* A tensor's contents on the CPU (f32 or its own dtype for non-floats); caller frees. */
static ghc_tensor_t *oc_host(ghc_core_t *core, ghc_tensor_t *t)
{
    ghc_tensor_t *h = ghc_tensor_init(core, ghc_tensor_dtype(t), ghc_tensor_ndim(t), ghc_tensor_shape(t),
                                      GHC_DEVICE_CPU, GHC_ROLE_WORKSPACE);
    ck_assert_ptr_nonnull(h);
    ck_assert_int_eq(ghc_op_copy(h, t, NULL), 0);
    ck_assert_int_eq(ghc_op_sync(core, ghc_tensor_device(t), NULL), 0);
    return h;
}

static void oc_open(struct oc_run *r, const char *section, int dev, enum ghc_dtype dt, int32_t group,
                    ghc_tensor_t *const *from)
{
    memset(r, 0, sizeof(*r));
    r->dev = dev;
    r->core = oc_core(section);
    ck_assert_ptr_nonnull(r->core);
    r->opt = ghc_optimizer_get(r->core);
    ck_assert_ptr_nonnull(r->opt);
    ghc_st_t *st = oc_fixture(r->core);
    char key[64];
    for (int i = 0; i < OC_NP; i++) {
        snprintf(key, sizeof(key), "init.%s", oc_names[i]);
        ghc_tensor_t *h = from ? NULL : ghc_st_load(st, key, GHC_DTYPE_F32, GHC_ROLE_WORKSPACE);
        const ghc_tensor_t *src = from ? from[i] : h;
        r->value[i] = ghc_tensor_init(r->core, dt, ghc_tensor_ndim(src), ghc_tensor_shape(src), dev, GHC_ROLE_ADAPTER);
        ck_assert_ptr_nonnull(r->value[i]);
        ghc_tensor_t *hv = oc_host(r->core, (ghc_tensor_t *)src);
        ghc_tensor_t *tmp = ghc_tensor_init(r->core, dt, ghc_tensor_ndim(src), ghc_tensor_shape(src),
                                            GHC_DEVICE_CPU, GHC_ROLE_WORKSPACE);
        ck_assert_int_eq(ghc_op_cast(tmp, hv, 1.0f, NULL, NULL), 0);
        ck_assert_int_eq(ghc_op_copy(r->value[i], tmp, NULL), 0);
        ck_assert_int_eq(ghc_op_sync(r->core, dev, NULL), 0);
        ghc_tensor_free(tmp);
        ghc_tensor_free(hv);
        r->grad[i] = ghc_tensor_init(r->core, GHC_DTYPE_F32, ghc_tensor_ndim(src), ghc_tensor_shape(src), dev,
                                     GHC_ROLE_GRADS);
        ck_assert_ptr_nonnull(r->grad[i]);
        r->params[i] = (struct ghc_param){ oc_names[i], r->value[i], r->grad[i], group };
        ghc_tensor_free(h);
    }
    ghc_st_free(st);
    ck_assert_msg(ghc_optimizer_add_params(r->opt, r->params, OC_NP) == 0, "%s", ghc_error_message(r->core));
}

static void oc_close(struct oc_run *r)
{
    /* the params before the run: their memory comes from its memory policy (the optimizer
     * only borrows them) */
    for (int i = 0; i < OC_NP; i++) {
        ghc_tensor_free(r->value[i]);
        ghc_tensor_free(r->grad[i]);
    }
    ghc_core_free(r->core);
}

/* Steps first..last (1-based) with the fixture's gradients. */
static void oc_steps(struct oc_run *r, ghc_st_t *st, int first, int last, int32_t group)
{
    char key[64];
    for (int s = first; s <= last; s++) {
        for (int i = 0; i < OC_NP; i++) {
            snprintf(key, sizeof(key), "grad.%d.%s", s - 1, oc_names[i]);
            ghc_tensor_t *h = ghc_st_load(st, key, GHC_DTYPE_F32, GHC_ROLE_WORKSPACE);
            ck_assert_ptr_nonnull(h);
            ck_assert_int_eq(ghc_op_copy(r->grad[i], h, NULL), 0);
            ck_assert_int_eq(ghc_op_sync(r->core, r->dev, NULL), 0);
            ghc_tensor_free(h);
        }
        ck_assert_msg(ghc_optimizer_step(r->opt, group, s - 1, 1.0f, NULL) == 0, "%s", ghc_error_message(r->core));
    }
    ck_assert_int_eq(ghc_op_sync(r->core, r->dev, NULL), 0);
}

/* |got - want| <= tol * max(|want|, floor) element-wise (tol 0: bit-identical). */
static void oc_compare(ghc_core_t *core, const char *what, ghc_tensor_t *got_t, ghc_st_t *st, const char *key,
                       double tol, double floor)
{
    ghc_tensor_t *want = ghc_st_load(st, key, GHC_DTYPE_F32, GHC_ROLE_WORKSPACE);
    ck_assert_msg(want != NULL, "fixture lacks %s", key);
    ghc_tensor_t *got = oc_host(core, got_t);
    ghc_tensor_t *g32 = ghc_tensor_init(core, GHC_DTYPE_F32, 1, (int64_t[]){ ghc_tensor_numel(got) }, GHC_DEVICE_CPU,
                                        GHC_ROLE_WORKSPACE);
    ck_assert_int_eq(ghc_tensor_numel(got), ghc_tensor_numel(want));
    ck_assert_int_eq(ghc_tensor_convert_cpu(g32, got, 1.0f), 0);
    const float *a = ghc_tensor_cdata(g32), *b = ghc_tensor_cdata(want);
    for (int64_t i = 0; i < ghc_tensor_numel(want); i++) {
        double lim = tol * fmax(fabs(b[i]), floor);
        ck_assert_msg(tol == 0 ? memcmp(&a[i], &b[i], 4) == 0 : fabs((double)a[i] - b[i]) <= lim,
                      "%s (%s)[%lld]: got %.9g, want %.9g (tol %g)", what, key, (long long)i, a[i], b[i], tol);
    }
    ghc_tensor_free(g32);
    ghc_tensor_free(got);
    ghc_tensor_free(want);
}

/* The saved state file as the optimizer writes it, opened. */
static ghc_st_t *oc_state(struct oc_run *r, const char *dir, const char *name)
{
    char path[4200];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    ck_assert_msg(ghc_optimizer_save(r->opt, path) == 0, "%s", ghc_error_message(r->core));
    ghc_st_t *st = ghc_st_open(r->core, path);
    ck_assert_ptr_nonnull(st);
    return st;
}

/* adamw against torch.optim.AdamW: both moments bit-identical; the params within `tol`
 * relative: PyTorch's CPU result differs from the formula evaluated op by op in f32 (as here)
 * by one rounding in a few elements a step (about 1 in 300, seen in the fixture's probe). */
static void oc_adamw_golden(int dev, double tol)
{
    char key[96], *dir = tu_tmpdir();
    for (int g = 0; g < 3; g++) {
        struct oc_run r;
        oc_open(&r, oc_adamw_cfg, dev, GHC_DTYPE_F32, oc_group_ids[g], NULL);
        ghc_st_t *fx = oc_fixture(r.core);
        for (int half = 0; half < 2; half++) {
            int at = half ? 20 : 10;
            oc_steps(&r, fx, half ? 11 : 1, at, oc_group_ids[g]);
            ghc_st_t *st = oc_state(&r, dir, "adamw.safetensors");
            for (int i = 0; i < OC_NP; i++) {
                snprintf(key, sizeof(key), "adamw.%s.%d.%s", oc_groups[g], at, oc_names[i]);
                oc_compare(r.core, "param", r.value[i], fx, key, tol, 1e-3);
                static const char *const sfx[2] = { "exp_avg", "exp_avg_sq" };
                for (int s = 0; s < 2; s++) {
                    char skey[96], fkey[128];
                    snprintf(skey, sizeof(skey), "%s.%s", oc_names[i], sfx[s]);
                    snprintf(fkey, sizeof(fkey), "%s.%s", key, sfx[s]);
                    ghc_tensor_t *t = ghc_st_load(st, skey, GHC_DTYPE_F32, GHC_ROLE_WORKSPACE);
                    ck_assert_ptr_nonnull(t);
                    oc_compare(r.core, sfx[s], t, fx, fkey, 0, 0);
                    ghc_tensor_free(t);
                }
            }
            ghc_st_free(st);
        }
        float lr = ghc_optimizer_lr(r.opt, oc_group_ids[g]);
        ck_assert_float_eq_tol(lr, g == 0 ? 2e-3f : g == 1 ? 5e-4f : 1e-3f, 1e-9f);
        ghc_st_free(fx);
        oc_close(&r);
    }
    tu_rm_rf(dir);
    free(dir);
}

/* automagic against ai-toolkit's: the lr mask codes, its scale and the polarity bit for bit;
 * the params and second moments within `tol` relative (the means and norms are summed in
 * another order than PyTorch's). */
static void oc_automagic_golden(int dev, double tol)
{
    char key[96], skey[96], fkey[128], cfg[1024], *dir = tu_tmpdir();
    snprintf(cfg, sizeof(cfg), oc_automagic_cfg, "");
    for (int g = 0; g < 3; g++) {
        struct oc_run r;
        oc_open(&r, cfg, dev, GHC_DTYPE_F32, oc_group_ids[g], NULL);
        ghc_st_t *fx = oc_fixture(r.core);
        for (int half = 0; half < 2; half++) {
            int at = half ? 20 : 10;
            oc_steps(&r, fx, half ? 11 : 1, at, oc_group_ids[g]);
            ghc_st_t *st = oc_state(&r, dir, "am.safetensors");
            for (int i = 0; i < OC_NP; i++) {
                snprintf(key, sizeof(key), "automagic.%s.%d.%s", oc_groups[g], at, oc_names[i]);
                oc_compare(r.core, "param", r.value[i], fx, key, tol, 1e-3);
                /* the mask: codes (u8) and scale exactly */
                snprintf(skey, sizeof(skey), "%s.lr_mask", oc_names[i]);
                snprintf(fkey, sizeof(fkey), "%s.lr_mask", key);
                ck_assert_int_eq(ghc_st_find(st, skey, &(struct ghc_st_info){ 0 }), 1);
                const uint8_t *q = ghc_st_raw(st, skey), *qw = ghc_st_raw(fx, fkey);
                int64_t n = ghc_tensor_numel(r.value[i]);
                for (int64_t j = 0; j < n; j++)
                    ck_assert_msg(q[j] == qw[j], "%s[%lld]: code %d, want %d", fkey, (long long)j, q[j], qw[j]);
                snprintf(skey, sizeof(skey), "%s.lr_scale", oc_names[i]);
                snprintf(fkey, sizeof(fkey), "%s.lr_scale", key);
                float sc[2], scw;
                memcpy(sc, ghc_st_raw(st, skey), 8);
                memcpy(&scw, ghc_st_raw(fx, fkey), 4);
                ck_assert_msg(memcmp(&sc[0], &scw, 4) == 0, "%s: scale %.9g, want %.9g", fkey, sc[0], scw);
                snprintf(fkey, sizeof(fkey), "%s.avg_lr", key);
                float avg;
                memcpy(&avg, ghc_st_raw(fx, fkey), 4);
                ck_assert_msg(fabs(sc[1] - avg) <= 1e-6 * avg, "%s: %.9g, want %.9g", fkey, sc[1], avg);
                /* polarity: bit j of the words against the fixture's bools */
                snprintf(skey, sizeof(skey), "%s.last_polarity", oc_names[i]);
                snprintf(fkey, sizeof(fkey), "%s.last_polarity", key);
                const uint8_t *w = ghc_st_raw(st, skey), *pw = ghc_st_raw(fx, fkey);
                for (int64_t j = 0; j < n; j++)
                    ck_assert_msg(((w[j / 8] >> (j % 8)) & 1) == pw[j], "%s[%lld]", fkey, (long long)j);
                /* second moments */
                bool factored = i < 2;
                static const char *const mom[2][2] = { { "exp_avg_sq_row", "exp_avg_sq_col" }, { "exp_avg_sq", NULL } };
                for (int s = 0; s < 2; s++) {
                    const char *ours = mom[!factored][s];
                    if (!ours)
                        continue;
                    snprintf(skey, sizeof(skey), "%s.%s", oc_names[i], ours);
                    snprintf(fkey, sizeof(fkey), "%s.%s", key, factored ? ours : "exp_avg_sq");
                    ghc_tensor_t *t = ghc_st_load(st, skey, GHC_DTYPE_F32, GHC_ROLE_WORKSPACE);
                    ck_assert_ptr_nonnull(t);
                    oc_compare(r.core, ours, t, fx, fkey, tol, 0);
                    ghc_tensor_free(t);
                }
            }
            ghc_st_free(st);
        }
        ghc_st_free(fx);
        oc_close(&r);
    }
    tu_rm_rf(dir);
    free(dir);
}

static char *oc_slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc(*len + 1);
    ck_assert_uint_eq(fread(b, 1, *len, f), *len);
    fclose(f);
    return b;
}

/* 20 steps straight vs 10, save, a new run from the saved params and state, 10 more: the
 * params and the state files at 20 are identical bytes. */
static void oc_resume(int dev, const char *section, enum ghc_dtype dt, int32_t group)
{
    char *dir = tu_tmpdir(), p1[4200], p2[4200], mid[4200];
    snprintf(p1, sizeof(p1), "%s/straight.safetensors", dir);
    snprintf(p2, sizeof(p2), "%s/resumed.safetensors", dir);
    snprintf(mid, sizeof(mid), "%s/step10.safetensors", dir);
    struct oc_run a, b, c;
    oc_open(&a, section, dev, dt, group, NULL);
    ghc_st_t *fx = oc_fixture(a.core);
    oc_steps(&a, fx, 1, 20, group);
    ck_assert_int_eq(ghc_optimizer_save(a.opt, p1), 0);

    oc_open(&b, section, dev, dt, group, NULL);
    oc_steps(&b, fx, 1, 10, group);
    ck_assert_int_eq(ghc_optimizer_save(b.opt, mid), 0);
    oc_open(&c, section, dev, dt, group, b.value);
    oc_close(&b);
    ck_assert_msg(ghc_optimizer_load(c.opt, mid) == 0, "%s", ghc_error_message(c.core));
    oc_steps(&c, fx, 11, 20, group);
    ck_assert_int_eq(ghc_optimizer_save(c.opt, p2), 0);
    for (int i = 0; i < OC_NP; i++) {
        ghc_tensor_t *x = oc_host(a.core, a.value[i]), *y = oc_host(c.core, c.value[i]);
        ck_assert_msg(memcmp(ghc_tensor_cdata(x), ghc_tensor_cdata(y), ghc_tensor_nbytes(x)) == 0,
                      "param %s differs after resume", oc_names[i]);
        ghc_tensor_free(x);
        ghc_tensor_free(y);
    }
    size_t l1, l2;
    char *s1 = oc_slurp(p1, &l1), *s2 = oc_slurp(p2, &l2);
    ck_assert_msg(l1 == l2 && memcmp(s1, s2, l1) == 0, "state files differ after resume");
    free(s1);
    free(s2);
    ghc_st_free(fx);
    oc_close(&a);
    oc_close(&c);
    tu_rm_rf(dir);
    free(dir);
}

#endif /* GHC_TEST_OPTIM_CASES_H */
