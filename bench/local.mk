# bench: benchmarks (not tests): `make bench` builds them; run on the GPU machine.
EXTRA_PROGRAMS = bench/bench_ops
bench_bench_ops_SOURCES = bench/bench_ops.c
bench_bench_ops_LDADD = libgh200core_ops.la libgh200core.la
bench: $(EXTRA_PROGRAMS)
.PHONY: bench
CLEANFILES += $(EXTRA_PROGRAMS)
