/* test_wan22.c: the wan22 model plugin against the golden fixtures of tests/fixtures/wan22
 * (diffusers + peft, tests/fixtures/README.md), on the CPU in f32, and on a GPU in bf16 when
 * one is present (skipped otherwise).
 *
 * The plugin is driven two ways: as a plugin (loaded by a run from plugins/.libs, called
 * through the core wrappers of model.h: forward, backward, hooks, experts), and, for what the
 * plugin API does not show (config detection from bare shape lists, the loaded tensors, the
 * intermediates), through its internal functions: this test links the plugin's sources.
 *
 * The LoRA of the fixtures is a test-only adapter hook written here with ghc_op_gemm:
 *   forward  y += s (x A^T) B^T
 *   backward dB += s dy^T (x A^T),  dA += s (dy B)^T x,  dx += s (dy B) A.
 * Errors are ||got - ref|| / ||ref|| over a whole tensor. */
#include <config.h>

#include <math.h>

#include <gh200core/gh200core.h>
#include <gh200core/ops.h>
#include <gh200core/safetensors.h>

#include "../plugins/wan22/wan22_impl.h"
#ifdef GHC_HAVE_CUDA
#include "../kernels/cuda/device.h"
#endif
#include "testutil.h"

#define TOL_FWD   1e-5     /* f32 forward vs diffusers */
#define TOL_GRAD  1e-4     /* f32 gradients vs diffusers + peft */
#define TOL_BF16  2e-2     /* bf16 GPU path vs the f32 fixture */
/* One LoRA gradient tensor may be off by more than the set of 60 as a whole: the cross-attention
 * q/k gradients are small differences (505 identical pad keys), and fp32 rounding differs
 * between our kernels and torch's there (the fixture itself is 5e-5 off a float64 run on them,
 * ours up to 2e-4). Per tensor we allow 5x, as tests/fixtures/README.md suggests. */
#define GRAD_TENSOR_FACTOR 5.0

static bool have_gpu;

/* ---- helpers ------------------------------------------------------------------------------- */

static char *fixture(const char *name)
{
    static char buf[4][1024];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, 1024, "%s/tests/fixtures/wan22/%s", tu_env("GHC_TOP_SRCDIR"), name);
    return p;
}

static void ok(ghc_core_t *core, int rc)
{
    ck_assert_msg(rc == 0, "failed (%d): %s", rc, ghc_error_message(core));
}

/* A core with a memory policy (host, or device for gpu; mp_extra: more keys of its section)
 * and (when model_cfg is not NULL) a wan22 model from the config text of the model section's
 * body. */
static ghc_core_t *run_core_mp(const char *model_cfg, bool gpu, const char *mp_extra)
{
    ghc_core_t *core = ghc_core_init();
    ck_assert_ptr_nonnull(core);
    ok(core, ghc_plugin_add_path(core, tu_env("GHC_BUILD_PLUGINS")));
    char text[4096];
    snprintf(text, sizeof(text), "mempolicy = { plugin = \"%s\"; %s };\n%s%s%s", gpu ? "device" : "host",
             mp_extra ? mp_extra : "", model_cfg ? "model = { plugin = \"wan22\"; " : "", model_cfg ? model_cfg : "",
             model_cfg ? " };\n" : "");
    ok(core, ghc_config_load_string(core, text, "test.cfg", NULL, NULL, 0));
    ok(core, ghc_run_init(core));
    return core;
}

static ghc_core_t *run_core(const char *model_cfg, bool gpu)
{
    return run_core_mp(model_cfg, gpu, NULL);
}

/* The fixture model: official weights, 2 heads of 32. */
static ghc_core_t *fixture_core_mp(const char *extra, bool gpu, const char *mp_extra)
{
    char cfg[2048];
    snprintf(cfg, sizeof(cfg), "checkpoint = \"%s\"; heads = 2; dtype = \"%s\"; device = %d; %s",
             fixture("weights_official.safetensors"), gpu ? "bf16" : "f32", gpu ? 0 : -1, extra ? extra : "");
    return run_core_mp(cfg, gpu, mp_extra);
}

static ghc_core_t *fixture_core(const char *extra, bool gpu)
{
    return fixture_core_mp(extra, gpu, NULL);
}

static ghc_tensor_t *load(ghc_core_t *core, ghc_st_t *st, const char *name)
{
    ghc_tensor_t *t = ghc_st_load(st, name, GHC_DTYPE_F32, GHC_ROLE_WORKSPACE);
    ck_assert_msg(t != NULL, "%s: %s", name, ghc_error_message(core));
    return t;
}

static ghc_tensor_t *mk(ghc_core_t *core, int device, int ndim, const int64_t *shape)
{
    ghc_tensor_t *t = ghc_tensor_init(core, GHC_DTYPE_F32, ndim, shape, device, GHC_ROLE_ACTIVATIONS);
    ck_assert_msg(t != NULL, "tensor: %s", ghc_error_message(core));
    return t;
}

static ghc_tensor_t *like(ghc_core_t *core, const ghc_tensor_t *t, int device)
{
    return mk(core, device, ghc_tensor_ndim(t), ghc_tensor_shape(t));
}

/* t on `device` (a copy; the caller frees). */
static ghc_tensor_t *to_dev(ghc_core_t *core, const ghc_tensor_t *t, int device)
{
    ghc_tensor_t *d = like(core, t, device);
    ok(core, ghc_op_copy(d, t, NULL));
    /* the copy is asynchronous on the CUDA side of it: wait there */
    ok(core, ghc_op_sync(core, device == GHC_DEVICE_CPU ? ghc_tensor_device(t) : device, NULL));
    return d;
}

