# plugins/unified_memory: (to be written)
