"""The features picker, its layer slider and the input-size control beside the checkpoint
picker: where every view's patch features come from (the last block, block K, or a dense
last-block path: MaskCLIP, SCLIP, ClearCLIP, NACLIP) and the side the image tower runs at.

The checkpoint picker names the model and head set only; the controls show the reading and
write it into two hidden fields, the ``features`` and ``image_size`` parameters of every
endpoint that reads a backbone (:mod:`otviz.ui.reading`). A pick in the checkpoint picker
keeps the choice where the new backbone offers it, and a pick of a trained head set opens it
at the reading its heads were trained on. A line under them says what a head-set entry draws
(:meth:`~otviz.ui.context.AppContext.heads_note`: its provenance, or why its methods are
drawn training-free at this reading).
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from otviz.ui.context import AppContext
from otviz.ui.reading import DEFAULT_READING, Reading, split_reading, with_reading

#: The features picker's labels for the sources towers give (ImageTower.sources()).
SOURCE_LABELS = {
    "last": "last block (default)",
    "layer:K": "block K (slider)",
    "maskclip": "MaskCLIP: value path",
    "sclip": "SCLIP: q-q + k-k attention",
    "clearclip": "ClearCLIP: q-q, no residual, no FFN",
    "naclip": "NACLIP: neighbourhood k-k, no FFN",
    "resclip-rcs": "ResCLIP (RCS only): NACLIP + blocks 5-8 q-k",
    "scclip": "SC-CLIP: anomaly fix, block-8 similarity, fusion",
}
LAYER_FORM = "layer:K"
#: The ``features`` parameter of the controls' shown choice, computed in the browser.
MIRROR_FEATURES = (f"(form, k) => form === {LAYER_FORM!r} ? 'layer:' + Math.round(k) : form")


@dataclass
class ReadingControls:
    """The three controls (built by :func:`build_reading_controls`)."""

    features: gr.Dropdown
    layer: gr.Slider
    image_size: gr.Dropdown
    note: gr.Markdown
    #: The reading shown, as the ``features`` and ``image_size`` parameters of every endpoint
    #: that reads a backbone (hidden).
    features_value: gr.Textbox
    size_value: gr.Number


@dataclass
class ControlState:
    """What the controls show for one backbone: the value the views read it at (the
    picker's entry with the reading: :func:`~otviz.ui.reading.with_reading`), the feature
    sources its tower gives (``form`` the one shown), its depth for the layer
    slider (``layer`` shown) and the input sides it offers (``side`` shown)."""

    value: str
    sources: list[tuple[str, str]]
    form: str
    depth: int
    layer: int
    sizes: list[tuple[str, int]]
    side: int
    note: str = ""


def reading_of(features: str | None, layer: float | None, image_size: int | None) -> Reading:
    """The reading the controls show: ``layer:K`` with the slider's K."""
    source = features or "last"
    if source == LAYER_FORM:
        source = f"layer:{int(layer or 0)}"
    return Reading(source, int(image_size) if image_size else None)


def best_block(depth: int) -> int:
    """Where the block slider starts on a tower of ``depth`` blocks: the middle one,
    ``depth // 2``. Mid-network is where the Perception Encoder paper finds a CLIP's best
    dense features (docs/backbones.md, the ``layer:K`` row), and on the embedded tiny CLIP
    (4 blocks) block 2 has the best mean pointing game of its intermediate blocks
    (docs/backbones.md, the per-source table); the last block is the ``last`` source."""
    return depth // 2


def control_state(ctx: AppContext, checkpoint: str, reading: Reading) -> ControlState:
    """The controls for the picked backbone showing ``reading``, its source or size replaced
    by the default where this backbone does not offer it (the block slider, hidden, at
    :func:`best_block`), and the entry's note (:meth:`AppContext.heads_note`); the library
    checks the reading on this tower (a source it cannot give is its message)."""
    tower = ctx.explainer(split_reading(checkpoint)[0]).backbone.image_tower
    sizes, sources = ctx.sizes(checkpoint), tower.sources()
    form = LAYER_FORM if reading.features.startswith("layer:") else reading.features
    depth = tower.depth if LAYER_FORM in sources else 1
    layer = int(reading.features[len("layer:"):]) if form == LAYER_FORM else best_block(depth)
    if form not in sources or not -depth <= layer < depth:
        reading, form, layer = Reading("last", reading.image_size), "last", best_block(depth)
    if reading.image_size not in sizes[1:]:  # the native side is the default
        reading = Reading(reading.features)
    value = with_reading(checkpoint, reading)
    ctx.explainer(value)
    return ControlState(value, [(SOURCE_LABELS.get(s, s), s) for s in sources], form, depth,
                        layer % depth, size_choices(sizes), reading.image_size or sizes[0],
                        ctx.heads_note(value))


def picked_reading(ctx: AppContext, checkpoint: str, shown: Reading) -> Reading:
    """The reading a pick of ``checkpoint`` in the picker opens at: a head set's own (the
    one its heads were trained on), else the one the controls show (``shown``)."""
    heads = ctx.head_set(checkpoint)
    return shown if heads is None else heads.reading


def slider_top(depth: int) -> int:
    """The block slider's maximum: the last block, at least 1 (Gradio refuses a slider whose
    minimum is its maximum; a tower without ``layer:K``, depth 1, keeps the slider hidden and
    a pick past its last block falls back to ``last`` in :func:`control_state`)."""
    return max(depth - 1, 1)


def size_choices(sizes: list[int]) -> list[tuple[str, int]]:
    """The size control's entries: each side in pixels, the first marked native."""
    return [(f"{s} px" + (" (native)" if k == 0 else ""), s) for k, s in enumerate(sizes)]


def build_reading_controls(ctx: AppContext, checkpoint: gr.Dropdown) -> ReadingControls:
    """The controls, on the initial checkpoint's backbone at the default reading, wired to
    ``checkpoint``, and the line under them: a change of any rewrites the hidden
    ``features`` and ``image_size`` fields; a pick of another entry keeps the choice where
    that backbone offers it, a pick of a head set opens it at its heads' reading
    (:func:`picked_reading`). The picker's value is left as picked (the entry). Their events
    are the page's own (no API endpoint)."""
    state = control_state(ctx, checkpoint.value, DEFAULT_READING)
    with gr.Row():
        features = gr.Dropdown(state.sources, value=state.form, label="Patch features from",
                               interactive=True, elem_id="shared-features", scale=2)
        layer = gr.Slider(0, slider_top(state.depth), value=state.layer, step=1, label="Block K",
                          visible=False, elem_id="shared-layer", scale=1)
        size = gr.Dropdown(state.sizes, value=state.side, label="Input size", interactive=True,
                           elem_id="shared-image-size", scale=1)
    note = gr.Markdown(state.note, visible=bool(state.note), elem_id="shared-heads-note")
    reading = split_reading(state.value)[1]
    features_value = gr.Textbox(reading.features, visible=False, label="features")
    size_value = gr.Number(reading.image_size or 0, precision=0, visible=False,
                           label="image_size")  # 0: the native side of any backbone
    controls = [checkpoint, features, layer, size]

    def shown(s: ControlState) -> tuple:
        reading = split_reading(s.value)[1]
        return (gr.Dropdown(choices=s.sources, value=s.form),
                gr.Slider(maximum=slider_top(s.depth), value=s.layer,
                          visible=s.form == LAYER_FORM),
                gr.Dropdown(choices=s.sizes, value=s.side),
                gr.Markdown(s.note, visible=bool(s.note)),
                reading.features, reading.image_size or 0)

    def on_pick(value: str, source: str, k: float, side: int) -> tuple:
        reading = picked_reading(ctx, value, reading_of(source, k, side))
        return shown(control_state(ctx, value, reading))

    def on_change(value: str, source: str, k: float, side: int) -> tuple:
        return shown(control_state(ctx, value, reading_of(source, k, side)))

    for control in controls:
        control.input(on_pick if control is checkpoint else on_change, controls,
                      [features, layer, size, note, features_value, size_value],
                      api_visibility="private", show_progress="hidden")
    # the hidden fields follow a pick in the browser at once (no server round trip), so a
    # view's button clicked right after it reads the picked reading; the server's answer
    # above then corrects what this backbone does not offer
    for control in (features, layer):
        control.input(None, [features, layer], features_value, js=MIRROR_FEATURES,
                      api_visibility="private")
    size.input(None, size, size_value, js="(side) => side", api_visibility="private")
    return ReadingControls(features, layer, size, note, features_value, size_value)
