/* test_mem_cuda.c: the GPU memory policies on a real device (exit 77 without one). Placement
 * per role under gh200_uvm read back with cudaMemRangeGetAttribute (preferred location, last
 * prefetch location) for the access patterns and with hints off; the environment override;
 * the discrete cap, exercised through a configured headroom so no managed byte ever exceeds
 * what the card has free; equal losses and gradients for the same seed under device,
 * gh200_uvm (stage 1: weights managed) and offload (weights streamed through the ring), the
 * saved activations on the card or pinned through the saved ring, checkpointing "block" and
 * "block_attn", on a tiny 4-block two-expert wan22 model; estimate against the device policy's measured peak for
 * the tiny and an A14B-dims 4-block model; and the diag probe. CUDA does not survive fork():
 * the suite runs in-process. */
#include <math.h>

#include <cuda_runtime_api.h>

#include "../core/cli.h"
#include "mem_step.h"
#include "testutil.h"

static ghc_core_t *policy_core(const char *cfg)
{
    ghc_core_t *core = ghc_core_init();
    ck_assert_ptr_nonnull(core);
    ms_ok(core, ghc_plugin_add_path(core, tu_env("GHC_BUILD_PLUGINS")));
    ms_ok(core, ghc_config_load_string(core, cfg, "mem.cfg", NULL, NULL, 0));
    ms_ok(core, ghc_run_init(core));
    return core;
}

static int range_attr(void *p, size_t n, enum cudaMemRangeAttribute a)
{
    int v = -99;
    cudaError_t e = cudaMemRangeGetAttribute(&v, sizeof(v), a, p, n);
    ck_assert_msg(e == cudaSuccess, "cudaMemRangeGetAttribute: %s", cudaGetErrorString(e));
    return v;
}

static bool is_managed(void *p)
{
    struct cudaPointerAttributes at;
    ck_assert_int_eq(cudaPointerGetAttributes(&at, p), cudaSuccess);
    return at.type == cudaMemoryTypeManaged;
}

#define PREF(p, n) range_attr(p, n, cudaMemRangeAttributePreferredLocation)
#define LAST(p, n) range_attr(p, n, cudaMemRangeAttributeLastPrefetchLocation)
#define MiB ((size_t)1 << 20)

