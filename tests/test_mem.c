/* test_mem.c: the memory policies on the CPU. The gh200_uvm state machine (uvm_sm.c, linked
 * in) against a simulated device budget: transitions at the thresholds, light reclamation
 * before a change of stage, no oscillation inside the hysteresis band, the stage after caches
 * are emptied, the managed cap with hard reclamation, the discrete safety rule; platform
 * classes, caps, advice by role and setting parsing; bad settings of the policies and a
 * policy that needs a GPU on a machine without one (CUDA_VISIBLE_DEVICES is emptied so this
 * holds on a GPU machine too); the host policy's out-of-memory message; the saved-activation
 * ring (plugins/offload/saved.c, linked in) driven as wan22 drives it, its copies and events
 * replayed on two simulated streams with vector clocks: no copy races a kernel on a buffer or a
 * home, and every read sees the bytes its unit's last write pass left; the saved role through
 * the host policy; the encoders' roles through the host policy (tiny random VAE and umT5:
 * nothing under the model's roles); and the `estimate` and `diag` commands of the CLI. */
#include <config.h>

#include <math.h>

#include <gh200core/gh200core.h>
#include <gh200core/mempolicy.h>
#include <gh200core/safetensors.h>

#include "../core/cli.h"
#include "../plugins/gh200_uvm/uvm_sm.h"
#include "../plugins/offload/saved.h"
#include "mem_step.h"
#include "testutil.h"

#define GiB ((uint64_t)1 << 30)

/* ---- a simulated device: used bytes, cached pool slack, reclamation counts ------------------- */

struct sim {
    uint64_t total, used, slack;   /* free = total - used - slack */
    int      light, hard;
    uint64_t hard_frees;           /* what a hard reclamation frees beyond the slack */
};

static uint64_t sim_free(void *u)
{
    struct sim *s = u;
    return s->total - s->used - s->slack;
}
static void sim_light(void *u)
{
    struct sim *s = u;
    s->slack = 0;
    s->light++;
}
static void sim_hard(void *u)
{
    struct sim *s = u;
    s->slack = 0;
    s->used -= s->hard_frees;
    s->hard_frees = 0;
    s->hard++;
}

/* An 80 GiB device: t_in = max(0.15 x 80, 10) = 12 GiB, hysteresis 4 GiB, cap 400 GiB. */
static void sim_setup(struct uvm_sm *sm, struct sim *s, struct uvm_env *env, bool discrete, uint64_t cap)
{
    *s = (struct sim){ .total = 80 * GiB };
    *env = (struct uvm_env){ s, sim_free, sim_light, sim_hard };
    uvm_sm_init(sm, 80 * GiB, 0.15, 10 * GiB, 0.05, cap, 1 * GiB, discrete);
    ck_assert_uint_eq(sm->cfg.t_in, 12 * GiB);
    ck_assert_uint_eq(sm->cfg.hysteresis, 4 * GiB);
}

/* Place and, for device placements, count the bytes as used on the simulated device. */
static enum uvm_where place(struct uvm_sm *sm, struct uvm_env *env, struct sim *s, uint64_t bytes)
{
    enum uvm_where w = UVM_AT_DEVICE;
    ck_assert_int_eq(uvm_sm_place(sm, env, bytes, UVM_KIND_STAGE, &w), UVM_OK);
    if (w == UVM_AT_DEVICE)
        s->used += bytes;
    return w;
}

START_TEST(sm_threshold)
{
    struct uvm_sm sm;
    struct sim s;
    struct uvm_env env;
    sim_setup(&sm, &s, &env, false, 400 * GiB);
    /* 60 GiB leaves 20 free: stage 0, on the device, no reclamation */
    ck_assert_int_eq(place(&sm, &env, &s, 60 * GiB), UVM_AT_DEVICE);
    ck_assert_int_eq(sm.stage, 0);
    ck_assert_int_eq(s.light, 0);
    /* 8 more would leave exactly 12 = t_in: still stage 0 */
    ck_assert_int_eq(place(&sm, &env, &s, 8 * GiB), UVM_AT_DEVICE);
    ck_assert_int_eq(sm.stage, 0);
    /* one byte more would cross t_in: a light reclamation first, then stage 1, managed */
    ck_assert_int_eq(place(&sm, &env, &s, 1), UVM_AT_MANAGED);
    ck_assert_int_eq(s.light, 1);
    ck_assert_int_eq(sm.light, 1);
    ck_assert_int_eq(sm.stage, 1);
    ck_assert_uint_eq(sm.transitions, 1);
    ck_assert_uint_eq(sm.managed, 1);
    ck_assert_uint_eq(s.used, 68 * GiB);   /* the managed byte is not device memory */
}
END_TEST

START_TEST(sm_light_rescues)
{
    struct uvm_sm sm;
    struct sim s;
    struct uvm_env env;
    sim_setup(&sm, &s, &env, false, 400 * GiB);
    s.used = 50 * GiB;
    s.slack = 15 * GiB;   /* 15 free; the pool caches 15 more */
    /* 10 GiB would leave 5 < 12, but after the light reclamation 20 are left: stay in stage 0 */
    ck_assert_int_eq(place(&sm, &env, &s, 10 * GiB), UVM_AT_DEVICE);
    ck_assert_int_eq(s.light, 1);
    ck_assert_int_eq(sm.stage, 0);
    ck_assert_uint_eq(sm.transitions, 0);
}
END_TEST

START_TEST(sm_no_oscillation)
{
    struct uvm_sm sm;
    struct sim s;
    struct uvm_env env;
    sim_setup(&sm, &s, &env, false, 400 * GiB);
    s.used = 69 * GiB;                                   /* 11 free: below t_in */
    ck_assert_int_eq(place(&sm, &env, &s, GiB), UVM_AT_MANAGED);
    ck_assert_int_eq(sm.stage, 1);
    /* free memory wanders inside [t_in, t_in + hysteresis) = [12, 16): stage 1 stays */
    for (int i = 0; i < 20; i++) {
        s.used = (i % 2 ? 66 : 63) * GiB;                /* 14 or 17 free before the request */
        ck_assert_int_eq(place(&sm, &env, &s, 2 * GiB), UVM_AT_MANAGED);   /* leaves 12 or 15 */
        uvm_sm_release(&sm, 2 * GiB);
        ck_assert_int_eq(sm.stage, 1);
    }
    ck_assert_uint_eq(sm.transitions, 1);
    /* past the band: back to stage 0 and on the device */
    s.used = 50 * GiB;                                   /* 30 free, 28 left >= 16 */
    ck_assert_int_eq(place(&sm, &env, &s, 2 * GiB), UVM_AT_DEVICE);
    ck_assert_int_eq(sm.stage, 0);
    ck_assert_uint_eq(sm.transitions, 2);
    /* and in stage 0 a request that leaves free inside the band stays on the device */
    s.used = 60 * GiB;                                   /* 20 free, 13 left after 7 */
    ck_assert_int_eq(place(&sm, &env, &s, 7 * GiB), UVM_AT_DEVICE);
    ck_assert_int_eq(sm.stage, 0);
    ck_assert_uint_eq(sm.transitions, 2);
}
END_TEST

START_TEST(sm_after_empty_cache)
{
    struct uvm_sm sm;
    struct sim s;
    struct uvm_env env;
    sim_setup(&sm, &s, &env, false, 400 * GiB);
    s.used = 75 * GiB;
    ck_assert_int_eq(place(&sm, &env, &s, GiB), UVM_AT_MANAGED);
    ck_assert_int_eq(sm.stage, 1);
    /* 40 GiB of device memory is released, but the pool keeps it cached: free stays low, so a
     * re-evaluation keeps stage 1 */
    s.used -= 40 * GiB;
    s.slack += 40 * GiB;
    uvm_sm_reevaluate(&sm, sim_free(&s));
    ck_assert_int_eq(sm.stage, 1);
    /* emptying the caches (light reclamation) and re-evaluating returns to stage 0 */
    sim_light(&s);
    uvm_sm_reevaluate(&sm, sim_free(&s));
    ck_assert_int_eq(sm.stage, 0);
    ck_assert_uint_eq(sm.transitions, 2);
    /* a re-evaluation inside the band changes nothing */
    s.used = 66 * GiB;   /* 14 free */
    uvm_sm_reevaluate(&sm, sim_free(&s));
    ck_assert_int_eq(sm.stage, 0);
    s.used = 69 * GiB;   /* 11 free: below t_in */
    uvm_sm_reevaluate(&sm, sim_free(&s));
    ck_assert_int_eq(sm.stage, 1);
    s.used = 66 * GiB;   /* 14 free: inside the band, stays 1 */
    uvm_sm_reevaluate(&sm, sim_free(&s));
    ck_assert_int_eq(sm.stage, 1);
    ck_assert_uint_eq(sm.transitions, 3);
}
END_TEST

