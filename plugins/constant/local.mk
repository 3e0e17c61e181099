# plugins/constant: the `constant` scheduler (fixed micro-batches, warmup then constant lr).
plugins_LTLIBRARIES += plugins/ghc_constant.la
plugins_ghc_constant_la_SOURCES = plugins/constant/constant.c
plugins_ghc_constant_la_CFLAGS = $(PLUGIN_CFLAGS)
plugins_ghc_constant_la_LDFLAGS = -module -avoid-version -no-undefined -export-symbols-regex '^ghc_plugin_'
plugins_ghc_constant_la_LIBADD = libgh200core.la
