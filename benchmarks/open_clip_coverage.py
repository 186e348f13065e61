"""Which of open_clip's pretrained tags otviz runs: every ``open_clip.list_pretrained()`` tag
with its tower families, whether its architecture loads, whether all methods run and
whether every view renders; plus the encoding cost of one model per family.

Nothing is downloaded and every model is randomly initialised. The columns
(:data:`COLUMNS` says the same in the Markdown output):

* ``loads``: the tag's full-size architecture is built by ``open_clip.create_model`` on
  PyTorch's meta device (every module and parameter shape, no memory, no weights), and both
  towers have an otviz adapter (:mod:`otviz.towers`). A Hugging Face text tower's config
  lives on the hub: it is replaced by the default config of the same ``model_type``
  (``stand-in text config``), so its parameter count is approximate.
* ``params``/``fp32 GB``: the parameters of that meta instance (4 bytes each in fp32).
* ``methods``: on the *shrunken* instance of the architecture
  (:func:`otviz.towers.shrunken.shrunken_config`: same tower classes, pooling, projection
  kinds, tokenizer kind and cleaning, context length and patch size; fewer and narrower
  layers, a small image; Hugging Face tokenizers and text configs replaced by local
  stand-ins of the same kind), every registered method in its training-free suite scores
  one image-caption pair, its scores finite and, for the plan methods, a finite phrase
  heatmap on the patch grid.
* ``views``: the served app (``otviz.ui.app.build_app``) with the shrunken instance in its
  checkpoint picker, each view's endpoint called through ``gradio_client`` on one upload
  and caption (Align, its phrase change, Words, Anchors and anchor maps, Phrases & regions,
  Probe, Zero-shot on a few world images, Browse on a few world images): "n/n" when all
  answer without an error. The Train view is covered by the test suite
  (``tests/towers/test_non_vit_heads.py``), not here.
* ``explainers``: every registered explainer (:mod:`otviz.explainers`) on one pair with
  the shrunken instance, through :func:`otviz.explainers.explain_pairs` (the grounding
  table's call): the names of those whose map is finite and on the patch grid, then, after
  ``n/a:``, those that say they cannot read the tower; an error would be listed as one.
* ``encode ms`` (second table): one image and one caption through ``Backbone.encode`` at
  the family representative's native resolution, full size, random init, 2 CPU threads,
  median of 3 after one warm-up; beside it each explainer's map of one image-phrase pair on
  the same model (its phrase encoding included), median of 3 after one warm-up, "n/a" where
  it cannot read the tower.

Usage: ``python benchmarks/open_clip_coverage.py [--models RN50 ViT-B-16 ...] [--no-views]
[--no-timing] [--merge]``; writes ``benchmarks/open_clip_coverage.json`` and ``.md``
(``--merge``: the columns this run makes replace those of its models' rows in them; the
other columns and rows are kept).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import tempfile
import time
import traceback
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import open_clip
import torch
from PIL import Image

from otviz.backbone import Backbone
from otviz.backbone_spec import BackboneSpec
from otviz.explain import Explainer
from otviz.explainers import EXPLAINERS, explain_pairs, unavailable
from otviz.suite import SCORED_METHODS, MethodSuite
from otviz.tiny_clip.model import register_tiny_clip
from otviz.towers import image_tower, text_tower
from otviz.towers.shrunken import (
    hf_model_type,
    local_hf_tokenizer,
    register_shrunken,
)

OUT = Path(__file__).resolve().parent / "open_clip_coverage"
CAPTION = "A small red circle to the left of a blue square."
#: One architecture per family for the encoding cost (the base size of each).
TIMED = ["ViT-B-16", "coca_ViT-B-32", "RN50", "ViT-B-16-SigLIP", "EVA02-B-16",
         "convnext_base_w", "ViTamin-S", "MobileCLIP2-S0", "xlm-roberta-base-ViT-B-32"]
#: View endpoints called per architecture, in the page's order.
VIEWS = ["align", "align_phrase", "words", "anchors", "anchor_maps", "phrases", "probe",
         "zero_shot", "browse"]
#: Endpoint parameters set by label: a few world images instead of the page's defaults, the
#: phrase of the phrase change typed as words.
INPUTS = {"World images (1-500)": 4, "Number of world images": 8,
          "Phrase (a word or a parse-tree phrase; or type words)": "red circle"}
#: Architectures served by one app at a time (bounds the memory of loaded backbones).
APP_BATCH = 12

COLUMNS = {
    "loads": "the full-size architecture builds with open_clip on the meta device and both "
             "towers have an otviz adapter (stand-in text config: a Hugging Face text "
             "tower's hub config replaced by the default config of its model_type)",
    "params": "parameters of that meta instance, millions (fp32 GB: 4 bytes each)",
    "methods": "every registered method, training-free, on one pair with the shrunken "
               "random-init instance (same towers, pooling, tokenizer kind; fewer, narrower "
               "layers): finite scores and phrase heatmaps",
    "views": "the served app's view endpoints answered without an error, on the shrunken "
             "instance (Align, phrase change, Words, Anchors, anchor maps, Phrases & "
             "regions, Probe, Zero-shot, Browse)",
    "explainers": "every registered explainer on one image-phrase pair with the shrunken "
                  "instance, through the call the grounding table makes: the ones that read "
                  "the tower give a finite map on the patch grid (listed), the others their "
                  "'not available' note (after 'n/a:'); any error is listed as such",
}


def _image() -> np.ndarray:
    return (np.random.default_rng(0).random((180, 240, 3)) * 255).astype(np.uint8)


def describe(model: torch.nn.Module, cfg: dict[str, Any]) -> dict[str, str]:
    """The tag's families in words: image tower (with its pooling), text tower, tokenizer."""
    visual, text_cfg = model.visual, cfg["text_cfg"]
    kind = type(visual).__name__
    if kind == "VisionTransformer":
        pool = ("attention pool" if visual.attn_pool is not None
                else {"tok": "class token", "avg": "mean"}.get(visual.pool_type, visual.pool_type))
        image = f"open_clip ViT ({pool})"
    elif kind == "TimmModel":
        trunk = visual.trunk
        pool = getattr(trunk, "global_pool", "") or cfg["vision_cfg"].get("timm_pool", "")
        image = f"timm {type(trunk).__name__} ({pool or 'no pool'})"
    else:
        image = kind
    if text_cfg.get("hf_model_name"):
        text = f"Hugging Face {hf_model_type(text_cfg['hf_model_name'])}"
    else:
        text = "open_clip transformer"
    tok = text_cfg.get("hf_tokenizer_name")
    return {"image_family": image, "text_family": text,
            "tokenizer": f"Hugging Face ({tok})" if tok else "open_clip BPE"}


