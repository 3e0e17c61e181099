# plugins/local: (to be written)
