"""Dedup: normalised exact duplicates dropped within and across runs; the seen-set survives crashes."""

from __future__ import annotations

import gzip
import os
import shutil
import uuid
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm.data.dedup import publish_seen_hashes
from llm.data.inputs.dedup import (
    DIGEST_BYTES,
    IN_MEMORY_WARNING,
    DedupTextSource,
    SeenSet,
    collapse_whitespace,
    text_digest,
)
from llm.data.inputs.seen_file import read_seen_file
from llm.data.sources import LocalLineTextSource
from llm.data.text.stream import StreamingTextDataModule
from llm.training.core.config import DataConfig
from tests.resume import assert_same_steps, attach, check_resume, take_steps

EOS = 256


def write_gz(path: Path, lines: list[str]) -> Path:
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    return path


def write_txt(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")  # < 1 KiB: a single byte-range partition
    return path


def module_for(path, seen=None, workers=0, write=True) -> StreamingTextDataModule:
    data = DataConfig(data_source="dedup_local", dataset_path=str(path), max_seq_len=16, num_workers=workers,
                      seen_hashes_path=str(seen) if seen else None, write_seen_hashes=bool(seen) and write)
    return StreamingTextDataModule(data, batch_size=2, loop=False)


def held(seen: Path, algo: str = "sha256") -> int:
    """How many digests a seen-hashes file holds (0 when it does not exist)."""
    parsed = read_seen_file(seen, algo)
    return parsed.count if parsed else 0


def take(module, steps=None) -> list[dict]:
    return take_steps(module.train_dataloader(), steps)


def documents(steps: list[dict]) -> list[str]:
    """Documents of a one-partition stream (a small .txt): first token + every label, split at EOS."""
    tokens = [int(steps[0]["input_ids"][0][0])] if steps else []
    for s in steps:
        for row in s["labels"]:
            tokens.extend(int(t) for t in row if t >= 0)
    docs, cur = [], []
    for t in tokens:
        if t == EOS:
            docs.append(bytes(cur).decode())
            cur = []
        else:
            cur.append(t)
    return docs


def test_normalise_and_digests():
    assert collapse_whitespace("  a \t b\n\nc ") == "a b c"
    for algo in ("sha256", "xxh3_128", "md5", "blake2b", "shake_128"):
        d = text_digest("a  b", algo)
        assert len(d) == DIGEST_BYTES and d == text_digest(" a b ", algo) and d != text_digest("a b c", algo)
    assert text_digest("x", "sha256") != text_digest("x", "xxh3_128")


_digest = st.one_of(
    st.binary(min_size=16, max_size=16),
    st.binary(min_size=8, max_size=8).map(lambda lo: bytes(8) + lo),  # the "empty slot" prefix
    st.binary(min_size=8, max_size=8).map(lambda lo: b"\x01" + bytes(7) + lo),
)


@settings(max_examples=80, deadline=None)
@given(st.lists(_digest, max_size=300), st.integers(0, 300))
def test_seen_set_behaves_like_a_set(digests, split):
    seen, ref = SeenSet(capacity=4), set()
    seen.update(b"".join(digests[:split]))
    ref.update(digests[:split])
    for d in digests[split:]:
        assert seen.add(d) == (d not in ref)
        ref.add(d)
    assert len(seen) == len(ref) and all(d in seen for d in ref)
    absent = next(d for d in (bytes([i]) * 16 for i in range(256)) if d not in ref)
    assert absent not in seen


def test_seen_set_memory_is_fixed_per_record():
    seen = SeenSet()
    seen.update(np.frombuffer(os.urandom(16 * 100_000), dtype="<u8"))
    assert len(seen) == 100_000
    assert seen.nbytes() / len(seen) <= 64  # binary digests, not Python strings (~100+ bytes each)


def test_duplicates_dropped_within_a_run(tmp_path):
    path = write_txt(tmp_path / "a.txt", ["a b", "c", "a   b ", "A b", "c", "d", "\ta b"])
    with pytest.warns(UserWarning, match=IN_MEMORY_WARNING.split(":")[0]):
        module = module_for(path)
    assert documents(take(module)) == ["a b", "c", "A b", "d"]
    assert module.state_dict()["seen_hashes"]["count"] == 0  # nothing persisted


def test_duplicates_dropped_across_runs(tmp_path):
    seen = tmp_path / "seen.bin"
    first = module_for(write_txt(tmp_path / "one.txt", ["x1", "x2", "x3"]), seen)
    assert documents(take(first)) == ["x1", "x2", "x3"]
    state = first.checkpoint_state()  # the checkpoint's state: it carries what training consumed
    assert state["seen_hashes"]["count"] == 3 and held(seen) == 0  # not in the file before the checkpoint lands
    publish_seen_hashes(state)  # save_checkpoint does this once the checkpoint is on disk
    assert held(seen) == 3
    second = module_for(write_txt(tmp_path / "two.txt", ["x2", "y1", "x1 ", "y2", "x3"]), seen)
    assert documents(take(second)) == ["y1", "y2"]
    assert second.state_dict()["seen_hashes"]["pending"] == 2  # a pure getter: nothing written
    assert held(seen) == 3
    publish_seen_hashes(second.checkpoint_state())
    assert held(seen) == 5


def test_a_state_whose_checkpoint_never_landed_rides_in_the_next(tmp_path):
    seen = tmp_path / "seen.txt"
    run = module_for(write_txt(tmp_path / "one.txt", [f"x{i} " + "w" * 20 for i in range(40)]), seen)
    take(run, 1)
    lost = run.checkpoint_state()["seen_hashes"]  # its checkpoint never landed: never published
    take(run, 1)
    state = run.checkpoint_state()
    entry = state["seen_hashes"]
    assert lost["base"] == entry["base"] == 0 and 0 < lost["count"] < entry["count"]  # both steps' digests
    assert entry["digests"].startswith(lost["digests"])
    publish_seen_hashes(state)
    publish_seen_hashes(state)  # a second publication of the same state changes nothing
    assert held(seen) == entry["count"]
    take(run, 1)
    assert run.checkpoint_state()["seen_hashes"]["base"] == entry["count"]  # the file holds them now


def _corpus() -> list[str]:
    return [f"doc {i % 70} " + "w" * (i % 70 % 13) for i in range(200)]  # 70 distinct, repeated


def test_crash_after_a_commit_does_not_lose_records(tmp_path):
    path = write_gz(tmp_path / "c.txt.gz", _corpus())
    reference = take(module_for(path, tmp_path / "ref.bin"))
    seen = tmp_path / "seen.bin"
    run = module_for(path, seen)
    head = take(run, 10)
    checkpoint = run.checkpoint_state()  # saved with the checkpoint at step 10
    publish_seen_hashes(checkpoint)
    take(run, 15)
    publish_seen_hashes(run.checkpoint_state())  # a later checkpoint, lost with its disk: resume from step 10
    with open(seen, "ab") as f:
        f.write(b"0123abc")  # and a torn append (a line without its newline)
    assert held(seen) > checkpoint["seen_hashes"]["count"]
    resumed = module_for(path, seen)
    resumed.load_state_dict(checkpoint)
    assert held(seen) == checkpoint["seen_hashes"]["count"]
    assert seen.stat().st_size == read_seen_file(seen, "sha256").ends[-1][1]  # the torn append is gone
    tail = take(resumed)
    assert_same_steps(head + tail, reference, "resume from the last checkpoint after a crash")
    assert sum(int((s["labels"] == EOS).sum()) for s in reference) == 70  # one EOS per kept document


def test_missing_seen_file_for_a_state_is_an_error(tmp_path):
    path = write_gz(tmp_path / "c.txt.gz", _corpus())
    run = module_for(path, tmp_path / "seen.bin")
    take(run, 3)
    publish_seen_hashes(run.checkpoint_state())
    take(run, 2)
    state = run.checkpoint_state()  # continues a file of the first state's digests
    other = module_for(path, tmp_path / "elsewhere.bin")
    with pytest.raises(ValueError, match="elsewhere.bin is missing but the data state expects"):
        other.load_state_dict(state)


def run_dedup(config: dict, state: dict | None, steps: int | None):
    """resume.py protocol; each run gets its own copy of the seen-hashes file."""
    seen = Path(config["dir"]) / f"seen-{uuid.uuid4().hex}.bin"
    if state is not None and Path(state["seen_hashes"]["path"]).exists():  # no file: nothing committed
        shutil.copy(state["seen_hashes"]["path"], seen)
    module = attach(module_for(config["path"], seen, workers=config["workers"]), config)
    if state is not None:
        module.load_state_dict(state)
    out = take(module, steps)
    return out, module.checkpoint_state()


@pytest.mark.parametrize("workers", [0, 2])
def test_exact_resume_with_dedup(tmp_path, workers):
    # with workers, repeats stay inside one file: each worker dedups what it reads itself
    corpus = _corpus()
    for k in range(3):
        write_gz(tmp_path / f"f{k}.txt.gz", [f"{k}/{line}" for line in corpus[k::3]] if workers else corpus)
    config = {"dir": str(tmp_path), "path": str(tmp_path / "*.txt.gz"), "workers": workers}
    ref = check_resume(run_dedup, config, stops=[0, 13, 25], fresh_process=False)
    assert len(ref) > 25
    # independent of the code's own uninterrupted run: the kept documents are the distinct
    # normalised records (per file with workers: each file is read by one worker), each once,
    # and every one of their tokens is a label but the first of each stripe that kept any (8 a file)
    files = [[f"{k}/{line}" for line in corpus[k::3]] for k in range(3)] if workers else [corpus] * 3
    kept: dict[str, str] = {}
    for lines in files:
        seen_here: set[str] = set()
        for line in lines:
            key = collapse_whitespace(line)
            if key not in seen_here and (workers or key not in kept):
                kept[key if not workers else f"{len(kept)}"] = line
            seen_here.add(key)
    docs = list(kept.values())
    assert sum(int((s["labels"] == EOS).sum()) for s in ref) == len(docs)
    tokens = sum(len(d.strip().encode()) + 1 for d in docs)  # records are stripped
    labels = sum(int((s["labels"] >= 0).sum()) for s in ref)
    assert tokens - labels == 8 * (3 if workers else 1)  # files 2 and 3 add nothing without workers


def test_dedup_source_fingerprint(tmp_path):
    path = write_gz(tmp_path / "a.txt.gz", ["a"])
    with pytest.warns(UserWarning):
        fp = DedupTextSource(LocalLineTextSource(path), "xxh3_128").source_fingerprint()
    assert fp["type"] == "dedup" and fp["hash_algo"] == "xxh3_128" and fp["inner"]["type"] == "local"


def test_state_without_a_seen_file_leaves_the_file_alone(tmp_path):
    seen = tmp_path / "seen.bin"
    earlier = module_for(write_txt(tmp_path / "old.txt", ["o1", "o2"]), seen)
    take(earlier)
    publish_seen_hashes(earlier.checkpoint_state())
    path = write_txt(tmp_path / "a.txt", ["o1", "n1", "n2", "n3"])
    with pytest.warns(UserWarning, match="in-memory only"):
        in_memory = module_for(path)
    take(in_memory, 1)
    state = in_memory.state_dict()
    persisted = module_for(path, seen)
    persisted.load_state_dict(state)
    assert held(seen) == 2  # not truncated to the state's count of 0
    assert text_digest("o1") in persisted.source.committed and text_digest("o2") in persisted.source.committed


@settings(max_examples=60, deadline=None)
@given(st.lists(_digest, max_size=200))
def test_first_occurrences_keeps_the_first_copy_of_each(digests):
    from llm.data.inputs.dedup import _pairs, first_occurrences

    pairs = _pairs(b"".join(digests)) if digests else np.zeros((0, 2), dtype=np.uint64)
    seen: set[bytes] = set()
    expected = []
    for d in digests:
        expected.append(d not in seen)
        seen.add(d)
    assert first_occurrences(pairs).tolist() == expected
