# plugins/wan22: the `wan22` model (Wan2.2 DiT: checkpoints, config detection, forward,
# backward, adapter hooks). Computes through libgh200core_ops, so one build serves CPU and GPU.
# libwan22_impl.la, a convenience library of the plugin's sources, makes the plugin;
# tests/test_wan22 links it too (config detection and intermediates).
noinst_LTLIBRARIES += plugins/wan22/libwan22_impl.la
plugins_wan22_libwan22_impl_la_SOURCES = plugins/wan22/wan22.c plugins/wan22/detect.c plugins/wan22/load.c \
	plugins/wan22/forward.c plugins/wan22/backward.c plugins/wan22/wan22_impl.h \
	plugins/wan22/stream.c plugins/wan22/estimate.c
plugins_wan22_libwan22_impl_la_CFLAGS = $(PLUGIN_CFLAGS)
plugins_LTLIBRARIES += plugins/ghc_wan22.la
plugins_ghc_wan22_la_SOURCES =
plugins_ghc_wan22_la_CFLAGS = $(PLUGIN_CFLAGS)
plugins_ghc_wan22_la_LDFLAGS = $(PLUGIN_LDFLAGS)
plugins_ghc_wan22_la_LIBADD = plugins/wan22/libwan22_impl.la libgh200core_ops.la libgh200core.la -lm
EXTRA_DIST += doc/wan22.md
