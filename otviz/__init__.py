"""otviz: see how optimal transport aligns image patches with caption words.

Layers (imports point one way, lowest first; ARCHITECTURE.md, checked by tests/test_layers.py):
``ot`` -> ``methods`` -> ``text`` -> ``world`` -> ``checkpoints`` -> ``backbone`` ->
``data``/``suite`` -> ``explain`` -> ``train`` -> ``eval`` -> ``viz`` -> ``report`` -> ``ui``
-> ``cli``.
"""

__version__ = "0.1.0"
