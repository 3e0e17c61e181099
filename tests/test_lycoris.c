/* test_lycoris.c: the lycoris network plugin on the CPU (tests/test_lycoris_cuda.c includes
 * this file and runs the golden cases and the wan22 check on the GPU):
 *   - factorization against values worked out by hand from LyCORIS's factorization();
 *   - golden cases from the Python LyCORIS library (tests/fixtures/make_lycoris_fixtures.py):
 *     output, input gradient, adapter gradients and delta-W of LoRA (plain, rs_lora), LoHa and
 *     LoKr (factor -1, 4, 16; full, low-rank W2, both decomposed, full_matrix), read from the
 *     files LyCORIS saved (so loading LyCORIS files is tested too); the hook's plan per
 *     algorithm, its members' returns, and the parts written (forward write, backward
 *     accumulate false) as well as added, or refused where the plan does not offer it;
 *   - saving in the three namings (key names checked against the patterns ComfyUI's Wan
 *     loader takes, alpha a 0-dim F32, diffusers with the scale folded in) and loading back, also
 *     into a network of another alpha;
 *   - which tools load the files: C transcriptions of the Wan loaders of ComfyUI, musubi-tuner
 *     and diffusers played on the default file (LoRA: all three; LoHa, LoKr: ComfyUI and
 *     musubi-tuner), on other namings, subsets, extra_formats and DoRA, against what the
 *     network says at attach; DoRA files store dora_scale for ComfyUI and read back;
 *   - presets: "full" adds targets outside the blocks, and on Wan2.2 equals "attn_ffn";
 *   - malformed adapter files: clear errors naming the tensor, nothing changed;
 *   - target selection (presets, include/exclude, overrides), dropout, config errors;
 *   - end to end on the tiny wan22 model: the wan22 fixture's LoRA (diffusers + peft goldens)
 *     loaded through the network gives the fixture's prediction and gradients, and on a random
 *     model the adapter gradients match central finite differences of the loss; the ways the
 *     core may take (linear.h, forced with ghc_linear_ways: fold, K-concatenation, written
 *     first, added after) against each other, and the H kept from the forward. */
#include <config.h>

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

/* ---- factorization ------------------------------------------------------------------------- */

#ifndef LYC_TEST_GPU

START_TEST(factorization)
{
    /* LyCORIS's factorization() worked out by hand (rows 5120, 13824, 1536, 360 and 64) */
    static const struct { int64_t d, f, m, n; } v[] = {
        { 5120, -1, 64, 80 }, { 5120, 4, 4, 1280 }, { 5120, 12, 10, 512 }, { 5120, 16, 16, 320 },
        { 5120, 100, 64, 80 }, { 5120, 128, 40, 128 }, { 13824, -1, 108, 128 }, { 13824, 8, 8, 1728 },
        { 13824, 100, 96, 144 }, { 1536, 64, 24, 64 }, { 1536, 128, 12, 128 }, { 360, -1, 18, 20 },
        { 360, 16, 15, 24 }, { 64, 64, 1, 64 }, { 64, 16, 4, 16 }, { 64, 100, 8, 8 }, { 30720, 100, 96, 320 },
        { 8960, 12, 10, 896 }, { 256, 32, 8, 32 },
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        int64_t m, n;
        lyc_factorization(v[i].d, v[i].f, &m, &n);
        ck_assert_msg(m == v[i].m && n == v[i].n, "factorization(%lld, %lld) = (%lld, %lld), expected (%lld, %lld)",
                      (long long)v[i].d, (long long)v[i].f, (long long)m, (long long)n, (long long)v[i].m,
                      (long long)v[i].n);
    }
}
END_TEST
#endif

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
static char *wan22_cfg(char *buf, size_t len, bool f32)
{
    snprintf(buf, len, "checkpoint = \"%s\"; heads = 2; dtype = \"%s\"; device = %d;",
             fixture("wan22", "weights_official.safetensors"), dev == GHC_DEVICE_CPU || f32 ? "f32" : "bf16", dev);
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
    /* 30 targets, each forward twice (block checkpointing, the model's default) and backward
     * once, either way. Written first: every forward but under DoRA; LoRA's dx where the model's
     * GEMM writes it (6 linears a block: self-attention q and the ones after it; self-attention
     * k and v add to q's, cross-attention k and v have no dx) */
    const bool dora = strstr(first_cfgs[_i], "dora") != NULL, lora = strstr(first_cfgs[_i], "lora") != NULL;
    printf("first vs after (%s): written first: %d of %d forwards, %d of %d backwards\n", first_cfgs[_i],
           fwd_write[0], fwd[0], bwd_write[0], bwd[0]);
    for (int pass = 0; pass < 2; pass++) {
        ck_assert_int_eq(fwd[pass], 60);
        ck_assert_int_eq(bwd[pass], 30);
    }
    ck_assert_int_eq(fwd_write[0], dora ? 0 : 60);
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
 * runs again right before its backward under the model's block checkpointing; here without
 * K-concatenation, which keeps its own): every one of the 30 LoRA backward calls takes it (the
 * count the network keeps, read through the hook), and the prediction and the gradients equal
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
        ck_assert_int_eq(lnet->hk_hits - hits0, pass ? 0 : 30);
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
};

