# plugins/disk: (to be written)
