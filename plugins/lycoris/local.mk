# plugins/lycoris: the `lycoris` network (LoRA, LoHa, LoKr adapters; ComfyUI, musubi and
# diffusers files). Computes through libgh200core_ops, so one build serves CPU and GPU.
# liblycoris_impl.la, a convenience library of the plugin's sources, makes the plugin;
# tests/test_lycoris and test_lycoris_cuda link it too (factorization, key names).
noinst_LTLIBRARIES += plugins/lycoris/liblycoris_impl.la
plugins_lycoris_liblycoris_impl_la_SOURCES = plugins/lycoris/lycoris.c plugins/lycoris/algo.c \
	plugins/lycoris/algo_lora.c plugins/lycoris/algo_loha.c plugins/lycoris/algo_lokr.c plugins/lycoris/algo_dora.c \
	plugins/lycoris/file.c plugins/lycoris/merge.c plugins/lycoris/estimate.c plugins/lycoris/lycoris_impl.h
plugins_lycoris_liblycoris_impl_la_CFLAGS = $(PLUGIN_CFLAGS)
plugins_LTLIBRARIES += plugins/ghc_lycoris.la
plugins_ghc_lycoris_la_SOURCES =
plugins_ghc_lycoris_la_CFLAGS = $(PLUGIN_CFLAGS)
plugins_ghc_lycoris_la_LDFLAGS = $(PLUGIN_LDFLAGS)
plugins_ghc_lycoris_la_LIBADD = plugins/lycoris/liblycoris_impl.la libgh200core_ops.la libgh200core.la -lm
EXTRA_DIST += doc/lycoris.md
