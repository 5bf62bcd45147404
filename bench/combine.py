"""`python -m bench.combine OUT IN...`: one results JSON from several bench runs, each scenario's source named.

For a machine too busy to run every scenario in one sitting: scenarios come from the inputs in
order (a later input replaces an earlier one's scenario; the set-up reported is the last input's), except that runs of the same scenario
whose inputs were started with the same set-up (corpus, tokenizer, workers) are pooled per
(contestant, case), as if run with more repeats (each input interleaves its cases A B A B, so
pooled inputs are interleaved too), and their medians recomputed. `--encoders` attaches
`python -m bench.encoders --fresh --json` files. `config.sources` says where each scenario came
from; the report prints it. Then `python -m bench --report-only OUT` renders the docs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.context import summary


def _setup(cfg: dict) -> tuple:
    return (cfg["corpus"]["sha256"], cfg["tokenizer"], cfg["workers"], cfg.get("block_size"), cfg.get("batch_size"))


def _pool(rows_a: list[dict], rows_b: list[dict]) -> list[dict]:
    """Rows of one scenario from two runs, their `runs` joined per (who, case) and summaries redone."""
    merged: dict[tuple[str, str], dict] = {}
    for row in [*rows_a, *rows_b]:
        key = (row["who"], row["case"])
        if key not in merged:
            merged[key] = {**row, "runs": list(row.get("runs", []))}
        else:
            merged[key]["runs"] += row.get("runs", [])
    for row in merged.values():
        for key, value in list(row.items()):
            if isinstance(value, dict) and {"median", "min", "max"} <= set(value):
                row[key] = summary(row["runs"], key)
    return list(merged.values())


def combine(inputs: list[Path], encoders: list[Path]) -> dict:
    out: dict = {"config": None, "scenarios": {}, "profiles": []}
    sources: dict[str, list[str]] = {}
    # The set-up reported (machine, corpus, engines) is the last input's: the newest run.
    last = json.loads(inputs[-1].read_text())["config"]
    for path in inputs:
        res = json.loads(path.read_text())
        cfg = res["config"]
        if out["config"] is None:
            out["config"] = {**last}
        for name, rows in res["scenarios"].items():
            here = f"{path.name} ({cfg['started']}, {cfg['repeat']} repeat{'s' if cfg['repeat'] > 1 else ''})"
            pooled = name in out["scenarios"] and sources[name] and _setup(cfg) == out["_setups"][name]
            out["scenarios"][name] = _pool(out["scenarios"][name], rows) if pooled else rows
            sources[name] = [*sources[name], here] if pooled else [here]
            out.setdefault("_setups", {})[name] = _setup(cfg)
            if not pooled and _setup(cfg) != _setup(last):
                sources[name][-1] += "; another corpus or set-up than the first input"
    out.pop("_setups", None)
    out["config"]["sources"] = sources
    out["config"]["repeat"] = max(len(r.get("runs", [])) for rows in out["scenarios"].values() for r in rows) or 1
    if encoders:
        rows = []
        for path in encoders:
            enc = json.loads(path.read_text())
            rows += enc["rows"]
        out["encoders"] = {"corpus_mb": enc["corpus_mb"], "threads": enc["threads"], "rows": rows}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.combine", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("output", type=Path)
    p.add_argument("inputs", type=Path, nargs="+", help="results JSON files, in order")
    p.add_argument("--encoders", type=Path, action="append", default=[], help="bench.encoders --fresh --json files")
    args = p.parse_args(argv)
    args.output.write_text(json.dumps(combine(args.inputs, args.encoders), indent=1, default=str))
    print(f"combined {len(args.inputs)} result file(s) into {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
