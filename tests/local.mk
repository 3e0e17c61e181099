# tests: Check suites, loader test plugins, the CLI and the out-of-tree example plugin.
# Test plugins are linked as the shipped ones are (PLUGIN_LDFLAGS, Makefile.am), plus -rpath
# /nowhere (never installed); good ones go to tests/plugins/.libs, deliberately broken ones to
# tests/badplugins/.libs.
TEST_PLUGIN_LDFLAGS = $(PLUGIN_LDFLAGS) -rpath /nowhere
TEST_PLUGIN_CFLAGS = $(PLUGIN_CFLAGS)
TEST_PLUGIN_LIBS = libgh200core.la

check_LTLIBRARIES += tests/plugins/ghc_good.la
tests_plugins_ghc_good_la_SOURCES = tests/plugins/fake.c
tests_plugins_ghc_good_la_CPPFLAGS = $(AM_CPPFLAGS) -DFAKE_NAME=good
tests_plugins_ghc_good_la_CFLAGS = $(TEST_PLUGIN_CFLAGS)
tests_plugins_ghc_good_la_LDFLAGS = $(TEST_PLUGIN_LDFLAGS)
tests_plugins_ghc_good_la_LIBADD = $(TEST_PLUGIN_LIBS)

check_LTLIBRARIES += tests/plugins/ghc_refuse.la
tests_plugins_ghc_refuse_la_SOURCES = tests/plugins/fake.c
tests_plugins_ghc_refuse_la_CPPFLAGS = $(AM_CPPFLAGS) -DFAKE_NAME=refuse -DFAKE_INSTANCE_FAIL
tests_plugins_ghc_refuse_la_CFLAGS = $(TEST_PLUGIN_CFLAGS)
tests_plugins_ghc_refuse_la_LDFLAGS = $(TEST_PLUGIN_LDFLAGS)
tests_plugins_ghc_refuse_la_LIBADD = $(TEST_PLUGIN_LIBS)

# a memory policy whose members fail without a message: the core's wrappers give one
check_LTLIBRARIES += tests/plugins/ghc_silent.la
tests_plugins_ghc_silent_la_SOURCES = tests/plugins/fake.c
tests_plugins_ghc_silent_la_CPPFLAGS = $(AM_CPPFLAGS) -DFAKE_NAME=silent -DFAKE_SILENT \
	-DFAKE_KINDS='GHC_KIND_BIT(GHC_KIND_MEMPOLICY)'
tests_plugins_ghc_silent_la_CFLAGS = $(TEST_PLUGIN_CFLAGS)
tests_plugins_ghc_silent_la_LDFLAGS = $(TEST_PLUGIN_LDFLAGS)
tests_plugins_ghc_silent_la_LIBADD = $(TEST_PLUGIN_LIBS)

check_LTLIBRARIES += tests/badplugins/ghc_badabi.la
tests_badplugins_ghc_badabi_la_SOURCES = tests/plugins/fake.c
tests_badplugins_ghc_badabi_la_CPPFLAGS = $(AM_CPPFLAGS) -DFAKE_NAME=badabi -DFAKE_ABI=99
tests_badplugins_ghc_badabi_la_CFLAGS = $(TEST_PLUGIN_CFLAGS)
tests_badplugins_ghc_badabi_la_LDFLAGS = $(TEST_PLUGIN_LDFLAGS)
tests_badplugins_ghc_badabi_la_LIBADD = $(TEST_PLUGIN_LIBS)

check_LTLIBRARIES += tests/badplugins/ghc_newapi.la
tests_badplugins_ghc_newapi_la_SOURCES = tests/plugins/fake.c
tests_badplugins_ghc_newapi_la_CPPFLAGS = $(AM_CPPFLAGS) -DFAKE_NAME=newapi -DFAKE_API=999
tests_badplugins_ghc_newapi_la_CFLAGS = $(TEST_PLUGIN_CFLAGS)
tests_badplugins_ghc_newapi_la_LDFLAGS = $(TEST_PLUGIN_LDFLAGS)
tests_badplugins_ghc_newapi_la_LIBADD = $(TEST_PLUGIN_LIBS)

