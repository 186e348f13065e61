"""Small random-init stand-ins of any open_clip architecture, offline.

:func:`shrunken_config` keeps what makes an architecture's family (its tower classes, the
pooling, the projection kinds, CoCa's attention pooler and decoder, the tokenizer kind and
its cleaning, the context length, the patch size) and shrinks what only scales it (depth,
width, heads, image size), so a tag's whole code path runs in a fraction of a second on a
CPU. It is how the tests build one instance per family and how the coverage benchmark
(``benchmarks/open_clip_coverage.py``) runs every method and view for every tag.

Nothing is downloaded. A timm trunk is shrunk through a timm entrypoint registered here
(:func:`shrunken_timm_name`: the same timm model function with smaller depth / width
keyword arguments). A Hugging Face text tower or tokenizer, which open_clip fetches from
the hub by name, is replaced by a local stand-in of the same kind
(:func:`local_hf_text_config`, :func:`local_hf_tokenizer`): a small config of the same
``model_type`` and a tokenizer of the same kind (WordPiece for BERT, SentencePiece-style
Unigram otherwise) trained with the ``tokenizers`` library on a few built-in sentences,
with the original's special-token layout. Their weights and vocabularies are not the
originals', which no test here needs.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import timm
import torch
from timm.models import register_model
from timm.models._registry import _model_entrypoints

#: Edge of a shrunken convolutional tower's input (a 2 x 2 grid at stride 32).
CNN_IMAGE = 64
#: Patches per side of a shrunken ViT's input.
VIT_GRID = 4
#: Width / heads of shrunken text towers.
WIDTH, HEADS = 32, 2
#: Joint embedding dimension of a shrunken model, also the width of its ViT towers (SigLIP's
#: timm towers pass their width through as the embedding).
EMBED_DIM = 64

#: Keyword arguments that shrink a timm model, by the model's class name.
TIMM_SHRINK: dict[str, dict[str, Any]] = {
    "VisionTransformer": {"depth": 2, "embed_dim": EMBED_DIM, "num_heads": 2},
    "VisionTransformerRelPos": {"depth": 2, "embed_dim": EMBED_DIM, "num_heads": 2},
    "Eva": {"depth": 2, "embed_dim": EMBED_DIM, "num_heads": 2},
    "ConvNeXt": {"depths": (1, 1, 1, 1), "dims": (16, 32, 64, 128)},
    "FastVit": {"layers": (1, 1, 1, 1), "embed_dims": (16, 32, 64, 128)},
    "SwinTransformer": {"depths": (1, 1, 1, 1), "embed_dim": 16, "num_heads": (1, 1, 2, 2)},
}

#: Text a stand-in tokenizer is trained on (every printable ASCII character appears).
CORPUS = [
    "a small red circle to the left of a blue square",
    "there is a cyan star above a large green triangle",
    "a dog runs on the beach near the water",
    "two people ride bicycles down a busy city street",
    "a plate of food with pizza and salad on a wooden table",
    "the cat is sleeping on a white sofa in the living room",
    "snow covers the trees and the mountains under a grey sky",
    "A man, a woman & their child walk home; it's 5 o'clock!",
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789",
    "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
]

#: Hugging Face text model name fragment -> ``model_type`` (open_clip's ``arch_dict``).
HF_MODEL_TYPES = [("nllb", "m2m_100"), ("mt5", "mt5"), ("xlm-roberta", "xlm-roberta"),
                  ("roberta", "roberta"), ("bert", "bert")]


def shrunken_timm_name(name: str) -> tuple[str, int]:
    """Register (once) a timm entrypoint that builds ``name`` shrunk by :data:`TIMM_SHRINK`
    and return its name and the image edge it takes. ``KeyError`` for an unknown class."""
    with torch.device("meta"):
        full = timm.create_model(name)
    kind = type(full).__name__
    overrides = dict(TIMM_SHRINK[kind])
    patch = getattr(getattr(full, "patch_embed", None), "patch_size", None)
    if kind == "SwinTransformer":  # its windows fix the input size
        size = int(full.patch_embed.img_size[0])
    elif kind in ("ConvNeXt", "FastVit"):  # fully convolutional: any input size
        size = CNN_IMAGE
    elif tuple(patch) == (1, 1):  # hybrid ViT: a CNN stem fixes the width; fewer blocks
        size = CNN_IMAGE
        overrides = {"depth": overrides["depth"], "img_size": size}
    else:  # ViTs: a few patches per side
        size = int(patch[0]) * VIT_GRID
        overrides["img_size"] = size
    new = f"otviz_shrunk__{name}"
    if new not in _model_entrypoints:

        def entry(pretrained: bool = False, **kwargs: Any) -> torch.nn.Module:
            return timm.create_model(name, pretrained=False, **{**overrides, **kwargs})

        entry.__name__ = entry.__qualname__ = new
        register_model(entry)
    return new, size


def hf_model_type(hf_name: str) -> str:
    """The ``model_type`` of a Hugging Face text model open_clip names (by name fragment)."""
    for fragment, model_type in HF_MODEL_TYPES:
        if fragment in hf_name.lower():
            return model_type
    raise KeyError(f"no stand-in for the Hugging Face model {hf_name!r}")


def local_hf_tokenizer(directory: Path, original: str) -> Path:
    """A fast tokenizer saved under ``directory`` that stands in for the hub's ``original``:
    WordPiece with ``[CLS] ... [SEP]`` for BERT, SentencePiece-style Unigram with
    ``<s> ... </s>`` (RoBERTa, XLM-R, NLLB) or ``... </s>`` (T5, SigLIP) otherwise."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    out = Path(directory) / f"tokenizer-{original.replace('/', '--')}"
    if (out / "tokenizer.json").exists():
        return out
    bert = "bert" in original.lower() and "roberta" not in original.lower()
    if bert:
        specials = {"unk_token": "[UNK]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                    "sep_token": "[SEP]", "mask_token": "[MASK]"}
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=400, special_tokens=list(specials.values()))
        tok.train_from_iterator(CORPUS, trainer)
        template = "[CLS] $A [SEP]"
    else:
        bos = not any(k in original.lower() for k in ("t5", "siglip"))
        specials = {"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"}
        if bos:
            specials["bos_token"] = "<s>"
        tok = Tokenizer(models.Unigram())
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=300, special_tokens=list(specials.values()),
                                          unk_token="<unk>")
        tok.train_from_iterator(CORPUS, trainer)
        template = "<s> $A </s>" if bos else "$A </s>"
    names = [t for t in template.split() if t != "$A"]
    tok.post_processor = processors.TemplateProcessing(
        single=template, special_tokens=[(t, tok.token_to_id(t)) for t in names]
    )
    PreTrainedTokenizerFast(tokenizer_object=tok, **specials).save_pretrained(out)
    return out


