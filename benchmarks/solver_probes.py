"""Hostile probes of issues 44 and 50 at fresh seeds: every solver knob, MethodConfig field,
per-problem ``eps`` / ``tau``, tiny ``eps``, the faithful low-rank residual and the
non-convergence advice (44); empty batches, empty sides, ``eps`` / ``tau`` tensors of the
other float dtype, all-False masks in the methods and half precision at a method (50). A
probe misbehaves when a bad value is not refused with an
:class:`otviz.errors.InputError` / :class:`otviz.ot.SolverInputError` naming its knob (a
bare ``TypeError``, ``ZeroDivisionError`` or ``LinAlgError``, or no refusal), or when a
solve returns a NaN plan, a converged-but-wrong plan (against separate solves or POT),
advice that would not help, a wrong empty result, a mixed-dtype solve that differs from
the one given the cast knobs, or an empty pair that is not "no alignment".

    PYTHONPATH=. python benchmarks/solver_probes.py [--seed 100]

Prints one line per misbehaving probe and the totals per group; exits 1 if any misbehaves.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import ot as pot
import torch
import torch.nn.functional as F

import otviz.ot as ot
from otviz.bench.runners import random_batch
from otviz.errors import OtvizError
from otviz.methods import METHODS, MethodConfig, PairBatch, build_method
from otviz.methods.base import no_alignment
from otviz.ot._knobs import eps_floor

NAN, INF = math.nan, math.inf
Probe = tuple[str, str, Callable[[], object], Callable[[object], str | None] | str]


def _problem(seed: int, bsz: int = 3, n: int = 7, m: int = 5, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    x = F.normalize(torch.randn(bsz, n, 6, generator=gen, dtype=dtype), dim=-1)
    y = F.normalize(torch.randn(bsz, m, 6, generator=gen, dtype=dtype), dim=-1)
    a = torch.softmax(torch.randn(bsz, n, generator=gen, dtype=dtype), 1)
    b = torch.softmax(torch.randn(bsz, m, generator=gen, dtype=dtype), 1)
    anchors = F.normalize(torch.randn(4, 6, generator=gen, dtype=dtype), dim=-1)
    return {"x": x, "y": y, "cost": 1 - x @ y.transpose(1, 2), "a": a, "b": b,
            "d1": x @ x.transpose(1, 2), "d2": y @ y.transpose(1, 2), "anchors": anchors}


def _solvers(p: dict, **k) -> dict[str, Callable[..., object]]:
    c, a, b = p["cost"], p["a"], p["b"]
    return {
        "sinkhorn_log": lambda eps, **kw: ot.sinkhorn_log(c, a, b, eps, **kw),
        "sinkhorn_unbalanced_log": lambda eps, **kw: ot.sinkhorn_unbalanced_log(
            c, a, b, eps, kw.pop("tau", 0.5), 0.5, **kw),
        "partial_ot_log": lambda eps, **kw: ot.partial_ot_log(c, a, b, eps, 0.6, **kw),
        "dbot_log": lambda eps, **kw: ot.dbot_log(c, a, 0.5 * b, 2 * b, eps, **kw),
        "fgw_sinkhorn": lambda eps, **kw: ot.fgw_sinkhorn(
            c, a, b, eps, p["d1"], p["d2"], 0.1, tau_a=kw.pop("tau", INF),
            n_inner=kw.pop("n_iters", 1000), **kw),
        "fgw_isoftmax": lambda eps, **kw: ot.fgw_isoftmax(c, a, eps, p["d1"], p["d2"], 0.1, **kw),
        "fgw_pgd": lambda eps, **kw: ot.fgw_pgd(c, a, eps, p["d1"], p["d2"], 0.1, **kw),
        "sinkhorn_divergence": lambda eps, **kw: ot.sinkhorn_divergence(
            p["x"], p["y"], a, b, eps, **kw),
        "lowrank_uot": lambda eps, **kw: ot.lowrank_uot(
            p["x"], p["y"], p["anchors"], a, b, ot.LowRankSettings(
                eps=eps, tau_a=kw.pop("tau", 0.5), tau_b=0.5, **kw)),
    }


def _plan(res) -> torch.Tensor:
    if hasattr(res, "factors") and res.factors is not None:
        return res.dense()
    return res.plan


def _settings_probes() -> list[Probe]:
    bad = {"eps": ["x", True, NAN, INF, -1.0, 0.0], "n_iters": [2.5, True, 0, "3"],
           "tol": [NAN, INF, 0.0, True], "tau_a": [NAN, -1.0, "1"], "tau_b": [NAN, -INF],
           "kpp_reg": [NAN, INF, -1.0], "variant": ["faithfull", None], "clamp": [NAN, 0.0],
           "floor": [NAN, -1e-8, INF]}
    out = []
    for kind in (ot.SinkhornSettings, ot.UnbalancedSettings, ot.LowRankSettings):
        base = {k: v for k, v in {"eps": 0.1, "tau_a": 0.2, "tau_b": 0.2}.items()
                if k in kind.__dataclass_fields__}
        for name, values in bad.items():
            if name not in kind.__dataclass_fields__:
                continue
            for v in values:
                out.append(("settings", f"{kind.__name__}({name}={v!r})",
                            lambda kind=kind, name=name, v=v, base=base: kind(**{**base, name: v}),
                            name))
    return out


def _config_probes() -> list[Probe]:
    bad = {"eps": [0.0, -0.1, NAN, INF, "0.1"], "tau_v": [-0.5, NAN], "tau_t": [-INF, None],
           "n_iters": [2.5, 0, True], "rank": [0, 3.5], "concept_dim": [0, False],
           "kpp_reg": [NAN, -1.0], "lowrank_variant": ["faithfull"], "start": ["nope"],
           "start_rank": [-1, 0.5], "trainable": [1, "no"], "extra": [None]}
    out = [("config", f"MethodConfig({k}={v!r})", lambda k=k, v=v: MethodConfig(**{k: v}), k)
           for k, values in bad.items() for v in values]
    out.append(("config", "dense_uot eps=0.0 (issue's regression)", lambda: build_method(
        "dense_uot", 8, 8, MethodConfig(trainable=False, eps=0.0)), "eps"))
    return out


def _method_batch(seed: int, dtype) -> PairBatch:
    """Two random pairs of 9 patches and 4 tokens (:func:`otviz.bench.runners.random_batch`)
    in ``dtype``."""
    b = random_batch(2, 9, 4, 8, seed)
    return replace(b, patches=b.patches.to(dtype), tokens=b.tokens.to(dtype),
                   image_global=b.image_global.to(dtype), text_global=b.text_global.to(dtype))


def _solver_knob_probes(seed: int) -> list[Probe]:
    out = []
    for dtype in (torch.float32, torch.float64):
        p = _problem(seed, dtype=dtype)
        for name, solve in _solvers(p).items():
            tiny = [1e-12, 1e-20, 1e-30, 1e-100, 0.3 * eps_floor(dtype, 2.0)]
            for eps in [0.0, -0.1, NAN, INF, *tiny]:
                out.append(("eps", f"{name} {dtype} eps={eps:g}",
                            lambda s=solve, e=eps: s(e), "eps"))
            if name not in ("fgw_isoftmax", "fgw_pgd"):
                for n in (2.5, 0, True):
                    out.append(("count", f"{name} n_iters={n!r}",
                                lambda s=solve, n=n: s(0.2, n_iters=n), "n_iters"))
            out.append(("eps", f"{name} eps [B+1]", lambda s=solve, dt=dtype: s(
                torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=dt)), "eps"))
    p = _problem(seed)
    out += [
        ("other", "sinkhorn_divergence objective='nope'", lambda: ot.sinkhorn_divergence(
            p["x"], p["y"], p["a"], p["b"], 0.5, objective="nope"), "objective"),
        ("other", "came negative_slope=nan", lambda: ot.came_marginals(
            p["x"], p["y"], negative_slope=NAN), "negative_slope"),
        ("other", "came temperature=inf", lambda: ot.came_marginals(
            p["x"], p["y"], temperature=INF), "temperature"),
        ("other", "came all-False t_mask", lambda: ot.came_marginals(
            p["x"], p["y"], t_mask=torch.zeros(3, 5, dtype=torch.bool)), "t_mask"),
        ("other", "structure_matrix kind='x'", lambda: ot.structure_matrix(p["x"], "x"), "kind"),
        ("other", "fgw alpha0=nan", lambda: ot.fgw_pgd(
            p["cost"], p["a"], 0.2, p["d1"], p["d2"], NAN), "alpha0"),
        ("other", "fgw scaling typo", lambda: ot.fgw_sinkhorn(
            p["cost"], p["a"], p["b"], 0.2, p["d1"], p["d2"], 0.1, scaling="unit"), "scaling"),
        ("other", "uot tau [B] negative entry", lambda: ot.sinkhorn_unbalanced_log(
            p["cost"], p["a"], p["b"], 0.2, torch.tensor([0.1, -1.0, 0.2], dtype=torch.float64),
            0.5), "tau_a"),
    ]
    def finite(result) -> str | None:
        return None if bool(torch.isfinite(_plan(result)).all()) else "NaN plan"

    solvers = _solvers(p)
    out += [
        ("accept", "sinkhorn_log eps=np.float32(0.1)", lambda: solvers["sinkhorn_log"](
            np.float32(0.1)), finite),
        ("accept", "partial_ot_log eps=1 (int)", lambda: solvers["partial_ot_log"](1), finite),
        ("accept", "uot eps 0-D tensor with grad, tau [B] with inf", lambda: solvers[
            "sinkhorn_unbalanced_log"](torch.tensor(0.2, dtype=torch.float64,
                                                    requires_grad=True),
                                       tau=torch.tensor([0.1, INF, 2.0], dtype=torch.float64)),
         finite),
        ("accept", "MethodConfig numpy numbers", lambda: MethodConfig(
            eps=np.float64(0.07), n_iters=np.int64(5), tau_v=np.float32(0.2)),
         lambda c: None if c.n_iters == 5 else "n_iters changed"),
        ("eps", "lowrank eps [B] with a NaN entry", lambda: solvers["lowrank_uot"](
            torch.tensor([0.1, NAN, 0.2], dtype=torch.float64)), "eps"),
        ("eps", "sinkhorn_log eps [B] requiring grad, one negative", lambda: solvers[
            "sinkhorn_log"](torch.tensor([0.1, -0.2, 0.3], dtype=torch.float64,
                                         requires_grad=True)), "eps"),
        ("other", "uot tau_b [B-1]", lambda: ot.sinkhorn_unbalanced_log(
            p["cost"], p["a"], p["b"], 0.2, 0.5, torch.tensor([0.1, 0.2], dtype=torch.float64)),
         "tau_b"),
    ]
    for name in ("dense_uot", "conceptot", "qc_align", "balanced_ot"):
        for dtype in (torch.float32, torch.float64):
            def run(name=name, dtype=dtype):
                low = MethodConfig(trainable=False, eps=0.3 * eps_floor(dtype, 2.0), rank=4)
                return build_method(name, 8, 8, low).to(dtype)(_method_batch(seed, dtype))
            out.append(("method", f"{name} forward {dtype} eps below floor", run, "eps"))
    return out


def _cut(p: dict, batch: slice = slice(None), n: int | None = None,
         m: int | None = None) -> dict:
    """Problem ``p`` restricted to the problems ``batch`` and the first ``n`` rows / ``m``
    columns (the shared anchors whole)."""
    rows, cols = slice(None, n), slice(None, m)
    index = {"x": (batch, rows), "y": (batch, cols), "cost": (batch, rows, cols),
             "a": (batch, rows), "b": (batch, cols), "d1": (batch, rows, rows),
             "d2": (batch, cols, cols)}
    return {k: v[index[k]] if k in index else v for k, v in p.items()}


TAU_SOLVERS = ("sinkhorn_unbalanced_log", "fgw_sinkhorn", "lowrank_uot")


def _edge_probes(seed: int) -> list[Probe]:
    """Issue 50: every solver at ``B = 0`` (an empty result of the right shape and dtype),
    ``N = 0`` / ``M = 0`` (refused naming the dimension), a ``[B]`` eps / tau of the other
    float dtype (the plan of the cast knobs, in the problem's dtype) and fgw_sinkhorn's
    tau of the wrong length (refused naming fgw_sinkhorn)."""
    out: list[Probe] = []
    p = _problem(seed)
    for name in _solvers(p):
        def empty_batch(name=name):
            return _plan(_solvers(_cut(p, batch=slice(0, 0)))[name](0.2))

        out.append(("empty", f"{name} B=0", empty_batch, lambda plan: None if (
            plan.shape == (0, 7, 5) and plan.dtype == torch.float64) else
            f"plan {tuple(plan.shape)} {plan.dtype}"))
        for side, cut in (("N", {"n": 0}), ("M", {"m": 0})):
            out.append(("empty", f"{name} {side}=0", lambda name=name, cut=cut: _solvers(
                _cut(p, **cut))[name](0.2), f"{side} = 0"))
    out.append(("empty", "came_marginals B=0", lambda: ot.came_marginals(
        p["x"][:0], p["y"][:0]), lambda r: None if r.mu.shape == (0, 7) else "wrong shape"))
    for dtype, other in ((torch.float32, torch.float64), (torch.float64, torch.float32)):
        q = _problem(seed + 1, dtype=dtype)
        gen = torch.Generator().manual_seed(seed + 2)
        eps = 0.1 + torch.rand(3, generator=gen, dtype=torch.float64)
        tau = 0.1 + torch.rand(3, generator=gen, dtype=torch.float64)
        for name, solve in _solvers(q).items():
            def mixed(name=name, solve=solve, dtype=dtype, other=other, eps=eps, tau=tau):
                e, t = eps.to(other), tau.to(other)  # the knobs as given, and as cast:
                kw = {"tau": t} if name in TAU_SOLVERS else {}
                same = {"tau": t.to(dtype)} if name in TAU_SOLVERS else {}
                return _plan(solve(e, **kw)), _plan(solve(e.to(dtype), **same))

            def judge(r, dtype=dtype):
                if r[0].dtype != dtype:
                    return f"plan in {r[0].dtype}, the problem in {dtype}"
                return None if torch.equal(r[0], r[1]) else _close(r[0], r[1], 0.0)
            out.append(("mixed dtype", f"{name} {dtype} problem, {other} eps/tau [B]", mixed,
                        judge))
    out.append(("other", "fgw_sinkhorn tau_a [B-1] names fgw_sinkhorn", lambda: ot.fgw_sinkhorn(
        p["cost"], p["a"], p["b"], 0.2, p["d1"], p["d2"], 0.1,
        tau_a=torch.tensor([0.1, 0.2], dtype=torch.float64)), "fgw_sinkhorn: tau_a"))
    return out


def _method_edge_probes(seed: int) -> list[Probe]:
    """Issue 50 at every method's forward: a pair with an all-False token or patch mask
    scores NO_ALIGNMENT (sorting last, its plan and marginals zero, every value finite);
    float16 / bfloat16 features are refused naming half precision."""
    out: list[Probe] = []
    empty = seed % 2
    for name in METHODS:
        for dtype in (torch.float32, torch.float64):
            for side in ("token_mask", "patch_mask"):
                def run(name=name, dtype=dtype, side=side):
                    batch = _method_batch(seed, dtype)
                    mask = getattr(batch, side).clone()
                    mask[empty] = False
                    method = build_method(name, 8, 8, MethodConfig(trainable=False, rank=4))
                    return method.to(dtype)(replace(batch, **{side: mask}))

                def judge(a) -> str | None:
                    plan = a.plan.dense()
                    if not bool(no_alignment(a.local_score)[empty]):
                        return f"empty pair scores {float(a.local_score[empty]):.4g}"
                    if int(a.local_score.argmin()) != empty:
                        return "the empty pair does not sort last"
                    if bool(plan[empty].any()) or bool(a.row_marginal[empty].any()):
                        return "the empty pair has plan mass"
                    if not bool(torch.isfinite(plan).all() & torch.isfinite(
                            a.combined_score(0.0)).all()):
                        return "NaN or inf in the plan or the combined score"
                    return None
                out.append(("empty mask", f"{name} {dtype} all-False {side}", run, judge))
        for dtype in (torch.float16, torch.bfloat16):
            out.append(("half", f"{name} forward {dtype}", lambda name=name, dtype=dtype:
                        build_method(name, 8, 8, MethodConfig(trainable=False, rank=4))(
                            _method_batch(seed, dtype)), "half precision"))
    return out


def _close(a: torch.Tensor, b: torch.Tensor, tol: float) -> str | None:
    if not bool(torch.isfinite(a).all()):
        return "NaN or inf in the plan"
    err = float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))
    return None if err <= tol else f"plan off by {err:.3g} (relative to its largest entry)"


def _solve_probes(seed: int) -> list[Probe]:
    out = []
    for bsz, m in ((5, 5), (3, 5), (6, 2)):
        p = _problem(seed + bsz, bsz=bsz, m=m)
        gen = torch.Generator().manual_seed(seed + 50 + bsz)
        eps = 0.05 + torch.rand(bsz, generator=gen, dtype=torch.float64)
        tau = 0.1 + torch.rand(bsz, generator=gen, dtype=torch.float64)
        for name in _solvers(p):
            def batched_vs_separate(name=name, p=p, eps=eps, tau=tau, bsz=bsz):
                kw = {} if name in ("fgw_isoftmax", "fgw_pgd") else {"n_iters": 40, "tol": None}
                if name in ("sinkhorn_unbalanced_log", "fgw_sinkhorn", "lowrank_uot"):
                    kw["tau"] = tau
                whole = _plan(_solvers(p)[name](eps, **dict(kw)))
                parts = []
                for i in range(bsz):
                    q = {k: (v if k == "anchors" else v[i : i + 1]) for k, v in p.items()}
                    kwi = {k: (float(v[i]) if k == "tau" else v) for k, v in kw.items()}
                    parts.append(_plan(_solvers(q)[name](float(eps[i]), **kwi)))
                return whole, torch.cat(parts)
            out.append(("per-problem", f"{name} eps/tau [B], B={bsz}, M={m}",
                        batched_vs_separate, lambda r: _close(r[0], r[1], 1e-9)))
    for dtype in (torch.float32, torch.float64):
        p = _problem(seed + 7, dtype=dtype)
        for name, solve in _solvers(p).items():
            def just_above(solve=solve, dtype=dtype, name=name):
                kw = {} if name in ("fgw_isoftmax", "fgw_pgd") else {"n_iters": 20, "tol": None}
                return _plan(solve(2.2 * eps_floor(dtype, 2.0), **kw))
            out.append(("tiny eps", f"{name} {dtype} eps just above floor", just_above,
                        lambda plan: None if bool(torch.isfinite(plan).all()) else "NaN plan"))
    for s in range(3):
        def paper(s=s):
            gen = torch.Generator().manual_seed(seed + 200 + s)
            z = F.normalize(torch.randn(2, 50, 16, generator=gen, dtype=torch.float64), dim=-1)
            y = F.normalize(torch.randn(2, 10, 16, generator=gen, dtype=torch.float64), dim=-1)
            anc = F.normalize(torch.randn(8, 16, generator=gen, dtype=torch.float64), dim=-1)
            mu = torch.softmax(torch.randn(2, 50, generator=gen, dtype=torch.float64), 1)
            nu = torch.softmax(torch.randn(2, 10, generator=gen, dtype=torch.float64), 1)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                res = ot.lowrank_uot(z, y, anc, mu, nu, ot.LowRankSettings(
                    eps=0.07, tau_a=0.2, tau_b=0.2, n_iters=4000))
                more = ot.lowrank_uot(z, y, anc, mu, nu, ot.LowRankSettings(
                    eps=0.07, tau_a=0.2, tau_b=0.2, n_iters=4000, tol=None))
            return res, more

        def judge(r):
            res, more = r
            if not bool(res.converged.all()):
                return f"not converged (rel {res.relative_error.tolist()})"
            moved = float(((more.dense() - res.dense()).abs().sum((1, 2)) / res.mass).max())
            return None if moved < 1e-3 else f"converged but 4000 more iterations move {moved:.3g}"
        out.append(("lowrank", f"faithful at the paper's settings, seed {seed + 200 + s}",
                    paper, judge))
    for s in range(4):
        def advice(s=s):
            gen = torch.Generator().manual_seed(seed + 300 + s)
            x, y = torch.randn(1, 40, 8, generator=gen), torch.randn(1, 12, 8, generator=gen)
            c = torch.cdist(x, y) ** 2
            c = c / c.max()
            a = torch.softmax(torch.randn(1, 40, generator=gen), 1)
            b = torch.softmax(torch.randn(1, 12, generator=gen), 1)
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                r32 = ot.sinkhorn_log(c, a, b, 0.01, 100_000, 1e-6)
                r64 = ot.sinkhorn_log(c.double(), a.double(), b.double(), 0.01, 100_000, 1e-6)
            return r32, r64, [str(x.message) for x in w]

        def judge_advice(r):
            r32, r64, msgs = r
            if bool(r32.converged.all()):
                return None  # nothing to advise
            if not msgs or "raise n_iters" in msgs[0] or "float64" not in msgs[0]:
                return f"advice {msgs[:1]}"
            return None if bool(r64.converged.all()) else "float64 did not help"
        out.append(("advice", f"f32 40x12 eps 0.01 tol 1e-6, seed {seed + 300 + s}", advice,
                    judge_advice))
    for s in range(12):
        def versus_pot(s=s):
            gen = torch.Generator().manual_seed(seed + 400 + s)
            n, m = 5 + s, 3 + s % 5
            c = torch.rand(1, n, m, generator=gen, dtype=torch.float64)
            a = torch.softmax(torch.randn(1, n, generator=gen, dtype=torch.float64), 1)
            b = torch.softmax(torch.randn(1, m, generator=gen, dtype=torch.float64), 1)
            eps = [0.02, 0.05, 0.2][s % 3]
            res = ot.sinkhorn_log(c, a, b, eps, 10_000, 1e-9)
            ref = pot.sinkhorn(a[0].numpy(), b[0].numpy(), c[0].numpy(), eps,
                               method="sinkhorn_log", numItermax=100_000, stopThr=1e-13)
            return res, torch.from_numpy(np.asarray(ref))[None]

        out.append(("POT", f"sinkhorn_log vs POT, seed {seed + 400 + s}", versus_pot,
                    lambda r: None if not bool(r[0].converged.all()) else _close(
                        r[0].plan, r[1], 1e-5)))
    return out


def _run(probe: Probe) -> str | None:
    _, _, call, expect = probe
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ot.NotConvergedWarning)
            result = call()
    except (OtvizError, ValueError) as e:
        if not isinstance(expect, str):
            return f"refused a valid problem: {type(e).__name__}: {e}"
        if not isinstance(e, OtvizError):
            return f"untyped {type(e).__name__}: {e}"
        return None if re.search(rf"\b{expect}\b", str(e)) else f"message lacks {expect!r}: {e}"
    except Exception as e:  # noqa: BLE001 - a probe's point is to catch what escapes
        return f"bare {type(e).__name__}: {e}"
    if isinstance(expect, str):
        return f"accepted (no refusal naming {expect!r})"
    return expect(result)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=100)
    args = parser.parse_args()
    torch.set_num_threads(1)
    probes = (_settings_probes() + _config_probes() + _solver_knob_probes(args.seed)
              + _solve_probes(args.seed) + _edge_probes(args.seed)
              + _method_edge_probes(args.seed))
    total, bad = Counter(), Counter()
    for probe in probes:
        total[probe[0]] += 1
        why = _run(probe)
        if why:
            bad[probe[0]] += 1
            print(f"MISBEHAVES [{probe[0]}] {probe[1]}: {why[:300]}")
    for group in total:
        print(f"{group:12s} {total[group]:4d} probes, {bad[group]} misbehave")
    print(f"total        {sum(total.values()):4d} probes, {sum(bad.values())} misbehave "
          f"(seed {args.seed})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
