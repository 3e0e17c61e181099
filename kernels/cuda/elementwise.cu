/* kernels/cuda/elementwise.cu: placeholder (being written). */
