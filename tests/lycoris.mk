# tests/lycoris.mk: (to be written)
