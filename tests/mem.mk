# tests/mem.mk: the memory policies. test_mem (CPU) links the pure state machine of
# gh200_uvm (plugins/gh200_uvm/libgh200_uvm_sm.la) and the saved-activation ring
# (plugins/offload/libsaved.la), and loads the policies through runs; test_mem_cuda (GPU suite,
# exit 77 without a GPU) checks placement per role, the discrete cap and equal losses under
# device, gh200_uvm and offload on a tiny multi-block wan22 model.
check_PROGRAMS += tests/test_mem
tests_test_mem_SOURCES = tests/test_mem.c tests/testutil.h tests/mem_step.h core/estimate.c core/cli.h
tests_test_mem_CFLAGS = $(TEST_CFLAGS)
tests_test_mem_LDADD = plugins/gh200_uvm/libgh200_uvm_sm.la plugins/offload/libsaved.la libgh200core_train.la libgh200core_ops.la $(TEST_LIBS) -lm
TESTS += tests/test_mem

if HAVE_CUDA
check_PROGRAMS += tests/test_mem_cuda
tests_test_mem_cuda_SOURCES = tests/test_mem_cuda.c tests/testutil.h tests/mem_step.h core/estimate.c core/diag.c \
	core/cli.h
tests_test_mem_cuda_CFLAGS = $(TEST_CFLAGS) $(CUDA_CFLAGS)
tests_test_mem_cuda_LDADD = libgh200core_train.la libgh200core_ops.la $(TEST_LIBS) $(CUDA_LIBS) -lm
TESTS += tests/test_mem_cuda
endif
EXTRA_DIST += tests/test_mem_cuda.c
