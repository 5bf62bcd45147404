"""The scan stage: one input file to its record lines, MinHash signatures and sorted key runs.

A task reads its input a chunk of `chunk_records` records (or `CHUNK_CHARS` of text) at a time (the memory bound)
and appends to a private folder: `lines.u64` (each record's line), `sig.u32` (its
signature, near dedup only), and per chunk one sorted run of (digest, id) rows and one
sorted run of (band key, id) rows per band. The folder is committed by one rename as
`scan/NNNNN`, with `meta.json` saying how many records each chunk held.
Record ids and the folder's place are `workdir.py`'s.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llm.data.corpus_dedup.commit import commit_dir, kill_point, remove_leftovers, tmp_name
from llm.data.corpus_dedup.exact import digest_rows
from llm.data.corpus_dedup.lsh import all_band_keys
from llm.data.corpus_dedup.minhash import MinHasher
from llm.data.corpus_dedup.params import DedupParams
from llm.data.corpus_dedup.records import iter_input_records
from llm.data.corpus_dedup.runs import sort_rows
from llm.data.corpus_dedup.workdir import record_id, scan_dir
from llm.data.inputs.listing import Input

BAND_ROW = np.dtype([("key", "<u8"), ("id", "<u8")])
# A chunk also ends at this much text: `chunk_records` of long records would hold GBs (chunks never
# change a byte of the result, only how many runs the merges read).
CHUNK_CHARS = 32 << 20


@dataclass(frozen=True)
class ScanTask:
    """Scan input `inputs[i]` into `work/scan/i` (a picklable callable: local workers and Ray run it)."""

    work: Path
    inputs: tuple[Input, ...]
    params: DedupParams
    todo: tuple[int, ...]  # input indices still to scan (committed ones are skipped)
    sync_dir: bool = True  # False: the pipeline fsyncs `scan/` once after the stage (commit.commit_file)

    def __call__(self, task_id: int, report) -> int:
        file_index = self.todo[task_id]
        final = scan_dir(self.work, file_index)
        remove_leftovers(final.parent, final.name)
        tmp = tmp_name(final)
        tmp.mkdir(parents=True)
        count = scan_input(self.inputs[file_index], file_index, tmp, self.params, report)
        commit_dir(tmp, final, self.sync_dir)
        kill_point(f"scan:{file_index}")
        return count


def scan_input(path: Input, file_index: int, folder: Path, params: DedupParams, report) -> int:
    """Write one input's scan files into `folder`; returns its record count."""
    hasher = MinHasher(params.num_perm, params.ngram, params.seed, params.minhash) if params.near is not None else None
    chunks: list[int] = []
    done = 0
    lines: list[int] = []
    texts: list[str] = []
    with open(folder / "lines.u64", "wb") as lines_file, open(folder / "sig.u32", "wb") as sig_file:

        def flush() -> None:
            nonlocal done
            c = len(chunks)
            ids = record_id(file_index, np.arange(done, done + len(texts)))
            lines_file.write(np.asarray(lines, dtype="<u8").tobytes())
            (folder / f"exact-{c:05d}.run").write_bytes(sort_rows(digest_rows(texts, ids, params.hash_algo)).tobytes())
            if hasher is not None:
                signatures = hasher.signatures(texts)
                sig_file.write(signatures.tobytes())
                # every band's run sorted by (key, id): ids rise in input order, so a stable sort by key is enough
                keys = all_band_keys(signatures, params.bands, params.rows)
                order = np.argsort(keys, axis=1, kind="stable")
                runs = np.empty((params.bands, len(texts)), dtype=BAND_ROW)
                runs["key"] = np.take_along_axis(keys, order, axis=1)
                runs["id"] = ids[order]
                (folder / f"bands-{c:05d}.run").write_bytes(runs.tobytes())
            chunks.append(len(texts))
            done += len(texts)
            report(len(texts), 0)
            lines.clear()
            texts.clear()

        chars = 0
        repairs: list[int] = []
        for line, _, text in iter_input_records(path, params.text_column, repairs):
            lines.append(line)
            texts.append(text)
            chars += len(text)
            if len(texts) >= params.chunk_records or chars >= CHUNK_CHARS:
                flush()
                chars = 0
        if texts:
            flush()
    # utf8: every record's line is valid UTF-8 as it stands, so the write stage copies it unchecked (output.py)
    meta = {"records": done, "chunks": chunks, "utf8": not repairs}
    (folder / "meta.json").write_text(json.dumps(meta))
    return done