START_TEST(sm_cap_and_hard)
{
    struct uvm_sm sm;
    struct sim s;
    struct uvm_env env;
    enum uvm_where w;
    sim_setup(&sm, &s, &env, false, 100 * GiB);   /* coherent-like: managed may pass HBM up to the cap */
    s.used = 70 * GiB;
    ck_assert_int_eq(place(&sm, &env, &s, 90 * GiB), UVM_AT_MANAGED);   /* 90 > HBM's 80: allowed */
    ck_assert_int_eq(s.hard, 0);
    /* 20 more would pass the 100 GiB cap: one hard reclamation, then out of memory, nothing counted */
    ck_assert_int_eq(uvm_sm_place(&sm, &env, 20 * GiB, UVM_KIND_STAGE, &w), UVM_OOM_CAP);
    ck_assert_int_eq(s.hard, 1);
    ck_assert_uint_eq(sm.hard, 1);
    ck_assert_uint_eq(sm.managed, 90 * GiB);
    /* after a release it fits */
    uvm_sm_release(&sm, 30 * GiB);
    ck_assert_int_eq(uvm_sm_place(&sm, &env, 20 * GiB, UVM_KIND_STAGE, &w), UVM_OK);
    ck_assert_int_eq(w, UVM_AT_MANAGED);
    ck_assert_uint_eq(sm.managed, 80 * GiB);
}
END_TEST

START_TEST(sm_discrete_never_past_free)
{
    struct uvm_sm sm;
    struct sim s;
    struct uvm_env env;
    enum uvm_where w;
    sim_setup(&sm, &s, &env, true, 400 * GiB);   /* even with a large cap, discrete follows free memory */
    s.used = 70 * GiB;                             /* 10 free, headroom 1 */
    ck_assert_int_eq(place(&sm, &env, &s, 5 * GiB), UVM_AT_MANAGED);
    ck_assert_int_eq(place(&sm, &env, &s, 4 * GiB), UVM_AT_MANAGED);   /* 9 + 1 headroom = 10: fits */
    ck_assert_int_eq(uvm_sm_place(&sm, &env, 1, UVM_KIND_STAGE, &w), UVM_OOM_CAP);
    ck_assert_int_eq(s.hard, 1);
    /* a hard reclamation that frees device memory makes room */
    s.hard_frees = 8 * GiB;
    ck_assert_int_eq(uvm_sm_place(&sm, &env, 6 * GiB, UVM_KIND_STAGE, &w), UVM_OK);
    ck_assert_int_eq(w, UVM_AT_MANAGED);
    ck_assert_int_eq(s.hard, 2);
    ck_assert_uint_le(sm.managed + sm.cfg.headroom, sim_free(&s));
}
END_TEST

START_TEST(sm_kinds)
{
    struct uvm_sm sm;
    struct sim s;
    struct uvm_env env;
    enum uvm_where w;
    sim_setup(&sm, &s, &env, false, 400 * GiB);
    /* managed kinds are managed even in stage 0 with room */
    ck_assert_int_eq(uvm_sm_place(&sm, &env, GiB, UVM_KIND_MANAGED, &w), UVM_OK);
    ck_assert_int_eq(w, UVM_AT_MANAGED);
    ck_assert_int_eq(sm.stage, 0);
    /* device kinds stay on the device in stage 1 */
    s.used = 75 * GiB;
    ck_assert_int_eq(uvm_sm_place(&sm, &env, GiB, UVM_KIND_DEVICE, &w), UVM_OK);
    ck_assert_int_eq(w, UVM_AT_DEVICE);
    ck_assert_int_eq(sm.stage, 1);
    /* and fail clearly when the device is full even after a hard reclamation */
    ck_assert_int_eq(uvm_sm_place(&sm, &env, 10 * GiB, UVM_KIND_DEVICE, &w), UVM_OOM_DEVICE);
    ck_assert_int_eq(s.hard, 1);
    /* a failed device allocation: hard reclamation and retry, then managed */
    ck_assert_int_eq(uvm_sm_device_failed(&sm, &env, GiB, false, &w), UVM_OK);
    ck_assert_int_eq(w, UVM_AT_DEVICE);
    ck_assert_int_eq(s.hard, 2);
    uint64_t before = sm.managed;
    ck_assert_int_eq(uvm_sm_device_failed(&sm, &env, GiB, true, &w), UVM_OK);
    ck_assert_int_eq(w, UVM_AT_MANAGED);
    ck_assert_uint_eq(sm.managed, before + GiB);
}
END_TEST

START_TEST(sm_thresholds_small_device)
{
    struct uvm_sm sm;
    uvm_sm_init(&sm, 16 * GiB, 0.15, 10 * GiB, 0.05, 80 * GiB, GiB, false);
    ck_assert_uint_eq(sm.cfg.t_in, 8 * GiB);   /* min 10 GiB, at most half of 16 */
    uvm_sm_init(&sm, 96 * GiB, 0.15, 10 * GiB, 0.05, 0, GiB, false);
    ck_assert_uint_eq(sm.cfg.t_in, (uint64_t)(0.15 * 96 * GiB));
}
END_TEST

/* ---- platform, cap, advice, settings --------------------------------------------------------- */

START_TEST(platform_classes)
{
    ck_assert_int_eq(uvm_platform_classify(1, 1, 1), GHC_PLATFORM_INTEGRATED);
    ck_assert_int_eq(uvm_platform_classify(0, 1, 1), GHC_PLATFORM_COHERENT);
    ck_assert_int_eq(uvm_platform_classify(0, 0, 1), GHC_PLATFORM_DISCRETE);
    ck_assert_int_eq(uvm_platform_classify(0, 0, 0), GHC_PLATFORM_NONE);
    ck_assert_str_eq(ghc_mem_platform_name(GHC_PLATFORM_COHERENT), "coherent");
    bool capped;
    /* discrete: the ratio's 400 GiB become free 70 - headroom 4 */
    ck_assert_uint_eq(uvm_cap(GHC_PLATFORM_DISCRETE, 80 * GiB, 70 * GiB, 500 * GiB, 5.0, 4 * GiB, &capped), 66 * GiB);
    ck_assert(capped);
    /* coherent: ratio x HBM, at most the host's available memory */
    ck_assert_uint_eq(uvm_cap(GHC_PLATFORM_COHERENT, 96 * GiB, 90 * GiB, 1000 * GiB, 3.0, 4 * GiB, &capped), 288 * GiB);
    ck_assert(!capped);
    ck_assert_uint_eq(uvm_cap(GHC_PLATFORM_COHERENT, 96 * GiB, 90 * GiB, 200 * GiB, 3.0, 4 * GiB, &capped), 200 * GiB);
    /* integrated: MemAvailable minus the headroom */
    ck_assert_uint_eq(uvm_cap(GHC_PLATFORM_INTEGRATED, 120 * GiB, 100 * GiB, 100 * GiB, 5.0, 6 * GiB, &capped), 94 * GiB);
    ck_assert_uint_eq(uvm_cap(GHC_PLATFORM_NONE, 80 * GiB, 80 * GiB, 80 * GiB, 5.0, GiB, &capped), 0);
}
END_TEST

START_TEST(advice_by_role)
{
    /* the placement rules of doc/memory.md ("Advice") */
    ck_assert_int_eq(uvm_advice_for(GHC_ROLE_LATENTS, UVM_GPU_FIRST, 0, true, true), UVM_ADVICE_HOST);
    ck_assert_int_eq(uvm_advice_for(GHC_ROLE_WEIGHTS_INACTIVE, UVM_GPU_FIRST, 0, true, true), UVM_ADVICE_HOST);
    ck_assert_int_eq(uvm_advice_for(GHC_ROLE_TEXT_EMBEDS, UVM_CPU_FIRST, 0, true, true), UVM_ADVICE_GPU);
    ck_assert_int_eq(uvm_advice_for(GHC_ROLE_MASKS, UVM_BALANCED, 1, true, true), UVM_ADVICE_GPU);
    ck_assert_int_eq(uvm_advice_for(GHC_ROLE_WEIGHTS, UVM_GPU_FIRST, 1, true, true), UVM_ADVICE_GPU);
    /* an encoder's weights as the model's, its activations by pattern like the model's */
    ck_assert_int_eq(uvm_advice_for(GHC_ROLE_ENCODER_WEIGHTS, UVM_CPU_FIRST, 1, true, true), UVM_ADVICE_GPU);
    ck_assert_int_eq(uvm_advice_for(GHC_ROLE_ENCODER_WEIGHTS, UVM_GPU_FIRST, 1, true, false), UVM_ADVICE_NONE);
    ck_assert_int_eq(uvm_advice_for(GHC_ROLE_ENCODER_ACTIVATIONS, UVM_CPU_FIRST, 1, true, true), UVM_ADVICE_HOST);
    ck_assert_int_eq(uvm_advice_for(GHC_ROLE_ENCODER_ACTIVATIONS, UVM_BALANCED, 1, true, true), UVM_ADVICE_NONE);
    ck_assert_int_eq(uvm_kind_for(GHC_ROLE_ENCODER_WEIGHTS, true), UVM_KIND_STAGE);
    ck_assert_int_eq(uvm_kind_for(GHC_ROLE_ENCODER_ACTIVATIONS, true), UVM_KIND_STAGE);
    /* GPU-preferred only while it fits the device budget */
    ck_assert_int_eq(uvm_advice_for(GHC_ROLE_WEIGHTS, UVM_GPU_FIRST, 1, true, false), UVM_ADVICE_NONE);
    /* optimizer state: by pattern in stage 0, on the host when pressed */
    ck_assert_int_eq(uvm_advice_for(GHC_ROLE_OPTIMIZER_STATE, UVM_GPU_FIRST, 0, true, true), UVM_ADVICE_GPU);
    ck_assert_int_eq(uvm_advice_for(GHC_ROLE_OPTIMIZER_STATE, UVM_GPU_FIRST, 1, true, true), UVM_ADVICE_HOST);
    /* the rest by access pattern */
    ck_assert_int_eq(uvm_advice_for(GHC_ROLE_ACTIVATIONS, UVM_GPU_FIRST, 1, true, true), UVM_ADVICE_GPU);
    ck_assert_int_eq(uvm_advice_for(GHC_ROLE_ACTIVATIONS, UVM_CPU_FIRST, 1, true, true), UVM_ADVICE_HOST);
    ck_assert_int_eq(uvm_advice_for(GHC_ROLE_GRADS, UVM_BALANCED, 1, true, true), UVM_ADVICE_NONE);
    /* hints off: nothing */
    for (int r = 0; r < GHC_ROLE_COUNT; r++)
        ck_assert_int_eq(uvm_advice_for((enum ghc_mem_role)r, UVM_GPU_FIRST, 1, false, true), UVM_ADVICE_NONE);
    ck_assert_int_eq(uvm_kind_for(GHC_ROLE_WORKSPACE, true), UVM_KIND_DEVICE);
    ck_assert_int_eq(uvm_kind_for(GHC_ROLE_LATENTS, true), UVM_KIND_MANAGED);
    ck_assert_int_eq(uvm_kind_for(GHC_ROLE_LATENTS, false), UVM_KIND_STAGE);
    ck_assert_int_eq(uvm_kind_for(GHC_ROLE_WEIGHTS, true), UVM_KIND_STAGE);
}
END_TEST