def local_hf_text_config(directory: Path, hf_name: str, pad_token_id: int, vocab: int) -> Path:
    """A small config of ``hf_name``'s ``model_type`` saved under ``directory``."""
    from transformers import AutoConfig

    model_type = hf_model_type(hf_name)
    out = Path(directory) / f"config-{model_type}-{vocab}"
    if (out / "config.json").exists():
        return out
    sizes = {"vocab_size": vocab, "pad_token_id": pad_token_id}
    if model_type in ("mt5", "m2m_100"):
        sizes.update(d_model=WIDTH, num_layers=1, num_heads=HEADS, d_ff=2 * WIDTH, d_kv=16,
                     encoder_layers=1, decoder_layers=1, encoder_attention_heads=HEADS,
                     decoder_attention_heads=HEADS, encoder_ffn_dim=2 * WIDTH,
                     decoder_ffn_dim=2 * WIDTH, max_position_embeddings=128)
    else:
        sizes.update(hidden_size=WIDTH, num_hidden_layers=1, num_attention_heads=HEADS,
                     intermediate_size=2 * WIDTH, max_position_embeddings=130)
    AutoConfig.for_model(model_type, **sizes).save_pretrained(out)
    return out


def shrunken_config(cfg: dict[str, Any], hf_dir: Path) -> dict[str, Any]:
    """A small config of ``cfg``'s family (see the module docstring); Hugging Face
    stand-ins are written under ``hf_dir``."""
    cfg = copy.deepcopy(cfg)
    cfg["embed_dim"] = EMBED_DIM
    vision, text = cfg["vision_cfg"], cfg["text_cfg"]
    if vision.get("timm_model_name"):
        vision["timm_model_name"], vision["image_size"] = shrunken_timm_name(
            vision["timm_model_name"])
        vision.pop("timm_drop_path", None)
    elif isinstance(vision.get("layers"), (list, tuple)):  # ModifiedResNet
        vision.update(layers=[1, 1, 1, 1], width=16, image_size=CNN_IMAGE)
    else:  # open_clip ViT
        patch = int(vision.get("patch_size", 16))
        vision.update(layers=2, width=EMBED_DIM, head_width=32, image_size=patch * VIT_GRID)
        if vision.get("attentional_pool"):
            vision.update(attn_pooler_queries=8, attn_pooler_heads=HEADS)
    if text.get("hf_tokenizer_name"):
        original = text["hf_tokenizer_name"]
        text["hf_tokenizer_name"] = str(local_hf_tokenizer(hf_dir, original))
    if text.get("hf_model_name"):
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(text["hf_tokenizer_name"])
        text["hf_model_name"] = str(local_hf_text_config(
            hf_dir, text["hf_model_name"], tok.pad_token_id, len(tok)))
        text["hf_model_pretrained"] = False
    else:  # without a projection (SigLIP i18n) the text width is the embedding dimension
        text.update(width=EMBED_DIM if text.get("proj_type") == "none" else WIDTH,
                    heads=HEADS, layers=1)
        if text.get("hf_tokenizer_name"):
            from transformers import AutoTokenizer

            text["vocab_size"] = len(AutoTokenizer.from_pretrained(text["hf_tokenizer_name"]))
    if "multimodal_cfg" in cfg:
        cfg["multimodal_cfg"].update(width=WIDTH, heads=HEADS, layers=1,
                                     attn_pooler_heads=HEADS)
    return cfg


def register_shrunken(model_name: str, hf_dir: Path) -> str:
    """Register the :func:`shrunken_config` of open_clip's ``model_name`` with open_clip as
    ``otviz-shrunk-<model_name>`` and return that name (``open_clip.create_model`` and
    ``open_clip.get_tokenizer`` then build it like any architecture)."""
    from open_clip.factory import get_model_config

    from otviz.tiny_clip.model import register_tiny_clip

    cfg = get_model_config(model_name)
    if cfg is None:
        raise KeyError(f"unknown open_clip model {model_name!r}")
    return register_tiny_clip(shrunken_config(cfg, hf_dir), name=f"otviz-shrunk-{model_name}")
