# plugins/unified_memory: the `unified_memory` cache (decoded tensors held through the
# mempolicy with their roles, prefetched to the GPU ahead of use; plugins/disk/tcache.c).
plugins_LTLIBRARIES += plugins/ghc_unified_memory.la
plugins_ghc_unified_memory_la_SOURCES = plugins/unified_memory/unified_memory.c plugins/disk/tcache.c \
	plugins/disk/tcache.h
plugins_ghc_unified_memory_la_CFLAGS = $(PLUGIN_CFLAGS)
plugins_ghc_unified_memory_la_LDFLAGS = $(PLUGIN_LDFLAGS)
plugins_ghc_unified_memory_la_LIBADD = libgh200core.la $(PTHREAD_LIBS)
