/* test_merge.c: `gh200core merge` (core/merge.c with the lycoris plugin's reader and math), run
 * through the CLI on the CPU:
 *   - the golden cases of tests/fixtures/lycoris (LoRA, rs_lora, LoHa, LoKr full / low-rank /
 *     both decomposed / full_matrix, DoRA on two targets): the merged weight equals
 *     case.w + m case.dw, the delta-W Python LyCORIS computed (for DoRA module(I) - linear(I),
 *     i.e. W_new - W), in ComfyUI, musubi and bare naming; the other tensors and the metadata
 *     are copied byte for byte; --dtype bf16 rounds the merged weight only;
 *   - end to end on the tiny wan22 model: the wan22 fixture's LoRA (diffusers + peft golden)
 *     merged into the official and the diffusers checkpoint gives the fixture's prediction with
 *     no adapter attached; LoKr (ComfyUI naming) and DoRA (musubi naming) adapters saved by the
 *     network give, merged, the prediction of the base with the adapter attached; a sharded
 *     base merges into one file;
 *   - DoRA as ComfyUI applies it: the file a DoRA network writes after a few steps, under a C
 *     transcription of ComfyUI's weight_decompose, gives the trained weight and the merged one;
 *     ComfyUI's own code (fixture) agrees with both;
 *   - bad input: an existing --out (exit 6, untouched), missing files (5), a module with no base
 *     weight or of another shape (5, naming the key and both shapes), an incomplete module (5),
 *     an fp8 base weight (1), bad usage (2), a NaN or an infinity in the adapter's factors, its
 *     alpha or a base weight merged into (5, naming the file, the tensor and the element) or
 *     made by the merge; nothing is written on any error. */
#include <config.h>

#include <check.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gh200core/gh200core.h>
#include <gh200core/ops.h>
#include <gh200core/safetensors.h>

#include "testutil.h"

static void ok(ghc_core_t *core, int rc)
{
    ck_assert_msg(rc == 0, "failed (%d): %s", rc, ghc_error_message(core));
}

static char *fixture(const char *dir, const char *name)
{
    static char buf[4][1024];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, 1024, "%s/tests/fixtures/%s/%s", tu_env("GHC_TOP_SRCDIR"), dir, name);
    return p;
}

static ghc_tensor_t *load(ghc_core_t *core, ghc_st_t *st, const char *name)
{
    ghc_tensor_t *t = ghc_st_load(st, name, GHC_DTYPE_F32, GHC_ROLE_WORKSPACE);
    ck_assert_msg(t != NULL, "%s: %s", name, ghc_error_message(core));
    return t;
}

static ghc_st_t *open_st(ghc_core_t *core, const char *path)
{
    ghc_st_t *st = ghc_st_open(core, path);
    ck_assert_msg(st != NULL, "%s: %s", path, ghc_error_message(core));
    return st;
}

static bool exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* gh200core merge ARGS; returns the exit status, *out the output (caller frees). */
static int merge(char **out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int merge(char **out, const char *fmt, ...)
{
    char args[6000], cmd[7000];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof(args), fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof(cmd), "GHC_PLUGIN_PATH='%s' %s merge %s", tu_env("GHC_BUILD_PLUGINS"), tu_env("GHC_CLI"),
             args);
    return tu_run(cmd, out);
}

/* Copy tensors of `src` whose name starts with `from` into writer w, renamed to `to` + rest
 * with '.' -> '_' in the module part when musubi. */
static void copy_renamed(ghc_core_t *core, ghc_st_t *src, ghc_st_writer_t *w, const char *from, const char *to,
                         bool musubi)
{
    for (int i = 0; i < ghc_st_count(src); i++) {
        struct ghc_st_info t;
        ghc_st_info_at(src, i, &t);
        if (strncmp(t.name, from, strlen(from)) != 0)
            continue;
        char nm[256];
        snprintf(nm, sizeof(nm), "%s%s", to, t.name + strlen(from));
        if (musubi) {   /* lora_unet_blocks_0_self_attn_q.lora_down.weight */
            static const char *const sfx[] = { ".lora_down.weight", ".lora_up.weight", ".alpha", ".dora_scale",
                                               ".hada_", ".lokr_" };
            char *end = NULL;
            for (size_t k = 0; k < sizeof(sfx) / sizeof(sfx[0]) && !end; k++)
                end = strstr(nm, sfx[k]);
            ck_assert_ptr_nonnull(end);
            for (char *p = nm + strlen(to); p < end; p++)
                if (*p == '.')
                    *p = '_';
        }
        ok(core, ghc_st_writer_add_raw(w, nm, t.dtype, t.ndim, t.shape, ghc_st_raw(src, t.name)));
    }
}

