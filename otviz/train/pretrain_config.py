"""Every knob of tiny-CLIP pre-training (:func:`otviz.train.pretrain.pretrain`) in one
dataclass; each field is a flag of ``otviz pretrain`` (read without importing torch)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from otviz.knobs import (
    Count,
    NonNegative,
    NonNegativeInt,
    OTCLIPLoss,
    PosEmbed,
    VisionPool,
    VisionStem,
)

if TYPE_CHECKING:
    from otviz.world import WorldConfig


@dataclass
class PretrainConfig:
    """Every knob of tiny-CLIP pre-training (defaults reproduce the shipped checkpoint)."""

    steps: Count = 6000  # optimiser steps (epochs = steps * batch_size / n_train)
    batch_size: Count = 256  # global batch (split over the processes)
    lr: NonNegative = 3e-3  # AdamW learning rate (peak, after the warm-up)
    warmup_steps: NonNegativeInt = 100  # linear warm-up steps, then cosine decay
    weight_decay: NonNegative = 0.05  # AdamW weight decay
    seed: NonNegativeInt = 0  # seeds torch and the world (train and test splits)
    n_train: Count = 200000  # world training samples, rendered once
    n_test: Count = 1000  # held-out world test pairs for retrieval
    # ---------------------------------------------------------------- architecture
    embed_dim: Count = 96  # shared image-text embedding width
    vision_width: Count = 96  # image transformer width
    vision_layers: Count = 4  # image transformer blocks
    vision_heads: Count = 3  # image attention heads
    text_width: Count = 96  # text transformer width
    text_layers: Count = 3  # text transformer blocks
    text_heads: Count = 3  # text attention heads
    context_length: Count = 32  # caption tokens (longer captions are cut)
    vision_pool: VisionPool = "avg"  # "avg": image embedding = mean of patch tokens; "tok": CLS
    vision_pos_embed: PosEmbed = "sin_cos_2d"  # fixed 2-D patch positions, or "learnable"
    vision_mlp_ratio: NonNegative = 4.0  # image MLP width / transformer width
    vision_stem: VisionStem = "conv"  # "patch": one linear map per patch; "conv": a
    # convolutional stem (stride-2 3x3 convolutions, Xiao et al. 2021), same token grid
    init_temperature: NonNegative = 0.07  # initial temperature of the logits (learned after)
    # ---------------------------------------------------------------- loss
    loss: OTCLIPLoss = "infonce"  # global loss: InfoNCE or an OT-CLIP kind
    # (otviz.train.otclip_losses)
    hard_negatives: NonNegativeInt = 2  # world hard-negative captions per image (InfoNCE only)
    local_weight: NonNegative = 1.0  # weight of FILIP's token-wise local loss next to the global
    bf16: bool = False  # forward and loss under CPU bfloat16 autocast
    init_from: str = ""  # start from this tiny-CLIP checkpoint's weights (same architecture)
    negative_weights: str = ""  # e.g. "replace_obj:3,swap_obj:2" (categories' odds; "": uniform)
    # ---------------------------------------------------------------- images
    image_size: Count = 80  # world and model image side (objects scale with it; 8-px patches)
    patch_size: Count = 8  # side of a square image patch (a token) in pixels
    max_shift: NonNegativeInt = 2  # augmentation: random translation in pixels (0: none)
    # ---------------------------------------------------------------- run control
    threads: Count = 1  # torch threads per process
    processes: Count = 2  # data-parallel processes (gloo), each with batch_size / processes
    device: str = "cpu"  # "cpu" or a CUDA device ("cuda", "cuda:1"; one process only)
    data_cache: str = ""  # folder keeping the rendered training set for later runs (one
    # process; "": render in memory each run)
    render_workers: Count = 1  # processes rendering the training set (with --data-cache)
    eval_every: NonNegativeInt = 500  # held-out retrieval every this many steps (0: at the end)
    out: str = "checkpoints/tiny-clip"  # checkpoint directory ("" : do not save)
    save_every: NonNegativeInt = 100  # resumable training state every this many steps (0: never)
    resume: bool = True  # continue from the training state left by a stopped run

    def model_config(self) -> dict[str, Any]:
        """The tiny CLIP's open_clip model config
        (:func:`otviz.tiny_clip.model.tiny_clip_config`)."""
        from otviz.tiny_clip.model import tiny_clip_config

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
        from otviz.world import WorldConfig

        return WorldConfig(negatives=False).scaled(self.image_size)

    def state_dir(self) -> Path | None:
        """Where the resumable training state lives (beside ``out``; ``None`` if not saved)."""
        return Path(self.out + ".resume") if self.out and self.save_every > 0 else None
