/* kernels/cuda/reduce.cu: placeholder (being written). */