/* ||got - ref|| / ||ref||; got on any device, f32; ref f32 on the CPU, same numel. */
static double rel_err(ghc_core_t *core, const ghc_tensor_t *got, const ghc_tensor_t *ref)
{
    ck_assert_int_eq(ghc_tensor_numel(got), ghc_tensor_numel(ref));
    ghc_tensor_t *h = ghc_tensor_device(got) == GHC_DEVICE_CPU ? NULL : to_dev(core, got, GHC_DEVICE_CPU);
    const float *a = ghc_tensor_cdata(h ? h : got), *b = ghc_tensor_cdata(ref);
    double num = 0, den = 0;
    for (int64_t i = 0; i < ghc_tensor_numel(ref); i++) {
        ck_assert_msg(isfinite(a[i]), "element %lld is %g", (long long)i, a[i]);
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    ghc_tensor_free(h);
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static float scalar(ghc_core_t *core, const ghc_tensor_t *t)
{
    ghc_tensor_t *h = ghc_tensor_device(t) == GHC_DEVICE_CPU ? NULL : to_dev(core, t, GHC_DEVICE_CPU);
    float v = *(const float *)ghc_tensor_cdata(h ? h : t);
    ghc_tensor_free(h);
    return v;
}

/* ---- the fixture case ------------------------------------------------------------------------ */

struct fcase {
    ghc_st_t     *st;
    ghc_tensor_t *x700, *x150, *t700, *t150, *text, *v;   /* on the model's device */
};

static void case_open(ghc_core_t *core, struct fcase *c, int device)
{
    c->st = ghc_st_open(core, fixture("case.safetensors"));
    ck_assert_msg(c->st != NULL, "%s", ghc_error_message(core));
    const char *names[] = { "x_sigma_700", "x_sigma_150", "t_700", "t_150", "text_embedding", "v" };
    ghc_tensor_t **slots[] = { &c->x700, &c->x150, &c->t700, &c->t150, &c->text, &c->v };
    for (int i = 0; i < 6; i++) {
        ghc_tensor_t *h = load(core, c->st, names[i]);
        if (ghc_tensor_ndim(h) == 0)
            ghc_tensor_reshape(h, 1, (const int64_t[]){ 1 });
        *slots[i] = device == GHC_DEVICE_CPU ? h : to_dev(core, h, device);
        if (device != GHC_DEVICE_CPU)
            ghc_tensor_free(h);
    }
}

static void case_close(struct fcase *c)
{
    ghc_tensor_t *all[] = { c->x700, c->x150, c->t700, c->t150, c->text, c->v };
    for (int i = 0; i < 6; i++)
        ghc_tensor_free(all[i]);
    ghc_st_free(c->st);
}

static struct ghc_model_batch batch_of(struct fcase *c, bool t700)
{
    return (struct ghc_model_batch){ .noisy = t700 ? c->x700 : c->x150, .timesteps = t700 ? c->t700 : c->t150,
                                     .text_embed = c->text };
}

/* ---- a test-only LoRA hook -------------------------------------------------------------------- */

struct lora {
    ghc_core_t   *core;
    int           device;
    int32_t       n;
    float         s;
    ghc_tensor_t **A, **B, **dA, **dB;   /* per target, f32 on the device */
    int           calls_fwd, calls_bwd;
};

static void lora_init(struct lora *l, ghc_core_t *core, ghc_model_t *model, ghc_st_t *st, int device)
{
    const struct ghc_model_target *tg;
    *l = (struct lora){ .core = core, .device = device, .s = 2.0f };
    ok(core, ghc_model_targets(model, &tg, &l->n));
    ck_assert_int_eq(l->n, 30);
    l->A = calloc((size_t)l->n, sizeof(ghc_tensor_t *));
    l->B = calloc((size_t)l->n, sizeof(ghc_tensor_t *));
    l->dA = calloc((size_t)l->n, sizeof(ghc_tensor_t *));
    l->dB = calloc((size_t)l->n, sizeof(ghc_tensor_t *));
    for (int32_t i = 0; i < l->n; i++) {
        char nm[128];
        snprintf(nm, sizeof(nm), "%s.alpha", tg[i].name);
        ghc_tensor_t *al = load(core, st, nm);
        snprintf(nm, sizeof(nm), "%s.lora_A", tg[i].name);
        ghc_tensor_t *a = load(core, st, nm);
        snprintf(nm, sizeof(nm), "%s.lora_B", tg[i].name);
        ghc_tensor_t *b = load(core, st, nm);
        ck_assert_int_eq(ghc_tensor_dim(a, 1), tg[i].in_features);
        ck_assert_int_eq(ghc_tensor_dim(b, 0), tg[i].out_features);
        l->s = *(const float *)ghc_tensor_cdata(al) / (float)ghc_tensor_dim(a, 0);
        l->A[i] = to_dev(core, a, device);
        l->B[i] = to_dev(core, b, device);
        l->dA[i] = like(core, a, device);
        l->dB[i] = like(core, b, device);
        ok(core, ghc_op_fill(l->dA[i], 0.0, NULL));
        ok(core, ghc_op_fill(l->dB[i], 0.0, NULL));
        ghc_tensor_free(al);
        ghc_tensor_free(a);
        ghc_tensor_free(b);
    }
}

static void lora_free(struct lora *l)
{
    for (int32_t i = 0; i < l->n; i++) {
        ghc_tensor_free(l->A[i]);
        ghc_tensor_free(l->B[i]);
        ghc_tensor_free(l->dA[i]);
        ghc_tensor_free(l->dB[i]);
    }
    free(l->A);
    free(l->B);
    free(l->dA);
    free(l->dB);
}

/* A 2-D view [rows, cols] of t's memory. */
static ghc_tensor_t *view2(const ghc_tensor_t *t, int64_t cols)
{
    int64_t shape[2] = { ghc_tensor_numel(t) / cols, cols };
    return ghc_tensor_wrap(ghc_tensor_core(t), ghc_tensor_dtype(t), 2, shape, ghc_tensor_device(t),
                           (void *)ghc_tensor_cdata(t));
}

/* x as f32 [rows, in] (a cast copy for bf16 x; *tmp to free). */
static ghc_tensor_t *x_f32(struct lora *l, const ghc_tensor_t *x, int64_t in, ghc_tensor_t **tmp)
{
    *tmp = NULL;
    if (ghc_tensor_dtype(x) != GHC_DTYPE_F32) {
        *tmp = like(l->core, x, ghc_tensor_device(x));
        if (ghc_op_cast(*tmp, x, 1.0f, NULL, NULL) < 0)
            return NULL;
        x = *tmp;
    }
    return view2(x, in);
}

/* Every target adapted; the part only ever added after the model's GEMM. */
static int lora_plan(void *user, int32_t target, struct ghc_adapter_plan *out)
{
    (void)user;
    (void)target;
    out->adapted = true;
    return 1;
}

static int lora_fwd(void *user, int32_t target, const ghc_tensor_t *x, ghc_tensor_t *y, bool write, void *stream)
{
    ck_assert(!write);
    struct lora *l = user;
    ghc_tensor_t *A = l->A[target], *B = l->B[target], *tmp;
    int64_t in = ghc_tensor_dim(A, 1), out = ghc_tensor_dim(B, 0), r = ghc_tensor_dim(A, 0);
    ghc_tensor_t *x2 = x_f32(l, x, in, &tmp), *y2 = view2(y, out);
    ghc_tensor_t *xa = mk(l->core, ghc_tensor_device(x), 2, (const int64_t[]){ ghc_tensor_dim(x2, 0), r });
    int rc = ghc_op_gemm(xa, x2, A, &(struct ghc_gemm){ .trans_b = true }, stream);
    if (rc == 0)
        rc = ghc_op_gemm(y2, xa, B, &(struct ghc_gemm){ .trans_b = true, .alpha = l->s, .beta = 1.0f }, stream);
    ghc_tensor_free(xa);
    ghc_tensor_free(y2);
    ghc_tensor_free(x2);
    ghc_tensor_free(tmp);
    l->calls_fwd++;
    return rc < 0 ? rc : 1;
}

static int lora_bwd(void *user, int32_t target, const ghc_tensor_t *x, const ghc_tensor_t *dy, const ghc_tensor_t *g,
                    ghc_tensor_t *dx, bool accumulate, void *stream)
{
    (void)g;
    ck_assert(accumulate);
    struct lora *l = user;
    ghc_tensor_t *A = l->A[target], *B = l->B[target], *tmp;
    int64_t in = ghc_tensor_dim(A, 1), out = ghc_tensor_dim(B, 0), r = ghc_tensor_dim(A, 0);
    ghc_tensor_t *x2 = x_f32(l, x, in, &tmp), *dy2 = view2(dy, out), *dx2 = dx ? view2(dx, in) : NULL;
    int64_t rows = ghc_tensor_dim(x2, 0);
    ghc_tensor_t *xa = mk(l->core, ghc_tensor_device(x), 2, (const int64_t[]){ rows, r });
    ghc_tensor_t *dyb = mk(l->core, ghc_tensor_device(x), 2, (const int64_t[]){ rows, r });
    int rc = 0;
    if (!rc) rc = ghc_op_gemm(xa, x2, A, &(struct ghc_gemm){ .trans_b = true }, stream);
    if (!rc) rc = ghc_op_gemm(l->dB[target], dy2, xa, &(struct ghc_gemm){ .trans_a = true, .alpha = l->s, .beta = 1 },
                              stream);
    if (!rc) rc = ghc_op_gemm(dyb, dy2, B, NULL, stream);
    if (!rc) rc = ghc_op_gemm(l->dA[target], dyb, x2, &(struct ghc_gemm){ .trans_a = true, .alpha = l->s, .beta = 1 },
                              stream);
    if (!rc && dx2)
        rc = ghc_op_gemm(dx2, dyb, A, &(struct ghc_gemm){ .alpha = l->s, .beta = 1 }, stream);
    ghc_tensor_free(dyb);
    ghc_tensor_free(xa);
    ghc_tensor_free(dx2);
    ghc_tensor_free(dy2);
    ghc_tensor_free(x2);
    ghc_tensor_free(tmp);
    l->calls_bwd++;
    return rc < 0 ? rc : 1;
}

static struct ghc_adapter_hook lora_hook(struct lora *l)
{
    return (struct ghc_adapter_hook){ .struct_size = sizeof(struct ghc_adapter_hook), .user = l, .plan = lora_plan,
                                      .forward = lora_fwd, .backward = lora_bwd };
}

/* ---- config detection ------------------------------------------------------------------------ */

/* A file's tensor list for dims d (official or diffusers names, with a prefix). */
struct shapes {
    struct wan22_tspec       *spec;
    struct wan22_tensor_desc *desc;
    char                    (*names)[128];
    int                       n;
};

static void shapes_make(ghc_core_t *core, struct shapes *s, const struct wan22_dims *d, bool diffusers,
                        const char *prefix)
{
    ok(core, wan22_tensor_list(core, d, NULL, &s->spec, &s->n));
    s->desc = calloc((size_t)s->n, sizeof(*s->desc));
    s->names = calloc((size_t)s->n, sizeof(*s->names));
    for (int i = 0; i < s->n; i++) {
        char nm[128];
        if (diffusers)
            wan22_name_diffusers(s->spec[i].name, nm, sizeof(nm));
        else
            snprintf(nm, sizeof(nm), "%s", s->spec[i].name);
        snprintf(s->names[i], sizeof(s->names[i]), "%s%s", prefix, nm);
        s->desc[i] = (struct wan22_tensor_desc){ s->names[i], s->spec[i].ndim, s->spec[i].shape };
    }
}

static void shapes_free(struct shapes *s)
{
    free(s->spec);
    free(s->desc);
    free(s->names);
}

static int64_t shapes_params(const struct shapes *s)
{
    int64_t total = 0;
    for (int i = 0; i < s->n; i++) {
        int64_t p = 1;
        for (int k = 0; k < s->spec[i].ndim; k++)
            p *= s->spec[i].shape[k];
        total += p;
    }
    return total;
}

START_TEST(detect_variants)
{
    /* dims, tensor counts and parameter counts of the released configs (their config.json files) */
    static const struct {
        struct wan22_dims d;
        enum wan22_variant v;
        int tensors;
        int64_t params;
    } cases[] = {
        { { 5120, 13824, 40, 40, 16, 16, 4096, 256 }, WAN22_A14B_T2V, 1095, INT64_C(14288491584) },
        { { 5120, 13824, 40, 40, 36, 16, 4096, 256 }, WAN22_A14B_I2V, 1095, INT64_C(14288901184) },
        { { 3072, 14336, 24, 30, 48, 48, 4096, 256 }, WAN22_TI2V_5B, 825, INT64_C(4999787712) },
        { { 1536, 8960, 12, 30, 16, 16, 4096, 256 }, WAN21_T2V_1_3B, 825, INT64_C(1418996800) },
        { { 256, 704, 2, 3, 16, 16, 4096, 256 }, WAN22_CUSTOM, 96, INT64_C(4347008) },
        { { 256, 704, 2, 3, 36, 16, 4096, 256 }, WAN22_CUSTOM, 96, INT64_C(4367488) },
        { { 256, 704, 2, 3, 48, 48, 4096, 256 }, WAN22_CUSTOM, 96, INT64_C(4412672) },
    };
    static const char *const prefixes[] = { "", "model.diffusion_model.", "diffusion_model." };
    ghc_core_t *core = ghc_core_init();
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++)
        for (int layout = 0; layout < 2; layout++)
            for (int p = 0; p < 3; p++) {
                struct shapes s;
                struct wan22_detected det;
                shapes_make(core, &s, &cases[c].d, layout == 1, prefixes[p]);
                ck_assert_int_eq(s.n, cases[c].tensors);
                ck_assert_int_eq(shapes_params(&s), cases[c].params);
                ok(core, wan22_detect(core, "f", s.desc, s.n, 0, &det));
                ck_assert_int_eq(det.variant, cases[c].v);
                ck_assert_int_eq(det.layout, layout);
                ck_assert_str_eq(det.prefix, prefixes[p]);
                ck_assert_mem_eq(&det.dims, &cases[c].d, sizeof(det.dims));
                shapes_free(&s);
            }
    /* the fixture's config: head dim 32 needs the head count */
    struct wan22_dims tiny = { 64, 176, 2, 3, 16, 16, 32, 256 };
    struct shapes s;
    struct wan22_detected det;
    shapes_make(core, &s, &tiny, false, "");
    ck_assert_int_eq(wan22_detect(core, "tiny.safetensors", s.desc, s.n, 0, &det), GHC_EFORMAT);
    ck_assert_msg(strstr(ghc_error_message(core), "'heads'"), "%s", ghc_error_message(core));
    ok(core, wan22_detect(core, "tiny.safetensors", s.desc, s.n, 2, &det));
    ck_assert_mem_eq(&det.dims, &tiny, sizeof(tiny));
    ck_assert_int_eq(det.variant, WAN22_CUSTOM);
    shapes_free(&s);
    ghc_core_free(core);
}
END_TEST

START_TEST(detect_errors)
{
    ghc_core_t *core = ghc_core_init();
    struct wan22_dims d = { 1536, 8960, 12, 30, 16, 16, 4096, 256 };
    struct shapes s;
    struct wan22_detected det;
    const char *msg;

    /* a transposed FFN weight */
    shapes_make(core, &s, &d, false, "model.diffusion_model.");
    for (int i = 0; i < s.n; i++)
        if (strcmp(s.spec[i].name, "blocks.7.ffn.2.weight") == 0) {
            s.spec[i].shape[0] = 8960;
            s.spec[i].shape[1] = 1536;
        }
    ck_assert_int_eq(wan22_detect(core, "bad.safetensors", s.desc, s.n, 0, &det), GHC_EFORMAT);
    msg = ghc_error_message(core);
    ck_assert_msg(strstr(msg, "bad.safetensors") && strstr(msg, "'model.diffusion_model.blocks.7.ffn.2.weight'") &&
                  strstr(msg, "has shape [8960, 1536], expected [1536, 8960]"), "%s", msg);
    shapes_free(&s);

    /* a missing tensor, diffusers names */
    shapes_make(core, &s, &d, true, "");
    for (int i = 0; i < s.n; i++)
        if (strcmp(s.spec[i].name, "blocks.29.norm3.bias") == 0)
            s.desc[i].name = "blocks.29.norm2.bias_renamed";
    ck_assert_int_eq(wan22_detect(core, "x.safetensors", s.desc, s.n, 0, &det), GHC_EFORMAT);
    msg = ghc_error_message(core);
    ck_assert_msg(strstr(msg, "missing tensor 'blocks.29.norm2.bias' (expected shape [1536])"), "%s", msg);
    shapes_free(&s);

    /* not a Wan checkpoint; a Wan2.1 I2V image branch */
    struct wan22_tensor_desc other[] = { { "encoder.weight", 1, (const int64_t[]){ 4 } } };
    ck_assert_int_eq(wan22_detect(core, "vae.safetensors", other, 1, 0, &det), GHC_EFORMAT);
    ck_assert_msg(strstr(ghc_error_message(core), "not a Wan2.x DiT"), "%s", ghc_error_message(core));
    shapes_make(core, &s, &d, false, "");
    s.desc[5].name = "img_emb.proj.0.weight";
    ck_assert_int_eq(wan22_detect(core, "i2v21.safetensors", s.desc, s.n, 0, &det), GHC_EUNSUPPORTED);
    shapes_free(&s);
    ghc_core_free(core);
}
END_TEST

START_TEST(names_and_targets)
{
    char buf[128];
    ck_assert_str_eq(wan22_name_diffusers("blocks.3.self_attn.o.weight", buf, sizeof(buf)),
                     "blocks.3.attn1.to_out.0.weight");
    ck_assert_str_eq(wan22_name_diffusers("blocks.3.norm3.bias", buf, sizeof(buf)), "blocks.3.norm2.bias");
    ck_assert_str_eq(wan22_name_diffusers("blocks.12.cross_attn.norm_k.weight", buf, sizeof(buf)),
                     "blocks.12.attn2.norm_k.weight");
    ck_assert_str_eq(wan22_name_diffusers("blocks.0.ffn.0.bias", buf, sizeof(buf)), "blocks.0.ffn.net.0.proj.bias");
    ck_assert_str_eq(wan22_name_diffusers("blocks.0.modulation", buf, sizeof(buf)), "blocks.0.scale_shift_table");
    ck_assert_str_eq(wan22_name_diffusers("head.modulation", buf, sizeof(buf)), "scale_shift_table");
    ck_assert_str_eq(wan22_name_diffusers("time_projection.1.weight", buf, sizeof(buf)),
                     "condition_embedder.time_proj.weight");
    ck_assert_str_eq(wan22_name_diffusers("patch_embedding.bias", buf, sizeof(buf)), "patch_embedding.bias");

    ghc_core_t *core = fixture_core(NULL, false);
    ghc_model_t *model = ghc_model_get(core);
    const struct ghc_model_target *tg;
    int32_t n;
    ck_assert_ptr_nonnull(model);
    ok(core, ghc_model_targets(model, &tg, &n));
    ck_assert_int_eq(n, 30);
    ck_assert_str_eq(tg[13].name, "blocks.1.self_attn.o");
    ck_assert_str_eq(tg[13].alias, "blocks.1.attn1.to_out.0");
    ck_assert_str_eq(tg[28].name, "blocks.2.ffn.0");
    ck_assert_str_eq(tg[28].alias, "blocks.2.ffn.net.0.proj");
    ck_assert_int_eq(tg[28].out_features, 176);
    ck_assert_int_eq(tg[29].in_features, 176);
    ck_assert_int_eq(tg[29].block, 2);
    ck_assert_int_eq(ghc_model_experts(model), 1);
    ck_assert_int_eq(ghc_model_expert_for(model, 999.0f), 0);
    ck_assert_int_eq(ghc_model_forward(model, 1, NULL, NULL, false, NULL), GHC_EINVAL);
    ghc_core_free(core);
}
END_TEST

/* ---- loading ---------------------------------------------------------------------------------- */

/* A direct instance (no plugin): f32 on the CPU. */
static void direct_init(struct wan22 *m, ghc_core_t *core, bool ckpt)
{
    memset(m, 0, sizeof(*m));
    m->core = core;
    m->base = GHC_DTYPE_F32;
    m->device = GHC_DEVICE_CPU;
    m->ckpt = ckpt;
    m->ckpt_every = 1;
    m->ffn_chunk = WAN22_FFN_CHUNK;
    m->n_experts = 1;
    m->experts = calloc(1, sizeof(*m->experts));
    /* the fixtures' linears are far below 2^22 elements (the scratch is allocated when needed) */
    m->lin = ghc_linears_new(core, m->device, m->base, 1024, (int64_t)1 << 22);
    ck_assert_ptr_nonnull(m->lin);
}

/* The GEMM operand dtype, and the linears for it. */
static void direct_base(struct wan22 *m, enum ghc_dtype base)
{
    m->base = base;
    ghc_linears_free(m->lin);
    m->lin = ghc_linears_new(m->core, m->device, m->base, 1024, (int64_t)1 << 22);
    ck_assert_ptr_nonnull(m->lin);
}

static void direct_free(struct wan22 *m)
{
    wan22_state_free(m);
    ghc_linears_free(m->lin);
    wan22_weights_free(m, &m->experts[0]);
    free(m->experts);
}

static void expect_same_weights(struct wan22 *a, struct wan22 *b, const char *what)
{
    struct wan22_tspec *sa, *sb;
    int na, nb;
    ok(a->core, wan22_tensor_list(a->core, &a->d, &a->experts[0], &sa, &na));
    ok(b->core, wan22_tensor_list(b->core, &b->d, &b->experts[0], &sb, &nb));
    ck_assert_int_eq(na, nb);
    for (int i = 0; i < na; i++) {
        const ghc_tensor_t *x = *sa[i].slot, *y = *sb[i].slot;
        ck_assert_msg(ghc_tensor_same_shape(x, y) && ghc_tensor_nbytes(x) == ghc_tensor_nbytes(y) &&
                      memcmp(ghc_tensor_cdata(x), ghc_tensor_cdata(y), ghc_tensor_nbytes(x)) == 0,
                      "%s: %s differs", what, sa[i].name);
    }
    free(sa);
    free(sb);
}

/* Rewrite a file with every name prefixed (one file, or two shards and an index). */
static void rewrite(ghc_core_t *core, const char *src, const char *dir, const char *prefix, bool sharded)
{
    ghc_st_t *st = ghc_st_open(core, src);
    ck_assert_ptr_nonnull(st);
    ghc_st_writer_t *w[2] = { ghc_st_writer_init(core), ghc_st_writer_init(core) };
    int n = ghc_st_count(st);
    char path[1024], line[512];
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
    FILE *idx = sharded ? fopen(path, "w") : NULL;
    if (idx)
        fputs("{\"metadata\": {\"total_size\": 1}, \"weight_map\": {", idx);
    for (int i = 0; i < n; i++) {
        struct ghc_st_info info;
        char nm[256];
        ghc_st_info_at(st, i, &info);
        snprintf(nm, sizeof(nm), "%s%s", prefix, info.name);
        int k = sharded ? i % 2 : 0;
        ok(core, ghc_st_writer_add_raw(w[k], nm, info.dtype, info.ndim, info.shape, ghc_st_raw(st, info.name)));
        if (idx) {
            snprintf(line, sizeof(line), "%s\"%s\": \"shard-%d.safetensors\"", i ? ", " : "", nm, k);
            fputs(line, idx);
        }
    }
    if (idx) {
        fputs("}}\n", idx);
        fclose(idx);
        for (int k = 0; k < 2; k++) {
            snprintf(path, sizeof(path), "%s/shard-%d.safetensors", dir, k);
            ok(core, ghc_st_writer_finish(w[k], path));
        }
    } else {
        snprintf(path, sizeof(path), "%s/model.safetensors", dir);
        ok(core, ghc_st_writer_finish(w[0], path));
    }
    ghc_st_writer_free(w[0]);
    ghc_st_writer_free(w[1]);
    ghc_st_free(st);
}

/* The inverse name map, and the model member merge_names through the core's wrapper (the
 * names `gh200core merge` matches an adapter's modules with). */
START_TEST(merge_names)
{
    static const char *const official[] = {
        "blocks.7.self_attn.q.weight", "blocks.7.self_attn.k.weight", "blocks.7.self_attn.v.weight",
        "blocks.7.self_attn.o.weight", "blocks.7.cross_attn.q.weight", "blocks.7.cross_attn.k.weight",
        "blocks.7.cross_attn.v.weight", "blocks.7.cross_attn.o.weight", "blocks.7.ffn.0.weight",
        "blocks.7.ffn.2.weight", "text_embedding.0.weight", "text_embedding.2.weight", "time_embedding.0.weight",
        "time_embedding.2.weight", "time_projection.1.weight", "head.head.weight",
    };
    char d[160], o[160];
    for (size_t i = 0; i < sizeof(official) / sizeof(official[0]); i++) {
        wan22_name_diffusers(official[i], d, sizeof(d));
        ck_assert_msg(strcmp(d, official[i]) != 0, "%s has no diffusers name", official[i]);
        ck_assert_str_eq(wan22_name_official(d, o, sizeof(o)), official[i]);
        ck_assert_str_eq(wan22_name_official(official[i], o, sizeof(o)), official[i]);   /* not a diffusers name */
    }

    ghc_core_t *core = ghc_core_init();
    ok(core, ghc_plugin_add_path(core, tu_env("GHC_BUILD_PLUGINS")));
    static const struct { const char *tensor, *want[4]; } cases[] = {
        { "model.diffusion_model.blocks.3.self_attn.q.weight",
          { "blocks.3.self_attn.q", "blocks.3.attn1.to_q", "blocks_3_self_attn_q", "blocks_3_attn1_to_q" } },
        { "blocks.3.attn1.to_out.0.weight",
          { "blocks.3.attn1.to_out.0", "blocks.3.self_attn.o", "blocks_3_attn1_to_out_0", "blocks_3_self_attn_o" } },
        { "diffusion_model.condition_embedder.time_proj.weight",
          { "condition_embedder.time_proj", "time_projection.1", "condition_embedder_time_proj",
            "time_projection_1" } },
    };
    const int64_t shape[2] = { 64, 64 };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        struct ghc_merge_names n = { .struct_size = sizeof(n) };
        ok(core, ghc_model_merge_names(core, "wan22", cases[c].tensor, 2, shape, &n));
        ck_assert_int_eq(n.n, 4);   /* its naming and the other, dotted and underscored */
        for (int k = 0; k < 4; k++) {
            bool found = false, us = k >= 2;
            for (int32_t j = 0; j < n.n; j++)
                found |= n.underscored[j] == us && strcmp(n.name[j], cases[c].want[k]) == 0;
            ck_assert_msg(found, "%s: no %s name '%s'", cases[c].tensor, us ? "underscored" : "dotted",
                          cases[c].want[k]);
        }
    }
    struct ghc_merge_names n = { .struct_size = sizeof(n) };
    ok(core, ghc_model_merge_names(core, "wan22", "blocks.3.norm3.weight", 1, shape, &n));   /* 1-D: none */
    ck_assert_int_eq(n.n, 0);
    ok(core, ghc_model_merge_names(core, "wan22", "blocks.3.modulation", 2, shape, &n));    /* no .weight */
    ck_assert_int_eq(n.n, 0);
    ghc_core_free(core);
}
END_TEST

