"""Targets and Markdown for the `s3` scenario (bench/s3.py)."""

from __future__ import annotations

import re
import statistics

from bench.runners.common import BLOCK

NAMES = {"ours": "ours (llm.data)", "litdata": "LitData", "mosaic": "MosaicML Streaming"}


def _row(rows: list[dict], who: str, prefix: str) -> dict | None:
    return next((r for r in rows if r["who"] == who and r["case"].startswith(prefix)), None)


def _tps(row: dict | None) -> float | None:
    return row["tokens_per_s"]["median"] if row and row.get("tokens_per_s") else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _config(rows: list[dict]) -> dict:
    return next((r for r in rows if r["who"] == "config"), {})


def limit_rows(rows: list[dict]) -> list[tuple[dict, dict | None]]:
    """(limited run row, ours' unlimited row at the same shard size and workers)."""
    out = []
    for r in rows:
        if r["case"].startswith(("limit ", "(info) limit ")):
            shards_workers = ", ".join(p for p in r["case"].split(", ")[1:] if p != "unshuffled")
            out.append((r, _row(rows, "ours", f"no limit, {shards_workers}")))
    return out


def targets(rows: list[dict], workers: int) -> list[dict]:
    out: list[dict] = []

    def add(name: str, ratio: float | None, goal: float) -> None:
        out.append({"name": name, "ratio": ratio, "goal": f">= {goal:g}", "ok": None if ratio is None else ratio >= goal})

    for kind in ("cold", "warm"):
        for nw, goal in ((0, 1.0), (workers, 2.0)):
            ours, lit = _row(rows, "ours", f"{kind}, {nw} workers"), _row(rows, "litdata", f"{kind}, {nw} workers")
            add(f"s3 {kind} cache, {nw} workers: ours / LitData", _ratio(_tps(ours), _tps(lit)), goal)
    limited_runs = [(r, ref) for r, ref in limit_rows(rows) if r["who"] == "ours" and not r["case"].startswith("(info)")]
    if limited_runs:
        exact = [r for r, _ in limited_runs if r["outcomes"] == ["exact"]]
        out.append({"name": "s3 cache limit: ours completes every configuration, every block exactly once",
                    "ratio": len(exact) / len(limited_runs), "goal": "= 1", "ok": len(exact) == len(limited_runs),
                    "detail": ", ".join(r["case"] for r, _ in limited_runs if r not in exact)})
        speeds = [_ratio(_tps(r), _tps(ref)) for r, ref in limited_runs]
        worst = min((s for s in speeds if s is not None), default=None)
        add("s3 cache limit: ours / ours without a limit (slowest configuration)",
            worst if None not in speeds else None, 0.5)
        bounded = [r for r, _ in limited_runs if all(run.get("within_limit") for run in r["runs"])]
        out.append({"name": "s3 cache limit: ours' peak cache <= limit + one shard (every configuration)",
                    "ratio": len(bounded) / len(limited_runs), "goal": "= 1", "ok": len(bounded) == len(limited_runs)})
    ours = [r for r in rows if r["who"] == "ours"]
    if ours:
        corrupt = sum(r.get("corrupt_cached", 0) for r in ours)
        out.append({"name": "s3: corrupt files in ours' cache (every run)", "ratio": corrupt, "goal": "= 0",
                    "ok": corrupt == 0})
    restarts = [r for r in ours if r["case"].startswith("server restart")]
    if restarts:
        fine = [r for r in restarts if all(o in ("exact", "error") for o in r["outcomes"])]
        out.append({"name": "s3 server restart: ours delivers every block exactly once, or raises",
                    "ratio": len(fine) / len(restarts), "goal": "= 1", "ok": len(fine) == len(restarts),
                    "detail": "; ".join(f"{r['case']}: {'/'.join(r['outcomes'])}" for r in restarts)})
    return out + request_targets(rows)


def request_rows(rows: list[dict]) -> list[dict]:
    """The rows whose runs went through the counting proxy (every case but the server restart)."""
    return [r for r in rows if r.get("runs") and any("requests" in run for run in r["runs"])]


def _median_counts(row: dict, finished: bool = True) -> dict:
    """Each request count's median over the row's runs (its runs are repeats of one case): those that finished,
    or with `finished=False` every run (a failed one's requests up to its failure)."""
    runs = [run["requests"] for run in row["runs"] if "requests" in run and not (finished and "error" in run)]
    if not runs:
        return {}
    return {k: statistics.median(run[k] for run in runs) for k in runs[0]}


