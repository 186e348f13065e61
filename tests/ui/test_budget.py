"""The server's compute budget (otviz/ui/budget.py): slots across events, a per-visitor cap,
a cost cap checked before the work starts, refusals that say when to try again, estimates
updated from measurements; and the events that use it (Trust panel, Browse's trust sort,
explainers) refuse at once instead of computing."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from otviz.ui import budget as budget_module
from otviz.ui.budget import (
    MIN_RETRY_S,
    SMOOTHING,
    BudgetRefused,
    ComputeBudget,
    CostModel,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_slots_are_shared_by_every_event_and_freed_on_exit():
    clock = Clock()
    budget = ComputeBudget(slots=2, per_visitor=1, max_request_s=100, clock=clock)
    with budget.admit("a", "the trust metrics", 30), budget.admit("b", "training", 50):
        clock.now += 10
        with pytest.raises(BudgetRefused) as refused:
            budget.acquire("c", "sorting by a trust metric", 1)
        # the soonest end: "the trust metrics" started 10 s ago, estimated 30 s
        assert "server is busy" in str(refused.value)
        assert "try again in about 20 s" in str(refused.value)
    assert budget.running() == []
    with budget.admit("c", "sorting by a trust metric", 1):
        pass


def test_a_visitor_gets_one_piece_of_work_at_a_time():
    clock = Clock()
    budget = ComputeBudget(slots=4, per_visitor=1, clock=clock)
    with budget.admit("a", "the trust metrics", 2):
        with pytest.raises(BudgetRefused, match="your previous expensive computation") as e:
            budget.acquire("a", "the explainer maps", 1)
        assert f"try again in about {MIN_RETRY_S} s" in str(e.value)  # the floor
        with budget.admit("b", "the explainer maps", 1):  # another visitor is served
            assert len(budget.running()) == 2


def test_the_cost_cap_is_checked_before_starting_and_names_the_fix():
    budget = ComputeBudget(slots=1, max_request_s=60)
    with pytest.raises(BudgetRefused, match=r"about 61 s .* more than the 60 s .*fewer images"):
        budget.acquire("a", "sorting by a trust metric", 61)
    assert budget.running() == []
    work = budget.acquire("a", "training", 10_000, capped=False)  # bounded by its step cap
    budget.release(work)


def test_a_refusal_in_the_block_frees_nothing_it_did_not_take():
    budget = ComputeBudget(slots=1)
    with budget.admit("a", "x", 1):
        with pytest.raises(BudgetRefused):
            with budget.admit("b", "y", 1):
                pass
        assert [w.visitor for w in budget.running()] == ["a"]


def test_slots_hold_under_concurrent_requests():
    budget = ComputeBudget(slots=3, per_visitor=1)
    admitted, refused, gate = [], [], threading.Barrier(20)

    def ask(k: int) -> None:
        gate.wait()
        try:
            admitted.append(budget.acquire(f"v{k}", "x", 1))
        except BudgetRefused:
            refused.append(k)

    threads = [threading.Thread(target=ask, args=(k,)) for k in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(admitted) == 3 and len(refused) == 17


def test_costs_start_from_the_measured_figures_and_follow_measurements():
    costs = CostModel()
    seeded = budget_module.SEED_MAP_S + budget_module.SEED_METRIC_S["mprt"]
    assert costs.trust(10, ["mprt"]) == pytest.approx(10 * seeded)
    # a measurement of 2 maps: 1000 ms of MPRT and 200 ms drawing the maps
    costs.record_trust({"mprt": 1000.0, "maps": 200.0}, 2)
    mprt = (1 - SMOOTHING) * budget_module.SEED_METRIC_S["mprt"] + SMOOTHING * 0.5
    drawn = (1 - SMOOTHING) * budget_module.SEED_MAP_S + SMOOTHING * 0.1
    assert costs.unit("metric:mprt") == pytest.approx(mprt)
    assert costs.trust(3, ["mprt"]) == pytest.approx(3 * (mprt + drawn))
    costs.record("train_pair", float("nan"))  # ignored
    assert costs.unit("train_pair") == budget_module.SEED_PAIR_STEP_S


def test_the_server_budget_follows_the_space_and_the_environment(monkeypatch):
    monkeypatch.delenv("OTVIZ_EXPENSIVE_SLOTS", raising=False)
    monkeypatch.delenv("OTVIZ_MAX_REQUEST_S", raising=False)
    monkeypatch.setenv("SPACE_ID", "someone/otviz")
    space = ComputeBudget.for_server()
    assert (space.slots, space.max_request_s) == (budget_module.SPACE_SLOTS,
                                                   budget_module.SPACE_MAX_REQUEST_S)
    monkeypatch.delenv("SPACE_ID")
    monkeypatch.setenv("OTVIZ_EXPENSIVE_SLOTS", "5")
    monkeypatch.setenv("OTVIZ_MAX_REQUEST_S", "7")
    local = ComputeBudget.for_server()
    assert (local.slots, local.max_request_s) == (5, 7.0)


def test_the_memory_cap_follows_the_space_the_machine_and_the_environment(monkeypatch):
    monkeypatch.delenv("OTVIZ_MAX_RSS_MB", raising=False)
    monkeypatch.setenv("SPACE_ID", "someone/otviz")
    assert ComputeBudget.for_server().max_rss_mb == budget_module.SPACE_MAX_RSS_MB
    monkeypatch.delenv("SPACE_ID")
    monkeypatch.setattr(budget_module, "physical_mb", lambda: 8000.0)
    assert ComputeBudget.for_server().max_rss_mb == 6000.0
    monkeypatch.setenv("OTVIZ_MAX_RSS_MB", "1500")
    assert ComputeBudget.for_server().max_rss_mb == 1500.0


@pytest.mark.skipif(budget_module.resident_mb() is None, reason="reads /proc for memory")
def test_resident_memory_is_the_kernels_figure():
    status = dict(line.split(":", 1) for line in
                  Path("/proc/self/status").read_text().splitlines())
    kernel_mb = int(status["VmRSS"].split()[0]) / 1024
    assert budget_module.resident_mb() == pytest.approx(kernel_mb, abs=8)


def test_no_expensive_work_starts_over_the_memory_cap():
    clock, used = Clock(), {"mb": 900.0}
    budget = ComputeBudget(slots=2, clock=clock, max_rss_mb=1000,
                           memory=lambda: used["mb"])
    with budget.admit("a", "training", 40):  # under the cap
        used["mb"] = 1300.0
        clock.now += 10
        with pytest.raises(BudgetRefused, match=r"the trust metrics not started: the server is "
                           r"using 1\.3 GB of memory, over the 1000 MB .*\(the expensive work "
                           r"running now holds memory\); try again in about 30 s"):
            budget.acquire("b", "the trust metrics", 1)
    with pytest.raises(BudgetRefused, match="nothing expensive is running to free it sooner"
                       r"\); try again in about 300 s"):
        budget.acquire("b", "the trust metrics", 1)
    used["mb"] = 999.0
    with budget.admit("b", "the trust metrics", 1):
        assert len(budget.running()) == 1


def test_the_trust_panel_refuses_over_a_tiny_memory_cap(tools, monkeypatch):
    from otviz.ui import trust_panel
    from otviz.ui.examples import load_examples

    if budget_module.resident_mb() is None:
        pytest.skip("reads /proc for memory")
    computed = []
    monkeypatch.setattr(trust_panel, "_score_part", lambda *a, **k: computed.append(a))
    explainer, suite = tools
    e = load_examples()[0]
    encoded = explainer.encode(e.image_path, e.caption)
    budget = ComputeBudget(slots=1, max_rss_mb=1)  # the process's own memory is over it
    rows = trust_panel.trust_rows(explainer, suite, encoded, [0], False,
                                  trust_panel.TrustCache(), budget=budget)
    with pytest.raises(BudgetRefused, match="the trust metrics not started: the server is "
                                            "using .* of memory, over the 1 MB"):
        next(rows)
    assert computed == [] and budget.running() == []


# ------------------------------------------------------------------ the events that use it
@pytest.fixture()
def full_budget(monkeypatch) -> ComputeBudget:
    """The server budget with its one slot taken by another visitor."""
    budget = ComputeBudget(slots=1)
    monkeypatch.setattr(budget_module, "_SERVER", budget)
    budget.acquire("someone else", "training", 60, capped=False)
    return budget


def test_the_trust_panel_refuses_before_computing(tools, full_budget, monkeypatch):
    from otviz.ui import trust_panel
    from otviz.ui.examples import load_examples

    computed = []
    monkeypatch.setattr(trust_panel, "_score_part", lambda *a, **k: computed.append(a))
    explainer, suite = tools
    e = load_examples()[0]
    encoded = explainer.encode(e.image_path, e.caption)
    rows = trust_panel.trust_rows(explainer, suite, encoded, [0], False,
                                  trust_panel.TrustCache(), budget=full_budget)
    with pytest.raises(BudgetRefused, match="the trust metrics not started: the server is "
                                            "busy .* try again in about 60 s"):
        next(rows)
    assert computed == []


def test_browse_trust_sort_refuses_over_the_cost_cap(tools, monkeypatch, tmp_path):
    from otviz.eval.browse import world_browse
    from otviz.ui import trust_browse

    explainer, suite = tools
    table = world_browse(suite, 4, "test", cache_dir=tmp_path)
    budget = ComputeBudget(slots=1, max_request_s=0.01)
    computed = []
    monkeypatch.setattr(trust_browse, "browse_trust_values", lambda *a: computed.append(a))
    values = trust_browse.TrustValues(budget)
    with pytest.raises(BudgetRefused, match="sorting by a trust metric would take about"):
        trust_browse.trust_sort(values, suite, table, "conceptot", "Max-sensitivity ↓",
                                "all rows")
    assert computed == [] and budget.running() == []


def test_explainer_maps_are_admitted_by_the_budget(tools, full_budget):
    from otviz.ui.examples import load_examples
    from otviz.ui.explainer_panels import explainer_maps

    explainer, _ = tools
    e = load_examples()[1]
    encoded = explainer.encode(e.image_path, e.caption)
    with pytest.raises(BudgetRefused, match="the explainer maps not started"):
        explainer_maps(explainer.backbone, encoded, "a phrase no one asked for")


def test_align_draws_the_methods_maps_when_the_budget_refuses_the_explainers(tools,
                                                                             full_budget):
    """Issue 43.6: the click is answered with every method's map, the explainers' panels say
    they were skipped and when to try again, and the grid equals the one drawn with those
    notes in place (a plain re-composition of the same layout)."""
    from otviz.explainers import EXPLAINERS
    from otviz.ui.align.compute import encode_and_align, phrase_maps
    from otviz.ui.align.settings import AlignSettings
    from otviz.ui.align.views import align_view
    from otviz.ui.examples import load_examples
    from otviz.ui.explainer_panels import SKIPPED_NOTE
    from otviz.viz.panels import compose_heatmaps

    explainer, suite = tools
    e = load_examples()[2]
    settings = AlignSettings(explainers=True)
    view = align_view(explainer, suite, e.image_path, e.caption, settings=settings)
    assert "the explainer maps not started: the server is busy" in view.explainers_refused
    assert "try again in about 60 s" in view.explainers_refused
    note = SKIPPED_NOTE.format(when=" in about 60 s")
    encoded, runs = encode_and_align(explainer, suite, e.image_path, e.caption, settings)
    maps = phrase_maps(runs, encoded, view.phrase, lambda _: dict.fromkeys(EXPLAINERS, note))
    expected = compose_heatmaps(encoded.image, **maps.layout(encoded, False))
    assert np.array_equal(view.grid, expected)
    for name, heat in view.heats.items():  # the methods' maps, as without explainers
        assert np.array_equal(heat, maps.heats[name]), name
    assert [w.what for w in full_budget.running()] == ["training"]  # nothing admitted


def test_browse_explainer_columns_are_admitted_by_the_budget(ctx, full_budget, monkeypatch,
                                                             tmp_path):
    from otviz.eval.browse import BrowseCache
    from otviz.ui import browse_tab

    computed = []
    monkeypatch.setattr(browse_tab, "world_browse", lambda *a, **k: computed.append(a))
    sources = browse_tab.BrowseSources(BrowseCache(), tmp_path / "f", tmp_path / "u")
    with pytest.raises(BudgetRefused, match="the explainer columns not started"):
        browse_tab.load_table(ctx, sources, ctx.checkpoint_choices()[0],
                              browse_tab.WORLD_SOURCE, 8, "test", explainers=("chefer",))
    assert computed == []
    browse_tab.load_table(ctx, sources, ctx.checkpoint_choices()[0], browse_tab.WORLD_SOURCE,
                          8, "test")  # no explainer column: no admission
    assert len(computed) == 1