START_TEST(load_layouts)
{
    ghc_core_t *core = ghc_core_init();
    struct wan22 a, b;
    struct wan22_detected det;
    char *dir = tu_tmpdir(), path[1024];
    direct_init(&a, core, false);
    ok(core, wan22_load(&a, fixture("weights_official.safetensors"), 2, &a.experts[0], GHC_ROLE_WEIGHTS, &det));
    ck_assert_int_eq(det.layout, WAN22_LAYOUT_OFFICIAL);
    struct wan22_dims want = { 64, 176, 2, 3, 16, 16, 32, 256 };
    ck_assert_mem_eq(&a.d, &want, sizeof(want));

    direct_init(&b, core, false);
    ok(core, wan22_load(&b, fixture("weights_diffusers.safetensors"), 2, &b.experts[0], GHC_ROLE_WEIGHTS, &det));
    ck_assert_int_eq(det.layout, WAN22_LAYOUT_DIFFUSERS);
    expect_same_weights(&a, &b, "diffusers");
    direct_free(&b);

    /* ComfyUI's prefix, one file */
    rewrite(core, fixture("weights_official.safetensors"), dir, "model.diffusion_model.", false);
    direct_init(&b, core, false);
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    ok(core, wan22_load(&b, path, 2, &b.experts[0], GHC_ROLE_WEIGHTS, &det));
    ck_assert_str_eq(det.prefix, "model.diffusion_model.");
    expect_same_weights(&a, &b, "prefixed");
    direct_free(&b);

    /* diffusers names in two shards through the index */
    rewrite(core, fixture("weights_diffusers.safetensors"), dir, "", true);
    direct_init(&b, core, false);
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
    ok(core, wan22_load(&b, path, 2, &b.experts[0], GHC_ROLE_WEIGHTS, &det));
    expect_same_weights(&a, &b, "sharded");
    direct_free(&b);

    /* bf16 base: linears rounded, everything else f32 */
    direct_init(&b, core, false);
    direct_base(&b, GHC_DTYPE_BF16);
    ok(core, wan22_load(&b, fixture("weights_official.safetensors"), 2, &b.experts[0], GHC_ROLE_WEIGHTS, &det));
    ck_assert_int_eq(ghc_tensor_dtype(b.experts[0].blocks[1].w[WAN22_FFN_2]), GHC_DTYPE_BF16);
    ck_assert_int_eq(ghc_tensor_dtype(b.experts[0].te0_w), GHC_DTYPE_BF16);
    ck_assert_int_eq(ghc_tensor_dtype(b.experts[0].tp_w), GHC_DTYPE_F32);
    ck_assert_int_eq(ghc_tensor_dtype(b.experts[0].blocks[1].b[WAN22_FFN_2]), GHC_DTYPE_F32);
    direct_free(&b);
    direct_free(&a);
    tu_rm_rf(dir);
    free(dir);
    ghc_core_free(core);
}
END_TEST

START_TEST(load_errors)
{
    ghc_core_t *core = ghc_core_init();
    char *dir = tu_tmpdir(), path[1024];
    struct wan22 m;
    struct wan22_detected det;
    /* a file with one tensor of the wrong shape */
    ghc_st_t *st = ghc_st_open(core, fixture("weights_official.safetensors"));
    ghc_st_writer_t *w = ghc_st_writer_init(core);
    for (int i = 0; i < ghc_st_count(st); i++) {
        struct ghc_st_info info;
        ghc_st_info_at(st, i, &info);
        int64_t shape[5];
        memcpy(shape, info.shape, (size_t)info.ndim * sizeof(int64_t));
        const void *raw = ghc_st_raw(st, info.name);
        if (strcmp(info.name, "blocks.1.cross_attn.k.bias") == 0)
            shape[0] = 32;   /* half of it */
        ok(core, ghc_st_writer_add_raw(w, info.name, info.dtype, info.ndim, shape, raw));
    }
    snprintf(path, sizeof(path), "%s/bad.safetensors", dir);
    ok(core, ghc_st_writer_finish(w, path));
    ghc_st_writer_free(w);
    ghc_st_free(st);
    direct_init(&m, core, false);
    ck_assert_int_eq(wan22_load(&m, path, 2, &m.experts[0], GHC_ROLE_WEIGHTS, &det), GHC_EFORMAT);
    ck_assert_msg(strstr(ghc_error_message(core), "bad.safetensors: tensor 'blocks.1.cross_attn.k.bias' has shape "
                         "[32], expected [64]"), "%s", ghc_error_message(core));
    direct_free(&m);

    /* through the plugin: the same message from ghc_run_init */
    ghc_core_t *c2 = ghc_core_init();
    char cfg[2048];
    ok(c2, ghc_plugin_add_path(c2, tu_env("GHC_BUILD_PLUGINS")));
    snprintf(cfg, sizeof(cfg), "mempolicy = { plugin = \"host\"; };\nmodel = { plugin = \"wan22\"; checkpoint = \"%s\"; "
             "heads = 2; device = -1; };\n", path);
    ok(c2, ghc_config_load_string(c2, cfg, "t.cfg", NULL, NULL, 0));
    ck_assert_int_eq(ghc_run_init(c2), GHC_EFORMAT);
    ck_assert_msg(strstr(ghc_error_message(c2), "'blocks.1.cross_attn.k.bias' has shape [32], expected [64]"), "%s",
                  ghc_error_message(c2));
    ghc_core_free(c2);
    tu_rm_rf(dir);
    free(dir);
    ghc_core_free(core);
}
END_TEST

/* A block index no Wan model has (the blocks.9223372036854775807.*: LLONG_MAX + 1 layers,
 * a signed overflow, then "out of memory for the tensor list" naming no file): refused by
 * detection and by estimate, naming the file and the tensor. */
