# plugins/local: the `local` backend (dataset directories read in place; the ops live in
# core/backend.c, which the dataset also uses when no backend is configured).
plugins_LTLIBRARIES += plugins/ghc_local.la
plugins_ghc_local_la_SOURCES = plugins/local/local.c
plugins_ghc_local_la_CFLAGS = $(PLUGIN_CFLAGS)
plugins_ghc_local_la_LDFLAGS = $(PLUGIN_LDFLAGS)
plugins_ghc_local_la_LIBADD = libgh200core.la
