/* kernels/cuda/attention.cu: placeholder (being written). */
