# plugins/device: the `device` memory policy (plain cudaMalloc for every role); CUDA builds only.
EXTRA_DIST += plugins/device/device.c plugins/device/devpool.c plugins/device/devpool.h
if HAVE_CUDA
plugins_LTLIBRARIES += plugins/ghc_device.la
plugins_ghc_device_la_SOURCES = plugins/device/device.c plugins/device/devpool.c plugins/device/devpool.h
plugins_ghc_device_la_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CFLAGS)
plugins_ghc_device_la_CFLAGS = $(PLUGIN_CFLAGS)
plugins_ghc_device_la_LDFLAGS = $(PLUGIN_LDFLAGS)
plugins_ghc_device_la_LIBADD = libgh200core.la $(CUDA_LIBS) $(PTHREAD_LIBS)
endif