START_TEST(huge_block_index)
{
    static const char *const bad_names[] = { "blocks.9223372036854775807.ffn.0.bias",
                                             "blocks.99999999999999999999999.ffn.0.bias", "blocks.100000.ffn.0.bias" };
    ghc_core_t *core = ghc_core_init();
    char *dir = tu_tmpdir(), path[1024];
    for (size_t k = 0; k < sizeof(bad_names) / sizeof(*bad_names); k++) {
        const char *bad = bad_names[k];
        /* detection from a tensor list */
        struct wan22_dims d = { 1536, 8960, 12, 30, 16, 16, 4096, 256 };
        struct shapes s;
        struct wan22_detected det;
        shapes_make(core, &s, &d, false, "model.diffusion_model.");
        char full[160];
        snprintf(full, sizeof(full), "model.diffusion_model.%s", bad);
        s.desc[s.n - 1].name = full;
        ck_assert_int_eq(wan22_detect(core, "huge.safetensors", s.desc, s.n, 0, &det), GHC_EFORMAT);
        const char *msg = ghc_error_message(core);
        ck_assert_msg(strstr(msg, "huge.safetensors") && strstr(msg, full) && strstr(msg, "not a Wan block index"),
                      "%s", msg);
        shapes_free(&s);

        /* a file: the fixture with one more tensor */
        ghc_st_t *st = ghc_st_open(core, fixture("weights_official.safetensors"));
        ghc_st_writer_t *w = ghc_st_writer_init(core);
        for (int i = 0; i < ghc_st_count(st); i++) {
            struct ghc_st_info info;
            ghc_st_info_at(st, i, &info);
            ok(core, ghc_st_writer_add_raw(w, info.name, info.dtype, info.ndim, info.shape, ghc_st_raw(st, info.name)));
        }
        float one = 1;
        ok(core, ghc_st_writer_add_raw(w, bad, GHC_DTYPE_F32, 1, (const int64_t[]){ 1 }, &one));
        snprintf(path, sizeof(path), "%s/huge%zu.safetensors", dir, k);
        ok(core, ghc_st_writer_finish(w, path));
        ghc_st_writer_free(w);
        ghc_st_free(st);
        struct wan22 m;
        direct_init(&m, core, false);
        ck_assert_int_eq(wan22_load(&m, path, 2, &m.experts[0], GHC_ROLE_WEIGHTS, &det), GHC_EFORMAT);
        msg = ghc_error_message(core);
        ck_assert_msg(strstr(msg, path) && strstr(msg, bad) && strstr(msg, "not a Wan block index"), "%s", msg);
        direct_free(&m);

        /* estimate through the CLI */
        char cfgtext[2048], *out, cmd[4096];
        snprintf(cfgtext, sizeof(cfgtext), "model = { plugin = \"wan22\"; checkpoint = \"%s\"; heads = 2; };\n", path);
        char *cfg = tu_write(dir, "est.cfg", cfgtext);
        snprintf(cmd, sizeof(cmd), "'%s' -P '%s' estimate -c '%s'", tu_env("GHC_CLI"), tu_env("GHC_BUILD_PLUGINS"), cfg);
        int rc = tu_run(cmd, &out);
        ck_assert_msg(rc != 0 && rc < 128, "estimate: exit %d: %s", rc, out);
        ck_assert_msg(strstr(out, path) && strstr(out, bad) && strstr(out, "not a Wan block index"), "%s", out);
        free(out);
        free(cfg);
    }
    tu_rm_rf(dir);
    free(dir);
    ghc_core_free(core);
}
END_TEST

/* ---- forward ----------------------------------------------------------------------------------- */

START_TEST(forward_fixture)
{
    ghc_core_t *core = fixture_core("checkpointing = \"off\";", false);
    ghc_model_t *model = ghc_model_get(core);
    struct fcase c;
    case_open(core, &c, GHC_DEVICE_CPU);
    const char *tags[] = { "700", "150" };
    for (int k = 0; k < 2; k++) {
        char nm[64];
        struct ghc_model_batch b = batch_of(&c, k == 0);
        ghc_tensor_t *out = like(core, c.x700, GHC_DEVICE_CPU), *loss = mk(core, -1, 1, (const int64_t[]){ 1 });
        ok(core, ghc_model_forward(model, 0, &b, out, false, NULL));
        snprintf(nm, sizeof(nm), "pred_%s", tags[k]);
        ghc_tensor_t *ref = load(core, c.st, nm);
        double e = rel_err(core, out, ref);
        printf("forward t=%s: rel err %.3g\n", tags[k], e);
        ck_assert_msg(e < TOL_FWD, "pred_%s: rel err %g", tags[k], e);
        ok(core, ghc_op_mse_loss(loss, NULL, out, c.v, NULL));
        snprintf(nm, sizeof(nm), "loss_%s", tags[k]);
        ghc_tensor_t *lref = load(core, c.st, nm);
        double le = fabs(scalar(core, loss) - scalar(core, lref)) / scalar(core, lref);
        printf("loss t=%s: %.8f vs %.8f (rel %.3g)\n", tags[k], scalar(core, loss), scalar(core, lref), le);
        ck_assert_msg(le < TOL_FWD, "loss_%s rel err %g", tags[k], le);
        ghc_tensor_free(lref);
        ghc_tensor_free(ref);
        ghc_tensor_free(loss);
        ghc_tensor_free(out);
    }
    case_close(&c);
    ghc_core_free(core);
}
END_TEST

/* Records the outputs of block 0's o projections and ffn.2 (no adapter). */
struct spy {
    ghc_core_t   *core;
    ghc_tensor_t *attn1, *attn2, *ffn;
};

static int spy_plan(void *user, int32_t target, struct ghc_adapter_plan *out)
{
    (void)user;
    out->adapted = target == WAN22_SA_O || target == WAN22_CA_O || target == WAN22_FFN_2;
    return 1;
}

static int spy_fwd(void *user, int32_t target, const ghc_tensor_t *x, ghc_tensor_t *y, bool write, void *stream)
{
    struct spy *s = user;
    (void)write;
    ghc_tensor_t **slot = target == WAN22_SA_O ? &s->attn1 : target == WAN22_CA_O ? &s->attn2
                        : target == WAN22_FFN_2 ? &s->ffn : NULL;
    if (slot && !*slot) {
        *slot = like(s->core, y, GHC_DEVICE_CPU);
        int rc = ghc_op_copy(*slot, y, stream);
        return rc < 0 ? rc : 1;
    }
    return 0;
}

static int spy_bwd(void *user, int32_t target, const ghc_tensor_t *x, const ghc_tensor_t *dy, const ghc_tensor_t *g,
                   ghc_tensor_t *dx, bool accumulate, void *stream)
{
    (void)user, (void)target, (void)x, (void)dy, (void)g, (void)dx, (void)accumulate, (void)stream;
    return 0;
}

START_TEST(intermediates)
{
    ghc_core_t *core = ghc_core_init();
    struct wan22 m;
    struct wan22_detected det;
    struct fcase c;
    direct_init(&m, core, false);
    ok(core, wan22_load(&m, fixture("weights_official.safetensors"), 2, &m.experts[0], GHC_ROLE_WEIGHTS, &det));
    m.targets = calloc(30, sizeof(*m.targets));
    struct spy spy = { core, NULL, NULL, NULL };
    ok(core, ghc_linears_set_hook(m.lin, &(struct ghc_adapter_hook){ .struct_size = sizeof(struct ghc_adapter_hook),
                                  .user = &spy, .plan = spy_plan, .forward = spy_fwd, .backward = spy_bwd }, NULL));
    case_open(core, &c, GHC_DEVICE_CPU);
    struct ghc_model_batch b = batch_of(&c, true);
    ghc_tensor_t *out = like(core, c.x700, GHC_DEVICE_CPU);
    ok(core, wan22_forward(&m, 0, &b, out, true, NULL));
    struct {
        const char *name;
        const ghc_tensor_t *got;
        double tol;
    } cmp[] = {
        { "dbg.t_freq", m.st.sinus, 1e-5 },   /* f64 sinusoid vs diffusers' fp32 */
        { "dbg.e", m.st.e, 1e-5 },
        { "dbg.ctx", m.st.ctx, 1e-6 },
        { "dbg.tokens", m.st.xs[0], 1e-6 },
        { "dbg.block0.attn1_out", spy.attn1, TOL_FWD },
        { "dbg.block0.attn2_out", spy.attn2, TOL_FWD },
        { "dbg.block0.ffn_out", spy.ffn, TOL_FWD },
        { "dbg.block0.out", m.st.xs[1], TOL_FWD },
        { "dbg.block1.out", m.st.xs[2], TOL_FWD },
        { "dbg.block2.out", m.st.xs[3], TOL_FWD },
        { "dbg.head_out", m.st.ho, TOL_FWD },
    };
    for (size_t i = 0; i < sizeof(cmp) / sizeof(cmp[0]); i++) {
        ghc_tensor_t *ref = load(core, c.st, cmp[i].name);
        ck_assert_ptr_nonnull(cmp[i].got);
        double e = rel_err(core, cmp[i].got, ref);
        printf("%-22s rel err %.3g\n", cmp[i].name, e);
        ck_assert_msg(e < cmp[i].tol, "%s: rel err %g", cmp[i].name, e);
        ghc_tensor_free(ref);
    }
    /* e0: six chunks */
    ghc_tensor_t *e0 = load(core, c.st, "dbg.e0");
    for (int k = 0; k < 6; k++) {
        ghc_tensor_t *chunk = ghc_tensor_wrap(core, GHC_DTYPE_F32, 1, (const int64_t[]){ 64 }, -1,
                                              (float *)ghc_tensor_data(e0) + 64 * k);
        double e = rel_err(core, m.st.e0[k], chunk);
        ck_assert_msg(e < 1e-5, "dbg.e0 chunk %d: rel err %g", k, e);
        ghc_tensor_free(chunk);
    }
    ghc_tensor_free(e0);
    ghc_tensor_free(spy.attn1);
    ghc_tensor_free(spy.attn2);
    ghc_tensor_free(spy.ffn);
    ghc_tensor_free(out);
    case_close(&c);
    free(m.targets);
    direct_free(&m);
    ghc_core_free(core);
}
END_TEST

/* ---- backward ---------------------------------------------------------------------------------- */

/* Forward at t = 700, flow-matching loss, backward; with the LoRA hook when l is set. Returns
 * the loss; *dx gets d loss / d x_sigma (CPU f32, caller frees). */
static float train_step(ghc_core_t *core, struct fcase *c, struct lora *l, int device, ghc_tensor_t **pred,
                        ghc_tensor_t **dx)
{
    ghc_model_t *model = ghc_model_get(core);
    struct ghc_adapter_hook h = l ? lora_hook(l) : (struct ghc_adapter_hook){ 0 };
    ok(core, ghc_model_set_hook(model, l ? &h : NULL));
    struct ghc_model_batch b = batch_of(c, true);
    ghc_tensor_t *out = like(core, c->x700, device), *grad = like(core, c->x700, device);
    ghc_tensor_t *loss = mk(core, device, 1, (const int64_t[]){ 1 }), *dn = like(core, c->x700, device);
    ok(core, ghc_model_forward(model, 0, &b, out, true, NULL));
    ok(core, ghc_op_mse_loss(loss, grad, out, c->v, NULL));
    ok(core, ghc_model_backward(model, 0, grad, dn, NULL));
    ck_assert_int_eq(ghc_model_backward(model, 0, grad, dn, NULL), GHC_EINVAL);   /* once per forward */
    float v = scalar(core, loss);
    *dx = device == GHC_DEVICE_CPU ? dn : to_dev(core, dn, GHC_DEVICE_CPU);
    *pred = device == GHC_DEVICE_CPU ? out : to_dev(core, out, GHC_DEVICE_CPU);
    if (device != GHC_DEVICE_CPU) {
        ghc_tensor_free(dn);
        ghc_tensor_free(out);
    }
    ghc_tensor_free(grad);
    ghc_tensor_free(loss);
    return v;
}

START_TEST(backward_base)
{
    ghc_core_t *core = fixture_core(NULL, false);
    struct fcase c;
    ghc_tensor_t *pred, *dx;
    case_open(core, &c, GHC_DEVICE_CPU);
    train_step(core, &c, NULL, GHC_DEVICE_CPU, &pred, &dx);
    ghc_tensor_t *ref = load(core, c.st, "grad_base.x_sigma_700");
    double e = rel_err(core, dx, ref);
    printf("base d loss/d x_sigma: rel err %.3g\n", e);
    ck_assert_msg(e < TOL_GRAD, "grad_base.x_sigma_700: rel err %g", e);
    ghc_tensor_free(ref);
    ghc_tensor_free(pred);
    ghc_tensor_free(dx);
    case_close(&c);
    ghc_core_free(core);
}
END_TEST

/* LoRA prediction, loss, input gradient and the 60 LoRA gradients against the fixture: all 60
 * together within tol_grad, each within tol_tensor (0: not checked, only reported). */
