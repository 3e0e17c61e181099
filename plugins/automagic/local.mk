# plugins/automagic: (to be written)
