"""The `dedup` scenario: planted duplicates in real text; speed, recall, originals kept and precision, ours vs datasketch and datatrove.

`python -m bench.dedup [--corpus-mb 40] [--doc-bytes 2048] [--repeat 3] [--scale-docs 1000000]`
(also `python -m bench --only dedup`, smaller and without the scale run): the bench corpus (real
text, bench/corpus.py), cut into documents of ~2 KB, gets planted copies after their originals:
exact copies, copies with ~1% of the words changed and copies with a short tail added, each
kept only when its true Jaccard similarity of word 5-grams to the original is in [0.8, 0.9]
for the near ones. Ours (`llm.data.dedup_corpus`, with each MinHash engine), datatrove's MinHash
pipeline (same 5-grams, permutations, bands and rows, whitespace words for both) and datasketch's
MinHashLSH (the reference, one process, in input order, as its users write it) dedup it at
threshold 0.8; each runs in its own subprocess, timed from launch to exit (peak RSS of the process
tree). Quality: recall on the planted near copies, share of originals kept, and the precision of
each engine's verified pairs against their exact Jaccard. Scale: ours on 10^6 documents (time, peak RSS).
Results in bench/results/dedup-*.json; the table goes in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import compileall
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
from bench.runners.dedup import kept_ids

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


CONTESTANTS = ("ours", "ours-numpy", "datasketch", "datatrove")
DOC_BYTES = 2048  # documents of ~2 KB (about a web page's text): 40 MB of bench text gives ~25,000 records


def _ours_engines() -> list[str]:
    from llm.data.corpus_dedup.minhash import rensa_available

    return ["rensa", "numpy"] if rensa_available() else ["numpy"]


def scale_corpus(texts: list[str], docs: int, folder: Path) -> dict:
    """`docs` distinct documents for the scale run: the planted corpus again and again, each pass's words tagged.

    Pass v > 0 appends `~v` to every word (whitespace runs become one space, as in a planted copy), so
    no two passes share a shingle and every pass holds the planted duplicates of the ratio corpus at
    the same similarity. Written as JSONL files of ~64 MB.
    """
    folder.mkdir(parents=True, exist_ok=True)
    files, n, size, out, v = [], 0, 0, None, 0
    while n < docs:
        tag = f"~{v}"
        for text in texts:
            if n >= docs:
                break
            if out is None or size >= 64 << 20:
                if out:
                    out.close()
                files.append(str(folder / f"part-{len(files):05d}.jsonl"))
                out, size = open(files[-1], "w", encoding="utf-8"), 0
            body = text if v == 0 else " ".join(w + tag for w in text.split())  # a copy and its original alike
            line = json.dumps({"id": n, "text": body}, ensure_ascii=False) + "\n"
            out.write(line)
            size += len(line)
            n += 1
        v += 1
    if out:
        out.close()
    return {"files": files, "records": n, "text_gb": sum(Path(f).stat().st_size for f in files) / 1e9, "passes": v}


def _spread(values: list[float]) -> dict | None:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)} if values else None


def run(corpus_mb: float, repeat: int, workers: int, cache_dir: Path, scale_docs: int = 0,
        doc_bytes: int = DOC_BYTES, contestants: tuple[str, ...] = CONTESTANTS, say=print) -> dict:
    root = Path(tempfile.mkdtemp(prefix="bench-dedup-"))
    # Bytecode for our source tree, as an installed wheel has it (datasketch's site-packages have theirs): with
    # PYTHONDONTWRITEBYTECODE set (as on this machine), every run of ours would compile ~80 modules again.
    compileall.compile_dir(str(REPO_ROOT / "src"), quiet=1)
    try:
        engines = _ours_engines()
        contestants = tuple(c for c in contestants if c != "ours-numpy" or "rensa" in engines)
        results: dict = {"threshold": THRESHOLD, "ngram": NGRAM, "num_perm": NUM_PERM, "workers": workers,
                         "repeat": repeat, "doc_bytes": doc_bytes, "runs": {}, "engines": {}, "scale": {}}
        meta = build_corpus(cache_dir, corpus_mb)
        texts = recut([t for p in corpus_paths(meta) for t in iter_texts(p)], doc_bytes)
        c = plant(texts, root / "in-1x")
        sims = [p["jaccard"] for p in c["planted"].values() if p["kind"] != "exact"]
        results["corpus_1x"] = {"records": c["records"], "originals": c["originals"], "text_mb": round(c["text_mb"], 1),
                                "largest_record_kb": round(max(len(t.encode()) for t in texts) / 1024),
                                "planted": {k: sum(p["kind"] == k for p in c["planted"].values())
                                            for k in ("exact", "changed", "tail")},
                                "planted_near_jaccard": [round(min(sims), 3), round(statistics.median(sims), 3),
                                                         round(max(sims), 3)] if sims else None}
        say(f"dedup bench: {c['records']:,} records, {c['text_mb']:.1f} MB, {len(c['planted'])} planted")
        ours_spec = {"impl": "dedup", "scenario": "ours", "inputs": c["files"], "threshold": THRESHOLD,
                     "workers": workers, "num_perm": NUM_PERM, "ngram": NGRAM}
        # one probe per engine, its work folder kept: the precision of its verified pairs against exact Jaccard
        for engine in engines:
            first = run_worker(sys.executable, {**ours_spec, "minhash": engine, "output": str(root / "probe"),
                                                "keep_work": True})
            if "error" in first:
                raise RuntimeError(first["error"])
            first["kept_ids"] = kept_ids("ours", root / "probe")
            results["bands"], results["rows"] = first["bands"], first["rows"]
            pr = precision(root / "probe" / ".dedup-work", c)
            results["engines"][engine] = {"precision": pr, "quality": score(first["kept_ids"], c)}
            shutil.rmtree(root / "probe", ignore_errors=True)
        peer = {"inputs": c["files"], "input_dir": str(root / "in-1x"), "threshold": THRESHOLD, "num_perm": NUM_PERM,
                "ngram": NGRAM, "bands": results["bands"], "rows": results["rows"], "workers": workers, "tasks": workers}
        cases = {"ours": {**ours_spec, "minhash": engines[0]}, "ours-numpy": {**ours_spec, "minhash": "numpy"},
                 "datatrove": {"impl": "dedup", "scenario": "datatrove", **peer},
                 "datasketch": {"impl": "dedup", "scenario": "datasketch", **peer}}
        for rep in range(repeat):
            for who in contestants:  # A B C D A B C D: every repeat pairs ours with datasketch on the same machine state
                out = root / f"{who}-{rep}"
                res = run_worker(sys.executable, {**cases[who], "output": str(out)})
                if "error" not in res and "kept_ids" not in res:  # read here, outside the measured process
                    res["kept_ids"] = kept_ids(cases[who]["scenario"], out)
                shutil.rmtree(out, ignore_errors=True)
                if "error" in res:
                    results["runs"].setdefault(who, []).append({"error": res["error"][-1500:]})
                    say(f"dedup bench: {who}: {res['error'][-300:]}")
                    continue
                row = {"seconds": res["seconds"], "wall_s": res["wall_s"],
                       "records_per_s": c["records"] / res["wall_s"],  # the whole process: start, imports, pools
                       "records_per_s_inner": c["records"] / res["seconds"],
                       "records_per_cpu_s": c["records"] / res["cpu_s"],
                       "peak_rss_mb": res["peak_rss_mb"], "peak_pss_mb": res["peak_pss_mb"], "cpu_s": res["cpu_s"],
                       **score(res["kept_ids"], c)}
                results["runs"].setdefault(who, []).append(row)
                say(f"dedup bench: {who} rep {rep}: {row['records_per_s']:.0f} records/s (whole process), "
                    f"RSS {row['peak_rss_mb']:.0f} MB, near recall {row['near_recall']:.3f}, "
                    f"originals kept {row['originals_kept']:.4f}")
        if scale_docs:
            records = [json.loads(line)["text"] for f in c["files"] for line in Path(f).read_text(encoding="utf-8").splitlines()]
            big = scale_corpus(records, scale_docs, root / "in-scale")
            del records
            results["corpus_scale"] = {k: big[k] for k in ("records", "text_gb", "passes")}
            say(f"dedup bench: scale: {big['records']:,} records, {big['text_gb']:.2f} GB")
            res = run_worker(sys.executable, {**cases["ours"], "inputs": big["files"], "output": str(root / "scale")},
                             timeout_s=3600)
            shutil.rmtree(root / "scale", ignore_errors=True)
            shutil.rmtree(root / "in-scale", ignore_errors=True)
            if "error" in res:
                results["scale"] = {"error": res["error"][-1500:]}
            else:
                results["scale"] = {"records": big["records"], "wall_s": res["wall_s"], "seconds": res["seconds"],
                                    "records_per_s": big["records"] / res["wall_s"], "peak_rss_mb": res["peak_rss_mb"],
                                    "peak_pss_mb": res["peak_pss_mb"], "cpu_s": res["cpu_s"], "kept": res["kept"],
                                    "minhash": res["minhash"]}
            say(f"dedup bench: scale: {results['scale']}")
        results["summary"] = summarize(results)
        return results
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _median(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if key in r]
    return statistics.median(values) if values else None


def _paired(runs: dict, a: str, b: str, key: str) -> dict | None:
    """a / b of `key`, paired per repeat (the same machine state): median, min and max."""
    return _spread([x[key] / y[key] for x, y in zip(runs.get(a, []), runs.get(b, [])) if key in x and key in y])


def summarize(results: dict) -> dict:
    runs = results["runs"]
    keys = ("records_per_s", "records_per_s_inner", "records_per_cpu_s", "peak_rss_mb", "near_recall", "originals_kept",
            "exact_recall", "unique_originals_kept", "near_pairs_resolved", "wall_s")
    out: dict = {who: {k: _median(rows, k) for k in keys} for who, rows in runs.items()}
    for who in ("ours", "ours-numpy", "datatrove"):
        out[f"{who}_over_datasketch"] = _paired(runs, who, "datasketch", "records_per_s")
        out[f"{who}_over_datasketch_cpu"] = _paired(runs, who, "datasketch", "records_per_cpu_s")
    return out


NAMES = {"ours": "ours (llm.data.dedup_corpus, rensa)", "ours-numpy": "ours, --minhash numpy",
         "datatrove": "datatrove MinHash pipeline", "datasketch": "datasketch MinHashLSH"}


def _ratio(r: dict | None) -> str:
    return f"**{r['median']:.2f}x** [{r['min']:.2f}-{r['max']:.2f}]" if r else "n/a"


def markdown(results: dict) -> list[str]:
    """The docs/benchmarks.md section."""
    if "engines" not in results:  # a result of the earlier layout (before --minhash)
        return []
    s, c = results["summary"], results["corpus_1x"]
    lines = ["", "## Dedup: planted duplicates in real text (MinHash-LSH)", "",
             f"`python -m bench.dedup`: {c['records']:,} records ({c['text_mb']} MB; {c['originals']:,} originals: the "
             f"bench corpus cut into documents of ~{results['doc_bytes']:,} bytes, plus planted copies after them: "
             f"{c['planted']['exact']:,} exact, {c['planted']['changed']:,} with ~1% of words changed, "
             f"{c['planted']['tail']:,} with a short tail; true Jaccard of the near ones "
             f"{c['planted_near_jaccard'][0]}-{c['planted_near_jaccard'][2]}, median {c['planted_near_jaccard'][1]}). "
             f"Threshold {results['threshold']}, word {results['ngram']}-grams, {results['num_perm']} permutations, "
             f"{results['bands']} bands x {results['rows']} rows for all; {results['workers']} processes "
             f"(datasketch: one, as its users write it); medians of {results['repeat']} interleaved repeats. "
             "records/s counts each whole process (start, imports, worker pools) from launch to exit.", "",
             "| contestant | records/s | / datasketch [range] | records per CPU s | peak RSS MB (tree) | near-dup recall "
             "| exact-copy recall | originals kept | unique originals kept |",
             "|---|---|---|---|---|---|---|---|---|"]
    for who in ("ours", "ours-numpy", "datatrove", "datasketch"):
        r = s.get(who)
        if not r or r.get("records_per_s") is None:
            if results["runs"].get(who):
                err = next((x["error"] for x in results["runs"][who] if "error" in x), "not run")
                lines.append(f"| {NAMES[who]} | error: {err.splitlines()[-1][:120]} | | | | | | | |")
            continue
        ratio = "1" if who == "datasketch" else _ratio(s.get(f"{who}_over_datasketch"))
        lines.append(f"| {NAMES[who]} | {r['records_per_s']:,.0f} | {ratio} | {r['records_per_cpu_s']:,.0f} | "
                     f"{r['peak_rss_mb']:,.0f} | {r['near_recall']:.3f} | {r['exact_recall']:.3f} | "
                     f"{r['originals_kept']:.4f} | {r['unique_originals_kept']:.4f} |")
    lines.append("")
    for engine, e in results["engines"].items():
        pr, q = e["precision"], e["quality"]
        lines.append(f"- `--minhash {engine}`: precision of the verified pairs against exact Jaccard >= "
                     f"{results['threshold']}: {pr['verified_true']:,} of {pr['verified_pairs']:,} ({pr['precision']:.3f}; "
                     f"{pr['verified_true_over_0_7']:.3f} have exact Jaccard >= 0.7); candidates {pr['candidate_pairs']:,}, "
                     f"of which {pr['candidates_true']:,} truly >= {results['threshold']}; mean |estimate - exact| "
                     f"{pr['estimate_error_mean']:.3f}; near recall {q['near_recall']:.3f}, originals kept "
                     f"{q['originals_kept']:.4f}, unique originals kept {q['unique_originals_kept']:.4f}")
    lines.append(f"- records per CPU second (user + system of the process tree), ours / datasketch: "
                 f"{_ratio(s.get('ours_over_datasketch_cpu'))}")
    lines.append("- near-dup recall counts the planted copy removed (it comes after its original); unique originals: "
                 "those without an earlier original at exact Jaccard >= the threshold (natural near duplicates of the "
                 "real text, found among the candidate pairs): removing those is right")
    sc = results.get("scale") or {}
    if sc.get("records_per_s"):
        cs = results["corpus_scale"]
        lines.append(f"- scale: {sc['records']:,} documents ({cs['text_gb']:.2f} GB of JSONL: the corpus above "
                     f"{cs['passes']} times, each pass's words tagged so that passes share no shingle), "
                     f"`--minhash {sc['minhash']}`, {results['workers']} workers: {sc['wall_s']:.0f} s "
                     f"({sc['records_per_s']:,.0f} records/s, whole process), peak RSS of the process tree "
                     f"{sc['peak_rss_mb']:,.0f} MB (PSS {sc['peak_pss_mb']:,.0f} MB), {sc['kept']:,} kept")
    elif sc.get("error"):
        lines.append(f"- scale: error: {sc['error'].splitlines()[-1][:200]}")
    lines += larger_line(newest(LARGE))
    return lines


LARGE = "dedup_large"  # results of `--large`: a larger corpus, where the fixed costs of a run weigh less


def larger_line(big: dict | None) -> list[str]:
    """The table's ratios on the larger corpus of a `--large` run, if one was saved."""
    if not big or "summary" not in big:
        return []
    s, c = big["summary"], big["corpus_1x"]
    if not s.get("ours") or not s.get("datasketch") or not s.get("ours_over_datasketch"):
        return []
    return [f"- larger corpus (`python -m bench.dedup --large --corpus-mb {big.get('corpus_mb', 0):g}`, the same kind: "
            f"{c['records']:,} records of ~{big['doc_bytes']:,} bytes, {c['text_mb']} MB, medians of {big['repeat']}): "
            f"ours {s['ours']['records_per_s']:,.0f} records/s, datasketch {s['datasketch']['records_per_s']:,.0f}: "
            f"{_ratio(s['ours_over_datasketch'])} (whole processes), {_ratio(s.get('ours_over_datasketch_cpu'))} "
            f"per CPU second; near recall {s['ours']['near_recall']:.3f} (datasketch {s['datasketch']['near_recall']:.3f}), "
            f"unique originals kept {s['ours']['unique_originals_kept']:.4f} (datasketch "
            f"{s['datasketch']['unique_originals_kept']:.4f}), all originals kept {s['ours']['originals_kept']:.4f} "
            f"(datasketch {s['datasketch']['originals_kept']:.4f}: this much more text holds many natural near "
            "duplicates, e.g. C headers)"]


