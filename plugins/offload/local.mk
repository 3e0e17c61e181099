# plugins/offload: the `offload` memory policy (weights pinned on the host, streamed per block
# into a ring of device buffers on a copy stream); CUDA builds only. Shares the caching device
# pool of plugins/device. saved.c (pure C, also in host) and saved_cuda.c: the ring that moves saved
# activations between pinned host memory and the device (also in gh200_uvm).
EXTRA_DIST += plugins/offload/offload.c plugins/offload/saved_cuda.c
# the ring's logic, pure C: a convenience library built with or without CUDA, linked into
# offload, gh200_uvm, host and tests/test_mem
noinst_LTLIBRARIES += plugins/offload/libsaved.la
plugins_offload_libsaved_la_SOURCES = plugins/offload/saved.c plugins/offload/saved.h
plugins_offload_libsaved_la_CFLAGS = $(PLUGIN_CFLAGS)
if HAVE_CUDA
plugins_LTLIBRARIES += plugins/ghc_offload.la
plugins_ghc_offload_la_SOURCES = plugins/offload/offload.c plugins/offload/saved_cuda.c plugins/device/devpool.c \
	plugins/device/devpool.h
plugins_ghc_offload_la_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CFLAGS)
plugins_ghc_offload_la_CFLAGS = $(PLUGIN_CFLAGS)
plugins_ghc_offload_la_LDFLAGS = $(PLUGIN_LDFLAGS)
plugins_ghc_offload_la_LIBADD = plugins/offload/libsaved.la libgh200core.la $(CUDA_LIBS) $(PTHREAD_LIBS)
endif
