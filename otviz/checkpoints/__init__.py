"""Checkpoints: the on-disk format (safetensors + JSON, atomic, checksummed,
:mod:`otviz.checkpoints.store`), a backbone's identity (:mod:`otviz.checkpoints.identity`),
method-head checkpoints (:mod:`otviz.checkpoints.heads`) and the manifest of shipped
checkpoints (:mod:`otviz.checkpoints.manifest`).

Loading a head needs only this package and :mod:`otviz.methods`, never :mod:`otviz.train`.
"""
