# plugins/constant: the `constant` scheduler (fixed micro-batches, warmup then constant lr).
plugins_LTLIBRARIES += plugins/ghc_constant.la
plugins_ghc_constant_la_SOURCES = plugins/constant/constant.c
plugins_ghc_constant_la_CFLAGS = $(PLUGIN_CFLAGS)
plugins_ghc_constant_la_LDFLAGS = $(PLUGIN_LDFLAGS)
plugins_ghc_constant_la_LIBADD = libgh200core.la
