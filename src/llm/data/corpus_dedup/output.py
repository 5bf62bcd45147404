"""The output: kept records per input (input order, records unchanged), the removed list and `dedup.json`.

Each input's kept records go to the output path `records.output_names` gives it, written
under a private name and renamed into place (a present file is complete). The removed
list `dedup-removed.jsonl` has one line per removed record: its file and line, the
record it duplicates (file and line), exact or near, and the estimated similarity.
`dedup.json` is written last: its presence means the run finished.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from llm.data.corpus_dedup.commit import commit_file, kill_point, remove_leftovers, tmp_name
from llm.data.corpus_dedup.records import iter_input_records, repaired
from llm.data.corpus_dedup.workdir import ID_SHIFT, scan_dir, split_id
from llm.data.inputs.listing import Input, input_kind
from llm.data.inputs.readers import is_json_array, open_binary

REPORT_NAME = "dedup.json"
REMOVED_NAME = "dedup-removed.jsonl"
RESERVED = (REPORT_NAME, REMOVED_NAME)
COPY_BLOCK = 4 << 20  # bytes of input read (and kept lines written) at a time by the write stage


def removed_in_file(removed: np.ndarray, file_index: int) -> np.ndarray:
    """Record indices (in the file) of the removed records of one input, sorted."""
    lo = np.searchsorted(removed["id"], np.uint64(file_index) << np.uint64(ID_SHIFT))
    hi = np.searchsorted(removed["id"], np.uint64(file_index + 1) << np.uint64(ID_SHIFT))
    return split_id(removed["id"][lo:hi])[1]


@dataclass(frozen=True)
class WriteTask:
    """Write the kept records of input `todo[task_id]` to its output file."""

    work: Path
    output: Path
    inputs: tuple[Input, ...]
    names: tuple[str, ...]
    text_column: str
    todo: tuple[int, ...]
    sync_dir: bool = True  # False: the pipeline fsyncs the outputs' folders once after the stage (commit.commit_file)
    utf8: tuple[bool, ...] = ()  # per input: its scan saw only valid UTF-8 records (meta.json), so no check here

    def __call__(self, task_id: int, report) -> int:
        from llm.data.corpus_dedup.clusters import REMOVED_ROW

        file_index = self.todo[task_id]
        final = self.output / self.names[file_index]
        final.parent.mkdir(parents=True, exist_ok=True)
        remove_leftovers(final.parent, final.name)
        drop = removed_in_file(open_removed(self.work, REMOVED_ROW), file_index)
        tmp = tmp_name(final)
        path = self.inputs[file_index]
        with open(tmp, "wb") as out:
            if input_kind(path) == "jsonl" and not is_json_array(path):
                lines = np.fromfile(scan_dir(self.work, file_index) / "lines.u64", dtype="<u8")
                valid = file_index < len(self.utf8) and self.utf8[file_index]
                kept = _copy_lines(path, np.delete(lines, drop), out, checked=valid)
            else:
                kept = _write_records(path, self.text_column, drop, out)
        commit_file(tmp, final, self.sync_dir)
        report(kept, 0)
        kill_point(f"write:{file_index}")
        return kept


def _copy_lines(path: Input, keep: np.ndarray, out: BinaryIO, checked: bool = False) -> int:
    """Copy the JSON Lines lines numbered `keep` (sorted), unparsed: the scan parsed and checked them.

    Read in blocks of `COPY_BLOCK` and written once per block: a call per line (read and write) was ~25,000
    system calls for 40 MB of ~2 KB records, the stage's main cost after the checks. `checked`: the scan
    found every record valid UTF-8, so the blocks are written without decoding them again (~0.03 CPU s
    for 40 MB); otherwise each block is checked and its invalid lines repaired.
    """
    wanted = keep.tolist()
    k, before = 0, 0  # next wanted, lines before this block
    with open_binary(path) as f:
        rest = b""
        while k < len(wanted):
            block = f.read(COPY_BLOCK)
            lines = (rest + block).split(b"\n") if block else [rest]  # a last line without its newline
            rest = lines.pop() if block else b""
            picked = []
            while k < len(wanted) and wanted[k] <= before + len(lines):
                picked.append(lines[wanted[k] - before - 1].rstrip(b"\r"))
                k += 1
            before += len(lines)
            if picked:
                data = b"\n".join(picked) + b"\n"
                out.write(data if checked else _valid(data))
            if not block:
                break
    return len(keep)


def _valid(data: bytes) -> bytes:
    """Lines with invalid UTF-8 written as the text that was read (U+FFFD), as the scan read them."""
    try:
        data.decode("utf-8")
        return data
    except UnicodeDecodeError:
        return b"".join(_repair_line(raw) + b"\n" for raw in data[:-1].split(b"\n"))


def _repair_line(raw: bytes) -> bytes:
    try:
        raw.decode("utf-8")
        return raw
    except UnicodeDecodeError:
        return repaired(raw)


def _write_records(path: Input, text_column: str, drop: np.ndarray, out: BinaryIO) -> int:
    """Other kinds: every record read again as its JSON object, the removed ones skipped."""
    kept, at = 0, 0
    for index, (_, raw, _) in enumerate(iter_input_records(path, text_column)):
        if at < len(drop) and drop[at] == index:
            at += 1
            continue
        out.write(raw + b"\n")
        kept += 1
    return kept


def open_removed(work: Path, dtype: np.dtype) -> np.ndarray:
    """The cluster stage's removed records, memory-mapped (sorted by id)."""
    path = work / "removed.bin"
    return np.memmap(path, dtype=dtype, mode="r") if path.stat().st_size else np.zeros(0, dtype)


