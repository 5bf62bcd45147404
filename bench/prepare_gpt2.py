"""Prepare with GPT-2's vocabulary, whole processes: `llm-data optimize` against LitData + tiktoken (issue 38).

Each side is one command, timed from just before its process starts to its exit: the
interpreter, the imports, loading the vocabulary, the process pool and writing the shards all
count, as a user waiting for the command sees it. Ours is the `llm-data` console script with the
.tiktoken file; LitData is bench/runners/litdata_gpt2.py (`tiktoken.get_encoding("r50k_base")`,
GPT-2's ranks from a TIKTOKEN_CACHE_DIR filled here, so nothing downloads). The same corpus
shards, 2 processes each, A B A B. The "1 document" cases run the same commands on a corpus of
one short document: their time is each side's fixed start-up cost. Both outputs must hold the
same number of tokens (the ids are the same vocabulary's), checked per run.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import statistics
import sys
from pathlib import Path

from bench.context import Context, result_rows, summary
from bench.corpus import corpus_paths
from bench.measure import REPO_ROOT, run_command

R50K_URL = "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken"
R50K_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"


def gpt2_file(cache_dir: Path) -> Path:
    path = cache_dir / "gpt2.tiktoken"
    if not path.exists():
        raise SystemExit(f"{path} is missing: python -m bench --tokenizer gpt2 says how to get it")
    if hashlib.sha256(path.read_bytes()).hexdigest() != R50K_SHA256:
        raise SystemExit(f"{path} is not GPT-2's ranks file (sha256 differs from tiktoken's r50k_base)")
    return path


def tiktoken_cache(cache_dir: Path, ranks: Path) -> Path:
    """A TIKTOKEN_CACHE_DIR holding r50k_base under the name tiktoken reads before it would download."""
    folder = cache_dir / "tiktoken-cache"
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / hashlib.sha1(R50K_URL.encode()).hexdigest()
    if not target.exists():
        shutil.copyfile(ranks, target)
    return folder


def _tiny_corpus(cache_dir: Path) -> list[str]:
    path = cache_dir / "one-document" / "one.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    # stripped, as the corpus's documents are (ours strips each record's text; LitData's fn does not)
    path.write_text(json.dumps({"text": "def f(x):\n    return x + 1  # one short document"}) + "\n")
    return [str(path)]


def _llm_data(python: str) -> list[str]:
    script = Path(python).parent / "llm-data"  # the console script users run
    return [str(script)] if script.exists() else [python, "-m", "llm.cli.data"]


def _tokens_written(who: str, out: Path) -> int | None:
    try:
        index = json.loads((out / ("index.json")).read_text())
    except (OSError, ValueError):
        return None
    if who == "litdata":
        return sum(int(c["dim"]) for c in index["chunks"])
    return int(index["totals"]["tokens"])


def scenario_prepare_gpt2(ctx: Context) -> list[dict]:
    ranks = gpt2_file(ctx.cache_dir)
    env = {"TIKTOKEN_CACHE_DIR": str(tiktoken_cache(ctx.cache_dir, ranks))}
    corpora = {"": corpus_paths(ctx.corpus), "1 document, ": _tiny_corpus(ctx.cache_dir)}
    w = ctx.workers
    cases = []
    for prefix, files in corpora.items():
        for who in ("ours", "litdata"):
            if not ctx.active(who):
                continue
            out = ctx.work_dir / f"gpt2-{who}{'-tiny' if prefix else ''}"
            if who == "ours":
                cmd = [*_llm_data(ctx.python), "optimize", *files, "--output", str(out), "--tokenizer", str(ranks),
                       "--num-workers", str(w), "--no-progress", "--overwrite"]
            else:
                cmd = [ctx.python, str(REPO_ROOT / "bench" / "runners" / "litdata_gpt2.py"), str(out), str(w), *files]
            cases.append((who, f"{prefix}{w} processes", cmd, out))
    runs: dict[tuple[str, str], list[dict]] = {}
    for rep in range(ctx.repeat):
        for who, case, cmd, out in cases:
            ctx.say(f"rep {rep + 1}/{ctx.repeat}: prepare_gpt2 {who} {case}")
            shutil.rmtree(out, ignore_errors=True)
            stdout, stderr, code, measured = run_command(cmd, env=env)
            res = dict(measured, seconds=measured["wall_s"])
            if code != 0:
                res["error"] = f"exit {code}: " + "\n".join((stderr or stdout).strip().splitlines()[-6:])
                ctx.say(f"{who} prepare_gpt2 failed: {res['error'][:300]}")
            else:
                res["tokens"] = _tokens_written(who, out)
            runs.setdefault((who, case), []).append(res)
    text_bytes = {"": ctx.corpus["text_bytes"], "1 document, ": None}
    for (who, case), rs in runs.items():
        prefix = "1 document, " if case.startswith("1 document") else ""
        other = runs.get(("litdata" if who == "ours" else "ours", case), [])
        for r, o in zip(rs, other):
            if "error" not in r and "error" not in o:
                r["same_tokens_as_peer"] = r["tokens"] == o["tokens"]
        for r in rs:
            if "error" not in r and text_bytes[prefix]:
                r["mb_per_s"] = text_bytes[prefix] / 1e6 / r["seconds"]
    if any(r.get("same_tokens_as_peer") is False for rs in runs.values() for r in rs):
        print("bench: prepare_gpt2: ours and LitData wrote different token counts", file=sys.stderr)
    rows = result_rows(runs, ["seconds", "mb_per_s", "cpu_s", "peak_rss_mb"])
    for prefix in corpora:  # LitData's time / ours, per repeat (the two ran back to back)
        pairs = zip(runs.get(("ours", f"{prefix}{w} processes"), []), runs.get(("litdata", f"{prefix}{w} processes"), []))
        ratios = [{"ratio": lit["seconds"] / ours["seconds"]} for ours, lit in pairs
                  if "error" not in ours and "error" not in lit]
        rows.append({"who": "ratio", "case": f"{prefix}{w} processes", "runs": ratios,
                     "ratio": summary(ratios, "ratio"), "text_mb": (text_bytes[prefix] or 0) / 1e6})
    return rows


def ratio(rows: list[dict], case_prefix: str = "") -> dict | None:
    """LitData's time / ours per repeat (median, min, max) for the corpus ("") or "1 document, "."""
    return next((r["ratio"] for r in rows if r["who"] == "ratio" and r["case"].startswith(case_prefix)
                 and (case_prefix or not r["case"].startswith("1 document"))), None)


