"""Dedup contestants, each run in its own subprocess by bench.worker: ours, datatrove's MinHash pipeline, datasketch.

Each returns its records/s (the harness adds peak RSS of the process tree and CPU time); the ids of
the records kept are read by the harness from the output folder afterwards (`kept_ids`), as a user
would read them, not inside the measured process (~0.2 s of JSON parsing for 20,000 records), except
datasketch's, which its loop collects as it goes.
"""

from __future__ import annotations

import json
import time
from pathlib import Path


def ours(spec: dict) -> dict:
    from llm.data import dedup_corpus

    t0 = time.perf_counter()
    report = dedup_corpus(spec["inputs"], spec["output"], near=spec["threshold"], num_workers=spec["workers"],
                          num_perm=spec["num_perm"], ngram=spec["ngram"], progress=False, keep_work=spec.get("keep_work", False),
                          chunk_records=spec.get("chunk_records", 50_000), minhash=spec.get("minhash", "auto"))
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "records": report["records_in"], "kept": report["kept"],
            "minhash": report["parameters"]["minhash"],
            "bands": report["parameters"]["bands"], "rows": report["parameters"]["rows"],
            "candidate_pairs": report["candidate_pairs"], "verified_pairs": report["verified_pairs"]}


class _Words:
    """datatrove's word tokenizer stand-in: whitespace words, as ours (its English one needs spaCy)."""

    def word_tokenize(self, text: str) -> list[str]:
        return text.split()


def datatrove(spec: dict) -> dict:
    import datatrove.pipeline.dedup.minhash as minhash
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter
    from datatrove.utils.hashing import HashConfig

    minhash.load_word_tokenizer = lambda language: _Words()  # noqa: ARG005 - before the steps are made
    # its xxhash wrapper passes str, which xxhash>=4 (ours) refuses (datatrove pins xxhash<4): encode first, as <4 did
    import xxhash

    minhash.create_hash_func = lambda config: lambda text: xxhash.xxh64_intdigest(text.encode("utf-8"))
    work = Path(spec["output"])
    config = minhash.MinhashConfig(n_grams=spec["ngram"], num_buckets=spec["bands"], hashes_per_bucket=spec["rows"],
                                   seed=1, hash_config=HashConfig(precision=64))
    tasks, workers = spec["tasks"], spec["workers"]
    reader = lambda: JsonlReader(spec["input_dir"], glob_pattern="part-*.jsonl")  # noqa: E731
    common = {"workers": workers, "start_method": "fork"}
    t0 = time.perf_counter()
    LocalPipelineExecutor([reader(), minhash.MinhashDedupSignature(str(work / "sigs"), config=config)],
                          tasks=tasks, logging_dir=str(work / "logs1"), **common).run()
    LocalPipelineExecutor([minhash.MinhashDedupBuckets(str(work / "sigs"), str(work / "buckets"), config=config)],
                          tasks=spec["bands"], logging_dir=str(work / "logs2"), **common).run()
    LocalPipelineExecutor([minhash.MinhashDedupCluster(str(work / "buckets"), str(work / "remove"), config=config)],
                          tasks=1, logging_dir=str(work / "logs3"), **common).run()
    LocalPipelineExecutor([reader(), minhash.MinhashDedupFilter(str(work / "remove")),
                           JsonlWriter(str(work / "kept"), compression=None)],
                          tasks=tasks, logging_dir=str(work / "logs4"), **common).run()
    return {"seconds": time.perf_counter() - t0}


def kept_ids(scenario: str, output: Path) -> list:
    """The ids of the records a contestant kept, in output order, read from its output folder (by the harness)."""
    files = sorted(output.glob("part-*.jsonl")) if scenario == "ours" else sorted((output / "kept").glob("*.jsonl"))
    return [json.loads(line)["id"] for p in files for line in p.read_text(encoding="utf-8").splitlines()]


def datasketch(spec: dict) -> dict:
    """The reference: MinHashLSH with the same bands and rows, records inserted in input order."""
    from datasketch import MinHash, MinHashLSH

    sigs: dict = {}
    lsh = MinHashLSH(threshold=spec["threshold"], num_perm=spec["num_perm"], params=(spec["bands"], spec["rows"]))
    kept, n = [], 0
    t0 = time.perf_counter()
    for path in spec["inputs"]:
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            words = record["text"].lower().split()
            k = spec["ngram"]
            grams = {" ".join(words[i : i + k]).encode() for i in range(max(1, len(words) - k + 1))}
            m = MinHash(num_perm=spec["num_perm"], seed=1)
            m.update_batch(list(grams))
            n += 1
            if any(m.jaccard(other) >= spec["threshold"] for other in (sigs[c] for c in lsh.query(m))):
                continue
            key = str(record["id"])
            sigs[key] = m
            lsh.insert(key, m)
            kept.append(record["id"])
    return {"seconds": time.perf_counter() - t0, "records": n, "kept_ids": kept}
