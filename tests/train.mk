# tests/train.mk: (to be written)
