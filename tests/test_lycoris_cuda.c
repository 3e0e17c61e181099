/* test_lycoris_cuda.c: the lycoris golden cases (f32 and bf16 input; DoRA included), the wan22
 * fixture LoRA, the finite-difference checks and the hook's parts before / after the model's
 * GEMMs, ghc_linear_forward_gelu (cuBLASLt's GELU epilogue) and a bf16 output's bias of
 * tests/lycoris_cases.h (which tests/test_lycoris.c runs on the CPU) on GPU 0,
 * through the `device` memory policy: the same code path (the ops) with the CUDA kernels.
 * Exits 77 without a GPU. */
#include <config.h>

#include "lycoris_cases.h"

#include "../kernels/cuda/device.h"   /* defines: ghc_k_device_count */

int main(void)
{
    if (ghc_k_device_count() < 1)
        return 77;
    dev = 0;
    Suite *s = suite_create("lycoris_cuda");
    TCase *tc = tcase_create("gpu");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, golden, 0, N_GCASES);
    tcase_add_loop_test(tc, golden_bf16_input, 0, N_GCASES);
    tcase_add_loop_test(tc, wan22_fixture_lora, 0, 3);
    tcase_add_loop_test(tc, wan22_finite_differences, 0, 5);
    tcase_add_loop_test(tc, wan22_first_vs_after, 0, (int)(sizeof(first_cfgs) / sizeof(first_cfgs[0])));
    tcase_add_loop_test(tc, wan22_keep_h, 0, 2);
    tcase_add_loop_test(tc, wan22_concat, 0, (int)(sizeof(concat_cfgs) / sizeof(concat_cfgs[0])));
    tcase_add_loop_test(tc, linear_gelu, 0, N_LG_CASES);
    tcase_add_test(tc, linear_bf16_bias);
    suite_add_tcase(s, tc);
    return tu_run_suite(s, true);
}