/* stage1_threshold = 1: every allocation but the workspace is served managed, with advice */
START_TEST(uvm_placement_per_role)
{
    ghc_core_t *core = policy_core("mempolicy = { plugin = \"gh200_uvm\"; stage1_threshold = 1.0; };");
    ghc_mempolicy_t *mp = ghc_mempolicy_get(core);
    void *p[GHC_ROLE_COUNT];
    for (int r = 0; r < GHC_ROLE_COUNT; r++)
        ms_ok(core, ghc_mem_alloc(mp, 4 * MiB, (enum ghc_mem_role)r, 0, &p[r]));
    ck_assert(!is_managed(p[GHC_ROLE_WORKSPACE]));
    ck_assert_int_eq(PREF(p[GHC_ROLE_LATENTS], 4 * MiB), cudaCpuDeviceId);
    ck_assert_int_eq(PREF(p[GHC_ROLE_WEIGHTS_INACTIVE], 4 * MiB), cudaCpuDeviceId);
    ck_assert_int_eq(PREF(p[GHC_ROLE_TEXT_EMBEDS], 4 * MiB), 0);
    ck_assert_int_eq(PREF(p[GHC_ROLE_MASKS], 4 * MiB), 0);
    ck_assert_int_eq(PREF(p[GHC_ROLE_WEIGHTS], 4 * MiB), 0);
    ck_assert_int_eq(PREF(p[GHC_ROLE_ACTIVATIONS], 4 * MiB), 0);          /* gpu_first */
    ck_assert_int_eq(PREF(p[GHC_ROLE_ENCODER_WEIGHTS], 4 * MiB), 0);      /* as the model's weights */
    ck_assert_int_eq(PREF(p[GHC_ROLE_ENCODER_ACTIVATIONS], 4 * MiB), 0);  /* gpu_first */
    ck_assert_int_eq(PREF(p[GHC_ROLE_OPTIMIZER_STATE], 4 * MiB), cudaCpuDeviceId);   /* stage 1: pressed */
    /* prefetch: recorded on the range; latents read where they are until prefetched */
    ms_ok(core, ghc_mem_prefetch(mp, p[GHC_ROLE_TEXT_EMBEDS], 4 * MiB, 0, NULL));
    ms_ok(core, ghc_mem_prefetch(mp, p[GHC_ROLE_LATENTS], 4 * MiB, 0, NULL));
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
    ck_assert_int_eq(LAST(p[GHC_ROLE_TEXT_EMBEDS], 4 * MiB), 0);
    ck_assert_int_eq(LAST(p[GHC_ROLE_LATENTS], 4 * MiB), 0);
    /* the expert switch: the weights' role changes and their advice follows */
    ms_ok(core, ghc_mem_advise(mp, p[GHC_ROLE_WEIGHTS], 4 * MiB, GHC_ROLE_WEIGHTS_INACTIVE));
    ck_assert_int_eq(PREF(p[GHC_ROLE_WEIGHTS], 4 * MiB), cudaCpuDeviceId);
    struct ghc_mem_stats st = { .struct_size = sizeof(st) };
    ms_ok(core, ghc_mem_stats(mp, &st));
    ck_assert_int_eq(st.stage, 1);
    /* all but the workspace, and the saved activations, pinned on the host unless integrated */
    ck_assert(!is_managed(p[GHC_ROLE_SAVED]) || st.platform == GHC_PLATFORM_INTEGRATED);
    ck_assert_uint_eq(st.bytes_managed, (st.platform == GHC_PLATFORM_INTEGRATED ? 12 : 11) * 4 * MiB);
    ck_assert_uint_eq(st.bytes_role_peak[GHC_ROLE_ENCODER_WEIGHTS], 4 * MiB);
    ck_assert_uint_eq(st.bytes_role_managed[GHC_ROLE_WEIGHTS_INACTIVE], 8 * MiB);
    ck_assert_uint_eq(st.prefetched_bytes, 8 * MiB);
    ck_assert_uint_ge(st.transitions, 1);
    ck_assert_int_ne(st.platform, GHC_PLATFORM_NONE);
    fprintf(stderr, "uvm: platform %s, managed cap %.1f GiB, device budget %.1f GiB\n",
            ghc_mem_platform_name((enum ghc_mem_platform)st.platform), st.managed_cap / 1073741824.0,
            st.device_budget / 1073741824.0);
    for (int r = 0; r < GHC_ROLE_COUNT; r++)
        ghc_mem_release(mp, p[r]);
    ms_ok(core, ghc_mem_stats(mp, &st));
    ck_assert_uint_eq(st.bytes_managed, 0);
    ghc_core_free(core);
}
END_TEST

START_TEST(uvm_patterns_and_hints)
{
    static const struct { const char *cfg, *env; int act, lat; } cases[] = {
        { "access_pattern = \"cpu_first\";", NULL, cudaCpuDeviceId, cudaCpuDeviceId },
        { "access_pattern = \"balanced\";", NULL, cudaInvalidDeviceId, cudaCpuDeviceId },
        { "access_pattern = \"gpu_first\";", "cpu_first", cudaCpuDeviceId, cudaCpuDeviceId },   /* env wins */
        { "enable_uvm_hints = false;", NULL, cudaInvalidDeviceId, cudaInvalidDeviceId },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char cfg[256];
        snprintf(cfg, sizeof(cfg), "mempolicy = { plugin = \"gh200_uvm\"; stage1_threshold = 1.0; %s };", cases[i].cfg);
        if (cases[i].env)
            setenv("GH200_UVM_ACCESS_PATTERN", cases[i].env, 1);
        ghc_core_t *core = policy_core(cfg);
        unsetenv("GH200_UVM_ACCESS_PATTERN");
        ghc_mempolicy_t *mp = ghc_mempolicy_get(core);
        void *a, *l;
        ms_ok(core, ghc_mem_alloc(mp, 2 * MiB, GHC_ROLE_ACTIVATIONS, 0, &a));
        ms_ok(core, ghc_mem_alloc(mp, 2 * MiB, GHC_ROLE_LATENTS, 0, &l));
        ck_assert(is_managed(a) && is_managed(l));
        ck_assert_msg(PREF(a, 2 * MiB) == cases[i].act, "case %zu: activations %d", i, PREF(a, 2 * MiB));
        ck_assert_msg(PREF(l, 2 * MiB) == cases[i].lat, "case %zu: latents %d", i, PREF(l, 2 * MiB));
        ghc_mem_release(mp, a);
        ghc_mem_release(mp, l);
        ghc_core_free(core);
    }
}
END_TEST

/* The cap on a discrete GPU, against a configured headroom that leaves 256 MiB of managed
 * budget: what fits is served, what would pass it is refused before anything is allocated. */