START_TEST(settings_parse)
{
    double r;
    enum uvm_pattern p;
    ck_assert(uvm_ratio_parse("3.0", &r));
    ck_assert(r == 3.0);
    ck_assert(!uvm_ratio_parse("0", &r));
    ck_assert(!uvm_ratio_parse("-1", &r));
    ck_assert(!uvm_ratio_parse("nan", &r));
    ck_assert(!uvm_ratio_parse("5x", &r));
    ck_assert(!uvm_ratio_parse("", &r));
    ck_assert(uvm_pattern_parse("cpu_first", &p));
    ck_assert_int_eq(p, UVM_CPU_FIRST);
    ck_assert(!uvm_pattern_parse("gpu-first", &p));
    ck_assert_str_eq(uvm_pattern_name(UVM_BALANCED), "balanced");
}
END_TEST

/* ---- policies through a run: bad settings, no GPU, out-of-memory messages ------------------- */

/* ghc_run_init's status for `cfg`, its message into msg. */
static int run_with(const char *cfg, char *msg, size_t len)
{
    ghc_core_t *core = ghc_core_init();
    ck_assert_ptr_nonnull(core);
    ck_assert_int_eq(ghc_plugin_add_path(core, tu_env("GHC_BUILD_PLUGINS")), 0);
    int rc = ghc_config_load_string(core, cfg, "mem.cfg", NULL, NULL, 0);
    if (rc == 0)
        rc = ghc_run_init(core);
    snprintf(msg, len, "%s", ghc_error_message(core));
    ghc_core_free(core);
    return rc;
}

static bool have_plugin(const char *name)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/ghc_%s.so", tu_env("GHC_BUILD_PLUGINS"), name);
    return access(path, R_OK) == 0;
}

START_TEST(uvm_bad_settings)
{
    char msg[1024];
    if (!have_plugin("gh200_uvm"))
        return;   /* a build without CUDA has no gh200_uvm */
    ck_assert_int_eq(run_with("mempolicy = { plugin = \"gh200_uvm\";\n oversubscription_ratio = 0.0; };", msg, sizeof(msg)),
                     GHC_ECONFIG);
    ck_assert_msg(strstr(msg, "mem.cfg:2") && strstr(msg, "oversubscription_ratio must be > 0"), "%s", msg);
    ck_assert_int_eq(run_with("mempolicy = { plugin = \"gh200_uvm\"; oversubscription_ratio = -2.5; };", msg, sizeof(msg)),
                     GHC_ECONFIG);
    ck_assert_msg(strstr(msg, "got -2.5"), "%s", msg);
    ck_assert_int_eq(run_with("mempolicy = { plugin = \"gh200_uvm\";\n\n access_pattern = \"gpu_only\"; };", msg, sizeof(msg)),
                     GHC_ECONFIG);
    ck_assert_msg(strstr(msg, "mem.cfg:3") && strstr(msg, "'gpu_only' is unknown") && strstr(msg, "cpu_first"), "%s", msg);
    ck_assert_int_eq(run_with("mempolicy = { plugin = \"gh200_uvm\"; hysteresis = 0.9; };", msg, sizeof(msg)), GHC_ECONFIG);
    ck_assert_msg(strstr(msg, "hysteresis"), "%s", msg);
    /* the environment overrides the config, and is checked the same way */
    setenv("GH200_UVM_OVERSUBSCRIPTION_RATIO", "0", 1);
    ck_assert_int_eq(run_with("mempolicy = { plugin = \"gh200_uvm\"; };", msg, sizeof(msg)), GHC_ECONFIG);
    ck_assert_msg(strstr(msg, "GH200_UVM_OVERSUBSCRIPTION_RATIO='0'"), "%s", msg);
    unsetenv("GH200_UVM_OVERSUBSCRIPTION_RATIO");
    setenv("GH200_UVM_ACCESS_PATTERN", "everywhere", 1);
    ck_assert_int_eq(run_with("mempolicy = { plugin = \"gh200_uvm\"; };", msg, sizeof(msg)), GHC_ECONFIG);
    ck_assert_msg(strstr(msg, "GH200_UVM_ACCESS_PATTERN='everywhere'") && strstr(msg, "balanced"), "%s", msg);
    unsetenv("GH200_UVM_ACCESS_PATTERN");
}
END_TEST

START_TEST(gpu_policies_without_gpu)
{
    /* main() hid every GPU (CUDA_VISIBLE_DEVICES=""), so this holds on any machine */
    static const char *const names[] = { "gh200_uvm", "device", "offload" };
    char cfg[256], msg[1024];
    for (int i = 0; i < 3; i++) {
        if (!have_plugin(names[i]))
            continue;
        snprintf(cfg, sizeof(cfg), "mempolicy = { plugin = \"%s\"; };", names[i]);
        ck_assert_int_eq(run_with(cfg, msg, sizeof(msg)), GHC_EUNSUPPORTED);
        ck_assert_msg(strstr(msg, "no CUDA device") && strstr(msg, "\"host\""), "%s: %s", names[i], msg);
    }
}
END_TEST

START_TEST(host_oom_names_roles)
{
    ghc_core_t *core = ghc_core_init();
    ck_assert_int_eq(ghc_plugin_add_path(core, tu_env("GHC_BUILD_PLUGINS")), 0);
    ck_assert_int_eq(ghc_config_load_string(core, "mempolicy = { plugin = \"host\"; limit_mib = 4; };", "m.cfg",
                                            NULL, NULL, 0), 0);
    ck_assert_int_eq(ghc_run_init(core), 0);
    ghc_mempolicy_t *mp = ghc_mempolicy_get(core);
    void *a, *b, *c;
    ck_assert_int_eq(ghc_mem_alloc(mp, 3 << 20, GHC_ROLE_WEIGHTS, GHC_DEVICE_CPU, &a), 0);
    ck_assert_int_eq(ghc_mem_alloc(mp, 512 << 10, GHC_ROLE_LATENTS, GHC_DEVICE_CPU, &b), 0);
    ck_assert_int_eq(ghc_mem_alloc(mp, 1 << 20, GHC_ROLE_GRADS, GHC_DEVICE_CPU, &c), GHC_ENOMEM);
    const char *m = ghc_error_message(core);
    ck_assert_msg(strstr(m, "1048576 bytes of grads") && strstr(m, "weights 3.0 MiB, latents 512.0 KiB"), "%s", m);
    struct ghc_mem_stats st = { .struct_size = sizeof(st) };
    ck_assert_int_eq(ghc_mem_stats(mp, &st), 0);
    ck_assert_uint_eq(st.bytes_role[GHC_ROLE_WEIGHTS], 3 << 20);
    ck_assert_uint_eq(st.bytes_role[GHC_ROLE_GRADS], 0);
    /* trim, map and group are no-ops on a policy without them */
    ck_assert_int_eq(ghc_mem_trim(mp, true), 0);
    ck_assert_ptr_eq(ghc_mem_map(mp, a), a);
    ck_assert_int_eq(ghc_mem_group(mp, 0, &a, (const size_t[]){ 3 << 20 }, 1), 0);
    ghc_mem_release(mp, a);
    ghc_mem_release(mp, b);
    ghc_core_free(core);
}
END_TEST

/* ---- the saved-activation ring on two simulated streams ------------------------------------- */

/* Streams 0 (compute) and 1 (copies) with vector clocks: an operation ticks its stream's own
 * entry; an event takes its stream's clock; a wait merges the event's clock into the stream's.
 * Access a happened before access b iff a's tick on its stream is <= b's clock entry for that
 * stream. Every access to the same memory from the other stream, one of them a write, must be
 * ordered; memory holds a tag (which unit's bytes of which pass) replayed in program order. */
enum { SIM_C = 0, SIM_K = 1, SIM_LOG = 4096, SIM_MEM = 64 };
struct svc { uint64_t t[2]; };
struct sev { struct svc vc; };
struct sacc { const void *mem; int stream; bool write; struct svc vc; };
struct ssim {
    struct svc   s[2];
    struct sacc  log[SIM_LOG];
    int          n_log, races, events;
    const void  *mem[SIM_MEM];
    long         tag[SIM_MEM];
    int          n_mem;
    bool         no_wait;        /* sabotage: the copy stream ignores `after` (the detector must see it) */
    char         first_race[256];
};

