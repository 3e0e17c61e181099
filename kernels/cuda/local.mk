# kernels/cuda: CUDA kernels as a convenience library linked into libgh200core_ops (and GPU
# tests); the core links no CUDA. Built for sm_90a, sm_121 and compute_90 PTX (NVCCFLAGS).
CUDA_KERNEL_SOURCES = kernels/cuda/device.cu kernels/cuda/device.h kernels/cuda/kernels.h kernels/cuda/common.cuh \
	kernels/cuda/mma.cuh \
	kernels/cuda/cast_rng.cu kernels/cuda/norm.cu kernels/cuda/rope.cu kernels/cuda/patch.cu \
	kernels/cuda/elementwise.cu kernels/cuda/reduce.cu kernels/cuda/gemm.cu \
	kernels/cuda/attention.cu
EXTRA_DIST += $(CUDA_KERNEL_SOURCES)
if HAVE_CUDA
noinst_LTLIBRARIES += kernels/libghc_cuda.la
kernels_libghc_cuda_la_SOURCES = $(CUDA_KERNEL_SOURCES)
kernels_libghc_cuda_la_LIBADD = $(CUDA_LIBS) -lcublasLt
endif
# The .cu.lo rule has no automatic header dependencies: name them.
if HAVE_CUDA
$(kernels_libghc_cuda_la_OBJECTS): kernels/cuda/common.cuh kernels/cuda/mma.cuh kernels/cuda/kernels.h kernels/cuda/device.h \
	include/gh200core/ops.h include/gh200core/tensor.h
endif
# optimizer updates (issue 6)
CUDA_KERNEL_SOURCES += kernels/cuda/optim.cu
# LoRA's backward at a K-concatenated linear's output (issue 5)
CUDA_KERNEL_SOURCES += kernels/cuda/lora.cu
