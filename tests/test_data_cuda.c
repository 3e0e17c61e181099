/* test_data_cuda.c: batches on a CUDA device: the unified_memory cache under the `device`
 * mempolicy, the next batch prefetched through the policy on a stream, the copies through
 * ghc_op_copy; the device batches must equal the CPU batches byte for byte, and the peers' f16
 * caches arrive as f32 there too. Exits 77 (SKIP)
 * without a GPU; runs without fork (CUDA does not survive fork()). */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include <gh200core/gh200core.h>
#include <gh200core/ops.h>

#include "testutil.h"

START_TEST(test_device_batches)
{
    char cfg[8192];
    const char *top = tu_env("GHC_TOP_SRCDIR");
    snprintf(cfg, sizeof(cfg),
             "mempolicy = { plugin = \"device\"; };\ncache = { plugin = \"unified_memory\"; };\n"
             "data = { batch_size = 2; text_dropout = 0.3; datasets = ( { path = \"%s/tests/fixtures/data/native\"; repeats = 2; },"
             " { path = \"%s/tests/fixtures/data/musubi\"; }, { path = \"%s/tests/fixtures/data/aitk\"; },"
             " { path = \"%s/tests/fixtures/data/peers/aitk\"; }, { path = \"%s/tests/fixtures/data/peers/musubi\"; } ); };",
             top, top, top, top, top);
    ghc_core_t *core = ghc_core_init();
    ck_assert_int_eq(ghc_plugin_add_path(core, tu_env("GHC_BUILD_PLUGINS")), 0);
    ck_assert_int_eq(ghc_config_load_string(core, cfg, "t.cfg", NULL, NULL, 0), 0);
    ck_assert_msg(ghc_run_init(core) == 0, "%s", ghc_error_message(core));
    ghc_dataset_t *ds = NULL;
    ck_assert_msg(ghc_dataset_open(core, &ds) == 0, "%s", ghc_error_message(core));
    for (int i = 0; i < 18; i++) {
        int64_t e, c;
        ghc_dataset_tell(ds, &e, &c);
        struct ghc_data_batch dev, cpu;
        ck_assert_msg(ghc_dataset_next(ds, 0, NULL, &dev) == 0, "%s", ghc_error_message(core));
        ck_assert_int_eq(ghc_tensor_device(dev.latents), 0);
        ck_assert_int_eq(ghc_tensor_device(dev.text_mask), 0);
        ck_assert_int_ne(ghc_tensor_dtype(dev.latents), GHC_DTYPE_F16);
        ck_assert_int_ne(ghc_tensor_dtype(dev.text_embed), GHC_DTYPE_F16);
        ck_assert_int_eq(ghc_dataset_seek(ds, e, c), 0);
        ck_assert_int_eq(ghc_dataset_next(ds, GHC_DEVICE_CPU, NULL, &cpu), 0);
        ghc_tensor_t *d[3] = { dev.latents, dev.text_embed, dev.text_mask };
        ghc_tensor_t *h[3] = { cpu.latents, cpu.text_embed, cpu.text_mask };
        for (int k = 0; k < 3; k++) {
            ghc_tensor_t *back = ghc_tensor_init(core, ghc_tensor_dtype(d[k]), ghc_tensor_ndim(d[k]), ghc_tensor_shape(d[k]),
                                                 GHC_DEVICE_CPU, GHC_ROLE_WORKSPACE);
            ck_assert_int_eq(ghc_op_copy(back, d[k], NULL), 0);
            ck_assert_int_eq(ghc_op_sync(core, 0, NULL), 0);
            ck_assert(ghc_tensor_same_shape(back, h[k]));
            ck_assert_msg(memcmp(ghc_tensor_cdata(back), ghc_tensor_cdata(h[k]), ghc_tensor_nbytes(back)) == 0,
                          "batch %d tensor %d differs on the device", i, k);
            ghc_tensor_free(back);
        }
        ghc_data_batch_release(ds, &dev);
        ghc_data_batch_release(ds, &cpu);
    }
    struct ghc_cache_stats cs;
    ghc_cache_stats(ghc_cache_get(core), &cs);
    ck_assert_uint_gt(cs.prefetched_bytes, 0);
    ghc_dataset_free(ds);
    ghc_core_free(core);
}
END_TEST

int main(void)
{
    ghc_core_t *probe = tu_device_core();   /* NULL without a CUDA device */
    if (!probe)
        return 77;
    ghc_core_free(probe);
    Suite *s = suite_create("data_cuda");
    TCase *tc = tcase_create("device");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_device_batches);
    suite_add_tcase(s, tc);
    return tu_run_suite(s, true);
}
