"""One-seed ``otviz eval`` runs combined over seeds exactly as ``otviz eval --seeds`` combines
them, so the seeds of a long table can run as one process each:

    for s in 0 1 2; do otviz eval --seed $s ... --out RUN/seed-$s & done; wait
    python benchmarks/combine_seeds.py RUN

writes ``RUN/tables.json`` and ``RUN/tables.md`` (the tables over seeds, the claims table,
the per-seed tables and the first run's configuration with its seeds), as
:func:`otviz.eval.runner.run_eval` writes them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from otviz.eval.runner import over_seeds, read_tables, write_tables
from otviz.eval.trust.table import refresh_verdicts


def combine_seeds(run: Path) -> bool:
    """``run/tables.json`` over the one-seed runs ``run/seed-S/tables.json`` (seeds in
    numeric order): :func:`otviz.eval.runner.over_seeds`, then the trust table's verdicts
    from the mean (:func:`otviz.eval.trust.table.refresh_verdicts`), as ``run_eval`` does.
    False (nothing written) when ``run`` has no such runs or already has a ``tables.json``."""
    paths = sorted(run.glob("seed-*/tables.json"), key=lambda p: int(p.parent.name[5:]))
    if not paths or (run / "tables.json").exists():
        return False
    per_seed = {p.parent.name[5:]: list(read_tables(p).values()) for p in paths}
    tables = over_seeds(list(per_seed.values()))
    refresh_verdicts(tables)
    config = {**json.loads(paths[0].read_text())["config"], "seeds": ",".join(per_seed),
              "out": str(run)}
    write_tables(tables, run, {
        "config": config,
        "per_seed": {s: {t.key: t.to_dict() for t in ts} for s, ts in per_seed.items()}})
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="folder of seed-S/tables.json runs")
    args = parser.parse_args()
    if not combine_seeds(args.run):
        raise SystemExit(f"{args.run}: no seed-S/tables.json to combine, or tables.json exists")
    print((args.run / "tables.md").read_text())


if __name__ == "__main__":
    main()