def register_offline_full(name: str, hf_dir: Path) -> tuple[str, bool]:
    """Register ``name``'s full-size config as ``otviz-full-<name>`` with what lives on the
    hub replaced locally: a Hugging Face tokenizer by a stand-in of its kind, a Hugging Face
    text tower's config by its ``model_type``'s default config (untrained). Returns the
    name and whether the text config was replaced."""
    cfg = open_clip.get_model_config(name)
    text_cfg = cfg["text_cfg"]
    if text_cfg.get("hf_tokenizer_name"):
        text_cfg["hf_tokenizer_name"] = str(
            local_hf_tokenizer(hf_dir, text_cfg["hf_tokenizer_name"]))
    stand_in = bool(text_cfg.get("hf_model_name"))
    if stand_in:
        from transformers import AutoConfig

        model_type = hf_model_type(text_cfg["hf_model_name"])
        folder = hf_dir / f"default-{model_type}"
        AutoConfig.for_model(model_type).save_pretrained(folder)
        text_cfg.update(hf_model_name=str(folder), hf_model_pretrained=False)
    return register_tiny_clip(cfg, name=f"otviz-full-{name}"), stand_in


def meta_check(name: str, hf_dir: Path) -> dict[str, Any]:
    """Build the full architecture on the meta device; families, adapters, parameters."""
    full, stand_in = register_offline_full(name, hf_dir)
    with torch.device("meta"):
        model = open_clip.create_model(full, pretrained=None, pretrained_text=False,
                                       device="meta")
    image_tower(model), text_tower(model)  # an unknown family raises with the known ones
    params = sum(p.numel() for p in model.parameters())
    return {**describe(model, open_clip.get_model_config(name)),
            "loads": "yes, stand-in text config" if stand_in else "yes",
            "params_m": round(params / 1e6, 1), "fp32_gb": round(params * 4 / 2**30, 2)}


