# plugins/in_memory: (to be written)
