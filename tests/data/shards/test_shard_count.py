"""The shard-count test: opening a dataset and taking its first batch does work bounded by the shards it touches.

No time is asserted: each test counts what the open path does (files stat'ed and opened,
`ShardInfo` entries built, JSON bytes parsed, objects left alive) on 2,000 tiny shards and
on the same tokens in about 20, and checks the first batch and a resume token for token (the
resume also in fresh processes, on 1 and 2 ranks, through tests/resume.py: marked slow).
"""

from __future__ import annotations

import gc
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import xxhash

from llm.data import StreamingDataLoader, StreamingDataset, TokensLoader
from llm.data.shards.format import manifest as manifest_module
from llm.data.shards.format import shard_table, verified
from llm.data.shards.format.manifest import INDEX_NAME, Manifest, ShardInfo
from llm.data.shards.format.reader import ShardError
from tests.data.shards.helpers import all_tokens, many_shards, run_loader
from tests.resume import check_resume

DOC, DOCS, BLOCK, BATCH = 32, 2000, 64, 8
TOUCHED = 3 * BATCH  # a 64-token block of 32-token shards lies in at most 3 of them


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, Path]:
    """The same 64,000 tokens in 2,000 shards (one document each) and in about 20."""
    root = tmp_path_factory.mktemp("shard-count")
    out = {"many": many_shards(root / "many", DOCS, DOC), "few": many_shards(root / "few", DOCS, DOC, docs_per_shard=100)}
    assert Manifest.load(out["many"]).num_shards == DOCS and Manifest.load(out["few"]).num_shards <= 20
    return out


class _Counts:
    """What one open + first batch did to the dataset's folder and to the manifest."""

    def __init__(self, folder: Path):
        self.folder, self.stats, self.opened, self.infos, self.json_bytes = str(folder), [], [], 0, 0
        self.active = False

    def audit(self, event: str, args: tuple) -> None:
        if self.active and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            path = os.fsdecode(args[0])
            if path.startswith(self.folder):
                self.opened.append(path)


_counting: list[_Counts] = []  # audit hooks cannot be removed: one hook, pointed at the current count


def _hook_audit() -> None:
    """Add the one audit hook (at first use: a module merely collected adds none to the session)."""
    if not getattr(_hook_audit, "done", False):
        sys.addaudithook(lambda event, args: _counting[-1].audit(event, args) if _counting else None)
        _hook_audit.done = True  # type: ignore[attr-defined]


def _open_and_first_batch(folder: Path, monkeypatch, state: dict | None = None) -> tuple[_Counts, np.ndarray, int]:
    """Counts, the first batch and the objects left alive by opening `folder` in a process that knows its manifest."""
    _hook_audit()
    counts = _Counts(folder)
    real_stat, real_init, real_loads = os.stat, ShardInfo.__init__, json.loads

    def stat(path, *a, **kw):
        if counts.active and os.fsdecode(path).startswith(counts.folder):
            counts.stats.append(os.fsdecode(path))
        return real_stat(path, *a, **kw)

    def init(self, *a, **kw):
        counts.infos += 1
        real_init(self, *a, **kw)

    def loads(s, *a, **kw):
        counts.json_bytes += len(s)
        return real_loads(s, *a, **kw)

    monkeypatch.setattr(os, "stat", stat)
    monkeypatch.setattr(ShardInfo, "__init__", init)
    monkeypatch.setattr(json, "loads", loads)
    verified._stores.clear()  # as a new process: the verified-shards store is read afresh
    gc.collect()
    alive = len(gc.get_objects())
    _counting.append(counts)
    counts.active = True
    try:
        ds = StreamingDataset(folder, item_loader=TokensLoader(block_size=BLOCK), shuffle=True)
        loader = StreamingDataLoader(ds, batch_size=BATCH)
        if state is not None:
            loader.load_state_dict(state)
        batch = next(iter(loader)).numpy()
    finally:
        counts.active = False
        _counting.pop()
        monkeypatch.undo()
    gc.collect()
    grown = len(gc.get_objects()) - alive
    del loader, ds
    return counts, batch, grown


