# plugins/automagic: the `automagic` optimizer (ai-toolkit's Automagic v1, stage lr bounds).
plugins_LTLIBRARIES += plugins/ghc_automagic.la
plugins_ghc_automagic_la_SOURCES = plugins/automagic/automagic.c plugins/adamw/optim_common.c plugins/adamw/optim_common.h
plugins_ghc_automagic_la_CFLAGS = $(PLUGIN_CFLAGS)
plugins_ghc_automagic_la_LDFLAGS = $(PLUGIN_LDFLAGS)
plugins_ghc_automagic_la_LIBADD = libgh200core_ops.la libgh200core.la -lm
