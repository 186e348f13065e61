"""A config class's field docs under concurrent server threads: CPython 3.11's ``ast.parse``
is not thread-safe (gh-106905), and the Train tab's form read them per request, so two
requests at once failed with "AST constructor recursion depth mismatch"."""

from __future__ import annotations

import ast
import threading

from otviz.field_docs import _parsed_field_docs, field_docs
from otviz.train.config import TrainConfig


def _parses(monkeypatch, run) -> int:
    """How many times ``ast.parse`` runs during ``run()``, from an empty cache."""
    calls = []
    real = ast.parse

    def counting(*args, **kwargs):
        calls.append(threading.get_ident())
        return real(*args, **kwargs)

    _parsed_field_docs.cache_clear()
    monkeypatch.setattr(ast, "parse", counting)
    run()
    monkeypatch.setattr(ast, "parse", real)
    return len(calls)


def test_a_class_is_parsed_once_whatever_the_threads(monkeypatch):
    once = _parses(monkeypatch, lambda: field_docs(TrainConfig))
    assert once >= 1
    results: list[dict] = [{} for _ in range(8)]
    start = threading.Barrier(len(results))

    def read(i: int) -> None:
        start.wait()
        results[i] = field_docs(TrainConfig)

    def in_threads() -> None:
        threads = [threading.Thread(target=read, args=(i,)) for i in range(len(results))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    assert _parses(monkeypatch, in_threads) == once
    assert results[0] and all(r == results[0] for r in results)
    assert results[0]["method"].help  # the form's help text is read, not empty


def test_each_call_gets_its_own_dict():
    first = field_docs(TrainConfig)
    first.clear()
    assert field_docs(TrainConfig)
