# ---- Wan VAEs (plugins/wanvae) and the convolution / VAE ops ----
# Golden fixtures made by diffusers through the committed script (tests/fixtures/README.md,
# section "wanvae"); the C test reads them, Python is not needed.
EXTRA_DIST += tests/fixtures/make_wanvae_fixtures.py \
	tests/fixtures/wanvae/weights_diffusers.safetensors \
	tests/fixtures/wanvae/names_tiny21.txt \
	tests/fixtures/wanvae/case.safetensors \
	tests/fixtures/wanvae/names_wan21.txt \
	tests/fixtures/wanvae/weights22_diffusers.safetensors \
	tests/fixtures/wanvae/names_tiny22.txt \
	tests/fixtures/wanvae/case22.safetensors \
	tests/fixtures/wanvae/case_tiled.safetensors \
	tests/fixtures/wanvae/case22_tiled.safetensors \
	tests/fixtures/wanvae/names_wan22.txt
check_PROGRAMS += tests/test_wanvae
tests_test_wanvae_SOURCES = tests/test_wanvae.c tests/testutil.h
tests_test_wanvae_CFLAGS = $(TEST_CFLAGS)
tests_test_wanvae_LDADD = plugins/wanvae/libwanvae.la libgh200core_ops.la $(TEST_LIBS) -lm
TESTS += tests/test_wanvae
# the CUDA kernels of the convolution / VAE ops and the VAEs on the GPU (exit 77 without a device)
if HAVE_CUDA
check_PROGRAMS += tests/test_vae_cuda
tests_test_vae_cuda_SOURCES = tests/test_vae_cuda.c tests/testutil.h tests/cuda_testutil.h
tests_test_vae_cuda_CFLAGS = $(TEST_CFLAGS)
tests_test_vae_cuda_LDADD = plugins/wanvae/libwanvae.la libgh200core_ops.la $(TEST_LIBS) -lm
TESTS += tests/test_vae_cuda
endif
EXTRA_DIST += tests/test_vae_cuda.c
