# bench: benchmarks (not tests): `make bench` builds them; run them on the GPU machine
# (bench/README.md). bench_ops times our GEMMs and attention; bench_torch.py times PyTorch at
# the same shapes and prints both side by side.
if HAVE_CUDA
EXTRA_PROGRAMS = bench/bench_ops
bench_bench_ops_SOURCES = bench/bench_ops.c
bench_bench_ops_CFLAGS = $(AM_CFLAGS) $(CUDA_CFLAGS)
bench_bench_ops_LDADD = libgh200core_ops.la libgh200core.la $(CUDA_LIBS)
endif
bench: $(EXTRA_PROGRAMS)
.PHONY: bench
CLEANFILES += $(EXTRA_PROGRAMS)
EXTRA_DIST += bench/bench_ops.c bench/bench_torch.py bench/README.md

# ---- lycoris (issue 5): adapter cost on one A14B block; see bench/bench_lycoris.c ----
if HAVE_CUDA
EXTRA_PROGRAMS += bench/bench_lycoris
bench_bench_lycoris_SOURCES = bench/bench_lycoris.c
bench_bench_lycoris_LDADD = libgh200core_ops.la libgh200core.la
endif
EXTRA_DIST += bench/bench_lycoris.c
# ---- end lycoris ----
