"""The scenarios: which contestant runs what, interleaved A B A B, and the medians that come out."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from bench.context import (
    Context,
    dataset_dir,
    ensure_dataset,
    interleave,
    multiset_diff,
    result_rows,
    stream_epochs,
)
from bench.corpus import build_corpus, corpus_paths
from bench.runners.common import BLOCK

SCENARIOS = ["prepare", "stream", "integrity", "resume", "onthefly", "scale", "paths", "packing", "s3", "dedup",
             "mixelastic", "ledger", "prepare_gpt2"]
# run only when named in --only (s3 starts an S3 server and takes half an hour; mixelastic needs git's main)
OPT_IN = ["s3", "dedup", "mixelastic", "ledger", "prepare_gpt2"]



def probe(ctx: Context) -> None:
    """Mark every contestant that cannot be imported as skipped, with the reason."""
    checks = {
        "ours": "import llm.data as d; d.optimize; d.StreamingDataset; d.StreamingDataLoader",
        "litdata": "from litdata import optimize, StreamingDataset, StreamingDataLoader, TokensLoader",
        "mosaic": "from bench.runners.mosaic_peer import _import_streaming as f; f()",
        "hf": "import datasets",
    }
    import subprocess

    from bench.measure import REPO_ROOT

    started = {}
    for who, code in checks.items():  # all at once: each is an interpreter importing torch (seconds), untimed
        if who not in ctx.contestants:
            continue
        py = ctx.python_for(who)
        if not Path(py).exists():
            ctx.skipped[who] = f"python not found: {py} (pass --peer-python)"
            continue
        started[who] = subprocess.Popen([py, "-c", code], cwd=REPO_ROOT, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, text=True)
    for who, p in started.items():
        _, err = p.communicate()
        if p.returncode != 0:
            last = (err.strip().splitlines() or ["?"])[-1]
            ctx.skipped[who] = f"does not import: {last[:200]}"
    for who, why in ctx.skipped.items():
        ctx.say(f"skipping {who}: {why}")


def setup(ctx: Context) -> None:
    """Corpus and the canonical token stream (the tokens every contestant should write and deliver)."""
    ctx.corpus = build_corpus(ctx.cache_dir, ctx.corpus_mb)
    ctx.work_dir.mkdir(parents=True, exist_ok=True)
    index = ctx.work_dir / "tokens.json"
    if not index.exists():
        ctx.say(f"tokenizing {ctx.corpus['text_bytes'] / 1e6:.1f} MB once for the reference token stream")
        res = ctx.run("limit", "build_tokens", tokenizer=ctx.tokenizer, inputs=corpus_paths(ctx.corpus),
                      num_workers=ctx.workers, output=str(ctx.work_dir / "tokens.bin"), index=str(index))
        if "error" in res:
            raise RuntimeError(f"could not tokenize the corpus: {res['error']}")
    ctx.tokens = json.loads(index.read_text())


def scenario_prepare(ctx: Context) -> list[dict]:
    files = corpus_paths(ctx.corpus)
    cases = []
    for who in ("ours", "litdata", "mosaic", "limit"):
        if ctx.active(who):
            spec = {"tokenizer": ctx.tokenizer, "inputs": files, "num_workers": ctx.workers}
            if who != "limit":
                spec["output_dir"] = str(dataset_dir(ctx, who))
            else:  # the fastest identical engine's bare loop (ours' choice), not the peers' encoder
                spec["engine"] = "ours"
            cases.append((who, f"{ctx.workers} processes", "prepare", spec))
    runs = interleave(ctx, cases)
    for (who, _), rs in runs.items():
        if who != "limit" and rs and "error" not in rs[-1]:
            (dataset_dir(ctx, who) / "bench-done.json").write_text(json.dumps(rs[-1]))

    def derive(r: dict) -> None:
        r["mb_per_s"] = ctx.corpus["text_bytes"] / 1e6 / r["seconds"]
        r["tokens_per_s"] = ctx.tokens["tokens"] / r["seconds"]

    return result_rows(runs, ["mb_per_s", "tokens_per_s", "seconds", "cpu_s", "peak_rss_mb"], derive)


def scenario_stream(ctx: Context) -> list[dict]:
    cases = []
    ep = stream_epochs(ctx)
    for nw in (0, ctx.workers):
        for who in ("ours", "litdata", "mosaic"):
            if ctx.active(who) and (d := ensure_dataset(ctx, who)):
                cases.append((who, f"{nw} workers", "stream",
                              {"data_dir": str(d), "num_workers": nw, "epochs": ep}))
                if who == "ours" and nw > 0:
                    # Ours defaults to reader threads for token data; this is the like-for-like
                    # comparison with the peers' worker processes.
                    cases.append((who, f"{nw} workers, processes", "stream",
                                  {"data_dir": str(d), "num_workers": nw, "epochs": ep,
                                   "worker_backend": "processes"}))
        if nw == 0 and ctx.active("limit"):
            cases.append(("limit", "0 workers", "stream",
                          {"index": str(ctx.work_dir / "tokens.json"), "epochs": ep}))
    runs = interleave(ctx, cases)
    for (who, _case), rs in runs.items():
        ok = [r for r in rs if "error" not in r]
        if ok:
            ctx.epoch_batches[who] = ok[0]["batches"] // ep
    return result_rows(runs, ["tokens_per_s", "steady_tokens_per_s", "first_batch_s", "cpu_s", "peak_rss_mb",
                        "peak_anon_mb", "peak_pss_mb"])


def scenario_integrity(ctx: Context) -> list[dict]:
    """One shuffled epoch per contestant, every block hashed: how many tokens arrive, and how often."""
    rows = []
    for who in ("ours", "litdata", "mosaic"):
        if not (ctx.active(who) and (d := ensure_dataset(ctx, who))):
            continue
        hashes_out = ctx.work_dir / f"epoch-{who}.npy"
        # drop_last: count full blocks only, as the peers deliver (ours would pad the last one)
        res = ctx.run(who, "stream", data_dir=str(d), num_workers=0, hash=True, hashes_out=str(hashes_out),
                      drop_last=True)
        row = {"who": who, "case": "1 epoch", "tokens_written": ctx.tokens["tokens"]}
        if "error" in res:
            row["error"] = res["error"]
        else:
            h = np.load(hashes_out)
            _, counts = np.unique(h, return_counts=True)
            ctx.references[who] = hashes_out
            ctx.epoch_batches[who] = res["batches"]
            row.update(blocks=int(len(h)), distinct_blocks=int(len(counts)),
                       tokens_delivered=int(len(h)) * BLOCK,
                       tokens_lost=int(ctx.tokens["tokens"] - len(h) * BLOCK))
            if who == "ours":
                # Ours' blocks are the reference stream cut every 2049 tokens: check the content.
                row["vs_reference"] = multiset_diff(_canonical_hashes(ctx), h)
        rows.append(row)
    return rows


def _delivery(reference: Path, before: Path, after: list[Path]) -> dict:
    """How many of the epoch's blocks the interrupted run delivered once, more than once, never."""
    seen = np.concatenate([np.load(before), *[np.load(a) for a in after]])
    return multiset_diff(np.load(reference), seen)


