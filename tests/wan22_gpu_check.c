/* wan22_gpu_check.c: one forward (keep) and one backward of the wan22 plugin on the GPU, bf16,
 * for the full-size check against diffusers (tests/fixtures/wan22_a14b_block_check.py).
 * Not part of the test suite: built by `make tests/wan22_gpu_check`, run on the GPU machine.
 *
 *   wan22_gpu_check CHECKPOINT INPUTS OUTPUT
 *
 * INPUTS (safetensors): x_sigma [1,16,F,H,W] f32, t (scalar or [1]) f32, text [1,L,text_dim]
 * f32, dout [1,16,F,H,W] f32 (the upstream gradient of the prediction).
 * OUTPUT (safetensors): pred and dx (= d(sum(pred * dout)) / d x_sigma), f32.
 * The plugin is loaded from $GHC_BUILD_PLUGINS (default plugins/.libs). */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <gh200core/gh200core.h>
#include <gh200core/ops.h>
#include <gh200core/safetensors.h>

static ghc_core_t *core;

static void die(const char *what, int rc)
{
    fprintf(stderr, "wan22_gpu_check: %s failed (%d): %s\n", what, rc, core ? ghc_error_message(core) : "");
    exit(1);
}

#define OK(what, expr) do { int rc_ = (expr); if (rc_ != 0) die(what, rc_); } while (0)

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static ghc_tensor_t *mk(int device, int ndim, const int64_t *shape)
{
    ghc_tensor_t *t = ghc_tensor_init(core, GHC_DTYPE_F32, ndim, shape, device, GHC_ROLE_ACTIVATIONS);
    if (!t)
        die("tensor", -1);
    return t;
}

/* t copied to `device` (f32). */
static ghc_tensor_t *to_dev(const ghc_tensor_t *t, int device)
{
    ghc_tensor_t *d = mk(device, ghc_tensor_ndim(t), ghc_tensor_shape(t));
    OK("copy", ghc_op_copy(d, t, NULL));
    OK("sync", ghc_op_sync(core, device == GHC_DEVICE_CPU ? ghc_tensor_device(t) : device, NULL));
    return d;
}

static ghc_tensor_t *input(ghc_st_t *st, const char *name, int device)
{
    ghc_tensor_t *h = ghc_st_load(st, name, GHC_DTYPE_F32, GHC_ROLE_WORKSPACE);
    if (!h)
        die(name, -1);
    if (ghc_tensor_ndim(h) == 0)
        OK("reshape", ghc_tensor_reshape(h, 1, (const int64_t[]){ 1 }));
    ghc_tensor_t *d = to_dev(h, device);
    ghc_tensor_free(h);
    return d;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s CHECKPOINT INPUTS OUTPUT\n", argv[0]);
        return 2;
    }
    const int dev = 0;
    const char *plugins = getenv("GHC_BUILD_PLUGINS");
    double t0 = now();
    core = ghc_core_init();
    if (!core)
        die("ghc_core_init", -1);
    OK("plugin path", ghc_plugin_add_path(core, plugins && *plugins ? plugins : "plugins/.libs"));
    char text[4096];
    snprintf(text, sizeof(text),
             "mempolicy = { plugin = \"device\"; };\n"
             "model = { plugin = \"wan22\"; checkpoint = \"%s\"; dtype = \"bf16\"; device = %d; "
             "checkpointing = \"off\"; };\n", argv[1], dev);
    OK("config", ghc_config_load_string(core, text, "wan22_gpu_check.cfg", NULL, NULL, 0));
    OK("run init (model load)", ghc_run_init(core));
    double t_load = now() - t0;

    ghc_st_t *st = ghc_st_open(core, argv[2]);
    if (!st)
        die(argv[2], -1);
    ghc_tensor_t *x = input(st, "x_sigma", dev), *t = input(st, "t", dev), *txt = input(st, "text", dev);
    ghc_tensor_t *dout = input(st, "dout", dev);
    ghc_st_free(st);

    ghc_model_t *model = ghc_model_get(core);
    if (!model)
        die("ghc_model_get", -1);
    ghc_tensor_t *pred = mk(dev, ghc_tensor_ndim(x), ghc_tensor_shape(x));
    ghc_tensor_t *dx = mk(dev, ghc_tensor_ndim(x), ghc_tensor_shape(x));
    struct ghc_model_batch b = { .noisy = x, .timesteps = t, .text_embed = txt };

    /* a warm-up pair first (cuBLAS handles, workspaces), then the timed pair whose results are written */
    double tf = 0, tb = 0;
    for (int rep = 0; rep < 2; rep++) {
        OK("sync", ghc_op_sync(core, dev, NULL));
        double a = now();
        OK("ghc_model_forward", ghc_model_forward(model, 0, &b, pred, true, NULL));
        OK("sync", ghc_op_sync(core, dev, NULL));
        double m = now();
        OK("ghc_model_backward", ghc_model_backward(model, 0, dout, dx, NULL));
        OK("sync", ghc_op_sync(core, dev, NULL));
        tf = m - a;
        tb = now() - m;
        printf("wan22_gpu_check: %s forward %.1f ms, backward %.1f ms\n", rep ? "timed " : "warm-up",
               1e3 * tf, 1e3 * tb);
    }
    printf("wan22_gpu_check: load %.2f s; forward %.1f ms, backward %.1f ms\n", t_load, 1e3 * tf, 1e3 * tb);

    ghc_tensor_t *hp = to_dev(pred, GHC_DEVICE_CPU), *hd = to_dev(dx, GHC_DEVICE_CPU);
    ghc_st_writer_t *w = ghc_st_writer_init(core);
    if (!w)
        die("ghc_st_writer_init", -1);
    OK("write pred", ghc_st_writer_add(w, "pred", hp));
    OK("write dx", ghc_st_writer_add(w, "dx", hd));
    OK("write", ghc_st_writer_finish(w, argv[3]));
    ghc_st_writer_free(w);
    printf("wan22_gpu_check: wrote %s\n", argv[3]);

    ghc_tensor_t *all[] = { hp, hd, pred, dx, x, t, txt, dout };
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        ghc_tensor_free(all[i]);
    ghc_core_free(core);
    return 0;
}
