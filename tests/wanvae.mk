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
	tests/fixtures/wanvae/names_wan22.txt
check_PROGRAMS += tests/test_wanvae
tests_test_wanvae_SOURCES = tests/test_wanvae.c tests/testutil.h
tests_test_wanvae_CFLAGS = $(TEST_CFLAGS)
tests_test_wanvae_LDADD = plugins/wanvae/libwanvae.la libgh200core_ops.la $(TEST_LIBS) -lm
TESTS += tests/test_wanvae