static void check_lora(ghc_core_t *core, int device, double tol_fwd, double tol_grad, double tol_tensor)
{
    struct fcase c;
    struct lora l;
    ghc_tensor_t *pred, *dx;
    case_open(core, &c, device);
    lora_init(&l, core, ghc_model_get(core), c.st, device);
    float loss = train_step(core, &c, &l, device, &pred, &dx);
    ck_assert_int_eq(l.calls_bwd, 30);
    ghc_tensor_t *ref = load(core, c.st, "lora_pred_700");
    double e = rel_err(core, pred, ref);
    printf("lora prediction: rel err %.3g\n", e);
    ck_assert_msg(e < tol_fwd, "lora_pred_700: rel err %g", e);
    ghc_tensor_free(ref);
    ref = load(core, c.st, "lora_loss_700");
    e = fabs(loss - scalar(core, ref)) / scalar(core, ref);
    printf("lora loss %.8f vs %.8f: rel err %.3g\n", loss, scalar(core, ref), e);
    ck_assert_msg(e < tol_fwd, "lora_loss_700: rel err %g", e);
    ghc_tensor_free(ref);
    ref = load(core, c.st, "grad.x_sigma_700");
    e = rel_err(core, dx, ref);
    printf("lora d loss/d x_sigma: rel err %.3g\n", e);
    ck_assert_msg(e < tol_grad, "grad.x_sigma_700: rel err %g", e);
    ghc_tensor_free(ref);
    const struct ghc_model_target *tg;
    int32_t n;
    ok(core, ghc_model_targets(ghc_model_get(core), &tg, &n));
    double worst = 0, num = 0, den = 0;
    const char *worst_name = "";
    char nm[128], worst_buf[128];
    for (int32_t i = 0; i < n; i++)
        for (int ab = 0; ab < 2; ab++) {
            snprintf(nm, sizeof(nm), "grad.%s.lora_%c", tg[i].name, "AB"[ab]);
            ref = load(core, c.st, nm);
            ghc_tensor_t *got = ab ? l.dB[i] : l.dA[i];
            e = rel_err(core, got, ref);
            double r2 = 0;
            const float *rv = ghc_tensor_cdata(ref);
            for (int64_t k = 0; k < ghc_tensor_numel(ref); k++)
                r2 += (double)rv[k] * rv[k];
            num += e * e * r2;
            den += r2;
            if (e > worst) {
                worst = e;
                snprintf(worst_buf, sizeof(worst_buf), "%s", nm);
                worst_name = worst_buf;
            }
            ck_assert_msg(tol_tensor == 0 || e < tol_tensor, "%s: rel err %g", nm, e);
            ghc_tensor_free(ref);
        }
    e = sqrt(num / den);
    printf("lora gradients (60 tensors together): rel err %.3g\n", e);
    ck_assert_msg(e < tol_grad, "the 60 LoRA gradients: rel err %g", e);
    printf("lora gradients (60): worst rel err %.3g (%s)\n", worst, worst_name);
    ghc_tensor_free(pred);
    ghc_tensor_free(dx);
    lora_free(&l);
    case_close(&c);
}

START_TEST(backward_lora)
{
    ghc_core_t *core = fixture_core(NULL, false);
    check_lora(core, GHC_DEVICE_CPU, TOL_FWD, TOL_GRAD, TOL_GRAD * GRAD_TENSOR_FACTOR);
    ghc_core_free(core);
}
END_TEST

/* A hook that fails without a message (it breaks the hook contract): the model passes the
 * failure on as it is, and the core's hook names the member and the target. */
static int silent_forward(void *user, int32_t target, const ghc_tensor_t *x, ghc_tensor_t *y, bool write, void *stream)
{
    (void)user, (void)target, (void)x, (void)y, (void)write, (void)stream;
    return GHC_EIO;
}

START_TEST(hook_fails_silently)
{
    ghc_core_t *core = fixture_core(NULL, false);
    struct fcase c;
    case_open(core, &c, GHC_DEVICE_CPU);
    ghc_model_t *model = ghc_model_get(core);
    const struct ghc_model_target *t;
    int32_t n;
    ok(core, ghc_model_targets(model, &t, &n));
    struct ghc_adapter_hook h = { .struct_size = sizeof(h), .plan = lora_plan, .forward = silent_forward,
                                  .backward = lora_bwd };
    ok(core, ghc_model_set_hook(model, &h));
    struct ghc_model_batch b = batch_of(&c, true);
    ghc_tensor_t *out = like(core, c.x700, GHC_DEVICE_CPU);
    ck_assert_int_eq(ghc_model_forward(model, 0, &b, out, false, NULL), GHC_EIO);
    char want[256];
    snprintf(want, sizeof(want), "adapter: hook forward on %s failed: %s (code %d, no message from the plugin)",
             t[0].name, ghc_status_string(GHC_EIO), GHC_EIO);
    ck_assert_str_eq(ghc_error_message(core), want);
    ok(core, ghc_model_set_hook(model, NULL));
    ghc_tensor_free(out);
    case_close(&c);
    ghc_core_free(core);
}
END_TEST

/* A malloc'ed copy of a tensor's f32 values (outlives the tensor's core). */
static float *snap(ghc_core_t *core, const ghc_tensor_t *t)
{
    ghc_tensor_t *h = ghc_tensor_device(t) == GHC_DEVICE_CPU ? NULL : to_dev(core, t, GHC_DEVICE_CPU);
    size_t n = ghc_tensor_nbytes(t);
    float *v = malloc(n);
    ck_assert_ptr_nonnull(v);
    memcpy(v, ghc_tensor_cdata(h ? h : t), n);
    ghc_tensor_free(h);
    return v;
}

/* A training step's results on the host (they outlive the step's core): the loss, the
 * prediction, the input gradient and the 30 targets' LoRA gradients. */
struct step_snap {
    float  loss, *dx, *pred, *dA[30], *dB[30];
    size_t n_x, n_a[30], n_b[30];
};

static void step_snap_take(struct step_snap *s, ghc_core_t *core, float loss, const ghc_tensor_t *p,
                           const ghc_tensor_t *d, const struct lora *l)
{
    s->loss = loss;
    s->n_x = ghc_tensor_nbytes(d);
    s->dx = snap(core, d);
    s->pred = snap(core, p);
    for (int i = 0; i < 30; i++) {
        s->n_a[i] = ghc_tensor_nbytes(l->dA[i]);
        s->n_b[i] = ghc_tensor_nbytes(l->dB[i]);
        s->dA[i] = snap(core, l->dA[i]);
        s->dB[i] = snap(core, l->dB[i]);
    }
}

static void step_snap_free(struct step_snap *s)
{
    for (int i = 0; i < 30; i++) {
        free(s->dA[i]);
        free(s->dB[i]);
    }
    free(s->dx);
    free(s->pred);
}

/* checkpointing "off" (activations kept), "block" (every block recomputed), "block" with
 * checkpoint_every = 2 and 3 (blocks 0, 2 resp. block 0 of the 3 recomputed), "block_attn" (the
 * recomputation restores the self-attention output and lse instead of computing them) with
 * k = 1 and 2, "block_qkv" (and q, k and v: no q, k, v products in the recomputation; the
 * CPU's GEMM dtype is f32, so q's and k's rounding changes no bit), and the saved activations
 * moved through the host policy's ring (copied home and back; every buffer NaN-poisoned when
 * handed out for writing and when its unit leaves it, or kept for the turn-around blocks) give
 * the same bits. */
START_TEST(checkpointing_same)
{
    enum { RUNS = 14 };
    static const struct { const char *model, *mp; int calls; } runs[RUNS] = {
        /* a recomputation calls the hook again, but for ffn.2's forward (its output is not
         * needed; the backward writes its K-concatenated H only) */
        { "checkpointing = \"off\";", NULL, 30 },
        { "checkpointing = \"block\";", NULL, 57 },
        { "checkpointing = \"block\"; checkpoint_every = 2;", NULL, 48 },
        { "checkpointing = \"block\"; checkpoint_every = 3;", NULL, 39 },
        { "checkpointing = \"block_attn\";", NULL, 57 },
        { "checkpointing = \"block_attn\"; checkpoint_every = 2;", NULL, 48 },
        { "checkpointing = \"block\";", "saved_ring = 3;", 57 },
        { "checkpointing = \"block_attn\";", "saved_ring = 3;", 57 },
        { "checkpointing = \"block_attn\"; checkpoint_every = 2;", "saved_ring = 2; saved_ahead = 1;", 48 },
        { "checkpointing = \"block_attn\";", "saved_ring = 4; saved_ahead = 2; saved_poison = false;", 57 },
        { "checkpointing = \"block\";", "saved_ring = 2; saved_ahead = 1; saved_poison = false;", 57 },
        /* block_qkv: nor q's, k's and v's (their spare columns written again, no forward) */
        { "checkpointing = \"block_qkv\";", NULL, 48 },
        { "checkpointing = \"block_qkv\"; checkpoint_every = 2;", "saved_ring = 2; saved_ahead = 1;", 42 },
        { "checkpointing = \"block_qkv\";", "saved_ring = 4; saved_ahead = 2; saved_poison = false;", 48 },
    };
    struct step_snap r[RUNS];
    uint64_t saved_block = 0, saved_attn = 0;
    for (int k = 0; k < RUNS; k++) {
        ghc_core_t *core = fixture_core_mp(runs[k].model, false, runs[k].mp);
        struct fcase c;
        struct lora l;
        ghc_tensor_t *p, *d;
        case_open(core, &c, GHC_DEVICE_CPU);
        lora_init(&l, core, ghc_model_get(core), c.st, GHC_DEVICE_CPU);
        float loss = train_step(core, &c, &l, GHC_DEVICE_CPU, &p, &d);
        ck_assert_int_eq(l.calls_fwd, runs[k].calls);
        struct ghc_mem_stats st = { .struct_size = sizeof(st) };
        ok(core, ghc_mem_stats(ghc_mempolicy_get(core), &st));
        /* the saved role: 3 block inputs of [1, L, 64] f32, and with block_attn the recomputed
         * blocks' o [1, L, 64] f32 and lse [1, 2, L] f32 */
        if (k == 1)
            saved_block = st.bytes_role[GHC_ROLE_SAVED];
        ck_assert_uint_gt(st.bytes_role[GHC_ROLE_SAVED], 0);
        if (k == 4)
            saved_attn = st.bytes_role[GHC_ROLE_SAVED];
        if (k == 4)
            ck_assert_uint_gt(st.bytes_role[GHC_ROLE_SAVED], saved_block);
        if (k == 11)   /* and q, k, v [1, L, 64] f32 each */
            ck_assert_uint_gt(st.bytes_role[GHC_ROLE_SAVED], saved_attn);
        if (runs[k].mp) {   /* through the ring: every unit went home, and came back unless still there */
            fprintf(stderr, "checkpointing_same %s %s: saved out %llu, in %llu, hits %llu, ring %llu B\n",
                    runs[k].model, runs[k].mp, (unsigned long long)st.saved_out_bytes,
                    (unsigned long long)st.saved_in_bytes, (unsigned long long)st.saved_hits,
                    (unsigned long long)st.saved_ring_bytes);
            ck_assert_uint_eq(st.saved_out_bytes, st.bytes_role[GHC_ROLE_SAVED]);
            ck_assert_uint_gt(st.saved_ring_bytes, 0);
            if (strstr(runs[k].mp, "poison = false")) {
                ck_assert_uint_gt(st.saved_hits, 0);
                ck_assert_uint_lt(st.saved_in_bytes, st.saved_out_bytes);
            } else {
                ck_assert_uint_eq(st.saved_hits, 0);
                ck_assert_uint_eq(st.saved_in_bytes, st.saved_out_bytes);
            }
        } else {
            ck_assert_uint_eq(st.saved_out_bytes + st.saved_in_bytes, 0);
        }
        step_snap_take(&r[k], core, loss, p, d, &l);
        ghc_tensor_free(p);
        ghc_tensor_free(d);
        lora_free(&l);
        case_close(&c);
        ghc_core_free(core);
    }
    for (int k = 1; k < RUNS; k++) {
        const char *what = runs[k].model;
        ck_assert_msg(r[0].loss == r[k].loss, "%s %s: loss differs", what, runs[k].mp ? runs[k].mp : "");
        ck_assert_msg(memcmp(r[0].pred, r[k].pred, r[0].n_x) == 0, "%s: prediction differs", what);
        ck_assert_msg(memcmp(r[0].dx, r[k].dx, r[0].n_x) == 0, "%s: input gradient differs", what);
        for (int i = 0; i < 30; i++) {
            ck_assert_msg(memcmp(r[0].dA[i], r[k].dA[i], r[0].n_a[i]) == 0, "%s: dA of target %d differs", what, i);
            ck_assert_msg(memcmp(r[0].dB[i], r[k].dB[i], r[0].n_b[i]) == 0, "%s: dB of target %d differs", what, i);
        }
    }
    for (int k = 0; k < RUNS; k++)
        step_snap_free(&r[k]);
    /* checkpoint_every without block checkpointing, and out of range, are config errors */
    static const char *const bad[] = { "checkpointing = \"off\"; checkpoint_every = 2;", "checkpoint_every = 0;" };
    for (int b = 0; b < 2; b++) {
        char text[1024];
        ghc_core_t *core = ghc_core_init();
        ck_assert_ptr_nonnull(core);
        ok(core, ghc_plugin_add_path(core, tu_env("GHC_BUILD_PLUGINS")));
        snprintf(text, sizeof(text), "mempolicy = { plugin = \"host\"; };\nmodel = { plugin = \"wan22\"; "
                 "checkpoint = \"%s\"; heads = 2; dtype = \"f32\"; device = -1; %s };\n",
                 fixture("weights_official.safetensors"), bad[b]);
        ok(core, ghc_config_load_string(core, text, "test.cfg", NULL, NULL, 0));
        ck_assert_int_lt(ghc_run_init(core), 0);
        ck_assert_msg(strstr(ghc_error_message(core), "checkpoint_every"), "%s", ghc_error_message(core));
        ghc_core_free(core);
    }
}
END_TEST

