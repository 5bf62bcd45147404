"""Mixing text sources: each strategy's schedule, weight errors, and exact resume with 0 and 2 workers."""

from __future__ import annotations

import hashlib
import multiprocessing
from collections import Counter
from itertools import islice
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm.data.inputs.readers import InputError
from llm.data.mix.choosers import check_weights, choose
from llm.data.text.stream import StreamingTextDataModule, merge_stream_states
from llm.training.core.data_config import DataConfig
from llm.training.core.errors import ConfigError
from tests.resume import assert_same_steps, attach, check_resume, loaded, step_ranks


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=2, max_size=4).filter(lambda w: sum(w) > 0), st.integers(50, 400))
def test_weighted_stays_within_one_record_of_its_weights(raw, n):
    weights = [w / sum(raw) for w in raw]
    counts = [0] * len(weights)
    live = list(range(len(weights)))
    for drawn in range(1, n + 1):
        counts[choose("weighted", live, counts, weights, 0, 0)] += 1
        assert all(abs(c - w * drawn) <= 1 for c, w in zip(counts, weights)), (counts, weights, drawn)


def test_round_robin_and_random():
    counts = [0, 0, 0]
    order = []
    for _ in range(6):
        i = choose("round_robin", [0, 1, 2], counts, [1 / 3] * 3, 0, 0)
        order.append(i)
        counts[i] += 1
    assert order == [0, 1, 2, 0, 1, 2]
    assert choose("round_robin", [0, 2], [5, 9, 3], [1 / 3] * 3, 0, 0) == 2  # an exhausted source is skipped
    draws = []
    counts = [0, 0]
    for _ in range(4000):
        i = choose("random", [0, 1], counts, [0.8, 0.2], seed=7, consumer=0)
        draws.append(i)
        counts[i] += 1
    assert 0.77 < counts[0] / 4000 < 0.83  # seeded draws by weight
    again, counts = [], [0, 0]
    for _ in range(4000):
        i = choose("random", [0, 1], counts, [0.8, 0.2], seed=7, consumer=0)
        again.append(i)
        counts[i] += 1
    assert again == draws  # reproducible


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"streaming_mixing_weights": [0.5, 0.3, 0.2]}, "streaming_mixing_weights has 3 weights but there are 2 datasets; give one weight per dataset"),
        ({"streaming_mixing_weights": [1.2, -0.2]}, r"streaming_mixing_weights\[1\] \(datasets\[1\]\) is -0.2; expected a finite number >= 0"),
        ({"streaming_mixing_weights": [0.5, 0.4]}, r"streaming_mixing_weights sum to 0.9 \(\[0.5, 0.4\]\); weights must sum to 1 \(within 1e-6\)"),
        ({"streaming_dataset_mixing_strategy": "weighted"}, "streaming_mixing_weights is required"),
    ],
)
def test_weight_mistakes_are_one_sentence(kwargs, message):
    entries = [{"dataset_path": "a.txt"}, {"dataset_path": "b.txt"}]
    with pytest.raises(ConfigError, match=message):
        DataConfig(datasets=entries, **kwargs)


def write_sources(folder: Path) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, n in (("big", 300), ("small", 60)):
        path = folder / f"{name}.txt"
        path.write_text("".join(f"{name} record {i} " + "z" * (i % 7) + "\n" for i in range(n)))
        paths.append(str(path))
    return paths


def make(config: dict, rank: int | None = None, world: int | None = None) -> StreamingTextDataModule:
    entries = [{"dataset_path": p} for p in config["paths"]]
    data = DataConfig(datasets=entries, max_seq_len=16, num_workers=config["workers"],
                      streaming_dataset_mixing_strategy=config["strategy"],
                      streaming_mixing_weights=config.get("weights"))
    return StreamingTextDataModule(data, batch_size=4, rank=rank, world_size=world, loop=False)


def run_mix(config: dict, state: dict | None, steps: int | None):
    """resume.py protocol; `world` ranks simulated in one process, their batches stacked per step."""
    world = config.get("world", 1)
    modules = loaded([make(config, r, world) for r in range(world)], state, config.get("ledger"))
    return step_ranks(modules, steps), merge_stream_states([m.state_dict() for m in modules])


@pytest.mark.parametrize(
    "strategy, weights, workers",
    [("round_robin", None, 0), ("weighted", [0.75, 0.25], 0), ("random", [0.5, 0.5], 0), ("weighted", [0.75, 0.25], 2)],
)
def test_exact_resume_of_a_mixture(tmp_path, strategy, weights, workers):
    config = {"paths": write_sources(tmp_path), "strategy": strategy, "weights": weights, "workers": workers}
    ref = check_resume(run_mix, config, stops=[0, 9, 30], fresh_process=False)
    # every record of both sources arrives once (one EOS each), and the sources interleave
    assert sum(int((s["labels"] == 256).sum()) for s in ref) == 360
    text = bytes(int(t) for s in ref for row in s["labels"] for t in row if 0 <= t < 256).decode()
    firsts = [text.find("small record"), text.find("big record 299")]
    assert 0 <= firsts[0] < firsts[1]  # the small source was mixed in, not read after the big one


