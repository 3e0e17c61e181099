# core: libgh200core (loader, registry, config, log, errors, tensors, safetensors) and the CLI.
# -version-info C:R:A. Update before a release: code changed, interfaces not -> R+1;
# interfaces added -> C+1, R=0, A+1; interfaces removed or changed -> C+1, R=0, A=0.
lib_LTLIBRARIES += libgh200core.la
libgh200core_la_SOURCES = core/core.c core/cfg.c core/loader.c core/run.c core/core_impl.h \
	core/tensor.c core/safetensors.c core/safetensors_write.c core/elem.h core/model.c core/schedule.c
# data: backend and cache wrappers, the `local` backend (the dataset is in libgh200core_train,
# core/train.mk)
libgh200core_la_SOURCES += core/backend.c core/cache.c

# optimizer wrappers
libgh200core_la_SOURCES += core/optimizer.c

# network wrappers
libgh200core_la_SOURCES += core/network.c
libgh200core_la_CFLAGS = $(AM_CFLAGS) -fvisibility=hidden $(LIBCONFIG_CFLAGS) $(JANSSON_CFLAGS)
libgh200core_la_LDFLAGS = -version-info 0:0:0 -no-undefined $(AM_LDFLAGS)
libgh200core_la_LIBADD = $(LIBCONFIG_LIBS) $(JANSSON_LIBS) -lm

gh200coreincludedir = $(includedir)/gh200core
gh200coreinclude_HEADERS = \
	include/gh200core/gh200core.h include/gh200core/core.h include/gh200core/plugin.h \
	include/gh200core/run.h include/gh200core/mempolicy.h include/gh200core/backend.h \
	include/gh200core/cache.h include/gh200core/model.h include/gh200core/network.h \
	include/gh200core/optimizer.h include/gh200core/scheduler.h include/gh200core/encoder.h \
	include/gh200core/tensor.h include/gh200core/safetensors.h include/gh200core/ops.h \
	include/gh200core/linear.h
gh200coreinclude_HEADERS += include/gh200core/dataset.h include/gh200core/train.h include/gh200core/media.h
nodist_gh200coreinclude_HEADERS = include/gh200core/version.h

pkgconfigdir = $(libdir)/pkgconfig
pkgconfig_DATA = gh200core.pc

# the CLI
bin_PROGRAMS += gh200core
gh200core_SOURCES = core/main.c core/inspect.c core/cli.h core/diag.c core/estimate.c
gh200core_LDADD = libgh200core_train.la libgh200core_ops.la libgh200core.la
# merge: through the network and model plugins' merge members (no plugin source in the CLI)
gh200core_SOURCES += core/merge.c
# several ranks: the launcher's environment, the rendezvous, --nproc (issue 25)
gh200core_SOURCES += core/dist.c core/dist.h core/dist_shard.h core/launch.c
gh200core_CFLAGS = $(AM_CFLAGS) $(NCCL_CFLAGS)
if HAVE_NCCL
gh200core_SOURCES += core/dist_nccl.c
gh200core_LDADD += $(NCCL_LIBS) $(CUDA_LIBS)
endif
gh200core_LDADD += $(PTHREAD_LIBS) -lm

