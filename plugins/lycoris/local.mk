# plugins/lycoris: (to be written)
