# kernels: libgh200core_ops, the compute ops of ops.h. kernels/ops.c validates and dispatches
# by device to the CPU reference (kernels/cpu/) or the CUDA kernels (kernels/cuda/, linked in
# from libghc_cuda.la when built with CUDA). The core itself links no CUDA; plugins that
# compute link this library.
lib_LTLIBRARIES += libgh200core_ops.la
libgh200core_ops_la_SOURCES = kernels/ops.c kernels/cpu/cpu.h \
	kernels/cpu/random.c kernels/cpu/gemm.c kernels/cpu/attention.c kernels/cpu/norm.c \
	kernels/cpu/rope.c kernels/cpu/patch.c kernels/cpu/elementwise.c kernels/cpu/reduce.c \
	kernels/cpu/text.c
libgh200core_ops_la_CFLAGS = $(AM_CFLAGS) -fvisibility=hidden
libgh200core_ops_la_LDFLAGS = -version-info 0:0:0 -no-undefined $(AM_LDFLAGS)
libgh200core_ops_la_LIBADD = libgh200core.la -lm
if HAVE_CUDA
libgh200core_ops_la_LIBADD += kernels/libghc_cuda.la $(CUDA_LIBS) -lcublasLt
endif
# a model's frozen linears with the network's adapters (linear.h)
libgh200core_ops_la_SOURCES += kernels/linear.c
# optimizer updates: the CPU twin of kernels/cuda/optim_*.cu
libgh200core_ops_la_SOURCES += kernels/cpu/optim.c
# convolution / VAE ops (the Wan VAEs, doc/vae.md): CPU reference only so far
libgh200core_ops_la_SOURCES += kernels/cpu/conv.c