def gets_per_shard(row: dict, finished: bool = True) -> float | None:
    c = _median_counts(row, finished)
    return c["shard_gets"] / c["shards"] if c and c.get("shards") else None


def request_targets(rows: list[dict]) -> list[dict]:
    """Issue 26: about one GET per shard per epoch, O(1) listing per epoch, never a request per sample."""
    our_rows = [r for r in request_rows(rows) if r["who"] == "ours" and _median_counts(r)]
    if not our_rows:
        return []
    worst = max(our_rows, key=lambda r: gets_per_shard(r) or 0)
    lists = max(_median_counts(r)["LIST"] for r in our_rows)
    per_sample = max((_requests(r) / _blocks(r) for r in our_rows if _blocks(r)), default=0.0)
    return [
        {"name": "s3 requests: ours' GETs per shard per epoch (worst case)", "ratio": gets_per_shard(worst),
         "goal": "<= 1.1", "ok": (gets_per_shard(worst) or 0) <= 1.1, "detail": worst["case"]},
        {"name": "s3 requests: ours' listings per epoch (worst case)", "ratio": lists, "goal": "<= 2", "ok": lists <= 2},
        {"name": "s3 requests: ours' requests per delivered block (worst case)", "ratio": per_sample, "goal": "<= 0.01",
         "ok": per_sample <= 0.01},
    ]


def _requests(row: dict) -> float:
    c = _median_counts(row)
    return sum(c.get(k, 0) for k in ("GET", "HEAD", "LIST", "PUT", "other"))


def _blocks(row: dict) -> float:
    """Blocks delivered in an epoch (median over the runs that finished; 0 when none did)."""
    tokens = [run["tokens"] for run in row["runs"] if run.get("tokens") and "error" not in run]
    return statistics.median(tokens) / BLOCK if tokens else 0