/* The FFN over chunks of tokens (ffn_chunk, wan22_ffn_rows): with 5 tokens a chunk the case's
 * tokens run in several chunks, the last one shorter. Checkpointing off, block (the backward
 * runs ffn.0 and the GELU again chunk by chunk and writes no ffn.2 output), every 2 and
 * block_attn through the ring give the same bits as each other; against the unchunked run the
 * prediction and the input gradient are the same bits (every row's sums run alike), the
 * adapter gradients (sums over the rows, chunk by chunk) agree to 1e-6 relative. */
START_TEST(ffn_chunked)
{
    enum { RUNS = 5 };
    static const struct { const char *model, *mp; } runs[RUNS] = {
        { "checkpointing = \"block\";", NULL },   /* unchunked: the reference */
        { "checkpointing = \"off\"; ffn_chunk = 5;", NULL },
        { "checkpointing = \"block\"; ffn_chunk = 5;", NULL },
        { "checkpointing = \"block\"; checkpoint_every = 2; ffn_chunk = 5;", NULL },
        { "checkpointing = \"block_attn\"; ffn_chunk = 5;", "saved_ring = 2; saved_ahead = 1;" },
    };
    struct step_snap r[RUNS];
    for (int k = 0; k < RUNS; k++) {
        ghc_core_t *core = fixture_core_mp(runs[k].model, false, runs[k].mp);
        struct fcase c;
        struct lora l;
        ghc_tensor_t *p, *d;
        case_open(core, &c, GHC_DEVICE_CPU);
        if (k == 1)   /* tokens: F (H / 2) (W / 2), over 2 chunks of 5 */
            ck_assert_int_gt(ghc_tensor_dim(c.x700, 2) * (ghc_tensor_dim(c.x700, 3) / 2) *
                             (ghc_tensor_dim(c.x700, 4) / 2), 10);
        lora_init(&l, core, ghc_model_get(core), c.st, GHC_DEVICE_CPU);
        float loss = train_step(core, &c, &l, GHC_DEVICE_CPU, &p, &d);
        step_snap_take(&r[k], core, loss, p, d, &l);
        ghc_tensor_free(p);
        ghc_tensor_free(d);
        lora_free(&l);
        case_close(&c);
        ghc_core_free(core);
    }
    double worst = 0.0;
    for (int k = 1; k < RUNS; k++) {
        const char *what = runs[k].model;
        ck_assert_msg(memcmp(r[0].pred, r[k].pred, r[0].n_x) == 0, "%s: prediction differs", what);
        ck_assert_msg(memcmp(r[0].dx, r[k].dx, r[0].n_x) == 0, "%s: input gradient differs", what);
        for (int i = 0; i < 30; i++) {
            if (k > 1) {   /* the chunked runs among themselves: the same bits */
                ck_assert_msg(r[1].loss == r[k].loss, "%s: loss differs from the chunked off run", what);
                ck_assert_msg(memcmp(r[1].dA[i], r[k].dA[i], r[0].n_a[i]) == 0, "%s: dA of target %d differs", what, i);
                ck_assert_msg(memcmp(r[1].dB[i], r[k].dB[i], r[0].n_b[i]) == 0, "%s: dB of target %d differs", what, i);
            }
            const float *a[2] = { r[0].dA[i], r[0].dB[i] }, *b[2] = { r[k].dA[i], r[k].dB[i] };
            const size_t n[2] = { r[0].n_a[i] / sizeof(float), r[0].n_b[i] / sizeof(float) };
            for (int j = 0; j < 2; j++) {
                double num = 0.0, den = 0.0;
                for (size_t e = 0; e < n[j]; e++) {
                    num += ((double)a[j][e] - b[j][e]) * ((double)a[j][e] - b[j][e]);
                    den += (double)a[j][e] * a[j][e];
                }
                double rel = den > 0.0 ? sqrt(num / den) : sqrt(num);
                worst = rel > worst ? rel : worst;
                ck_assert_msg(rel < 1e-6, "%s: %s of target %d: rel err %g against the unchunked run", what,
                              j ? "dB" : "dA", i, rel);
            }
        }
    }
    printf("ffn_chunked: prediction and input gradient the same bits; adapter gradients within %.3g\n", worst);
    for (int k = 0; k < RUNS; k++)
        step_snap_free(&r[k]);
}
END_TEST

/* ---- batches, text padding, experts, I2V ----------------------------------------------------- */

static ghc_tensor_t *cpu(ghc_core_t *core, int ndim, const int64_t *shape)
{
    return mk(core, GHC_DEVICE_CPU, ndim, shape);
}

static bool same_bits(const ghc_tensor_t *a, const ghc_tensor_t *b, int64_t off_b)
{
    return memcmp(ghc_tensor_cdata(a), (const float *)ghc_tensor_cdata(b) + off_b, ghc_tensor_nbytes(a)) == 0;
}

START_TEST(batch_and_padding)
{
    ghc_core_t *core = fixture_core("checkpointing = \"off\";", false);
    ghc_model_t *model = ghc_model_get(core);
    struct fcase c;
    case_open(core, &c, GHC_DEVICE_CPU);
    const int64_t n = ghc_tensor_numel(c.x700), nt = ghc_tensor_numel(c.text);
    ghc_tensor_t *one[2];
    for (int k = 0; k < 2; k++) {   /* B = 1 at t = 700 and t = 150 */
        struct ghc_model_batch b = batch_of(&c, k == 0);
        one[k] = like(core, c.x700, GHC_DEVICE_CPU);
        ok(core, ghc_model_forward(model, 0, &b, one[k], false, NULL));
    }
    /* B = 2: both samples at once, each with its own t */
    ghc_tensor_t *x2 = cpu(core, 5, (const int64_t[]){ 2, 16, 3, 8, 12 }), *out2 = like(core, x2, GHC_DEVICE_CPU);
    ghc_tensor_t *t2 = cpu(core, 1, (const int64_t[]){ 2 }), *txt2 = cpu(core, 3, (const int64_t[]){ 2, 512, 32 });
    memcpy(ghc_tensor_data(x2), ghc_tensor_cdata(c.x700), (size_t)n * 4);
    memcpy((float *)ghc_tensor_data(x2) + n, ghc_tensor_cdata(c.x150), (size_t)n * 4);
    ((float *)ghc_tensor_data(t2))[0] = 700.0f;
    ((float *)ghc_tensor_data(t2))[1] = 150.0f;
    memcpy(ghc_tensor_data(txt2), ghc_tensor_cdata(c.text), (size_t)nt * 4);
    memcpy((float *)ghc_tensor_data(txt2) + nt, ghc_tensor_cdata(c.text), (size_t)nt * 4);
    struct ghc_model_batch b2 = { .noisy = x2, .timesteps = t2, .text_embed = txt2 };
    ok(core, ghc_model_forward(model, 0, &b2, out2, true, NULL));
    ck_assert_msg(same_bits(one[0], out2, 0) && same_bits(one[1], out2, n), "B = 2 differs from two B = 1 runs");
    ghc_tensor_t *g2 = like(core, x2, GHC_DEVICE_CPU), *dn2 = like(core, x2, GHC_DEVICE_CPU);
    ok(core, ghc_op_fill(g2, 1e-3, NULL));
    ok(core, ghc_model_backward(model, 0, g2, dn2, NULL));

    /* 7 real rows, padded by the model; 512 rows with junk past row 7 and a mask */
    ghc_tensor_t *t7 = cpu(core, 3, (const int64_t[]){ 1, 7, 32 }), *junk = like(core, c.text, GHC_DEVICE_CPU);
    ghc_tensor_t *mask = cpu(core, 2, (const int64_t[]){ 1, 512 }), *out = like(core, c.x700, GHC_DEVICE_CPU);
    memcpy(ghc_tensor_data(t7), ghc_tensor_cdata(c.text), 7 * 32 * 4);
    ok(core, ghc_op_fill(junk, 0.5, NULL));
    memcpy(ghc_tensor_data(junk), ghc_tensor_cdata(c.text), 7 * 32 * 4);
    for (int i = 0; i < 512; i++)
        ((float *)ghc_tensor_data(mask))[i] = i < 7;
    struct ghc_model_batch b7 = { .noisy = c.x700, .timesteps = c.t700, .text_embed = t7 };
    ok(core, ghc_model_forward(model, 0, &b7, out, false, NULL));
    ck_assert_msg(same_bits(one[0], out, 0), "7 text rows padded by the model differ from 512 given rows");
    struct ghc_model_batch bm = { .noisy = c.x700, .timesteps = c.t700, .text_embed = junk, .text_mask = mask };
    ok(core, ghc_model_forward(model, 0, &bm, out, false, NULL));
    ck_assert_msg(same_bits(one[0], out, 0), "masked rows are not treated as padding");

    ghc_tensor_t *all[] = { one[0], one[1], x2, out2, t2, txt2, g2, dn2, t7, junk, mask, out };
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        ghc_tensor_free(all[i]);
    case_close(&c);
    ghc_core_free(core);
}
END_TEST

/* A small random I2V-shaped model with two experts. */
#define RANDOM_I2V "random = { dim = 64; ffn_dim = 96; heads = 2; layers = 2; in_channels = 36; " \
                   "out_channels = 16; text_dim = 32; freq_dim = 64; experts = 2; seed = 5; };"

static void fill_seq(ghc_tensor_t *t, float a, float b)
{
    float *v = ghc_tensor_data(t);
    for (int64_t i = 0; i < ghc_tensor_numel(t); i++)
        v[i] = a * sinf(b * (float)i + 0.3f * (float)(i % 7));
}

START_TEST(experts_and_i2v)
{
    ghc_core_t *core = run_core("dtype = \"f32\"; device = -1; " RANDOM_I2V, false);
    ghc_model_t *model = ghc_model_get(core);
    ck_assert_int_eq(ghc_model_experts(model), 2);
    ck_assert_int_eq(ghc_model_expert_for(model, 999.0f), 0);   /* I2V default boundary 0.9 */
    ck_assert_int_eq(ghc_model_expert_for(model, 900.0f), 0);
    ck_assert_int_eq(ghc_model_expert_for(model, 899.5f), 1);
    ck_assert_int_eq(ghc_model_expert_for(model, 0.0f), 1);
    ok(core, ghc_model_activate(model, 1));
    ok(core, ghc_model_activate(model, 0));
    ck_assert_int_eq(ghc_model_activate(model, 2), GHC_EINVAL);

    const int64_t sh16[] = { 1, 16, 2, 4, 4 }, sh20[] = { 1, 20, 2, 4, 4 }, sh36[] = { 1, 36, 2, 4, 4 };
    ghc_tensor_t *x16 = cpu(core, 5, sh16), *c20 = cpu(core, 5, sh20), *x36 = cpu(core, 5, sh36);
    ghc_tensor_t *t = cpu(core, 1, (const int64_t[]){ 1 }), *txt = cpu(core, 3, (const int64_t[]){ 1, 5, 32 });
    ghc_tensor_t *o16 = cpu(core, 5, sh16), *o36 = cpu(core, 5, sh16), *oe = cpu(core, 5, sh16);
    ghc_tensor_t *g = cpu(core, 5, sh16), *d16 = cpu(core, 5, sh16), *d36 = cpu(core, 5, sh36);
    fill_seq(x16, 1.0f, 0.37f);
    fill_seq(c20, 0.5f, 0.11f);
    fill_seq(txt, 1.0f, 0.05f);
    fill_seq(g, 0.01f, 0.21f);
    memcpy(ghc_tensor_data(x36), ghc_tensor_cdata(x16), ghc_tensor_nbytes(x16));
    memcpy((char *)ghc_tensor_data(x36) + ghc_tensor_nbytes(x16), ghc_tensor_cdata(c20), ghc_tensor_nbytes(c20));
    *(float *)ghc_tensor_data(t) = 950.0f;

    /* noisy 16 + cond 20 is the 36-channel input; dnoisy is its first 16 channels */
    struct ghc_model_batch bc = { .noisy = x16, .timesteps = t, .text_embed = txt, .cond = c20 };
    struct ghc_model_batch bf = { .noisy = x36, .timesteps = t, .text_embed = txt };
    ok(core, ghc_model_forward(model, 0, &bc, o16, true, NULL));
    ok(core, ghc_model_backward(model, 0, g, d16, NULL));
    ok(core, ghc_model_forward(model, 0, &bf, o36, true, NULL));
    ok(core, ghc_model_backward(model, 0, g, d36, NULL));
    ck_assert(same_bits(o16, o36, 0));
    ck_assert(same_bits(d16, d36, 0));
    ck_assert_int_eq(ghc_model_backward(model, 1, g, d16, NULL), GHC_EINVAL);   /* no forward kept */
    /* the other expert has its own weights */
    ok(core, ghc_model_forward(model, 1, &bc, oe, false, NULL));
    ck_assert(!same_bits(o16, oe, 0));
    /* a missing cond is an error naming it */
    struct ghc_model_batch bn = { .noisy = x16, .timesteps = t, .text_embed = txt };
    ck_assert_int_eq(ghc_model_forward(model, 0, &bn, o16, false, NULL), GHC_EINVAL);
    ck_assert_msg(strstr(ghc_error_message(core), "batch.cond"), "%s", ghc_error_message(core));
    ghc_tensor_t *all[] = { x16, c20, x36, t, txt, o16, o36, oe, g, d16, d36 };
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        ghc_tensor_free(all[i]);
    ghc_core_free(core);

    /* two expert files: high noise first; an explicit boundary */
    char cfg[2048];
    snprintf(cfg, sizeof(cfg), "checkpoints = [ \"%s\", \"%s\" ]; heads = 2; dtype = \"f32\"; device = -1; "
             "boundary = 0.5;", fixture("weights_official.safetensors"), fixture("weights_diffusers.safetensors"));
    core = run_core(cfg, false);
    model = ghc_model_get(core);
    ck_assert_int_eq(ghc_model_experts(model), 2);
    ck_assert_int_eq(ghc_model_expert_for(model, 500.0f), 0);
    ck_assert_int_eq(ghc_model_expert_for(model, 499.0f), 1);
    struct fcase c;
    case_open(core, &c, GHC_DEVICE_CPU);
    struct ghc_model_batch b = batch_of(&c, false);
    ghc_tensor_t *p0 = like(core, c.x700, GHC_DEVICE_CPU), *p1 = like(core, c.x700, GHC_DEVICE_CPU);
    ok(core, ghc_model_forward(model, 0, &b, p0, false, NULL));
    ok(core, ghc_model_activate(model, 1));
    ok(core, ghc_model_forward(model, 1, &b, p1, false, NULL));
    ck_assert(same_bits(p0, p1, 0));
    ghc_tensor_free(p0);
    ghc_tensor_free(p1);
    case_close(&c);
    ghc_core_free(core);

    /* configuration errors */
    ghc_core_t *c2 = ghc_core_init();
    ok(c2, ghc_plugin_add_path(c2, tu_env("GHC_BUILD_PLUGINS")));
    ok(c2, ghc_config_load_string(c2, "mempolicy = { plugin = \"host\"; };\nmodel = { plugin = \"wan22\"; "
                                  "device = -1; };\n", "t.cfg", NULL, NULL, 0));
    ck_assert_int_eq(ghc_run_init(c2), GHC_ECONFIG);
    ck_assert_msg(strstr(ghc_error_message(c2), "exactly one of 'checkpoint'"), "%s", ghc_error_message(c2));
    ok(c2, ghc_config_load_string(c2, "mempolicy = { plugin = \"host\"; };\nmodel = { plugin = \"wan22\"; "
                                  "dtype = \"fp4\"; random = { dim = 64; }; };\n", "t.cfg", NULL, NULL, 0));
    ck_assert_int_eq(ghc_run_init(c2), GHC_ECONFIG);
    ghc_core_free(c2);
}
END_TEST

