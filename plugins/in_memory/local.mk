# plugins/in_memory: the `in_memory` backend (every dataset file staged into RAM by a thread
# pool, per-dataset lz4/zlib/snappy blocks; codec.c also reads .ghz files).
# libin_memory_impl.la, a convenience library of the plugin's sources, makes the plugin;
# tests/test_data links it too (ghz_encode writes .ghz files).
noinst_LTLIBRARIES += plugins/in_memory/libin_memory_impl.la
plugins_in_memory_libin_memory_impl_la_SOURCES = plugins/in_memory/in_memory.c plugins/in_memory/codec.c \
	plugins/in_memory/codec.h
plugins_in_memory_libin_memory_impl_la_CFLAGS = $(PLUGIN_CFLAGS) $(LZ4_CFLAGS) $(ZLIB_CFLAGS)
plugins_LTLIBRARIES += plugins/ghc_in_memory.la
plugins_ghc_in_memory_la_SOURCES =
plugins_ghc_in_memory_la_CFLAGS = $(PLUGIN_CFLAGS)
plugins_ghc_in_memory_la_LDFLAGS = $(PLUGIN_LDFLAGS)
plugins_ghc_in_memory_la_LIBADD = plugins/in_memory/libin_memory_impl.la libgh200core.la $(LZ4_LIBS) $(ZLIB_LIBS) \
	$(SNAPPY_LIBS) $(PTHREAD_LIBS)
