# ---- lycoris network plugin ----
# test_lycoris loads plugins/.libs/ghc_lycoris.so through a run and also links the plugin's
# convenience library (plugins/lycoris/local.mk) for the factorization and key names. Golden
# cases come from tests/fixtures/make_lycoris_fixtures.py (Python LyCORIS + peft, pinned); the
# C tests read them, Python is not needed. test_lycoris_cuda runs the golden cases and the
# wan22 checks (tests/lycoris_cases.h) on GPU 0 (exit 77 without one).
LYCORIS_TEST_SOURCES = tests/lycoris_cases.h tests/testutil.h
LYCORIS_TEST_LIBS = plugins/lycoris/liblycoris_impl.la libgh200core_ops.la $(TEST_LIBS) -lm
check_PROGRAMS += tests/test_lycoris
tests_test_lycoris_SOURCES = tests/test_lycoris.c $(LYCORIS_TEST_SOURCES)
tests_test_lycoris_CFLAGS = $(TEST_CFLAGS)
tests_test_lycoris_LDADD = $(LYCORIS_TEST_LIBS)
TESTS += tests/test_lycoris
if HAVE_CUDA
check_PROGRAMS += tests/test_lycoris_cuda
tests_test_lycoris_cuda_SOURCES = tests/test_lycoris_cuda.c $(LYCORIS_TEST_SOURCES)
tests_test_lycoris_cuda_CFLAGS = $(TEST_CFLAGS)
tests_test_lycoris_cuda_LDADD = $(LYCORIS_TEST_LIBS)
TESTS += tests/test_lycoris_cuda
endif
EXTRA_DIST += tests/test_lycoris.c tests/test_lycoris_cuda.c tests/fixtures/make_lycoris_fixtures.py \
	tests/fixtures/check_lycoris_load.py \
	tests/fixtures/lycoris/lora_r4.safetensors tests/fixtures/lycoris/lora_r8_rs.safetensors \
	tests/fixtures/lycoris/loha_r4.safetensors tests/fixtures/lycoris/lokr_fm1_full.safetensors \
	tests/fixtures/lycoris/lokr_f4_w2lr.safetensors tests/fixtures/lycoris/lokr_f16_both.safetensors \
	tests/fixtures/lycoris/lokr_f16_full.safetensors \
	tests/fixtures/lycoris/dora_r4_ffn0.safetensors tests/fixtures/lycoris/dora_r8_q.safetensors \
	tests/fixtures/make_comfyui_dora_fixture.py tests/fixtures/lycoris/comfyui_dora.safetensors
# gh200core merge: through the CLI, with the lycoris and wan22 fixtures (comfyui_dora: what
# ComfyUI's own DoRA code makes of a file of ours, from make_comfyui_dora_fixture.py)
check_PROGRAMS += tests/test_merge
tests_test_merge_SOURCES = tests/test_merge.c tests/testutil.h
tests_test_merge_CFLAGS = $(TEST_CFLAGS)
tests_test_merge_LDADD = libgh200core_ops.la $(TEST_LIBS) -lm
TESTS += tests/test_merge
EXTRA_DIST += tests/test_merge.c
# ---- end lycoris ----
