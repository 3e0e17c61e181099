# plugins/gh200_uvm: the `gh200_uvm` memory policy (device pool + managed memory with placement
# per role, the two-stage state machine, CUPTI telemetry, the `diag` probe); CUDA builds only.
# The state machine, uvm_sm.c, is pure C: a convenience library built with or without CUDA,
# linked into the plugin and into tests/test_mem (the state machine on the CPU).
EXTRA_DIST += doc/memory.md
EXTRA_DIST += plugins/gh200_uvm/gh200_uvm.c plugins/gh200_uvm/uvm_impl.h plugins/gh200_uvm/telemetry.c \
	plugins/gh200_uvm/probe.c
noinst_LTLIBRARIES += plugins/gh200_uvm/libgh200_uvm_sm.la
plugins_gh200_uvm_libgh200_uvm_sm_la_SOURCES = plugins/gh200_uvm/uvm_sm.c plugins/gh200_uvm/uvm_sm.h
plugins_gh200_uvm_libgh200_uvm_sm_la_CFLAGS = $(PLUGIN_CFLAGS)
if HAVE_CUDA
plugins_LTLIBRARIES += plugins/ghc_gh200_uvm.la
plugins_ghc_gh200_uvm_la_SOURCES = plugins/gh200_uvm/gh200_uvm.c plugins/gh200_uvm/uvm_impl.h \
	plugins/gh200_uvm/telemetry.c plugins/gh200_uvm/probe.c plugins/offload/saved_cuda.c
plugins_ghc_gh200_uvm_la_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CFLAGS)
plugins_ghc_gh200_uvm_la_CFLAGS = $(PLUGIN_CFLAGS)
plugins_ghc_gh200_uvm_la_LDFLAGS = $(PLUGIN_LDFLAGS)
plugins_ghc_gh200_uvm_la_LIBADD = plugins/gh200_uvm/libgh200_uvm_sm.la plugins/offload/libsaved.la libgh200core.la $(CUDA_LIBS) -lcupti \
	$(PTHREAD_LIBS) -lm
endif