check_LTLIBRARIES += tests/badplugins/ghc_nosym.la
tests_badplugins_ghc_nosym_la_SOURCES = tests/plugins/fake.c
tests_badplugins_ghc_nosym_la_CPPFLAGS = $(AM_CPPFLAGS) -DFAKE_NAME=nosym -DFAKE_SYMBOL=ghc_plugin_other
tests_badplugins_ghc_nosym_la_CFLAGS = $(TEST_PLUGIN_CFLAGS)
tests_badplugins_ghc_nosym_la_LDFLAGS = $(TEST_PLUGIN_LDFLAGS)
tests_badplugins_ghc_nosym_la_LIBADD = $(TEST_PLUGIN_LIBS)

check_LTLIBRARIES += tests/badplugins/ghc_tinysym.la
tests_badplugins_ghc_tinysym_la_SOURCES = tests/plugins/fake.c
tests_badplugins_ghc_tinysym_la_CPPFLAGS = $(AM_CPPFLAGS) -DFAKE_NAME=tinysym -DFAKE_TINY_SYMBOL \
	-DFAKE_SYMBOL=ghc_plugin_tinysym_desc
tests_badplugins_ghc_tinysym_la_CFLAGS = $(TEST_PLUGIN_CFLAGS)
tests_badplugins_ghc_tinysym_la_LDFLAGS = $(TEST_PLUGIN_LDFLAGS)
tests_badplugins_ghc_tinysym_la_LIBADD = $(TEST_PLUGIN_LIBS)

check_LTLIBRARIES += tests/badplugins/ghc_badname.la
tests_badplugins_ghc_badname_la_SOURCES = tests/plugins/fake.c
tests_badplugins_ghc_badname_la_CPPFLAGS = $(AM_CPPFLAGS) -DFAKE_NAME=badname -DFAKE_DESC_NAME='"other"'
tests_badplugins_ghc_badname_la_CFLAGS = $(TEST_PLUGIN_CFLAGS)
tests_badplugins_ghc_badname_la_LDFLAGS = $(TEST_PLUGIN_LDFLAGS)
tests_badplugins_ghc_badname_la_LIBADD = $(TEST_PLUGIN_LIBS)

check_LTLIBRARIES += tests/badplugins/ghc_dup.la
tests_badplugins_ghc_dup_la_SOURCES = tests/plugins/fake.c
tests_badplugins_ghc_dup_la_CPPFLAGS = $(AM_CPPFLAGS) -DFAKE_NAME=dup -DFAKE_OPS_NAME='"good"'
tests_badplugins_ghc_dup_la_CFLAGS = $(TEST_PLUGIN_CFLAGS)
tests_badplugins_ghc_dup_la_LDFLAGS = $(TEST_PLUGIN_LDFLAGS)
tests_badplugins_ghc_dup_la_LIBADD = $(TEST_PLUGIN_LIBS)

check_LTLIBRARIES += tests/badplugins/ghc_noreq.la
tests_badplugins_ghc_noreq_la_SOURCES = tests/plugins/fake.c
tests_badplugins_ghc_noreq_la_CPPFLAGS = $(AM_CPPFLAGS) -DFAKE_NAME=noreq -DFAKE_NO_REQUIRED
tests_badplugins_ghc_noreq_la_CFLAGS = $(TEST_PLUGIN_CFLAGS)
tests_badplugins_ghc_noreq_la_LDFLAGS = $(TEST_PLUGIN_LDFLAGS)
tests_badplugins_ghc_noreq_la_LIBADD = $(TEST_PLUGIN_LIBS)

check_LTLIBRARIES += tests/badplugins/ghc_bigops.la
tests_badplugins_ghc_bigops_la_SOURCES = tests/plugins/fake.c
tests_badplugins_ghc_bigops_la_CPPFLAGS = $(AM_CPPFLAGS) -DFAKE_NAME=bigops -DFAKE_BIG_OPS
tests_badplugins_ghc_bigops_la_CFLAGS = $(TEST_PLUGIN_CFLAGS)
tests_badplugins_ghc_bigops_la_LDFLAGS = $(TEST_PLUGIN_LDFLAGS)
tests_badplugins_ghc_bigops_la_LIBADD = $(TEST_PLUGIN_LIBS)

