# tests/train.mk: the trainer (issue 9): samplers, TensorBoard files, schedules, whole runs.
# The suite compiles the trainer's internal pieces in (they are hidden in the library).
check_PROGRAMS += tests/test_train
tests_test_train_SOURCES = tests/test_train.c tests/testutil.h core/sampler.c core/tboard.c core/train_impl.h
tests_test_train_CFLAGS = $(TEST_CFLAGS)
tests_test_train_LDADD = libgh200core_ops.la $(TEST_LIBS) -lm
TESTS += tests/test_train