def _canonical_hashes(ctx: Context) -> np.ndarray:
    """Hashes of the full blocks of the reference token stream (what ours must deliver, in any order)."""
    import xxhash

    mm = np.memmap(ctx.tokens["path"], dtype=np.dtype(ctx.tokens["dtype"]), mode="r")
    n = len(mm) // BLOCK
    rows = mm[: n * BLOCK].reshape(n, BLOCK)
    return np.array([xxhash.xxh3_64_intdigest(r.astype(np.int64).tobytes()) for r in rows], dtype=np.uint64)


def scenario_resume(ctx: Context) -> list[dict]:
    if not ctx.references:
        scenario_integrity(ctx)
    w = ctx.workers
    variants = [("ours", f"{w}->{w} workers", w, w, 1), ("ours", f"{w}->0 workers", w, 0, 1),
                ("ours", "1->2 ranks", w, w, 2), ("litdata", f"{w}->{w} workers", w, w, 1),
                ("litdata", f"{w}->0 workers", w, 0, 1)]
    cases, deliveries = [], {}
    saves: dict[tuple, tuple[Path, Path, dict]] = {}  # every load of a (who, point) resumes one saved state
    for pct in ctx.resume_at:
        for who, label, w_save, w_load, world in variants:
            if not ctx.active(who) or who not in ctx.references:
                continue
            d = dataset_dir(ctx, who)
            stop = max(1, ctx.epoch_batches[who] * pct // 100)
            tag = f"{who}-{label.replace(' ', '').replace('>', '')}-{pct}"
            key = (who, w_save, stop)  # saved in one process whatever the world size of the load
            if key not in saves:
                state = ctx.work_dir / f"state-{tag}"
                before = ctx.work_dir / f"before-{tag}.npy"
                saves[key] = (state, before, ctx.run(who, "resume_save", data_dir=str(d), num_workers=w_save,
                                                     stop_batches=stop, state_path=str(state),
                                                     hashes_out=str(before), drop_last=True))
            state, before, saved = saves[key]
            if "error" in saved:
                continue
            case = f"{label} @{pct}%"
            for rank in range(world):
                spec = {"data_dir": str(d), "num_workers": w_load, "state_path": str(state),
                        "hashes_out": str(ctx.work_dir / f"after-{tag}-r{rank}.npy"), "drop_last": True}
                if who == "ours":
                    spec.update(rank=rank, world_size=world)
                cases.append((who, case if world == 1 else f"{case} r{rank}", "resume_load", spec))
            deliveries[(who, case)] = (ctx.references[who], before,
                                       [ctx.work_dir / f"after-{tag}-r{r}.npy" for r in range(world)],
                                       saved.get("state_bytes"))
    runs = interleave(ctx, cases)
    # Merge the ranks of a world-size change: the first batch is ready when the slower rank has it.
    merged: dict[tuple[str, str], list[dict]] = {}
    for (who, case), rs in runs.items():
        key = (who, case.rsplit(" r", 1)[0] if case.endswith((" r0", " r1")) else case)
        if key not in merged:
            merged[key] = [dict(r) for r in rs]
        else:
            for m, r in zip(merged[key], rs, strict=True):
                if "error" in r:
                    m["error"] = r["error"]
                elif "error" not in m:
                    m["first_batch_s"] = max(m["first_batch_s"], r["first_batch_s"])
                    m["peak_rss_mb"] = max(m["peak_rss_mb"], r["peak_rss_mb"])
    rows = result_rows(merged, ["first_batch_s"])
    for row in rows:
        ref, before, after, state_bytes = deliveries[(row["who"], row["case"])]
        if "error" not in row and all(a.exists() for a in after):
            row["delivery"] = _delivery(ref, before, after)
        row["state_bytes"] = state_bytes
    return rows


def scenario_onthefly(ctx: Context) -> list[dict]:
    """The corpus as it is, then re-cut into short (~0.5 KB) and long (~7 KB) documents (bench/doclength.py)."""
    from bench.doclength import LENGTHS, recut_corpus

    nw = ctx.workers
    cuts = [("", ctx.corpus, ctx.tokens["tokens"])] if "as-is" in ctx.onthefly_cuts else []
    cuts += [(f"{name} docs, ", recut_corpus(ctx.corpus, ctx.cache_dir, name), None)
             for name in LENGTHS if name in ctx.onthefly_cuts]
    cases = []
    for prefix, corpus, _ in cuts:
        files = corpus_paths(corpus)
        if ctx.active("ours"):
            cases.append(("ours", f"{prefix}{nw} workers", "onthefly",
                          {"tokenizer": ctx.tokenizer, "corpus_dir": str(Path(corpus["dir"]) / "*.jsonl"),
                           "num_workers": nw}))
        if ctx.active("hf"):  # tuned (`in_order=False`, `prefetch_factor=8`): the faster of the two
            cases.append(("hf", f"{prefix}{nw} workers, tuned", "onthefly",
                          {"tokenizer": ctx.tokenizer, "inputs": files, "num_workers": nw, "tuned": True}))
        if ctx.active("limit"):  # the fastest identical engine's bare loop (ours' choice)
            cases.append(("limit", f"{prefix}{nw} processes", "prepare",
                          {"tokenizer": ctx.tokenizer, "inputs": files, "num_workers": nw, "engine": "ours"}))
    runs = interleave(ctx, cases)
    # Tokens each cut encodes to (EOS included): the canonical stream, or the limit's count of it.
    encoded = {}
    for prefix, _, tokens in cuts:
        limit_runs = [r for r in runs.get(("limit", f"{prefix}{nw} processes"), []) if "tokens" in r]
        encoded[prefix] = tokens or (limit_runs[0]["tokens"] if limit_runs else None)

    for (_, case), rs in runs.items():
        total = next((n for prefix, n in encoded.items() if prefix and case.startswith(prefix)), encoded.get(""))
        for r in rs:
            if "error" in r:
                continue
            if "tokens_per_s" not in r:  # the tokenizer limit
                r["tokens_per_s"] = r["tokens"] / r["seconds"]
            r["delivered_fraction"] = r["tokens"] / total if total else None
    return result_rows(runs, ["tokens_per_s", "first_batch_s", "delivered_fraction", "cpu_s", "peak_rss_mb"])


def scenario_scale(ctx: Context) -> list[dict]:
    nw = ctx.workers
    cases = []
    for who in ("ours", "litdata"):
        if not ctx.active(who):
            continue
        for tag, copies in (("1x", 1), ("4x", 4)):
            d = ensure_dataset(ctx, who, tag, copies)
            if d:
                cases.append((who, f"{tag}, {nw} workers", "stream",
                              {"data_dir": str(d), "num_workers": nw, "epochs": stream_epochs(ctx, copies)}))
    runs = interleave(ctx, cases)
    return result_rows(runs, ["peak_rss_mb", "peak_anon_mb", "peak_pss_mb", "tokens_per_s"])


def clean(ctx: Context) -> None:
    """Remove the prepared datasets of this corpus (they are rebuilt on demand)."""
    shutil.rmtree(ctx.work_dir, ignore_errors=True)


def scenario_paths(ctx: Context) -> list[dict]:
    from bench.paths import scenario_paths as run  # its own module: old vs new read paths of ours

    return run(ctx)


def scenario_packing(ctx: Context) -> list[dict]:
    from bench.packing import scenario_packing as run  # its own module: best-fit vs greedy, ours

    return run(ctx)


def scenario_s3(ctx: Context) -> list[dict]:
    from bench.s3 import S3Options  # its own module: a local S3 server, three readers
    from bench.s3 import scenario_s3 as run

    return run(ctx, S3Options(**ctx.s3))


def scenario_dedup(ctx: Context) -> dict:
    """Corpus dedup with planted duplicates, ours vs datatrove and datasketch (bench/dedup.py; 16 MB at most at 1x)."""
    from bench import dedup

    return dedup.run(min(ctx.corpus_mb, 16.0), ctx.repeat, ctx.workers, ctx.cache_dir, say=ctx.say)


def scenario_ledger(ctx: Context) -> dict:
    """The run ledger's bytes per sample and loader overhead at 2 workers (bench/ledger.py)."""
    from bench.ledger import scenario_ledger as run

    return run(ctx)


def scenario_mixelastic(ctx: Context) -> dict:
    """The shard mixture before (git main) and after issue 35, and its shares over a batch ramp (bench/mix_elastic.py)."""
    from bench.mix_elastic import scenario_mixelastic as run

    return run(ctx)


def scenario_prepare_gpt2(ctx: Context) -> list[dict]:
    """`llm-data optimize` vs LitData + tiktoken with GPT-2's vocabulary, whole processes (bench/prepare_gpt2.py)."""
    from bench.prepare_gpt2 import scenario_prepare_gpt2 as run

    return run(ctx)