def markdown(rows: list[dict]) -> list[str]:
    """docs/benchmarks.md's section: the whole-process table and the paired ratios."""
    def cell(stat: dict | None, digits: int = 2) -> str:
        return "n/a" if not stat else f"{stat['median']:.{digits}f} [{stat['min']:.{digits}f}-{stat['max']:.{digits}f}]"

    corpus = next((r["text_mb"] for r in rows if r["who"] == "ratio" and r.get("text_mb")), 0)
    md = ["", "## Prepare with the GPT-2 vocabulary, whole processes (issue 38)", "",
          f"`python -m bench --only prepare_gpt2 --tokenizer gpt2 --corpus-mb 60`: {corpus:.1f} MB of the corpus, "
          "each side one command timed from its start to its exit (interpreter, imports, vocabulary, process pool "
          "and shards included): ours `llm-data optimize --tokenizer gpt2.tiktoken --num-workers 2 --no-progress`, "
          "LitData `optimize(fn, ..., num_workers=2, item_loader=TokensLoader())` with "
          "`tiktoken.get_encoding(\"r50k_base\")` (GPT-2's ranks) in `fn` (bench/runners/litdata_gpt2.py); "
          "alternating, medians [min-max]. The 1-document rows are the same commands on one short document: "
          "each side's fixed start-up cost.", "",
          "| contestant | case | s | MB text/s | CPU s (tree) | peak RSS MB | same tokens as the other |",
          "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["who"] == "ratio":
            continue
        same = {r2.get("same_tokens_as_peer") for r2 in r["runs"]} - {None}
        md.append(f"| {'ours' if r['who'] == 'ours' else 'LitData + tiktoken'} | {r['case']} | "
                  f"{cell(r.get('seconds'))} | {cell(r.get('mb_per_s'), 1)} | {cell(r.get('cpu_s'), 1)} | "
                  f"{cell(r.get('peak_rss_mb'), 0)} | {'yes' if same == {True} else 'n/a' if not same else '**no**'} |")
    md.append("")
    for r in rows:
        if r["who"] == "ratio":
            md.append(f"- LitData's time / ours, {r['case']}: **{cell(r['ratio'])}x** (paired per repeat)")
    return md + _ab_lines()


def _ab_lines() -> list[str]:
    """The newest `python -m bench.prepare_gpt2_ab` run: ours before and after, beside LitData."""
    from bench.results import newest

    ab = newest("prepare-gpt2-ab")
    if not ab:
        return []

    def cell(values: list[float]) -> str:
        return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"

    md = ["", f"`python -m bench.prepare_gpt2_ab` ({ab['corpus_mb']:.1f} MB, {ab['repeat']} repeats, each repeat "
          "`before` (the baseline's `llm`), `after` (this checkout's) and LitData back to back):", "",
          "| case | side | s | CPU s (tree) | peak RSS MB |", "|---|---|---|---|---|"]
    for label in ("corpus", "1 document"):
        runs = ab[label]["runs"]
        for side, rs in runs.items():
            md.append(f"| {label} | {side} | {cell([r['wall_s'] for r in rs])} | {cell([r['cpu_s'] for r in rs])} | "
                      f"{cell([r['peak_rss_mb'] for r in rs])} |")
    md.append("")
    for label in ("corpus", "1 document"):
        runs = ab[label]["runs"]
        ratios = {side: cell([lit["wall_s"] / o["wall_s"] for lit, o in zip(runs["litdata"], runs[side])])
                  for side in ("before", "after")}
        md.append(f"- {label}: LitData's time / ours before {ratios['before']}x, after **{ratios['after']}x**")
    return md


def latest() -> list[dict] | None:
    """The rows of the newest main-run result in bench/results/ that ran this scenario (docs/benchmarks.md
    keeps the section when other scenarios are rerun)."""
    from bench.results import RESULTS

    for path in sorted(RESULTS.glob("2*.json"), reverse=True):  # main runs: <UTC time>-<MB>mb.json
        try:
            rows = json.loads(path.read_text())["scenarios"].get("prepare_gpt2")
        except (ValueError, KeyError, AttributeError):
            continue
        if rows:
            return rows
    return None
