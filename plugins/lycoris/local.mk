# plugins/lycoris: the `lycoris` network (LoRA, LoHa, LoKr adapters; ComfyUI, musubi and
# diffusers files). Computes through libgh200core_ops, so one build serves CPU and GPU.
plugins_LTLIBRARIES += plugins/ghc_lycoris.la
plugins_ghc_lycoris_la_SOURCES = plugins/lycoris/lycoris.c plugins/lycoris/algo.c plugins/lycoris/algo_lora.c \
	plugins/lycoris/algo_loha.c plugins/lycoris/algo_lokr.c plugins/lycoris/algo_dora.c plugins/lycoris/file.c \
	plugins/lycoris/merge.c plugins/lycoris/estimate.c plugins/lycoris/lycoris_impl.h
plugins_ghc_lycoris_la_CFLAGS = $(PLUGIN_CFLAGS)
plugins_ghc_lycoris_la_LDFLAGS = $(PLUGIN_LDFLAGS)
plugins_ghc_lycoris_la_LIBADD = libgh200core_ops.la libgh200core.la -lm
EXTRA_DIST += doc/lycoris.md