def methods_check(name: str, hf_dir: Path) -> dict[str, Any]:
    """Every method on the shrunken instance (see :data:`COLUMNS`)."""
    shrunk = register_shrunken(name, hf_dir)
    torch.manual_seed(0)
    bb = BackboneSpec(model=shrunk).load()
    suite = MethodSuite.training_free(bb, ["a red circle", "a blue square", "a dog"])
    explainer = Explainer(bb)
    encoded = explainer.encode(_image(), CAPTION)
    runs = explainer.align(encoded, suite, list(SCORED_METHODS))
    select = encoded.token_select([3])
    ok = []
    for method, run in runs.items():
        a = run.alignment
        finite = bool(torch.isfinite(torch.cat([a.local_score, a.global_score])).all())
        if method != "global_only":
            finite &= bool(torch.isfinite(a.heatmap(select)).all())
        ok.append(finite)
    return {"methods": f"{sum(ok)}/{len(ok)}", "shrunk_name": shrunk,
            **explainers_check(bb),
            "shrunk": f"grid {bb.grid[0]}x{bb.grid[1]}, widths {bb.patch_dim}/{bb.token_dim}, "
                      f"embed {bb.embed_dim}"}


def explainers_check(bb: Backbone) -> dict[str, Any]:
    """Every explainer on one pair (see :data:`COLUMNS`): which ran, which are not
    available for the tower, which failed."""
    ran, not_available, failed = [], [], []
    for name in EXPLAINERS:
        if unavailable(bb, name) is not None:
            not_available.append(name)
            continue
        try:
            maps = explain_pairs(bb, name, [_image()], ["a blue square"]).maps
            good = maps.shape == (1, bb.grid[0] * bb.grid[1]) and bool(torch.isfinite(maps).all())
            (ran if good else failed).append(name if good else f"{name}: not finite / grid")
        except Exception as e:  # the reason goes in the table
            failed.append(f"{name}: {type(e).__name__}: {str(e)[:120]}")
    text = ", ".join(ran) + (f"; n/a: {', '.join(not_available)}" if not_available else "")
    return {"explainers": text + (f"; FAILED {'; '.join(failed)}" if failed else ""),
            "explainers_ran": ran, "explainers_failed": failed}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def views_check(names: list[str], work: Path) -> dict[str, str]:
    """Each view endpoint of one served app holding the shrunken ``names`` (already
    registered by :func:`methods_check`)."""
    from gradio_client import Client, handle_file

    from otviz.suite import WORLD_FIT_CAPTIONS
    from otviz.ui.app import build_app, serve_options
    from otviz.ui.context import SEPARATOR, AppContext, BackboneChoice
    from otviz.ui.train_jobs import TrainingJobs

    choices = [BackboneChoice(n, lambda n=n: BackboneSpec(model=n).load(),
                              WORLD_FIT_CAPTIONS, n) for n in names]
    ctx = AppContext(choices)
    app = build_app(ctx, TrainingJobs(ctx, work / "runs", work / "features"))
    app.launch(server_name="127.0.0.1", server_port=_free_port(), prevent_thread_lock=True,
               quiet=True, ssr_mode=False, **serve_options(app))
    image = work / "upload.png"
    Image.fromarray(_image()).save(image)
    out = {}
    try:
        client = Client(app.local_url, verbose=False)
        api = client.view_api(return_format="dict", print_info=False)["named_endpoints"]
        for name in names:
            checkpoint = next(c for c in ctx.checkpoint_choices()
                              if c.split(SEPARATOR)[0] == name)  # its training-free entry
            failed = []
            for view in VIEWS:
                kwargs = {}
                for p in api[f"/{view}"]["parameters"]:
                    label = p["label"]
                    if label == "Image":
                        kwargs[p["parameter_name"]] = handle_file(str(image))
                    elif label == "Caption":
                        kwargs[p["parameter_name"]] = CAPTION
                    elif label == "Checkpoint":
                        kwargs[p["parameter_name"]] = checkpoint
                    elif label in INPUTS:
                        kwargs[p["parameter_name"]] = INPUTS[label]
                    elif not p["parameter_has_default"]:
                        kwargs[p["parameter_name"]] = None
                try:
                    result = client.predict(**kwargs, api_name=f"/{view}")
                    values = result if isinstance(result, tuple) else (result,)
                    if all(v is None for v in values):
                        failed.append(f"{view}: empty")
                except Exception as e:  # the page's message (gr.Error) or a server error
                    failed.append(f"{view}: {str(e)[:160]}")
            out[name] = (f"{len(VIEWS) - len(failed)}/{len(VIEWS)}"
                         + ("" if not failed else " (" + "; ".join(failed) + ")"))
    finally:
        app.close()
    return out


