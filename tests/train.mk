# tests/train.mk: the trainer (issue 9): samplers, TensorBoard files, schedules, whole runs.
# The suite compiles the trainer's internal pieces in (they are hidden in the library).
check_PROGRAMS += tests/test_train
tests_test_train_SOURCES = tests/test_train.c tests/testutil.h core/sampler.c core/tboard.c core/train_impl.h
tests_test_train_CFLAGS = $(TEST_CFLAGS)
tests_test_train_LDADD = libgh200core_ops.la $(TEST_LIBS) -lm
TESTS += tests/test_train

# doc/config.md and etc/*.cfg against the keys the code declares
check_PROGRAMS += tests/test_docs
tests_test_docs_SOURCES = tests/test_docs.c tests/testutil.h
tests_test_docs_CFLAGS = $(TEST_CFLAGS) $(LIBCONFIG_CFLAGS)
tests_test_docs_LDADD = $(TEST_LIBS) $(LIBCONFIG_LIBS)
TESTS += tests/test_docs
