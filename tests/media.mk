# tests/media.mk: raw media (media.h): scan, captions, buckets, clips, settings, the VAE's input
# against Pillow's and OpenCV's resize (tests/fixtures/make_media_fixtures.py) and, with FFmpeg, decoding
# of media that the test writes itself (media.h's writer, tests/media_write.h).
check_PROGRAMS += tests/test_media
tests_test_media_SOURCES = tests/test_media.c tests/testutil.h tests/media_write.h
tests_test_media_CFLAGS = $(TEST_CFLAGS) $(FFMPEG_CFLAGS)
tests_test_media_LDADD = libgh200core_train.la libgh200core_ops.la $(TEST_LIBS) $(FFMPEG_LIBS) -lm
TESTS += tests/test_media
dist_doc_DATA += doc/media.md
EXTRA_DIST += tests/fixtures/make_media_fixtures.py tests/fixtures/media
# `gh200core prepare` through the CLI, with the wanvae and umt5 plugins at small random sizes
check_PROGRAMS += tests/test_prepare
tests_test_prepare_SOURCES = tests/test_prepare.c tests/testutil.h tests/media_write.h
tests_test_prepare_CFLAGS = $(TEST_CFLAGS)
tests_test_prepare_LDADD = libgh200core_train.la $(TEST_LIBS)
TESTS += tests/test_prepare
dist_doc_DATA += doc/prepare.md
