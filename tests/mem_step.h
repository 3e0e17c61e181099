/* mem_step.h: one training step of a tiny wan22 model under a given memory policy, shared by
 * test_mem (CPU, host policy: estimate against the measured peak) and test_mem_cuda (equal
 * losses under device, gh200_uvm and offload). Header-only: static functions, one copy per
 * test program. */
#ifndef GHC_MEM_STEP_H
#define GHC_MEM_STEP_H

#include <gh200core/gh200core.h>
#include <gh200core/mempolicy.h>
#include <gh200core/model.h>
#include <gh200core/ops.h>

#include "testutil.h"

struct mem_step {
    double               loss[2];        /* per expert: mean of out^2 */
    float               *out[2], *dx[2]; /* host copies, n floats each (caller frees) */
    int64_t              n;
    struct ghc_mem_stats stats;          /* after the step, before anything is freed */
};

static void ms_ok(ghc_core_t *core, int rc)
{
    ck_assert_msg(rc == 0, "status %d: %s", rc, ghc_error_message(core));
}

/* A tensor on `device` filled from host values v (or zeros). */
static ghc_tensor_t *ms_tensor(ghc_core_t *core, int device, enum ghc_mem_role role, int ndim, const int64_t *shape,
                               const float *v)
{
    ghc_tensor_t *t = ghc_tensor_init(core, GHC_DTYPE_F32, ndim, shape, device, role);
    ck_assert_msg(t != NULL, "%s", ghc_error_message(core));
    int64_t n = ghc_tensor_numel(t);
    ghc_tensor_t *h = ghc_tensor_init(core, GHC_DTYPE_F32, ndim, shape, GHC_DEVICE_CPU, GHC_ROLE_WORKSPACE);
    ck_assert_ptr_nonnull(h);
    float *p = ghc_tensor_data(h);
    for (int64_t i = 0; i < n; i++)
        p[i] = v ? v[i] : 0.0f;
    ms_ok(core, ghc_op_copy(t, h, NULL));
    ms_ok(core, ghc_op_sync(core, device, NULL));
    ghc_tensor_free(h);
    return t;
}

static float *ms_host(ghc_core_t *core, const ghc_tensor_t *t, int device)
{
    int64_t n = ghc_tensor_numel(t);
    ghc_tensor_t *h = ghc_tensor_init(core, GHC_DTYPE_F32, ghc_tensor_ndim(t), ghc_tensor_shape(t), GHC_DEVICE_CPU,
                                      GHC_ROLE_WORKSPACE);
    ck_assert_ptr_nonnull(h);
    ms_ok(core, ghc_op_copy(h, t, NULL));
    ms_ok(core, ghc_op_sync(core, device, NULL));
    float *v = malloc((size_t)n * sizeof(float));
    ck_assert_ptr_nonnull(v);
    memcpy(v, ghc_tensor_data(h), (size_t)n * sizeof(float));
    ghc_tensor_free(h);
    return v;
}

/* Forward (keep) and backward of every expert of the run's model on a seeded batch of B x
 * C x T x Hl x Wl latents, loss = mean(out^2). `cfg` is the whole configuration text. */
static void mem_step_run(const char *cfg, int device, int64_t B, int64_t C, int64_t T, int64_t Hl, int64_t Wl,
                         int64_t text_dim, struct mem_step *r)
{
    memset(r, 0, sizeof(*r));   /* a one-expert model leaves out[1], dx[1] NULL */
    ghc_core_t *core = ghc_core_init();
    ck_assert_ptr_nonnull(core);
    ms_ok(core, ghc_plugin_add_path(core, tu_env("GHC_BUILD_PLUGINS")));
    ms_ok(core, ghc_config_load_string(core, cfg, "step.cfg", NULL, NULL, 0));
    ms_ok(core, ghc_run_init(core));
    ghc_model_t *model = ghc_model_get(core);
    ck_assert_ptr_nonnull(model);
    const int64_t lat[5] = { B, C, T, Hl, Wl }, n = B * C * T * Hl * Wl, Lt = 16;
    float *v = malloc((size_t)(n > B * Lt * text_dim ? n : B * Lt * text_dim) * sizeof(float));
    ck_assert_ptr_nonnull(v);
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        v[i] = (float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
    ghc_tensor_t *noisy = ms_tensor(core, device, GHC_ROLE_LATENTS, 5, lat, v);
    for (int64_t i = 0; i < B * Lt * text_dim; i++)
        v[i] = (float)sin(0.37 * (double)i) * 0.5f;
    ghc_tensor_t *text = ms_tensor(core, device, GHC_ROLE_TEXT_EMBEDS, 3, (const int64_t[]){ B, Lt, text_dim }, v);
    float tv[8] = { 950.0f, 300.0f, 500.0f, 700.0f, 100.0f, 800.0f, 200.0f, 600.0f };
    ghc_tensor_t *ts = ms_tensor(core, device, GHC_ROLE_WORKSPACE, 1, (const int64_t[]){ B }, tv);
    ghc_tensor_t *out = ms_tensor(core, device, GHC_ROLE_ACTIVATIONS, 5, lat, NULL);
    ghc_tensor_t *dout = ms_tensor(core, device, GHC_ROLE_ACTIVATIONS, 5, lat, NULL);
    ghc_tensor_t *dx = ms_tensor(core, device, GHC_ROLE_ACTIVATIONS, 5, lat, NULL);
    struct ghc_model_batch batch = { .noisy = noisy, .timesteps = ts, .text_embed = text };
    r->n = n;
    for (int32_t e = 0; e < ghc_model_experts(model); e++) {
        ms_ok(core, ghc_model_activate(model, e));
        ms_ok(core, ghc_model_forward(model, e, &batch, out, true, NULL));
        r->out[e] = ms_host(core, out, device);
        double sum = 0;
        for (int64_t i = 0; i < n; i++) {
            sum += (double)r->out[e][i] * r->out[e][i];
            v[i] = 2.0f * r->out[e][i] / (float)n;
        }
        r->loss[e] = sum / (double)n;
        ghc_tensor_t *g = ms_tensor(core, device, GHC_ROLE_ACTIVATIONS, 5, lat, v);
        ms_ok(core, ghc_op_copy(dout, g, NULL));
        ghc_tensor_free(g);
        ms_ok(core, ghc_model_backward(model, e, dout, dx, NULL));
        r->dx[e] = ms_host(core, dx, device);
    }
    r->stats = (struct ghc_mem_stats){ .struct_size = sizeof(r->stats) };
    ms_ok(core, ghc_mem_stats(ghc_mempolicy_get(core), &r->stats));
    ghc_tensor_free(noisy);
    ghc_tensor_free(text);
    ghc_tensor_free(ts);
    ghc_tensor_free(out);
    ghc_tensor_free(dout);
    ghc_tensor_free(dx);
    free(v);
    ghc_core_free(core);
}

static void mem_step_free(struct mem_step *r)
{
    for (int e = 0; e < 2; e++) {
        free(r->out[e]);
        free(r->dx[e]);
    }
}

#endif /* GHC_MEM_STEP_H */
