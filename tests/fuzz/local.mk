# tests/fuzz: libFuzzer targets for every parser of outside bytes, built by `make fuzz` only
# (never by all, check or distcheck: they need clang's libFuzzer, and a fuzzer run is not a
# test). tests/fuzz/build.sh compiles the libraries' sources with $(FUZZ_CFLAGS) and links
# each tests/fuzz/fuzz_NAME.c; tests/fuzz/README.md has the seeds and the runs.
FUZZ_CC = clang
FUZZ_CFLAGS = -g -O1 -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined \
	-fno-omit-frame-pointer
FUZZ_TARGETS = safetensors config sharded ghz trainer_state wan22 dataset adapter optimizer cache
fuzz:
	$(AM_V_GEN)FUZZ_CC='$(FUZZ_CC)' FUZZ_CFLAGS='$(FUZZ_CFLAGS)' \
	FUZZ_CPPFLAGS='$(DEFS) -I$(top_builddir) -I$(top_srcdir) -I$(top_srcdir)/include -I$(top_builddir)/include $(LIBCONFIG_CFLAGS) $(JANSSON_CFLAGS) $(LZ4_CFLAGS) $(ZLIB_CFLAGS) $(FFMPEG_CFLAGS)' \
	FUZZ_PLUGINSDIR='$(pluginsdir)' \
	FUZZ_LIBS='$(LIBCONFIG_LIBS) $(JANSSON_LIBS) $(LZ4_LIBS) $(ZLIB_LIBS) $(SNAPPY_LIBS) $(FFMPEG_LIBS) $(PTHREAD_LIBS) -ldl -lm' \
	FUZZ_SOURCES='$(libgh200core_la_SOURCES) $(libgh200core_ops_la_SOURCES) $(libgh200core_train_la_SOURCES)' \
	FUZZ_TARGETS='$(FUZZ_TARGETS)' srcdir='$(srcdir)' builddir='$(builddir)' \
	$(SHELL) $(srcdir)/tests/fuzz/build.sh && \
	$(SHELL) $(srcdir)/tests/fuzz/seeds.sh $(srcdir) tests/fuzz/corpus tests/fuzz
fuzz-clean:
	-rm -rf tests/fuzz/obj tests/fuzz/corpus tests/fuzz/plugins
	-for t in $(FUZZ_TARGETS); do rm -f tests/fuzz/fuzz_$$t; done
.PHONY: fuzz fuzz-clean
EXTRA_DIST += tests/fuzz/build.sh tests/fuzz/seeds.sh tests/fuzz/seeds/trainer.json tests/fuzz/fuzz.h tests/fuzz/fuzz_config.c tests/fuzz/fuzz_sharded.c \
	tests/fuzz/fuzz_ghz.c tests/fuzz/fuzz_trainer_state.c tests/fuzz/fuzz_wan22.c tests/fuzz/fuzz_dataset.c \
	tests/fuzz/fuzz_adapter.c tests/fuzz/fuzz_optimizer.c tests/fuzz/fuzz_cache.c tests/fuzz/lsan.supp
