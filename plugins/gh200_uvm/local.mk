# plugins/gh200_uvm: (to be written)