/* ---- fp8 base weights --------------------------------------------------------------------------- */

/* fp8 (e4m3 block linears, dequantised to bf16 per GEMM) gives the bits of a bf16 model whose
 * block linears hold those dequantised values: forward and input gradient. */
START_TEST(fp8_exact)
{
    ghc_core_t *core = ghc_core_init();
    struct wan22 q, b;
    struct wan22_detected det;
    struct fcase c;
    direct_init(&q, core, true);
    direct_base(&q, GHC_DTYPE_BF16);
    q.fp8 = true;
    ok(core, wan22_load(&q, fixture("weights_official.safetensors"), 2, &q.experts[0], GHC_ROLE_WEIGHTS, &det));
    direct_init(&b, core, true);
    direct_base(&b, GHC_DTYPE_BF16);
    ok(core, wan22_load(&b, fixture("weights_official.safetensors"), 2, &b.experts[0], GHC_ROLE_WEIGHTS, &det));
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < WAN22_TARGETS; j++) {
            const ghc_tensor_t *w8 = q.experts[0].blocks[i].w[j];
            float sc = q.experts[0].blocks[i].wscale[j];
            ck_assert_int_eq(ghc_tensor_dtype(w8), GHC_DTYPE_F8_E4M3);
            /* the per-tensor scale maps the largest magnitude to 448 */
            float amax = 0;
            for (int64_t k = 0; k < ghc_tensor_numel(w8); k++)
                amax = fmaxf(amax, fabsf(ghc_e4m3_to_f32(((const uint8_t *)ghc_tensor_cdata(w8))[k])));
            ck_assert_msg(amax == 448.0f, "block %d linear %d: amax %g", i, j, amax);
            ck_assert(sc > 0);
            ok(core, ghc_op_cast(b.experts[0].blocks[i].w[j], w8, sc, NULL, NULL));
        }
    case_open(core, &c, GHC_DEVICE_CPU);
    struct ghc_model_batch bt = batch_of(&c, true);
    ghc_tensor_t *o[2], *d[2], *g = like(core, c.x700, GHC_DEVICE_CPU);
    fill_seq(g, 1e-3f, 0.3f);
    struct wan22 *ms[2] = { &q, &b };
    for (int k = 0; k < 2; k++) {
        o[k] = like(core, c.x700, GHC_DEVICE_CPU);
        d[k] = like(core, c.x700, GHC_DEVICE_CPU);
        ok(core, wan22_forward(ms[k], 0, &bt, o[k], true, NULL));
        ok(core, wan22_backward(ms[k], 0, g, d[k], NULL));
    }
    ck_assert(same_bits(o[0], o[1], 0));
    ck_assert(same_bits(d[0], d[1], 0));
    for (int k = 0; k < 2; k++) {
        ghc_tensor_free(o[k]);
        ghc_tensor_free(d[k]);
    }
    ghc_tensor_free(g);
    case_close(&c);
    direct_free(&b);
    direct_free(&q);
    ghc_core_free(core);
}
END_TEST

/* fp8 through the plugin against the f32 fixture: the quantisation error (1.8% measured).
 * With fp8_gemm the block-linear inputs are e4m3 too (scale 1, saturating): 2.6% measured on
 * the CPU against the fixture and 1.8% against the bf16-GEMM fp8 path; the bounds are about 2x. */
#define TOL_FP8            5e-2
#define TOL_FP8_GEMM       5e-2
#define TOL_FP8_GEMM_DIFF  4e-2

/* The fp8 model's prediction at t = 700 (host copy, *n floats) and its error to the fixture. */
static float *fp8_pred(bool gpu, bool fp8_gemm, size_t *n, double *err)
{
    char cfg[2048];
    int dev = gpu ? 0 : GHC_DEVICE_CPU;
    snprintf(cfg, sizeof(cfg), "checkpoint = \"%s\"; heads = 2; dtype = \"fp8\"; device = %d; fp8_gemm = %s;",
             fixture("weights_official.safetensors"), dev, fp8_gemm ? "true" : "false");
    ghc_core_t *core = run_core(cfg, gpu);
    struct fcase c;
    case_open(core, &c, dev);
    struct ghc_model_batch b = batch_of(&c, true);
    ghc_tensor_t *out = like(core, c.x700, dev);
    for (int k = 0; k < 2; k++)   /* the second run reuses the e4m3 scratch of the first */
        ok(core, ghc_model_forward(ghc_model_get(core), 0, &b, out, false, NULL));
    ghc_tensor_t *ref = load(core, c.st, "pred_700");
    *err = rel_err(core, out, ref);
    *n = (size_t)ghc_tensor_numel(out);
    float *v = snap(core, out);
    ghc_tensor_free(ref);
    ghc_tensor_free(out);
    case_close(&c);
    ghc_core_free(core);
    return v;
}

static void check_fp8(bool gpu)
{
    size_t n, n2;
    double e, e2;
    float *p = fp8_pred(gpu, false, &n, &e);
    printf("%s fp8 (e4m3 block linears, bf16 GEMMs) forward t=700: rel err %.3g\n", gpu ? "gpu" : "cpu", e);
    ck_assert_msg(e < TOL_FP8, "fp8 pred_700: rel err %g", e);
    float *q = fp8_pred(gpu, true, &n2, &e2);
    ck_assert_uint_eq(n, n2);
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)q[i] - p[i]) * ((double)q[i] - p[i]);
        den += (double)p[i] * p[i];
    }
    double d = sqrt(num / den);
    printf("%s fp8_gemm (e4m3 x e4m3 GEMMs) forward t=700: rel err %.3g, %.3g from the bf16-GEMM fp8 path\n",
           gpu ? "gpu" : "cpu", e2, d);
    ck_assert_msg(e2 < TOL_FP8_GEMM, "fp8_gemm pred_700: rel err %g", e2);
    ck_assert_msg(d > 0 && d < TOL_FP8_GEMM_DIFF, "fp8_gemm vs fp8: rel diff %g", d);
    free(p);
    free(q);
}

START_TEST(fp8_fixture)
{
    check_fp8(false);
}
END_TEST

/* fp8_gemm: the backward recomputes a checkpointed block with the same fp8 GEMMs (the bits of
 * checkpointing "off"); fp8_gemm with another dtype is a config error naming the key. */
START_TEST(fp8_gemm_checks)
{
    static const char *const cfgs[2] = { "checkpointing = \"off\";", "checkpointing = \"block\";" };
    float *dx[2], *pred[2], *dA[2][30], loss[2];
    size_t n_x = 0, n_a[30];
    for (int k = 0; k < 2; k++) {
        char cfg[2048];
        snprintf(cfg, sizeof(cfg), "checkpoint = \"%s\"; heads = 2; dtype = \"fp8\"; fp8_gemm = true; "
                 "device = -1; %s", fixture("weights_official.safetensors"), cfgs[k]);
        ghc_core_t *core = run_core(cfg, false);
        struct fcase c;
        struct lora l;
        ghc_tensor_t *p, *d;
        case_open(core, &c, GHC_DEVICE_CPU);
        lora_init(&l, core, ghc_model_get(core), c.st, GHC_DEVICE_CPU);
        loss[k] = train_step(core, &c, &l, GHC_DEVICE_CPU, &p, &d);
        n_x = ghc_tensor_nbytes(d);
        dx[k] = snap(core, d);
        pred[k] = snap(core, p);
        for (int i = 0; i < 30; i++) {
            n_a[i] = ghc_tensor_nbytes(l.dA[i]);
            dA[k][i] = snap(core, l.dA[i]);
        }
        ghc_tensor_free(p);
        ghc_tensor_free(d);
        lora_free(&l);
        case_close(&c);
        ghc_core_free(core);
    }
    ck_assert(loss[0] == loss[1]);
    ck_assert(memcmp(pred[0], pred[1], n_x) == 0);
    ck_assert_msg(memcmp(dx[0], dx[1], n_x) == 0, "fp8_gemm: input gradient differs with recomputation");
    for (int i = 0; i < 30; i++) {
        ck_assert_msg(memcmp(dA[0][i], dA[1][i], n_a[i]) == 0, "fp8_gemm: dA of target %d differs", i);
        free(dA[0][i]);
        free(dA[1][i]);
    }
    for (int k = 0; k < 2; k++) {
        free(dx[k]);
        free(pred[k]);
    }
    static const char *const bad[] = { "dtype = \"bf16\"; fp8_gemm = true;", "dtype = \"f32\"; fp8_gemm = true;",
                                       "fp8_gemm = true;" };
    for (int b = 0; b < 3; b++) {
        char text[1024];
        ghc_core_t *core = ghc_core_init();
        ck_assert_ptr_nonnull(core);
        ok(core, ghc_plugin_add_path(core, tu_env("GHC_BUILD_PLUGINS")));
        snprintf(text, sizeof(text), "mempolicy = { plugin = \"host\"; };\nmodel = { plugin = \"wan22\"; "
                 "checkpoint = \"%s\"; heads = 2; device = -1; %s };\n", fixture("weights_official.safetensors"),
                 bad[b]);
        ok(core, ghc_config_load_string(core, text, "test.cfg", NULL, NULL, 0));
        ck_assert_int_eq(ghc_run_init(core), GHC_ECONFIG);
        ck_assert_msg(strstr(ghc_error_message(core), "fp8_gemm"), "%s", ghc_error_message(core));
        ghc_core_free(core);
    }
}
END_TEST

/* A ComfyUI-style fp8_scaled file (block linears e4m3 + X.scale_weight, a scaled_fp8 marker):
 * dtype bf16 dequantises them; dtype fp8 keeps the file's bytes and scales. */
