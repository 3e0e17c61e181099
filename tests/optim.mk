# tests/optim.mk: (to be written)