static long *sim_tag(struct ssim *x, const void *mem)
{
    for (int i = 0; i < x->n_mem; i++)
        if (x->mem[i] == mem)
            return &x->tag[i];
    ck_assert_int_lt(x->n_mem, SIM_MEM);
    x->mem[x->n_mem] = mem;
    x->tag[x->n_mem] = -1;
    return &x->tag[x->n_mem++];
}

static void sim_access(struct ssim *x, int stream, const void *mem, bool write)
{
    x->s[stream].t[stream]++;
    struct sacc a = { mem, stream, write, x->s[stream] };
    for (int i = 0; i < x->n_log; i++) {
        const struct sacc *b = &x->log[i];
        if (b->mem != mem || b->stream == stream || !(b->write || write))
            continue;
        if (b->vc.t[b->stream] > a.vc.t[b->stream]) {   /* b is not ordered before a */
            if (!x->races++)
                snprintf(x->first_race, sizeof(x->first_race), "%s on stream %d vs an earlier %s on stream %d",
                         write ? "write" : "read", stream, b->write ? "write" : "read", b->stream);
        }
    }
    ck_assert_int_lt(x->n_log, SIM_LOG);
    x->log[x->n_log++] = a;
}

static void sim_merge(struct svc *into, const struct svc *from)
{
    for (int k = 0; k < 2; k++)
        if (from->t[k] > into->t[k])
            into->t[k] = from->t[k];
}

static int sim_buf_alloc(void *ctx, size_t n, void **buf)
{
    (void)ctx;
    *buf = malloc(n);   /* an address only: the simulation tracks tags, not bytes */
    return *buf ? 0 : GHC_ENOMEM;
}
static void sim_buf_free(void *ctx, void *buf) { (void)ctx; free(buf); }
static int sim_event_make(void *ctx, void **ev)
{
    ((struct ssim *)ctx)->events++;
    *ev = calloc(1, sizeof(struct sev));
    return *ev ? 0 : GHC_ENOMEM;
}
static void sim_event_free(void *ctx, void *ev) { ((struct ssim *)ctx)->events--; free(ev); }
static void sim_record(void *ctx, void *ev, void *stream)
{
    ck_assert_ptr_null(stream);   /* the model's compute stream: NULL here */
    ((struct sev *)ev)->vc = ((struct ssim *)ctx)->s[SIM_C];
}
static void sim_wait(void *ctx, void *stream, void *ev)
{
    ck_assert_ptr_null(stream);
    sim_merge(&((struct ssim *)ctx)->s[SIM_C], &((struct sev *)ev)->vc);
}
static int sim_copy(void *ctx, void *dst, const void *src, size_t n, bool to_ring, void *after, void *done)
{
    struct ssim *x = ctx;
    (void)n, (void)to_ring;
    if (after && !x->no_wait)
        sim_merge(&x->s[SIM_K], &((struct sev *)after)->vc);
    sim_access(x, SIM_K, src, false);
    sim_access(x, SIM_K, dst, true);
    *sim_tag(x, dst) = *sim_tag(x, src);
    if (done)
        ((struct sev *)done)->vc = x->s[SIM_K];
    return 0;
}
static void sim_sync(void *ctx)
{
    struct ssim *x = ctx;   /* the host waits for both streams: everything after is ordered */
    sim_merge(&x->s[SIM_C], &x->s[SIM_K]);
    sim_merge(&x->s[SIM_K], &x->s[SIM_C]);
}

/* A kernel of the model on the compute stream: reads the buffer, or writes it with `tag`. */
static void sim_kernel(struct ssim *x, const void *at, bool write, long tag)
{
    sim_access(x, SIM_C, at, write);
    if (write)
        *sim_tag(x, at) = tag;
}

/* wan22's forward: unit 0 opened for writing before the patch embedding, then per block i its
 * input read (and with `attn` its attention output written into it) and unit i + 1 written;
 * unit i closed after the block. */
static void sim_forward(struct saved_ring *r, struct ssim *x, void **homes, size_t *bytes, int n, long pass, bool attn)
{
    void *at[2];
    ck_assert_int_eq(saved_ring_begin(r, homes[0], bytes[0], 0, true, NULL, &at[0]), 0);
    sim_kernel(x, at[0], true, pass * 100);
    for (int i = 0; i < n; i++) {
        if (i + 1 < n) {
            ck_assert_int_eq(saved_ring_begin(r, homes[i + 1], bytes[i + 1], i + 1, true, NULL, &at[(i + 1) % 2]), 0);
            ck_assert_ptr_ne(at[(i + 1) % 2], at[i % 2]);
        }
        sim_kernel(x, at[i % 2], false, 0);
        if (attn)
            sim_kernel(x, at[i % 2], true, pass * 100 + i);   /* o and lse: the same unit's bytes */
        if (i + 1 < n)
            sim_kernel(x, at[(i + 1) % 2], true, pass * 100 + i + 1);
        ck_assert_int_eq(saved_ring_end(r, homes[i], NULL), 0);
    }
}

/* wan22's backward: each unit read in reverse, checked, used as scratch, closed. */
static void sim_backward(struct saved_ring *r, struct ssim *x, void **homes, size_t *bytes, int n, long pass)
{
    for (int i = n - 1; i >= 0; i--) {
        void *at;
        ck_assert_int_eq(saved_ring_begin(r, homes[i], bytes[i], i, false, NULL, &at), 0);
        ck_assert_msg(*sim_tag(x, at) == pass * 100 + i, "unit %d read %ld, written %ld", i, *sim_tag(x, at),
                      pass * 100 + i);
        sim_kernel(x, at, false, 0);
        sim_kernel(x, at, true, -7);   /* scratch writes: never seen again */
        ck_assert_int_eq(saved_ring_end(r, homes[i], NULL), 0);
    }
}

/* Rings of 2 to 5 buffers, 0 to 4 units ahead, 1 to 7 units of two sizes: forward, backward,
 * forward, forward, backward (the latest write pass counts), without a race. */
START_TEST(saved_ring_streams)
{
    static const struct saved_io sio = { .buf_alloc = sim_buf_alloc, .buf_free = sim_buf_free,
                                         .event_make = sim_event_make, .event_free = sim_event_free,
                                         .record = sim_record, .wait = sim_wait, .copy = sim_copy, .sync = sim_sync };
    ghc_core_t *core = ghc_core_init();
    static struct ssim x;
    for (int bufs = 2; bufs <= 5; bufs++)
        for (int ahead = 0; ahead <= 4; ahead++)
            for (int n = 1; n <= 7; n += 2) {
                memset(&x, 0, sizeof(x));
                struct saved_io io = sio;
                io.ctx = &x;
                struct saved_ring r;
                saved_ring_init(&r, core, "test", &io, bufs, ahead, false);
                void *homes[7];
                size_t bytes[7];
                for (int i = 0; i < n; i++) {
                    bytes[i] = i % 2 ? 512 : 256;   /* units of two sizes: one buffer size for all */
                    homes[i] = malloc(bytes[i]);
                    ck_assert_int_eq(saved_ring_add(&r, homes[i], bytes[i]), 0);
                }
                sim_forward(&r, &x, homes, bytes, n, 1, ahead % 2);
                sim_backward(&r, &x, homes, bytes, n, 1);
                sim_forward(&r, &x, homes, bytes, n, 2, false);
                sim_forward(&r, &x, homes, bytes, n, 3, true);
                sim_backward(&r, &x, homes, bytes, n, 3);
                ck_assert_msg(x.races == 0, "%d buffers, %d ahead, %d units: %d races, first: %s", bufs, ahead, n,
                              x.races, x.first_race);
                ck_assert_uint_eq(r.out_bytes % 256, 0);
                ck_assert_uint_ge(r.buf_bytes, n > 1 ? 512 : 256);
                if (n > bufs)   /* some units had to come back from their homes */
                    ck_assert_uint_gt(r.in_bytes, 0);
                else if (n == 1)   /* the turn-around unit never leaves its buffer */
                    ck_assert_uint_eq(r.hits, 2);
                for (int i = 0; i < n; i++) {
                    ck_assert(saved_ring_drop(&r, homes[i]));
                    free(homes[i]);
                }
                ck_assert_uint_eq(saved_ring_bytes(&r), 0);   /* the last home took the buffers along */
                saved_ring_free(&r);
                ck_assert_int_eq(x.events, 0);
            }
    /* the detector sees the race of a copy home that does not wait for the kernel writing it */
    memset(&x, 0, sizeof(x));
    x.no_wait = true;
    struct saved_io io = sio;
    io.ctx = &x;
    struct saved_ring r;
    saved_ring_init(&r, core, "test", &io, 3, 2, false);
    void *homes[4];
    size_t bytes[4] = { 256, 256, 256, 256 };
    for (int i = 0; i < 4; i++) {
        homes[i] = malloc(256);
        ck_assert_int_eq(saved_ring_add(&r, homes[i], 256), 0);
    }
    sim_forward(&r, &x, homes, bytes, 4, 1, false);
    ck_assert_int_gt(x.races, 0);
    /* misuse: a unit begun twice, an end without a begin, a read before any write */
    void *at;
    ck_assert_int_eq(saved_ring_begin(&r, homes[0], 256, 0, true, NULL, &at), 0);
    ck_assert_int_eq(saved_ring_begin(&r, homes[0], 256, 0, true, NULL, &at), GHC_EINVAL);
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), "begun twice"));
    ck_assert_int_eq(saved_ring_end(&r, homes[0], NULL), 0);
    ck_assert_int_eq(saved_ring_end(&r, homes[0], NULL), GHC_EINVAL);
    ck_assert_ptr_nonnull(strstr(ghc_error_message(core), "without saved_begin"));
    ck_assert_int_eq(saved_ring_begin(&r, homes[1], 512, 1, false, NULL, &at), GHC_EINVAL);   /* more than its size */
    int dummy;
    ck_assert_int_eq(saved_ring_begin(&r, &dummy, 4, 0, false, NULL, &at), 0);   /* not a home: in place */
    ck_assert_ptr_eq(at, &dummy);
    ck_assert_int_eq(saved_ring_end(&r, &dummy, NULL), 0);
    for (int i = 0; i < 4; i++) {
        saved_ring_drop(&r, homes[i]);
        free(homes[i]);
    }
    saved_ring_free(&r);
    ghc_core_free(core);
}
END_TEST