check_LTLIBRARIES += tests/badplugins/ghc_undeclared.la
tests_badplugins_ghc_undeclared_la_SOURCES = tests/plugins/fake.c
tests_badplugins_ghc_undeclared_la_CPPFLAGS = $(AM_CPPFLAGS) -DFAKE_NAME=undeclared -DFAKE_REGISTER_OPTIMIZER
tests_badplugins_ghc_undeclared_la_CFLAGS = $(TEST_PLUGIN_CFLAGS)
tests_badplugins_ghc_undeclared_la_LDFLAGS = $(TEST_PLUGIN_LDFLAGS)
tests_badplugins_ghc_undeclared_la_LIBADD = $(TEST_PLUGIN_LIBS)

check_LTLIBRARIES += tests/badplugins/ghc_noregister.la
tests_badplugins_ghc_noregister_la_SOURCES = tests/plugins/fake.c
tests_badplugins_ghc_noregister_la_CPPFLAGS = $(AM_CPPFLAGS) -DFAKE_NAME=noregister \
	-DFAKE_KINDS='(GHC_KIND_BIT(GHC_KIND_SCHEDULER) | GHC_KIND_BIT(GHC_KIND_OPTIMIZER))'
tests_badplugins_ghc_noregister_la_CFLAGS = $(TEST_PLUGIN_CFLAGS)
tests_badplugins_ghc_noregister_la_LDFLAGS = $(TEST_PLUGIN_LDFLAGS)
tests_badplugins_ghc_noregister_la_LIBADD = $(TEST_PLUGIN_LIBS)

check_LTLIBRARIES += tests/badplugins/ghc_initfail.la
tests_badplugins_ghc_initfail_la_SOURCES = tests/plugins/fake.c
tests_badplugins_ghc_initfail_la_CPPFLAGS = $(AM_CPPFLAGS) -DFAKE_NAME=initfail -DFAKE_INIT_FAIL
tests_badplugins_ghc_initfail_la_CFLAGS = $(TEST_PLUGIN_CFLAGS)
tests_badplugins_ghc_initfail_la_LDFLAGS = $(TEST_PLUGIN_LDFLAGS)
tests_badplugins_ghc_initfail_la_LIBADD = $(TEST_PLUGIN_LIBS)

# Left with an undefined symbol on purpose (no -no-undefined): dlopen(RTLD_NOW) must fail.
check_LTLIBRARIES += tests/badplugins/ghc_undef.la
tests_badplugins_ghc_undef_la_SOURCES = tests/plugins/fake.c
tests_badplugins_ghc_undef_la_CPPFLAGS = $(AM_CPPFLAGS) -DFAKE_NAME=undef -DFAKE_UNDEFINED
tests_badplugins_ghc_undef_la_CFLAGS = $(TEST_PLUGIN_CFLAGS)
tests_badplugins_ghc_undef_la_LDFLAGS = -module -avoid-version -rpath /nowhere
tests_badplugins_ghc_undef_la_LIBADD = $(TEST_PLUGIN_LIBS)

TEST_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
TEST_LIBS = libgh200core.la $(CHECK_LIBS)

check_PROGRAMS += tests/test_loader tests/test_config tests/test_cli
tests_test_loader_SOURCES = tests/test_loader.c tests/testutil.h
tests_test_loader_CFLAGS = $(TEST_CFLAGS)
tests_test_loader_LDADD = $(TEST_LIBS)
tests_test_config_SOURCES = tests/test_config.c tests/testutil.h
tests_test_config_CFLAGS = $(TEST_CFLAGS)
tests_test_config_LDADD = $(TEST_LIBS)
tests_test_cli_SOURCES = tests/test_cli.c tests/testutil.h
tests_test_cli_CFLAGS = $(TEST_CFLAGS)
tests_test_cli_LDADD = $(TEST_LIBS)
TESTS += tests/test_loader tests/test_config tests/test_cli