START_TEST(uvm_discrete_cap)
{
    size_t fr = 0, tot = 0;
    ck_assert_int_eq(cudaMemGetInfo(&fr, &tot), cudaSuccess);
    int cma = 0, hpt = 0, integ = 0;
    cudaDeviceGetAttribute(&cma, cudaDevAttrConcurrentManagedAccess, 0);
    cudaDeviceGetAttribute(&hpt, cudaDevAttrPageableMemoryAccessUsesHostPageTables, 0);
    cudaDeviceGetAttribute(&integ, cudaDevAttrIntegrated, 0);
    if (integ || hpt || !cma) {
        fprintf(stderr, "uvm_discrete_cap: not a discrete platform; skipped\n");
        return;
    }
    char cfg[256];
    long long headroom = (long long)(fr / MiB) - 256;
    snprintf(cfg, sizeof(cfg), "mempolicy = { plugin = \"gh200_uvm\"; headroom_mib = %lld; };", headroom);
    ghc_core_t *core = policy_core(cfg);
    ghc_mempolicy_t *mp = ghc_mempolicy_get(core);
    struct ghc_mem_stats st = { .struct_size = sizeof(st) };
    ms_ok(core, ghc_mem_stats(mp, &st));
    ck_assert_int_eq(st.platform, GHC_PLATFORM_DISCRETE);
    /* not ratio x HBM: the free memory the policy sees at its start minus the headroom, and
     * free memory moves by a little between the two readings (192 KiB seen on an H100) */
    ck_assert_uint_le(st.managed_cap, 272 * MiB);
    ck_assert_uint_ge(st.managed_cap, 200 * MiB);
    void *a = NULL, *b = NULL;
    ms_ok(core, ghc_mem_alloc(mp, 64 * MiB, GHC_ROLE_LATENTS, 0, &a));   /* latents: always managed */
    ck_assert(is_managed(a));
    int rc = ghc_mem_alloc(mp, 512 * MiB, GHC_ROLE_LATENTS, 0, &b);
    ck_assert_int_eq(rc, GHC_ENOMEM);
    ck_assert_ptr_null(b);
    const char *msg = ghc_error_message(core);
    ck_assert_msg(strstr(msg, "536870912 bytes") && strstr(msg, "latents") && strstr(msg, "managed cap") &&
                  strstr(msg, "in use by role: latents 64.0 MiB"), "%s", msg);
    ms_ok(core, ghc_mem_stats(mp, &st));
    ck_assert_uint_eq(st.bytes_managed, 64 * MiB);
    ck_assert_uint_ge(st.hard_reclamations, 1);
    ghc_mem_release(mp, a);
    ghc_core_free(core);
}
END_TEST

/* ---- equal losses under the three GPU policies --------------------------------------------- */

#define TINY_MODEL_CK(ck) \
    "model = { plugin = \"wan22\"; dtype = \"bf16\"; device = 0; checkpointing = \"" ck "\"; checkpoint_every = 2;\n" \
    "  random = { dim = 128; ffn_dim = 320; heads = 2; layers = 4; text_dim = 64; freq_dim = 64; experts = 2; seed = 7; }; };\n"
#define TINY_MODEL TINY_MODEL_CK("block")

static double max_rel(const float *a, const float *b, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num = fmax(num, fabs((double)a[i] - b[i]));
        den = fmax(den, fabs((double)b[i]));
    }
    return den > 0 ? num / den : num;
}

/* The same losses under device, gh200_uvm (stage 1: weights managed; saved activations pinned
 * through its ring) and offload (weights streamed; saved activations pinned through its ring,
 * or on the device), with checkpointing "block" and "block_attn" (the recomputation restores
 * the attention output instead of computing it): outputs bit for bit, input gradients within
 * 1e-6 of the device policy's with "block". */
