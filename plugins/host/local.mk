# plugins/host: the `host` memory policy (CPU memory for every role; the saved-activation ring of
# plugins/offload with memcpy, for the CPU test of its logic).
plugins_LTLIBRARIES += plugins/ghc_host.la
plugins_ghc_host_la_SOURCES = plugins/host/host.c
plugins_ghc_host_la_CFLAGS = $(PLUGIN_CFLAGS)
plugins_ghc_host_la_LDFLAGS = $(PLUGIN_LDFLAGS)
plugins_ghc_host_la_LIBADD = plugins/offload/libsaved.la libgh200core.la $(PTHREAD_LIBS)