START_TEST(fp8_scaled_file)
{
    ghc_core_t *core = ghc_core_init();
    char *dir = tu_tmpdir(), path[1024];
    ghc_st_t *st = ghc_st_open(core, fixture("weights_official.safetensors"));
    ghc_st_writer_t *w = ghc_st_writer_init(core);
    ok(core, ghc_st_writer_add_raw(w, "scaled_fp8", GHC_DTYPE_F8_E4M3, 1, (const int64_t[]){ 0 }, NULL));
    for (int i = 0; i < ghc_st_count(st); i++) {
        struct ghc_st_info info;
        ghc_st_info_at(st, i, &info);
        char nm[256];
        snprintf(nm, sizeof(nm), "model.diffusion_model.%s", info.name);
        bool lin = strncmp(info.name, "blocks.", 7) == 0 && info.ndim == 2;
        if (!lin) {
            ok(core, ghc_st_writer_add_raw(w, nm, info.dtype, info.ndim, info.shape, ghc_st_raw(st, info.name)));
            continue;
        }
        ghc_tensor_t *f = load(core, st, info.name);
        ghc_tensor_t *q = ghc_tensor_init(core, GHC_DTYPE_F8_E4M3, info.ndim, info.shape, -1, GHC_ROLE_WORKSPACE);
        float sc = 0.5f / 448.0f * (float)(1 + i % 3);   /* any scale; values saturate where they must */
        ok(core, ghc_tensor_convert_cpu(q, f, 1.0f / sc));
        ok(core, ghc_st_writer_add(w, nm, q));
        nm[strlen(nm) - 7] = '\0';
        strcat(nm, ".scale_weight");
        ok(core, ghc_st_writer_add_raw(w, nm, GHC_DTYPE_F32, 0, NULL, &sc));
        ghc_tensor_free(q);
        ghc_tensor_free(f);
    }
    snprintf(path, sizeof(path), "%s/wan_fp8_scaled.safetensors", dir);
    ok(core, ghc_st_writer_finish(w, path));
    ghc_st_writer_free(w);
    ghc_st_free(st);

    struct wan22 a, b;
    struct wan22_detected det;
    direct_init(&a, core, false);
    direct_base(&a, GHC_DTYPE_BF16);
    ok(core, wan22_load(&a, path, 2, &a.experts[0], GHC_ROLE_WEIGHTS, &det));
    ck_assert(det.fp8_scaled);
    direct_init(&b, core, false);
    direct_base(&b, GHC_DTYPE_BF16);
    b.fp8 = true;
    ok(core, wan22_load(&b, path, 2, &b.experts[0], GHC_ROLE_WEIGHTS, &det));
    st = ghc_st_open(core, path);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < WAN22_TARGETS; j++) {
            const ghc_tensor_t *w8 = b.experts[0].blocks[i].w[j], *wb = a.experts[0].blocks[i].w[j];
            float sc = b.experts[0].blocks[i].wscale[j];
            char nm[256];
            snprintf(nm, sizeof(nm), "model.diffusion_model.blocks.%d.%s.weight", i,
                     (const char *[]){ "self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o", "cross_attn.q",
                                       "cross_attn.k", "cross_attn.v", "cross_attn.o", "ffn.0", "ffn.2" }[j]);
            ck_assert_msg(memcmp(ghc_tensor_cdata(w8), ghc_st_raw(st, nm), ghc_tensor_nbytes(w8)) == 0,
                          "%s: fp8 bytes not kept", nm);
            for (int64_t k = 0; k < ghc_tensor_numel(w8); k++) {
                float v8 = ghc_e4m3_to_f32(((const uint8_t *)ghc_tensor_cdata(w8))[k]);
                float want = ghc_bf16_to_f32(ghc_f32_to_bf16(v8 * sc));
                ck_assert_msg(ghc_bf16_to_f32(((const uint16_t *)ghc_tensor_cdata(wb))[k]) == want,
                              "%s[%lld]: dequantised value", nm, (long long)k);
            }
        }
    ghc_st_free(st);
    direct_free(&b);
    direct_free(&a);
    tu_rm_rf(dir);
    free(dir);
    ghc_core_free(core);
}
END_TEST

/* The bf16 path (bf16 GEMM operands and attention, f32 everything else) on the CPU: what the
 * GPU runs, with the reference kernels. */
START_TEST(bf16_cpu)
{
    char cfg[2048];
    snprintf(cfg, sizeof(cfg), "checkpoint = \"%s\"; heads = 2; dtype = \"bf16\"; device = -1;",
             fixture("weights_official.safetensors"));
    ghc_core_t *core = run_core(cfg, false);
    check_lora(core, GHC_DEVICE_CPU, TOL_BF16, TOL_BF16 * 2.5, 0);
    ghc_core_free(core);
}
END_TEST

/* ffn.0 and v in the GEMM dtype (bf16 on the CPU, checkpointing off: every block keeps its
 * activations): a block's kept h1 and g are the bits of its ffn.0 product in f32 (the bias given
 * in bf16's values) rounded to bf16, and of the GELU of that unrounded product rounded to bf16
 * (ghc_linear_forward_gelu's fused epilogue, not the GELU of the rounded h1); v is the bf16
 * product with the bias rounded to bf16 (ghc_op_gemm's bias in bf16, rounded once). */
START_TEST(ffn_gelu_bf16)
{
    ghc_core_t *core = ghc_core_init();
    struct wan22 m;
    struct wan22_detected det;
    struct fcase c;
    direct_init(&m, core, false);
    direct_base(&m, GHC_DTYPE_BF16);
    ok(core, wan22_load(&m, fixture("weights_official.safetensors"), 2, &m.experts[0], GHC_ROLE_WEIGHTS, &det));
    case_open(core, &c, GHC_DEVICE_CPU);
    struct ghc_model_batch bt = batch_of(&c, true);
    ghc_tensor_t *o = like(core, c.x700, GHC_DEVICE_CPU);
    ok(core, wan22_forward(&m, 0, &bt, o, true, NULL));
    ck_assert_ptr_null(m.st.fh1);   /* nothing recomputed: no chunk scratch */
    const int64_t D = m.d.dim, F = m.d.ffn_dim;
    int64_t moved = 0, total = 0;
    for (int64_t i = 0; i < m.d.layers; i++) {
        const struct wan22_block_w *bw = &m.experts[0].blocks[i];
        struct wan22_act *a = &m.st.acts[wan22_act_slot(&m, i)];
        ck_assert(a->h1 && ghc_tensor_dtype(a->h1) == GHC_DTYPE_BF16 && ghc_tensor_dtype(a->v) == GHC_DTYPE_BF16);
        const int64_t BL = ghc_tensor_numel(a->u2) / D;
        ghc_tensor_t *b16 = ghc_tensor_init(core, GHC_DTYPE_BF16, 1, &F, GHC_DEVICE_CPU, GHC_ROLE_WORKSPACE);
        ghc_tensor_t *bq = ghc_tensor_init(core, GHC_DTYPE_F32, 1, &F, GHC_DEVICE_CPU, GHC_ROLE_WORKSPACE);
        ghc_tensor_t *pre = mk(core, GHC_DEVICE_CPU, 3, (const int64_t[]){ 1, BL, F });
        ghc_tensor_t *h = ghc_tensor_init(core, GHC_DTYPE_BF16, 3, (const int64_t[]){ 1, BL, F }, GHC_DEVICE_CPU,
                                          GHC_ROLE_WORKSPACE);
        ghc_tensor_t *gr = ghc_tensor_init(core, GHC_DTYPE_BF16, 3, (const int64_t[]){ 1, BL, F }, GHC_DEVICE_CPU,
                                           GHC_ROLE_WORKSPACE);
        ghc_tensor_t *gh = ghc_tensor_init(core, GHC_DTYPE_BF16, 3, (const int64_t[]){ 1, BL, F }, GHC_DEVICE_CPU,
                                           GHC_ROLE_WORKSPACE);
        ck_assert(b16 && bq && h && gr && gh);
        ok(core, ghc_op_cast(b16, bw->b[WAN22_FFN_0], 1.0f, NULL, NULL));
        ok(core, ghc_op_cast(bq, b16, 1.0f, NULL, NULL));
        struct ghc_linear lin = { .target = -1, .w = bw->w[WAN22_FFN_0], .w_scale = 1.0f, .b = bq, .out = F, .in = D };
        ok(core, ghc_linear_forward(m.lin, &lin, pre, a->u2, NULL, NULL));   /* f32: the bias as given */
        ok(core, ghc_op_cast(h, pre, 1.0f, NULL, NULL));
        ok(core, ghc_op_gelu_tanh(gr, pre, NULL));
        ok(core, ghc_op_gelu_tanh(gh, a->h1, NULL));
        ck_assert_msg(memcmp(ghc_tensor_cdata(h), ghc_tensor_cdata(a->h1), ghc_tensor_nbytes(h)) == 0,
                      "block %lld: h1", (long long)i);
        ck_assert_msg(memcmp(ghc_tensor_cdata(gr), ghc_tensor_cdata(a->g), ghc_tensor_nbytes(gr)) == 0,
                      "block %lld: g", (long long)i);
        for (int64_t k = 0; k < ghc_tensor_numel(gh); k++)
            moved += ((const uint16_t *)ghc_tensor_cdata(gh))[k] != ((const uint16_t *)ghc_tensor_cdata(a->g))[k];
        total += ghc_tensor_numel(gh);
        /* v: the bf16 product with the bias in bf16 */
        ghc_tensor_t *vb = ghc_tensor_init(core, GHC_DTYPE_BF16, 1, &D, GHC_DEVICE_CPU, GHC_ROLE_WORKSPACE);
        ghc_tensor_t *v = ghc_tensor_init(core, GHC_DTYPE_BF16, 3, (const int64_t[]){ 1, BL, D }, GHC_DEVICE_CPU,
                                          GHC_ROLE_WORKSPACE);
        ck_assert(vb && v);
        ok(core, ghc_op_cast(vb, bw->b[WAN22_SA_V], 1.0f, NULL, NULL));
        ok(core, ghc_op_gemm(v, a->u, bw->w[WAN22_SA_V],
                             &(struct ghc_gemm){ .trans_b = true, .epilogue = GHC_EPI_BIAS, .bias = vb }, NULL));
        ck_assert_msg(memcmp(ghc_tensor_cdata(v), ghc_tensor_cdata(a->v), ghc_tensor_nbytes(v)) == 0, "block %lld: v",
                      (long long)i);
        ghc_tensor_t *all[] = { b16, bq, pre, h, gr, gh, vb, v };
        for (size_t k = 0; k < sizeof(all) / sizeof(all[0]); k++)
            ghc_tensor_free(all[k]);
    }
    printf("ffn_gelu_bf16: the fused GELU differs from the GELU of the rounded h1 in %lld of %lld\n",
           (long long)moved, (long long)total);
    ck_assert_int_gt(moved, 0);
    ghc_tensor_free(o);
    case_close(&c);
    direct_free(&m);
    ghc_core_free(core);
}
END_TEST

/* ---- GPU ---------------------------------------------------------------------------------------- */

START_TEST(gpu_bf16)
{
    ghc_core_t *core = fixture_core(NULL, true);
    struct fcase c;
    case_open(core, &c, 0);
    struct ghc_model_batch b = batch_of(&c, true);
    ghc_tensor_t *out = like(core, c.x700, 0);
    ok(core, ghc_model_forward(ghc_model_get(core), 0, &b, out, false, NULL));
    ghc_tensor_t *ref = load(core, c.st, "pred_700");
    double e = rel_err(core, out, ref);
    printf("gpu bf16 forward t=700: rel err %.3g\n", e);
    ck_assert_msg(e < TOL_BF16, "pred_700 (bf16): rel err %g", e);
    ghc_tensor_free(ref);
    ghc_tensor_free(out);
    case_close(&c);
    /* bf16: the small cross-attention q/k gradients come out of cancellations over the pad
     * keys and are not meaningful one by one in bf16; all 60 together are checked */
    check_lora(core, 0, TOL_BF16, TOL_BF16 * 2.5, 0);
    ghc_core_free(core);
    check_fp8(true);
}
END_TEST

int main(void)
{
#ifdef GHC_HAVE_CUDA
    have_gpu = ghc_k_device_count() > 0;
#endif
    Suite *s = suite_create("wan22");
    TCase *tc = tcase_create("detect");
    tcase_add_test(tc, detect_variants);
    tcase_add_test(tc, detect_errors);
    tcase_add_test(tc, names_and_targets);
    tcase_add_test(tc, merge_names);
    suite_add_tcase(s, tc);
    tc = tcase_create("load");
    tcase_add_test(tc, load_layouts);
    tcase_add_test(tc, load_errors);
    tcase_add_test(tc, huge_block_index);
    suite_add_tcase(s, tc);
    tc = tcase_create("forward");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, forward_fixture);
    tcase_add_test(tc, intermediates);
    suite_add_tcase(s, tc);
    tc = tcase_create("backward");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, backward_base);
    tcase_add_test(tc, backward_lora);
    tcase_add_test(tc, checkpointing_same);
    tcase_add_test(tc, ffn_chunked);
    tcase_add_test(tc, hook_fails_silently);
    suite_add_tcase(s, tc);
    tc = tcase_create("inputs");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, batch_and_padding);
    tcase_add_test(tc, experts_and_i2v);
    suite_add_tcase(s, tc);
    tc = tcase_create("fp8");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, fp8_exact);
    tcase_add_test(tc, fp8_fixture);
    tcase_add_test(tc, fp8_gemm_checks);
    tcase_add_test(tc, fp8_scaled_file);
    tcase_add_test(tc, bf16_cpu);
    tcase_add_test(tc, ffn_gelu_bf16);
    suite_add_tcase(s, tc);
    if (have_gpu) {
        tc = tcase_create("gpu");
        tcase_set_timeout(tc, 300);
        tcase_add_test(tc, gpu_bf16);
        suite_add_tcase(s, tc);
    } else {
        printf("no CUDA device: the bf16 GPU case is skipped\n");
    }
    return tu_run_suite(s, have_gpu);
}
