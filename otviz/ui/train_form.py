"""The Train form's recipe, generated from :class:`~otviz.train.config.TrainConfig`: one
component per field of :data:`FORM_FIELDS`, labelled with the field's name, its help the
``otviz train --help`` text of the same field (:func:`otviz.field_docs.field_docs`: the
comment beside the field), grouped under the same sections, a dropdown for a ``OneOf``
field, a number box bounded by its ``AtLeast`` rule and this server's range
(:func:`otviz.ui.train_policy.limits`), a checkbox for a switch, a text box otherwise.

The values come back by name and become a ``TrainConfig`` directly
(:func:`config_from_form`): a new box on the form is one name added to
:data:`FORM_FIELDS`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, replace
from typing import Any

import gradio as gr

from otviz.explain import InputError
from otviz.field_docs import Rule, field_docs, field_rules
from otviz.knobs import AtLeast, OneOf
from otviz.train.config import TrainConfig
from otviz.ui.train_policy import app_config, limits

#: The TrainConfig fields the Train form shows; they appear in TrainConfig's order, under
#: its sections (the method and the data source have their own components).
FORM_FIELDS = (
    "n_train", "split",
    "epochs", "max_steps", "batch_size", "lr",
    "eps", "tau_v", "tau_t", "n_iters", "rank", "concept_dim", "start", "start_rank",
    "lambda_local", "tau_local", "hard_negatives",
)


@dataclass(frozen=True)
class FormField:
    """What the form shows for one TrainConfig field."""

    name: str
    kind: type  # int, float, str or bool
    rule: Rule | None
    help: str
    section: str
    default: Any
    low: float | None  # the number's floor (the field's rule and this server's range)
    high: float | None


def form_fields(names: tuple[str, ...] = FORM_FIELDS) -> list[FormField]:
    """The :class:`FormField` of each of ``names``, in TrainConfig's order."""
    unknown = set(names) - {f.name for f in dataclasses.fields(TrainConfig)}
    if unknown:
        raise ValueError(f"not TrainConfig fields: {sorted(unknown)}")
    docs, rules, ranges, defaults = (field_docs(TrainConfig), field_rules(TrainConfig),
                                     limits(), app_config())
    out = []
    for f in dataclasses.fields(TrainConfig):
        if f.name not in names:
            continue
        kind, rule = rules[f.name]
        allowed = ranges.get(f.name)
        floors = [x for x in (rule.low if isinstance(rule, AtLeast) else None,
                              allowed.low if allowed else None) if x is not None]
        doc = docs[f.name]
        out.append(FormField(f.name, kind, rule, doc.help, doc.section,
                             getattr(defaults, f.name), max(floors) if floors else None,
                             allowed.high if allowed else None))
    return out


def component(spec: FormField) -> gr.components.Component:
    """The component that edits ``spec``'s field."""
    common = {"value": spec.default, "label": spec.name, "info": spec.help}
    if isinstance(spec.rule, OneOf):
        return gr.Dropdown(choices=list(spec.rule.names), **common)
    if spec.kind is bool:
        return gr.Checkbox(**common)
    if spec.kind in (int, float):
        return gr.Number(precision=0 if spec.kind is int else None, minimum=spec.low,
                         maximum=spec.high, **common)
    return gr.Textbox(**common)


def build_form(names: tuple[str, ...] = FORM_FIELDS) -> dict[str, gr.components.Component]:
    """One component per field of ``names``, an accordion per section, two to a row;
    returns them by field name."""
    components: dict[str, gr.components.Component] = {}
    specs = form_fields(names)
    for section in dict.fromkeys(s.section for s in specs):
        group = [s for s in specs if s.section == section]
        with gr.Accordion(section or "other", open=True):
            for k in range(0, len(group), 2):
                with gr.Row():
                    for spec in group[k:k + 2]:
                        components[spec.name] = component(spec)
    return components


def _value(spec: FormField, value: Any) -> Any:
    if spec.kind in (int, float):
        if value is None or value != value:
            raise InputError(f"{spec.name} is empty")
        if not math.isfinite(float(value)):
            raise InputError(f"{spec.name} must be a finite number, got {value}")
        return round(float(value)) if spec.kind is int else float(value)
    if spec.kind is bool:
        return bool(value)
    text = str(value or "").strip()
    return text or spec.default  # an emptied text box: the default


def config_from_form(values: dict[str, Any], base: TrainConfig | None = None) -> TrainConfig:
    """``base`` (default: :func:`~otviz.ui.train_policy.app_config`) with the form's
    ``values`` by field name, each read as its field's type (an empty number is an
    :class:`InputError`). The rules and this server's ranges are checked when the run
    starts (:func:`otviz.ui.train_policy.check_request`)."""
    specs = {s.name: s for s in form_fields(tuple(values))}
    return replace(base or app_config(),
                   **{name: _value(specs[name], v) for name, v in values.items()})
