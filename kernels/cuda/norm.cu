/* kernels/cuda/norm.cu: placeholder (being written). */
