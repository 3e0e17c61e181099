# tests/umt5.mk: the umT5 text encoder module (plugins/umt5): tokenizer, cleaning, the
# text-encoder ops and the encoder forward against tests/fixtures/umt5, made by the committed
# tests/fixtures/make_umt5_fixtures.py (tests/fixtures/README.md, section "umt5").
check_PROGRAMS += tests/test_umt5
tests_test_umt5_SOURCES = tests/test_umt5.c tests/testutil.h tests/umt5_golden.h
tests_test_umt5_CFLAGS = $(TEST_CFLAGS) $(JANSSON_CFLAGS)
tests_test_umt5_LDADD = plugins/umt5/libumt5_impl.la libgh200core_ops.la $(TEST_LIBS) $(JANSSON_LIBS) -lm
if HAVE_SENTENCEPIECE
# the shim is C++: link with the C++ driver (its runtime)
nodist_EXTRA_tests_test_umt5_SOURCES = tests/cxx_link.cc
endif
TESTS += tests/test_umt5
# GPU suite (exits 77 without a device): the text-encoder kernels and the encoder on CUDA
if HAVE_CUDA
check_PROGRAMS += tests/test_umt5_cuda
tests_test_umt5_cuda_SOURCES = tests/test_umt5_cuda.c tests/testutil.h tests/umt5_golden.h
tests_test_umt5_cuda_CFLAGS = $(TEST_CFLAGS)
tests_test_umt5_cuda_LDADD = plugins/umt5/libumt5_impl.la libgh200core_ops.la $(TEST_LIBS) -lm
if HAVE_SENTENCEPIECE
nodist_EXTRA_tests_test_umt5_cuda_SOURCES = tests/cxx_link.cc
endif
TESTS += tests/test_umt5_cuda
endif
EXTRA_DIST += tests/test_umt5_cuda.c
EXTRA_DIST += tests/fixtures/make_umt5_fixtures.py tests/fixtures/umt5/spiece.model \
	tests/fixtures/umt5/tokens.json tests/fixtures/umt5/golden.safetensors \
	tests/fixtures/umt5/comfy_fp8_scaled.safetensors tests/fixtures/umt5/official.safetensors \
	tests/fixtures/umt5/hf/model.safetensors.index.json tests/fixtures/umt5/hf/model-00001-of-00003.safetensors \
	tests/fixtures/umt5/hf/model-00002-of-00003.safetensors tests/fixtures/umt5/hf/model-00003-of-00003.safetensors
