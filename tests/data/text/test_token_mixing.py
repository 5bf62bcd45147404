"""Token-budget mixing of text sources (`streaming_mixing_unit: tokens`) and the per-source accounting.

Two sources whose documents differ 20x in length, written with disjoint alphabets, so each
trained token's source is read off the batch itself (an EOS belongs to the document it ends):
the independent count every share and every `source_counts()` is checked against.
"""

from __future__ import annotations

import multiprocessing
import random
from pathlib import Path

import numpy as np
import pytest

from llm.data.text.stream import StreamingTextDataModule, merge_stream_states
from llm.training.core.data_config import DataConfig
from tests.resume import check_resume, loaded, step_ranks

EOS = 256  # the simple tokenizer's
SHORT, LONG = "abcdefghijklm", "nopqrstuvwxyz"  # source 0's and source 1's letters


def write_corpora(folder: Path, short_docs: int = 3000, long_docs: int = 200) -> list[str]:
    """`short.txt`: ~20-token documents; `long.txt`: ~400-token ones (20x longer)."""
    rng = random.Random(5)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, letters, n, (lo, hi) in (("short", SHORT, short_docs, (15, 25)), ("long", LONG, long_docs, (300, 500))):
        lines = ("".join(rng.choice(letters) for _ in range(rng.randint(lo, hi))) for _ in range(n))
        path = folder / f"{name}.txt"
        path.write_text("\n".join(lines) + "\n")
        paths.append(str(path))
    return paths


def count_by_source(batches: list[dict]) -> dict[str, list[int]]:
    """[trained tokens, rows] per source, from the batch contents alone."""
    lookup = np.full(EOS + 1, -1)
    lookup[[ord(c) for c in SHORT]] = 0
    lookup[[ord(c) for c in LONG]] = 1
    out = {"short": [0, 0], "long": [0, 0]}
    for batch in batches:
        for ids, labels in zip(np.asarray(batch["input_ids"]), np.asarray(batch["labels"])):
            trained = labels != -100
            # a label's source is its own letter's, or (an EOS) that of the token it follows
            source = np.where(labels == EOS, lookup[ids], lookup[np.clip(labels, 0, EOS)])[trained]
            assert (source >= 0).all(), "a trained token of neither source"
            for s, name in enumerate(("short", "long")):
                out[name][0] += int((source == s).sum())
            out[("short", "long")[int(source[0])]][1] += 1
            assert (source == source[0]).all(), "a row mixes sources (one partition per row)"
    return out


def module(paths: list[str], unit: str, weights: list[float], workers: int = 0, **extra) -> StreamingTextDataModule:
    data = DataConfig(datasets=[{"dataset_path": p} for p in paths], max_seq_len=64, num_workers=workers,
                      streaming_dataset_mixing_strategy=extra.pop("strategy", "weighted"),
                      streaming_mixing_weights=weights, streaming_mixing_unit=unit, **extra)
    return StreamingTextDataModule(data, batch_size=4, steps_per_epoch=300, loop=False)


@pytest.mark.parametrize("weights, workers", [([0.5, 0.5], 0), ([0.7, 0.3], 0), ([0.5, 0.5], 2)])
def test_token_shares_follow_the_weights_over_300_batches(tmp_path, weights, workers):
    multiprocessing.set_start_method("fork", force=True)
    m = module(write_corpora(tmp_path), "tokens", weights, workers)
    batches = list(m.train_dataloader())
    assert len(batches) == 300
    counted = count_by_source(batches)
    total = sum(t for t, _ in counted.values())
    shares = [counted["short"][0] / total, counted["long"][0] / total]
    assert all(abs(s - w) <= 0.01 for s, w in zip(shares, weights)), (shares, weights)
    # the loader's own accounting is the batches' count, exactly (also through worker processes)
    assert m.source_counts() == {k: {"tokens": t, "samples": n} for k, (t, n) in counted.items()}


def test_record_shares_leave_the_token_shares_10_to_1(tmp_path):
    """The peers' behaviour, kept as `records` (the default): 1:1 in documents is ~1:20 in tokens."""
    m = module(write_corpora(tmp_path), "records", [0.5, 0.5])
    counted = count_by_source(list(m.train_dataloader()))
    assert counted["long"][0] > 10 * counted["short"][0]


