# tests/train.mk: the trainer: samplers, TensorBoard files, schedules, whole runs.
# The suite compiles the trainer's internal pieces in (they are hidden in the library).
check_PROGRAMS += tests/test_train
tests_test_train_SOURCES = tests/test_train.c tests/testutil.h core/sampler.c core/tboard.c core/train_impl.h
tests_test_train_CFLAGS = $(TEST_CFLAGS)
tests_test_train_LDADD = libgh200core_train.la libgh200core_ops.la $(TEST_LIBS) -lm
TESTS += tests/test_train

# doc/config.md and etc/*.cfg against the keys the code declares
check_PROGRAMS += tests/test_docs
tests_test_docs_SOURCES = tests/test_docs.c tests/testutil.h
tests_test_docs_CFLAGS = $(TEST_CFLAGS) $(LIBCONFIG_CFLAGS)
tests_test_docs_LDADD = $(TEST_LIBS) $(LIBCONFIG_LIBS)
TESTS += tests/test_docs

# `gh200core diag` where the probe finds no GPU: a stand-in gh200_uvm plugin that reports as
# the CUDA runtime does on such a machine (tests/test_cli.c)
check_LTLIBRARIES += tests/diagplugins/ghc_gh200_uvm.la
tests_diagplugins_ghc_gh200_uvm_la_SOURCES = tests/plugins/fake_uvm.c
tests_diagplugins_ghc_gh200_uvm_la_CFLAGS = $(TEST_PLUGIN_CFLAGS)
tests_diagplugins_ghc_gh200_uvm_la_LDFLAGS = $(TEST_PLUGIN_LDFLAGS)
tests_diagplugins_ghc_gh200_uvm_la_LIBADD = $(TEST_PLUGIN_LIBS)
