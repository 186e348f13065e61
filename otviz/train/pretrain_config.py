"""Every knob of tiny-CLIP pre-training (:func:`otviz.train.pretrain.pretrain`) in one
dataclass; each field is a flag of ``otviz pretrain``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otviz.tiny_clip import tiny_clip_config
from otviz.world import WorldConfig


@dataclass
class PretrainConfig:
    """Every knob of tiny-CLIP pre-training (defaults reproduce the shipped checkpoint)."""

    steps: int = 6000  # optimiser steps (epochs = steps * batch_size / n_train)
    batch_size: int = 256
    lr: float = 3e-3
    warmup_steps: int = 100
    weight_decay: float = 0.05
    seed: int = 0  # seeds torch and the world (train and test splits)
    n_train: int = 200000  # world training samples, rendered once
    n_test: int = 1000  # held-out world test pairs for retrieval
    embed_dim: int = 96
    vision_width: int = 96
    vision_layers: int = 4
    vision_heads: int = 3
    text_width: int = 96
    text_layers: int = 3
    text_heads: int = 3
    context_length: int = 32
    vision_pool: str = "avg"  # "avg": image embedding = mean of patch tokens; "tok": CLS
    vision_pos_embed: str = "sin_cos_2d"  # fixed 2-D patch positions, or "learnable"
    vision_mlp_ratio: float = 4.0
    vision_stem: str = "conv"  # "patch": one linear map per patch; "conv": a convolutional stem
    init_temperature: float = 0.07  # initial temperature of the logits (learned after)
    loss: str = "infonce"  # or an OT-CLIP kind of otviz.train.otclip_losses
    hard_negatives: int = 2  # world hard-negative captions per image (InfoNCE only)
    local_weight: float = 1.0  # weight of FILIP's token-wise local loss next to the global one
    bf16: bool = False  # forward and loss under CPU bfloat16 autocast
    init_from: str = ""  # start from this tiny-CLIP checkpoint's weights (same architecture)
    negative_weights: str = ""  # e.g. "replace_obj:3,swap_obj:2" (categories' odds; "": uniform)
    image_size: int = 80  # world and model image side (objects scale with it; 8-px patches)
    patch_size: int = 8
    max_shift: int = 2  # augmentation: random translation in pixels (0: none)
    threads: int = 1  # torch threads per process
    processes: int = 2  # data-parallel processes (gloo), each with batch_size / processes
    device: str = "cpu"  # "cpu" or a CUDA device ("cuda", "cuda:1"; one process only)
    data_cache: str = ""  # folder keeping the rendered training set for later runs (1 process)
    render_workers: int = 1  # processes rendering the training set (with --data-cache)
    eval_every: int = 500  # held-out retrieval every this many steps (0: only at the end)
    out: str = "checkpoints/tiny-clip"  # checkpoint directory ("" : do not save)
    save_every: int = 100  # resumable training state every this many steps (0: never)
    resume: bool = True  # continue from the training state left by a stopped run

    def model_config(self) -> dict[str, Any]:
        return tiny_clip_config(
            embed_dim=self.embed_dim,
            image_size=self.image_size,
            patch_size=self.patch_size,
            vision_width=self.vision_width,
            vision_layers=self.vision_layers,
            vision_heads=self.vision_heads,
            text_width=self.text_width,
            text_layers=self.text_layers,
            text_heads=self.text_heads,
            context_length=self.context_length,
            vision_pool=self.vision_pool,
            vision_pos_embed=self.vision_pos_embed,
            vision_mlp_ratio=self.vision_mlp_ratio,
            vision_stem=self.vision_stem,
            init_temperature=self.init_temperature,
        )

    def world_config(self) -> WorldConfig:
        """The world it trains on: the default world drawn at ``image_size``."""
        return WorldConfig(negatives=False).scaled(self.image_size)

    def state_dir(self) -> Path | None:
        """Where the resumable training state lives (beside ``out``; ``None`` if not saved)."""
        return Path(self.out + ".resume") if self.out and self.save_every > 0 else None