# several ranks (issue 25): links the CLI's core/dist.c; forks ranks that meet on loopback
check_PROGRAMS += tests/test_dist
tests_test_dist_SOURCES = tests/test_dist.c tests/testutil.h core/dist.c core/dist.h core/dist_shard.c core/dist_shard.h
tests_test_dist_CFLAGS = $(TEST_CFLAGS)
tests_test_dist_LDADD = $(TEST_LIBS) $(PTHREAD_LIBS) -lm
TESTS += tests/test_dist

# tensors, safetensors and the CPU ops
check_PROGRAMS += tests/test_tensor tests/test_safetensors tests/test_ops_cpu
tests_test_tensor_SOURCES = tests/test_tensor.c tests/testutil.h
tests_test_tensor_CFLAGS = $(TEST_CFLAGS)
tests_test_tensor_LDADD = $(TEST_LIBS)
tests_test_safetensors_SOURCES = tests/test_safetensors.c tests/testutil.h
tests_test_safetensors_CFLAGS = $(TEST_CFLAGS)
tests_test_safetensors_LDADD = $(TEST_LIBS)
tests_test_ops_cpu_SOURCES = tests/test_ops_cpu.c tests/testutil.h
tests_test_ops_cpu_CFLAGS = $(TEST_CFLAGS)
tests_test_ops_cpu_LDADD = libgh200core_ops.la $(TEST_LIBS)
TESTS += tests/test_tensor tests/test_safetensors tests/test_ops_cpu

# GPU suites: exit 77 without a device
if HAVE_CUDA
check_PROGRAMS += tests/test_ops_cuda tests/test_gemm_attn_cuda
tests_test_ops_cuda_SOURCES = tests/test_ops_cuda.c tests/testutil.h tests/cuda_testutil.h
tests_test_ops_cuda_CFLAGS = $(TEST_CFLAGS)
tests_test_ops_cuda_LDADD = libgh200core_ops.la $(TEST_LIBS)
tests_test_gemm_attn_cuda_SOURCES = tests/test_gemm_attn_cuda.c tests/testutil.h
tests_test_gemm_attn_cuda_CFLAGS = $(TEST_CFLAGS)
tests_test_gemm_attn_cuda_LDADD = libgh200core_ops.la $(TEST_LIBS)
TESTS += tests/test_ops_cuda tests/test_gemm_attn_cuda
endif
EXTRA_DIST += tests/test_ops_cuda.c tests/test_gemm_attn_cuda.c tests/gpu-suite.sh tests/cuda_testutil.h

if HAVE_CUDA
check_PROGRAMS += tests/test_cuda_device
tests_test_cuda_device_SOURCES = tests/test_cuda_device.c
tests_test_cuda_device_CFLAGS = $(TEST_CFLAGS) $(CUDA_CFLAGS)
tests_test_cuda_device_LDADD = kernels/libghc_cuda.la libgh200core.la $(CUDA_LIBS) $(CHECK_LIBS)
TESTS += tests/test_cuda_device
endif
EXTRA_DIST += tests/test_cuda_device.c

TESTS += tests/example-plugin.sh
EXTRA_DIST += tests/example-plugin.sh tests/data
TESTS += tests/example-model.sh
EXTRA_DIST += tests/example-model.sh tests/example-lib.sh

