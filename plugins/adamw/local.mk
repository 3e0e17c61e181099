# plugins/adamw: the `adamw` optimizer. optim_common.c (param table, group keys, state file) is
# compiled into both optimizer plugins (adamw and automagic); each exports only its descriptor.
plugins_LTLIBRARIES += plugins/ghc_adamw.la
plugins_ghc_adamw_la_SOURCES = plugins/adamw/adamw.c plugins/adamw/optim_common.c plugins/adamw/optim_common.h
plugins_ghc_adamw_la_CFLAGS = $(PLUGIN_CFLAGS)
plugins_ghc_adamw_la_LDFLAGS = $(PLUGIN_LDFLAGS)
plugins_ghc_adamw_la_LIBADD = libgh200core_ops.la libgh200core.la -lm