START_TEST(same_losses)
{
    enum { RUNS = 8 };
    static const struct { const char *name, *policy, *model; } runs[RUNS] = {
        { "device", "mempolicy = { plugin = \"device\"; };\n", TINY_MODEL },
        { "gh200_uvm", "mempolicy = { plugin = \"gh200_uvm\"; stage1_threshold = 1.0; };\n", TINY_MODEL },
        { "offload", "mempolicy = { plugin = \"offload\"; ring = 2; };\n", TINY_MODEL },
        { "offload/saved=device", "mempolicy = { plugin = \"offload\"; ring = 2; saved = \"device\"; };\n", TINY_MODEL },
        { "device/block_attn", "mempolicy = { plugin = \"device\"; };\n", TINY_MODEL_CK("block_attn") },
        { "offload/block_attn", "mempolicy = { plugin = \"offload\"; ring = 2; saved_ring = 2; saved_ahead = 1; };\n",
          TINY_MODEL_CK("block_attn") },
        { "gh200_uvm/block_attn", "mempolicy = { plugin = \"gh200_uvm\"; saved = \"host\"; };\n",
          TINY_MODEL_CK("block_attn") },
        { "offload/resident=2", "mempolicy = { plugin = \"offload\"; ring = 2; resident = 2; };\n", TINY_MODEL },
    };
    struct mem_step r[RUNS];
    char cfg[2048];
    for (int p = 0; p < RUNS; p++) {
        snprintf(cfg, sizeof(cfg), "%s%s", runs[p].policy, runs[p].model);
        mem_step_run(cfg, 0, 1, 16, 3, 16, 16, 64, &r[p]);
        fprintf(stderr, "same_losses: %-21s loss %.9g %.9g, peak %.2f MiB, managed %llu, streamed %.2f MiB, "
                "prefetched %.2f MiB, saved %.2f MiB (home %.2f, back %.2f MiB, %llu hits, ring %.2f MiB)\n",
                runs[p].name, r[p].loss[0], r[p].loss[1], r[p].stats.bytes_peak / 1048576.0,
                (unsigned long long)r[p].stats.bytes_role_managed[0], r[p].stats.streamed_bytes / 1048576.0,
                r[p].stats.prefetched_bytes / 1048576.0, r[p].stats.bytes_role[GHC_ROLE_SAVED] / 1048576.0,
                r[p].stats.saved_out_bytes / 1048576.0, r[p].stats.saved_in_bytes / 1048576.0,
                (unsigned long long)r[p].stats.saved_hits, r[p].stats.saved_ring_bytes / 1048576.0);
    }
    for (int p = 1; p < RUNS; p++)
        for (int e = 0; e < 2; e++) {
            ck_assert_msg(r[p].loss[e] == r[0].loss[e], "policy %d expert %d: loss %.9g vs %.9g", p, e, r[p].loss[e],
                          r[0].loss[e]);
            ck_assert_msg(memcmp(r[p].out[e], r[0].out[e], (size_t)r[0].n * sizeof(float)) == 0,
                          "policy %d expert %d: outputs differ, max rel %g", p, e, max_rel(r[p].out[e], r[0].out[e], r[0].n));
            double d = max_rel(r[p].dx[e], r[0].dx[e], r[0].n);
            ck_assert_msg(d <= 1e-6, "policy %d expert %d: input gradients differ, max rel %g", p, e, d);
        }
    ck_assert(r[0].loss[0] != r[0].loss[1]);                           /* two different experts ran */
    ck_assert_uint_gt(r[1].stats.bytes_role_managed[GHC_ROLE_WEIGHTS] +
                      r[1].stats.bytes_role_managed[GHC_ROLE_WEIGHTS_INACTIVE], 0);   /* weights were managed */
    ck_assert_uint_gt(r[1].stats.prefetched_bytes, 0);                  /* next block prefetched */
    ck_assert_uint_gt(r[2].stats.bytes_pinned, 0);                      /* weights pinned on the host */
    /* streamed: both experts, forward and backward, every block at least once per pass */
    uint64_t weights = r[0].stats.bytes_role[GHC_ROLE_WEIGHTS] + r[0].stats.bytes_role[GHC_ROLE_WEIGHTS_INACTIVE];
    ck_assert_msg(r[2].stats.streamed_bytes >= weights / 2, "streamed %llu of %llu weight bytes",
                  (unsigned long long)r[2].stats.streamed_bytes, (unsigned long long)weights);
    /* resident = 2 of the 4 blocks a expert: those copied once, the others streamed as before;
     * their buffers on the device */
    ck_assert_msg(r[7].stats.streamed_bytes < r[2].stats.streamed_bytes, "resident: streamed %llu, all streamed %llu",
                  (unsigned long long)r[7].stats.streamed_bytes, (unsigned long long)r[2].stats.streamed_bytes);
    ck_assert_uint_gt(r[7].stats.bytes_device, r[2].stats.bytes_device);
    /* saved activations: in place under device and offload saved=device; else every unit went
     * home in each of the 2 forwards, and some came back (more units than ring buffers) */
    for (int p = 0; p < RUNS; p++) {
        const struct ghc_mem_stats *st = &r[p].stats;
        bool ring = p == 2 || p == 5 || p == 6 || p == 7 || (p == 1 && st->platform != GHC_PLATFORM_INTEGRATED);   /* auto */
        ck_assert_uint_gt(st->bytes_role[GHC_ROLE_SAVED], 0);
        if (ring) {
            ck_assert_msg(st->saved_out_bytes == 2 * st->bytes_role[GHC_ROLE_SAVED], "%s: %llu bytes home", runs[p].name,
                          (unsigned long long)st->saved_out_bytes);
            ck_assert_msg(st->saved_in_bytes > 0 && st->saved_ring_bytes > 0, "%s", runs[p].name);
        } else {
            ck_assert_uint_eq(st->saved_out_bytes + st->saved_in_bytes + st->saved_ring_bytes, 0);
        }
    }
    ck_assert_uint_gt(r[4].stats.bytes_role[GHC_ROLE_SAVED], r[0].stats.bytes_role[GHC_ROLE_SAVED]);   /* o, lse */
    for (int p = 0; p < RUNS; p++)
        mem_step_free(&r[p]);
}
END_TEST