def encode_cost(name: str, hf_dir: Path) -> dict[str, Any]:
    """Full-size random-init ``name`` at its native resolution (Hugging Face tokenizer and
    text config: local stand-ins); median ``encode`` ms of one pair."""
    full, _ = register_offline_full(name, hf_dir)
    torch.manual_seed(0)
    bb = BackboneSpec(model=full).load()
    image = _image()
    bb.encode([image], [CAPTION])  # warm-up
    times = []
    for _ in range(3):
        start = time.perf_counter()
        bb.encode([image], [CAPTION])
        times.append(1000 * (time.perf_counter() - start))
    size = bb.image_tower.image_size
    return {"model": name, **describe(bb.model, open_clip.get_model_config(name)),
            "image_px": f"{size[0]}x{size[1]}", "grid": f"{bb.grid[0]}x{bb.grid[1]}",
            "encode_ms": round(statistics.median(times), 1),
            "explainer_ms": {e: explainer_cost(bb, e) for e in EXPLAINERS}}


def explainer_cost(bb: Backbone, name: str) -> float | None:
    """Median ms of the explainer ``name``'s map of one image-phrase pair (its text encoding
    included, as the grounding table pays it), 3 runs after a warm-up; ``None`` where it
    cannot read the tower."""
    if unavailable(bb, name) is not None:
        return None
    pair = [_image()], ["a blue square"]
    explain_pairs(bb, name, *pair)  # warm-up (Grad-CAM's and timm traces' private copy)
    times = []
    for _ in range(3):
        start = time.perf_counter()
        explain_pairs(bb, name, *pair)
        times.append(1000 * (time.perf_counter() - start))
    return round(statistics.median(times), 1)


def run(models: list[str], views: bool, timing: bool) -> dict[str, Any]:
    tags: dict[str, list[str]] = defaultdict(list)
    for model, tag in open_clip.list_pretrained():
        tags[model].append(tag)
    work = Path(tempfile.mkdtemp(prefix="otviz-coverage-"))
    hf_dir = work / "hf"
    per_model: dict[str, dict[str, Any]] = {}
    for name in models or sorted(tags):
        row: dict[str, Any] = {"tags": tags.get(name, [])}
        for column, check in (("loads", meta_check), ("methods", methods_check)):
            try:
                row.update(check(name, hf_dir))
            except Exception as e:  # the reason goes in the table
                row[column] = f"no: {type(e).__name__}: {str(e)[:200]}"
                row["error"] = traceback.format_exc(limit=-2)[-600:]
                break
        per_model[name] = row
        print(name, row.get("loads"), row.get("methods"), flush=True)
    if views:
        runnable = [n for n, r in per_model.items() if "shrunk_name" in r]
        for s in range(0, len(runnable), APP_BATCH):
            batch = runnable[s : s + APP_BATCH]
            shrunk = views_check([per_model[n]["shrunk_name"] for n in batch], work)
            for n in batch:
                per_model[n]["views"] = shrunk[per_model[n]["shrunk_name"]]
                print(n, "views", per_model[n]["views"], flush=True)
    costs = []
    if timing:
        torch.set_num_threads(2)
        for name in TIMED:
            if not models or name in models:
                costs.append(encode_cost(name, hf_dir))
                print(costs[-1], flush=True)
    return {
        "machine": {"cpu": platform.processor() or platform.machine(),
                    "threads_for_timing": 2, "torch": torch.__version__,
                    "open_clip": open_clip.__version__, "load_avg": os.getloadavg()},
        "columns": COLUMNS,
        "models": per_model,
        "encoding_cost": costs,
    }


def summary(result: dict[str, Any]) -> dict[str, Any]:
    rows = [(m, r) for m, r in result["models"].items() if r["tags"]]
    n_tags = sum(len(r["tags"]) for _, r in rows)

    def tags_where(pred) -> int:
        return sum(len(r["tags"]) for _, r in rows if pred(r))

    full = tags_where(lambda r: str(r.get("loads", "")).startswith("yes")
                      and r.get("methods") == f"{len(SCORED_METHODS)}/{len(SCORED_METHODS)}"
                      and str(r.get("views", "")).startswith(f"{len(VIEWS)}/{len(VIEWS)}"))
    return {"architectures": len(rows), "tags": n_tags,
            "tags_loading": tags_where(lambda r: str(r.get("loads", "")).startswith("yes")),
            "tags_all_methods": tags_where(lambda r: r.get("methods") == (
                f"{len(SCORED_METHODS)}/{len(SCORED_METHODS)}")),
            "tags_all_views": tags_where(lambda r: str(r.get("views", "")).startswith(
                f"{len(VIEWS)}/{len(VIEWS)}")),
            "tags_everything": full,
            "tags_explainer_errors": tags_where(lambda r: bool(r.get("explainers_failed"))),
            "tags_per_explainer": {e: tags_where(lambda r, e=e: e in r.get("explainers_ran", []))
                                   for e in EXPLAINERS}}