def rows(step: dict) -> list[bytes]:
    return [a.tobytes() + b.tobytes() for a, b in zip(step["input_ids"], step["labels"])]


def test_a_mixture_resumes_on_other_topologies_losing_nothing(tmp_path):
    config = {"paths": write_sources(tmp_path), "strategy": "weighted", "weights": [0.75, 0.25], "workers": 0}
    others = [{**config, "world": 2}, {**config, "workers": 2}]
    check_resume(run_mix, config, stops=[11, 40], resume_configs=others, exact=False, split_records=rows,
                 fresh_process=False)


def test_a_mixture_is_refused_for_per_entry_dedup_keys_and_sft_entries():
    with pytest.raises(ConfigError, match="seen_hashes_path is not a datasets entry key: every dedup_"):
        DataConfig(datasets=[{"data_source": "dedup_local", "dataset_path": "a", "seen_hashes_path": "s"},
                             {"dataset_path": "b"}])
    cfg = DataConfig(datasets=[{"path": "a.jsonl", "type": "alpaca"}], max_seq_len=8, steps_per_epoch=2)
    with pytest.raises(ValueError, match="datasets\\[0\\] has fine-tuning keys"):
        StreamingTextDataModule(cfg, batch_size=2)


def test_weighted_shares_of_the_records_a_consumer_reads(tmp_path):
    from llm.data.inputs.partitions import stripe_partitions
    from llm.data.text.dataset import StreamingTextDataset

    config = {"paths": write_sources(tmp_path), "strategy": "weighted", "weights": [0.8, 0.2], "workers": 0}
    module = make(config)
    ds = StreamingTextDataset(module.source, module.tokenizer, 16, 4, rank=0, world_size=1)
    events = ds._events(stripe_partitions(module.source.partitions()), {})
    sources = [e[3] for e in events if e[0] == "record"]
    assert Counter(sources) == {0: 300, 1: 60}  # every record of both, once
    # until the small source runs out (its 60 records are 20% of 300), the shares follow the weights
    for n in range(1, 300):
        assert abs(sources[:n].count(1) - 0.2 * n) <= 1


def write_overlapping(folder: Path) -> list[str]:
    """Two corpora sharing records (and repeating some inside), and a third, plain one with repeats."""
    folder.mkdir(parents=True, exist_ok=True)
    texts = {
        "a.txt": [f"shared {i}" for i in range(40)] + [f"only a {i}" for i in range(20)] + ["shared 3"] * 3,
        "b.txt": [f"only b {i}" for i in range(20)] + [f"shared {i}" for i in range(40)],
        "c.txt": ["plain repeat"] * 5 + [f"plain {i}" for i in range(10)],
    }
    for name, lines in texts.items():
        (folder / name).write_text("".join(line + "\n" for line in lines))
    return [str(folder / name) for name in texts]


def dedup_module(config: dict, seen: Path) -> StreamingTextDataModule:
    a, b, c = config["paths"]
    entries = [{"data_source": "dedup_local", "dataset_path": a}, {"data_source": "dedup_local", "dataset_path": b},
               {"dataset_path": c}]
    data = DataConfig(datasets=entries, max_seq_len=16, num_workers=config["workers"], seen_hashes_path=str(seen),
                      write_seen_hashes=True, streaming_dataset_mixing_strategy="round_robin",
                      streaming_mixing_unit=config.get("unit", "records"))
    return StreamingTextDataModule(data, batch_size=4, loop=False)


def run_dedup_mix(config: dict, state: dict | None, steps: int | None):
    """resume.py protocol; each run gets its own copy of the seen-hashes file, committed at the checkpoint."""
    import shutil
    import uuid

    multiprocessing.set_start_method("fork", force=True)
    seen = Path(config["dir"]) / f"seen-{uuid.uuid4().hex}.bin"
    if state is not None and Path(state["seen_hashes"]["path"]).exists():
        shutil.copy(state["seen_hashes"]["path"], seen)
    module = attach(dedup_module(config, seen), config)
    if state is not None:
        module.load_state_dict(state)
    out, batches = [], iter(module.train_dataloader())
    while steps is None or len(out) < steps:
        batch = next(batches, None)
        if batch is None:
            break
        out.append({k: batch[k].numpy() for k in ("input_ids", "labels")})
    return out, module.checkpoint_state()


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("unit", ["records", "tokens"])
def test_dedup_entries_share_one_seen_set_and_resume_exactly(tmp_path, unit):
    config = {"paths": write_overlapping(tmp_path / "text"), "dir": str(tmp_path), "workers": 0, "unit": unit}
    ref = check_resume(run_dedup_mix, config, stops=[0, 4, 9], fresh_process=False)
    # counted by EOS: 40 shared + 20 + 20 distinct dedup records, and all 15 plain ones (repeats kept)
    assert sum(int((s["labels"] == 256).sum()) for s in ref) == 40 + 20 + 20 + 15
    # a standalone pass (iter_texts) keeps the same records, in source order
    texts = list(dedup_module(config, tmp_path / "standalone.bin").source.iter_texts())
    assert Counter(texts)["plain repeat"] == 5 and Counter(texts)["shared 3"] == 1
    assert len(texts) == 95 and texts.index("only b 0") == 60 and texts[-1] == "plain 9"