def test_random_by_tokens_is_near_the_weights(tmp_path):
    m = module(write_corpora(tmp_path), "tokens", [0.5, 0.5], strategy="random")
    counted = count_by_source(list(m.train_dataloader()))
    share = counted["short"][0] / (counted["short"][0] + counted["long"][0])
    assert abs(share - 0.5) < 0.06  # seeded draws: near the weight, not held to it like `weighted`


def make(config: dict, rank: int | None = None, world: int | None = None) -> StreamingTextDataModule:
    data = DataConfig(datasets=[{"dataset_path": p, "name": n} for p, n in zip(config["paths"], ("short", "long"))],
                      max_seq_len=32, num_workers=config["workers"], streaming_dataset_mixing_strategy="weighted",
                      streaming_mixing_weights=config.get("weights"), streaming_mixing_unit="tokens",
                      streaming_mixing_schedule=config.get("schedule"))
    # one whole pass (no step limit): another topology must give the same records, in another order
    return StreamingTextDataModule(data, batch_size=2, rank=rank, world_size=world, loop=False)


def run_tokens(config: dict, state: dict | None, steps: int | None):
    """resume.py protocol: `world` ranks in one process, their batches stacked per step; the counts checked."""
    world = config.get("world", 1)
    modules = loaded([make(config, r, world) for r in range(world)], state, config.get("ledger"))
    before = [m.source_counts() for m in modules]
    out = step_ranks(modules, steps)
    # what each run handed over is what its counts grew by, source by source
    grown = {k: [0, 0] for k in ("short", "long")}
    for m, b in zip(modules, before):
        for k, v in m.source_counts().items():
            grown[k][0] += v["tokens"] - b[k]["tokens"]
            grown[k][1] += v["samples"] - b[k]["samples"]
    assert grown == count_by_source(out)
    return out, merge_stream_states([m.state_dict() for m in modules])


def rows(step: dict) -> list[bytes]:
    return [a.tobytes() + b.tobytes() for a, b in zip(step["input_ids"], step["labels"])]


def test_token_mixing_with_workers_resumes_exactly_and_on_other_topologies(tmp_path):
    config = {"paths": write_corpora(tmp_path, 150, 10), "weights": [0.6, 0.4], "workers": 2}
    others = [{**config, "workers": 0}, {**config, "workers": 1, "world": 2}]
    check_resume(run_tokens, config, stops=[0, 7, 23], resume_configs=others, exact=False, split_records=rows,
                 fresh_process=False)


def test_the_counts_are_kept_in_the_state_and_summed_on_another_topology(tmp_path):
    config = {"paths": write_corpora(tmp_path, 150, 10), "weights": [0.6, 0.4], "workers": 0}
    one = make(config)
    head = [b for _, b in zip(range(9), one.train_dataloader())]
    state = one.state_dict()
    assert state["consumed"]["0"] == {k: [v["tokens"], v["samples"]] for k, v in one.source_counts().items()}
    two = [make(config, r, 2) for r in range(2)]
    for m in two:
        m.load_state_dict(state)
    # on another topology rank 0 carries every earlier count, so the job's sum stays exact
    assert two[0].source_counts() == one.source_counts()
    assert two[1].source_counts() == {"short": {"tokens": 0, "samples": 0}, "long": {"tokens": 0, "samples": 0}}
    assert sum(v["tokens"] for v in one.source_counts().values()) == sum(int((b["labels"] != -100).sum()) for b in head)


def test_a_version_2_state_without_token_counts_resumes_exactly(tmp_path):
    """States saved before token counts (no `tokens` in the cursors, no step, anchors or counts) still resume."""
    from tests.data.text.test_mixing import run_mix, write_sources
    from tests.resume import assert_same_steps

    config = {"paths": write_sources(tmp_path), "strategy": "weighted", "weights": [0.75, 0.25], "workers": 0}
    reference, _ = run_mix(config, None, None)
    head, state = run_mix(config, None, 13)
    old = {k: v for k, v in state.items() if k not in ("step", "samples", "tokens", "sources", "mix", "consumed")}
    old["partitions"] = {k: {f: x for f, x in c.items() if f != "tokens"} for k, c in state["partitions"].items()}
    old["version"] = 2
    tail, _ = run_mix(config, old, None)
    assert_same_steps(head + tail, reference, "an old version-2 state")