AM_TESTS_ENVIRONMENT = \
	GHC_TEST_PLUGINS='$(abs_top_builddir)/tests/plugins/.libs'; export GHC_TEST_PLUGINS; \
	GHC_TEST_BADPLUGINS='$(abs_top_builddir)/tests/badplugins/.libs'; export GHC_TEST_BADPLUGINS; \
	GHC_BUILD_PLUGINS='$(abs_top_builddir)/plugins/.libs'; export GHC_BUILD_PLUGINS; \
	GHC_TEST_DATA='$(abs_top_srcdir)/tests/data'; export GHC_TEST_DATA; \
	GHC_CLI='$(abs_top_builddir)/gh200core'; export GHC_CLI; \
	GHC_TOP_BUILDDIR='$(abs_top_builddir)'; export GHC_TOP_BUILDDIR; \
	GHC_TOP_SRCDIR='$(abs_top_srcdir)'; export GHC_TOP_SRCDIR; \
	MAKE='$(MAKE)'; export MAKE; \
	GHC_PLUGIN_PATH=; export GHC_PLUGIN_PATH; \
	chmod go-w '$(abs_top_builddir)/plugins/.libs' '$(abs_top_builddir)/tests/plugins/.libs' \
	  '$(abs_top_builddir)/tests/badplugins/.libs' '$(abs_top_builddir)'/plugins/.libs/*.so \
	  '$(abs_top_builddir)'/tests/plugins/.libs/*.so '$(abs_top_builddir)'/tests/badplugins/.libs/*.so \
	  2>/dev/null || :;

# ---- safetensors (fixtures, corpus, fuzz) ----
# test_safetensors also checks `inspect`'s output: it links the CLI's core/inspect.c, which
# uses only the public API. Fixtures are made by the committed Python scripts
# (tests/fixtures/README.md); the broken corpus lives in tests/data/broken (in EXTRA_DIST
# with tests/data). The libFuzzer targets are built by `make fuzz` (tests/fuzz/local.mk).
tests_test_safetensors_SOURCES += core/inspect.c core/cli.h
EXTRA_DIST += tests/fixtures/README.md tests/fixtures/make_safetensors_fixtures.py \
	tests/fixtures/make_broken_corpus.py tests/fixtures/all_dtypes.safetensors \
	tests/fixtures/writer_ref.safetensors \
	tests/fixtures/sharded/model.safetensors.index.json \
	tests/fixtures/sharded/model-00001-of-00002.safetensors \
	tests/fixtures/sharded/model-00002-of-00002.safetensors \
	tests/fuzz/fuzz_safetensors.c tests/fuzz/safetensors.dict tests/fuzz/README.md

# ---- wan22 fixtures ----
# Golden fixtures for the Wan2.2 transformer, written by diffusers + peft through the committed
# script (tests/fixtures/README.md, section "wan22"); the C tests read them, Python is not needed.
EXTRA_DIST += tests/fixtures/make_wan22_fixtures.py \
	tests/fixtures/wan22/weights_diffusers.safetensors \
	tests/fixtures/wan22/weights_official.safetensors \
	tests/fixtures/wan22/case.safetensors

# ---- wan22 model plugin ----
# The suite loads plugins/.libs/ghc_wan22.so through a run and also links the plugin's
# convenience library (plugins/wan22/local.mk) to reach config detection and intermediates;
# its GPU case runs only with a CUDA device.
check_PROGRAMS += tests/test_wan22
tests_test_wan22_SOURCES = tests/test_wan22.c tests/testutil.h
tests_test_wan22_CFLAGS = $(TEST_CFLAGS)
tests_test_wan22_LDADD = plugins/wan22/libwan22_impl.la libgh200core_ops.la $(TEST_LIBS) -lm
TESTS += tests/test_wan22
# ---- end wan22 ----

# ---- wan22 A14B block check on the GPU ----
# Not a test: one bf16 forward + backward of a wan22 checkpoint on GPU 0, driven by
# tests/fixtures/wan22_a14b_block_check.py on the GPU machine (doc/wan22.md). Built by
# `make tests/wan22_gpu_check` (and by `make check`, which does not run it). A check program and
# not an EXTRA_PROGRAMS one: bench/local.mk (included later) sets EXTRA_PROGRAMS with '=' under
# HAVE_CUDA, so a '+=' here is an automake error, and its `bench` target builds all of them.
check_PROGRAMS += tests/wan22_gpu_check
tests_wan22_gpu_check_SOURCES = tests/wan22_gpu_check.c
tests_wan22_gpu_check_LDADD = libgh200core_ops.la libgh200core.la -lm
EXTRA_DIST += tests/fixtures/wan22_a14b_block_check.py
# ---- end wan22 A14B block check ----
