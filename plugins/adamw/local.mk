# plugins/adamw: (to be written)
