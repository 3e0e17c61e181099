# bench: benchmarks (not tests): `make bench` builds them; run them on the GPU machine
# (bench/README.md). bench_ops times our GEMMs and attention; bench_torch.py times PyTorch at
# the same shapes and prints both side by side.
EXTRA_PROGRAMS =
if HAVE_CUDA
EXTRA_PROGRAMS += bench/bench_ops
bench_bench_ops_SOURCES = bench/bench_ops.c
bench_bench_ops_CFLAGS = $(AM_CFLAGS) $(CUDA_CFLAGS)
bench_bench_ops_LDADD = libgh200core_ops.la libgh200core.la $(CUDA_LIBS)
endif
bench: $(EXTRA_PROGRAMS)
.PHONY: bench
CLEANFILES += $(EXTRA_PROGRAMS)
EXTRA_DIST += bench/bench_ops.c bench/bench_torch.py bench/README.md

# ---- bench_data: in_memory staging per compression vs sequential reads ----
noinst_PROGRAMS = bench/bench_data
bench_bench_data_SOURCES = bench/bench_data.c
bench_bench_data_LDADD = libgh200core.la
bench: bench/bench_data
# ---- end bench_data ----

# ---- bench_optim: fused optimizer updates vs the device copy bandwidth ----
if HAVE_CUDA
EXTRA_PROGRAMS += bench/bench_optim
bench_bench_optim_SOURCES = bench/bench_optim.c
bench_bench_optim_CFLAGS = $(AM_CFLAGS) $(CUDA_CFLAGS)
bench_bench_optim_LDADD = libgh200core_ops.la libgh200core.la $(CUDA_LIBS)
endif
EXTRA_DIST += bench/bench_optim.c

# ---- bench_lycoris: adapter cost on one A14B block; see bench/bench_lycoris.c ----
if HAVE_CUDA
EXTRA_PROGRAMS += bench/bench_lycoris
bench_bench_lycoris_SOURCES = bench/bench_lycoris.c
bench_bench_lycoris_LDADD = libgh200core_ops.la libgh200core.la
endif
EXTRA_DIST += bench/bench_lycoris.c
# ---- end bench_lycoris ----

# ---- bench_mem: device vs offload vs gh200_uvm on a multi-block A14B-dims step; saved activations ----
if HAVE_CUDA
EXTRA_PROGRAMS += bench/bench_mem
bench_bench_mem_SOURCES = bench/bench_mem.c
bench_bench_mem_CFLAGS = $(AM_CFLAGS) $(CUDA_CFLAGS)
bench_bench_mem_LDADD = libgh200core_ops.la libgh200core.la $(CUDA_LIBS) -lm
endif
EXTRA_DIST += bench/bench_mem.c

# ---- e2e: the whole training step through the CLI beside diffusers + peft (issue 23) ----
EXTRA_DIST += bench/e2e.sh bench/e2e_torch.py

# ---- bench_umt5: the umT5-XXL encoder beside transformers' UMT5EncoderModel (bench/umt5.sh) ----
if HAVE_CUDA
EXTRA_PROGRAMS += bench/bench_umt5
bench_bench_umt5_SOURCES = bench/bench_umt5.c
bench_bench_umt5_CFLAGS = $(AM_CFLAGS) $(CUDA_CFLAGS)
bench_bench_umt5_LDADD = plugins/umt5/libumt5_impl.la libgh200core_ops.la libgh200core.la $(CUDA_LIBS) -lm
if HAVE_SENTENCEPIECE
# the tokenizer's shim is C++: link with the C++ driver (its runtime)
nodist_EXTRA_bench_bench_umt5_SOURCES = bench/cxx_link.cc
endif
endif
EXTRA_DIST += bench/bench_umt5.c bench/umt5.sh bench/umt5_ref.py
# ---- end bench_umt5 ----

# ---- bench_vae: our Wan2.1 VAE encode beside diffusers' AutoencoderKLWan (bench/vae.sh) ----
if HAVE_CUDA
EXTRA_PROGRAMS += bench/bench_vae
bench_bench_vae_SOURCES = bench/bench_vae.c
bench_bench_vae_CFLAGS = $(AM_CFLAGS) $(CUDA_CFLAGS)
bench_bench_vae_LDADD = libgh200core_ops.la libgh200core.la $(CUDA_LIBS)
endif
EXTRA_DIST += bench/bench_vae.c bench/vae.sh bench/vae_ref.py

# ---- bench_media: prepare's decode and resize of a clip on one thread ----
EXTRA_PROGRAMS += bench/bench_media
bench_bench_media_SOURCES = bench/bench_media.c
bench_bench_media_LDADD = libgh200core_train.la libgh200core.la
EXTRA_DIST += bench/bench_media.c
# ---- end bench_media ----

# ---- prepare.sh: a whole `gh200core prepare` on the GPU; ffmpeg_min.sh: FFmpeg for a machine without it ----
EXTRA_DIST += bench/prepare.sh bench/ffmpeg_min.sh
