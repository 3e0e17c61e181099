# plugins/disk: the `disk` cache (decode on demand, LRU of decoded tensors). tcache.c is the
# decoded-tensor table that plugins/unified_memory shares.
plugins_LTLIBRARIES += plugins/ghc_disk.la
plugins_ghc_disk_la_SOURCES = plugins/disk/disk.c plugins/disk/tcache.c plugins/disk/tcache.h
plugins_ghc_disk_la_CFLAGS = $(PLUGIN_CFLAGS)
plugins_ghc_disk_la_LDFLAGS = $(PLUGIN_LDFLAGS)
plugins_ghc_disk_la_LIBADD = libgh200core.la $(PTHREAD_LIBS)
