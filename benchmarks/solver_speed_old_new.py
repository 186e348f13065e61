"""Old tree against new tree, same machine, one run: every public solver and four methods'
forward passes, timed alternately in two worker processes (one per tree, each importing
its own ``otviz``), so machine drift hits both alike (issue 44's "no speed regression").

    PYTHONPATH=. python benchmarks/solver_speed_old_new.py --old /tmp/old-solvers \
        --new . --repeats 9

Each repeat runs every case once in the old worker, then once in the new one (the order
flips every repeat); a case's time is the median of ``--inner`` calls. Reported: the
median time of each tree over the repeats, and the median new/old ratio with the range of
the middle repeats (a distribution-free ~90 % interval of the median for 9 repeats: the
2nd and 8th order statistics). float32, 1 thread, cosine costs of random unit features at
ConceptOT's shape N = 196, M = 48, L = 5 (fixed counts, as the methods run) and to the
default tol where a solver iterates.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

WORKER = r'''
import json, sys, time, warnings
import torch
import torch.nn.functional as F
torch.set_num_threads(1)
warnings.simplefilter("ignore")
import otviz.ot as ot
from otviz.methods import MethodConfig, PairBatch, build_method

B, N, M, D, L = 64, 196, 48, 64, 5
g = torch.Generator().manual_seed(0)
z = F.normalize(torch.randn(B, N, D, generator=g), dim=-1)
y = F.normalize(torch.randn(B, M, D, generator=g), dim=-1)
anchors = F.normalize(torch.randn(32, D, generator=g), dim=-1)
cost = 1.0 - z @ y.transpose(1, 2)
a, b = torch.full((B, N), 1.0 / N), torch.full((B, M), 1.0 / M)
d1, d2 = z @ z.transpose(1, 2), y @ y.transpose(1, 2)
low = ot.LowRankSettings(eps=0.07, tau_a=0.2, tau_b=0.2, n_iters=L, tol=None)
batch = PairBatch(patches=z, tokens=y, patch_mask=torch.ones(B, N, dtype=torch.bool),
                  token_mask=torch.ones(B, M, dtype=torch.bool), image_global=z[:, 0],
                  text_global=y[:, 0], grid=(14, 14))
methods = {}
for name in ("dense_uot", "balanced_ot", "conceptot", "qc_align"):
    m = build_method(name, D, D, MethodConfig(trainable=False, rank=32)).eval()
    m.fit_training_free(batch)
    methods[name] = m
CASES = {
    "sinkhorn_log L=5": lambda: ot.sinkhorn_log(cost, a, b, 0.07, L, None),
    "sinkhorn_log tol": lambda: ot.sinkhorn_log(cost, a, b, 0.1),
    "sinkhorn_unbalanced_log L=5": lambda: ot.sinkhorn_unbalanced_log(
        cost, a, b, 0.07, 0.2, 0.2, L, None),
    "partial_ot_log 20": lambda: ot.partial_ot_log(cost[:16], a[:16], b[:16], 0.1, 0.5, 20,
                                                   None),
    "dbot_log 20": lambda: ot.dbot_log(cost[:16], a[:16], 0.5 * b[:16], 2 * b[:16], 0.1, 20,
                                       None),
    "fgw_sinkhorn 2x5": lambda: ot.fgw_sinkhorn(cost[:16], a[:16], b[:16], 0.1, d1[:16],
                                                d2[:16], 0.1, 2, 5, tol=None),
    "sinkhorn_divergence 5": lambda: ot.sinkhorn_divergence(z[:16], y[:16], a[:16], b[:16],
                                                            0.5, 5, tol=None),
    "lowrank_uot faithful L=5": lambda: ot.lowrank_uot(z, y, anchors, a, b, low),
    "came_marginals": lambda: ot.came_marginals(z, y),
    **{f"method {k}": (lambda m=m: m(batch)) for k, m in methods.items()},
}
print(json.dumps(sorted(CASES)), flush=True)
for line in sys.stdin:
    name, inner = json.loads(line)
    fn = CASES[name]
    times = []
    with torch.no_grad():
        fn()
        for _ in range(inner):
            t = time.perf_counter(); fn(); times.append(time.perf_counter() - t)
    times.sort()
    print(json.dumps(times[len(times) // 2]), flush=True)
'''


def _worker(tree: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(tree), "OMP_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen([sys.executable, "-c", WORKER], cwd=os.path.abspath(tree), env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _ask(proc: subprocess.Popen, name: str, inner: int) -> float:
    proc.stdin.write(json.dumps([name, inner]) + "\n")
    proc.stdin.flush()
    return json.loads(proc.stdout.readline())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", required=True)
    parser.add_argument("--new", default=".")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--inner", type=int, default=5)
    parser.add_argument("--json", default="")
    parser.add_argument("--cases", default="", help="comma list of substrings of case names")
    args = parser.parse_args()
    old, new = _worker(args.old), _worker(args.new)
    cases = json.loads(old.stdout.readline())
    assert cases == json.loads(new.stdout.readline())
    wanted = [w for w in args.cases.split(",") if w]
    cases = [c for c in cases if not wanted or any(w in c for w in wanted)]
    times: dict[str, dict[str, list[float]]] = {c: {"old": [], "new": []} for c in cases}
    for rep in range(args.repeats):
        order = (("old", old), ("new", new)) if rep % 2 == 0 else (("new", new), ("old", old))
        for case in cases:
            for tag, proc in order:
                times[case][tag].append(_ask(proc, case, args.inner))
    for proc in (old, new):
        proc.stdin.close()
        proc.wait()
    rows = []
    print("| case | old ms | new ms | new/old median | interval |")
    print("|---|---|---|---|---|")
    for case in cases:
        o, n = times[case]["old"], times[case]["new"]
        ratios = sorted(x / y for x, y in zip(n, o, strict=True))
        k = len(ratios) // 9  # 2nd and 8th of 9: ~90 % interval of the median
        lo, hi = ratios[k], ratios[-1 - k]
        med = statistics.median(ratios)
        rows.append({"case": case, "old_ms": 1e3 * statistics.median(o),
                     "new_ms": 1e3 * statistics.median(n), "ratio": med, "lo": lo, "hi": hi})
        print(f"| {case} | {1e3 * statistics.median(o):.2f} | {1e3 * statistics.median(n):.2f}"
              f" | {med:.3f} | {lo:.3f}-{hi:.3f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"repeats": args.repeats, "inner": args.inner, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
