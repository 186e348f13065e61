"""Data: image-caption datasets (COCO, Karpathy, CSV folders and the synthetic world behind
one protocol, :mod:`otviz.data.datasets`), the world rendered into training tensors
(:mod:`otviz.data.rendered`) and frozen-backbone features cached on disk
(:mod:`otviz.data.feature_cache`).

Below :mod:`otviz.train` and :mod:`otviz.eval`, which both read it; imports nothing above
:mod:`otviz.backbone`.
"""
