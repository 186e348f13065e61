"""The "Phrases & regions" view: PowerCLIP's alignment of parse-tree nodes with region-mask
subsets (PowerCLIP Eq. 1-16).

The caption's constituency tree (and which parser made it) with a picker of its phrase
nodes; the region masks on the image; the picked node's best-matching region subset (exact
``argmax_A Q_{A,B}`` by enumeration, and PowerCLIP's own soft membership); and the exact
T2R / R2T aggregations next to their NLA approximations on the same region-node scores.

Callbacks are plain functions of plain values (testable without a browser); the builder
only wires them to components.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr
import numpy as np
from matplotlib.figure import Figure
from torch import Tensor

from otviz.explain import REGION_KINDS, InputError
from otviz.methods.powerclip import PowerCLIP
from otviz.methods.powerclip_readout import powerset_readout
from otviz.text.parse import phrase_nodes
from otviz.text.tree import Tree
from otviz.ui.context import AppContext, SharedInputs
from otviz.ui.downloads import PendingDownloads
from otviz.ui.events import offer_downloads, on_edit
from otviz.ui.inputs import user_errors
from otviz.ui.plots import FigurePlot
from otviz.viz.regions import best_subset_figure, regions_figure
from otviz.viz.trees import tree_figure

HOW_TO_READ = """**How to read this view.** PowerCLIP (PowerSet alignment) scores an image
against a caption by matching *sets* of image regions with the *phrases* of the caption's
parse tree. **Tree**: every phrase node (pick one in the list) is one phrase B; the
highlighted box and its subtree are the picked node. **Regions**: the masks the image is cut
into (grid cells, 5-15 seeded random boxes as in the paper, or SLIC superpixels), numbered.
**Best regions**: for the picked phrase, the region subset A that maximises the score
Q(A, B) (left: exact, by enumerating all 2^M subsets; it is the set of regions with a
positive score, Corollary 1), PowerCLIP's soft version (middle: bright = in the subset), and
the phrase's map (right): the similarity of the phrase to each patch (the paper's Fig. 6)
on the regions of its subset, so two phrases give two maps. **Table**: the exact
tree-to-regions (T2R) and regions-to-tree (R2T) aggregations, computed by enumerating the
powerset, next to the linear-time approximations PowerCLIP trains with (NLA-T1 and NLA-T2).
NLA-T1 is never below T2R and exceeds it by at most tau * M * log 2 (Theorem 1); R2T lies
between Lambda(0) and Lambda(1) (Eq. 78), which NLA-T2 interpolates with alpha. **Per node**:
the exact best subset A* and its score Q(A*, B), the method's own best-subset score (NLA;
exact in exact mode), and its soft members (membership sigmoid(q / tau) above 0.5)."""

BENEPAR_NOTE = (
    "benepar's model (benepar_en3) is not installed here, so the built-in chunker made the "
    "tree (it reproduces the synthetic world's gold trees exactly; ordinary captions get "
    "NP / PP / VP chunks). A Space can fetch benepar_en3 at start-up with "
    "`otviz.text.parse.try_download_benepar()`."
)
SUMMARY_HEADERS = ["aggregation", "exact", "approximation", "approx. value", "approx. - exact",
                   "guarantee"]
NODE_HEADERS = ["node", "label", "words", "exact A*", "Q(A*, B)", "method score",
                "soft members"]
#: Widths that keep every column in view at the app's width (the words wrap).
NODE_WIDTHS = ["6%", "6%", "38%", "14%", "10%", "10%", "16%"]
MAX_TAU = 10.0


def node_label(node: Tree) -> str:
    """Picker text of a phrase node: ``"NP: a red circle"`` (cut at 60 characters)."""
    text = f"{node.label}: {node.span_text()}"
    return text if len(text) <= 60 else text[:59] + "…"


def summary_rows(s: dict[str, float | None]) -> list[list]:
    """The exact-vs-NLA table of :func:`otviz.methods.powerclip_readout.powerset_summary`
    ("n/a" where not enumerated)."""

    def num(x: float | None):
        return "n/a" if x is None else round(x, 6)

    def diff(a: float, b: float | None):
        return "n/a" if b is None else round(a - b, 6) + 0.0  # no "-0.0"

    total = None if s["t2r"] is None else s["t2r"] + s["r2t"]
    bracket = (
        "n/a" if s["lambda0"] is None
        else f"Lambda(0) = {s['lambda0']:.4g} <= R2T <= Lambda(1) = {s['lambda1']:.4g} (Eq. 78)"
    )
    return [
        ["T2R (Eq. 7)", num(s["t2r"]), "NLA-T1 (Eq. 14)", num(s["nla_t1"]),
         diff(s["nla_t1"], s["t2r"]),
         f"0 <= error <= tau M log 2 = {s['t1_bound']:.4g} (Theorem 1)"],
        ["R2T (Eq. 6, 42)", num(s["r2t"]), "NLA-T2 (Eq. 15)", num(s["nla_t2"]),
         diff(s["nla_t2"], s["r2t"]), bracket],
        ["T2R + R2T", num(total), "S = NLA-T1 + NLA-T2 (Eq. 16)",
         num(s["nla_t1"] + s["nla_t2"]), diff(s["nla_t1"] + s["nla_t2"], total), ""],
    ]


@dataclass
class PhrasesView:
    """Everything the view shows for one pair, region kind and picked node."""

    parser: str
    nodes: list[Tree]  # phrase_nodes of the tree, PowerCLIP's node order
    choices: list[tuple[str, int]]  # picker entries of the nodes that kept a token
    node: int  # the picked node (index into ``nodes``)
    regions: np.ndarray  # [R, N] bool region masks
    q: np.ndarray  # [R, K] region-node scores
    exact_best: np.ndarray | None  # [K, R] bool exact best subsets (None above 12 regions)
    soft_best: np.ndarray  # [K, R] the method's memberships (extras["node_best_regions"])
    summary: dict[str, float | None]
    summary_table: list[list]
    node_table: list[list]
    tree_figure: Figure
    regions_figure: Figure
    subset_figure: Figure
    parser_note: str
    files: PendingDownloads  # written once the view is shown


def phrases_view(
    ctx: AppContext,
    checkpoint: str,
    image,
    caption: str | None,
    regions: str = "grid",
    node: int | None = None,
    tau: float | None = None,
) -> PhrasesView:
    """Run PowerCLIP on the pair with ``regions`` masks (cached) and assemble the view for
    phrase node ``node`` (default: the first); ``tau`` (default: the method's) sets the
    temperature of the NLA column of the exact-vs-NLA table."""
    if regions not in REGION_KINDS:
        raise InputError(f"unknown region kind {regions!r}; choose one of {REGION_KINDS}")
    explainer = ctx.explainer(checkpoint)
    suite = ctx.suite(checkpoint)
    name = next((n for n, e in suite.methods.items() if isinstance(e.method, PowerCLIP)), None)
    if name is None:
        raise InputError(f"the checkpoint {checkpoint!r} has no PowerCLIP method")
    method = suite.methods[name].method
    tau = method.tau if tau is None else float(tau)
    if not 0.0 < tau <= MAX_TAU:
        raise InputError(f"tau must be in (0, {MAX_TAU}], got {tau}")
    encoded = explainer.encode(image, caption)
    run = explainer.align(encoded, suite, [name], regions)[name]
    readout = powerset_readout(run.alignment, tau, method.alpha)
    nodes = phrase_nodes(encoded.parse.tree)
    node_mask = readout.node_mask
    choices = [(node_label(n), k) for k, n in enumerate(nodes) if bool(node_mask[k])]
    node = choices[0][1] if node is None else int(node)
    if node not in {k for _, k in choices}:
        raise InputError(
            f"no phrase node {node} in this caption: press Show to list its phrases"
        )

    summary, masks, q0 = readout.summary, readout.regions, readout.q
    exact_best, soft_best = readout.exact_best, readout.soft_best
    node_table = _node_rows(nodes, node_mask, q0, exact_best, soft_best, readout.best_score)

    parser = encoded.parse.parser
    soft_label = (
        "PowerCLIP (exact mode)" if method.exact
        else f"PowerCLIP's NLA membership sigmoid(q / tau), tau = {method.tau:g}"
    )
    tree_fig = tree_figure(
        encoded.parse.tree, nodes[node], title=f"Constituency tree ({parser} parser)"
    )
    regions_fig = regions_figure(
        encoded.image, masks, encoded.geometry, title=f"{len(masks)} regions ({regions})"
    )
    subset_fig = best_subset_figure(
        encoded.image, masks, encoded.geometry,
        None if exact_best is None else exact_best[node], soft_best[node],
        readout.cover[node], readout.phrase_map[node], nodes[node].span_text(), soft_label,
    )
    note = f"Tree made by the **{parser}** parser."
    if parser == "builtin":
        note += " " + BENEPAR_NOTE
    summary_table = summary_rows(summary)

    out = PendingDownloads()
    out.save_figure(tree_fig, "parse_tree")
    out.save_figure(regions_fig, f"regions_{regions}")
    out.save_figure(subset_fig, f"best_regions_node{node}")
    out.save_array(q0, "region_node_scores", columns=[node_label(n) for n in nodes])
    out.save_array(masks.astype(np.uint8), f"region_masks_{regions}")
    out.save_array(readout.phrase_map[node].reshape(encoded.grid), f"phrase_map_node{node}")
    out.save_json(
        {
            "caption": encoded.caption,
            "parser": parser,
            "tree": encoded.parse.tree.to_bracket(),
            "nodes": [{"label": n.label, "start": n.start, "end": n.end,
                       "words": n.span_text()} for n in nodes],
            "regions": regions,
            "summary": summary,
            "per_node": [dict(zip(NODE_HEADERS, row, strict=True)) for row in node_table],
        },
        "powerset_scores",
    )
    return PhrasesView(
        parser, nodes, choices, node, masks, q0, exact_best, soft_best, summary, summary_table,
        node_table, tree_fig, regions_fig, subset_fig, note, out,
    )


def _node_rows(
    nodes: list[Tree],
    node_mask: Tensor,
    q: np.ndarray,
    exact_best: np.ndarray | None,
    soft_best: np.ndarray,
    soft_score: np.ndarray,
) -> list[list]:
    """Per valid node: its exact best subset and score ``Q(A*, B) = sum_{m in A*} q_mB``
    next to the method's best-subset score and soft members."""
    rows = []
    for k, n in enumerate(nodes):
        if not bool(node_mask[k]):
            continue
        if exact_best is None:
            subset, score = "n/a", "n/a"
        else:
            chosen = np.flatnonzero(exact_best[k])
            subset = "{" + ", ".join(map(str, chosen)) + "}"
            score = round(float(q[chosen, k].sum()), 6)
        soft = "{" + ", ".join(map(str, np.flatnonzero(soft_best[k] > 0.5))) + "}"
        rows.append([k, n.label, n.span_text(), subset, score, round(float(soft_score[k]), 6),
                     soft])
    return rows


def build_phrases_tab(ctx: AppContext, shared: SharedInputs) -> None:
    """Add the Phrases & regions view to the enclosing ``gr.Blocks`` (inside its tab)."""
    with gr.Row():
        with gr.Column(scale=1):
            kind = gr.Radio(list(REGION_KINDS), value="grid", label="Regions")
            picker = gr.Dropdown(choices=[], label="Phrase node")
            tau = gr.Number(value=None, label="tau of the NLA column (empty or 0: the method's)",
                            minimum=0.0)
            run = gr.Button("Show phrases & regions", variant="primary")
        with gr.Column(scale=2):
            note = gr.Markdown()
    # full width: a long caption's tree stays legible
    tree_plot = FigurePlot(label="Constituency tree", elem_id="phrases-tree")
    with gr.Row():
        regions_plot = FigurePlot(label="Region masks", elem_id="phrases-regions")
        subset_plot = FigurePlot(label="Best-matching regions and map of the phrase")
    # wrapped cells: every column fits the page's width
    summary = gr.Dataframe(headers=SUMMARY_HEADERS, label="Exact powerset vs NLA", wrap=True)
    per_node = gr.Dataframe(headers=NODE_HEADERS, label="Best region subset per node",
                            elem_id="phrases-nodes", wrap=True, column_widths=NODE_WIDTHS)
    files = gr.File(label="Downloads", file_count="multiple", elem_id="phrases-downloads")
    pending = gr.State()
    gr.Markdown(HOW_TO_READ)

    def shown(image, caption: str, checkpoint: str,
              features: str | None, image_size: float | None, regions: str,
              node: int | None, tau: float | None, keep_node: bool):
        # the browser sends an empty number field as 0: both mean "the method's tau"
        view = phrases_view(ctx, ctx.read_as(checkpoint, features, image_size), image,
                            caption, regions, node if keep_node else None, tau or None)
        return (
            gr.Dropdown(choices=view.choices, value=view.node), view.tree_figure,
            view.regions_figure, view.subset_figure, view.summary_table, view.node_table,
            view.parser_note, view.files,
        )

    @user_errors
    def on_show(image, caption: str, checkpoint: str,
                features: str | None, image_size: float | None, regions: str,
                node: int | None, tau: float | None):
        """The click: the caption's phrases from its root (``node`` is not read)."""
        return shown(image, caption, checkpoint, features, image_size, regions, node, tau,
                     keep_node=False)

    @user_errors
    def on_node(image, caption: str, checkpoint: str,
                features: str | None, image_size: float | None, regions: str,
                node: int | None, tau: float | None):
        """An edit: the phrases with the picked ``node`` kept."""
        return shown(image, caption, checkpoint, features, image_size, regions, node, tau,
                     keep_node=True)

    inputs = [shared.image, shared.caption, *shared.backbone, kind, picker, tau]
    outputs = [picker, tree_plot, regions_plot, subset_plot, summary, per_node, note, pending]
    offer_downloads(run.click(on_show, inputs, outputs, api_name="phrases"), pending, files)
    # the node picker's edit is the endpoint that keeps a node; the other edits run it again
    for control, api in ((picker, {"api_name": "phrases_node"}),
                         (kind, {"api_visibility": "private"}),
                         (tau, {"api_visibility": "private"})):
        offer_downloads(on_edit(control, on_node, inputs, outputs, **api), pending, files)
