# core/train.mk: included after kernels/local.mk (libgh200core_train links libgh200core_ops).
# libgh200core_train: the trainer (core/train.c the loop; train_check.c, checkpoint.c, outdir.c
# and progress.c), the sigma samplers, TensorBoard files, the embedded demo's data and the
# dataset (dataset.h: core/dataset.c and data_*.c; batches go to a device by ghc_op_copy).
# Apart from libgh200core because it computes (links libgh200core_ops). Uses the public API
# of libgh200core only (never core_impl.h).
lib_LTLIBRARIES += libgh200core_train.la
libgh200core_train_la_SOURCES = core/train.c core/train_check.c core/checkpoint.c core/outdir.c core/progress.c \
	core/train_impl.h core/sampler.c core/tboard.c core/demo.c core/dist_shard.c core/dist_shard.h core/prepare.c
libgh200core_train_la_SOURCES += core/dataset.c core/dataset_impl.h core/data_formats.c core/data_aitk.c \
	core/data_order.c core/data_batch.c core/data_aug.c
# raw media for `prepare` (media.h): folder scan, captions, buckets, clips (media.c), musubi-tuner's
# resize filters (media_resize.c), the FFmpeg decoder (media_ffmpeg.c) and writer (media_write.c: the
# demo's media and the tests'); both GHC_EUNSUPPORTED when configured --without-ffmpeg
libgh200core_train_la_SOURCES += core/media.c core/media_resize.c core/media_ffmpeg.c core/media_write.c core/media_impl.h
libgh200core_train_la_CFLAGS = $(AM_CFLAGS) -fvisibility=hidden $(LIBCONFIG_CFLAGS) $(JANSSON_CFLAGS) $(FFMPEG_CFLAGS)
libgh200core_train_la_LDFLAGS = -version-info 0:0:0 -no-undefined $(AM_LDFLAGS)
libgh200core_train_la_LIBADD = libgh200core_ops.la libgh200core.la $(LIBCONFIG_LIBS) $(JANSSON_LIBS) $(FFMPEG_LIBS) $(PTHREAD_LIBS) -lm