/* ---- estimate against the measured peak ----------------------------------------------------- */

static void estimate_vs_peak(const char *model, int64_t T, int64_t Hl, int64_t Wl, int64_t text_dim)
{
    char cfg[2048];
    snprintf(cfg, sizeof(cfg), "mempolicy = { plugin = \"device\"; };\n%s", model);
    struct mem_step r;
    mem_step_run(cfg, 0, 1, 16, T, Hl, Wl, text_dim, &r);
    ghc_core_t *core = ghc_core_init();
    ck_assert_int_eq(ghc_plugin_add_path(core, tu_env("GHC_BUILD_PLUGINS")), 0);   /* the plugins estimate */
    ck_assert_int_eq(ghc_config_load_string(core, cfg, "e.cfg", NULL, NULL, 0), 0);
    struct ghc_estimate est;
    struct ghc_estimate_opts o = { .batch = 1, .tokens = T * (Hl / 2) * (Wl / 2), .adapters = false };
    ck_assert_msg(ghc_cli_estimate(core, &o, &est, NULL) == 0, "%s", ghc_error_message(core));
    double got = (double)est.at[1], peak = (double)r.stats.bytes_peak;
    fprintf(stderr, "estimate: %.3f GiB vs measured peak %.3f GiB (%+.2f%%)\n", got / 1073741824.0,
            peak / 1073741824.0, 100.0 * (got - peak) / peak);
    ck_assert_msg(fabs(got - peak) <= 0.10 * peak, "estimate %.0f vs peak %.0f", got, peak);
    mem_step_free(&r);
    ghc_core_free(core);
}

START_TEST(estimate_tiny)
{
    estimate_vs_peak(TINY_MODEL, 3, 16, 16, 64);
}
END_TEST

START_TEST(estimate_a14b_4_blocks)
{
    estimate_vs_peak("model = { plugin = \"wan22\"; dtype = \"bf16\"; device = 0; checkpointing = \"block\";\n"
                     "  random = { dim = 5120; ffn_dim = 13824; heads = 40; layers = 4; seed = 1; }; };\n",
                     5, 30, 52, 4096);   /* 5 x 15 x 26 = 1950 tokens */
}
END_TEST

START_TEST(diag_probe)
{
    ghc_core_t *core = ghc_core_init();
    ms_ok(core, ghc_plugin_add_path(core, tu_env("GHC_BUILD_PLUGINS")));
    struct ghc_probe_opts o = { .struct_size = sizeof(o), .oversubscription_scale = 0.05 };
    int failed = -1;
    char path[256];
    snprintf(path, sizeof(path), "%s/diag.json", getenv("OUT") ? getenv("OUT") : "/tmp");
    ms_ok(core, ghc_cli_diag(core, &o, path, stderr, &failed));
    ck_assert_int_eq(failed, 0);
    ghc_core_free(core);
}
END_TEST

int main(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1)
        return 77;
    Suite *s = suite_create("mem_cuda");
    TCase *tc = tcase_create("gpu");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, uvm_placement_per_role);
    tcase_add_test(tc, uvm_patterns_and_hints);
    tcase_add_test(tc, uvm_discrete_cap);
    tcase_add_test(tc, same_losses);
    tcase_add_test(tc, estimate_tiny);
    tcase_add_test(tc, estimate_a14b_4_blocks);
    tcase_add_test(tc, diag_probe);
    suite_add_tcase(s, tc);
    return tu_run_suite(s, true);
}
