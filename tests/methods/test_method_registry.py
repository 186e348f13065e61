"""A method is one class plus one registry line: a toy method defined here, registered with
one ``METHODS`` entry, trains, is evaluated, benchmarked and offered by the app with no other
edit; and no module outside ``otviz.methods`` tests a method's name (they ask the class)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from otviz.backbone import Backbone
from otviz.bench import config as bench_config
from otviz.bench import runners
from otviz.eval.alignment_tables import grounding_table
from otviz.eval.world_set import EvalSet
from otviz.methods import METHODS
from otviz.methods.base import (
    Alignment,
    AlignmentMethod,
    MethodConfig,
    PairBatch,
    Projection,
    register,
)
from otviz.methods.projected import dense_plan_alignment, masked_similarity
from otviz.suite import ALIGN_METHODS, METHOD_LABELS, WORLD_FIT_CAPTIONS, MethodSuite
from otviz.train.config import paper_recipe
from otviz.train.loop import train_method
from otviz.train.losses import LOCAL_CONTRASTIVE, local_objective
from otviz.train.pairs import TensorPairs
from otviz.ui import train_tab
from otviz.ui.align import layout as align_layout
from tests.helpers import ROOT, random_tiny_clip, tiny_train_config


class ToyMethod(AlignmentMethod):
    """Softmax attention of each token over the patches, scored by Eq. 8 on its plan."""

    name = "toy"
    label = "Toy"

    def __init__(self, patch_dim: int, token_dim: int, config: MethodConfig | None = None):
        super().__init__(patch_dim, token_dim, config)
        dim = self.config.concept_dim if self.config.trainable else patch_dim
        self.proj_v = Projection(patch_dim, dim, self.config.trainable)
        self.proj_t = Projection(token_dim, dim, self.config.trainable)

    def align(self, batch: PairBatch) -> Alignment:
        z, y = self.proj_v(batch.patches), self.proj_t(batch.tokens)
        sim = masked_similarity(z, y, batch, fill=-float("inf"))
        attention = torch.softmax(sim / 0.1, dim=1).nan_to_num(0.0)  # [B, N, M] over patches
        plan = attention * batch.token_mask[:, None, :] / batch.token_mask.sum(1)[:, None, None]
        return dense_plan_alignment(batch, plan, sim.nan_to_num(0.0, neginf=0.0), None, None,
                                    None)


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setitem(METHODS, ToyMethod.name, ToyMethod)  # the one registry line
    return ToyMethod.name


def test_a_name_taken_twice_is_refused() -> None:
    first = METHODS["filip"]

    class Twin(ToyMethod):
        name = "filip"

    with pytest.raises(ValueError, match=r"method 'filip' is registered twice: "
                                         r"otviz\.methods\.filip\.Filip and .*Twin"):
        register(Twin)
    assert METHODS["filip"] is first


def test_toy_method_trains(toy: str, tmp_path: Path) -> None:
    config = tiny_train_config(tmp_path, method=toy, max_steps=3)
    assert config.method_config().eps == MethodConfig().eps  # the shared solver settings
    assert local_objective(toy) == LOCAL_CONTRASTIVE and paper_recipe(config).epochs == 8
    result = train_method(config, source=TensorPairs.random(8, seed=1))
    assert result.status == "finished" and len(result.history) == 3
    assert all(torch.isfinite(torch.tensor(h["local"])) for h in result.history)


def test_toy_method_is_evaluated(toy: str, tmp_path: Path) -> None:
    backbone = Backbone.from_checkpoint(random_tiny_clip(tmp_path / "bb", 0))
    suite = MethodSuite.training_free(backbone, WORLD_FIT_CAPTIONS[:10])
    assert list(suite.methods)[-1] == toy  # every registered method, the toy last
    data = EvalSet.build(backbone, 2, "test", 0, str(tmp_path / "cache"))
    only = MethodSuite(backbone, {toy: suite.methods[toy]}, "toy")
    rows = grounding_table(only, data, chunk=4).rows
    assert [r["method"] for r in rows if not r.get("baseline")] == ["Toy"]


def test_toy_method_is_benchmarked(toy: str) -> None:
    assert toy in runners.benchmarked_methods(bench_config.BenchConfig())
    cfg = bench_config.BenchConfig(methods=(toy,), ns=(16,), ms=(4,), ranks=(3,), pairs=2,
                            backward_pairs=2, repeats=1, pot=False, train_step=False,
                            shared=False)
    rows = [r for r in runners.run_benchmark(cfg)["rows"] if r["kind"] == "method"]
    assert rows and all(r["method"] == toy and r["status"] == "ok" for r in rows)


def test_toy_method_is_offered_by_the_app(toy: str) -> None:
    assert list(ALIGN_METHODS)[-1] == toy and METHOD_LABELS[toy] == "Toy"
    assert ("Toy", toy) in align_layout.method_choices()
    assert ("Toy", toy) in train_tab.method_choices()


def _name_tests(names: list[str]) -> re.Pattern[str]:
    """A comparison with a method name literal, or membership in a literal collection of
    them: ``x == "powerclip"``, ``"qc_align" != x``, ``x in ("a", "qc_align")``."""
    name = "|".join(re.escape(n) for n in names)
    quoted = rf"""["'](?:{name})["']"""
    member = rf"\bin\s*[(\[{{][^)\]}}]*{quoted}"
    return re.compile(rf"(?:==|!=)\s*{quoted}|{quoted}\s*(?:==|!=)|{member}")


def test_no_module_outside_the_methods_tests_a_method_name() -> None:
    pattern = _name_tests(sorted(METHODS))
    sources = [p for p in (ROOT / "otviz").rglob("*.py") if "methods" not in p.parts]
    offenders = [
        f"{path.relative_to(ROOT)}:{k}: {line.strip()}"
        for path in [*sources, ROOT / "app.py"]
        for k, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert offenders == []


def test_the_name_pattern_catches_the_usual_forms() -> None:
    pattern = _name_tests(["qc_align", "powerclip"])
    for line in ('if config.method == "powerclip":', "if 'qc_align' != name:",
                 'names = [n for n in x if n not in ("powerclip", "qc_align")]'):
        assert pattern.search(line), line
    assert not pattern.search('DEFAULT_METHOD = "powerclip"')
