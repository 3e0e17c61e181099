/* lycoris_cases.h: the lycoris cases shared by the CPU suite (test_lycoris.c) and the GPU suite
 * (test_lycoris_cuda.c), on the device `dev` (GHC_DEVICE_CPU unless the suite sets another):
 *   - golden cases from the Python LyCORIS library (tests/fixtures/make_lycoris_fixtures.py):
 *     output, input gradient, adapter gradients and delta-W of LoRA (plain, rs_lora), LoHa and
 *     LoKr (factor -1, 4, 16; full, low-rank W2, both decomposed, full_matrix), read from the
 *     files LyCORIS saved (so loading LyCORIS files is tested too), with f32 and bf16 input;
 *   - end to end on the tiny wan22 model: the wan22 fixture's LoRA (diffusers + peft goldens)
 *     loaded through the network gives the fixture's prediction and gradients, on a random
 *     loaded through the network gives the fixture's prediction and gradients, on a random
 *     model the adapter gradients match central finite differences of the loss, and the ways
 *     the core may take (linear.h, forced with ghc_linear_ways) agree with each other;
 *   - ghc_linear_forward_gelu in each way against ghc_linear_forward and the GELU op, and a bf16
 *     output's bias rounded to bf16 (linear.h, API 20).
 * Header-only like optim_cases.h: static functions and Check tests, one copy per suite; the
 * suites add the tests (golden, golden_bf16_input, wan22_*, linear_*) to their own test cases. */
#ifndef GHC_TEST_LYCORIS_CASES_H
#define GHC_TEST_LYCORIS_CASES_H

#include <check.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gh200core/gh200core.h>
#include <gh200core/linear.h>
#include <gh200core/ops.h>
#include <gh200core/safetensors.h>

#include "testutil.h"
#include "../plugins/lycoris/lycoris_impl.h"

static int dev = GHC_DEVICE_CPU;   /* the device the golden cases and the wan22 check run on */

static void ok(ghc_core_t *core, int rc)
{
    ck_assert_msg(rc == 0, "failed (%d): %s", rc, ghc_error_message(core));
}

/* A hook member's return: want 1 (did its work) or 0 (nothing to add in this step). */
static void did(ghc_core_t *core, int rc, int want)
{
    ck_assert_msg(rc == want, "hook member returned %d, expected %d: %s", rc, want,
                  rc < 0 ? ghc_error_message(core) : "");
}

static char *fixture(const char *dir, const char *name)
{
    static char buf[4][1024];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, 1024, "%s/tests/fixtures/%s/%s", tu_env("GHC_TOP_SRCDIR"), dir, name);
    return p;
}

/* A core with a memory policy (host on the CPU, device on the GPU), a network section
 * `net_cfg` (the body) and optionally a model section body. */
static ghc_core_t *core_with(const char *net_cfg, const char *model_cfg)
{
    ghc_core_t *core = ghc_core_init();
    ck_assert_ptr_nonnull(core);
    ok(core, ghc_plugin_add_path(core, tu_env("GHC_BUILD_PLUGINS")));
    char text[4096];
    snprintf(text, sizeof(text), "mempolicy = { plugin = \"%s\"; };\n%s%s%s"
             "network = { plugin = \"lycoris\"; device = %d; %s };\n", dev == GHC_DEVICE_CPU ? "host" : "device",
             model_cfg ? "model = { plugin = \"wan22\"; " : "", model_cfg ? model_cfg : "", model_cfg ? " };\n" : "",
             dev, net_cfg);
    ok(core, ghc_config_load_string(core, text, "test.cfg", NULL, NULL, 0));
    ok(core, ghc_run_init(core));
    return core;
}

/* One linear like the golden cases' (in 64, out 48). */
static const struct ghc_model_target one_target = {
    .name = "blocks.0.self_attn.q", .alias = "blocks.0.attn1.to_q", .in_features = 64, .out_features = 48, .block = 0,
};

static ghc_tensor_t *load(ghc_core_t *core, ghc_st_t *st, const char *name)
{
    ghc_tensor_t *t = ghc_st_load(st, name, GHC_DTYPE_F32, GHC_ROLE_WORKSPACE);
    ck_assert_msg(t != NULL, "%s: %s", name, ghc_error_message(core));
    return t;
}

static ghc_tensor_t *mk(ghc_core_t *core, int device, enum ghc_dtype dt, int ndim, const int64_t *shape)
{
    ghc_tensor_t *t = ghc_tensor_init(core, dt, ndim, shape, device, GHC_ROLE_ACTIVATIONS);
    ck_assert_msg(t != NULL, "tensor: %s", ghc_error_message(core));
    return t;
}

/* A copy of t on `device` in dtype dt. */
static ghc_tensor_t *on(ghc_core_t *core, const ghc_tensor_t *t, int device, enum ghc_dtype dt)
{
    const ghc_tensor_t *h = t;
    ghc_tensor_t *tmp = NULL;
    if (dt != ghc_tensor_dtype(t)) {
        tmp = mk(core, ghc_tensor_device(t), dt, ghc_tensor_ndim(t), ghc_tensor_shape(t));
        ok(core, ghc_op_cast(tmp, t, 1.0f, NULL, NULL));
        h = tmp;
    }
    ghc_tensor_t *d = mk(core, device, dt, ghc_tensor_ndim(t), ghc_tensor_shape(t));
    ok(core, ghc_op_copy(d, h, NULL));
    ok(core, ghc_op_sync(core, device == GHC_DEVICE_CPU ? ghc_tensor_device(h) : device, NULL));
    ghc_tensor_free(tmp);
    return d;
}

