/* test_cuda_device.c: the CUDA build path end to end: code compiled by nvcc through libtool
 * (build-aux/nvcc-lt) loads, finds the device and computes what the CPU computes.
 * Exits 77 (automake SKIP) without a device; runs with CK_FORK=no (CUDA and fork() do not mix). */
#include <check.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/cuda/device.h"

START_TEST(device_info)
{
    char name[256];
    int major = 0, minor = 0;
    size_t free_b = 0, total_b = 0;
    int e = ghc_k_device_info(0, name, sizeof(name), &major, &minor, &free_b, &total_b);
    ck_assert_msg(e == 0, "%s", ghc_k_error_string(e));
    ck_assert(strlen(name) > 0);
    ck_assert_int_ge(major, 7);
    ck_assert(total_b > 0 && free_b <= total_b);
    printf("device 0: %s, sm_%d%d, %.1f of %.1f GiB free\n", name, major, minor,
           free_b / 1073741824.0, total_b / 1073741824.0);
}
END_TEST

START_TEST(axpy_matches_cpu)
{
    static const size_t sizes[] = { 1, 255, 256, 257, 1000003 };
    for (size_t k = 0; k < sizeof(sizes) / sizeof(*sizes); k++) {
        size_t n = sizes[k];
        float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
        ck_assert(x && y && got);
        srand(1234 + (unsigned)k);
        for (size_t i = 0; i < n; i++) {
            x[i] = (float)rand() / RAND_MAX - 0.5f;
            y[i] = (float)rand() / RAND_MAX - 0.5f;
        }
        float *dx, *dy;
        ck_assert_int_eq(cudaMalloc((void **)&dx, (n + 64) * sizeof(float)), cudaSuccess);
        ck_assert_int_eq(cudaMalloc((void **)&dy, (n + 64) * sizeof(float)), cudaSuccess);
        ck_assert_int_eq(cudaMemset(dy, 0xff, (n + 64) * sizeof(float)), cudaSuccess);  /* poison: NaN */
        ck_assert_int_eq(cudaMemcpy(dx, x, n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
        ck_assert_int_eq(cudaMemcpy(dy, y, n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
        int e = ghc_k_axpy_f32(dy, dx, 1.5f, n, NULL);
        ck_assert_msg(e == 0, "%s", ghc_k_error_string(e));
        ck_assert_int_eq(cudaMemcpy(got, dy, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
        for (size_t i = 0; i < n; i++) {
            float ref = 1.5f * x[i] + y[i];
            ck_assert_msg(fabsf(got[i] - ref) <= 1e-6f + 1e-6f * fabsf(ref), "n=%zu [%zu] %g vs %g", n, i, got[i], ref);
        }
        /* the element past the end stays poisoned: the kernel wrote only n elements */
        uint32_t past;
        ck_assert_int_eq(cudaMemcpy(&past, dy + n, sizeof(past), cudaMemcpyDeviceToHost), cudaSuccess);
        ck_assert_uint_eq(past, 0xffffffffu);
        cudaFree(dx);
        cudaFree(dy);
        free(x);
        free(y);
        free(got);
    }
}
END_TEST

int main(void)
{
    if (ghc_k_device_count() < 1) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    Suite *s = suite_create("cuda_device");
    TCase *tc = tcase_create("device");
    tcase_add_test(tc, device_info);
    tcase_add_test(tc, axpy_matches_cpu);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
