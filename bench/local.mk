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

# ---- bench_mem (issue 7): device vs offload vs gh200_uvm on a multi-block A14B-dims step ----
if HAVE_CUDA
EXTRA_PROGRAMS += bench/bench_mem
bench_bench_mem_SOURCES = bench/bench_mem.c
bench_bench_mem_CFLAGS = $(AM_CFLAGS) $(CUDA_CFLAGS)
bench_bench_mem_LDADD = libgh200core_ops.la libgh200core.la $(CUDA_LIBS) -lm
endif
EXTRA_DIST += bench/bench_mem.c
