# tests/data.mk: the dataset, backends and caches. Fixtures: tests/fixtures/data,
# made by tests/fixtures/make_data_fixtures.py and, for data/peers, make_peer_cache_fixtures.py
# (tests/fixtures/README.md, sections "data" and "data/peers").
check_PROGRAMS += tests/test_data
tests_test_data_SOURCES = tests/test_data.c tests/testutil.h
tests_test_data_CFLAGS = $(TEST_CFLAGS)
tests_test_data_LDADD = plugins/in_memory/libin_memory_impl.la libgh200core_train.la libgh200core_ops.la $(TEST_LIBS) \
	$(LZ4_LIBS) $(ZLIB_LIBS) $(SNAPPY_LIBS) -lm
TESTS += tests/test_data
EXTRA_DIST += tests/fixtures/make_data_fixtures.py tests/fixtures/make_peer_cache_fixtures.py tests/fixtures/data
# GPU suite: batches on a CUDA device through the unified_memory cache; exits 77 without a GPU
if HAVE_CUDA
check_PROGRAMS += tests/test_data_cuda
tests_test_data_cuda_SOURCES = tests/test_data_cuda.c tests/testutil.h
tests_test_data_cuda_CFLAGS = $(TEST_CFLAGS)
tests_test_data_cuda_LDADD = libgh200core_train.la libgh200core_ops.la $(TEST_LIBS)
TESTS += tests/test_data_cuda
endif
EXTRA_DIST += tests/test_data_cuda.c
dist_doc_DATA += doc/dataset.md
# the in_memory backend on hostile .ghz files (sizes checked without overflow)
check_PROGRAMS += tests/test_in_memory
tests_test_in_memory_SOURCES = tests/test_in_memory.c tests/testutil.h
tests_test_in_memory_CFLAGS = $(TEST_CFLAGS)
tests_test_in_memory_LDADD = plugins/in_memory/libin_memory_impl.la libgh200core_train.la libgh200core_ops.la $(TEST_LIBS) \
	$(LZ4_LIBS) $(ZLIB_LIBS) $(SNAPPY_LIBS) -lm
TESTS += tests/test_in_memory