def request_table(rows: list[dict]) -> list[str]:
    """Markdown: requests by kind, GETs per shard and MB received per epoch, per contestant and case (a run that
    failed: its requests up to the failure, its outcome saying so)."""
    md = ["| contestant | case | outcome | GET | HEAD | LIST | PUT | GETs per shard (shard GETs / shards) | "
          "MB received | blocks per request |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in request_rows(rows):
        c = _median_counts(r, finished=False)
        per_request = _blocks(r) / _requests(r) if _requests(r) else None
        md.append(f"| {NAMES.get(r['who'], r['who'])} | {r['case']} | {'/'.join(r['outcomes'])} | {c['GET']:g} | "
                  f"{c['HEAD']:g} | {c['LIST']:g} | {c['PUT']:g} | {gets_per_shard(r, False):.2f} "
                  f"({c['shard_gets']:g} / {c['shards']:g}) | {c['mb_in']:.1f} | "
                  f"{'n/a' if per_request is None else f'{per_request:,.0f}'} |")
    return md


def _f(stat: dict | None, scale: float = 1.0, digits: int = 1) -> str:
    if not stat:
        return "n/a"
    m = stat["median"] / scale
    if stat.get("n", 1) > 1:
        return f"{m:.{digits}f} [{stat['min'] / scale:.{digits}f}-{stat['max'] / scale:.{digits}f}]"
    return f"{m:.{digits}f}"


def _delivery(row: dict) -> str:
    ds = [run.get("delivery") for run in row["runs"]]
    if not all(ds):
        return "n/a"
    worst = max(ds, key=lambda d: d["never"] + d["twice_or_more"] + d["unknown"])
    return f"{worst['once']:,} / {worst['twice_or_more'] + worst['unknown']:,} / {worst['never']:,}"


def _outcome(row: dict) -> str:
    text = "/".join(row["outcomes"])
    why = next((run["error_summary"] for run in row["runs"] if run.get("error_summary")), None)
    if why:
        why = re.sub(r"(?<![:\w/])(/[^\s/\"']+)+/([^\s/\"']+)", r".../\2", why)  # paths: their file name is enough
        text += f": {why[:160].replace('|', '/')}"
    return text


def _over(row: dict) -> str:
    runs = [run for run in row["runs"] if "within_limit" in run and "error" not in run]
    return " **over**" if any(not run["within_limit"] for run in runs) else ""


def markdown(rows: list[dict], workers: int) -> list[str]:
    cfg = _config(rows)
    md = ["", "## Object storage (s3)", ""]
    if not cfg:
        return md + [f"not run: {rows[0].get('error', '?') if rows else 'no rows'}"]
    files = cfg.get("dataset_shards", {})
    sizes = "; ".join(f"{k}: {v:.0f} MB in {files.get(k, '?')} shards" for k, v in cfg["dataset_mb"].items())
    md += [f"A SeaweedFS on 127.0.0.1 (`weed mini` with both telemetry flags, `-master.telemetry=false -master.telemetry.url=http://127.0.0.1:9/off`, `bench/seaweed.py`) holds each contestant's copy of the token "
           f"stream, repeated {cfg['copies']}x ({sizes}). Every run is one shuffled epoch (restart: "
           "unshuffled, paced) in its own process, every delivered block hashed and compared with the data "
           "(`once / twice+ / never`, the worst run), the cache folder sampled every 10 ms for its peak, and every "
           "cached file compared byte for byte with the original of its name. `cold`: an empty cache folder; "
           "`warm`: the same folder again, in a new process. Medians with [min-max] over the repeats.", "",
           "| contestant | case | M tokens/s | first batch s | peak cache MB | once / twice+ / never | "
           "corrupt cached | outcome |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["case"].split(",")[0] in ("cold", "warm") or r["case"].startswith("as shipped"):
            md.append(f"| {NAMES.get(r['who'], r['who'])} | {r['case']} | {_f(r.get('tokens_per_s'), 1e6)} | "
                      f"{_f(r.get('first_batch_s'), 1, 2)} | {_f(r.get('cache_peak_mb'), 1, 0)} | {_delivery(r)} | "
                      f"{r.get('corrupt_cached', 0)} | {_outcome(r)} |")
    md += ["", "| ratio of medians | " + " | ".join(f"{k} {nw}w" for k in ("cold", "warm") for nw in (0, workers))
           + " |", "|---|---|---|---|---|"]
    for peer in ("litdata", "mosaic"):
        cells = [_ratio(_tps(_row(rows, "ours", f"{k}, {nw} workers")), _tps(_row(rows, peer, f"{k}, {nw} workers")))
                 for k in ("cold", "warm") for nw in (0, workers)]
        md.append(f"| ours / {NAMES[peer]} | " + " | ".join("n/a" if c is None else f"{c:.2f}x" for c in cells) + " |")
    md += ["", f"Cache limit {cfg['cache_mb']:g} MB (`max_cache_size` for ours and LitData, `cache_limit` for "
           "MosaicML): one run per configuration; speed against ours without a limit at the same shard size "
           "and workers; the peak must stay within the limit + one shard.", "",
           "| contestant | case | outcome | M tokens/s | / ours no limit | peak cache MB | limit + shard MB | "
           "once / twice+ / never | corrupt cached |", "|---|---|---|---|---|---|---|---|---|"]
    for r, ref in limit_rows(rows):
        ratio = _ratio(_tps(r), _tps(ref))
        md.append(f"| {NAMES.get(r['who'], r['who'])} | {r['case']} | {_outcome(r)} | {_f(r.get('tokens_per_s'), 1e6)} | "
                  f"{'n/a' if ratio is None else f'{ratio:.2f}x'} | {_f(r.get('cache_peak_mb'), 1, 0)}{_over(r)} | "
                  f"{r['limit_mb'] + r['shard_mb']:g} | {_delivery(r)} | {r.get('corrupt_cached', 0)} |")
    if request_rows(rows):
        md += ["", "Requests per epoch: every run above read the server through a counting proxy of its own "
               "(`bench/faultproxy.py`, one request per connection), so each line is one epoch of one contestant: "
               "requests by kind (LIST: a GET of the bucket), GETs of shard files per shard (index and metadata "
               "files not counted), response bytes received, and blocks delivered per request. Medians over the "
               "repeats.", "", *request_table(rows)]
    md += ["", f"Server restart: the server is killed (SIGKILL) {cfg['restart_at_s']:g} s into an unshuffled epoch "
           f"paced to last about 10 s, and started again {cfg['down_s']:g} s later on the same folder and port "
           "(`back after`: from the kill until the server took a write again; reads of older objects can fail a "
           "little longer, while its volumes re-register).", "",
           "| contestant | case | outcome | once / twice+ / never | killed at s | back after s | corrupt cached |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["case"].startswith("server restart"):
            fault = r["runs"][0].get("restart") or {}
            md.append(f"| {NAMES.get(r['who'], r['who'])} | {r['case']} | {_outcome(r)} | {_delivery(r)} | "
                      f"{fault.get('killed_at_s', 'n/a')} | {fault.get('unreachable_s', 'n/a')} | "
                      f"{r.get('corrupt_cached', 0)} |")
    return md