START_TEST(wan22_concat)
{
    int32_t np;
    struct ghc_param *ps;
    ghc_core_t *core = wan_net(concat_cfgs[_i], false, 91, 0.2f, &ps, &np);
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
    snprintf(what, sizeof(what), "%s%s", concat_cfgs[_i], _i == 4 ? " against after" : "");
    printf("concat (%s): concat_forward wrote %d times (%lld in the recomputation from the kept H), "
           "concat_backward %d\n", what, cat[0], (long long)kept, cat[1]);
    ck_assert_int_eq(kept, cat[0] / 2);   /* every recomputation takes H as kept */
    if (_i == 0 || _i == 4) {
        ck_assert_int_eq(cat[0], 60);   /* 10 targets x 3 blocks x (forward, recomputation) */
        ck_assert_int_eq(cat[1], 30);   /* every target's backward, dy cast by the hook */
    } else if (_i == 1) {
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

#ifndef LYC_TEST_GPU

/* ---- files ------------------------------------------------------------------------------------ */

/* Does `key` have one of the forms ComfyUI loads for Wan (doc/lycoris.md, "Which tool loads
 * which file"): module name `diffusion_model.<path>` or `lora_unet_<path with _>`, then a
 * LoRA/LoHa/LoKr tensor or alpha? */
static bool comfy_key(const char *key)
{
    static const char *const sfx[] = { ".lora_up.weight", ".lora_down.weight", ".alpha", ".hada_w1_a", ".hada_w1_b",
                                       ".hada_w2_a", ".hada_w2_b", ".lokr_w1", ".lokr_w1_a", ".lokr_w1_b", ".lokr_w2",
                                       ".lokr_w2_a", ".lokr_w2_b" };
    const char *mod;
    if (strncmp(key, "diffusion_model.blocks.", 23) == 0)
        mod = key + 23;
    else if (strncmp(key, "lora_unet_blocks_", 17) == 0)
        mod = key + 17;
    else
        return false;
    char *end;
    strtol(mod, &end, 10);
    if (end == mod)
        return false;
    bool dotted = key[0] == 'd';
    static const char *const lin[] = { "self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o", "cross_attn.q",
                                       "cross_attn.k", "cross_attn.v", "cross_attn.o", "ffn.0", "ffn.2" };
    for (size_t i = 0; i < 10; i++) {
        char want[32];
        snprintf(want, sizeof(want), "%c%s", dotted ? '.' : '_', lin[i]);
        if (!dotted)
            for (char *c = want; *c; c++)
                if (*c == '.')
                    *c = '_';
        if (strncmp(end, want, strlen(want)) == 0)
            for (size_t k = 0; k < sizeof(sfx) / sizeof(sfx[0]); k++)
                if (strcmp(end + strlen(want), sfx[k]) == 0)
                    return true;
    }
    return false;
}

/* 30 wan22-like targets (3 blocks of 10; dim 64, ffn 96). */
static struct ghc_model_target *fake_targets(int32_t *n)
{
    static const char *const lin[] = { "self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o", "cross_attn.q",
                                       "cross_attn.k", "cross_attn.v", "cross_attn.o", "ffn.0", "ffn.2" };
    static const char *const dif[] = { "attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", "attn2.to_q",
                                       "attn2.to_k", "attn2.to_v", "attn2.to_out.0", "ffn.net.0.proj", "ffn.net.2" };
    static char names[30][2][48];
    static struct ghc_model_target t[30];
    for (int i = 0; i < 30; i++) {
        snprintf(names[i][0], 48, "blocks.%d.%s", i / 10, lin[i % 10]);
        snprintf(names[i][1], 48, "blocks.%d.%s", i / 10, dif[i % 10]);
        t[i] = (struct ghc_model_target){ .name = names[i][0], .alias = names[i][1], .block = i / 10,
                                          .in_features = i % 10 == 9 ? 96 : 64, .out_features = i % 10 == 8 ? 96 : 64 };
    }
    *n = 30;
    return t;
}

/* Random values for every param (so saved files are not all zeros). */
static void randomise(ghc_core_t *core, ghc_network_t *net, uint64_t seed)
{
    struct ghc_param *ps;
    int32_t np;
    ok(core, ghc_network_params(net, 0, &ps, &np));
    for (int32_t k = 0; k < np; k++)
        ok(core, ghc_op_rand_normal(ps[k].value, &(struct ghc_rng){ seed, (uint64_t)k << 20 }, NULL));
}

/* The output of every target of `net` for the same input, concatenated (CPU f32, caller frees).
 * With `ref` set, the inputs and outputs go into it as x.<target> and y.<target>. */
static float *outputs_ref(ghc_core_t *core, ghc_network_t *net, const struct ghc_model_target *t, int32_t n,
                          size_t *len, ghc_st_writer_t *ref)
{
    struct ghc_adapter_hook hook;
    ok(core, ghc_network_hook(net, 0, &hook));
    float *all = NULL;
    *len = 0;
    for (int32_t i = 0; i < n; i++) {
        ghc_tensor_t *x = mk(core, -1, GHC_DTYPE_F32, 3, (const int64_t[]){ 1, 3, t[i].in_features });
        ghc_tensor_t *y = mk(core, -1, GHC_DTYPE_F32, 3, (const int64_t[]){ 1, 3, t[i].out_features });
        ok(core, ghc_op_rand_normal(x, &(struct ghc_rng){ 9, (uint64_t)i }, NULL));
        ok(core, ghc_op_fill(y, 0.0, NULL));
        did(core, hook.forward(hook.user, i, x, y, false, NULL), 1);
        if (ref) {
            char nm[128];
            snprintf(nm, sizeof(nm), "x.%s", t[i].name);
            ok(core, ghc_st_writer_add(ref, nm, x));
            snprintf(nm, sizeof(nm), "y.%s", t[i].name);
            ok(core, ghc_st_writer_add(ref, nm, y));
        }
        all = realloc(all, (*len + (size_t)ghc_tensor_numel(y)) * sizeof(float));
        memcpy(all + *len, ghc_tensor_cdata(y), ghc_tensor_nbytes(y));
        *len += (size_t)ghc_tensor_numel(y);
        ghc_tensor_free(x);
        ghc_tensor_free(y);
    }
    return all;
}

static float *outputs(ghc_core_t *core, ghc_network_t *net, const struct ghc_model_target *t, int32_t n, size_t *len)
{
    return outputs_ref(core, net, t, n, len, NULL);
}

static double max_rel(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* ---- which tools load a file: their loaders' rules, as their code states them -------------------
 * Each checker takes the file's keys and the model's linear weights (official names) and plays
 * the tool's own loader on the names: which modules it applies and whether a key is left over
 * (the tools warn and drop it: for a dora_scale that is a DoRA applied as a plain LoRA). */

struct keyset {
    int          n;
    char       **k;
    bool        *used;
};

static struct keyset ks_open(ghc_core_t *core, const char *path)
{
    ghc_st_t *st = ghc_st_open(core, path);
    ck_assert_msg(st != NULL, "%s", ghc_error_message(core));
    struct keyset ks = { .n = ghc_st_count(st) };
    ks.k = calloc((size_t)ks.n, sizeof(char *));
    ks.used = calloc((size_t)ks.n, sizeof(bool));
    for (int i = 0; i < ks.n; i++) {
        struct ghc_st_info info;
        ghc_st_info_at(st, i, &info);
        ks.k[i] = strdup(info.name);
    }
    ghc_st_free(st);
    return ks;
}

static void ks_free(struct keyset *ks)
{
    for (int i = 0; i < ks->n; i++)
        free(ks->k[i]);
    free(ks->k);
    free(ks->used);
}

static bool ks_has(const struct keyset *ks, const char *name)
{
    for (int i = 0; i < ks->n; i++)
        if (strcmp(ks->k[i], name) == 0)
            return true;
    return false;
}

/* Mark `prefix` + `sfx` used; false when absent. */
static bool ks_take(struct keyset *ks, const char *prefix, const char *sfx)
{
    char name[256];
    snprintf(name, sizeof(name), "%s.%s", prefix, sfx);
    for (int i = 0; i < ks->n; i++)
        if (strcmp(ks->k[i], name) == 0)
            return ks->used[i] = true;
    return false;
}

static int ks_left(const struct keyset *ks, const char **first)
{
    int n = 0;
    for (int i = 0; i < ks->n; i++)
        if (!ks->used[i] && !n++)
            *first = ks->k[i];
    return n;
}

static bool ks_any_prefix(const struct keyset *ks, const char *prefix)
{
    for (int i = 0; i < ks->n; i++)
        if (strncmp(ks->k[i], prefix, strlen(prefix)) == 0)
            return true;
    return false;
}

/* "blocks.0.self_attn.q" -> "lora_unet_blocks_0_self_attn_q" (both tools build it this way). */
static void underscored(const char *name, char *buf, size_t len)
{
    snprintf(buf, len, "lora_unet_%s", name);
    for (char *c = buf + 10; *c; c++)
        if (*c == '.')
            *c = '_';
}

/* musubi-tuner (kohya-ss/musubi-tuner 30c658c, utils/lora_utils.py
 * load_safetensors_with_lora_and_fp8; networks/loha.py and networks/lokr.py
 * merge_weights_to_tensor): the network type is the first key holding "lora_down", "hada_w1_a" or
 * "lokr_w1"; for every model weight "<path>.weight" the module "lora_unet_<path with _>" is
 * merged: LoRA needs lora_down and lora_up (alpha optional), LoHa hada_w1_a, _w1_b, _w2_a, _w2_b,
 * LoKr lokr_w1 with lokr_w2_a and _w2_b or lokr_w2; consumed keys are removed and any key left
 * is reported "not all LoRA keys are used". Returns the modules merged; *left the keys left. */
static int musubi_rule(struct keyset *ks, const struct ghc_model_target *t, int32_t n, int *left, const char **first)
{
    int type = 0;   /* lora */
    for (int i = 0; i < ks->n; i++) {
        if (strstr(ks->k[i], "lora_down")) { type = 0; break; }
        if (strstr(ks->k[i], "hada_w1_a")) { type = 1; break; }
        if (strstr(ks->k[i], "lokr_w1")) { type = 2; break; }
    }
    int merged = 0;
    for (int32_t m = 0; m < n; m++) {
        char ln[160];
        underscored(t[m].name, ln, sizeof(ln));
        char k[200];
        if (type == 1) {
            snprintf(k, sizeof(k), "%s.hada_w1_a", ln);
            if (!ks_has(ks, k))
                continue;
            bool all = ks_take(ks, ln, "hada_w1_a") & ks_take(ks, ln, "hada_w1_b") & ks_take(ks, ln, "hada_w2_a") &
                       ks_take(ks, ln, "hada_w2_b");
            ck_assert_msg(all, "musubi-tuner: %s: a LoHa factor is missing (KeyError)", ln);
            ks_take(ks, ln, "alpha");
            merged++;
        } else if (type == 2) {
            char w1[200], w2a[200], w2[200];
            snprintf(w1, sizeof(w1), "%s.lokr_w1", ln);
            snprintf(w2a, sizeof(w2a), "%s.lokr_w2_a", ln);
            snprintf(w2, sizeof(w2), "%s.lokr_w2", ln);
            if (!ks_has(ks, w1) || (!ks_has(ks, w2a) && !ks_has(ks, w2)))
                continue;
            ks_take(ks, ln, "lokr_w1");
            if (ks_has(ks, w2a))
                ck_assert_msg(ks_take(ks, ln, "lokr_w2_a") && ks_take(ks, ln, "lokr_w2_b"), "musubi-tuner: %s: KeyError",
                              ln);
            else
                ks_take(ks, ln, "lokr_w2");
            ks_take(ks, ln, "alpha");
            merged++;
        } else {
            char d[200], u[200];
            snprintf(d, sizeof(d), "%s.lora_down.weight", ln);
            snprintf(u, sizeof(u), "%s.lora_up.weight", ln);
            if (!ks_has(ks, d) || !ks_has(ks, u))
                continue;
            ks_take(ks, ln, "lora_down.weight");
            ks_take(ks, ln, "lora_up.weight");
            ks_take(ks, ln, "alpha");
            merged++;
        }
    }
    *left = ks_left(ks, first);
    return merged;
}

/* ComfyUI (Comfy-Org/ComfyUI a125cd8, comfy/lora.py model_lora_keys_unet and load_lora;
 * comfy/weight_adapter/lora.py, loha.py, lokr.py LoRAAdapter.load, ...): every model weight
 * "diffusion_model.<path>.weight" is reachable as "lora_unet_<path with _>" and as
 * "diffusion_model.<path>" (no diffusers names for Wan: unet_to_diffusers gives none without
 * num_res_blocks); for each, <x>.alpha and <x>.dora_scale are read, then LoRA (<x>.lora_up.weight
 * with <x>.lora_down.weight, or lora_B/lora_A), LoHa (<x>.hada_w1_a and the other three), LoKr
 * (any lokr_w*); keys never read are logged "lora key not loaded". Returns the patches made. */
static int comfy_rule(struct keyset *ks, const struct ghc_model_target *t, int32_t n, int *left, const char **first)
{
    int patches = 0;
    for (int32_t m = 0; m < n; m++) {
        char x[2][160];
        underscored(t[m].name, x[0], sizeof(x[0]));
        snprintf(x[1], sizeof(x[1]), "diffusion_model.%s", t[m].name);
        for (int v = 0; v < 2; v++) {
            ks_take(ks, x[v], "alpha");
            ks_take(ks, x[v], "dora_scale");
            char k[400];
            bool lora = false, loha = false, lokr = false;
            snprintf(k, sizeof(k), "%s.lora_up.weight", x[v]);
            if (ks_has(ks, k))
                lora = ks_take(ks, x[v], "lora_up.weight") && ks_take(ks, x[v], "lora_down.weight");
            snprintf(k, sizeof(k), "%s.lora_B.weight", x[v]);
            if (!lora && ks_has(ks, k))
                lora = ks_take(ks, x[v], "lora_B.weight") && ks_take(ks, x[v], "lora_A.weight");
            snprintf(k, sizeof(k), "%s.hada_w1_a", x[v]);
            if (ks_has(ks, k))
                loha = ks_take(ks, x[v], "hada_w1_a") & ks_take(ks, x[v], "hada_w1_b") &
                       ks_take(ks, x[v], "hada_w2_a") & ks_take(ks, x[v], "hada_w2_b");
            bool w1 = ks_take(ks, x[v], "lokr_w1"), w1a = ks_take(ks, x[v], "lokr_w1_a");
            bool w1b = ks_take(ks, x[v], "lokr_w1_b"), w2 = ks_take(ks, x[v], "lokr_w2");
            bool w2a = ks_take(ks, x[v], "lokr_w2_a"), w2b = ks_take(ks, x[v], "lokr_w2_b");
            lokr = (w1 || (w1a && w1b)) && (w2 || (w2a && w2b));
            patches += lora || loha || lokr;
        }
    }
    *left = ks_left(ks, first);
    return patches;
}

/* diffusers (huggingface/diffusers 58eb52c, loaders/lora_pipeline.py WanLoraLoaderMixin
 * .lora_state_dict and load_lora_weights; loaders/lora_conversion_utils.py): a file with a
 * "diffusion_model." key goes through _convert_non_diffusers_wan_lora_to_diffusers (per block
 * from the lowest to the highest number, the 10 linears' lora_down / lora_up (or lora_A / lora_B)
 * and alpha where present; anything left but ".diff" keys raises ValueError), one with a
 * "lora_unet_" key through _convert_musubi_wan_lora_to_diffusers (blocks 0 to N-1, N the number
 * of distinct block numbers, each with all 10 linears' lora_down, lora_up and alpha, else
 * KeyError; anything left raises ValueError), any other file is taken as peft names
 * ("transformer.<diffusers path>.lora_A.weight"); then every key must hold "lora". Returns the
 * LoRA modules it loads, or -1 with the reason in why. */
static int diffusers_rule(struct keyset *ks, const struct ghc_model_target *t, int32_t n, char *why, size_t len)
{
    static const char *const lin[] = { "self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o", "cross_attn.q",
                                       "cross_attn.k", "cross_attn.v", "cross_attn.o", "ffn.0", "ffn.2" };
    const char *first = NULL;
    int mods = 0;
    if (ks_any_prefix(ks, "diffusion_model.")) {
        long lo = 1L << 30, hi = -1;
        for (int i = 0; i < ks->n; i++)
            if (strncmp(ks->k[i], "diffusion_model.blocks.", 23) == 0) {
                long b = strtol(ks->k[i] + 23, NULL, 10);
                lo = b < lo ? b : lo;
                hi = b > hi ? b : hi;
            }
        bool ab = false;
        for (int i = 0; i < ks->n; i++)
            ab |= strstr(ks->k[i], "lora_A") != NULL;
        for (long b = lo; b <= hi; b++)
            for (int j = 0; j < 10; j++) {
                char x[160];
                snprintf(x, sizeof(x), "diffusion_model.blocks.%ld.%s", b, lin[j]);
                bool a = ks_take(ks, x, ab ? "lora_A.weight" : "lora_down.weight");
                bool u = ks_take(ks, x, ab ? "lora_B.weight" : "lora_up.weight");
                bool al = ks_take(ks, x, "alpha");
                if (al && (!a || !u)) {
                    snprintf(why, len, "KeyError: %s without its factors", x);
                    return -1;
                }
                mods += a && u;
            }
        if (ks_left(ks, &first)) {
            snprintf(why, len, "ValueError: state_dict should be empty at this point but has %s", first);
            return -1;
        }
    } else if (ks_any_prefix(ks, "lora_unet_")) {
        char seen[1024] = { 0 };
        int nb = 0;
        for (int i = 0; i < ks->n; i++) {
            const char *p = strstr(ks->k[i], "blocks_");
            if (!p) {
                snprintf(why, len, "IndexError: %s has no blocks_", ks->k[i]);
                return -1;
            }
            long b = strtol(p + 7, NULL, 10);
            if (b >= 0 && b < 1024 && !seen[b]++)
                nb++;
        }
        for (int b = 0; b < nb; b++)
            for (int j = 0; j < 10; j++) {
                char name[64], x[160];
                snprintf(name, sizeof(name), "blocks.%d.%s", b, lin[j]);
                underscored(name, x, sizeof(x));
                if (!ks_take(ks, x, "lora_down.weight") || !ks_take(ks, x, "lora_up.weight") ||
                    !ks_take(ks, x, "alpha")) {
                    snprintf(why, len, "KeyError: %s.lora_down.weight, lora_up.weight or alpha", x);
                    return -1;
                }
                mods++;
            }
        if (ks_left(ks, &first)) {
            snprintf(why, len, "ValueError: state_dict should be empty at this point but has %s", first);
            return -1;
        }
    } else {   /* the converters' output has lora_A / lora_B names only; a peft file is checked as it is */
        for (int i = 0; i < ks->n; i++)
            if (!strstr(ks->k[i], "lora")) {
                snprintf(why, len, "ValueError: Invalid LoRA checkpoint (%s)", ks->k[i]);
                return -1;
            }
        for (int32_t m = 0; m < n; m++) {
            char x[160];
            snprintf(x, sizeof(x), "transformer.%s", t[m].alias);
            mods += ks_take(ks, x, "lora_A.weight") && ks_take(ks, x, "lora_B.weight");
        }
        if (ks_left(ks, &first)) {
            snprintf(why, len, "%s matches no module of WanTransformer3DModel", first);
            return -1;
        }
    }
    return mods;
}

/* Which tools apply the file at path as trained (enum lyc_tool bits), by the three rules above:
 * every module of the network (n_mods) merged and no key left. */
static unsigned tools_loading(ghc_core_t *core, const char *path, const struct ghc_model_target *t, int32_t n,
                              int n_mods, const char *what)
{
    unsigned tools = 0;
    int left;
    const char *first = "";
    char why[512] = "";
    struct keyset ks = ks_open(core, path);
    int c = comfy_rule(&ks, t, n, &left, &first);
    printf("%s: ComfyUI applies %d of %d modules, %d keys not loaded%s%s\n", what, c, n_mods, left, left ? ", e.g. " : "",
           left ? first : "");
    tools |= c == n_mods && !left ? LYC_TOOL_COMFYUI : 0;
    ks_free(&ks);
    ks = ks_open(core, path);
    c = musubi_rule(&ks, t, n, &left, &first);
    printf("%s: musubi-tuner merges %d of %d modules, %d keys unused%s%s\n", what, c, n_mods, left, left ? ", e.g. " : "",
           left ? first : "");
    tools |= c == n_mods && !left ? LYC_TOOL_MUSUBI : 0;
    ks_free(&ks);
    ks = ks_open(core, path);
    c = diffusers_rule(&ks, t, n, why, sizeof(why));
    printf("%s: diffusers loads %d of %d modules%s%s\n", what, c < 0 ? 0 : c, n_mods, c < 0 ? ": " : "", why);
    tools |= c == n_mods ? LYC_TOOL_DIFFUSERS : 0;
    ks_free(&ks);
    return tools;
}

/* Log lines collected by log_grab (tests read what the network says at attach). */
static char grabbed[16384];

static void log_grab(void *user, enum ghc_log_level lvl, const char *msg)
{
    (void)user;
    size_t o = strlen(grabbed);
    snprintf(grabbed + o, sizeof(grabbed) - o, "%s%s\n", lvl == GHC_LOG_WARN ? "W: " : "I: ", msg);
}

/* The tools the network's attach message says load its files (INFO "... load in A, B" or WARN
 * "... they load in: A, B"). */
static unsigned tools_claimed(void)
{
    const char *p = strstr(grabbed, "load in: ");
    p = p ? p + 9 : strstr(grabbed, ") load in ");
    ck_assert_msg(p != NULL, "no loaders line in:\n%s", grabbed);
    if (*p == ')')
        p += 10;
    const char *end = strchr(p, '\n');
    unsigned tools = 0;
    static const char *const name[] = { "ComfyUI", "musubi-tuner", "diffusers" };
    for (int t = 0; t < 3; t++) {
        const char *q = strstr(p, name[t]);
        tools |= q && q < end ? 1u << t : 0;
    }
    return tools;
}

/* The default file and its variants against the three loaders: LoRA, LoHa and LoKr with default
 * keys load in every tool that takes the algorithm (LoRA: all three; LoHa, LoKr: ComfyUI and
 * musubi-tuner); what a selection or naming costs, DoRA, and extra_formats; and the network's
 * message at attach names the same tools. */
START_TEST(default_file_loaders)
{
    static const unsigned ALL = LYC_TOOL_COMFYUI | LYC_TOOL_MUSUBI | LYC_TOOL_DIFFUSERS;
    static const unsigned CM = LYC_TOOL_COMFYUI | LYC_TOOL_MUSUBI;
    static const struct { const char *cfg; unsigned want, extra; bool model; } v[] = {
        { "", ALL, 0, false },                                              /* the default file */
        { "algo = \"loha\";", CM, 0, false },
        { "algo = \"lokr\"; rank = 2; factor = 4;", CM, 0, false },
        { "algo = \"lokr\"; rank = 100; factor = 8;", CM, 0, false },        /* both factors full */
        { "algo = \"lokr\"; rank = 1; factor = 4; decompose_both = true;", LYC_TOOL_COMFYUI, 0, false },
        { "preset = \"attn\";", CM, 0, false },                             /* diffusers: incomplete blocks */
        { "preset = \"attn\"; extra_formats = [ \"diffusers\" ];", CM, LYC_TOOL_DIFFUSERS, false },
        { "format = \"comfyui\";", LYC_TOOL_COMFYUI | LYC_TOOL_DIFFUSERS, 0, false },
        { "format = \"comfyui\"; extra_formats = [ \"musubi\" ];", LYC_TOOL_COMFYUI | LYC_TOOL_DIFFUSERS, ALL, false },
        { "format = \"diffusers\";", LYC_TOOL_DIFFUSERS, 0, false },
        { "dora_wd = true;", LYC_TOOL_COMFYUI, 0, true },                    /* the others drop dora_scale */
    };
    char *dir = tu_tmpdir();
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        char mcfg[1024], path[4200], extra[4300];
        ghc_core_t *core = core_with(v[i].cfg, v[i].model ? wan22_cfg(mcfg, sizeof(mcfg), true) : NULL);
        ghc_network_t *net = ghc_network_get(core);
        const struct ghc_model_target *t;
        int32_t n;
        if (v[i].model)
            ok(core, ghc_model_targets(ghc_model_get(core), &t, &n));
        else
            t = fake_targets(&n);
        grabbed[0] = '\0';
        ghc_log_set_sink(core, log_grab, NULL);
        ok(core, ghc_network_attach(net, 0, t, n));
        randomise(core, net, i + 1);
        struct ghc_param *ps;
        int32_t np;
        ok(core, ghc_network_params(net, 0, &ps, &np));
        int mods = 0;
        for (int32_t k = 0; k < np; k++)   /* modules: their first slot */
            mods += strstr(ps[k].name, ".lora_down.weight") || strstr(ps[k].name, ".hada_w1_a") ||
                    (strstr(ps[k].name, ".lokr_w1") && !strstr(ps[k].name, ".lokr_w1_b"));
        snprintf(path, sizeof(path), "%s/f%zu.safetensors", dir, i);
        ok(core, ghc_network_save(net, 0, path));
        printf("-- %s\n%s", *v[i].cfg ? v[i].cfg : "(defaults)", grabbed);
        unsigned got = tools_loading(core, path, t, n, mods, "file");
        ck_assert_msg(got == v[i].want, "%s: the file loads in tools %#x, expected %#x", v[i].cfg, got, v[i].want);
        unsigned all = got;
        if (v[i].extra) {
            lyc_extra_path(path, strstr(v[i].cfg, "\"diffusers\" ]") ? LYC_FMT_DIFFUSERS : LYC_FMT_MUSUBI, extra,
                           sizeof(extra));
            unsigned ge = tools_loading(core, extra, t, n, mods, "extra file");
            ck_assert_msg(ge == v[i].extra, "%s: the extra file %s loads in %#x, expected %#x", v[i].cfg, extra, ge,
                          v[i].extra);
            all |= ge;
        }
        ck_assert_msg(tools_claimed() == all, "%s: the network says its files load in %#x, the loaders' rules give "
                      "%#x:\n%s", v[i].cfg, tools_claimed(), all, grabbed);
        ghc_core_free(core);
    }
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* Save in each naming, check the keys and alpha, load back into a network with another alpha
 * and get the same outputs. */
START_TEST(save_load_formats)
{
    static const struct { const char *cfg, *key0, *algo; } fm[] = {
        { "algo = \"lora\"; rank = 4; alpha = 2.0; format = \"comfyui\"; save_dtype = \"f32\";",
          "diffusion_model.blocks.0.self_attn.q.lora_down.weight", "lora" },
        { "algo = \"lora\"; rank = 4; alpha = 2.0; format = \"musubi\"; save_dtype = \"f32\";",
          "lora_unet_blocks_0_self_attn_q.lora_down.weight", "lora" },
        { "algo = \"lora\"; rank = 4; alpha = 2.0; format = \"diffusers\"; save_dtype = \"f32\";",
          "transformer.blocks.0.attn1.to_q.lora_A.weight", "lora" },
        { "algo = \"loha\"; rank = 2; alpha = 1.0; format = \"comfyui\"; save_dtype = \"f32\";",
          "diffusion_model.blocks.0.self_attn.q.hada_w1_a", "loha" },
        { "algo = \"lokr\"; rank = 2; alpha = 1.0; factor = 4; decompose_both = true; save_dtype = \"f32\";",
          "lora_unet_blocks_0_self_attn_q.lokr_w2_a", "lokr" },
        { "algo = \"lokr\"; rank = 100; factor = 8; format = \"musubi\"; save_dtype = \"f32\";",
          "lora_unet_blocks_2_ffn_2.lokr_w2", "lokr" },
        { "algo = \"lora\"; rank = 4; alpha = 2.0;", "lora_unet_blocks_2_ffn_0.lora_up.weight", "lora" },
    };
    char *dir = tu_tmpdir();
    int32_t n;
    struct ghc_model_target *t = fake_targets(&n);
    for (size_t f = 0; f < sizeof(fm) / sizeof(fm[0]); f++) {
        ghc_core_t *core = core_with(fm[f].cfg, NULL);
        ghc_network_t *net = ghc_network_get(core);
        ok(core, ghc_network_attach(net, 0, t, n));
        randomise(core, net, f + 1);
        char path[4200];
        snprintf(path, sizeof(path), "%s/a%zu.safetensors", dir, f);
        ok(core, ghc_network_save(net, 0, path));
        size_t len;
        /* GHC_LYCORIS_KEEP=dir keeps the files and the layer outputs for
         * tests/fixtures/check_lycoris_load.py (doc/lycoris.md) */
        const char *keep = getenv("GHC_LYCORIS_KEEP");
        ghc_st_writer_t *ref = keep ? ghc_st_writer_init(core) : NULL;
        float *want = outputs_ref(core, net, t, n, &len, ref);
        if (keep) {
            char kp[4200];
            snprintf(kp, sizeof(kp), "%s/a%zu.safetensors", keep, f);
            ok(core, ghc_network_save(net, 0, kp));
            snprintf(kp, sizeof(kp), "%s/a%zu.ref.safetensors", keep, f);
            ok(core, ghc_st_writer_finish(ref, kp));
            ghc_st_writer_free(ref);
        }

        ghc_st_t *st = ghc_st_open(core, path);
        ck_assert_msg(st != NULL, "%s", ghc_error_message(core));
        struct ghc_st_info info;
        ck_assert_msg(ghc_st_find(st, fm[f].key0, &info), "%s: no key %s", fm[f].cfg, fm[f].key0);
        bool peft = strstr(fm[f].cfg, "diffusers") != NULL;
        int alphas = 0;
        for (int i = 0; i < ghc_st_count(st); i++) {
            ghc_st_info_at(st, i, &info);
            if (!peft)
                ck_assert_msg(comfy_key(info.name), "key '%s' is not a form ComfyUI loads for Wan", info.name);
            else
                ck_assert_msg(strncmp(info.name, "transformer.blocks.", 19) == 0 && strstr(info.name, ".lora_"),
                              "diffusers key '%s'", info.name);
            if (strstr(info.name, ".alpha")) {
                ck_assert_int_eq(info.ndim, 0);
                ck_assert_int_eq(info.dtype, GHC_DTYPE_F32);
                alphas++;
            } else {
                ck_assert_int_eq(info.dtype, strstr(fm[f].cfg, "save_dtype") ? GHC_DTYPE_F32 : GHC_DTYPE_BF16);
            }
        }
        ck_assert_int_eq(alphas, peft ? 0 : 30);
        ck_assert_str_eq(ghc_st_metadata(st, "ss_network_args") ? strstr(ghc_st_metadata(st, "ss_network_args"),
                         fm[f].algo) ? fm[f].algo : "?" : "-", fm[f].algo);
        ck_assert_str_eq(ghc_st_metadata(st, "ss_base_model_version"), "wan");
        if (f == 5) {   /* both-full LoKr: the defensive alpha out_k // out_l = 8 // 8... for ffn.2: 64 = (8, 8) */
            ghc_tensor_t *a = load(core, st, "lora_unet_blocks_2_ffn_2.alpha");
            ck_assert_float_eq(*(const float *)ghc_tensor_cdata(a), 1.0f);
            ghc_tensor_free(a);
        }
        if (f == 0) {   /* alpha = alpha (rank 4, alpha 2) */
            ghc_tensor_t *a = load(core, st, "diffusion_model.blocks.1.ffn.0.alpha");
            ck_assert_float_eq(*(const float *)ghc_tensor_cdata(a), 2.0f);
            ghc_tensor_free(a);
        }
        ghc_st_free(st);
        ghc_core_free(core);

        /* load into a network of another alpha: same outputs (scale difference folded in) */
        char cfg2[512];
        snprintf(cfg2, sizeof(cfg2), "%s", fm[f].cfg);
        char *p = strstr(cfg2, "alpha = ");
        if (p)   /* blank the old alpha */
            memset(p, ' ', strcspn(p, ";") + 1);
        strcat(cfg2, " alpha = 7.0;");
        core = core_with(cfg2, NULL);
        net = ghc_network_get(core);
        ok(core, ghc_network_attach(net, 0, t, n));
        ok(core, ghc_network_load(net, 0, path));
        size_t len2;
        float *got = outputs(core, net, t, n, &len2);
        ck_assert_uint_eq(len, len2);
        double e = max_rel(got, want, len);
        printf("%s: reloaded (alpha 7) outputs rel err %.3g\n", fm[f].cfg, e);
        ck_assert_msg(e < (strstr(fm[f].cfg, "save_dtype") ? 1e-6 : 1e-2), "%s: reload rel err %g", fm[f].cfg, e);
        free(got);
        free(want);
        ghc_core_free(core);
    }
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* Write a one-module file for target blocks.0.self_attn.q (in 64, out 48) with tensors given as
 * "name:rows:cols" (cols 0: a 0-dim alpha). */
static char *write_file(ghc_core_t *core, const char *dir, const char *fname, const char *const *spec, int n)
{
    ghc_st_writer_t *w = ghc_st_writer_init(core);
    for (int i = 0; i < n; i++) {
        char name[128];
        int rows, cols;
        ck_assert_int_eq(sscanf(spec[i], "%127[^:]:%d:%d", name, &rows, &cols), 3);
        float *v = calloc((size_t)(rows * (cols ? cols : 1)), sizeof(float));
        v[0] = 1.0f;
        ok(core, ghc_st_writer_add_raw(w, name, GHC_DTYPE_F32, cols ? 2 : 0, (const int64_t[]){ rows, cols }, v));
        free(v);
    }
    char *path = malloc(strlen(dir) + strlen(fname) + 2);
    sprintf(path, "%s/%s", dir, fname);
    ok(core, ghc_st_writer_finish(w, path));
    ghc_st_writer_free(w);
    return path;
}

/* DoRA files: g (and the factors) saved by a network on the wan22 fixture model and loaded by
 * another give the same layer outputs (base W x + b included); dora_scale is F32 [out, 1].
 * With GHC_LYCORIS_KEEP=dir also writes dir/dN.safetensors and dir/dN.ref.safetensors (x.<t>,
 * y.<t>, w.<t>, b.<t>) for check_lycoris_load.py. */
static float *dora_outputs(ghc_core_t *core, ghc_st_writer_t *ref, size_t *len)
{
    ghc_model_t *model = ghc_model_get(core);
    ghc_network_t *net = ghc_network_get(core);
    const struct ghc_model_target *tg;
    int32_t n;
    struct ghc_adapter_hook hook;
    ok(core, ghc_model_targets(model, &tg, &n));
    ok(core, ghc_network_hook(net, 0, &hook));
    size_t total = 0, o = 0;
    for (int32_t t = 0; t < n; t++)
        total += 5 * (size_t)tg[t].out_features;
    float *all = malloc(total * sizeof(float));
    for (int32_t t = 0; t < n; t++) {
        const ghc_tensor_t *w, *b;
        float sc;
        ok(core, ghc_model_target_weight(model, 0, t, &w, &sc, &b));
        ck_assert(sc == 1.0f && b != NULL);
        ghc_tensor_t *xh = mk(core, GHC_DEVICE_CPU, GHC_DTYPE_F32, 3, (const int64_t[]){ 1, 5, tg[t].in_features });
        ok(core, ghc_op_rand_normal(xh, &(struct ghc_rng){ 99, (uint64_t)t << 20 }, NULL));
        ghc_tensor_t *x = on(core, xh, dev, GHC_DTYPE_F32);
        ghc_tensor_t *y = base_linear(core, x, w, b);
        did(core, hook.forward(hook.user, t, x, y, false, NULL), 1);
        ghc_tensor_t *yh = on(core, y, GHC_DEVICE_CPU, GHC_DTYPE_F32);
        memcpy(all + o, ghc_tensor_cdata(yh), 5 * (size_t)tg[t].out_features * sizeof(float));
        o += 5 * (size_t)tg[t].out_features;
        if (ref) {
            char k[128];
            /* again: the model's weight view is its own and the hook's DoRA asked for another */
            ok(core, ghc_model_target_weight(model, 0, t, &w, &sc, &b));
            ghc_tensor_t *wh = on(core, w, GHC_DEVICE_CPU, GHC_DTYPE_F32), *bh = on(core, b, GHC_DEVICE_CPU, GHC_DTYPE_F32);
            snprintf(k, sizeof(k), "x.%s", tg[t].name);
            ok(core, ghc_st_writer_add(ref, k, xh));
            snprintf(k, sizeof(k), "y.%s", tg[t].name);
            ok(core, ghc_st_writer_add(ref, k, yh));
            snprintf(k, sizeof(k), "w.%s", tg[t].name);
            ok(core, ghc_st_writer_add(ref, k, wh));
            snprintf(k, sizeof(k), "b.%s", tg[t].name);
            ok(core, ghc_st_writer_add(ref, k, bh));
            ghc_tensor_free(wh);
            ghc_tensor_free(bh);
        }
        ghc_tensor_free(xh);
        ghc_tensor_free(x);
        ghc_tensor_free(y);
        ghc_tensor_free(yh);
    }
    *len = total;
    return all;
}

START_TEST(dora_save_load)
{
    static const char *const cfgs[] = {
        "algo = \"lora\"; rank = 4; alpha = 2.0; dora_wd = true; save_dtype = \"f32\";",
        "algo = \"lora\"; rank = 4; alpha = 2.0; dora_wd = true; format = \"comfyui\";",
    };
    const char *cfg = cfgs[_i];
    char mcfg[1024], path[4200], kp[4200];
    char *dir = tu_tmpdir();
    snprintf(path, sizeof(path), "%s/dora.safetensors", dir);
    ghc_core_t *core = core_with(cfg, wan22_cfg(mcfg, sizeof(mcfg), true));
    ghc_network_t *net = ghc_network_get(core);
    const struct ghc_model_target *tg;
    int32_t n;
    ok(core, ghc_model_targets(ghc_model_get(core), &tg, &n));
    ok(core, ghc_network_attach(net, 0, tg, n));
    randomise(core, net, 7 + (uint64_t)_i);
    const char *keep = getenv("GHC_LYCORIS_KEEP");
    ghc_st_writer_t *ref = keep ? ghc_st_writer_init(core) : NULL;
    size_t len, len2;
    float *y1 = dora_outputs(core, ref, &len);
    ok(core, ghc_network_save(net, 0, path));
    if (keep) {
        snprintf(kp, sizeof(kp), "%s/d%d.safetensors", keep, _i);
        ok(core, ghc_network_save(net, 0, kp));
        snprintf(kp, sizeof(kp), "%s/d%d.ref.safetensors", keep, _i);
        ok(core, ghc_st_writer_finish(ref, kp));
        ghc_st_writer_free(ref);
    }
    ghc_st_t *st = ghc_st_open(core, path);
    struct ghc_st_info info;
    ck_assert(ghc_st_find(st, _i ? "diffusion_model.blocks.1.ffn.0.dora_scale" : "lora_unet_blocks_1_ffn_0.dora_scale",
                          &info));
    ck_assert_str_eq(ghc_st_metadata(st, LYC_DORA_NORM_KEY), "base_weight");
    /* the wan22 model claims Wan's architecture (its architecture member): Wan's metadata */
    ck_assert_str_eq(ghc_st_metadata(st, "ss_base_model_version"), "wan");
    ck_assert_str_eq(ghc_st_metadata(st, "modelspec.architecture"), "wan2.1/lora");
    ck_assert_str_eq(ghc_st_metadata(st, "modelspec.implementation"), "https://github.com/Wan-Video/Wan2.1");
    ck_assert_int_eq(info.dtype, GHC_DTYPE_F32);
    ck_assert_int_eq(info.ndim, 2);
    ck_assert_int_eq(info.shape[0], 176);
    ck_assert_int_eq(info.shape[1], 1);
    ghc_st_free(st);
    ghc_core_free(core);

    core = core_with(cfg, wan22_cfg(mcfg, sizeof(mcfg), true));
    net = ghc_network_get(core);
    ok(core, ghc_model_targets(ghc_model_get(core), &tg, &n));
    ok(core, ghc_network_attach(net, 0, tg, n));
    ok(core, ghc_network_load(net, 0, path));
    float *y2 = dora_outputs(core, NULL, &len2);
    ck_assert_uint_eq(len, len2);
    double e = max_rel(y2, y1, len);
    printf("dora save/load (%s): max rel diff %.3g\n", cfg, e);
    ck_assert_msg(e < (_i ? 2e-2 : 1e-6), "dora reload: %g", e);
    /* a dora_norm the reader does not know: refused, nothing loaded */
    st = ghc_st_open(core, path);
    ghc_st_writer_t *bw = ghc_st_writer_init(core);
    for (int k = 0; k < ghc_st_count(st); k++) {
        struct ghc_st_info t;
        ghc_st_info_at(st, k, &t);
        ok(core, ghc_st_writer_add_raw(bw, t.name, t.dtype, t.ndim, t.shape, ghc_st_raw(st, t.name)));
    }
    ok(core, ghc_st_writer_metadata(bw, LYC_DORA_NORM_KEY, "row_norms"));
    snprintf(kp, sizeof(kp), "%s/bad_norm.safetensors", dir);
    ok(core, ghc_st_writer_finish(bw, kp));
    ghc_st_writer_free(bw);
    ghc_st_free(st);
    ck_assert_int_eq(ghc_network_load(net, 0, kp), GHC_EFORMAT);
    ck_assert_msg(strstr(ghc_error_message(core), "gh200core.dora_norm = 'row_norms'"), "%s", ghc_error_message(core));
    free(y1);
    free(y2);
    ghc_core_free(core);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

START_TEST(malformed_files)
{
    static const struct { const char *what; const char *t[4]; int n; const char *msg; } bad[] = {
        { "missing up", { "diffusion_model.blocks.0.self_attn.q.lora_down.weight:4:64",
                          "diffusion_model.blocks.0.self_attn.q.alpha:1:0" }, 2, "'lora_up.weight' is missing" },
        { "missing down", { "lora_unet_blocks_0_self_attn_q.lora_up.weight:48:4" }, 1, "'lora_down.weight' is missing" },
        { "wrong shape", { "diffusion_model.blocks.0.self_attn.q.lora_down.weight:4:65",
                           "diffusion_model.blocks.0.self_attn.q.lora_up.weight:48:4" }, 2,
          "lora_down.weight': shape [4, 65] F32, expected [4, 64]" },
        { "wrong rank", { "diffusion_model.blocks.0.self_attn.q.lora_down.weight:8:64",
                          "diffusion_model.blocks.0.self_attn.q.lora_up.weight:48:8" }, 2, "expected [4, 64]" },
        { "unknown algorithm", { "diffusion_model.blocks.0.self_attn.q.oft_blocks:4:12" }, 1,
          "unknown adapter tensor 'oft_blocks'" },
        { "other algorithm", { "diffusion_model.blocks.0.self_attn.q.hada_w1_a:48:4" }, 1,
          "the file holds LoHa tensors, the network is configured for algo \"lora\"" },
        { "dora", { "diffusion_model.blocks.0.self_attn.q.dora_scale:48:1" }, 1, "set dora_wd = true to load it" },
        { "no tensors", { "diffusion_model.blocks.7.self_attn.q.lora_up.weight:48:4" }, 1,
          "no adapter tensors for module 'blocks.0.self_attn.q'" },
        { "bad alpha", { "diffusion_model.blocks.0.self_attn.q.lora_down.weight:4:64",
                         "diffusion_model.blocks.0.self_attn.q.lora_up.weight:48:4",
                         "diffusion_model.blocks.0.self_attn.q.alpha:2:2" }, 3, "alpha must be one float" },
    };
    char *dir = tu_tmpdir();
    ghc_core_t *core = core_with("algo = \"lora\"; rank = 4;", NULL);
    ghc_network_t *net = ghc_network_get(core);
    ok(core, ghc_network_attach(net, 0, &one_target, 1));
    randomise(core, net, 3);
    size_t len;
    float *before = outputs(core, net, &one_target, 1, &len);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char *path = write_file(core, dir, "bad.safetensors", bad[i].t, bad[i].n);
        int rc = ghc_network_load(net, 0, path);
        const char *msg = ghc_error_message(core);
        printf("%s: %s\n", bad[i].what, msg);
        ck_assert_msg(rc == GHC_EFORMAT, "%s: rc %d (%s)", bad[i].what, rc, msg);
        ck_assert_msg(strstr(msg, bad[i].msg) && strstr(msg, path), "%s: message '%s' lacks '%s' or the path",
                      bad[i].what, msg, bad[i].msg);
        free(path);
    }
    /* nothing changed */
    float *after = outputs(core, net, &one_target, 1, &len);
    ck_assert(memcmp(before, after, len * sizeof(float)) == 0);
    /* not a safetensors file; absent file */
    char *junk = tu_write(dir, "junk.safetensors", "not a file");
    ck_assert_int_eq(ghc_network_load(net, 0, junk), GHC_EFORMAT);
    ck_assert_int_lt(ghc_network_load(net, 0, "/nonexistent/a.safetensors"), 0);
    /* a LoKr layout mismatch: full W2 in the file, low-rank in the network */
    ghc_core_t *c2 = core_with("algo = \"lokr\"; rank = 2; factor = 4;", NULL);
    ok(c2, ghc_network_attach(ghc_network_get(c2), 0, &one_target, 1));
    static const char *const lk[] = { "diffusion_model.blocks.0.self_attn.q.lokr_w1:4:4",
                                      "diffusion_model.blocks.0.self_attn.q.lokr_w2:12:16" };
    char *path = write_file(c2, dir, "lk.safetensors", lk, 2);
    ck_assert_int_eq(ghc_network_load(ghc_network_get(c2), 0, path), GHC_EFORMAT);
    printf("lokr layout: %s\n", ghc_error_message(c2));
    ck_assert(strstr(ghc_error_message(c2), "lokr_w2") != NULL);
    free(path);
    ghc_core_free(c2);
    free(junk);
    free(before);
    free(after);
    ghc_core_free(core);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* ---- targets, dropout, config ----------------------------------------------------------------- */

START_TEST(target_selection)
{
    static const struct { const char *cfg; int mods; const char *has, *hasnt; } v[] = {
        { "", 30, "blocks.2.ffn.2.lora_up.weight", NULL },
        { "preset = \"attn\";", 24, "blocks.1.cross_attn.o.lora_up.weight", "blocks.0.ffn.0.lora_up.weight" },
        { "preset = \"attn\"; include = [ \"blocks.0.ffn.*\" ];", 26, "blocks.0.ffn.2.lora_up.weight",
          "blocks.1.ffn.0.lora_up.weight" },
        { "exclude = [ \"*.cross_attn.k\", \"*.cross_attn.v\" ];", 24, "blocks.0.cross_attn.q.lora_up.weight",
          "blocks.2.cross_attn.v.lora_up.weight" },
        { "exclude = [ \"blocks.2.*\" ];", 20, "blocks.1.ffn.2.lora_down.weight", "blocks.2.self_attn.q.lora_up.weight" },
    };
    int32_t n;
    struct ghc_model_target *t = fake_targets(&n);
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        ghc_core_t *core = core_with(v[i].cfg, NULL);
        ghc_network_t *net = ghc_network_get(core);
        ok(core, ghc_network_attach(net, 1, t, n));
        struct ghc_param *ps;
        int32_t np;
        ok(core, ghc_network_params(net, 1, &ps, &np));
        ck_assert_msg(np == 2 * v[i].mods, "%s: %d params", v[i].cfg, np);
        bool has = false, hasnt = false;
        for (int32_t k = 0; k < np; k++) {
            has |= strcmp(ps[k].name, v[i].has) == 0;
            hasnt |= v[i].hasnt && strcmp(ps[k].name, v[i].hasnt) == 0;
            ck_assert_int_eq(ps[k].group, 1);
        }
        ck_assert_msg(has && !hasnt, "%s", v[i].cfg);
        ck_assert_int_eq(ghc_network_params(net, 0, &ps, &np), GHC_EINVAL);   /* expert 0 not attached */
        ghc_core_free(core);
    }
    /* overrides: ffn rank 2 alpha 8 -> alpha file 8, scale 4 */
    ghc_core_t *core = core_with("rank = 4; overrides = [ \"*.ffn.*:2:8\", \"blocks.0.self_attn.q:6\" ];", NULL);
    ghc_network_t *net = ghc_network_get(core);
    ok(core, ghc_network_attach(net, 0, t, n));
    struct ghc_param *ps;
    int32_t np;
    ok(core, ghc_network_params(net, 0, &ps, &np));
    for (int32_t k = 0; k < np; k++) {
        int64_t r = strstr(ps[k].name, "down") ? ghc_tensor_dim(ps[k].value, 0) : ghc_tensor_dim(ps[k].value, 1);
        int64_t want = strstr(ps[k].name, ".ffn.") ? 2 : strncmp(ps[k].name, "blocks.0.self_attn.q", 20) == 0 ? 6 : 4;
        ck_assert_msg(r == want, "%s: rank %lld, expected %lld", ps[k].name, (long long)r, (long long)want);
    }
    char *dir = tu_tmpdir(), path[4200];
    snprintf(path, sizeof(path), "%s/o.safetensors", dir);
    ok(core, ghc_network_save(net, 0, path));
    ghc_st_t *st = ghc_st_open(core, path);
    ghc_tensor_t *a = load(core, st, "lora_unet_blocks_1_ffn_0.alpha");
    ck_assert_float_eq(*(const float *)ghc_tensor_cdata(a), 8.0f);   /* the override's alpha, per layer */
    ghc_tensor_free(a);
    a = load(core, st, "lora_unet_blocks_0_self_attn_q.alpha");
    ck_assert_float_eq(*(const float *)ghc_tensor_cdata(a), 6.0f);   /* alpha unset: = rank */
    ghc_tensor_free(a);
    ghc_st_free(st);
    ghc_core_free(core);
    /* nothing selected */
    core = core_with("preset = \"attn\"; exclude = [ \"*attn*\" ];", NULL);
    ck_assert_int_eq(ghc_network_attach(ghc_network_get(core), 0, t, n), GHC_EINVAL);
    ck_assert(strstr(ghc_error_message(core), "no target selected") != NULL);
    ghc_core_free(core);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* preset "full" selects every target the model offers: on a model with targets outside its
 * blocks it adds them to attn_ffn's; the wan22 model offers only the 10 linears of each block,
 * so there "full" selects exactly what "attn_ffn" does, and attach says so. */
START_TEST(preset_full)
{
    int32_t n;
    struct ghc_model_target *t30 = fake_targets(&n), t[32];
    memcpy(t, t30, 30 * sizeof(*t));
    t[30] = (struct ghc_model_target){ .name = "time_projection.1", .in_features = 64, .out_features = 96, .block = -1 };
    t[31] = (struct ghc_model_target){ .name = "head.head", .in_features = 64, .out_features = 64, .block = -1 };
    static const struct { const char *cfg; int mods; const char *says; } v[] = {
        { "preset = \"attn_ffn\";", 30, "preset \"attn_ffn\": 30 of the model's 32 targets" },
        { "preset = \"full\";", 32, "preset \"full\": 32 of the model's 32 targets (30 block linears, 24 of them "
          "attention); 2 of them outside the blocks (not in \"attn_ffn\")" },
        { "preset = \"attn\";", 24, "preset \"attn\": 24 of the model's 32 targets" },
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        ghc_core_t *core = core_with(v[i].cfg, NULL);
        grabbed[0] = '\0';
        ghc_log_set_sink(core, log_grab, NULL);
        ok(core, ghc_network_attach(ghc_network_get(core), 0, t, 32));
        struct ghc_param *ps;
        int32_t np;
        ok(core, ghc_network_params(ghc_network_get(core), 0, &ps, &np));
        ck_assert_msg(np == 2 * v[i].mods, "%s: %d params", v[i].cfg, np);
        ck_assert_msg(strstr(grabbed, v[i].says), "%s: attach said:\n%s", v[i].cfg, grabbed);
        ghc_core_free(core);
    }
    /* the wan22 model: full = attn_ffn, module for module */
    char mcfg[1024], *names[2] = { NULL, NULL };
    for (int k = 0; k < 2; k++) {
        ghc_core_t *core = core_with(k ? "preset = \"full\";" : "", wan22_cfg(mcfg, sizeof(mcfg), true));
        const struct ghc_model_target *tg;
        int32_t nt;
        ok(core, ghc_model_targets(ghc_model_get(core), &tg, &nt));
        grabbed[0] = '\0';
        ghc_log_set_sink(core, log_grab, NULL);
        ok(core, ghc_network_attach(ghc_network_get(core), 0, tg, nt));
        struct ghc_param *ps;
        int32_t np;
        ok(core, ghc_network_params(ghc_network_get(core), 0, &ps, &np));
        size_t len = 0;
        for (int32_t j = 0; j < np; j++)
            len += strlen(ps[j].name) + 1;
        names[k] = calloc(len + 1, 1);
        for (int32_t j = 0; j < np; j++)
            strcat(strcat(names[k], ps[j].name), "\n");
        ck_assert_int_eq(np, 2 * nt);
        if (k)
            ck_assert_msg(strstr(grabbed, "the model offers no target outside its blocks, so \"full\" selects what "
                                 "\"attn_ffn\" does here"), "wan22, full: attach said:\n%s", grabbed);
        ghc_core_free(core);
    }
    ck_assert_str_eq(names[0], names[1]);
    free(names[0]);
    free(names[1]);
}
END_TEST

/* The adapter's contribution to y of target 0 for an input of ones, at step `step`; the forward
 * returns 1, or 0 where module dropout skips the module (y untouched). */
static float *delta_at(ghc_core_t *core, ghc_network_t *net, int64_t step, int want)
{
    struct ghc_adapter_hook hook;
    ok(core, ghc_network_hook(net, 0, &hook));
    ok(core, ghc_network_begin_step(net, step));
    ghc_tensor_t *x = mk(core, -1, GHC_DTYPE_F32, 3, (const int64_t[]){ 1, 2, 64 });
    ghc_tensor_t *y = mk(core, -1, GHC_DTYPE_F32, 3, (const int64_t[]){ 1, 2, 48 });
    ok(core, ghc_op_fill(x, 1.0, NULL));
    ok(core, ghc_op_fill(y, 0.0, NULL));
    did(core, hook.forward(hook.user, 0, x, y, false, NULL), want);
    float *v = malloc(96 * sizeof(float));
    memcpy(v, ghc_tensor_cdata(y), 96 * sizeof(float));
    ghc_tensor_free(x);
    ghc_tensor_free(y);
    return v;
}

START_TEST(dropout)
{
    ghc_core_t *c0 = core_with("rank = 4; seed = 3;", NULL);
    ghc_core_t *c1 = core_with("rank = 4; seed = 3; rank_dropout = 0.5;", NULL);
    ghc_core_t *c2 = core_with("rank = 4; seed = 3; module_dropout = 1.0;", NULL);
    ghc_core_t *c3 = core_with("rank = 4; seed = 3; rank_dropout = 0.5; rank_dropout_scale = true;", NULL);
    ghc_core_t *cs[] = { c0, c1, c2, c3 };
    for (int i = 0; i < 4; i++) {
        ok(cs[i], ghc_network_attach(ghc_network_get(cs[i]), 0, &one_target, 1));
        randomise(cs[i], ghc_network_get(cs[i]), 11);
    }
    float *full = delta_at(c0, ghc_network_get(c0), 1, 1);
    float *a = delta_at(c1, ghc_network_get(c1), 1, 1), *a2 = delta_at(c1, ghc_network_get(c1), 1, 1);
    float *b = delta_at(c1, ghc_network_get(c1), 2, 1), *off = delta_at(c2, ghc_network_get(c2), 1, 0);
    float *sc = delta_at(c3, ghc_network_get(c3), 1, 1);
    ck_assert(memcmp(a, a2, 96 * sizeof(float)) == 0);          /* same step: same masks (recomputation) */
    ck_assert(memcmp(a, b, 96 * sizeof(float)) != 0);           /* another step: other masks */
    int kept = 0;
    for (int k = 0; k < 48; k++) {
        bool on = a[k] != 0.0f;
        kept += on;
        for (int row = 0; row < 2; row++)   /* a whole output row of delta-W is kept or dropped */
            ck_assert_float_eq(a[row * 48 + k], on ? full[row * 48 + k] : 0.0f);
    }
    ck_assert_msg(kept > 10 && kept < 38, "kept %d of 48 rows at p = 0.5", kept);
    for (int k = 0; k < 48; k++)   /* d / mean(d): kept rows scaled by 48 / kept */
        if (a[k] != 0.0f)
            ck_assert_float_eq_tol(sc[k], full[k] * 48.0f / (float)kept, 1e-4f * fabsf(full[k]) + 1e-6f);
    for (int k = 0; k < 96; k++)
        ck_assert_float_eq(off[k], 0.0f);                        /* module dropout 1: skipped */
    float *ptrs[] = { full, a, a2, b, off, sc };
    for (int i = 0; i < 6; i++)
        free(ptrs[i]);
    for (int i = 0; i < 4; i++)
        ghc_core_free(cs[i]);
}
END_TEST

START_TEST(config_errors)
{
    static const struct { const char *cfg, *msg; } v[] = {
        { "algo = \"loha\"; dora_wd = true;", "dora_wd is implemented for algo" },
        { "dora_wd = true; rank_dropout = 0.1;", "dora_wd is implemented for algo" },
        { "dora_wd = true; format = \"diffusers\";", "dora_wd is implemented for algo" },
        { "algo = \"lokr\"; format = \"diffusers\";", "format \"diffusers\" holds LoRA only" },
        { "extra_formats = [ \"kohya\" ];", "extra_formats: 'kohya' is not one of" },
        { "extra_formats = [ \"musubi\" ];", "extra_formats: 'musubi' is already written" },
        { "extra_formats = [ \"comfyui\", \"comfyui\" ];", "extra_formats: 'comfyui' is already written" },
        { "algo = \"loha\"; extra_formats = [ \"diffusers\" ];", "\"diffusers\" holds plain LoRA only" },
        { "dora_wd = true; extra_formats = [ \"diffusers\" ];", "\"diffusers\" holds plain LoRA only" },
        { "algo = \"oft\";", "algo" },
        { "overrides = [ \"*.ffn.*\" ];", "expected \"pattern:rank\"" },
        { "overrides = [ \"*.ffn.*:0\" ];", "rank >= 1" },
        { "factor = 0;", "factor must be -1" },
        { "rank = 0;", "rank" },
        { "rank_dropout = 1.5;", "rank_dropout" },
        { "ranks = 4;", "unknown key 'ranks'" },
        /* gone with the core's choice of way (linear.h): H always kept, K-concatenation wherever
         * the plan and the model allow, dy always cast by concat_backward */
        { "keep_h = false;", "unknown key 'keep_h'" },
        { "concat = false;", "unknown key 'concat'" },
        { "fuse_cast = false;", "unknown key 'fuse_cast'" },
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        ghc_core_t *core = ghc_core_init();
        ok(core, ghc_plugin_add_path(core, tu_env("GHC_BUILD_PLUGINS")));
        char text[1024];
        snprintf(text, sizeof(text), "mempolicy = { plugin = \"host\"; };\nnetwork = { plugin = \"lycoris\"; %s };\n",
                 v[i].cfg);
        ok(core, ghc_config_load_string(core, text, "t.cfg", NULL, NULL, 0));
        ck_assert_int_lt(ghc_run_init(core), 0);
        printf("%s -> %s\n", v[i].cfg, ghc_error_message(core));
        ck_assert_msg(strstr(ghc_error_message(core), v[i].msg) && strstr(ghc_error_message(core), "t.cfg:"),
                      "%s: '%s'", v[i].cfg, ghc_error_message(core));
        ghc_core_free(core);
    }
    /* wrappers: expert out of range with a model; hook before attach */
    char mcfg[1024];
    ghc_core_t *core = core_with("", wan22_cfg(mcfg, sizeof(mcfg), false));
    ghc_network_t *net = ghc_network_get(core);
    struct ghc_adapter_hook h;
    ck_assert_int_eq(ghc_network_attach(net, 1, &one_target, 1), GHC_EINVAL);   /* one expert */
    ck_assert_int_eq(ghc_network_hook(net, 0, &h), GHC_EINVAL);
    ck_assert(strstr(ghc_error_message(core), "attach first") != NULL);
    ghc_core_free(core);
}
END_TEST

/* The key prefixes of the three namings. */
START_TEST(key_names)
{
    struct lyc_module md = { .name = "blocks.12.cross_attn.o", .alias = "blocks.12.attn2.to_out.0" };
    char buf[128];
    ck_assert_str_eq(lyc_key_prefix(&md, LYC_FMT_COMFYUI, buf, sizeof(buf)), "diffusion_model.blocks.12.cross_attn.o");
    ck_assert_str_eq(lyc_key_prefix(&md, LYC_FMT_MUSUBI, buf, sizeof(buf)), "lora_unet_blocks_12_cross_attn_o");
    ck_assert_str_eq(lyc_key_prefix(&md, LYC_FMT_DIFFUSERS, buf, sizeof(buf)), "transformer.blocks.12.attn2.to_out.0");
}
END_TEST

static Suite *lycoris_suite(void)
{
    Suite *s = suite_create("lycoris");
    TCase *tc = tcase_create("cpu");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, factorization);
    tcase_add_test(tc, key_names);
    tcase_add_loop_test(tc, golden, 0, N_GCASES);
    tcase_add_loop_test(tc, golden_bf16_input, 0, N_GCASES);
    tcase_add_test(tc, save_load_formats);
    tcase_add_test(tc, default_file_loaders);
    tcase_add_loop_test(tc, dora_save_load, 0, 2);
    tcase_add_test(tc, malformed_files);
    tcase_add_test(tc, target_selection);
    tcase_add_test(tc, preset_full);
    tcase_add_test(tc, dropout);
    tcase_add_test(tc, config_errors);
    tcase_add_loop_test(tc, wan22_fixture_lora, 0, 3);
    tcase_add_loop_test(tc, wan22_finite_differences, 0, 5);
    tcase_add_loop_test(tc, wan22_first_vs_after, 0, (int)(sizeof(first_cfgs) / sizeof(first_cfgs[0])));
    tcase_add_loop_test(tc, wan22_keep_h, 0, 2);
    tcase_add_loop_test(tc, wan22_concat, 0, (int)(sizeof(concat_cfgs) / sizeof(concat_cfgs[0])));
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tu_run_suite(lycoris_suite(), false);
}

#endif /* LYC_TEST_GPU */
