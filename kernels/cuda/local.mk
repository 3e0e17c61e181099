# kernels/cuda: CUDA kernels as a convenience library linked into libgh200core_ops (and GPU
# tests); the core links no CUDA. Built for sm_90a, sm_121 and compute_90 PTX (NVCCFLAGS).
CUDA_KERNEL_SOURCES = kernels/cuda/device.cu kernels/cuda/device.h kernels/cuda/kernels.h kernels/cuda/common.cuh \
	kernels/cuda/mma.cuh \
	kernels/cuda/cast_rng.cu kernels/cuda/norm.cu kernels/cuda/rope.cuh kernels/cuda/rope.cu kernels/cuda/patch.cu \
	kernels/cuda/elementwise.cu kernels/cuda/reduce.cu kernels/cuda/gemm.cu \
	kernels/cuda/attention_impl.cuh kernels/cuda/attention.cu kernels/cuda/attention_fwd.cu \
	kernels/cuda/attention_bwd.cu kernels/cuda/attention_wgmma.cu kernels/cuda/attention_generic.cu
EXTRA_DIST += $(CUDA_KERNEL_SOURCES) kernels/cuda/attention_cudnn.c kernels/cuda/cudnn_graph.c \
	kernels/cuda/cudnn_impl.h kernels/cuda/conv_cudnn.c
if HAVE_CUDA
noinst_LTLIBRARIES += kernels/libghc_cuda.la
kernels_libghc_cuda_la_SOURCES = $(CUDA_KERNEL_SOURCES)
kernels_libghc_cuda_la_LIBADD = $(CUDA_LIBS) -lcublasLt
# cuDNN's fused attention and convolution, host C against the CUDA headers (cudnn_graph.c loads
# libcudnn at run time)
noinst_LTLIBRARIES += kernels/libghc_cudnn.la
kernels_libghc_cudnn_la_SOURCES = kernels/cuda/cudnn_graph.c kernels/cuda/cudnn_impl.h kernels/cuda/attention_cudnn.c \
	kernels/cuda/conv_cudnn.c
kernels_libghc_cudnn_la_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CFLAGS)
kernels_libghc_cuda_la_LIBADD += kernels/libghc_cudnn.la
endif
# The .cu.lo rule has no automatic header dependencies: name them.
if HAVE_CUDA
$(kernels_libghc_cuda_la_OBJECTS): kernels/cuda/common.cuh kernels/cuda/mma.cuh kernels/cuda/kernels.h kernels/cuda/device.h \
	include/gh200core/ops.h include/gh200core/tensor.h
kernels/cuda/attention.lo kernels/cuda/attention_fwd.lo kernels/cuda/attention_bwd.lo \
	kernels/cuda/attention_wgmma.lo kernels/cuda/attention_generic.lo: kernels/cuda/attention_impl.cuh
kernels/cuda/norm.lo kernels/cuda/rope.lo: kernels/cuda/rope.cuh
endif
# optimizer updates (issue 6): adamw; automagic's separate passes, its cluster kernel, its plan
CUDA_KERNEL_SOURCES += kernels/cuda/optim_impl.cuh kernels/cuda/optim_am_cluster.cuh \
	kernels/cuda/optim_adamw.cu kernels/cuda/optim_automagic.cu kernels/cuda/optim_am_fused.cu \
	kernels/cuda/optim_plan.cu
if HAVE_CUDA
kernels/cuda/optim_adamw.lo kernels/cuda/optim_automagic.lo kernels/cuda/optim_am_fused.lo \
	kernels/cuda/optim_plan.lo: kernels/cuda/optim_impl.cuh
kernels/cuda/optim_am_fused.lo: kernels/cuda/optim_am_cluster.cuh
endif
# LoRA's backward at a K-concatenated linear's output (issue 5)
CUDA_KERNEL_SOURCES += kernels/cuda/lora.cu
# the GPU's time by kernel between two points of a run (CUPTI, loaded at run time; issue 23)
CUDA_KERNEL_SOURCES += kernels/cuda/profile.cu
# the model-input ops: timestep embedding, padded text rows (API 14)
CUDA_KERNEL_SOURCES += kernels/cuda/inputs.cu
# the text-encoder ops (umT5): embedding, relative-position bias, attention with bias and mask
# (its fused bf16 kernel takes the tile loads and fragments of attention_impl.cuh)
CUDA_KERNEL_SOURCES += kernels/cuda/text.cu
if HAVE_CUDA
kernels/cuda/text.lo: kernels/cuda/attention_impl.cuh
endif
# the convolution / VAE ops (API 16; the Wan VAEs): ours, and cuDNN's convolution (conv_cudnn.c)
CUDA_KERNEL_SOURCES += kernels/cuda/vae.cu
