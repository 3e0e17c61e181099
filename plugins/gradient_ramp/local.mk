# plugins/gradient_ramp: the `gradient_ramp` scheduler (accumulation ramp, warmup/cosine lr).
plugins_LTLIBRARIES += plugins/ghc_gradient_ramp.la
plugins_ghc_gradient_ramp_la_SOURCES = plugins/gradient_ramp/gradient_ramp.c
plugins_ghc_gradient_ramp_la_CFLAGS = $(PLUGIN_CFLAGS)
plugins_ghc_gradient_ramp_la_LDFLAGS = $(PLUGIN_LDFLAGS)
plugins_ghc_gradient_ramp_la_LIBADD = libgh200core.la -lm
