# tests/data.mk: (to be written)
