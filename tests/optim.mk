# tests/optim.mk: the adamw and automagic optimizers. Golden trajectories come from
# tests/fixtures/make_optim_fixtures.py (torch 2.9.1, ai-toolkit's Automagic); the C suites read
# tests/fixtures/optim/trajectories.safetensors. The GPU suite exits 77 without a device.
check_PROGRAMS += tests/test_optim
tests_test_optim_SOURCES = tests/test_optim.c tests/optim_cases.h tests/testutil.h
tests_test_optim_CFLAGS = $(TEST_CFLAGS)
tests_test_optim_LDADD = libgh200core_ops.la $(TEST_LIBS) -lm
TESTS += tests/test_optim
if HAVE_CUDA
check_PROGRAMS += tests/test_optim_cuda
tests_test_optim_cuda_SOURCES = tests/test_optim_cuda.c tests/optim_cases.h tests/testutil.h
tests_test_optim_cuda_CFLAGS = $(TEST_CFLAGS)
tests_test_optim_cuda_LDADD = libgh200core_ops.la $(TEST_LIBS) -lm
TESTS += tests/test_optim_cuda
endif
EXTRA_DIST += tests/test_optim_cuda.c tests/fixtures/make_optim_fixtures.py \
	tests/fixtures/optim/trajectories.safetensors
