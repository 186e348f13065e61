"""Text towers: open_clip's own transformer and Hugging Face encoders.

Token features are the per-position states of the last layer, one per input id. Width
space: open_clip's TextTransformer after its final norm ``ln_final`` (CoCa's appended class
token dropped); a Hugging Face encoder's ``last_hidden_state``. Projected space: the
tower's own projection applied per token (``text_projection``; the ``proj`` linear or MLP
of ``HFTextEncoder``), the map the pooled embedding goes through.
"""

from __future__ import annotations

from open_clip.hf_model import HFTextEncoder
from open_clip.model import CLIP
from open_clip.transformer import TextTransformer
from torch import Tensor, nn

from otviz.towers.base import TextTower, register_text_tower


@register_text_tower(TextTransformer)
@register_text_tower(CLIP)
class OpenClipText(TextTower):
    """open_clip's TextTransformer, at ``model.text`` or spread over a ``CLIP`` model."""


    @property
    def _tower(self) -> nn.Module:
        return getattr(self.model, "text", self.model)

    def encode(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        out = self.model.forward_intermediates(
            text=ids, text_indices=1, normalize=False, normalize_intermediates=True
        )
        return out["text_intermediates"][-1], out["text_features"]

    def project(self, tokens: Tensor) -> Tensor:
        proj = self._tower.text_projection
        if proj is None:
            return tokens
        return proj(tokens) if isinstance(proj, nn.Module) else tokens @ proj

    @property
    def width(self) -> int:
        tower = self._tower
        return int(getattr(tower, "width", None) or tower.transformer.width)

    @property
    def token_embeddings(self) -> Tensor:
        return self._tower.token_embedding.weight


@register_text_tower(HFTextEncoder)
class HuggingFaceText(TextTower):
    """open_clip's ``HFTextEncoder`` (BERT, RoBERTa, XLM-R, mT5 / NLLB encoders, ...)."""


    def encode(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        text = self.model.text
        attention = (ids != text.config.pad_token_id).long()
        out = text.transformer(input_ids=ids, attention_mask=attention)
        return out.last_hidden_state, text.proj(text.pooler(out, attention))

    def project(self, tokens: Tensor) -> Tensor:
        return self.model.text.proj(tokens)

    @property
    def width(self) -> int:
        return int(self.model.text.transformer.get_input_embeddings().weight.shape[1])

    @property
    def token_embeddings(self) -> Tensor:
        return self.model.text.transformer.get_input_embeddings().weight