def latest() -> dict | None:
    """The newest saved dedup result (docs/benchmarks.md keeps its section when other scenarios are rerun)."""
    return newest("dedup")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.dedup", description=__doc__.splitlines()[0])
    parser.add_argument("--corpus-mb", type=float, default=40.0, help="MB of real text (default 40: ~25,000 records)")
    parser.add_argument("--doc-bytes", type=int, default=DOC_BYTES,
                        help=f"cut the corpus into documents of about this many bytes (default {DOC_BYTES}; 0: as is)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--scale-docs", type=int, default=1_000_000,
                        help="documents of the scale run (time and peak RSS; default 10^6; 0: skip it)")
    parser.add_argument("--no-scale", action="store_true", help="skip the scale run (= --scale-docs 0)")
    parser.add_argument("--contestants", default=",".join(CONTESTANTS),
                        help=f"comma-separated, of {', '.join(CONTESTANTS)} (default: all)")
    parser.add_argument("--cache-dir", type=Path, default=REPO_ROOT / ".bench_cache")
    parser.add_argument("--results", default=None)
    parser.add_argument("--large", action="store_true",
                        help=f"save as results/{LARGE}-*.json: the docs' line for a larger corpus, not their table")
    args = parser.parse_args(argv)
    contestants = tuple(x for x in args.contestants.split(",") if x)
    if bad := [x for x in contestants if x not in CONTESTANTS]:
        parser.error(f"--contestants: unknown {', '.join(bad)} (choose from {', '.join(CONTESTANTS)})")
    results = run(args.corpus_mb, args.repeat, args.workers, args.cache_dir, 0 if args.no_scale else args.scale_docs,
                  args.doc_bytes, contestants, say=lambda m: print(m, file=sys.stderr, flush=True))
    results["corpus_mb"] = args.corpus_mb
    out = Path(args.results or RESULTS / f"{LARGE if args.large else 'dedup'}-{time.strftime('%Y%m%d-%H%M')}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print("\n".join(markdown(results)))


if __name__ == "__main__":
    main()
