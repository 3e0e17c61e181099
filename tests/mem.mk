# tests/mem.mk: (to be written)
