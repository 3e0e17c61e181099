# plugins/gradient_ramp: (to be written)