def test_open_and_first_batch_do_work_bounded_by_the_shards_touched_not_the_shard_count(datasets, monkeypatch):
    for folder in datasets.values():
        Manifest.load(folder)  # a first open on this machine checks the manifest (O(shards), once) and remembers it
    _open_and_first_batch(datasets["few"], monkeypatch)  # this process's first loader imports what loaders use
    many, first_many, grown_many = _open_and_first_batch(datasets["many"], monkeypatch)
    few, first_few, grown_few = _open_and_first_batch(datasets["few"], monkeypatch)
    shard_files = {p for p in many.stats + many.opened if p.endswith(".bin")}
    assert 0 < len(shard_files) <= TOUCHED, f"{len(shard_files)} of {DOCS} shard files stat'ed or opened"
    assert len(many.stats) <= 3 * TOUCHED + 5 and len(many.opened) <= 2 * TOUCHED + 5, (len(many.stats), len(many.opened))
    assert many.infos <= TOUCHED, f"{many.infos} shard entries built for a batch of {BATCH}"
    assert many.json_bytes < 4096 and few.json_bytes < 4096  # the manifest's JSON is not parsed again
    # Objects left alive by the open: one per shard would be >= 2,000 more for the many-shard dataset.
    assert grown_many - grown_few < 500, (grown_many, grown_few)
    # Same tokens, same number of blocks, same seed: the first shuffled batch is the same blocks.
    assert np.array_equal(first_many, first_few)
    tokens = all_tokens(datasets["many"])
    order = StreamingDataset(datasets["many"], item_loader=TokensLoader(block_size=BLOCK), shuffle=True).order(0)
    expected = [tokens[s * BLOCK : (s + 1) * BLOCK] for s in order(np.arange(BATCH)).tolist()]
    assert np.array_equal(first_many, np.stack(expected))


def test_a_resume_on_many_shards_does_bounded_work_and_continues_token_for_token(datasets, monkeypatch):
    Manifest.load(datasets["many"])
    ds = StreamingDataset(datasets["many"], item_loader=TokensLoader(block_size=BLOCK), shuffle=True)
    loader = StreamingDataLoader(ds, batch_size=BATCH)
    batches = iter(loader)
    for _ in range(70):
        next(batches)
    state = loader.state_dict()
    expected = next(batches).numpy()
    counts, first, _ = _open_and_first_batch(datasets["many"], monkeypatch, state)
    assert np.array_equal(first, expected)
    assert len({p for p in counts.stats + counts.opened if p.endswith(".bin")}) <= TOUCHED and counts.infos <= TOUCHED


@pytest.mark.slow
def test_many_shards_resume_token_for_token_in_fresh_processes_also_on_two_ranks(datasets):
    Manifest.load(datasets["many"])  # fresh processes then read the remembered table
    config = {"path": str(datasets["many"]), "block": BLOCK, "batch": BATCH}
    check_resume(run_loader, config, stops=[77], resume_configs=[dict(config, batch=BATCH // 2, world=2)])


def test_the_remembered_table_is_the_manifest_and_a_damaged_one_is_checked_again(datasets, monkeypatch):
    folder = datasets["many"]
    monkeypatch.setenv("LLM_REMEMBER_VERIFIED", "0")
    parsed = Manifest.load(folder)  # from the JSON, checked
    monkeypatch.delenv("LLM_REMEMBER_VERIFIED")
    Manifest.load(folder)
    remembered = Manifest.load(folder)  # from the table
    assert remembered.entries is not remembered.__dict__.get("_shards")  # columns, no list yet
    assert remembered.fingerprint() == parsed.fingerprint() and remembered.totals() == parsed.totals()
    assert remembered.entries[1234] == parsed.shards[1234]
    assert remembered.header_fields() == parsed.header_fields()
    assert remembered.shards == parsed.shards and remembered == parsed
    # A table file that does not read back whole is ignored: the manifest is parsed and checked again.
    digest = xxhash.xxh3_128_hexdigest((folder / INDEX_NAME).read_bytes())
    path = verified.manifests_folder() / f"{digest}.table"
    raw = bytearray(path.read_bytes())
    raw[-100] ^= 0xFF
    path.write_bytes(bytes(raw))
    assert shard_table.recall(digest) is None
    checks = []
    real = manifest_module.check_manifest
    monkeypatch.setattr(manifest_module, "check_manifest", lambda data, p: (checks.append(p), real(data, p))[1])
    assert Manifest.load(folder).shards == parsed.shards and len(checks) == 1
    assert Manifest.load(folder).shards == parsed.shards and len(checks) == 1  # rewritten whole: remembered again


def test_a_truncated_or_changed_shard_is_named_at_first_touch_after_a_flat_open(datasets, tmp_path):
    import shutil

    folder = tmp_path / "many"
    shutil.copytree(datasets["many"], folder)
    Manifest.load(folder)  # the table is remembered: the next open reads no shard
    shards = Manifest.load(folder).entries
    truncated, flipped = folder / shards[10].file, folder / shards[20].file
    truncated.write_bytes(truncated.read_bytes()[:-8])
    data = bytearray(flipped.read_bytes())
    data[0] ^= 0xFF
    flipped.write_bytes(bytes(data))
    ds = StreamingDataset(folder, item_loader=TokensLoader(block_size=DOC))  # block k is shard k here
    assert np.array_equal(ds[0].numpy(), all_tokens(datasets["many"])[:DOC])
    with pytest.raises(ShardError, match=f"shard {truncated} has {DOC * 2} bytes, the manifest says {DOC * 2 + 8}"):
        ds[10]
    with pytest.raises(ShardError, match=f"shard {flipped} fails its checksum"):
        ds[20]
