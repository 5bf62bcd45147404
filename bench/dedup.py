"""The `dedup` scenario: planted duplicates in real text; recall, originals kept and precision, ours vs datatrove and datasketch.

`python -m bench.dedup [--corpus-mb 8] [--repeat 2]` (also `python -m bench --only dedup`):
the bench corpus (real text, bench/corpus.py) gets planted copies after their originals:
exact copies, copies with ~1% of the words changed and copies with a short tail added, each
kept only when its true Jaccard similarity of word 5-grams to the original is in [0.8, 0.9]
for the near ones. Ours (`llm.data.dedup_corpus`), datatrove's MinHash pipeline (same 5-grams,
permutations, bands and rows, whitespace words for both) and datasketch's MinHashLSH (the
reference, in input order) dedup it at threshold 0.8; each runs in its own subprocess (peak RSS of
the process tree). Quality: recall on the planted near copies, share of originals kept, and
the precision of our verified pairs against their exact Jaccard. Scale: ours at 1x and 4x.
Results in bench/results/dedup-*.json; the table goes in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.corpus import build_corpus, corpus_paths, iter_texts
from bench.measure import REPO_ROOT, run_worker
from bench.results import newest

THRESHOLD, NGRAM, NUM_PERM = 0.8, 5, 128
FILE_BYTES = 2 << 20
RESULTS = REPO_ROOT / "bench" / "results"


def shingles(text: str, n: int = NGRAM) -> set:
    words = text.lower().split()
    return {tuple(words[i : i + n]) for i in range(max(1, len(words) - n + 1))}


def jaccard(a: str, b: str) -> float:
    x, y = shingles(a), shingles(b)
    return len(x & y) / len(x | y)


def _changed(text: str, rng: random.Random, share: float) -> str:
    words = text.split()
    for i in rng.sample(range(len(words)), max(1, round(len(words) * share))):
        words[i] = f"x{rng.randrange(10**6)}"
    return " ".join(words)


def _tailed(text: str, rng: random.Random, share: float, donor: str) -> str:
    tail = donor.split()[: max(1, round(len(text.split()) * share))]
    return text + " " + " ".join(tail)


def recut(texts: list[str], doc_bytes: int) -> list[str]:
    """The corpus re-cut into documents of about `doc_bytes` bytes (whole lines, in order; 0: as is).

    The bench corpus holds long files (median ~6 KB, some of hundreds of KB): web corpora hold
    many short documents, and per-document costs only show on many documents.
    """
    if not doc_bytes:
        return texts
    out: list[str] = []
    pending: list[str] = []
    size = 0
    for text in texts:
        for line in (text + "\n\n").splitlines(keepends=True):
            pending.append(line)
            size += len(line.encode("utf-8"))
            if size >= doc_bytes:
                piece = "".join(pending).strip()
                if piece:
                    out.append(piece)
                pending, size = [], 0
    piece = "".join(pending).strip()
    if piece:
        out.append(piece)
    return out


def plant(texts: list[str], folder: Path, seed: int = 0) -> dict:
    """Write the corpus with planted copies as JSONL files; returns who is a copy of whom and how."""
    rng = random.Random(seed)
    eligible = [i for i, t in enumerate(texts) if 200 <= len(t.split())]
    chosen = rng.sample(eligible, min(len(eligible), max(3, len(texts) // 4)))
    records: list[tuple[float, dict]] = [(i, {"id": f"o{i}", "text": t}) for i, t in enumerate(texts)]
    planted: dict[str, dict] = {}
    for k, i in enumerate(chosen):
        kind = ("exact", "changed", "tail")[k % 3]
        text = texts[i]
        if kind == "exact":
            copy, sim = text, 1.0
        else:
            copy, sim = text, 1.0
            for share in (0.01, 0.015, 0.02, 0.03) if kind == "changed" else (0.08, 0.12, 0.16, 0.2):
                copy = _changed(text, rng, share) if kind == "changed" else _tailed(text, rng, share, texts[(i + 7) % len(texts)])
                sim = jaccard(text, copy)
                if sim <= 0.9:
                    break
            if not 0.8 <= sim <= 0.9:
                continue
        cid = f"{kind[0]}{k}"
        planted[cid] = {"of": f"o{i}", "kind": kind, "jaccard": sim}
        records.append((rng.uniform(i + 0.5, len(texts)), {"id": cid, "text": copy}))
    records.sort(key=lambda r: r[0])
    folder.mkdir(parents=True, exist_ok=True)
    files, size, out = [], 0, None
    for _, record in records:
        if out is None or size >= FILE_BYTES:
            if out:
                out.close()
            files.append(str(folder / f"part-{len(files):05d}.jsonl"))
            out, size = open(files[-1], "w", encoding="utf-8"), 0
        line = json.dumps(record, ensure_ascii=False) + "\n"
        out.write(line)
        size += len(line)
    if out:
        out.close()
    return {"files": files, "records": len(records), "originals": len(texts), "planted": planted,
            "text_mb": sum(len(t.encode()) for _, r in records for t in [r["text"]]) / 1e6}


def score(kept_ids: list, corpus: dict) -> dict:
    """Recall on planted copies; originals kept, of all and of the unique ones (no natural near twin before them)."""
    kept = set(map(str, kept_ids))
    planted = corpus["planted"]
    near = [c for c, p in planted.items() if p["kind"] != "exact"]
    exact = [c for c, p in planted.items() if p["kind"] == "exact"]
    originals = [f"o{i}" for i in range(corpus["originals"])]
    unique = [o for o in originals if o not in corpus.get("natural", ())]
    # datatrove keeps some cluster member other than the first: a pair is deduplicated when not both stay
    resolved = sum(not (c in kept and planted[c]["of"] in kept) for c in near)
    return {"near_recall": sum(c not in kept for c in near) / max(1, len(near)),
            "near_pairs_resolved": resolved / max(1, len(near)),
            "exact_recall": sum(c not in kept for c in exact) / max(1, len(exact)),
            "originals_kept": sum(o in kept for o in originals) / len(originals),
            "unique_originals_kept": sum(o in kept for o in unique) / max(1, len(unique)),
            "in_input_order": list(map(str, kept_ids)) == [i for i in _order(corpus) if i in kept]}


def _order(corpus: dict) -> list:
    return [str(json.loads(line)["id"]) for f in corpus["files"] for line in Path(f).read_text(encoding="utf-8").splitlines()]


def precision(work: Path, corpus: dict) -> dict:
    """Our candidate and verified pairs against the exact Jaccard of their texts."""
    from llm.data.corpus_dedup.bands import EDGE_ROW
    from llm.data.corpus_dedup.workdir import split_id

    records = [[json.loads(line) for line in Path(f).read_text(encoding="utf-8").splitlines()] for f in corpus["files"]]
    texts = [[r["text"] for r in part] for part in records]
    ids = [[r["id"] for r in part] for part in records]
    edges = np.concatenate([np.fromfile(p, dtype=EDGE_ROW) for p in sorted((work / "bands").glob("*.pairs"))])
    pairs = {}
    for a, b, sim in zip(edges["a"].tolist(), edges["b"].tolist(), edges["sim"].tolist()):
        pairs[(a, b)] = sim
    fa, ia = split_id(np.array([p[0] for p in pairs], dtype=np.uint64))
    fb, ib = split_id(np.array([p[1] for p in pairs], dtype=np.uint64))
    truth = [jaccard(texts[x][i], texts[y][j]) for x, i, y, j in zip(fa.tolist(), ia.tolist(), fb.tolist(), ib.tolist())]
    est = list(pairs.values())
    # natural near duplicates of the real text: an original with an earlier original at exact Jaccard >= threshold
    later = [ids[y][j] for x, i, y, j, t in zip(fa.tolist(), ia.tolist(), fb.tolist(), ib.tolist(), truth)
             if t >= THRESHOLD and ids[x][i].startswith("o") and ids[y][j].startswith("o")]
    corpus["natural"] = sorted(set(later))
    verified = [t for t, e in zip(truth, est) if e >= THRESHOLD]
    return {"natural_near_duplicate_originals": len(corpus["natural"]), "candidate_pairs": len(truth), "candidates_true": sum(t >= THRESHOLD for t in truth),
            "verified_pairs": len(verified), "verified_true": sum(t >= THRESHOLD for t in verified),
            "precision": sum(t >= THRESHOLD for t in verified) / max(1, len(verified)),
            "verified_true_over_0_7": sum(t >= 0.7 for t in verified) / max(1, len(verified)),
            "estimate_error_mean": float(np.mean(np.abs(np.array(est) - np.array(truth)))) if truth else 0.0}


# The scale runs hold a chunk far smaller than either corpus: memory is bounded by a chunk (plus the
# largest record), so RSS stays flat only once a corpus spans several chunks. With the default chunk
# (50,000 records) both bench corpora fit in one, and RSS would grow with the corpus by construction.
SCALE_CHUNK_RECORDS = 256


def run(corpus_mb: float, repeat: int, workers: int, cache_dir: Path, scale: bool = True, say=print) -> dict:
    root = Path(tempfile.mkdtemp(prefix="bench-dedup-"))
    try:
        results: dict = {"threshold": THRESHOLD, "ngram": NGRAM, "num_perm": NUM_PERM, "workers": workers,
                         "repeat": repeat, "runs": {}, "scale": {}, "scale_chunk_records": SCALE_CHUNK_RECORDS}
        sizes = [("1x", corpus_mb)] + ([("4x", corpus_mb * 4)] if scale else [])
        corpora = {}
        for tag, mb in sizes:
            meta = build_corpus(cache_dir, mb)
            texts = [t for p in corpus_paths(meta) for t in iter_texts(p)]
            corpora[tag] = plant(texts, root / f"in-{tag}")
            c = corpora[tag]
            sims = [p["jaccard"] for p in c["planted"].values() if p["kind"] != "exact"]
            results[f"corpus_{tag}"] = {"records": c["records"], "originals": c["originals"], "text_mb": round(c["text_mb"], 1),
                                        "largest_record_kb": round(max(len(t.encode()) for t in texts) / 1024),
                                        "planted": {k: sum(p["kind"] == k for p in c["planted"].values())
                                                    for k in ("exact", "changed", "tail")},
                                        "planted_near_jaccard": [round(min(sims), 3), round(statistics.median(sims), 3),
                                                                 round(max(sims), 3)] if sims else None}
            say(f"dedup bench: {tag}: {c['records']:,} records, {c['text_mb']:.1f} MB, {len(c['planted'])} planted")
        c = corpora["1x"]
        ours_spec = {"impl": "dedup", "scenario": "ours", "inputs": c["files"], "threshold": THRESHOLD,
                     "workers": workers, "num_perm": NUM_PERM, "ngram": NGRAM}
        first = run_worker(sys.executable, {**ours_spec, "output": str(root / "ours-probe"), "keep_work": True})
        if "error" in first:
            raise RuntimeError(first["error"])
        bands, rows = first["bands"], first["rows"]
        results["bands"], results["rows"] = bands, rows
        results["precision"] = precision(root / "ours-probe" / ".dedup-work", c)
        results["ours_probe_quality"] = score(first["kept_ids"], c)
        shutil.rmtree(root / "ours-probe", ignore_errors=True)
        peer = {"inputs": c["files"], "input_dir": str(root / "in-1x"), "threshold": THRESHOLD, "num_perm": NUM_PERM,
                "ngram": NGRAM, "bands": bands, "rows": rows, "workers": workers, "tasks": workers}
        cases = {"ours": {**ours_spec}, "datatrove": {"impl": "dedup", "scenario": "datatrove", **peer},
                 "datasketch": {"impl": "dedup", "scenario": "datasketch", **peer}}
        for rep in range(repeat):
            for who, spec in cases.items():  # A B C A B C
                if who == "datasketch" and rep:
                    continue  # single-process Python reference: its quality is what matters, once is enough
                out = root / f"{who}-{rep}"
                res = run_worker(sys.executable, {**spec, "output": str(out)})
                shutil.rmtree(out, ignore_errors=True)
                if "error" in res:
                    results["runs"].setdefault(who, []).append({"error": res["error"][-1500:]})
                    say(f"dedup bench: {who}: {res['error'][-300:]}")
                    continue
                row = {"seconds": res["seconds"], "records_per_s": c["records"] / res["seconds"],
                       "records_per_cpu_s": c["records"] / res["cpu_s"],
                       "peak_rss_mb": res["peak_rss_mb"], "peak_pss_mb": res["peak_pss_mb"], "cpu_s": res["cpu_s"],
                       **score(res["kept_ids"], c)}
                results["runs"].setdefault(who, []).append(row)
                say(f"dedup bench: {who} rep {rep}: {row['records_per_s']:.0f} records/s, RSS {row['peak_rss_mb']:.0f} MB, "
                    f"near recall {row['near_recall']:.3f}, originals kept {row['originals_kept']:.4f}")
        if scale:
            for rep in range(repeat):
                for tag in ("1x", "4x"):
                    cc = corpora[tag]
                    out = root / f"scale-{tag}-{rep}"
                    res = run_worker(sys.executable, {**ours_spec, "inputs": cc["files"], "output": str(out),
                                                      "chunk_records": SCALE_CHUNK_RECORDS})
                    shutil.rmtree(out, ignore_errors=True)
                    if "error" in res:
                        results["scale"].setdefault(tag, []).append({"error": res["error"][-1500:]})
                        continue
                    results["scale"].setdefault(tag, []).append({
                        "records_per_s": cc["records"] / res["seconds"], "peak_rss_mb": res["peak_rss_mb"],
                        "peak_pss_mb": res["peak_pss_mb"], "near_recall": score(res["kept_ids"], cc)["near_recall"]})
        results["summary"] = summarize(results)
        return results
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _median(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if key in r]
    return statistics.median(values) if values else None


def summarize(results: dict) -> dict:
    runs = results["runs"]
    out = {who: {k: _median(rows, k) for k in ("records_per_s", "records_per_cpu_s", "peak_rss_mb", "near_recall", "originals_kept",
                                               "exact_recall", "unique_originals_kept", "near_pairs_resolved", "seconds")} for who, rows in runs.items()}
    ours, dt = out.get("ours", {}), out.get("datatrove", {})
    if ours.get("records_per_s") and dt.get("records_per_s"):
        # paired per repeat: the same machine state for both
        pairs = [a["records_per_s"] / b["records_per_s"] for a, b in zip(runs["ours"], runs["datatrove"])
                 if "records_per_s" in a and "records_per_s" in b]
        out["ours_over_datatrove_records_per_s"] = statistics.median(pairs) if pairs else None
        cpu = [a["records_per_cpu_s"] / b["records_per_cpu_s"] for a, b in zip(runs["ours"], runs["datatrove"])
               if "records_per_cpu_s" in a and "records_per_cpu_s" in b]
        out["ours_over_datatrove_records_per_cpu_s"] = statistics.median(cpu) if cpu else None
    for tag in ("1x", "4x"):
        rows = results["scale"].get(tag, [])
        out[f"scale_{tag}"] = {k: _median(rows, k) for k in ("records_per_s", "peak_rss_mb", "peak_pss_mb")}
    return out


NAMES = {"ours": "ours (llm.data.dedup_corpus)", "datatrove": "datatrove MinHash pipeline", "datasketch": "datasketch MinHashLSH"}


def markdown(results: dict) -> list[str]:
    """The docs/benchmarks.md section."""
    s, c = results["summary"], results["corpus_1x"]
    pr = results["precision"]
    lines = ["", "## Dedup: planted duplicates in real text (MinHash-LSH)", "",
             f"`python -m bench.dedup`: {c['records']:,} records ({c['text_mb']} MB; {c['originals']:,} originals of the "
             f"bench corpus plus planted copies after them: {c['planted']['exact']} exact, {c['planted']['changed']} "
             f"with ~1% of words changed, {c['planted']['tail']} with a short tail; true Jaccard of the near ones "
             f"{c['planted_near_jaccard'][0]}-{c['planted_near_jaccard'][2]}, median {c['planted_near_jaccard'][1]}). "
             f"Threshold {results['threshold']}, word {results['ngram']}-grams, {results['num_perm']} permutations, "
             f"{results['bands']} bands x {results['rows']} rows for all three; {results['workers']} processes "
             f"(datasketch: one); medians of {results['repeat']} interleaved repeats.", "",
             "| contestant | records/s | records per CPU s | peak RSS MB (tree) | near-dup recall | exact-copy recall | originals kept | unique originals kept |",
             "|---|---|---|---|---|---|---|---|"]
    for who in ("ours", "datatrove", "datasketch"):
        r = s.get(who)
        if not r or r.get("records_per_s") is None:
            err = next((x["error"] for x in results["runs"].get(who, []) if "error" in x), "not run")
            lines.append(f"| {NAMES[who]} | error: {err.splitlines()[-1][:120]} | | | | | | |")
            continue
        cpu = f"{r['records_per_cpu_s']:,.0f}" if r.get("records_per_cpu_s") else "n/a"
        lines.append(f"| {NAMES[who]} | {r['records_per_s']:,.0f} | {cpu} | {r['peak_rss_mb']:,.0f} | {r['near_recall']:.3f} | "
                     f"{r['exact_recall']:.3f} | {r['originals_kept']:.4f} | {r['unique_originals_kept']:.4f} |")
    ratio = s.get("ours_over_datatrove_records_per_s")
    cpu_ratio = s.get("ours_over_datatrove_records_per_cpu_s")
    resolved = ", ".join(f"{who} {s[who]['near_pairs_resolved']:.3f}" for who in ("ours", "datatrove", "datasketch")
                         if s.get(who, {}).get("near_pairs_resolved") is not None)
    lines += ["",
              f"- ours / datatrove, paired per repeat: **{ratio:.2f}x** records/s" if ratio else "- ours / datatrove: n/a",
              f"- ours / datatrove records per CPU second (user + system of the process tree): **{cpu_ratio:.2f}x**"
              if cpu_ratio else "- ours / datatrove per CPU second: n/a",
              f"- near-dup recall counts the planted copy removed (it comes after its original). Planted near pairs "
              f"not both kept, whichever went: {resolved}. datatrove keeps a cluster member other than the first in "
              "input order (so it often drops the original and keeps the copy) and clusters every candidate pair "
              "without verifying it",
              f"- unique originals: the {c['originals'] - pr['natural_near_duplicate_originals']:,} originals without an "
              f"earlier original at exact Jaccard >= {results['threshold']} (the real text has "
              f"{pr['natural_near_duplicate_originals']} such natural near duplicates, found among the candidate pairs "
              "and checked exactly); removing those is right, so `originals kept` counts them against everyone",
              f"- precision of our verified pairs against exact Jaccard >= {results['threshold']}: "
              f"{pr['verified_true']:,} of {pr['verified_pairs']:,} ({pr['precision']:.3f}; "
              f"{pr['verified_true_over_0_7']:.3f} have exact Jaccard >= 0.7); candidates before verification: "
              f"{pr['candidate_pairs']:,}, of which {pr['candidates_true']:,} truly >= {results['threshold']}; "
              f"mean |estimate - exact Jaccard| {pr['estimate_error_mean']:.3f}"]
    if s.get("scale_4x", {}).get("records_per_s"):
        a, b = s["scale_1x"], s["scale_4x"]
        c4 = results["corpus_4x"]
        chunk = results.get("scale_chunk_records")
        lines += [f"- scale, ours{f' (chunks of {chunk} records)' if chunk else ''}: 1x ({c['records']:,} records) "
                  f"{a['records_per_s']:,.0f} records/s, peak RSS "
                  f"{a['peak_rss_mb']:,.0f} MB (PSS {a['peak_pss_mb']:,.0f}); 4x ({c4['records']:,} records) "
                  f"{b['records_per_s']:,.0f} records/s, peak RSS {b['peak_rss_mb']:,.0f} MB (PSS {b['peak_pss_mb']:,.0f}): "
                  f"RSS x{b['peak_rss_mb'] / a['peak_rss_mb']:.2f} for 4x the records. Memory follows a scan chunk "
                  f"and the largest record, not the corpus: the largest record is {c.get('largest_record_kb', '?')} KB "
                  f"at 1x and {c4.get('largest_record_kb', '?')} KB at 4x (real files)"]
    return lines


def latest() -> dict | None:
    """The newest saved dedup result (docs/benchmarks.md keeps its section when other scenarios are rerun)."""
    return newest("dedup")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.dedup", description=__doc__.splitlines()[0])
    parser.add_argument("--corpus-mb", type=float, default=8.0, help="MB of real text at 1x (default 8; 4x is also run)")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--no-scale", action="store_true", help="skip the 1x / 4x scale runs")
    parser.add_argument("--cache-dir", type=Path, default=REPO_ROOT / ".bench_cache")
    parser.add_argument("--results", default=None)
    args = parser.parse_args(argv)
    results = run(args.corpus_mb, args.repeat, args.workers, args.cache_dir, scale=not args.no_scale,
                  say=lambda m: print(m, file=sys.stderr, flush=True))
    out = Path(args.results or RESULTS / f"dedup-{time.strftime('%Y%m%d-%H%M')}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print("\n".join(markdown(results)))


if __name__ == "__main__":
    main()