/* The encoders' roles through the host policy (the CPU-testable one): the tiny random Wan2.2
 * VAE (tiled: tiles of 32 every 16 over a 48 x 48 clip) encodes and decodes and the tiny umT5
 * encodes a caption with every byte under encoder_weights, encoder_activations and the latent's
 * role (latents; text_embeds where umT5 trims its output): the per-role peaks show none under
 * the model's roles. */
START_TEST(encoder_roles_host)
{
    ck_assert_str_eq(ghc_mem_role_name(GHC_ROLE_ENCODER_WEIGHTS), "encoder_weights");
    ck_assert_str_eq(ghc_mem_role_name(GHC_ROLE_ENCODER_ACTIVATIONS), "encoder_activations");
    ck_assert_int_eq(GHC_ROLE_ENCODER_WEIGHTS, GHC_ROLE_SAVED + 1);   /* appended: the ABI keeps */
    ghc_core_t *core = ghc_core_init();
    ck_assert_int_eq(ghc_plugin_add_path(core, tu_env("GHC_BUILD_PLUGINS")), 0);
    const char *cfg = "mempolicy = { plugin = \"host\"; };\n"
                      "vae = { plugin = \"wanvae\"; tile = 32; random = { version = 22; base_dim = 2; }; };\n"
                      "text_encoder = { plugin = \"umt5\"; random = { d_model = 32; }; };\n";
    ck_assert_int_eq(ghc_config_load_string(core, cfg, "m.cfg", NULL, NULL, 0), 0);
    ck_assert_msg(ghc_run_init(core) == 0, "%s", ghc_error_message(core));
    ghc_mempolicy_t *mp = ghc_mempolicy_get(core);
    ghc_vae_t *vae = ghc_vae_get(core);
    ghc_text_encoder_t *te = ghc_text_encoder_get(core);
    ck_assert_msg(vae && te, "%s", ghc_error_message(core));
    struct ghc_mem_stats st = { .struct_size = sizeof(st) };
    ck_assert_int_eq(ghc_mem_stats(mp, &st), 0);
    const uint64_t weights = st.bytes_role[GHC_ROLE_ENCODER_WEIGHTS];
    ck_assert_uint_gt(weights, 0);
    char use[256];
    ghc_mem_usage_text(st.bytes_role, (int32_t)st.n_roles, use, sizeof(use));
    ck_assert_msg(strncmp(use, "encoder_weights ", 16) == 0, "%s", use);
    ghc_tensor_t *video = ghc_tensor_init(core, GHC_DTYPE_F32, 4, (const int64_t[]){ 3, 5, 48, 48 }, GHC_DEVICE_CPU,
                                          GHC_ROLE_ENCODER_ACTIVATIONS);
    ghc_tensor_t *lat = NULL, *clip = NULL, *emb = NULL;
    ck_assert_ptr_nonnull(video);
    tu_fill_levels(video);
    ck_assert_msg(ghc_vae_encode(vae, video, &lat) == 0, "%s", ghc_error_message(core));
    ck_assert_msg(ghc_vae_decode(vae, lat, &clip) == 0, "%s", ghc_error_message(core));
    ck_assert_msg(ghc_text_encoder_encode(te, "a cat, walking", &emb) == 0, "%s", ghc_error_message(core));
    ck_assert_int_eq(ghc_tensor_dim(lat, 2), 3);
    ck_assert_int_eq(ghc_tensor_dim(clip, 3), 48);
    ck_assert_int_eq(ghc_mem_stats(mp, &st), 0);
    ck_assert_uint_eq(st.bytes_role[GHC_ROLE_ENCODER_WEIGHTS], weights);
    ck_assert_uint_gt(st.bytes_role_peak[GHC_ROLE_ENCODER_ACTIVATIONS], ghc_tensor_nbytes(video) + ghc_tensor_nbytes(clip));
    ck_assert_uint_eq(st.bytes_role[GHC_ROLE_LATENTS], ghc_tensor_nbytes(lat));
    for (int r = 0; r < GHC_ROLE_COUNT; r++)
        if (r != GHC_ROLE_ENCODER_WEIGHTS && r != GHC_ROLE_ENCODER_ACTIVATIONS && r != GHC_ROLE_LATENTS &&
            r != GHC_ROLE_TEXT_EMBEDS)
            ck_assert_msg(st.bytes_role_peak[r] == 0, "%s: %llu bytes at most", ghc_mem_role_name((enum ghc_mem_role)r),
                          (unsigned long long)st.bytes_role_peak[r]);
    ghc_tensor_free(video);
    ghc_tensor_free(lat);
    ghc_tensor_free(clip);
    ghc_tensor_free(emb);
    ghc_core_free(core);
}
END_TEST

/* The role through the core and the host policy: its name, its counts, saved_begin/saved_end
 * in place without a ring and through one with it; a read before any write is refused. */
START_TEST(saved_role_host)
{
    ck_assert_str_eq(ghc_mem_role_name(GHC_ROLE_SAVED), "saved");
    ck_assert_int_eq(GHC_ROLE_SAVED, GHC_ROLE_WORKSPACE + 1);
    ck_assert_int_le(GHC_ROLE_COUNT, GHC_ROLE_MAX);
    for (int ring = 0; ring <= 3; ring += 3) {
        char cfg[128];
        snprintf(cfg, sizeof(cfg), "mempolicy = { plugin = \"host\"; saved_ring = %d; };", ring);
        ghc_core_t *core = ghc_core_init();
        ck_assert_int_eq(ghc_plugin_add_path(core, tu_env("GHC_BUILD_PLUGINS")), 0);
        ck_assert_int_eq(ghc_config_load_string(core, cfg, "m.cfg", NULL, NULL, 0), 0);
        ck_assert_int_eq(ghc_run_init(core), 0);
        ghc_mempolicy_t *mp = ghc_mempolicy_get(core);
        void *u[2], *at;
        for (int i = 0; i < 2; i++)
            ck_assert_int_eq(ghc_mem_alloc(mp, 4096, GHC_ROLE_SAVED, GHC_DEVICE_CPU, &u[i]), 0);
        struct ghc_mem_stats st = { .struct_size = sizeof(st) };
        ck_assert_int_eq(ghc_mem_stats(mp, &st), 0);
        ck_assert_uint_eq(st.bytes_role[GHC_ROLE_SAVED], 8192);
        ck_assert_uint_eq(st.n_roles, GHC_ROLE_COUNT);
        char use[256];
        ck_assert_str_eq(ghc_mem_usage_text(st.bytes_role, (int32_t)st.n_roles, use, sizeof(use)), "saved 8.0 KiB");
        if (ring) {
            ck_assert_int_eq(ghc_mem_saved_begin(mp, u[1], 4096, 1, false, NULL, &at), GHC_EINVAL);
            ck_assert_ptr_null(at);
            ck_assert_msg(strstr(ghc_error_message(core), "before a write pass"), "%s", ghc_error_message(core));
        }
        for (int i = 0; i < 2; i++) {   /* write 0, 1; read 1, 0 */
            ck_assert_int_eq(ghc_mem_saved_begin(mp, u[i], 4096, i, true, NULL, &at), 0);
            ck_assert(ring ? at != u[i] : at == u[i]);
            memset(at, 10 + i, 4096);
            ck_assert_int_eq(ghc_mem_saved_end(mp, u[i], NULL), 0);
            ck_assert_int_eq(((unsigned char *)u[i])[4095], 10 + i);   /* home: at once (synchronous copies) */
        }
        for (int i = 1; i >= 0; i--) {
            ck_assert_int_eq(ghc_mem_saved_begin(mp, u[i], 4096, i, false, NULL, &at), 0);
            ck_assert_int_eq(((unsigned char *)at)[0], 10 + i);
            ck_assert_int_eq(ghc_mem_saved_end(mp, u[i], NULL), 0);
        }
        ck_assert_int_eq(ghc_mem_stats(mp, &st), 0);
        ck_assert_uint_eq(st.saved_out_bytes, ring ? 8192 : 0);
        ck_assert_uint_eq(st.saved_ring_bytes, ring ? 3 * 4096 : 0);
        for (int i = 0; i < 2; i++)
            ghc_mem_release(mp, u[i]);
        ghc_core_free(core);
    }
    /* a NULL policy and memory of another role: in place */
    void *at = NULL;
    int v;
    ck_assert_int_eq(ghc_mem_saved_begin(NULL, &v, sizeof(v), 0, true, NULL, &at), 0);
    ck_assert_ptr_eq(at, &v);
    ck_assert_int_eq(ghc_mem_saved_end(NULL, &v, NULL), 0);
}
END_TEST

