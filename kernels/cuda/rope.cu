/* kernels/cuda/rope.cu: placeholder (being written). */