@pytest.mark.parametrize(
    "weights, message",
    [
        ([float("nan"), 1.0], r"streaming_mixing_weights\[0\] \(datasets\[0\]\) is nan; expected a finite number >= 0"),
        ([0.5, float("inf")], r"streaming_mixing_weights\[1\] \(datasets\[1\]\) is inf"),
        ([1.5, -0.5], r"streaming_mixing_weights\[1\] \(datasets\[1\]\) is -0.5"),
        ([0.0, 0.0], r"streaming_mixing_weights are all zero \(\[0.0, 0.0\]\); give at least one dataset a positive weight"),
    ],
)
@pytest.mark.parametrize("strategy", ["weighted", "random"])
def test_nan_inf_negative_and_all_zero_weights_are_refused_naming_the_entry(weights, message, strategy):
    entries = [{"dataset_path": "a.txt"}, {"dataset_path": "b.txt"}]
    with pytest.raises(ConfigError, match=message):
        DataConfig(datasets=entries, streaming_mixing_weights=weights, streaming_dataset_mixing_strategy=strategy)
    with pytest.raises(ValueError, match=message):
        check_weights(weights, 2, strategy)


@pytest.mark.parametrize("blank", [b"", b"\n  \n"])
def test_an_entry_with_no_records_is_named_when_the_mixture_starts(tmp_path, blank):
    full, empty = write_sources(tmp_path)[0], tmp_path / "empty.txt"
    empty.write_bytes(blank)
    data = DataConfig(datasets=[{"dataset_path": full}, {"dataset_path": str(empty)}], max_seq_len=16)
    module = StreamingTextDataModule(data, batch_size=4, loop=False)
    with pytest.raises(InputError, match=rf"^no records in {empty}: .*; fix or remove datasets\[1\] of the mixture$"):
        next(iter(module.train_dataloader()))


def _random_mix(paths: list[str], seed: int | None = None, state: dict | None = None, steps: int | None = None):
    data = DataConfig(datasets=[{"dataset_path": p} for p in paths], max_seq_len=16,
                      streaming_dataset_mixing_strategy="random", streaming_mixing_weights=[0.5, 0.5])
    module = StreamingTextDataModule(data, batch_size=4, loop=False, **({} if seed is None else {"seed": seed}))
    if state is not None:
        module.load_state_dict(state)
    out = [b["input_ids"].numpy() for b in islice(module.train_dataloader(), steps)]
    return out, module


def test_the_root_seed_sets_a_random_mixture_order(tmp_path):
    paths = write_sources(tmp_path)
    one, _ = _random_mix(paths, seed=1)
    assert_same_steps(_random_mix(paths, seed=1)[0], one, "same seed")
    two, module = _random_mix(paths, seed=2)
    assert len(one) == len(two) and any((a != b).any() for a, b in zip(one, two))
    assert module.state_dict()["version"] == 3 and module.state_dict()["seed"] == 2


# every batch of the random mixture above before the root seed (state version 1: seed 0)
LEGACY_ORDER = (106, "011bcb60b84237d4f66408d2aefe2c95812d10519f5936a901c43ca03c989939")


def test_a_version_1_state_resumes_with_the_old_derivation_exactly(tmp_path):
    paths = write_sources(tmp_path)
    _, fresh = _random_mix(paths, steps=0)
    old = {**fresh.state_dict(), "version": 1}
    del old["seed"]
    legacy, _ = _random_mix(paths, seed=5, state=old)
    assert (len(legacy), hashlib.sha256(b"".join(b.tobytes() for b in legacy)).hexdigest()) == LEGACY_ORDER
    head, module = _random_mix(paths, seed=5, state=old, steps=40)
    state = module.state_dict()
    assert state["version"] == 1  # saved again the old way, so it keeps resuming exactly
    rest, _ = _random_mix(paths, seed=5, state=state)
    assert_same_steps(head + rest, legacy, "a version-1 state resumed")
