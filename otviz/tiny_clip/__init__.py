"""The embedded tiny CLIP: the open_clip model otviz trains on its synthetic world and ships
(:mod:`otviz.tiny_clip.model`), with the convolutional patch stem its image tower may use
(:mod:`otviz.tiny_clip.conv_stem`)."""