class Lines:
    """Each record's line in its input, from the scan files (memory-mapped)."""

    def __init__(self, work: Path, files: int):
        paths = [scan_dir(work, f) / "lines.u64" for f in range(files)]
        self._maps = [np.memmap(p, dtype="<u8", mode="r") if p.stat().st_size else np.zeros(0, "<u8") for p in paths]

    def __call__(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(input index, line) of each record id."""
        files, index = split_id(ids)
        lines = np.zeros(len(ids), dtype=np.int64)
        for f in np.unique(files).tolist():
            mask = files == f
            lines[mask] = self._maps[f][index[mask]]
        return files, lines


def write_removed_list(path: Path, removed: np.ndarray, lines: Lines, names: list[str], block: int = 65536) -> None:
    """`dedup-removed.jsonl`: one JSON line per removed record, in input order."""
    import json

    remove_leftovers(path.parent, path.name)
    tmp = tmp_name(path)
    # each line as json.dumps writes the record {"file", "line", "duplicate_of", "reason", "similarity"}, formatted
    # from plain lists (a dict, a dumps call and numpy scalars per record were ~7 µs each, in the driver); a
    # similarity (a share of equal MinHash entries) is finite: repr is what json writes
    quoted = [json.dumps(name, ensure_ascii=False) for name in names]
    with open(tmp, "w", encoding="utf-8") as out:
        for start in range(0, len(removed), block):
            part = removed[start : start + block]
            files, at = (x.tolist() for x in lines(part["id"]))
            of_files, of_at = (x.tolist() for x in lines(part["of"]))
            reasons = ["near" if n else "exact" for n in part["near"].tolist()]
            sims = [round(x, 4) for x in part["sim"].astype(np.float64).tolist()]
            out.write("".join(
                f'{{"file": {quoted[f]}, "line": {a}, "duplicate_of": {{"file": {quoted[g]}, "line": {b}}}, '
                f'"reason": "{r}", "similarity": {x!r}}}\n'
                for f, a, g, b, r, x in zip(files, at, of_files, of_at, reasons, sims)))
    commit_file(tmp, path)
    kill_point("removed-list")
