"""otviz: see how optimal transport aligns image patches with caption words.

Layers (data flows one way): ``backbone`` -> ``methods`` (built on ``ot``) -> ``viz`` -> ``ui``.
"""

__version__ = "0.1.0"