/* ---- estimate and diag ---------------------------------------------------------------------- */

/* The estimate of a tiny CPU run against the peak the host policy measured in the same run. */
START_TEST(estimate_matches_peak)
{
    static const char cfg[] =
        "mempolicy = { plugin = \"host\"; };\n"
        "model = { plugin = \"wan22\"; dtype = \"f32\"; device = -1; checkpointing = \"block\"; checkpoint_every = 2;\n"
        "  random = { dim = 64; ffn_dim = 160; heads = 2; layers = 4; text_dim = 32; freq_dim = 32; experts = 2; seed = 3; }; };\n";
    struct mem_step r;
    mem_step_run(cfg, GHC_DEVICE_CPU, 1, 16, 3, 16, 16, 32, &r);
    ghc_core_t *core = ghc_core_init();
    ck_assert_int_eq(ghc_plugin_add_path(core, tu_env("GHC_BUILD_PLUGINS")), 0);   /* the plugins estimate */
    ck_assert_int_eq(ghc_config_load_string(core, cfg, "e.cfg", NULL, NULL, 0), 0);
    struct ghc_estimate est;
    struct ghc_estimate_opts o = { .batch = 1, .tokens = 3 * 8 * 8, .adapters = false };
    ck_assert_msg(ghc_cli_estimate(core, &o, &est, NULL) == 0, "%s", ghc_error_message(core));
    double got = (double)est.at[0], peak = (double)r.stats.bytes_peak;
    ck_assert_msg(fabs(got - peak) <= 0.10 * peak, "estimate %.0f B vs measured peak %.0f B (%.1f%%)", got, peak,
                  100.0 * (got - peak) / peak);
    /* the weights as loaded: the host policy's counts at the end of the run */
    ck_assert_uint_eq(est.role[GHC_ROLE_WEIGHTS] + est.role[GHC_ROLE_WEIGHTS_INACTIVE],
                      r.stats.bytes_role[GHC_ROLE_WEIGHTS] + r.stats.bytes_role[GHC_ROLE_WEIGHTS_INACTIVE]);
    ck_assert(est.activations_ckpt < est.activations_full);
    mem_step_free(&r);
    ghc_core_free(core);
}
END_TEST

