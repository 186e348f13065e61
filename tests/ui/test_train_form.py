"""The Train form is generated from TrainConfig: its components are the declared fields,
each labelled with the field's name and helped by the same text as ``otviz train --help``,
a dropdown of a ``OneOf`` field's choices, a number box with its rule's floor; every value
a component hands back lands in TrainConfig's field, for any scalar field, so a new box is
one name added to ``FORM_FIELDS``."""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from typing import Any

import gradio as gr
import pytest

from otviz.cli.train import build_parser
from otviz.explain import InputError
from otviz.field_docs import field_rules
from otviz.knobs import HEAD_STARTS, AtLeast, OneOf
from otviz.train.config import TrainConfig
from otviz.ui.train_form import FORM_FIELDS, build_form, config_from_form, form_fields
from otviz.ui.train_policy import app_config, limits

#: Every TrainConfig field a form box can edit (numbers, text, switches, choices).
SCALAR_FIELDS = tuple(f.name for f in dataclasses.fields(TrainConfig)
                      if field_rules(TrainConfig)[f.name][0] in (int, float, str, bool))


def cli_help() -> dict[str, str]:
    """``otviz train --help``'s text of each field's flag, as printed (``%%`` is ``%``)."""
    actions = build_parser()._actions
    return {a.dest: (a.help or "").replace("%%", "%") for a in actions}


def build(names: tuple[str, ...]) -> dict[str, gr.components.Component]:
    with gr.Blocks():
        return build_form(names)


def changed(name: str) -> Any:
    """A value of field ``name`` other than the app's default, within its rule and range."""
    default = getattr(app_config(), name)
    kind, rule = field_rules(TrainConfig)[name]
    if isinstance(rule, OneOf):
        return next(n for n in rule.names if n != default)
    if kind is bool:
        return not default
    if kind in (int, float):
        high = limits()[name].high if name in limits() else None
        value = default + 1 if kind is int else default + 0.25
        return value if high is None or value <= high else default - (1 if kind is int else 0.25)
    return "changed"


def test_the_form_is_the_declared_fields_with_the_command_line_s_help():
    components = build(FORM_FIELDS)
    assert list(components) == [f.name for f in dataclasses.fields(TrainConfig)
                                if f.name in FORM_FIELDS]
    helps, defaults = cli_help(), app_config()
    for name, box in components.items():
        assert box.label == name
        assert box.info == helps[name] and box.info, name
        assert box.value == getattr(defaults, name), name
        kind, rule = field_rules(TrainConfig)[name]
        if isinstance(rule, OneOf):
            assert isinstance(box, gr.Dropdown)
            assert [c[1] for c in box.choices] == list(rule.names)
        elif kind in (int, float):
            assert isinstance(box, gr.Number) and (box.precision == 0) == (kind is int)
            if isinstance(rule, AtLeast):
                assert box.minimum is not None and box.minimum >= rule.low, name
    # the Train tab can start a head from a random projection (towers whose projection is
    # no affine map refuse the backbone start)
    assert [c[1] for c in components["start"].choices] == list(HEAD_STARTS)


@pytest.mark.parametrize("name", SCALAR_FIELDS)
def test_any_field_is_one_name_away_from_the_form(name):
    """A form of just ``name`` builds, helps with the CLI's text, and the value its box
    hands back (the component's own preprocessing) becomes TrainConfig's field."""
    box = build((name,))[name]
    assert box.info == cli_help()[name]
    value = changed(name)
    config = config_from_form({name: box.preprocess(value)})
    assert config == replace(app_config(), **{name: value})
    assert type(getattr(config, name)) is type(value)


def test_the_whole_form_round_trips():
    components = build(FORM_FIELDS)
    values = {name: changed(name) for name in FORM_FIELDS}
    read = {name: box.preprocess(values[name]) for name, box in components.items()}
    assert config_from_form(read) == replace(app_config(), **values)
    assert config_from_form(read).method_config().start == values["start"]


@pytest.mark.parametrize(("value", "message"), [(None, "hard_negatives is empty"),
                                              (float("nan"), "hard_negatives is empty"),
                                              (float("inf"), "must be a finite number")])
def test_a_number_that_is_none_is_a_message(value, message):
    with pytest.raises(InputError, match=message):
        config_from_form({"hard_negatives": value})


def test_a_name_that_is_no_field_is_refused():
    with pytest.raises(ValueError, match="not TrainConfig fields: \\['tau'\\]"):
        form_fields(("eps", "tau"))