def _ms(value: float | str | None) -> str:
    """A table cell of an explainer's ms: "n/a" where it cannot read the tower."""
    return "n/a" if value is None else str(value)


def markdown(result: dict[str, Any]) -> str:
    s = result["summary"]
    lines = [
        "# open_clip coverage",
        "",
        f"open_clip {result['machine']['open_clip']}, torch {result['machine']['torch']}; "
        "random init, nothing downloaded. Made by `benchmarks/open_clip_coverage.py`.",
        "",
        f"**{s['tags_everything']} of {s['tags']} pretrained tags** ({s['architectures']} "
        f"architectures) load, run all {len(SCORED_METHODS)} methods and render all "
        f"{len(VIEWS)} view endpoints; {s['tags_loading']} load, {s['tags_all_methods']} run "
        f"every method, {s['tags_all_views']} render every view.",
        "",
        "Explainers, tags whose tower each one reads (and gives a finite map on): "
        + ", ".join(f"{EXPLAINERS[e].label} {n}" for e, n in s["tags_per_explainer"].items())
        + f" of {s['tags']}; tags where an explainer failed: {s['tags_explainer_errors']}.",
        "",
        "## Columns",
        "",
        *[f"* **{k}**: {v}" for k, v in result["columns"].items()],
        "",
        "## Encoding and explainer cost per family",
        "",
        "One image and one caption through `Backbone.encode`, full size, random init, native "
        "resolution, 2 CPU threads, median of 3 (ms); each explainer's map of one "
        "image-phrase pair on the same model (its phrase encoding included), median of 3.",
        "",
        "| model | image tower | text tower | tokenizer | image | grid | encode ms | "
        + " | ".join(f"{EXPLAINERS[e].label} ms" for e in EXPLAINERS) + " |",
        "|---|---|---|---|---|---|---:|" + "---:|" * len(EXPLAINERS),
        *[f"| {c['model']} | {c['image_family']} | {c['text_family']} | {c['tokenizer']} | "
          f"{c['image_px']} | {c['grid']} | {c['encode_ms']} | "
          + " | ".join(_ms(c.get("explainer_ms", {}).get(e, "")) for e in EXPLAINERS) + " |"
          for c in result["encoding_cost"]],
        "",
        "## Every pretrained tag",
        "",
        "| architecture | tags | image tower | text tower | tokenizer | loads | params M | "
        "fp32 GB | methods | views | explainers |",
        "|---|---|---|---|---|---|---:|---:|---|---|---|",
    ]
    for name, r in result["models"].items():
        if not r["tags"]:
            continue
        lines.append(
            f"| {name} | {', '.join(r['tags'])} | {r.get('image_family', '')} | "
            f"{r.get('text_family', '')} | {r.get('tokenizer', '')} | {r.get('loads', '')} | "
            f"{r.get('params_m', '')} | {r.get('fp32_gb', '')} | {r.get('methods', '')} | "
            f"{r.get('views', '')} | {r.get('explainers', '')} |".replace("\n", " "))
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="*", default=[], help="default: every tagged one")
    parser.add_argument("--no-views", action="store_true")
    parser.add_argument("--no-timing", action="store_true")
    parser.add_argument("--out", default=str(OUT), help="path without suffix")
    parser.add_argument("--merge", action="store_true",
                        help="update the columns this run makes (and the timing, if run) in "
                             "the existing output instead of replacing it")
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = Path(args.out)
    result = run(args.models, not args.no_views, not args.no_timing)
    if args.merge and out.with_suffix(".json").exists():
        old = json.loads(out.with_suffix(".json").read_text())
        merged = {m: {**old["models"].get(m, {}), **r} for m, r in result["models"].items()}
        result["models"] = dict(sorted({**old["models"], **merged}.items()))
        result["encoding_cost"] = result["encoding_cost"] or old["encoding_cost"]
    result["summary"] = summary(result)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(result))
    print(json.dumps(result["summary"]))


if __name__ == "__main__":
    main()