/* ||got - ref|| / ||ref|| (got f32 on any device; ref f32 CPU). */
static double rel_err(ghc_core_t *core, const ghc_tensor_t *got, const ghc_tensor_t *ref)
{
    ck_assert_int_eq(ghc_tensor_numel(got), ghc_tensor_numel(ref));
    ghc_tensor_t *h = on(core, got, GHC_DEVICE_CPU, GHC_DTYPE_F32);
    const float *a = ghc_tensor_cdata(h), *b = ghc_tensor_cdata(ref);
    double num = 0, den = 0;
    for (int64_t i = 0; i < ghc_tensor_numel(ref); i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    ghc_tensor_free(h);
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* ---- golden cases ---------------------------------------------------------------------------- */

struct gcase {
    const char *name, *cfg;
    const char *target;   /* DoRA: the wan22 fixture target whose W the case uses (through the model) */
};

static const struct gcase gcases[] = {
    { "lora_r4", "algo = \"lora\"; rank = 4; alpha = 2.0;", NULL },
    { "lora_r8_rs", "algo = \"lora\"; rank = 8; alpha = 4.0; rs_lora = true;", NULL },
    { "loha_r4", "algo = \"loha\"; rank = 4; alpha = 2.0;", NULL },
    { "lokr_fm1_full", "algo = \"lokr\"; rank = 4; alpha = 1.0; factor = -1;", NULL },
    { "lokr_f4_w2lr", "algo = \"lokr\"; rank = 2; alpha = 3.0; factor = 4;", NULL },
    { "lokr_f16_both", "algo = \"lokr\"; rank = 1; alpha = 0.5; factor = 16; decompose_both = true;", NULL },
    { "lokr_f16_full", "algo = \"lokr\"; rank = 2; alpha = 8.0; factor = 16; full_matrix = true;", NULL },
    { "dora_r4_ffn0", "algo = \"lora\"; rank = 4; alpha = 2.0; dora_wd = true; preset = \"attn\";\n"
      "exclude = [\"*attn*\"]; include = [\"blocks.0.ffn.0\"];",
      "blocks.0.ffn.0" },
    { "dora_r8_q", "algo = \"lora\"; rank = 8; alpha = 8.0; dora_wd = true; preset = \"attn\";\n"
      "exclude = [\"blocks.[12].*\", \"*cross_attn*\", \"*.k\", \"*.v\", \"*.o\"];",
      "blocks.0.self_attn.q" },
};
#define N_GCASES ((int)(sizeof(gcases) / sizeof(gcases[0])))

#define TOL_F32   2e-5
#define TOL_BF16X 1.5e-2

/* y = x W^T + b on dev (the frozen linear the hook adds to). */
static ghc_tensor_t *base_linear(ghc_core_t *core, const ghc_tensor_t *x, const ghc_tensor_t *w, const ghc_tensor_t *b)
{
    int64_t shape[3] = { ghc_tensor_dim(x, 0), ghc_tensor_dim(x, 1), ghc_tensor_dim(w, 0) };
    ghc_tensor_t *y = mk(core, ghc_tensor_device(x), GHC_DTYPE_F32, 3, shape);
    ghc_tensor_t *x2 = ghc_tensor_wrap(core, ghc_tensor_dtype(x), 2, (const int64_t[]){ shape[0] * shape[1], ghc_tensor_dim(x, 2) },
                                       ghc_tensor_device(x), (void *)ghc_tensor_cdata(x));
    ghc_tensor_t *y2 = ghc_tensor_wrap(core, GHC_DTYPE_F32, 2, (const int64_t[]){ shape[0] * shape[1], shape[2] },
                                       ghc_tensor_device(x), ghc_tensor_data(y));
    ok(core, ghc_op_gemm(y2, x2, w, &(struct ghc_gemm){ .trans_b = true, .epilogue = GHC_EPI_BIAS, .bias = b }, NULL));
    ghc_tensor_free(x2);
    ghc_tensor_free(y2);
    return y;
}

static char *wan22_cfg(char *buf, size_t len, bool f32);

/* DoRA before loading: g (dora_scale) holds the row norms of the model's W, as LyCORIS sets it. */
static void check_dora_init(ghc_core_t *core, ghc_network_t *net, ghc_st_t *st, const char *name)
{
    struct ghc_param *ps;
    int32_t np;
    ok(core, ghc_network_params(net, 0, &ps, &np));
    ck_assert_int_eq(np, 3);
    ck_assert_str_eq(ps[2].name + strlen(ps[2].name) - 10, "dora_scale");
    ghc_tensor_t *ref = load(core, st, "case.g0");
    double e = rel_err(core, ps[2].value, ref);
    printf("%s: initial dora_scale rel err %.3g\n", name, e);
    ck_assert_msg(e < 1e-6, "%s: initial dora_scale rel err %g", name, e);
    ghc_tensor_free(ref);
}

static void run_gcase(int i, bool bf16_x)
{
    const struct gcase *gc = &gcases[i];
    char mcfg[1024];
    ghc_core_t *core = core_with(gc->cfg, gc->target ? wan22_cfg(mcfg, sizeof(mcfg), true) : NULL);
    ghc_network_t *net = ghc_network_get(core);
    const struct ghc_model_target *tg = &one_target;
    int32_t ntg = 1, ti = 0;
    if (gc->target) {
        ok(core, ghc_model_targets(ghc_model_get(core), &tg, &ntg));
        for (ti = 0; ti < ntg && strcmp(tg[ti].name, gc->target) != 0; ti++)
            ;
        ck_assert_int_lt(ti, ntg);
    }
    ok(core, ghc_network_attach(net, 0, tg, ntg));
    char path[64];
    snprintf(path, sizeof(path), "%s.safetensors", gc->name);
    ghc_st_t *st = ghc_st_open(core, fixture("lycoris", path));
    ck_assert_ptr_nonnull(st);
    if (gc->target)
        check_dora_init(core, net, st, gc->name);
    ok(core, ghc_network_load(net, 0, fixture("lycoris", path)));
    enum ghc_dtype xdt = bf16_x ? GHC_DTYPE_BF16 : GHC_DTYPE_F32;
    ghc_tensor_t *xh = load(core, st, "case.x"), *rh = load(core, st, "case.r");
    ghc_tensor_t *wh = load(core, st, "case.w"), *bh = load(core, st, "case.b");
    ghc_tensor_t *x = on(core, xh, dev, xdt), *r = on(core, rh, dev, GHC_DTYPE_F32);
    ghc_tensor_t *w = on(core, wh, dev, xdt), *b = on(core, bh, dev, GHC_DTYPE_F32);
    struct ghc_adapter_hook hook;
    ok(core, ghc_network_hook(net, 0, &hook));
    ok(core, ghc_network_begin_step(net, 1));
    ck_assert(hook.struct_size == sizeof(struct ghc_adapter_hook));
    ck_assert(hook.plan && hook.forward && hook.backward && hook.fold && hook.grads && hook.concat_forward &&
              hook.concat_backward);
    struct ghc_param *ps;
    int32_t np;
    ok(core, ghc_network_params(net, 0, &ps, &np));

    /* the plan: every algorithm adds or writes its forward part but DoRA (adds only); LoRA without
     * DoRA also writes dx and K-concatenates at its rank; fold only where the config asks */
    const bool dora = gc->target != NULL, lora = strncmp(gc->name, "lora", 4) == 0;
    struct ghc_adapter_plan pl = { .struct_size = sizeof(pl) };
    did(core, hook.plan(hook.user, ti, &pl), 1);
    ck_assert(pl.adapted && pl.forward_writes == !dora && pl.backward_writes == lora && !pl.fold);
    ck_assert_int_eq(pl.concat_rank, lora ? ghc_tensor_dim(ps[0].value, 0) : 0);
    if (gc->target) {   /* a target the case does not select */
        pl = (struct ghc_adapter_plan){ .struct_size = sizeof(pl) };
        did(core, hook.plan(hook.user, (ti + 1) % ntg, &pl), 1);
        ck_assert(!pl.adapted && !pl.forward_writes && !pl.backward_writes && !pl.fold && pl.concat_rank == 0);
    }

    /* forward */
    ghc_tensor_t *y = base_linear(core, x, w, b);
    did(core, hook.forward(hook.user, ti, x, y, false, NULL), 1);
    ghc_tensor_t *ref = load(core, st, "case.y");
    double e = rel_err(core, y, ref), tol = bf16_x ? TOL_BF16X : TOL_F32;
    printf("%s%s: output rel err %.3g\n", gc->name, bf16_x ? " (bf16 x)" : "", e);
    ck_assert_msg(e < tol, "%s: output rel err %g", gc->name, e);

    /* forward writing its part (y's old content ignored), the frozen linear added after it as the
     * core does; DoRA refuses (its plan does not offer it) */
    ghc_tensor_t *yw = mk(core, dev, GHC_DTYPE_F32, 3, ghc_tensor_shape(y));
    ok(core, ghc_op_fill(yw, 7.0, NULL));
    if (dora) {
        ck_assert_int_eq(hook.forward(hook.user, ti, x, yw, true, NULL), GHC_EINVAL);
    } else {
        did(core, hook.forward(hook.user, ti, x, yw, true, NULL), 1);
        ghc_tensor_t *yb = base_linear(core, x, w, b);
        ok(core, ghc_op_add(yw, yw, yb, 1.0f, 1.0f, NULL));
        e = rel_err(core, yw, ref);
        printf("%s%s: output (written, then the frozen linear added) rel err %.3g\n", gc->name,
               bf16_x ? " (bf16 x)" : "", e);
        ck_assert_msg(e < tol, "%s: written output rel err %g", gc->name, e);
        ghc_tensor_free(yb);
    }
    ghc_tensor_free(yw);
    ghc_tensor_free(ref);

    /* backward: dx starts as the frozen part r W */
    ghc_tensor_t *wf = on(core, wh, dev, GHC_DTYPE_F32);
    ghc_tensor_t *dx = mk(core, dev, GHC_DTYPE_F32, 3, ghc_tensor_shape(xh));
    int64_t n_in = ghc_tensor_dim(wh, 1), n_out = ghc_tensor_dim(wh, 0);
    ghc_tensor_t *r2 = ghc_tensor_wrap(core, GHC_DTYPE_F32, 2, (const int64_t[]){ 10, n_out }, dev, ghc_tensor_data(r));
    ghc_tensor_t *dx2 = ghc_tensor_wrap(core, GHC_DTYPE_F32, 2, (const int64_t[]){ 10, n_in }, dev, ghc_tensor_data(dx));
    ok(core, ghc_op_gemm(dx2, r2, wf, NULL, NULL));
    for (int32_t k = 0; k < np; k++)
        ok(core, ghc_op_fill(ps[k].grad, 0.0, NULL));
    did(core, hook.backward(hook.user, ti, x, r, NULL, dx, true, NULL), 1);
    ref = load(core, st, "case.dx");
    e = rel_err(core, dx, ref);
    printf("%s%s: input gradient rel err %.3g\n", gc->name, bf16_x ? " (bf16 x)" : "", e);
    ck_assert_msg(e < tol, "%s: dx rel err %g", gc->name, e);
    ghc_tensor_free(ref);
    for (int32_t k = 0; k < np; k++) {
        char nm[160];
        const char *sfx = ps[k].name + strlen(tg[ti].name) + 1;
        snprintf(nm, sizeof(nm), "case.grad.%s", sfx);
        ref = load(core, st, nm);
        e = rel_err(core, ps[k].grad, ref);
        printf("%s%s: grad %s rel err %.3g\n", gc->name, bf16_x ? " (bf16 x)" : "", sfx, e);
        ck_assert_msg(e < tol * 2, "%s: %s rel err %g", gc->name, nm, e);
        ck_assert_int_eq(ps[k].group, 0);
        ck_assert_int_eq(ghc_tensor_role(ps[k].value), GHC_ROLE_ADAPTER);
        ck_assert_int_eq(ghc_tensor_role(ps[k].grad), GHC_ROLE_GRADS);
        ghc_tensor_free(ref);
    }

    /* backward writing dx (its old content ignored), the frozen part r W added after it as the
     * core does: LoRA without DoRA; the others refuse (their plans do not offer it) */
    ghc_tensor_t *dxw = mk(core, dev, GHC_DTYPE_F32, 3, ghc_tensor_shape(xh));
    ghc_tensor_t *dxw2 = ghc_tensor_wrap(core, GHC_DTYPE_F32, 2, (const int64_t[]){ 10, n_in }, dev,
                                         ghc_tensor_data(dxw));
    ok(core, ghc_op_fill(dxw, 7.0, NULL));
    if (!lora) {
        ck_assert_int_eq(hook.backward(hook.user, ti, x, r, NULL, dxw, false, NULL), GHC_EINVAL);
    } else {
        did(core, hook.backward(hook.user, ti, x, r, NULL, dxw, false, NULL), 1);
        ok(core, ghc_op_gemm(dxw2, r2, wf, &(struct ghc_gemm){ .beta = 1.0f }, NULL));
        ref = load(core, st, "case.dx");
        e = rel_err(core, dxw, ref);
        printf("%s%s: input gradient (written, then the frozen part added) rel err %.3g\n", gc->name,
               bf16_x ? " (bf16 x)" : "", e);
        ck_assert_msg(e < tol, "%s: written dx rel err %g", gc->name, e);
        ghc_tensor_free(ref);
    }
    ghc_tensor_free(dxw2);
    ghc_tensor_free(dxw);

    /* fold (LoRA): y = x (W + delta-W)^T + b, dx = r (W + delta-W) and the grads hook's gradients
     * match the fixture like the hooks' (bf16 x: dy given in bf16 too, as the model gives it) */
    if (strncmp(gc->name, "lora", 4) == 0) {
        char cfg[256];
        snprintf(cfg, sizeof(cfg), "%s fold = true;", gc->cfg);
        ghc_core_t *c2 = core_with(cfg, NULL);
        ghc_network_t *n2 = ghc_network_get(c2);
        struct ghc_adapter_hook h2;
        struct ghc_param *p2;
        int32_t n2p;
        ok(c2, ghc_network_attach(n2, 0, &one_target, 1));
        ok(c2, ghc_network_load(n2, 0, fixture("lycoris", path)));
        ok(c2, ghc_network_hook(n2, 0, &h2));
        ok(c2, ghc_network_begin_step(n2, 1));
        struct ghc_adapter_plan pl2 = { .struct_size = sizeof(pl2) };
        did(c2, h2.plan(h2.user, 0, &pl2), 1);   /* fold, and so no K-concatenation */
        ck_assert(pl2.adapted && pl2.forward_writes && pl2.backward_writes && pl2.fold && pl2.concat_rank == 0);
        pl2 = (struct ghc_adapter_plan){ .struct_size = offsetof(struct ghc_adapter_plan, fold) };
        did(c2, h2.plan(h2.user, 0, &pl2), 1);   /* a caller of an older plan: nothing past its struct_size */
        ck_assert(pl2.adapted && !pl2.fold && pl2.concat_rank == 0);
        ok(c2, ghc_network_params(n2, 0, &p2, &n2p));
        for (int32_t k = 0; k < n2p; k++)
            ok(c2, ghc_op_fill(p2[k].grad, 0.0, NULL));
        ghc_tensor_t *x_ = on(c2, xh, dev, xdt), *w_ = on(c2, wh, dev, xdt), *b_ = on(c2, bh, dev, GHC_DTYPE_F32);
        ghc_tensor_t *wfold = mk(c2, dev, xdt, 2, ghc_tensor_shape(wh));
        ck_assert_int_eq(h2.fold(h2.user, 0, w_, wfold, NULL), 1);
        ghc_tensor_t *y2 = base_linear(c2, x_, wfold, b_);
        ref = load(c2, st, "case.y");
        e = rel_err(c2, y2, ref);
        printf("%s%s: fold: output rel err %.3g\n", gc->name, bf16_x ? " (bf16 x)" : "", e);
        ck_assert_msg(e < tol, "%s: fold: output rel err %g", gc->name, e);
        ghc_tensor_free(ref);
        ghc_tensor_t *wff = on(c2, wfold, dev, GHC_DTYPE_F32), *dxf = mk(c2, dev, GHC_DTYPE_F32, 2, (const int64_t[]){ 10, n_in });
        ghc_tensor_t *rr = on(c2, rh, dev, xdt);
        ghc_tensor_t *rr2 = ghc_tensor_wrap(c2, xdt, 2, (const int64_t[]){ 10, n_out }, dev, ghc_tensor_data(rr));
        ghc_tensor_t *rf2 = ghc_tensor_wrap(c2, GHC_DTYPE_F32, 2, (const int64_t[]){ 10, n_out }, dev, ghc_tensor_data(r));
        ok(c2, ghc_op_gemm(dxf, rf2, wff, NULL, NULL));
        did(c2, h2.grads(h2.user, 0, x_, rr, NULL), 1);
        ref = load(c2, st, "case.dx");
        e = rel_err(c2, dxf, ref);
        printf("%s%s: fold: input gradient rel err %.3g\n", gc->name, bf16_x ? " (bf16 x)" : "", e);
        ck_assert_msg(e < tol, "%s: fold: dx rel err %g", gc->name, e);
        ghc_tensor_free(ref);
        for (int32_t k = 0; k < n2p; k++) {
            char nm[160];
            snprintf(nm, sizeof(nm), "case.grad.%s", p2[k].name + strlen(one_target.name) + 1);
            ref = load(c2, st, nm);
            e = rel_err(c2, p2[k].grad, ref);
            printf("%s%s: fold: grad %s rel err %.3g\n", gc->name, bf16_x ? " (bf16 x)" : "", nm, e);
            ck_assert_msg(e < tol * 2, "%s: fold: %s rel err %g", gc->name, nm, e);
            ghc_tensor_free(ref);
        }
        ghc_tensor_t *fa[] = { x_, w_, b_, wfold, y2, wff, dxf, rr, rr2, rf2 };
        for (size_t k = 0; k < sizeof(fa) / sizeof(fa[0]); k++)
            ghc_tensor_free(fa[k]);
        ghc_core_free(c2);
    }

    /* delta-W: the hook on x = I with y = 0 gives delta-W^T (not for DoRA, whose hook is not
     * linear in y: its merged weight is checked by the merge tests) */
    if (!bf16_x && !gc->target) {
        ghc_tensor_t *eye = mk(core, GHC_DEVICE_CPU, GHC_DTYPE_F32, 3, (const int64_t[]){ 1, 64, 64 });
        float *ev = ghc_tensor_data(eye);
        for (int k = 0; k < 64 * 64; k++)
            ev[k] = k % 65 == 0;
        ghc_tensor_t *eyed = on(core, eye, dev, GHC_DTYPE_F32);
        ghc_tensor_t *dwt = mk(core, dev, GHC_DTYPE_F32, 3, (const int64_t[]){ 1, 64, 48 });
        ok(core, ghc_op_fill(dwt, 0.0, NULL));
        did(core, hook.forward(hook.user, 0, eyed, dwt, false, NULL), 1);
        ghc_tensor_t *dwh = on(core, dwt, GHC_DEVICE_CPU, GHC_DTYPE_F32);
        ref = load(core, st, "case.dw");
        const float *g = ghc_tensor_cdata(dwh), *rv = ghc_tensor_cdata(ref);
        double num = 0, den = 0;
        for (int o = 0; o < 48; o++)
            for (int c = 0; c < 64; c++) {
                double d = (double)g[c * 48 + o] - rv[o * 64 + c];
                num += d * d;
                den += (double)rv[o * 64 + c] * rv[o * 64 + c];
            }
        printf("%s: delta-W rel err %.3g\n", gc->name, sqrt(num / den));
        ck_assert_msg(sqrt(num / den) < TOL_F32, "%s: delta-W rel err %g", gc->name, sqrt(num / den));
        ghc_tensor_free(ref);
        ghc_tensor_free(dwh);
        ghc_tensor_free(dwt);
        ghc_tensor_free(eyed);
        ghc_tensor_free(eye);
    }
    ghc_tensor_t *all[] = { xh, rh, wh, bh, x, r, w, b, y, wf, dx, r2, dx2 };
    for (size_t k = 0; k < sizeof(all) / sizeof(all[0]); k++)
        ghc_tensor_free(all[k]);
    ghc_st_free(st);
    ghc_core_free(core);
}

START_TEST(golden)
{
    run_gcase(_i, false);
}
END_TEST

START_TEST(golden_bf16_input)
{
    run_gcase(_i, true);
}
END_TEST

/* ---- end to end on the wan22 fixture model -------------------------------------------------- */

/* The wan22 fixture model on dev: f32 on the CPU, bf16 on the GPU unless f32 is asked for (the
 * finite differences need an f32 loss). */
/* More model keys for the next wan_net (e.g. its checkpointing; "": the defaults). */
static const char *wan_model_more = "";

static char *wan22_cfg(char *buf, size_t len, bool f32)
{
    snprintf(buf, len, "checkpoint = \"%s\"; heads = 2; dtype = \"%s\"; device = %d; %s",
             fixture("wan22", "weights_official.safetensors"), dev == GHC_DEVICE_CPU || f32 ? "f32" : "bf16", dev,
             wan_model_more);
    return buf;
}

/* The wan22 fixture's case (x_sigma, t, text, v) on dev, forward + mse (+ backward when bwd)
 * through the network's hook. Returns the loss; *pred (CPU f32) gets the prediction when pred
 * != NULL.
 *
 * wan_step installs the network's hook with its members wrapped, counting the calls that did
 * the work (returned 1), and lets the core take only some of its ways (linear.h,
 * ghc_linear_ways, read when the hook is installed): without K-concatenation unless
 * with_concat (the tests from before it), and with after_only neither the adapter's parts
 * written before the model's GEMMs (forward write, backward accumulate false): added after. */
static bool after_only, with_concat;
static bool drop_kept_h;   /* the backward finds no H kept from the forward: computes it again */
static struct ghc_adapter_hook real_hook;
static int n_fwd, n_fwd_write;   /* forward calls that did the work; of them with write */
static int n_bwd, n_bwd_write;   /* backward calls that did the work; of them writing a dx */
static int n_cat_fwd, n_cat_bwd;

static int count_fwd(void *user, int32_t target, const ghc_tensor_t *x, ghc_tensor_t *y, bool write, void *stream)
{
    int rc = real_hook.forward(user, target, x, y, write, stream);
    n_fwd += rc == 1;
    n_fwd_write += rc == 1 && write;
    return rc;
}

static int count_bwd(void *user, int32_t target, const ghc_tensor_t *x, const ghc_tensor_t *dy, const ghc_tensor_t *g,
                     ghc_tensor_t *dx, bool accumulate, void *stream)
{
    if (drop_kept_h) {   /* (the tests link the plugin's header: its kept H, invalidated) */
        struct lycoris *lnet = user;
        for (int i = 0; i < LYC_HKEEP; i++)
            lnet->hk[i].valid = false;
    }
    int rc = real_hook.backward(user, target, x, dy, g, dx, accumulate, stream);
    n_bwd += rc == 1;
    n_bwd_write += rc == 1 && dx && !accumulate;
    return rc;
}

static int count_cat_fwd(void *user, int32_t target, const ghc_tensor_t *x, ghc_tensor_t *h, ghc_tensor_t *wcols,
                         bool again, void *stream)
{
    int rc = real_hook.concat_forward(user, target, x, h, wcols, again, stream);
    n_cat_fwd += rc == 1;
    return rc;
}

static int count_cat_bwd(void *user, int32_t target, const ghc_tensor_t *x, const ghc_tensor_t *h,
                         const ghc_tensor_t *dy, ghc_tensor_t *g, ghc_tensor_t *dh, ghc_tensor_t *wrows, void *stream)
{
    int rc = real_hook.concat_backward(user, target, x, h, dy, g, dh, wrows, stream);
    n_cat_bwd += rc == 1;
    return rc;
}

static float wan_step(ghc_core_t *core, ghc_st_t *cs, ghc_tensor_t **pred, bool bwd)
{
    ghc_model_t *model = ghc_model_get(core);
    ghc_network_t *net = ghc_network_get(core);
    struct ghc_adapter_hook hook;
    ok(core, ghc_network_hook(net, 0, &hook));
    ck_assert(hook.forward && hook.backward && hook.concat_forward && hook.concat_backward);
    real_hook = hook;
    hook.forward = count_fwd;
    hook.backward = count_bwd;
    hook.concat_forward = count_cat_fwd;
    hook.concat_backward = count_cat_bwd;
    ghc_linear_ways(GHC_LINEAR_ALL & ~(with_concat ? 0u : GHC_LINEAR_CONCAT) & ~(after_only ? GHC_LINEAR_WRITE : 0u));
    int rc = ghc_model_set_hook(model, &hook);
    ghc_linear_ways(GHC_LINEAR_ALL);
    ok(core, rc);
    ghc_tensor_t *xh = load(core, cs, "x_sigma_700"), *th = load(core, cs, "t_700");
    ghc_tensor_t *eh = load(core, cs, "text_embedding"), *vh = load(core, cs, "v");
    ghc_tensor_reshape(th, 1, (const int64_t[]){ 1 });
    ghc_tensor_t *x = on(core, xh, dev, GHC_DTYPE_F32), *t = on(core, th, dev, GHC_DTYPE_F32);
    ghc_tensor_t *e = on(core, eh, dev, GHC_DTYPE_F32), *v = on(core, vh, dev, GHC_DTYPE_F32);
    ghc_tensor_t *out = mk(core, dev, GHC_DTYPE_F32, 5, ghc_tensor_shape(xh));
    ghc_tensor_t *grad = mk(core, dev, GHC_DTYPE_F32, 5, ghc_tensor_shape(xh));
    ghc_tensor_t *loss = mk(core, dev, GHC_DTYPE_F32, 1, (const int64_t[]){ 1 });
    struct ghc_model_batch b = { .noisy = x, .timesteps = t, .text_embed = e };
    ok(core, ghc_model_forward(model, 0, &b, out, bwd, NULL));
    ok(core, ghc_op_mse_loss(loss, grad, out, v, NULL));
    if (bwd)
        ok(core, ghc_model_backward(model, 0, grad, NULL, NULL));
    ghc_tensor_t *lh = on(core, loss, GHC_DEVICE_CPU, GHC_DTYPE_F32);
    float l = *(const float *)ghc_tensor_cdata(lh);
    if (pred)
        *pred = on(core, out, GHC_DEVICE_CPU, GHC_DTYPE_F32);
    ghc_tensor_t *all[] = { xh, th, eh, vh, x, t, e, v, out, grad, loss, lh };
    for (size_t k = 0; k < sizeof(all) / sizeof(all[0]); k++)
        ghc_tensor_free(all[k]);
    return l;
}

/* The wan22 fixture's LoRA (30 targets, rank 4, peft naming lora_A/lora_B with bare module names
 * and an alpha each), loaded by the network from case.safetensors itself (its other tensors are
 * reported and skipped), gives the fixture's diffusers + peft prediction and LoRA gradients;
 * _i = 1: the same with fold = true (delta-W folded into the model's GEMM weights, the grads
 * hook in the backward); _i = 2: with K-concatenation (the adapter's factors in the model's own
 * GEMMs), within the same tolerances. */
START_TEST(wan22_fixture_lora)
{
    char mcfg[1024];
    ghc_core_t *core = core_with(_i == 1 ? "algo = \"lora\"; rank = 4; alpha = 1.0; fold = true;"
                                         : "algo = \"lora\"; rank = 4; alpha = 1.0;", wan22_cfg(mcfg, sizeof(mcfg), false));
    ghc_model_t *model = ghc_model_get(core);
    ghc_network_t *net = ghc_network_get(core);
    const struct ghc_model_target *tg;
    int32_t n;
    ok(core, ghc_model_targets(model, &tg, &n));
    ok(core, ghc_network_attach(net, 0, tg, n));
    const char *case_path = fixture("wan22", "case.safetensors");
    ok(core, ghc_network_load(net, 0, case_path));
    ghc_st_t *cs = ghc_st_open(core, case_path);
    ck_assert_ptr_nonnull(cs);
    struct ghc_param *ps;
    int32_t np;
    ok(core, ghc_network_params(net, 0, &ps, &np));
    ck_assert_int_eq(np, 60);
    for (int32_t k = 0; k < np; k++)
        ok(core, ghc_op_fill(ps[k].grad, 0.0, NULL));
    ghc_tensor_t *pred;
    n_cat_fwd = n_cat_bwd = 0;
    with_concat = _i == 2;   /* (fold plans no K-concatenation; _i = 0 and 1 leave it out) */
    float loss = wan_step(core, cs, &pred, true);
    with_concat = false;
    ck_assert_int_eq(n_cat_fwd, _i == 2 ? 60 : 0);   /* 10 targets x 3 blocks x (forward, recomputation) */
    ck_assert_int_eq(n_cat_bwd, _i == 2 ? 30 : 0);
    ghc_tensor_t *ref = load(core, cs, "lora_pred_700");
    double e = rel_err(core, pred, ref), tol = dev == GHC_DEVICE_CPU ? 1e-5 : 2e-2;
    printf("wan22 fixture LoRA through the network: prediction rel err %.3g, loss %.8f\n", e, loss);
    ck_assert_msg(e < tol, "lora_pred_700 rel err %g", e);
    ghc_tensor_free(ref);
    /* our params hold lora_B times (file scale / our scale) = 2: the gradient of B is ours / 2
     * relative to the fixture's (dL/dB_ours = dL/dB_file * (s_ours / s_file)) and of A the same */
    double num = 0, den = 0;
    for (int32_t k = 0; k < np; k++) {
        char nm[160];
        bool up = strstr(ps[k].name, "lora_up") != NULL;
        snprintf(nm, sizeof(nm), "grad.%.*s.lora_%c", (int)(strstr(ps[k].name, ".lora_") - ps[k].name), ps[k].name,
                 up ? 'B' : 'A');
        ref = load(core, cs, nm);
        ghc_tensor_t *g = on(core, ps[k].grad, GHC_DEVICE_CPU, GHC_DTYPE_F32), *al;
        char an[160];
        snprintf(an, sizeof(an), "%.*s.alpha", (int)(strstr(ps[k].name, ".lora_") - ps[k].name), ps[k].name);
        al = load(core, cs, an);
        double ratio = (*(const float *)ghc_tensor_cdata(al) / 4.0) / (1.0 / 4.0);   /* s_file / s_ours */
        const float *gv = ghc_tensor_cdata(g), *rv = ghc_tensor_cdata(ref);
        for (int64_t j = 0; j < ghc_tensor_numel(ref); j++) {
            double want = up ? rv[j] / ratio : rv[j];   /* dL/dB' = dL/dB / ratio; A unchanged */
            num += (gv[j] - want) * (gv[j] - want);
            den += want * want;
        }
        ghc_tensor_free(al);
        ghc_tensor_free(g);
        ghc_tensor_free(ref);
    }
    e = sqrt(num / den);
    printf("wan22 fixture LoRA: the 60 gradients together rel err %.3g\n", e);
    ck_assert_msg(e < (dev == GHC_DEVICE_CPU ? 1e-4 : 5e-2), "LoRA gradients rel err %g", e);
    ghc_tensor_free(pred);
    ghc_st_free(cs);
    ghc_core_free(core);
}
END_TEST

/* A core with the wan22 fixture model (f32: as wan22_cfg) and the network of net_cfg attached
 * to every target, its parameters moved off their zero-delta init (normal times `scale`, seeded)
 * and their gradients zeroed. */
static ghc_core_t *wan_net(const char *net_cfg, bool f32, uint64_t seed, float scale, struct ghc_param **ps,
                           int32_t *np)
{
    char mcfg[1024];
    ghc_core_t *core = core_with(net_cfg, wan22_cfg(mcfg, sizeof(mcfg), f32));
    ghc_network_t *net = ghc_network_get(core);
    const struct ghc_model_target *tg;
    int32_t n;
    ok(core, ghc_model_targets(ghc_model_get(core), &tg, &n));
    ok(core, ghc_network_attach(net, 0, tg, n));
    ok(core, ghc_network_params(net, 0, ps, np));
    for (int32_t k = 0; k < *np; k++) {
        ghc_tensor_t *h = mk(core, GHC_DEVICE_CPU, GHC_DTYPE_F32, 2, ghc_tensor_shape((*ps)[k].value));
        ok(core, ghc_op_rand_normal(h, &(struct ghc_rng){ seed, (uint64_t)k * 1000 }, NULL));
        ok(core, ghc_op_scale(h, h, scale, NULL));
        ok(core, ghc_op_copy((*ps)[k].value, h, NULL));
        ok(core, ghc_op_sync(core, dev, NULL));
        ok(core, ghc_op_fill((*ps)[k].grad, 0.0, NULL));
        ghc_tensor_free(h);
    }
    return core;
}

/* The relative error of the n gradients g[0][k] against g[1][k] (host f32) together, and the
 * reference's norm (asserted non-zero); frees both lists. */
static double grads_rel_err(ghc_tensor_t **g[2], int32_t n, double *norm)
{
    double num = 0, den = 0;
    for (int32_t k = 0; k < n; k++) {
        const float *a = ghc_tensor_cdata(g[0][k]), *b = ghc_tensor_cdata(g[1][k]);
        for (int64_t j = 0; j < ghc_tensor_numel(g[0][k]); j++) {
            num += ((double)a[j] - b[j]) * ((double)a[j] - b[j]);
            den += (double)b[j] * b[j];
        }
        ghc_tensor_free(g[0][k]);
        ghc_tensor_free(g[1][k]);
    }
    free(g[0]);
    free(g[1]);
    ck_assert(den > 0);
    *norm = sqrt(den);
    return sqrt(num / den);
}

/* The adapter's parts written before the model's GEMMs (forward with write, backward with
 * accumulate false where the model's dx GEMM writes: the adapter writes y and dx, the GEMM adds
 * to them; the core's way 3, linear.h) against added after them (way 4, after_only: the adapter
 * adds to what the GEMM wrote): the same prediction, input gradient and adapter gradients, for
 * each algorithm (LoRA with rank dropout: the masked path; DoRA: its plan writes neither; LoHa,
 * LoKr: the forward only), with parameters moved off their init. CPU: f32 rounding apart; CUDA
 * (bf16 model): the rounding of y and dx differs between the two orders. */
static const char *const first_cfgs[] = {
    "algo = \"lora\"; rank = 4;",
    "algo = \"lora\"; rank = 4; rank_dropout = 0.5; seed = 3;",
    "algo = \"loha\"; rank = 2;",
    "algo = \"loha\"; rank = 6;",
    "algo = \"lokr\"; rank = 4; factor = 4;",
    "algo = \"lora\"; rank = 4; dora_wd = true;",
};

START_TEST(wan22_first_vs_after)
{
    int32_t np;
    struct ghc_param *ps;
    ghc_core_t *core = wan_net(first_cfgs[_i], false, 91, 0.2f, &ps, &np);
    ok(core, ghc_network_begin_step(ghc_network_get(core), 5));
    ghc_st_t *cs = ghc_st_open(core, fixture("wan22", "case.safetensors"));
    ck_assert_ptr_nonnull(cs);
    ghc_tensor_t *pred[2], **grads[2];
    int fwd[2], fwd_write[2], bwd[2], bwd_write[2];
    for (int pass = 0; pass < 2; pass++) {
        for (int32_t k = 0; k < np; k++)
            ok(core, ghc_op_fill(ps[k].grad, 0.0, NULL));
        n_fwd = n_fwd_write = n_bwd = n_bwd_write = 0;
        after_only = pass == 1;
        wan_step(core, cs, &pred[pass], true);
        after_only = false;
        fwd[pass] = n_fwd, fwd_write[pass] = n_fwd_write, bwd[pass] = n_bwd, bwd_write[pass] = n_bwd_write;
        grads[pass] = calloc((size_t)np, sizeof(ghc_tensor_t *));
        for (int32_t k = 0; k < np; k++)
            grads[pass][k] = on(core, ps[k].grad, GHC_DEVICE_CPU, GHC_DTYPE_F32);
    }
    const bool cpu = dev == GHC_DEVICE_CPU;
    /* 30 targets, each forward twice (block checkpointing, the model's default; ffn.2's
     * recomputation is not needed, its output unused: 3 x 9 again) and backward once, either way. Written first: every forward but under DoRA; LoRA's dx where the model's
     * GEMM writes it (6 linears a block: self-attention q and the ones after it; self-attention
     * k and v add to q's, cross-attention k and v have no dx) */
    const bool dora = strstr(first_cfgs[_i], "dora") != NULL, lora = strstr(first_cfgs[_i], "lora") != NULL;
    printf("first vs after (%s): written first: %d of %d forwards, %d of %d backwards\n", first_cfgs[_i],
           fwd_write[0], fwd[0], bwd_write[0], bwd[0]);
    for (int pass = 0; pass < 2; pass++) {
        ck_assert_int_eq(fwd[pass], 57);
        ck_assert_int_eq(bwd[pass], 30);
    }
    ck_assert_int_eq(fwd_write[0], dora ? 0 : 57);
    ck_assert_int_eq(bwd_write[0], lora && !dora ? 18 : 0);
    ck_assert_int_eq(fwd_write[1] + bwd_write[1], 0);
    double e = rel_err(core, pred[0], pred[1]), norm;
    printf("first vs after (%s): prediction rel err %.3g\n", first_cfgs[_i], e);
    ck_assert_msg(e < (cpu ? 1e-6 : 1e-2), "%s: prediction rel err %g", first_cfgs[_i], e);
    e = grads_rel_err(grads, np, &norm);
    printf("first vs after (%s): the %d gradients together rel err %.3g (norm %.3g)\n", first_cfgs[_i], (int)np, e,
           norm);
    ck_assert_msg(e < (cpu ? 1e-5 : 3e-2), "%s: gradients rel err %g", first_cfgs[_i], e);
    ghc_tensor_free(pred[0]);
    ghc_tensor_free(pred[1]);
    ghc_st_free(cs);
    ghc_core_free(core);
}
END_TEST

/* The kept H: the LoRA backward takes H = X A^T from the target's forward (each target's forward
 * runs again right before its backward under the model's block checkpointing, ffn.2's excepted;
 * here without K-concatenation, which keeps its own): 28 of the 30 LoRA backward calls take it
 * (the count the network keeps, read through the hook): all but ffn.2 of the first two blocks,
 * whose forward's H is no longer kept when their backward comes (the last block's still is),
 * and the prediction and the gradients equal
 * those of a backward that finds none kept (drop_kept_h) and computes H again (CPU: the same f32
 * GEMM, so the same bits; CUDA: H rounded to bf16 from the f32 forward's instead of from the
 * GEMM's accumulator). The rank dropout case takes the f32 path. */
START_TEST(wan22_keep_h)
{
    static const char *const cfgs[] = { "algo = \"lora\"; rank = 4;", "algo = \"lora\"; rank = 4; rank_dropout = 0.5; seed = 3;" };
    ghc_tensor_t *pred[2], **grads[2];
    ghc_core_t *cores[2];
    int32_t nps[2];
    for (int pass = 0; pass < 2; pass++) {   /* H kept, then not */
        const char *cfg = cfgs[_i];
        int32_t np;
        struct ghc_param *ps;
        ghc_core_t *core = cores[pass] = wan_net(cfg, false, 91, 0.2f, &ps, &np);
        ok(core, ghc_network_begin_step(ghc_network_get(core), 5));
        ghc_st_t *cs = ghc_st_open(core, fixture("wan22", "case.safetensors"));
        ck_assert_ptr_nonnull(cs);
        struct ghc_adapter_hook hook;
        ok(core, ghc_network_hook(ghc_network_get(core), 0, &hook));
        const struct lycoris *lnet = hook.user;   /* the plugin's own (tests link its header) */
        const int64_t hits0 = lnet->hk_hits;
        drop_kept_h = pass == 1;
        wan_step(core, cs, &pred[pass], true);
        drop_kept_h = false;
        printf("kept H (%s%s): %lld of the backward calls took H from the forward\n", cfg,
               pass ? ", dropped before each backward" : "", (long long)(lnet->hk_hits - hits0));
        ck_assert_int_eq(lnet->hk_hits - hits0, pass ? 0 : 28);
        grads[pass] = calloc((size_t)np, sizeof(ghc_tensor_t *));
        for (int32_t k = 0; k < np; k++)
            grads[pass][k] = on(core, ps[k].grad, GHC_DEVICE_CPU, GHC_DTYPE_F32);
        nps[pass] = np;
        ghc_st_free(cs);
    }
    ck_assert_int_eq(nps[0], nps[1]);
    const bool cpu = dev == GHC_DEVICE_CPU;
    double e = rel_err(cores[0], pred[0], pred[1]), norm;   /* the forward is the same */
    ck_assert_msg(e == 0.0, "%s: the kept H changed the prediction: rel err %g", cfgs[_i], e);
    e = grads_rel_err(grads, nps[0], &norm);
    printf("kept H (%s): the gradients with and without, rel err %.3g\n", cfgs[_i], e);
    ck_assert_msg(e <= (cpu ? 0.0 : 1e-2), "%s: kept H gradients rel err %g", cfgs[_i], e);
    ghc_tensor_free(pred[0]);
    ghc_tensor_free(pred[1]);
    ghc_core_free(cores[0]);
    ghc_core_free(cores[1]);
}
END_TEST

/* K-concatenation (model.h, concat_forward and concat_backward: H in the inputs' spare columns,
 * B and A in the weights', one GEMM of the model's each way; the core's way 2, linear.h) against
 * the adapter's own passes (ghc_linear_ways without it: written before the model's GEMMs, or
 * with after_only added after them, the last case): the same prediction and gradients. LoRA of
 * rank 4 (alpha 2: s = 1/2); with module dropout (dropped modules take neither path in this
 * step); of rank 20, above the model's adapter_pad (16): every target takes the passes; with
 * rank dropout (its plan has no K-concatenation). Counted: the targets that concatenated (the
 * 10 of a block, forward and recomputation, and backward, where concat_backward also casts dy:
 * cross-attention k and v over the text too, for their parameter gradients), and the
 * recomputations that wrote the H kept from the forward instead of a GEMM. */
static const char *const concat_cfgs[] = {
    "algo = \"lora\"; rank = 4; alpha = 2.0;",
    "algo = \"lora\"; rank = 4; module_dropout = 0.5; seed = 11;",
    "algo = \"lora\"; rank = 20;",
    "algo = \"lora\"; rank = 4; rank_dropout = 0.5; seed = 3;",
    "algo = \"lora\"; rank = 4; alpha = 2.0;",   /* against the passes after the GEMMs */
    /* checkpointing "block_qkv": the recomputation writes q's, k's and v's H again without their
     * products (ghc_linear_restore) */
    "algo = \"lora\"; rank = 4; alpha = 2.0;",
    "algo = \"lora\"; rank = 4; module_dropout = 0.5; seed = 11;",
};

START_TEST(wan22_concat)
{
    int32_t np;
    struct ghc_param *ps;
    wan_model_more = _i >= 5 ? "checkpointing = \"block_qkv\";" : "";
    ghc_core_t *core = wan_net(concat_cfgs[_i], false, 91, 0.2f, &ps, &np);
    wan_model_more = "";
    ok(core, ghc_network_begin_step(ghc_network_get(core), 5));
    ghc_st_t *cs = ghc_st_open(core, fixture("wan22", "case.safetensors"));
    ck_assert_ptr_nonnull(cs);
    ghc_tensor_t *pred[2], **grads[2];
    int cat[2] = { 0, 0 };
    struct ghc_adapter_hook hook;
    ok(core, ghc_network_hook(ghc_network_get(core), 0, &hook));
    const struct lycoris *lnet = hook.user;   /* the plugin's own (tests link its header) */
    int64_t kept = lnet->hc_hits;
    for (int pass = 0; pass < 2; pass++) {   /* K-concatenation, then the passes */
        for (int32_t k = 0; k < np; k++)
            ok(core, ghc_op_fill(ps[k].grad, 0.0, NULL));
        n_cat_fwd = n_cat_bwd = 0;
        with_concat = pass == 0;
        after_only = pass == 1 && _i == 4;
        wan_step(core, cs, &pred[pass], true);
        with_concat = after_only = false;
        if (pass == 0)
            cat[0] = n_cat_fwd, cat[1] = n_cat_bwd, kept = lnet->hc_hits - kept;
        else
            ck_assert_int_eq(n_cat_fwd + n_cat_bwd, 0);
        grads[pass] = calloc((size_t)np, sizeof(ghc_tensor_t *));
        for (int32_t k = 0; k < np; k++)
            grads[pass][k] = on(core, ps[k].grad, GHC_DEVICE_CPU, GHC_DTYPE_F32);
    }
    char what[160];
    snprintf(what, sizeof(what), "%s%s", concat_cfgs[_i], _i == 4 ? " against after" : _i >= 5 ? " block_qkv" : "");
    printf("concat (%s): concat_forward wrote %d times (%lld in the recomputation from the kept H), "
           "concat_backward %d\n", what, cat[0], (long long)kept, cat[1]);
    ck_assert_int_eq(kept, cat[0] / 2);   /* every recomputation takes H as kept */
    if (_i == 0 || _i == 4 || _i == 5) {
        ck_assert_int_eq(cat[0], 60);   /* 10 targets x 3 blocks x (forward, recomputation) */
        ck_assert_int_eq(cat[1], 30);   /* every target's backward, dy cast by the hook */
    } else if (_i == 1 || _i == 6) {
        ck_assert(cat[0] > 0 && cat[0] < 60);
        ck_assert_int_eq(cat[1], cat[0] / 2);
    } else {
        ck_assert_int_eq(cat[0] + cat[1], 0);
    }
    const bool cpu = dev == GHC_DEVICE_CPU;
    double e = rel_err(core, pred[0], pred[1]), norm;
    printf("concat (%s): prediction rel err %.3g\n", what, e);
    ck_assert_msg(e < (cpu ? 1e-6 : 1e-2), "%s: prediction rel err %g", what, e);
    e = grads_rel_err(grads, np, &norm);
    printf("concat (%s): the %d gradients together rel err %.3g (norm %.3g)\n", what, (int)np, e, norm);
    ck_assert_msg(e < (cpu ? 1e-5 : 3e-2), "%s: gradients rel err %g", what, e);
    ghc_tensor_free(pred[0]);
    ghc_tensor_free(pred[1]);
    ghc_st_free(cs);
    ghc_core_free(core);
}
END_TEST

/* Central finite differences of the model loss along each of a few adapter tensors of every
 * algorithm (directional derivative along a random direction), against the gradient. */
static void fd_check(const char *net_cfg)
{
    int32_t np;
    struct ghc_param *ps;
    ghc_core_t *core = wan_net(net_cfg, true, 77, 0.3f, &ps, &np);
    ghc_st_t *cs = ghc_st_open(core, fixture("wan22", "case.safetensors"));
    ck_assert_ptr_nonnull(cs);
    wan_step(core, cs, NULL, true);
    const int32_t pick[] = { 0, np / 3, np / 2 + 1, np - 1 };
    for (size_t q = 0; q < sizeof(pick) / sizeof(pick[0]); q++) {
        struct ghc_param *p = &ps[pick[q]];
        ghc_tensor_t *v0 = on(core, p->value, GHC_DEVICE_CPU, GHC_DTYPE_F32);
        ghc_tensor_t *g = on(core, p->grad, GHC_DEVICE_CPU, GHC_DTYPE_F32);
        ghc_tensor_t *dir = mk(core, GHC_DEVICE_CPU, GHC_DTYPE_F32, 2, ghc_tensor_shape(v0));
        ghc_tensor_t *vv = mk(core, GHC_DEVICE_CPU, GHC_DTYPE_F32, 2, ghc_tensor_shape(v0));
        ok(core, ghc_op_rand_normal(dir, &(struct ghc_rng){ 5, q }, NULL));
        double analytic = 0, dn = 0;
        for (int64_t j = 0; j < ghc_tensor_numel(v0); j++) {
            analytic += ((const float *)ghc_tensor_cdata(g))[j] * ((const float *)ghc_tensor_cdata(dir))[j];
            dn += ((const float *)ghc_tensor_cdata(dir))[j] * ((const float *)ghc_tensor_cdata(dir))[j];
        }
        const float h = 2e-2f / (float)sqrt(dn / (double)ghc_tensor_numel(v0));
        float l[4];   /* +h, -h, +h/2, -h/2 */
        for (int k = 0; k < 4; k++) {
            float step = (k < 2 ? h : h / 2) * (k % 2 ? -1.0f : 1.0f);
            ok(core, ghc_op_add(vv, v0, dir, 1.0f, step, NULL));
            ok(core, ghc_op_copy(p->value, vv, NULL));
            ok(core, ghc_op_sync(core, dev, NULL));
            l[k] = wan_step(core, cs, NULL, false);
        }
        ok(core, ghc_op_copy(p->value, v0, NULL));
        ok(core, ghc_op_sync(core, dev, NULL));
        /* Richardson: the h^2 error of the central differences cancels */
        double d1 = ((double)l[0] - l[1]) / (2.0 * h), d2 = ((double)l[2] - l[3]) / h;
        double numeric = (4.0 * d2 - d1) / 3.0;
        /* the f32 loss is good to ~1e-7 relative: that, over h, bounds the numeric noise */
        double noise = 3e-7 * fabs((double)l[0]) / h, e = fabs(numeric - analytic);
        printf("fd %s (%s): analytic %.6g numeric %.6g (|diff| %.3g, noise %.3g)\n", p->name, net_cfg, analytic,
               numeric, e, noise);
        ck_assert_msg(e < 1e-2 * fabs(numeric) + noise, "%s: analytic %g vs finite differences %g", p->name,
                      analytic, numeric);
        ghc_tensor_free(v0);
        ghc_tensor_free(g);
        ghc_tensor_free(dir);
        ghc_tensor_free(vv);
    }
    ghc_st_free(cs);
    ghc_core_free(core);
}

START_TEST(wan22_finite_differences)
{
    static const char *const cfgs[] = {
        "algo = \"lora\"; rank = 4; alpha = 2.0;",
        "algo = \"loha\"; rank = 2; alpha = 1.0;",
        "algo = \"lokr\"; rank = 2; alpha = 1.0; factor = 4; decompose_both = true;",
        "algo = \"lora\"; rank = 4; alpha = 2.0; dora_wd = true;",
        "algo = \"loha\"; rank = 6; alpha = 3.0;",   /* materialised on the 64 x 64 linears, Khatri-Rao on ffn */
    };
    fd_check(cfgs[_i]);
}
END_TEST

/* ---- ghc_linear_forward_gelu and a bf16 output's bias (linear.h, API 20) ------------------------ */

/* An f32 host tensor of normal values (seeded), times scale. */
static ghc_tensor_t *lg_randn(ghc_core_t *core, int ndim, const int64_t *shape, uint64_t seed, float scale)
{
    ghc_tensor_t *h = mk(core, GHC_DEVICE_CPU, GHC_DTYPE_F32, ndim, shape);
    ok(core, ghc_op_rand_normal(h, &(struct ghc_rng){ seed, 0 }, NULL));
    ok(core, ghc_op_scale(h, h, scale, NULL));
    return h;
}

/* The elements where a and b (any dtype and device, same numel) differ. */
static int64_t lg_ndiff(ghc_core_t *core, const ghc_tensor_t *a, const ghc_tensor_t *b)
{
    ck_assert_int_eq(ghc_tensor_numel(a), ghc_tensor_numel(b));
    ghc_tensor_t *ha = on(core, a, GHC_DEVICE_CPU, GHC_DTYPE_F32), *hb = on(core, b, GHC_DEVICE_CPU, GHC_DTYPE_F32);
    const float *pa = ghc_tensor_cdata(ha), *pb = ghc_tensor_cdata(hb);
    int64_t n = 0;
    for (int64_t i = 0; i < ghc_tensor_numel(a); i++)
        n += pa[i] != pb[i];
    ghc_tensor_free(ha);
    ghc_tensor_free(hb);
    return n;
}

/* rel_err of got against ref on any device and dtype. */
static double lg_rel(ghc_core_t *core, const ghc_tensor_t *got, const ghc_tensor_t *ref)
{
    ghc_tensor_t *h = on(core, ref, GHC_DEVICE_CPU, GHC_DTYPE_F32);
    double e = rel_err(core, got, h);
    ghc_tensor_free(h);
    return e;
}

/* One linear [out 48, in 64] of the one_target shape, as a model keeping 8 spare rows and columns
 * stores it: LG_IN + 8 columns of the input, LG_OUT + 8 rows of the weight (zero outside the
 * linear). B samples of LG_ROWS rows. */
enum { LG_B = 2, LG_ROWS = 40, LG_IN = 64, LG_OUT = 48, LG_PAD = 8 };

struct lg_case {
    const char *what, *cfg;
    int32_t     target;   /* 0: one_target's adapter; -1: none */
    unsigned    ways;     /* ghc_linear_ways when the hook is installed */
    bool        xp;       /* the call gives xp (K-concatenation where the plan has it) */
    bool        bias;
    bool        fused;    /* one product writes all of pre: g from the GEMM's epilogue */
    int         cat, fwd, fwd_write;   /* the targets that K-concatenate (ghc_linears_set_hook); the
                                        * hook's calls per forward that did the work: concat_forward,
                                        * forward, forward writing */
};

static const struct lg_case lg_cases[] = {
    { "no adapter", "algo = \"lora\"; rank = 4;", -1, GHC_LINEAR_FOLD | GHC_LINEAR_WRITE, true, true, true, 0, 0, 0 },
    { "K-concatenated LoRA", "algo = \"lora\"; rank = 4; alpha = 2.0;", 0, GHC_LINEAR_ALL, true, true, true, 1, 0, 0 },
    { "K-concatenated LoRA, no bias", "algo = \"lora\"; rank = 4; alpha = 2.0;", 0, GHC_LINEAR_ALL, true, false, false,
      1, 0, 0 },
    { "folded LoRA", "algo = \"lora\"; rank = 4; alpha = 2.0; fold = true;", 0, GHC_LINEAR_ALL, true, true, true, 0, 0,
      0 },
    { "LoRA written first", "algo = \"lora\"; rank = 4; alpha = 2.0;", 0, GHC_LINEAR_FOLD | GHC_LINEAR_WRITE, true,
      true, false, 0, 1, 1 },
    { "LoRA added after", "algo = \"lora\"; rank = 4; alpha = 2.0;", 0, GHC_LINEAR_FOLD, true, true, false, 0, 1, 0 },
};
#define N_LG_CASES (int)(sizeof(lg_cases) / sizeof(lg_cases[0]))

/* ghc_linear_forward_gelu against ghc_linear_forward then ghc_op_gelu_tanh, for each way the core
 * takes, in f32 and bf16, with the hook's calls counted (the same in both). CPU: pre has the bits
 * of ghc_linear_forward's y; g those of ghc_op_gelu_tanh(pre) in f32 and wherever a pass of its own
 * applies the GELU; where the GEMM's epilogue does (fused) in bf16, g is the GELU of the unrounded
 * sum: the bits of ghc_op_gelu_tanh of the f32 y (its bias given in bf16's values, as the bf16
 * call rounds it) rounded to bf16, and differs from the GELU of the rounded pre somewhere. GPU
 * (cuBLASLt's epilogue GELU and bias, another algorithm than the plain product's): within
 * rounding. */
START_TEST(linear_gelu)
{
    const struct lg_case *c = &lg_cases[_i];
    const bool cpu = dev == GHC_DEVICE_CPU;
    ghc_core_t *core = core_with(c->cfg, NULL);
    ghc_network_t *net = ghc_network_get(core);
    ok(core, ghc_network_attach(net, 0, &one_target, 1));
    struct ghc_param *ps;
    int32_t np;
    ok(core, ghc_network_params(net, 0, &ps, &np));
    for (int32_t k = 0; k < np; k++) {   /* off the zero-delta init */
        ghc_tensor_t *h = lg_randn(core, ghc_tensor_ndim(ps[k].value), ghc_tensor_shape(ps[k].value), 40 + (uint64_t)k,
                                   0.3f);
        ok(core, ghc_op_copy(ps[k].value, h, NULL));
        ok(core, ghc_op_sync(core, dev, NULL));
        ghc_tensor_free(h);
    }
    ok(core, ghc_network_begin_step(net, 1));
    struct ghc_adapter_hook hook;
    ok(core, ghc_network_hook(net, 0, &hook));
    real_hook = hook;
    hook.forward = count_fwd;
    hook.backward = count_bwd;
    hook.concat_forward = count_cat_fwd;
    hook.concat_backward = count_cat_bwd;

    /* host values: x [B, rows, in], the weight's linear part, the bias (and in bf16's values) */
    const int64_t xs[3] = { LG_B, LG_ROWS, LG_IN }, ws[2] = { LG_OUT, LG_IN }, bs[1] = { LG_OUT };
    ghc_tensor_t *xh = lg_randn(core, 3, xs, 1, 1.0f), *wh = lg_randn(core, 2, ws, 2, 0.2f);
    ghc_tensor_t *bh = lg_randn(core, 1, bs, 3, 0.5f), *b16h = mk(core, GHC_DEVICE_CPU, GHC_DTYPE_BF16, 1, bs);
    ok(core, ghc_op_cast(b16h, bh, 1.0f, NULL, NULL));
    ghc_tensor_t *b = on(core, bh, dev, GHC_DTYPE_F32), *b16 = on(core, b16h, dev, GHC_DTYPE_F32);
    for (int d = 0; d < 2; d++) {
        const enum ghc_dtype dt = d ? GHC_DTYPE_BF16 : GHC_DTYPE_F32;
        const char *dn = ghc_dtype_name(dt);
        ghc_linears_t *l = ghc_linears_new(core, dev, dt, 1, (int64_t)1 << 16);
        ck_assert_ptr_nonnull(l);
        ghc_linear_ways(c->ways);
        int rc = ghc_linears_set_hook(l, &hook, (const int64_t[]){ LG_PAD });
        ghc_linear_ways(GHC_LINEAR_ALL);
        ck_assert_int_eq(rc, c->cat);
        /* xp = [x | 8 zero columns], the weight [W | 0 ; 0] in its room */
        ghc_tensor_t *xp = mk(core, dev, dt, 3, (const int64_t[]){ LG_B, LG_ROWS, LG_IN + LG_PAD });
        ghc_tensor_t *w = mk(core, dev, dt, 2, (const int64_t[]){ LG_OUT + LG_PAD, LG_IN + LG_PAD });
        ok(core, ghc_op_fill(xp, 0.0, NULL));
        ok(core, ghc_op_fill(w, 0.0, NULL));
        ghc_tensor_t *x = ghc_tensor_view_cols(xp, 0, LG_IN), *xd = on(core, xh, dev, dt), *wd = on(core, wh, dev, dt);
        ghc_tensor_t *wrows = ghc_tensor_wrap(core, dt, 2, (const int64_t[]){ LG_OUT, LG_IN + LG_PAD }, dev,
                                              ghc_tensor_data(w));
        ghc_tensor_t *wv = ghc_tensor_view_cols(wrows, 0, LG_IN);
        ck_assert(x && wrows && wv);
        ok(core, ghc_op_copy(x, xd, NULL));
        ok(core, ghc_op_copy(wv, wd, NULL));
        struct ghc_linear lin = { .target = c->target, .w = w, .w_scale = 1.0f, .b = c->bias ? b : NULL,
                                  .out = LG_OUT, .in = LG_IN, .spare_col = LG_IN, .spare = LG_PAD };
        const int64_t ys[3] = { LG_B, LG_ROWS, LG_OUT };
        ghc_tensor_t *y = mk(core, dev, dt, 3, ys), *gy = mk(core, dev, dt, 3, ys);
        /* g: a column view, as a model's next linear input with spare columns (gw, 3 elsewhere) */
        ghc_tensor_t *pre = mk(core, dev, dt, 3, ys), *gw = mk(core, dev, dt, 3, (const int64_t[]){ LG_B, LG_ROWS,
                                                                                                 LG_OUT + LG_PAD });
        ghc_tensor_t *g = ghc_tensor_view_cols(gw, 0, LG_OUT);
        ck_assert_ptr_nonnull(g);
        ok(core, ghc_op_fill(gw, 3.0, NULL));
        int counts[2][3];
        for (int pass = 0; pass < 2; pass++) {   /* the linear and a GELU pass, then in one call */
            n_fwd = n_fwd_write = n_cat_fwd = 0;
            if (pass == 0) {
                ok(core, ghc_linear_forward(l, &lin, y, x, c->xp ? xp : NULL, NULL));
                ok(core, ghc_op_gelu_tanh(gy, y, NULL));
            } else {
                ok(core, ghc_linear_forward_gelu(l, &lin, g, pre, x, c->xp ? xp : NULL, NULL));
            }
            counts[pass][0] = n_cat_fwd, counts[pass][1] = n_fwd, counts[pass][2] = n_fwd_write;
        }
        printf("linear_gelu (%s, %s): hook calls concat %d, forward %d (%d writing)\n", c->what, dn, counts[1][0],
               counts[1][1], counts[1][2]);
        for (int pass = 0; pass < 2; pass++) {
            ck_assert_int_eq(counts[pass][0], c->cat);
            ck_assert_int_eq(counts[pass][1], c->fwd);
            ck_assert_int_eq(counts[pass][2], c->fwd_write);
        }
        ghc_tensor_t *gwh = on(core, gw, GHC_DEVICE_CPU, GHC_DTYPE_F32);
        for (int64_t i = 0; i < ghc_tensor_numel(gwh); i++)
            if (i % (LG_OUT + LG_PAD) >= LG_OUT)
                ck_assert_msg(((const float *)ghc_tensor_cdata(gwh))[i] == 3.0f, "%s, %s: g's spare column written",
                              c->what, dn);
        ghc_tensor_free(gwh);
        const double tol = d ? 1e-2 : 1e-5;
        double e_pre = lg_rel(core, pre, y), e_g = lg_rel(core, g, gy);
        printf("linear_gelu (%s, %s): pre rel err %.3g, g rel err %.3g\n", c->what, dn, e_pre, e_g);
        ck_assert_msg(e_pre <= (cpu ? 0.0 : tol), "%s, %s: pre rel err %g", c->what, dn, e_pre);
        if (cpu)
            ck_assert_int_eq(lg_ndiff(core, pre, y), 0);
        if (cpu && (!c->fused || !d)) {
            ck_assert_int_eq(lg_ndiff(core, g, gy), 0);
        } else if (cpu) {   /* bf16, fused: the GELU of the unrounded sum */
            lin.b = b16;
            ghc_tensor_t *y32 = mk(core, dev, GHC_DTYPE_F32, 3, ys), *gr = mk(core, dev, dt, 3, ys);
            ok(core, ghc_linear_forward(l, &lin, y32, x, c->xp ? xp : NULL, NULL));
            ok(core, ghc_op_gelu_tanh(gr, y32, NULL));
            const int64_t moved = lg_ndiff(core, g, gy);
            printf("linear_gelu (%s, %s): the epilogue's GELU differs from the GELU of the rounded pre in %lld of "
                   "%lld\n", c->what, dn, (long long)moved, (long long)ghc_tensor_numel(g));
            ck_assert_int_eq(lg_ndiff(core, g, gr), 0);
            ck_assert_int_gt(moved, 0);
            ghc_tensor_free(y32);
            ghc_tensor_free(gr);
        } else {
            ck_assert_msg(e_g < tol, "%s, %s: g rel err %g", c->what, dn, e_g);
        }
        ghc_tensor_t *all[] = { xp, w, x, xd, wd, wrows, wv, y, gy, pre, g, gw };
        for (size_t k = 0; k < sizeof(all) / sizeof(all[0]); k++)
            ghc_tensor_free(all[k]);
        ghc_linears_free(l);
    }
    ghc_tensor_t *all[] = { xh, wh, bh, b16h, b, b16 };
    for (size_t k = 0; k < sizeof(all) / sizeof(all[0]); k++)
        ghc_tensor_free(all[k]);
    ghc_core_free(core);
}
END_TEST

/* A bf16 y with an f32 bias (linear.h, since API 20): the product with the bias rounded to bf16
 * (the CPU reference GEMM adds the bias it is given, widened to f32, to the f32 sum and rounds
 * once; it differs from the product with the f32 bias somewhere), whichever bias came before it
 * (a new bias at the same address, a longer one: the bf16 copy is made each call); an f32 y
 * takes the f32 bias, bits unchanged. GPU: cuBLASLt's fused bias of C's dtype. */
START_TEST(linear_bf16_bias)
{
    const bool cpu = dev == GHC_DEVICE_CPU;
    ghc_core_t *core = core_with("", NULL);
    ghc_linears_t *l = ghc_linears_new(core, dev, GHC_DTYPE_BF16, 0, 0);
    ck_assert_ptr_nonnull(l);
    const int64_t xs[3] = { LG_B, LG_ROWS, LG_IN }, ws[2] = { LG_OUT, LG_IN }, bs[1] = { LG_OUT };
    const int64_t ys[3] = { LG_B, LG_ROWS, LG_OUT };
    ghc_tensor_t *xh = lg_randn(core, 3, xs, 11, 1.0f), *wh = lg_randn(core, 2, ws, 12, 0.2f);
    ghc_tensor_t *x = on(core, xh, dev, GHC_DTYPE_BF16), *w = on(core, wh, dev, GHC_DTYPE_BF16);
    ghc_tensor_t *b = mk(core, dev, GHC_DTYPE_F32, 1, bs), *b16 = mk(core, dev, GHC_DTYPE_BF16, 1, bs);
    ghc_tensor_t *y = mk(core, dev, GHC_DTYPE_BF16, 3, ys), *ref = mk(core, dev, GHC_DTYPE_BF16, 3, ys);
    ghc_tensor_t *unr = mk(core, dev, GHC_DTYPE_BF16, 3, ys);
    ghc_tensor_t *x2 = ghc_tensor_wrap(core, GHC_DTYPE_BF16, 2, (const int64_t[]){ LG_B * LG_ROWS, LG_IN }, dev,
                                       ghc_tensor_data(x));
    ghc_tensor_t *bshort = ghc_tensor_wrap(core, GHC_DTYPE_F32, 1, (const int64_t[]){ 16 }, dev, ghc_tensor_data(b));
    ghc_tensor_t *ys16 = mk(core, dev, GHC_DTYPE_BF16, 3, (const int64_t[]){ LG_B, LG_ROWS, 16 });
    ck_assert(x2 && bshort);
    struct ghc_linear lin = { .target = -1, .w = w, .w_scale = 1.0f, .b = b, .out = LG_OUT, .in = LG_IN };
    struct ghc_linear lshort = { .target = -1, .w = w, .w_scale = 1.0f, .b = bshort, .out = 16, .in = LG_IN };
    for (int round = 0; round < 2; round++) {   /* a second bias at the same address */
        ghc_tensor_t *bh = lg_randn(core, 1, bs, 13 + (uint64_t)round, 0.7f);
        ok(core, ghc_op_copy(b, bh, NULL));
        ok(core, ghc_op_cast(b16, b, 1.0f, NULL, NULL));
        if (round == 0)   /* a shorter bias first: the copy grows for the longer one */
            ok(core, ghc_linear_forward(l, &lshort, ys16, x, NULL, NULL));
        ok(core, ghc_linear_forward(l, &lin, y, x, NULL, NULL));
        ok(core, ghc_op_gemm(ref, x, w, &(struct ghc_gemm){ .trans_b = true, .epilogue = GHC_EPI_BIAS, .bias = b16 },
                             NULL));
        ok(core, ghc_op_gemm(unr, x, w, &(struct ghc_gemm){ .trans_b = true, .epilogue = GHC_EPI_BIAS, .bias = b },
                             NULL));
        const int64_t nd = lg_ndiff(core, y, ref), nu = lg_ndiff(core, y, unr);
        const double e = lg_rel(core, y, ref);
        printf("linear_bf16_bias (bias %d): against the bf16 bias %lld differ (rel err %.3g), against the f32 bias "
               "%lld of %lld\n", round, (long long)nd, e, (long long)nu, (long long)ghc_tensor_numel(y));
        if (cpu) {
            ck_assert_int_eq(nd, 0);
            ck_assert_int_gt(nu, 0);
        } else {
            ck_assert_msg(e < 1e-2, "bf16 y against the product with the bf16 bias: rel err %g", e);
        }
        ghc_tensor_free(bh);
    }
    /* f32 y: the f32 bias as given */
    ghc_tensor_t *y32 = mk(core, dev, GHC_DTYPE_F32, 3, ys), *r32 = mk(core, dev, GHC_DTYPE_F32, 3, ys);
    ok(core, ghc_linear_forward(l, &lin, y32, x, NULL, NULL));
    ok(core, ghc_op_gemm(r32, x, w, &(struct ghc_gemm){ .trans_b = true, .epilogue = GHC_EPI_BIAS, .bias = b }, NULL));
    const double e32 = lg_rel(core, y32, r32);
    printf("linear_bf16_bias: f32 y against the product with the f32 bias: rel err %.3g\n", e32);
    if (cpu)
        ck_assert_int_eq(lg_ndiff(core, y32, r32), 0);
    else
        ck_assert_msg(e32 < 1e-5, "f32 y: rel err %g", e32);
    ghc_tensor_t *all[] = { xh, wh, x, w, b, b16, y, ref, unr, x2, bshort, ys16, y32, r32 };
    for (size_t k = 0; k < sizeof(all) / sizeof(all[0]); k++)
        ghc_tensor_free(all[k]);
    ghc_linears_free(l);
    ghc_core_free(core);
}
END_TEST

#endif /* GHC_TEST_LYCORIS_CASES_H */
