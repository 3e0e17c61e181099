# plugins/offload: (to be written)
