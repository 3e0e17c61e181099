/* test_optim_cuda.c: the adamw and automagic optimizers on CUDA device 0: the golden
 * trajectories of the CPU suite (adamw bit-identical: the kernel rounds as the CPU does;
 * automagic within a tolerance: f32 tree sums), exact resume on the device, bf16 params.
 * Exits 77 (automake SKIP) without a device; runs with CK_NOFORK. */
#include <config.h>

#include "optim_cases.h"

#include "../kernels/cuda/device.h"

static ghc_core_t *oc_core(const char *section)
{
    char text[2048];
    snprintf(text, sizeof(text), "mempolicy = { plugin = \"device\"; };\n%s", section);
    ghc_core_t *core = ghc_core_init();
    ck_assert_ptr_nonnull(core);
    ck_assert_int_eq(ghc_plugin_add_path(core, tu_env("GHC_BUILD_PLUGINS")), 0);
    ck_assert_msg(ghc_config_load_string(core, text, "t.cfg", NULL, NULL, 0) == 0, "%s", ghc_error_message(core));
    ck_assert_msg(ghc_run_init(core) == 0, "%s", ghc_error_message(core));
    return core;
}

START_TEST(adamw_golden_cuda) { oc_adamw_golden(0, 1e-6); }
END_TEST

START_TEST(automagic_golden_cuda) { oc_automagic_golden(0, 1e-5); }
END_TEST

START_TEST(resume_cuda)
{
    char cfg[1024];
    oc_resume(0, oc_adamw_cfg, GHC_DTYPE_F32, 0);
    oc_resume(0, oc_adamw_cfg, GHC_DTYPE_BF16, 1);
    snprintf(cfg, sizeof(cfg), oc_automagic_cfg, "");
    oc_resume(0, cfg, GHC_DTYPE_F32, 1);
    oc_resume(0, cfg, GHC_DTYPE_BF16, 0);
    snprintf(cfg, sizeof(cfg), oc_automagic_cfg, "lr_mask = \"f32\"; seed = 3;");
    oc_resume(0, cfg, GHC_DTYPE_F32, -1);
}
END_TEST

int main(void)
{
    if (ghc_k_device_count() < 1) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    Suite *s = suite_create("optim_cuda");
    TCase *tc = tcase_create("cuda");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, adamw_golden_cuda);
    tcase_add_test(tc, automagic_golden_cuda);
    tcase_add_test(tc, resume_cuda);
    suite_add_tcase(s, tc);
    return tu_run_suite(s, true);
}