START_TEST(estimate_cli)
{
    char *dir = tu_tmpdir(), *out, cmd[8192];
    char *cfg = tu_write(dir, "a14b.cfg",
        "mempolicy = { plugin = \"offload\"; ring = 3; };\n"
        "model = { plugin = \"wan22\"; dtype = \"bf16\"; checkpointing = \"block\";\n"
        "  random = { dim = 5120; ffn_dim = 13824; heads = 40; layers = 40; experts = 2; }; };\n");
    snprintf(cmd, sizeof(cmd), "'%s' -P '%s' estimate -c '%s' --tokens 32760", tu_env("GHC_CLI"),
             tu_env("GHC_BUILD_PLUGINS"), cfg);
    ck_assert_int_eq(tu_run(cmd, &out), 0);
    /* an A14B expert: 40 blocks of 351.4 M bf16 parameters plus f32 embeddings, about 27 GiB,
     * and the block linears' spare room for K-concatenation (adapter_pad 16: +0.84%) */
    ck_assert_msg(strstr(out, "weights                  27.1") && strstr(out, "pinned host") &&
                  strstr(out, "offload ring") && strstr(out, "without"), "%s", out);
    free(out);
    char *bad = tu_write(dir, "bad.cfg", "model = { plugin = \"wan22\"; checkpoint = \"/nonexistent.safetensors\"; };\n");
    snprintf(cmd, sizeof(cmd), "'%s' -P '%s' estimate -c '%s'", tu_env("GHC_CLI"), tu_env("GHC_BUILD_PLUGINS"),
             bad);
    ck_assert_int_ne(tu_run(cmd, &out), 0);
    ck_assert_msg(strstr(out, "/nonexistent.safetensors"), "%s", out);
    free(out);
    snprintf(cmd, sizeof(cmd), "'%s' estimate", tu_env("GHC_CLI"));
    ck_assert_int_eq(tu_run(cmd, &out), 2);
    ck_assert_msg(strstr(out, "needs a configuration"), "%s", out);
    free(out);
    free(cfg);
    free(bad);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* plan = "auto" (ghc_cli_plan_auto): the fastest plan whose estimate fits the card with its
 * headroom, set into the configuration. An A14B expert at 4096 tokens on 74 GiB: the device
 * policy with the fewest recomputed blocks that fit (the next fewer do not); at 32760 tokens
 * with both experts: offload with the most resident blocks that fit; on 8 GiB none fits (the leanest is set,
 * the line says so); the model on the CPU and plan = "configured": nothing changes. The tokens
 * come from the dataset's largest latent when not given. */
static ghc_core_t *auto_core(const char *extra)
{
    char text[2048];
    snprintf(text, sizeof(text),
             "plan = \"auto\";\nmempolicy = { plugin = \"offload\"; ring = 3; saved = \"device\"; };\n"
             "model = { plugin = \"wan22\"; dtype = \"bf16\"; device = 0; checkpointing = \"block\";\n"
             "  random = { dim = 5120; ffn_dim = 13824; heads = 40; layers = 40; experts = 1; }; };\n%s", extra);
    ghc_core_t *core = ghc_core_init();
    ck_assert_int_eq(ghc_plugin_add_path(core, tu_env("GHC_BUILD_PLUGINS")), 0);
    ck_assert_msg(ghc_config_load_string(core, text, "auto.cfg", NULL, NULL, 0) == 0, "%s", ghc_error_message(core));
    return core;
}

static int64_t cfg_int(ghc_core_t *core, const char *section, const char *key)
{
    int64_t v = -1;
    ck_assert_int_eq(ghc_cfg_get_int(ghc_config_section(core, section), key, -1, -1, 1 << 20, &v), 0);
    return v;
}

static const char *cfg_str(ghc_core_t *core, const char *section, const char *key)
{
    const char *v = NULL;
    ck_assert_int_eq(ghc_cfg_get_string(ghc_config_section(core, section), key, "", &v), 0);
    return v;
}

/* Whether the configuration in effect fits gib (with the auto headroom), with section.key = v. */
static bool fits_with(ghc_core_t *core, int64_t tokens, double gib, const char *section, const char *key, int64_t v)
{
    struct ghc_estimate e;
    struct ghc_estimate_opts o = { .batch = 1, .tokens = tokens, .adapters = true,
                                   .device_gib = gib * (1.0 - GHC_PLAN_AUTO_HEADROOM) };
    ck_assert_int_eq(ghc_cfg_set_int(ghc_config_section(core, section), key, v), 0);
    ck_assert_int_eq(ghc_cli_estimate(core, &o, &e, NULL), 0);
    return e.fits == 1;
}

START_TEST(plan_auto)
{
    char chosen[512];
    /* 4096 tokens, one expert, 74 GiB (on 79.6 checkpointing off fits since h1 is bf16) */
    ghc_core_t *core = auto_core("");
    const double gib = 74.0;
    struct ghc_plan_opts o = { .batch = 1, .tokens = 4096, .device_gib = gib, .host_gib = 480 };
    ck_assert_msg(ghc_cli_plan_auto(core, &o, chosen, sizeof(chosen)) == 0, "%s", ghc_error_message(core));
    printf("plan_auto: %s\n", chosen);
    ck_assert_str_eq(cfg_str(core, "mempolicy", "plugin"), "device");
    ck_assert_msg(!ghc_cfg_has(ghc_config_section(core, "mempolicy"), "saved"), "the offload keys stayed");
    /* q, k and v kept: fewer FLOPs a recomputed block than block_attn's, at more memory */
    ck_assert_str_eq(cfg_str(core, "model", "checkpointing"), "block_qkv");
    int64_t k = cfg_int(core, "model", "checkpoint_every");
    ck_assert_msg(k > 1 && k < 40 && strstr(chosen, "mempolicy device") && strstr(chosen, "block_qkv every"), "%s",
                  chosen);
    ck_assert(fits_with(core, 4096, gib, "model", "checkpoint_every", k));
    int64_t rec = (40 + k - 1) / k, k2 = 40 / (rec - 1);   /* one block fewer recomputed */
    while ((40 + k2 - 1) / k2 != rec - 1)
        k2++;
    ck_assert_msg(!fits_with(core, 4096, gib, "model", "checkpoint_every", k2), "every %lld fits too (chosen every %lld)",
                  (long long)k2, (long long)k);
    ghc_core_free(core);
    /* 32760 tokens, both experts, a PCIe 4 link (25 GB/s): a block's weights stream in under
     * its compute, so offload keeps no block resident (as fast, and the least on the card) */
    core = auto_core("");
    ghc_cfg_t *rnd;
    ck_assert_int_eq(ghc_cfg_set_group(ghc_config_section(core, "model"), "random", &rnd), 0);
    ck_assert_int_eq(ghc_cfg_set_int(rnd, "experts", 2), 0);
    o = (struct ghc_plan_opts){ .batch = 1, .tokens = 32760, .device_gib = 79.6, .flops = 700e12, .h2d = 25e9,
                                .host_gib = 480 };
    ck_assert_msg(ghc_cli_plan_auto(core, &o, chosen, sizeof(chosen)) == 0, "%s", ghc_error_message(core));
    printf("plan_auto: %s\n", chosen);
    ck_assert_str_eq(cfg_str(core, "mempolicy", "plugin"), "offload");
    ck_assert_str_eq(cfg_str(core, "mempolicy", "saved"), "host");
    ck_assert_int_eq(cfg_int(core, "mempolicy", "ring"), 3);   /* the configured policy's own keys stay */
    /* block_qkv would copy 75 GiB of saved units out and in: more than PCIe 4 hides */
    ck_assert_str_eq(cfg_str(core, "model", "checkpointing"), "block_attn");
    ck_assert_msg(cfg_int(core, "mempolicy", "resident") == 0 && strstr(chosen, "a step about") &&
                  strstr(chosen, "(given)"), "%s", chosen);
    ghc_core_free(core);
    /* one expert at 32760 tokens over PCIe 5 (55 GB/s), and the host's memory: block_qkv's saved
     * units (75 GiB) and the pinned weights (27 GiB) within 85% of a 125 GiB host; on 96 GiB only
     * block_attn's (40 GiB); on 64 GiB block's (27 GiB); on 40 GiB no offload plan: the device
     * policy with block checkpointing (the card holds its saved block inputs) */
    static const struct { double host; const char *policy, *ck; } hosts[] = {
        { 125, "offload", "block_qkv" }, { 96, "offload", "block_attn" }, { 64, "offload", "block" },
        { 40, "device", "block" } };
    for (size_t h = 0; h < sizeof(hosts) / sizeof(hosts[0]); h++) {
        core = auto_core("");
        struct ghc_plan_opts oh = { .batch = 1, .tokens = 32760, .device_gib = 79.6, .flops = 700e12, .h2d = 55e9,
                                    .host_gib = hosts[h].host };
        ck_assert_int_eq(ghc_cli_plan_auto(core, &oh, chosen, sizeof(chosen)), 0);
        printf("plan_auto: host %.0f GiB: %s\n", hosts[h].host, chosen);
        ck_assert_msg(strcmp(cfg_str(core, "mempolicy", "plugin"), hosts[h].policy) == 0 &&
                      strcmp(cfg_str(core, "model", "checkpointing"), hosts[h].ck) == 0 &&
                          !strstr(chosen, "does not fit"),
                      "host %.0f GiB: %s", hosts[h].host, chosen);
        ghc_core_free(core);
    }
    /* 4096 tokens on 20 GiB, where no device plan fits: a block's compute is shorter than its
     * copy, each resident block saves time: the most resident blocks that fit (the device
     * ring's 3 blocks beside them) */
    core = auto_core("");
    o.tokens = 4096;
    o.device_gib = 20;
    ck_assert_msg(ghc_cli_plan_auto(core, &o, chosen, sizeof(chosen)) == 0, "%s", ghc_error_message(core));
    printf("plan_auto: %s\n", chosen);
    int64_t r = cfg_int(core, "mempolicy", "resident");
    ck_assert_msg(r >= 10 && strstr(chosen, "mempolicy offload") && !strstr(chosen, "does not fit"), "%s", chosen);
    ck_assert(fits_with(core, 4096, 20, "mempolicy", "resident", r));
    ck_assert(r == 40 || !fits_with(core, 4096, 20, "mempolicy", "resident", r + 1));
    /* 8 GiB at 32760 tokens: nothing fits; the leanest is set and the line says so */
    o.device_gib = 8;
    o.tokens = 32760;
    ck_assert_int_eq(ghc_cli_plan_auto(core, &o, chosen, sizeof(chosen)), 0);
    ck_assert_msg(strstr(chosen, "does not fit") && strstr(chosen, "0 resident"), "%s", chosen);
    ck_assert_str_eq(cfg_str(core, "model", "checkpointing"), "block");
    ghc_core_free(core);
    /* one expert at 32760 tokens on 139.3 GiB over PCIe 5: the device policy fits (block_qkv,
     * every block) but is no faster than offload with nothing resident, whose copies hide under
     * the compute and which takes far less of the card */
    core = auto_core("");
    ck_assert_int_eq(ghc_cfg_set_string(ghc_config_section(core, "mempolicy"), "plugin", "device"), 0);
    o = (struct ghc_plan_opts){ .batch = 1, .tokens = 32760, .device_gib = 139.3, .flops = 700e12, .h2d = 55e9,
                                .host_gib = 480 };
    ck_assert_int_eq(ghc_cli_plan_auto(core, &o, chosen, sizeof(chosen)), 0);
    printf("plan_auto: %s\n", chosen);
    ck_assert_msg(strstr(chosen, "mempolicy offload") && cfg_int(core, "mempolicy", "resident") == 0 &&
                  strcmp(cfg_str(core, "model", "checkpointing"), "block_qkv") == 0, "%s", chosen);
    ck_assert(fits_with(core, 32760, 139.3 * 0.99, "mempolicy", "resident", 0));
    ck_assert_int_eq(ghc_cfg_set_string(ghc_config_section(core, "mempolicy"), "plugin", "device"), 0);
    ck_assert(fits_with(core, 32760, 139.3, "model", "checkpoint_every", 1));   /* device fits too */
    ghc_core_free(core);
    /* the same configured device policy at 4096 tokens: its section gets no offload keys */
    core = auto_core("");
    ck_assert_int_eq(ghc_cfg_set_string(ghc_config_section(core, "mempolicy"), "plugin", "device"), 0);
    o.tokens = 4096;
    ck_assert_int_eq(ghc_cli_plan_auto(core, &o, chosen, sizeof(chosen)), 0);
    ck_assert_msg(strstr(chosen, "mempolicy device, checkpointing off"), "%s", chosen);
    ck_assert_msg(!ghc_cfg_has(ghc_config_section(core, "mempolicy"), "resident") &&
                  !ghc_cfg_has(ghc_config_section(core, "mempolicy"), "saved"), "the offload trials' keys stayed");
    ghc_core_free(core);
    /* the model on the CPU; plan = "configured" */
    core = auto_core("");
    ck_assert_int_eq(ghc_cfg_set_int(ghc_config_section(core, "model"), "device", -1), 0);
    ck_assert_int_eq(ghc_cli_plan_auto(core, &o, chosen, sizeof(chosen)), 0);
    ck_assert_msg(strstr(chosen, "the configured plan"), "%s", chosen);
    ck_assert_str_eq(cfg_str(core, "mempolicy", "plugin"), "offload");
    ck_assert_int_eq(ghc_cfg_set_string(ghc_config_root(core), "plan", "configured"), 0);
    ck_assert_int_eq(ghc_cli_plan_auto(core, &o, chosen, sizeof(chosen)), 0);
    ck_assert_str_eq(chosen, "");
    ghc_core_free(core);
    /* the tokens of the dataset's largest latent: [16, 3, 8, 12] -> 3 x 4 x 6 */
    char *dir = tu_tmpdir(), data[4200];
    ghc_core_t *wc = ghc_core_init();
    static const int64_t shapes[2][4] = { { 16, 1, 8, 8 }, { 16, 3, 8, 12 } }, txt[2] = { 5, 4096 };
    float *zeros = calloc(5 * 4096, sizeof(float));
    for (int i = 0; i < 4; i++) {   /* s0, s1: latent (zeros) and text (zeros) */
        char path[4400];
        ghc_st_writer_t *w = ghc_st_writer_init(wc);
        ck_assert_int_eq(ghc_st_writer_add_raw(w, i % 2 ? "text_embed" : "latent", GHC_DTYPE_F32, i % 2 ? 2 : 4,
                                               i % 2 ? txt : shapes[i / 2], zeros), 0);
        snprintf(path, sizeof(path), "%s/s%d.%s.safetensors", dir, i / 2, i % 2 ? "text" : "latent");
        ck_assert_msg(ghc_st_writer_finish(w, path) == 0, "%s", ghc_error_message(wc));
        ghc_st_writer_free(w);
    }
    free(zeros);
    ghc_core_free(wc);
    snprintf(data, sizeof(data), "data = { batch_size = 2; datasets = ( { path = \"%s\"; } ); };\n", dir);
    core = auto_core(data);
    struct ghc_plan_opts od = { .device_gib = 79.6 };
    ck_assert_msg(ghc_cli_plan_auto(core, &od, chosen, sizeof(chosen)) == 0, "%s", ghc_error_message(core));
    ck_assert_msg(strstr(chosen, "auto for 2 x 72 tokens") && strstr(chosen, "checkpointing off"), "%s", chosen);
    ghc_core_free(core);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

/* The --set arguments on estimate's "plan:" line into buf (empty when there is none). */
static void plan_args(const char *out, char *buf, size_t len)
{
    const char *p = strstr(out, "plan:  --set "), *end = p ? strstr(p, " (") : NULL;
    buf[0] = 0;
    if (p && end)
        snprintf(buf, len, "%.*s", (int)(end - p - 7), p + 7);
}

/* estimate from the configuration alone (the shipped A14B config, its files absent: the dims
 * of the variant the names say), and with --device-memory: exit 7 and a plan for a run that
 * does not fit, a plan that fits when its --set arguments are given. */
START_TEST(estimate_plan)
{
    char *dir = tu_tmpdir(), *out, cmd[8192], base[4096], plan[600];
    /* the shipped config, its checkpoints pointed at files that are surely absent */
    snprintf(base, sizeof(base), "'%s' -P '%s' estimate -c '%s/etc/wan22_t2v_a14b.cfg' --tokens 32760 "
             "--set 'model.checkpoints=[\"%s/Wan2.2-T2V-A14B/high_noise_model/i.safetensors.index.json\", "
             "\"%s/Wan2.2-T2V-A14B/low_noise_model/i.safetensors.index.json\"]'", tu_env("GHC_CLI"),
             tu_env("GHC_BUILD_PLUGINS"), tu_env("GHC_TOP_SRCDIR"), dir, dir);
    /* as shipped (plan = "auto"): the plan the trainer would take on an 80 GiB card of a host
     * of 480 GiB first (on this machine's memory it could be another) */
    snprintf(cmd, sizeof(cmd), "%s --device-memory 80 --host-memory 480", base);
    ck_assert_msg(tu_run(cmd, &out) == 0, "%s", out);
    ck_assert_msg(strstr(out, "plan: auto for 1 x 32760 tokens, 80.0 GiB free on cuda:0: mempolicy offload, saved on "
                              "the host, ") && strstr(out, "resident blocks, checkpointing block_attn") &&
                  strstr(out, "of 80.0 GiB: fits"), "%s", out);
    free(out);
    /* the rest: the sections as written */
    size_t bl = strlen(base);
    snprintf(base + bl, sizeof(base) - bl, " --set plan='\"configured\"'");
    ck_assert_msg(tu_run(base, &out) == 0, "%s", out);
    ck_assert_msg(strstr(out, "dims:  from the variant the checkpoint names say: A14B T2V expert (files absent") &&
                  strstr(out, "2 experts, dim 5120, ffn 13824, 40 blocks") &&
                  strstr(out, "weights                  27.1") && !strstr(out, "device: "), "%s", out);
    free(out);
    /* the shipped config as it is (offload) fits an 80 GiB card */
    snprintf(cmd, sizeof(cmd), "%s --device-memory 80", base);
    ck_assert_msg(tu_run(cmd, &out) == 0, "%s", out);
    ck_assert_msg(strstr(out, "of 80.0 GiB: fits") && !strstr(out, "plan:"), "%s", out);
    free(out);
    /* changes that do not fit, the plan named, and the plan's arguments fit */
    static const struct { const char *set, *plan; } cases[] = {
        { "--set mempolicy.plugin=device", "--set mempolicy.plugin=offload" },
        { "--set model.checkpointing=off", "--set model.checkpointing=block_qkv" },
        { "--set model.checkpointing=block_attn --set mempolicy.saved=device", "--set mempolicy.saved=host" },
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        snprintf(cmd, sizeof(cmd), "%s %s --device-memory %s", base, cases[c].set, c == 2 ? "40" : "80");
        ck_assert_msg(tu_run(cmd, &out) == 7, "%s", out);
        plan_args(out, plan, sizeof(plan));
        ck_assert_msg(strstr(out, "does not fit") && strcmp(plan, cases[c].plan) == 0, "%s\n(plan '%s')", out, plan);
        free(out);
        snprintf(cmd, sizeof(cmd), "%s %s %s --device-memory %s", base, cases[c].set, plan, c == 2 ? "40" : "80");
        ck_assert_msg(tu_run(cmd, &out) == 0, "%s", out);
        ck_assert_msg(strstr(out, ": fits"), "%s", out);
        free(out);
    }
    /* nothing fits: exit 7 all the same, and says so */
    snprintf(cmd, sizeof(cmd), "%s --device-memory 4", base);
    ck_assert_msg(tu_run(cmd, &out) == 7, "%s", out);
    ck_assert_msg(strstr(out, "plan:  none fits"), "%s", out);
    free(out);
    /* one file of the 5B by its ComfyUI name; a name that says no variant is an error naming it */
    char *cfg = tu_write(dir, "5b.cfg", "mempolicy = { plugin = \"device\"; };\n"
                         "model = { plugin = \"wan22\"; checkpoint = \"models/wan2.2_ti2v_5B_fp16.safetensors\"; };\n");
    snprintf(cmd, sizeof(cmd), "'%s' -P '%s' estimate -c '%s' --device-memory 80", tu_env("GHC_CLI"),
             tu_env("GHC_BUILD_PLUGINS"), cfg);
    ck_assert_msg(tu_run(cmd, &out) == 0, "%s", out);
    ck_assert_msg(strstr(out, "1 expert, dim 3072, ffn 14336, 30 blocks") && strstr(out, "says: TI2V-5B"), "%s", out);
    free(out);
    snprintf(cmd, sizeof(cmd), "'%s' -P '%s' estimate -c '%s' --set model.checkpoint=nothing.safetensors",
             tu_env("GHC_CLI"), tu_env("GHC_BUILD_PLUGINS"), cfg);
    ck_assert_msg(tu_run(cmd, &out) == 5, "%s", out);
    ck_assert_msg(strstr(out, "nothing.safetensors: estimate: no such file"), "%s", out);
    free(out);
    snprintf(cmd, sizeof(cmd), "'%s' -P '%s' estimate -c '%s' --device-memory x", tu_env("GHC_CLI"),
             tu_env("GHC_BUILD_PLUGINS"), cfg);
    ck_assert_msg(tu_run(cmd, &out) == 2, "%s", out);
    free(out);
    free(cfg);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

START_TEST(diag_cli)
{
    char *dir = tu_tmpdir(), *out, cmd[8192], json[4200];
    snprintf(json, sizeof(json), "%s/diag.json", dir);
    snprintf(cmd, sizeof(cmd), "GHC_PLUGIN_PATH='%s' '%s' diag --skip-allocation --json '%s'", tu_env("GHC_BUILD_PLUGINS"),
             tu_env("GHC_CLI"), json);
    int rc = tu_run(cmd, &out);
#ifdef GHC_HAVE_CUDA
    /* no GPU is visible here: the probe says so and the run fails with the mark */
    ck_assert_msg(rc == 1 && strstr(out, "[env]") && strstr(out, "host_total") && strstr(out, "1 check failed"),
                  "exit %d: %s", rc, out);
    const char *failed = "\"failed\": 1";
#else
    /* a CPU-only build has no GPU probe (gh200_uvm is a CUDA plugin): skipped, not failed */
    ck_assert_msg(rc == 0 && strstr(out, "[env]") && strstr(out, "host_total") && strstr(out, "SKIP probe") &&
                  strstr(out, "0 checks failed"), "exit %d: %s", rc, out);
    const char *failed = "\"failed\": 0";
#endif
    if (access(tu_env("GHC_BUILD_PLUGINS"), R_OK) == 0 && strstr(out, "[gpu]") && !strstr(out, "SKIP probe"))
        ck_assert_msg(strstr(out, "FAIL devices") && strstr(out, "platform") && strstr(out, "none"), "%s", out);
    free(out);
    FILE *f = fopen(json, "r");
    ck_assert_msg(f != NULL, "no %s", json);
    char buf[65536];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = '\0';
    fclose(f);
    ck_assert_msg(strstr(buf, failed) && strstr(buf, "\"key\": \"host_total\"") && buf[n - 2] == '}', "%s", buf);
    snprintf(cmd, sizeof(cmd), "'%s' diag --oversubscription-scale -1", tu_env("GHC_CLI"));
    ck_assert_int_eq(tu_run(cmd, &out), 2);
    ck_assert_msg(strstr(out, "--oversubscription-scale '-1'"), "%s", out);
    free(out);
    tu_rm_rf(dir);
    free(dir);
}
END_TEST

static Suite *mem_suite(void)
{
    Suite *s = suite_create("mem");
    TCase *sm = tcase_create("state_machine");
    tcase_add_test(sm, sm_threshold);
    tcase_add_test(sm, sm_light_rescues);
    tcase_add_test(sm, sm_no_oscillation);
    tcase_add_test(sm, sm_after_empty_cache);
    tcase_add_test(sm, sm_cap_and_hard);
    tcase_add_test(sm, sm_discrete_never_past_free);
    tcase_add_test(sm, sm_kinds);
    tcase_add_test(sm, sm_thresholds_small_device);
    suite_add_tcase(s, sm);
    TCase *rules = tcase_create("rules");
    tcase_add_test(rules, platform_classes);
    tcase_add_test(rules, advice_by_role);
    tcase_add_test(rules, settings_parse);
    suite_add_tcase(s, rules);
    TCase *pol = tcase_create("policies");
    tcase_set_timeout(pol, 60);
    tcase_add_test(pol, uvm_bad_settings);
    tcase_add_test(pol, gpu_policies_without_gpu);
    tcase_add_test(pol, host_oom_names_roles);
    tcase_add_test(pol, saved_ring_streams);
    tcase_add_test(pol, saved_role_host);
    tcase_add_test(pol, encoder_roles_host);
    suite_add_tcase(s, pol);
    TCase *cli = tcase_create("cli");
    tcase_set_timeout(cli, 120);
    tcase_add_test(cli, estimate_matches_peak);
    tcase_add_test(cli, estimate_cli);
    tcase_add_test(cli, plan_auto);
    tcase_add_test(cli, estimate_plan);
    tcase_add_test(cli, diag_cli);
    suite_add_tcase(s, cli);
    return s;
}

int main(void)
{
    setenv("CUDA_VISIBLE_DEVICES", "", 1);   /* before any CUDA call: this suite sees no GPU */
    unsetenv("GH200_UVM_OVERSUBSCRIPTION_RATIO");
    unsetenv("GH200_UVM_ACCESS_PATTERN");
    return tu_run_suite(mem_suite(), false);
}
