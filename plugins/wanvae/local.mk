# plugins/wanvae: the Wan2.1 and Wan2.2 video VAEs (encode clips to normalised latents, decode
# latents to clips; doc/vae.md), a module with its own header (wanvae.h). Computes through
# libgh200core_ops. A convenience library that the `wanvae` vae plugin (below) and
# tests/test_wanvae link.
noinst_LTLIBRARIES += plugins/wanvae/libwanvae.la
plugins_wanvae_libwanvae_la_SOURCES = plugins/wanvae/wanvae.h plugins/wanvae/wanvae_impl.h \
	plugins/wanvae/wanvae.c plugins/wanvae/load.c
plugins_wanvae_libwanvae_la_CFLAGS = $(PLUGIN_CFLAGS)
EXTRA_DIST += doc/vae.md
# the `wanvae` vae plugin (encoder.h)
plugins_LTLIBRARIES += plugins/ghc_wanvae.la
plugins_ghc_wanvae_la_SOURCES = plugins/wanvae/plugin.c
plugins_ghc_wanvae_la_CFLAGS = $(PLUGIN_CFLAGS)
plugins_ghc_wanvae_la_LDFLAGS = $(PLUGIN_LDFLAGS)
plugins_ghc_wanvae_la_LIBADD = plugins/wanvae/libwanvae.la libgh200core_ops.la libgh200core.la -lm
