# plugins/offload: the `offload` memory policy (weights pinned on the host, streamed per block
# into a ring of device buffers on a copy stream); CUDA builds only. Shares the caching device
# pool of plugins/device.
EXTRA_DIST += plugins/offload/offload.c
if HAVE_CUDA
plugins_LTLIBRARIES += plugins/ghc_offload.la
plugins_ghc_offload_la_SOURCES = plugins/offload/offload.c plugins/device/devpool.c plugins/device/devpool.h
plugins_ghc_offload_la_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CFLAGS)
plugins_ghc_offload_la_CFLAGS = $(PLUGIN_CFLAGS)
plugins_ghc_offload_la_LDFLAGS = $(PLUGIN_LDFLAGS)
plugins_ghc_offload_la_LIBADD = libgh200core.la $(CUDA_LIBS) $(PTHREAD_LIBS)
endif