static double rel(const float *a, const float *b, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* ---- golden cases ---------------------------------------------------------------------------- */

static const char *const gcases[] = { "lora_r4", "lora_r8_rs", "loha_r4", "lokr_fm1_full", "lokr_f4_w2lr",
                                      "lokr_f16_both", "lokr_f16_full", "dora_r4_ffn0", "dora_r8_q" };
#define N_GCASES ((int)(sizeof(gcases) / sizeof(gcases[0])))

START_TEST(golden)
{
    ghc_core_t *core = ghc_core_init();
    char *dir = tu_tmpdir(), path[4][1200], *out;
    char fname[64];
    snprintf(fname, sizeof(fname), "%s.safetensors", gcases[_i]);
    ghc_st_t *fx = open_st(core, fixture("lycoris", fname));
    ghc_tensor_t *w = load(core, fx, "case.w"), *dw = load(core, fx, "case.dw"), *b = load(core, fx, "case.b");
    /* the base: the case's linear under a ComfyUI prefix, its bias, a bf16 and an int tensor */
    const char *tgt = strstr(gcases[_i], "ffn0") ? "blocks.0.ffn.0" : "blocks.0.self_attn.q";
    ghc_st_writer_t *bw = ghc_st_writer_init(core);
    char nm[160];
    snprintf(nm, sizeof(nm), "model.diffusion_model.%s.weight", tgt);
    ok(core, ghc_st_writer_add(bw, nm, w));
    snprintf(nm, sizeof(nm), "model.diffusion_model.%s.bias", tgt);
    ok(core, ghc_st_writer_add(bw, nm, b));
    const uint16_t h[3] = { 0x3f80, 0x4000, 0xc040 };
    const int32_t iv[2] = { 7, -3 };
    ok(core, ghc_st_writer_add_raw(bw, "model.diffusion_model.other.weight", GHC_DTYPE_BF16, 2,
                                   (const int64_t[]){ 1, 3 }, h));
    ok(core, ghc_st_writer_add_raw(bw, "steps", GHC_DTYPE_I32, 1, (const int64_t[]){ 2 }, iv));
    ok(core, ghc_st_writer_metadata(bw, "format", "pt"));
    ok(core, ghc_st_writer_metadata(bw, "note", "base \"fixture\""));
    snprintf(path[0], sizeof(path[0]), "%s/base.safetensors", dir);
    ok(core, ghc_st_writer_finish(bw, path[0]));
    ghc_st_writer_free(bw);
    /* the adapter in three namings: ComfyUI (as LyCORIS saved it), musubi, bare */
    static const char *const to[] = { "diffusion_model.", "lora_unet_", "" };
    int naming = _i % 3;
    ghc_st_writer_t *aw = ghc_st_writer_init(core);
    copy_renamed(core, fx, aw, "diffusion_model.", to[naming], naming == 1);
    snprintf(path[1], sizeof(path[1]), "%s/adapter.safetensors", dir);
    ok(core, ghc_st_writer_finish(aw, path[1]));
    ghc_st_writer_free(aw);
    const float m = 0.7f;
    snprintf(path[2], sizeof(path[2]), "%s/merged.safetensors", dir);
    int rc = merge(&out, "--base %s --adapter %s --out %s --multiplier 0.7", path[0], path[1], path[2]);
    ck_assert_msg(rc == 0, "%s: exit %d: %s", gcases[_i], rc, out);
    const char *algo = strncmp(gcases[_i], "dora", 4) == 0 ? "dora 1" : strncmp(gcases[_i], "loha", 4) == 0 ?
                       "loha 1" : strncmp(gcases[_i], "lokr", 4) == 0 ? "lokr 1" : "lora 1";
    ck_assert_msg(strstr(out, "multiplier 0.7") && strstr(out, algo) && strstr(out, "merged 1 adapter modules") &&
                  strstr(out, "skipped adapter keys: 0"), "%s: summary: %s", gcases[_i], out);
    free(out);
    /* merged = W + m dW; everything else as it was */
    ghc_st_t *ms = open_st(core, path[2]), *bs = open_st(core, path[0]);
    snprintf(nm, sizeof(nm), "model.diffusion_model.%s.weight", tgt);
    ghc_tensor_t *got = load(core, ms, nm);
    int64_t n = ghc_tensor_numel(w);
    float *want = malloc((size_t)n * sizeof(float));
    const float *wv = ghc_tensor_cdata(w), *dv = ghc_tensor_cdata(dw);
    for (int64_t k = 0; k < n; k++)
        want[k] = wv[k] + m * dv[k];
    double e = rel(ghc_tensor_cdata(got), want, n), ed = 0;
    for (int64_t k = 0; k < n; k++)   /* the change itself, relative */
        ed += ((double)((const float *)ghc_tensor_cdata(got))[k] - wv[k] - m * dv[k]) *
              ((double)((const float *)ghc_tensor_cdata(got))[k] - wv[k] - m * dv[k]);
    double dn = 0;
    for (int64_t k = 0; k < n; k++)
        dn += (double)m * dv[k] * m * dv[k];
    printf("%s (%s naming): merged weight rel err %.3g, of the change %.3g\n", gcases[_i],
           naming == 0 ? "ComfyUI" : naming == 1 ? "musubi" : "bare", e, sqrt(ed / dn));
    ck_assert_msg(sqrt(ed / dn) < 2e-5, "%s: merged - W rel err %g", gcases[_i], sqrt(ed / dn));
    ck_assert_int_eq(ghc_st_count(ms), ghc_st_count(bs));
    for (int i = 0; i < ghc_st_count(bs); i++) {
        struct ghc_st_info a, c;
        ghc_st_info_at(bs, i, &a);
        ck_assert(ghc_st_find(ms, a.name, &c));
        ck_assert_int_eq(a.dtype, c.dtype);
        ck_assert_int_eq(a.nbytes, c.nbytes);
        if (strcmp(a.name, nm) != 0)
            ck_assert_msg(memcmp(ghc_st_raw(bs, a.name), ghc_st_raw(ms, a.name), a.nbytes) == 0, "%s changed", a.name);
    }
    ck_assert_str_eq(ghc_st_metadata(ms, "format"), "pt");
    ck_assert_str_eq(ghc_st_metadata(ms, "note"), "base \"fixture\"");
    ghc_st_free(ms);
    /* --dtype bf16: the merged weight rounded, nothing else changes */
    snprintf(path[3], sizeof(path[3]), "%s/merged_bf16.safetensors", dir);
    rc = merge(&out, "--base %s --adapter %s --out %s --multiplier 0.7 --dtype bf16", path[0], path[1], path[3]);
    ck_assert_msg(rc == 0, "exit %d: %s", rc, out);
    free(out);
    ms = open_st(core, path[3]);
    struct ghc_st_info info;
    ck_assert(ghc_st_find(ms, nm, &info));
    ck_assert_int_eq(info.dtype, GHC_DTYPE_BF16);
    ghc_tensor_t *gb = load(core, ms, nm);
    e = rel(ghc_tensor_cdata(gb), ghc_tensor_cdata(got), n);
    ck_assert_msg(e > 0 && e < 4e-3, "bf16 rel err %g", e);
    ck_assert(ghc_st_find(ms, "model.diffusion_model.other.weight", &info));
    ck_assert_int_eq(info.dtype, GHC_DTYPE_BF16);
    snprintf(nm, sizeof(nm), "model.diffusion_model.%s.bias", tgt);
    ck_assert(ghc_st_find(ms, nm, &info));
    ck_assert_int_eq(info.dtype, GHC_DTYPE_F32);
    ghc_st_free(ms);
    ghc_tensor_t *all[] = { w, dw, b, got, gb };
    for (size_t k = 0; k < sizeof(all) / sizeof(all[0]); k++)
        ghc_tensor_free(all[k]);
    free(want);
    ghc_st_free(bs);
    ghc_st_free(fx);
    ghc_core_free(core);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* ---- end to end on the wan22 fixture model ---------------------------------------------------- */

/* A CPU f32 core with the wan22 fixture model from `ckpt` and optionally a lycoris network. */
static ghc_core_t *wan_core(const char *ckpt, const char *net_cfg)
{
    ghc_core_t *core = ghc_core_init();
    ck_assert_ptr_nonnull(core);
    ok(core, ghc_plugin_add_path(core, tu_env("GHC_BUILD_PLUGINS")));
    char text[4096];
    snprintf(text, sizeof(text), "mempolicy = { plugin = \"host\"; };\n"
             "model = { plugin = \"wan22\"; checkpoint = \"%s\"; heads = 2; dtype = \"f32\"; device = -1; };\n"
             "%s%s%s", ckpt, net_cfg ? "network = { plugin = \"lycoris\"; device = -1; save_dtype = \"f32\"; " : "",
             net_cfg ? net_cfg : "", net_cfg ? " };\n" : "");
    ok(core, ghc_config_load_string(core, text, "test.cfg", NULL, NULL, 0));
    ok(core, ghc_run_init(core));
    return core;
}

/* The prediction for the wan22 fixture's case (CPU f32, caller frees), with the network's
 * hook when the core has a network. */
static ghc_tensor_t *predict(ghc_core_t *core)
{
    ghc_model_t *model = ghc_model_get(core);
    ghc_network_t *net = ghc_network_get(core);
    if (net) {
        struct ghc_adapter_hook hook;
        ok(core, ghc_network_hook(net, 0, &hook));
        ok(core, ghc_model_set_hook(model, &hook));
    }
    ghc_st_t *cs = open_st(core, fixture("wan22", "case.safetensors"));
    ghc_tensor_t *x = load(core, cs, "x_sigma_700"), *t = load(core, cs, "t_700"), *e = load(core, cs, "text_embedding");
    ghc_tensor_reshape(t, 1, (const int64_t[]){ 1 });
    ghc_tensor_t *out = ghc_tensor_init(core, GHC_DTYPE_F32, 5, ghc_tensor_shape(x), GHC_DEVICE_CPU, GHC_ROLE_ACTIVATIONS);
    ck_assert_ptr_nonnull(out);
    struct ghc_model_batch b = { .noisy = x, .timesteps = t, .text_embed = e };
    ok(core, ghc_model_forward(model, 0, &b, out, false, NULL));
    ghc_tensor_free(x);
    ghc_tensor_free(t);
    ghc_tensor_free(e);
    ghc_st_free(cs);
    return out;
}

/* The fixture's LoRA (bare names, lora_A/lora_B, alpha; from diffusers + peft) merged into the
 * official and the diffusers checkpoint: the merged model alone gives lora_pred_700. */
START_TEST(wan22_fixture_lora)
{
    static const char *const bases[] = { "weights_official.safetensors", "weights_diffusers.safetensors" };
    ghc_core_t *core = ghc_core_init();
    char *dir = tu_tmpdir(), ad[1200], mg[1200], *out;
    ghc_st_t *cs = open_st(core, fixture("wan22", "case.safetensors"));
    ghc_st_writer_t *aw = ghc_st_writer_init(core);
    copy_renamed(core, cs, aw, "blocks.", "blocks.", false);
    snprintf(ad, sizeof(ad), "%s/lora.safetensors", dir);
    ok(core, ghc_st_writer_finish(aw, ad));
    ghc_st_writer_free(aw);
    ghc_tensor_t *ref = load(core, cs, "lora_pred_700");
    for (int i = 0; i < 2; i++) {
        snprintf(mg, sizeof(mg), "%s/merged%d.safetensors", dir, i);
        int rc = merge(&out, "--base %s --adapter %s --out %s", fixture("wan22", bases[i]), ad, mg);
        ck_assert_msg(rc == 0, "exit %d: %s", rc, out);
        ck_assert_msg(strstr(out, "lora 30,") != NULL, "%s", out);
        free(out);
        ghc_core_t *c2 = wan_core(mg, NULL);
        ghc_tensor_t *pred = predict(c2);
        double e = rel(ghc_tensor_cdata(pred), ghc_tensor_cdata(ref), ghc_tensor_numel(ref));
        printf("wan22 fixture LoRA merged into %s: prediction rel err %.3g\n", bases[i], e);
        ck_assert_msg(e < 1e-5, "%s: rel err %g", bases[i], e);
        ghc_tensor_free(pred);
        ghc_core_free(c2);
    }
    ghc_tensor_free(ref);
    ghc_st_free(cs);
    ghc_core_free(core);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* An adapter trained elsewhere (random factors) saved by the network on the base model: the
 * merged model alone predicts what the base does with the adapter attached. */
static const struct {
    const char *name, *cfg, *base;
} e2e[] = {
    { "lokr f4 (ComfyUI)", "algo = \"lokr\"; rank = 2; alpha = 3.0; factor = 4; preset = \"full\";",
      "weights_official.safetensors" },
    { "lokr f-1 both full (ComfyUI, diffusers base)", "algo = \"lokr\"; rank = 64; factor = -1;",
      "weights_diffusers.safetensors" },
    { "dora r4 (musubi)", "algo = \"lora\"; rank = 4; alpha = 2.0; dora_wd = true; format = \"musubi\";",
      "weights_official.safetensors" },
    { "loha r2 (musubi, diffusers base)", "algo = \"loha\"; rank = 2; format = \"musubi\";",
      "weights_diffusers.safetensors" },
    { "lora r4 (diffusers/peft naming)", "algo = \"lora\"; rank = 4; alpha = 1.0; format = \"diffusers\";",
      "weights_official.safetensors" },
};

START_TEST(wan22_attached_vs_merged)
{
    char *dir = tu_tmpdir(), ad[1200], mg[1200], *out;
    ghc_core_t *core = wan_core(fixture("wan22", e2e[_i].base), e2e[_i].cfg);
    ghc_model_t *model = ghc_model_get(core);
    ghc_network_t *net = ghc_network_get(core);
    const struct ghc_model_target *tg;
    int32_t nt;
    ok(core, ghc_model_targets(model, &tg, &nt));
    ok(core, ghc_network_attach(net, 0, tg, nt));
    struct ghc_param *ps;
    int32_t np;
    ok(core, ghc_network_params(net, 0, &ps, &np));
    for (int32_t k = 0; k < np; k++) {   /* small random factors; DoRA's g near its initial norms */
        ghc_tensor_t *r = ghc_tensor_init(core, GHC_DTYPE_F32, ghc_tensor_ndim(ps[k].value),
                                          ghc_tensor_shape(ps[k].value), GHC_DEVICE_CPU, GHC_ROLE_WORKSPACE);
        ok(core, ghc_op_rand_normal(r, &(struct ghc_rng){ 7, (uint64_t)k << 20 }, NULL));
        bool g = strstr(ps[k].name, "dora_scale") != NULL;
        ok(core, ghc_op_add(ps[k].value, g ? ps[k].value : r, r, g ? 1.0f : 0.0f, g ? 0.05f : 0.2f, NULL));
        ghc_tensor_free(r);
    }
    ok(core, ghc_network_begin_step(net, 1));
    ghc_tensor_t *rt = predict(core);
    int64_t n = ghc_tensor_numel(rt);
    float *ref = malloc((size_t)n * sizeof(float));   /* kept past its core */
    memcpy(ref, ghc_tensor_cdata(rt), (size_t)n * sizeof(float));
    ghc_tensor_free(rt);
    snprintf(ad, sizeof(ad), "%s/adapter.safetensors", dir);
    ok(core, ghc_network_save(net, 0, ad));
    ghc_core_free(core);
    snprintf(mg, sizeof(mg), "%s/merged.safetensors", dir);
    int rc = merge(&out, "--base %s --adapter %s --out %s", fixture("wan22", e2e[_i].base), ad, mg);
    ck_assert_msg(rc == 0, "exit %d: %s", rc, out);
    printf("%s", out);
    free(out);
    core = wan_core(mg, NULL);
    ghc_tensor_t *pred = predict(core);
    ghc_core_t *c0 = wan_core(fixture("wan22", e2e[_i].base), NULL);
    ghc_tensor_t *p0 = predict(c0);
    double e = rel(ghc_tensor_cdata(pred), ref, n), d = rel(ghc_tensor_cdata(p0), ref, n);
    printf("%s: merged vs attached prediction rel err %.3g (the adapter's effect: %.3g)\n", e2e[_i].name, e, d);
    ck_assert_msg(d > 1e-3, "%s: the adapter changes too little to test (%g)", e2e[_i].name, d);
    ck_assert_msg(e < 1e-5, "%s: rel err %g", e2e[_i].name, e);
    ghc_tensor_free(p0);
    ghc_tensor_free(pred);
    free(ref);
    ghc_core_free(c0);
    ghc_core_free(core);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* ---- DoRA as ComfyUI applies it -------------------------------------------------------------- */

/* ComfyUI's weight for one linear with a LoRA-DoRA patch, as its source states it
 * (Comfy-Org/ComfyUI a125cd8): comfy/weight_adapter/lora.py LoRAAdapter.calculate_weight takes
 * alpha = v[2] / mat2.shape[0] (the file's alpha over lora_down's rows) and
 * lora_diff = mm(lora_up, lora_down), then comfy/weight_adapter/base.py weight_decompose:
 * lora_diff *= alpha; weight_calc = weight + lora_diff; on the output axis
 * (dora_scale.shape[0] == weight_calc.shape[0]) weight_norm = the row norms of `weight`, the
 * weight before the patch (not of weight_calc), plus torch.finfo(weight.dtype).eps (f32: the
 * model patcher casts the weight to float32); weight_calc *= dora_scale / weight_norm; with
 * strength 1 the weight becomes weight_calc, otherwise weight += strength (weight_calc - weight).
 * Into res [out, in]; the norms summed in double, the rest in f32. */
static void comfy_dora(const float *w, const float *up, const float *down, float alpha_file, const float *ds, int64_t out,
                       int64_t in, int64_t r, float strength, float *res)
{
    float alpha = alpha_file / (float)r;
    for (int64_t o = 0; o < out; o++) {
        double n2 = 0;
        for (int64_t i = 0; i < in; i++)
            n2 += (double)w[o * in + i] * w[o * in + i];
        float norm = (float)sqrt(n2) + 1.1920929e-07f;
        float sc = ds[o] / norm;
        for (int64_t i = 0; i < in; i++) {
            float d = 0;
            for (int64_t k = 0; k < r; k++)
                d += up[o * r + k] * down[k * in + i];
            float calc = (w[o * in + i] + d * alpha) * sc;
            res[o * in + i] = strength == 1.0f ? calc : w[o * in + i] + strength * (calc - w[o * in + i]);
        }
    }
}

/* One SGD step on the wan22 fixture's case through the network's hooks. */
static void sgd_step(ghc_core_t *core, int64_t step, float lr)
{
    ghc_model_t *model = ghc_model_get(core);
    ghc_network_t *net = ghc_network_get(core);
    struct ghc_adapter_hook hook;
    ok(core, ghc_network_begin_step(net, step));
    ok(core, ghc_network_hook(net, 0, &hook));
    ok(core, ghc_model_set_hook(model, &hook));
    ghc_st_t *cs = open_st(core, fixture("wan22", "case.safetensors"));
    ghc_tensor_t *x = load(core, cs, "x_sigma_700"), *t = load(core, cs, "t_700"), *e = load(core, cs, "text_embedding");
    ghc_tensor_t *v = load(core, cs, "v");
    ghc_tensor_reshape(t, 1, (const int64_t[]){ 1 });
    ghc_tensor_t *out = ghc_tensor_init(core, GHC_DTYPE_F32, 5, ghc_tensor_shape(x), GHC_DEVICE_CPU, GHC_ROLE_ACTIVATIONS);
    ghc_tensor_t *grad = ghc_tensor_init(core, GHC_DTYPE_F32, 5, ghc_tensor_shape(x), GHC_DEVICE_CPU, GHC_ROLE_ACTIVATIONS);
    ghc_tensor_t *loss = ghc_tensor_init(core, GHC_DTYPE_F32, 1, (const int64_t[]){ 1 }, GHC_DEVICE_CPU,
                                         GHC_ROLE_ACTIVATIONS);
    struct ghc_model_batch b = { .noisy = x, .timesteps = t, .text_embed = e };
    ok(core, ghc_model_forward(model, 0, &b, out, true, NULL));
    ok(core, ghc_op_mse_loss(loss, grad, out, v, NULL));
    ok(core, ghc_model_backward(model, 0, grad, NULL, NULL));
    struct ghc_param *ps;
    int32_t np;
    ok(core, ghc_network_params(net, 0, &ps, &np));
    for (int32_t k = 0; k < np; k++) {
        ok(core, ghc_op_add(ps[k].value, ps[k].value, ps[k].grad, 1.0f, -lr, NULL));
        ok(core, ghc_op_fill(ps[k].grad, 0.0, NULL));
    }
    printf("dora step %lld: loss %.6g\n", (long long)step, *(const float *)ghc_tensor_cdata(loss));
    ghc_tensor_t *all[] = { x, t, e, v, out, grad, loss };
    for (size_t k = 0; k < sizeof(all) / sizeof(all[0]); k++)
        ghc_tensor_free(all[k]);
    ghc_st_free(cs);
}

/* The frozen weight and bias of target t (f32 on the CPU; the weight may sit in storage with
 * spare columns, adapter_pad): W dense [out, in] into wd; returns the bias (borrowed). */
static const float *frozen(ghc_core_t *core, int32_t t, const struct ghc_model_target *tg, float *wd)
{
    const ghc_tensor_t *w, *b;
    float sc;
    int64_t in = tg[t].in_features, out = tg[t].out_features;
    ok(core, ghc_model_target_weight(ghc_model_get(core), 0, t, &w, &sc, &b));
    ck_assert(ghc_tensor_dtype(w) == GHC_DTYPE_F32 && sc == 1.0f && ghc_tensor_device(w) == GHC_DEVICE_CPU);
    int64_t rs = ghc_tensor_row_stride(w);
    for (int64_t o = 0; o < out; o++)
        memcpy(wd + o * in, (const float *)ghc_tensor_cdata(w) + o * rs, (size_t)in * sizeof(float));
    return ghc_tensor_cdata(b);
}

/* The weight the network trains with on target t, W' (f32 [out, in] into res): the hook's
 * forward on x = I (y = x W^T + b going in), less the bias. */
static void adapted_weight(ghc_core_t *core, int32_t t, const struct ghc_model_target *tg, float *res)
{
    struct ghc_adapter_hook hook;
    int64_t in = tg[t].in_features, out = tg[t].out_features;
    float *wv = malloc((size_t)(in * out) * sizeof(float));
    const float *bv = frozen(core, t, tg, wv);
    ok(core, ghc_network_hook(ghc_network_get(core), 0, &hook));
    ghc_tensor_t *x = ghc_tensor_init(core, GHC_DTYPE_F32, 3, (const int64_t[]){ 1, in, in }, GHC_DEVICE_CPU,
                                      GHC_ROLE_ACTIVATIONS);
    ghc_tensor_t *y = ghc_tensor_init(core, GHC_DTYPE_F32, 3, (const int64_t[]){ 1, in, out }, GHC_DEVICE_CPU,
                                      GHC_ROLE_ACTIVATIONS);
    float *xv = ghc_tensor_data(x), *yv = ghc_tensor_data(y);
    for (int64_t i = 0; i < in; i++)
        for (int64_t k = 0; k < in; k++)
            xv[i * in + k] = i == k;
    for (int64_t i = 0; i < in; i++)
        for (int64_t o = 0; o < out; o++)
            yv[i * out + o] = wv[o * in + i] + bv[o];
    ck_assert_int_eq(hook.forward(hook.user, t, x, y, false, NULL), 1);
    for (int64_t i = 0; i < in; i++)
        for (int64_t o = 0; o < out; o++)
            res[o * in + i] = yv[i * out + o] - bv[o];
    free(wv);
    ghc_tensor_free(x);
    ghc_tensor_free(y);
}

/* || a - c || / || c - w || summed over targets: how far a is from c, relative to the adapter's
 * effect c - w. */
struct change_err { double num, den; };

static void change_add(struct change_err *e, const float *a, const float *c, const float *w, int64_t n)
{
    for (int64_t k = 0; k < n; k++) {
        e->num += ((double)a[k] - c[k]) * ((double)a[k] - c[k]);
        e->den += ((double)c[k] - w[k]) * ((double)c[k] - w[k]);
    }
}

/* The DoRA file the network writes after a few steps on the tiny model, applied by ComfyUI's
 * formula (comfy_dora above), gives the weight the network trained with and the weight
 * `gh200core merge` writes, at strength 1 and 0.7, within f32 rounding. ComfyUI divides
 * dora_scale by the norms of the base weight, the network g by those of W + delta-W: a file
 * holding g itself is off by a part of the adapter's effect, which the test shows. */
START_TEST(dora_comfyui)
{
    static const float strength[2] = { 1.0f, 0.7f };
    char *dir = tu_tmpdir(), ad[1200], mg[2][1200], *out;
    ghc_core_t *core = wan_core(fixture("wan22", "weights_official.safetensors"),
                                "algo = \"lora\"; rank = 4; alpha = 2.0; dora_wd = true;");
    ghc_model_t *model = ghc_model_get(core);
    ghc_network_t *net = ghc_network_get(core);
    const struct ghc_model_target *tg;
    int32_t nt;
    ok(core, ghc_model_targets(model, &tg, &nt));
    ok(core, ghc_network_attach(net, 0, tg, nt));
    struct ghc_param *ps;
    int32_t np;
    ok(core, ghc_network_params(net, 0, &ps, &np));
    for (int32_t k = 0; k < np; k++) {   /* lora_up off its zeros, so that the steps move every factor */
        if (!strstr(ps[k].name, "lora_up"))
            continue;
        ghc_tensor_t *r = ghc_tensor_init(core, GHC_DTYPE_F32, 2, ghc_tensor_shape(ps[k].value), GHC_DEVICE_CPU,
                                          GHC_ROLE_WORKSPACE);
        ok(core, ghc_op_rand_normal(r, &(struct ghc_rng){ 5, (uint64_t)k << 20 }, NULL));
        ok(core, ghc_op_scale(ps[k].value, r, 0.3f, NULL));
        ghc_tensor_free(r);
    }
    for (int64_t step = 1; step <= 3; step++)
        sgd_step(core, step, 0.5f);
    snprintf(ad, sizeof(ad), "%s/dora.safetensors", dir);
    ok(core, ghc_network_save(net, 0, ad));
    const char *keep = getenv("GHC_LYCORIS_KEEP");   /* the input of make_comfyui_dora_fixture.py */
    if (keep) {
        char kp[1200];
        snprintf(kp, sizeof(kp), "%s/dora_comfyui.safetensors", keep);
        ok(core, ghc_network_save(net, 0, kp));
    }
    ghc_st_t *as = open_st(core, ad);
    ck_assert_str_eq(ghc_st_metadata(as, "gh200core.dora_norm"), "base_weight");
    for (int i = 0; i < 2; i++) {
        snprintf(mg[i], sizeof(mg[i]), "%s/merged%d.safetensors", dir, i);
        int rc = merge(&out, "--base %s --adapter %s --out %s --multiplier %g",
                       fixture("wan22", "weights_official.safetensors"), ad, mg[i], strength[i]);
        ck_assert_msg(rc == 0, "exit %d: %s", rc, out);
        ck_assert_msg(strstr(out, "dora 30") != NULL, "%s", out);
        free(out);
    }
    ghc_st_t *ms[2] = { open_st(core, mg[0]), open_st(core, mg[1]) };
    struct change_err trained = { 0 }, merged[2] = { { 0 } }, old = { 0 };
    for (int32_t t = 0; t < nt; t++) {
        int64_t in = tg[t].in_features, o = tg[t].out_features, n = in * o;
        char mod[160], key[240];
        snprintf(mod, sizeof(mod), "lora_unet_%s", tg[t].name);
        for (char *c = mod + 10; *c; c++)
            if (*c == '.')
                *c = '_';
        snprintf(key, sizeof(key), "%s.lora_up.weight", mod);
        ghc_tensor_t *up = load(core, as, key);
        snprintf(key, sizeof(key), "%s.lora_down.weight", mod);
        ghc_tensor_t *down = load(core, as, key);
        snprintf(key, sizeof(key), "%s.alpha", mod);
        ghc_tensor_t *al = load(core, as, key);
        snprintf(key, sizeof(key), "%s.dora_scale", mod);
        ghc_tensor_t *ds = load(core, as, key);
        float *wv = malloc((size_t)n * sizeof(float));
        frozen(core, t, tg, wv);
        int64_t r = ghc_tensor_dim(down, 0);
        float *comfy = malloc((size_t)n * sizeof(float)), *net_w = malloc((size_t)n * sizeof(float));
        adapted_weight(core, t, tg, net_w);
        for (int i = 0; i < 2; i++) {
            comfy_dora(wv, ghc_tensor_cdata(up), ghc_tensor_cdata(down), *(const float *)ghc_tensor_cdata(al),
                       ghc_tensor_cdata(ds), o, in, r, strength[i], comfy);
            snprintf(key, sizeof(key), "%s.weight", tg[t].name);
            ghc_tensor_t *m = load(core, ms[i], key);
            change_add(&merged[i], ghc_tensor_cdata(m), comfy, wv, n);
            ghc_tensor_free(m);
            if (i == 0)
                change_add(&trained, net_w, comfy, wv, n);
        }
        /* the old file: dora_scale = g, the magnitude the network trains */
        for (int32_t k = 0; k < np; k++) {
            snprintf(key, sizeof(key), "%s.dora_scale", tg[t].name);
            if (strcmp(ps[k].name, key) == 0) {
                comfy_dora(wv, ghc_tensor_cdata(up), ghc_tensor_cdata(down), *(const float *)ghc_tensor_cdata(al),
                           ghc_tensor_cdata(ps[k].value), o, in, r, 1.0f, comfy);
                change_add(&old, comfy, net_w, wv, n);
            }
        }
        free(comfy);
        free(net_w);
        free(wv);
        ghc_tensor_t *all[] = { up, down, al, ds };
        for (size_t k = 0; k < sizeof(all) / sizeof(all[0]); k++)
            ghc_tensor_free(all[k]);
    }
    double et = sqrt(trained.num / trained.den), e1 = sqrt(merged[0].num / merged[0].den);
    double e7 = sqrt(merged[1].num / merged[1].den), eo = sqrt(old.num / old.den);
    printf("DoRA in ComfyUI (its weight_decompose on our file) vs the trained weight: %.3g of the adapter's effect; "
           "vs gh200core merge: %.3g (strength 1), %.3g (0.7); a file holding g itself: %.3g\n", et, e1, e7, eo);
    ck_assert_msg(eo > 1e-3, "the steps moved delta-W too little to tell the norms apart (%g)", eo);
    ck_assert_msg(et < 2e-6, "ComfyUI vs training: %g of the adapter's effect", et);
    ck_assert_msg(e1 < 2e-6 && e7 < 2e-6, "ComfyUI vs gh200core merge: %g, %g", e1, e7);
    ghc_st_free(ms[0]);
    ghc_st_free(ms[1]);
    ghc_st_free(as);
    ghc_core_free(core);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* ComfyUI's own code on a DoRA file of ours (tests/fixtures/lycoris/comfyui_dora.safetensors,
 * from make_comfyui_dora_fixture.py: LoRAAdapter.calculate_weight and weight_decompose of
 * ComfyUI a125cd8, torch 2.9.1, on three linears of the tiny model): comfy_dora, the C
 * transcription above, and `gh200core merge` give its weights at strength 1 and 0.7 within f32
 * rounding. The same file without its gh200core.dora_norm mark is read the LyCORIS way (norms of
 * W + delta-W), which differs from ComfyUI's by a part of the adapter's effect. */
START_TEST(dora_comfyui_fixture)
{
    ghc_core_t *core = ghc_core_init();
    char *dir = tu_tmpdir(), ad[2][1200], mg[1200], *out;
    ghc_st_t *fx = open_st(core, fixture("lycoris", "comfyui_dora.safetensors"));
    ck_assert_str_eq(ghc_st_metadata(fx, "gh200core.dora_norm"), "base_weight");
    for (int marked = 0; marked < 2; marked++) {   /* the adapter's tensors, with and without the mark */
        ghc_st_writer_t *aw = ghc_st_writer_init(core);
        for (int i = 0; i < ghc_st_count(fx); i++) {
            struct ghc_st_info t;
            ghc_st_info_at(fx, i, &t);
            if (strncmp(t.name, "adapter.", 8) == 0)
                ok(core, ghc_st_writer_add_raw(aw, t.name + 8, t.dtype, t.ndim, t.shape, ghc_st_raw(fx, t.name)));
        }
        if (marked)
            ok(core, ghc_st_writer_metadata(aw, "gh200core.dora_norm", "base_weight"));
        snprintf(ad[marked], sizeof(ad[marked]), "%s/adapter%d.safetensors", dir, marked);
        ok(core, ghc_st_writer_finish(aw, ad[marked]));
        ghc_st_writer_free(aw);
    }
    {   /* an unknown reading is refused */
        ghc_st_t *as = open_st(core, ad[0]);
        ghc_st_writer_t *aw = ghc_st_writer_init(core);
        for (int i = 0; i < ghc_st_count(as); i++) {
            struct ghc_st_info t;
            ghc_st_info_at(as, i, &t);
            ok(core, ghc_st_writer_add_raw(aw, t.name, t.dtype, t.ndim, t.shape, ghc_st_raw(as, t.name)));
        }
        ok(core, ghc_st_writer_metadata(aw, "gh200core.dora_norm", "row_norms"));
        char bad[1200];
        snprintf(bad, sizeof(bad), "%s/bad.safetensors", dir);
        ok(core, ghc_st_writer_finish(aw, bad));
        ghc_st_writer_free(aw);
        ghc_st_free(as);
        snprintf(mg, sizeof(mg), "%s/never.safetensors", dir);
        int rc = merge(&out, "--base %s --adapter %s --out %s", fixture("wan22", "weights_official.safetensors"), bad, mg);
        ck_assert_msg(rc != 0 && strstr(out, "gh200core.dora_norm = 'row_norms'") && !exists(mg), "exit %d: %s", rc, out);
        free(out);
    }
    ghc_st_t *bs = open_st(core, fixture("wan22", "weights_official.safetensors"));
    int checked = 0;
    for (int i = 0; i < ghc_st_count(fx); i++) {
        struct ghc_st_info t;
        ghc_st_info_at(fx, i, &t);
        if (strncmp(t.name, "comfyui.", 8) != 0)
            continue;
        char mod[128], key[256];
        const char *sp = strstr(t.name, ".s0.7");   /* "comfyui.<module>.s0.7" or ".s1" */
        if (!sp)
            sp = strrchr(t.name, '.');
        float strength = strtof(sp + 2, NULL);
        snprintf(mod, sizeof(mod), "%.*s", (int)(sp - t.name - 8), t.name + 8);
        snprintf(key, sizeof(key), "%s.weight", mod);
        ghc_tensor_t *want = load(core, fx, t.name), *w = load(core, bs, key);
        int64_t n = ghc_tensor_numel(w), o = ghc_tensor_dim(w, 0), in = ghc_tensor_dim(w, 1);
        /* the C transcription */
        char x[160];
        snprintf(x, sizeof(x), "adapter.lora_unet_%s", mod);
        for (char *c = x + 18; *c; c++)
            if (*c == '.')
                *c = '_';
        ghc_tensor_t *f[4];
        static const char *const sfx[4] = { "lora_up.weight", "lora_down.weight", "alpha", "dora_scale" };
        for (int k = 0; k < 4; k++) {
            char nm[256];
            snprintf(nm, sizeof(nm), "%s.%s", x, sfx[k]);
            f[k] = load(core, fx, nm);
        }
        float *c = malloc((size_t)n * sizeof(float));
        comfy_dora(ghc_tensor_cdata(w), ghc_tensor_cdata(f[0]), ghc_tensor_cdata(f[1]), *(const float *)ghc_tensor_cdata(f[2]),
                   ghc_tensor_cdata(f[3]), o, in, ghc_tensor_dim(f[1], 0), strength, c);
        struct change_err ec = { 0 }, em[2] = { { 0 } };
        change_add(&ec, c, ghc_tensor_cdata(want), ghc_tensor_cdata(w), n);
        /* gh200core merge, with and without the mark */
        for (int marked = 0; marked < 2; marked++) {
            snprintf(mg, sizeof(mg), "%s/merged_%d_%d.safetensors", dir, checked, marked);
            int rc = merge(&out, "--base %s --adapter %s --out %s --multiplier %g",
                           fixture("wan22", "weights_official.safetensors"), ad[marked], mg, strength);
            ck_assert_msg(rc == 0, "exit %d: %s", rc, out);
            free(out);
            ghc_st_t *ms = open_st(core, mg);
            ghc_tensor_t *m = load(core, ms, key);
            change_add(&em[marked], ghc_tensor_cdata(m), ghc_tensor_cdata(want), ghc_tensor_cdata(w), n);
            ghc_tensor_free(m);
            ghc_st_free(ms);
            unlink(mg);
        }
        double e_c = sqrt(ec.num / ec.den), e_m = sqrt(em[1].num / em[1].den), e_l = sqrt(em[0].num / em[0].den);
        printf("%s at strength %g: ComfyUI's code vs comfy_dora %.3g, vs gh200core merge %.3g (read as LyCORIS "
               "would: %.3g) of the adapter's effect\n", mod, strength, e_c, e_m, e_l);
        ck_assert_msg(e_c < 2e-6 && e_m < 2e-6, "%s s%g: %g, %g", mod, strength, e_c, e_m);
        ck_assert_msg(e_l > 1e-3, "%s: the two readings should differ (%g)", mod, e_l);
        for (int k = 0; k < 4; k++)
            ghc_tensor_free(f[k]);
        ghc_tensor_free(want);
        ghc_tensor_free(w);
        free(c);
        checked++;
    }
    ck_assert_int_eq(checked, 4);
    ghc_st_free(bs);
    ghc_st_free(fx);
    ghc_core_free(core);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* A sharded base (index + 2 shards) merges into one file with every tensor. */
START_TEST(sharded_base)
{
    ghc_core_t *core = ghc_core_init();
    char *dir = tu_tmpdir(), p[4][1200], *out;
    ghc_st_t *base = open_st(core, fixture("wan22", "weights_official.safetensors"));
    ghc_st_writer_t *w[2] = { ghc_st_writer_init(core), ghc_st_writer_init(core) };
    FILE *ix;
    snprintf(p[0], sizeof(p[0]), "%s/model.safetensors.index.json", dir);
    ck_assert_ptr_nonnull(ix = fopen(p[0], "w"));
    fprintf(ix, "{\"metadata\": {\"total_size\": 1}, \"weight_map\": {");
    for (int i = 0; i < ghc_st_count(base); i++) {
        struct ghc_st_info t;
        ghc_st_info_at(base, i, &t);
        int s = strncmp(t.name, "blocks.1", 8) >= 0;
        ok(core, ghc_st_writer_add_raw(w[s], t.name, t.dtype, t.ndim, t.shape, ghc_st_raw(base, t.name)));
        fprintf(ix, "%s\"%s\": \"part-%d.safetensors\"", i ? ", " : "", t.name, s);
    }
    fprintf(ix, "}}\n");
    fclose(ix);
    for (int s = 0; s < 2; s++) {
        snprintf(p[1], sizeof(p[1]), "%s/part-%d.safetensors", dir, s);
        ok(core, ghc_st_writer_finish(w[s], p[1]));
        ghc_st_writer_free(w[s]);
    }
    ghc_st_t *cs = open_st(core, fixture("wan22", "case.safetensors"));
    ghc_st_writer_t *aw = ghc_st_writer_init(core);
    copy_renamed(core, cs, aw, "blocks.", "diffusion_model.blocks.", false);
    snprintf(p[2], sizeof(p[2]), "%s/lora.safetensors", dir);
    ok(core, ghc_st_writer_finish(aw, p[2]));
    ghc_st_writer_free(aw);
    snprintf(p[3], sizeof(p[3]), "%s/merged.safetensors", dir);
    int rc = merge(&out, "--base %s --adapter %s --out %s", p[0], p[2], p[3]);
    ck_assert_msg(rc == 0, "exit %d: %s", rc, out);
    free(out);
    ghc_st_t *ms = open_st(core, p[3]);
    ck_assert_int_eq(ghc_st_count(ms), ghc_st_count(base));
    ck_assert_str_eq(ghc_st_metadata(ms, "total_size"), "1");
    ghc_core_t *c2 = wan_core(p[3], NULL);
    ghc_tensor_t *pred = predict(c2), *ref = load(core, cs, "lora_pred_700");
    double e = rel(ghc_tensor_cdata(pred), ghc_tensor_cdata(ref), ghc_tensor_numel(ref));
    printf("sharded base: prediction rel err %.3g\n", e);
    ck_assert_msg(e < 1e-5, "rel err %g", e);
    ghc_tensor_free(pred);
    ghc_tensor_free(ref);
    ghc_core_free(c2);
    ghc_st_free(ms);
    ghc_st_free(cs);
    ghc_st_free(base);
    ghc_core_free(core);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* ---- bad input ---------------------------------------------------------------------------------- */

START_TEST(errors)
{
    ghc_core_t *core = ghc_core_init();
    char *dir = tu_tmpdir(), base[1200], ad[1200], outp[1200], bad[1200], *out;
    ghc_st_t *fx = open_st(core, fixture("lycoris", "lora_r4.safetensors"));
    ghc_tensor_t *w = load(core, fx, "case.w");   /* [48, 64] */
    ghc_st_writer_t *bw = ghc_st_writer_init(core);
    ok(core, ghc_st_writer_add(bw, "blocks.0.self_attn.q.weight", w));
    ok(core, ghc_st_writer_add(bw, "blocks.0.self_attn.k.weight", w));
    static const uint8_t fp8_zeros[48 * 64];
    ok(core, ghc_st_writer_add_raw(bw, "blocks.0.ffn.0.weight", GHC_DTYPE_F8_E4M3, 2, (const int64_t[]){ 48, 64 },
                                   fp8_zeros));
    ok(core, ghc_st_writer_add_raw(bw, "blocks.0.ffn.0.scale_weight", GHC_DTYPE_F32, 0, NULL, &(float){ 1.0f }));
    snprintf(base, sizeof(base), "%s/base.safetensors", dir);
    ok(core, ghc_st_writer_finish(bw, base));
    ghc_st_writer_free(bw);
    ghc_st_writer_t *aw = ghc_st_writer_init(core);
    copy_renamed(core, fx, aw, "diffusion_model.", "diffusion_model.", false);
    snprintf(ad, sizeof(ad), "%s/ok.safetensors", dir);
    ok(core, ghc_st_writer_finish(aw, ad));
    ghc_st_writer_free(aw);
    snprintf(outp, sizeof(outp), "%s/out.safetensors", dir);

    /* an existing --out: exit 6, untouched */
    free(tu_write(dir, "out.safetensors", "keep me"));
    ck_assert_int_eq(merge(&out, "--base %s --adapter %s --out %s", base, ad, outp), 6);
    ck_assert_msg(strstr(out, "exists") != NULL, "%s", out);
    free(out);
    FILE *f = fopen(outp, "r");
    char buf[16] = { 0 };
    ck_assert_ptr_nonnull(f);
    ck_assert_ptr_nonnull(fgets(buf, sizeof(buf), f));
    fclose(f);
    ck_assert_str_eq(buf, "keep me");
    unlink(outp);

    /* missing files: exit 5 */
    ck_assert_int_eq(merge(&out, "--base %s/none.safetensors --adapter %s --out %s", dir, ad, outp), 5);
    ck_assert_msg(strstr(out, "none.safetensors") != NULL, "%s", out);
    free(out);
    ck_assert_int_eq(merge(&out, "--base %s --adapter %s/none.safetensors --out %s", base, dir, outp), 5);
    free(out);
    ck_assert(!exists(outp));

    /* adapter modules: no base weight, another shape, incomplete, fp8 base */
    static const struct {
        const char *from, *to;
        int drop;          /* drop tensors containing this suffix: 1 lora_up */
        const char *want[3];
        int code;
    } cases[] = {
        { "diffusion_model.blocks.0.self_attn.q", "diffusion_model.blocks.7.self_attn.q", 0,
          { "'diffusion_model.blocks.7.self_attn.q'", "matches no weight", NULL }, 5 },
        { "diffusion_model.blocks.0.self_attn.q", "diffusion_model.blocks.0.ffn.0", 0,
          { "blocks.0.ffn.0.weight", "F8_E4M3", NULL }, 1 },
        { "diffusion_model.blocks.0.self_attn.q", "diffusion_model.blocks.0.self_attn.q", 1,
          { "'diffusion_model.blocks.0.self_attn.q' is missing", "lora_up", NULL }, 5 },
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        aw = ghc_st_writer_init(core);
        for (int i = 0; i < ghc_st_count(fx); i++) {
            struct ghc_st_info t;
            ghc_st_info_at(fx, i, &t);
            if (strncmp(t.name, cases[c].from, strlen(cases[c].from)) != 0 ||
                (cases[c].drop && strstr(t.name, "lora_up")))
                continue;
            char nm[256];
            snprintf(nm, sizeof(nm), "%s%s", cases[c].to, t.name + strlen(cases[c].from));
            ok(core, ghc_st_writer_add_raw(aw, nm, t.dtype, t.ndim, t.shape, ghc_st_raw(fx, t.name)));
        }
        snprintf(bad, sizeof(bad), "%s/bad%zu.safetensors", dir, c);
        ok(core, ghc_st_writer_finish(aw, bad));
        ghc_st_writer_free(aw);
        int rc = merge(&out, "--base %s --adapter %s --out %s", base, bad, outp);
        printf("bad case %zu: exit %d: %s", c, rc, out);
        ck_assert_msg(rc == cases[c].code, "case %zu: exit %d: %s", c, rc, out);
        for (int k = 0; k < 3 && cases[c].want[k]; k++)
            ck_assert_msg(strstr(out, cases[c].want[k]) != NULL, "case %zu: '%s' not in: %s", c, cases[c].want[k], out);
        free(out);
        ck_assert(!exists(outp));
    }
    /* another shape: a base whose q is [64, 48] */
    bw = ghc_st_writer_init(core);
    ok(core, ghc_st_writer_add_raw(bw, "blocks.0.self_attn.q.weight", GHC_DTYPE_F32, 2, (const int64_t[]){ 64, 48 },
                                   ghc_tensor_cdata(w)));
    snprintf(bad, sizeof(bad), "%s/base_t.safetensors", dir);
    ok(core, ghc_st_writer_finish(bw, bad));
    ghc_st_writer_free(bw);
    ck_assert_int_eq(merge(&out, "--base %s --adapter %s --out %s", bad, ad, outp), 5);
    ck_assert_msg(strstr(out, "diffusion_model.blocks.0.self_attn.q") && strstr(out, "[48, 64]") &&
                  strstr(out, "[64, 48]") && strstr(out, "blocks.0.self_attn.q.weight"), "%s", out);
    free(out);
    ck_assert(!exists(outp));

    /* usage: exit 2 */
    ck_assert_int_eq(merge(&out, "--base %s --adapter %s", base, ad), 2);
    free(out);
    ck_assert_int_eq(merge(&out, "--base %s --adapter %s --out %s --dtype f8", base, ad, outp), 2);
    free(out);
    ck_assert_int_eq(merge(&out, "--base %s --adapter %s --out %s --multiplier x", base, ad, outp), 2);
    free(out);
    ck_assert(!exists(outp));
    ghc_tensor_free(w);
    ghc_st_free(fx);
    ghc_core_free(core);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* A NaN or an infinity in the adapter's factors, in its alpha or in a base weight merged into
 * is an error naming the file and the tensor, and nothing is written (it used to give a merged
 * model with non-finite weights, exit 0). */
START_TEST(nonfinite)
{
    ghc_core_t *core = ghc_core_init();
    char *dir = tu_tmpdir(), base[1200], ad[1200], outp[1200], *out;
    ghc_st_t *fx = open_st(core, fixture("lycoris", "lora_r4.safetensors"));
    ghc_tensor_t *w = load(core, fx, "case.w");   /* [48, 64] */
    snprintf(outp, sizeof(outp), "%s/out.safetensors", dir);
    static const struct { const char *tensor; float v; bool in_base; } cases[] = {
        { "lora_down.weight", NAN, false }, { "lora_up.weight", INFINITY, false }, { ".alpha", NAN, false },
        { "blocks.0.self_attn.q.weight", -INFINITY, true },
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        ghc_st_writer_t *bw = ghc_st_writer_init(core), *aw = ghc_st_writer_init(core);
        ghc_tensor_t *wq = ghc_tensor_init(core, GHC_DTYPE_F32, 2, ghc_tensor_shape(w), GHC_DEVICE_CPU,
                                           GHC_ROLE_WORKSPACE);
        ok(core, ghc_tensor_convert_cpu(wq, w, 1.0f));
        if (cases[c].in_base)
            ((float *)ghc_tensor_data(wq))[5] = cases[c].v;
        ok(core, ghc_st_writer_add(bw, "blocks.0.self_attn.q.weight", wq));
        snprintf(base, sizeof(base), "%s/base%zu.safetensors", dir, c);
        ok(core, ghc_st_writer_finish(bw, base));
        ghc_st_writer_free(bw);
        ghc_tensor_free(wq);
        const char *bad = NULL;
        for (int i = 0; i < ghc_st_count(fx); i++) {
            struct ghc_st_info t;
            ghc_st_info_at(fx, i, &t);
            if (strncmp(t.name, "diffusion_model.blocks.0.self_attn.q", 36) != 0)
                continue;
            if (cases[c].in_base || !strstr(t.name, cases[c].tensor)) {
                ok(core, ghc_st_writer_add_raw(aw, t.name, t.dtype, t.ndim, t.shape, ghc_st_raw(fx, t.name)));
                continue;
            }
            ghc_tensor_t *f = load(core, fx, t.name);
            ((float *)ghc_tensor_data(f))[0] = cases[c].v;
            ok(core, ghc_st_writer_add(aw, t.name, f));
            ghc_tensor_free(f);
            bad = t.name;
        }
        ck_assert(cases[c].in_base || bad);
        snprintf(ad, sizeof(ad), "%s/ad%zu.safetensors", dir, c);
        ok(core, ghc_st_writer_finish(aw, ad));
        ghc_st_writer_free(aw);
        char want[1400];
        snprintf(want, sizeof(want), "%s: tensor '%s': element %d is %s", cases[c].in_base ? base : ad,
                 cases[c].in_base ? cases[c].tensor : bad, cases[c].in_base ? 5 : 0,
                 isnan(cases[c].v) ? "nan" : cases[c].v > 0 ? "inf" : "-inf");
        int rc = merge(&out, "--base %s --adapter %s --out %s", base, ad, outp);
        ck_assert_msg(rc == 5 && strstr(out, want), "case %zu: exit %d, want '%s': %s", c, rc, want, out);
        free(out);
        ck_assert(!exists(outp));
    }
    /* finite files, an alpha and a multiplier that overflow the merged weight: refused too */
    snprintf(base, sizeof(base), "%s/base0.safetensors", dir);
    ghc_st_writer_t *aw = ghc_st_writer_init(core);
    for (int i = 0; i < ghc_st_count(fx); i++) {
        struct ghc_st_info t;
        ghc_st_info_at(fx, i, &t);
        if (strncmp(t.name, "diffusion_model.blocks.0.self_attn.q", 36) == 0 && !strstr(t.name, ".alpha"))
            ok(core, ghc_st_writer_add_raw(aw, t.name, t.dtype, t.ndim, t.shape, ghc_st_raw(fx, t.name)));
    }
    ok(core, ghc_st_writer_add_raw(aw, "diffusion_model.blocks.0.self_attn.q.alpha", GHC_DTYPE_F32, 0, NULL,
                                   &(float){ 3e38f }));
    snprintf(ad, sizeof(ad), "%s/huge.safetensors", dir);
    ok(core, ghc_st_writer_finish(aw, ad));
    ghc_st_writer_free(aw);
    int rc = merge(&out, "--base %s --adapter %s --out %s --multiplier 100000", base, ad, outp);
    ck_assert_msg(rc != 0 && strstr(out, "merge: tensor 'blocks.0.self_attn.q.weight': element ") &&
                  strstr(out, "after the merge (multiplier 100000)"), "exit %d: %s", rc, out);
    free(out);
    ck_assert(!exists(outp));
    ghc_tensor_free(w);
    ghc_st_free(fx);
    ghc_core_free(core);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

static Suite *merge_suite(void)
{
    Suite *s = suite_create("merge");
    TCase *tc = tcase_create("merge");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, golden, 0, N_GCASES);
    tcase_add_test(tc, wan22_fixture_lora);
    tcase_add_loop_test(tc, wan22_attached_vs_merged, 0, (int)(sizeof(e2e) / sizeof(e2e[0])));
    tcase_add_test(tc, dora_comfyui);
    tcase_add_test(tc, dora_comfyui_fixture);
    tcase_add_test(tc, sharded_base);
    tcase_add_test(tc, errors);
    tcase_add_test(tc, nonfinite);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tu_run_suite(merge_suite(), false);
}
