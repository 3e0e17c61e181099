# kernels/cuda: CUDA kernels as a convenience library that only CUDA plugins and GPU tests
# link (the core links no CUDA). Built for sm_90a, sm_121 and compute_90 PTX (NVCCFLAGS).
EXTRA_DIST += kernels/cuda/device.cu kernels/cuda/device.h
if HAVE_CUDA
noinst_LTLIBRARIES += kernels/libghc_cuda.la
kernels_libghc_cuda_la_SOURCES = kernels/cuda/device.cu kernels/cuda/device.h
kernels_libghc_cuda_la_LIBADD = $(CUDA_LIBS)
endif
