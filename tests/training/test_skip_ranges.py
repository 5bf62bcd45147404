"""`data.skip_batches`: a run trains the straight run's batches minus the skipped ones, across resumes, for every data kind."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from llm.data.shards.prepare.optimize_text import optimize_text
from llm.training.core.loading import build_config
from llm.training.skip_ranges import SkipRanges, merge, parse_ranges, uncovered
from llm.training.trainer import Trainer
from tests.training.test_trainer import tiny_tree, write_corpus


def train(tree: dict, task: str, steps: int, state: dict | None = None, skip: Any = None) -> tuple[list[bytes], dict]:
    """`steps` steps (from `state` when given) with data.skip_batches = `skip`; the batches trained and the payload."""
    torch.set_num_threads(1)  # a tiny model: more threads only contend on a busy machine
    tree = copy.deepcopy(tree)
    if skip is not None:
        tree["data"]["skip_batches"] = skip
    seen: list[bytes] = []
    trainer = Trainer(build_config(tree), task, callbacks=[lambda t, b, loss: seen.append(b["input_ids"].numpy().tobytes())],
                      log=lambda _: None)
    try:
        if state is not None:
            trainer.load_payload(state)
        trainer.fit(stop_after=steps)
        return seen, trainer.state_payload()
    finally:
        trainer.close()


def _tree(tmp_path: Path, kind: str) -> dict:
    """A tiny stream_lm run over a text stream, optimized shards of the same text, or a mixture of two texts."""
    text = write_corpus(tmp_path / "a.txt", 300)
    run = {"training": {"max_steps": 40}, "checkpoint": {"checkpoint_dir": str(tmp_path / "ck")}}
    if kind == "optimized shards":
        optimize_text([str(text)], str(tmp_path / "opt"), tokenizer="simple", num_workers=1, progress=False)
        return tiny_tree(tmp_path / "opt", data={"data_source": "optimized"}, **run)
    if kind == "mixture":
        other = tmp_path / "b.txt"
        other.write_text("\n".join(f"another text {i} with {'xyz' * (i % 3)}" for i in range(200)) + "\n")
        entries = [{"data_source": "local", "dataset_path": str(p)} for p in (text, other)]
        return tiny_tree(text, data={"steps_per_epoch": 40, "datasets": entries, "streaming_mixing_weights": [0.5, 0.5],
                                     "streaming_dataset_mixing_strategy": "weighted"}, **run)
    return tiny_tree(text, data={"steps_per_epoch": 40}, **run)


@pytest.mark.parametrize("kind", ["text stream", "optimized shards", "mixture"])
def test_skipped_batches_are_never_trained_and_survive_every_resume(tmp_path: Path, kind: str) -> None:
    tree, task = _tree(tmp_path, kind), "stream_lm"
    straight, _ = train(tree, task, 11)
    assert len(set(straight)) == 11  # every batch differs: the comparison below means something
    head, state = train(tree, task, 2)
    middle, state = train(tree, task, 3, state, skip=[[3, 5]])  # a spike at batches 3 and 4
    assert state["skip_batches"] == {"ranges": [[3, 5]], "next_batch": 7, "skipped": 2}
    tail, state = train(tree, task, 2, state, skip=[[8, 9]])  # a new range joins the checkpoint's
    assert state["skip_batches"] == {"ranges": [[3, 5], [8, 9]], "next_batch": 10, "skipped": 3}
    last, state = train(tree, task, 1, state)  # resumed without the key: the ranges stay
    assert head + middle + tail + last == [b for i, b in enumerate(straight) if i not in (3, 4, 8)]
    assert state["skip_batches"] == {"ranges": [[3, 5], [8, 9]], "next_batch": 11, "skipped": 3}
    if kind == "text stream":  # counted in metrics.jsonl
        records = [json.loads(line) for line in (tmp_path / "ck" / "metrics.jsonl").read_text().splitlines()]
        assert [r["skipped_batches"] for r in records if "skipped_batches" in r][-1] == 3


def test_a_range_over_batches_already_trained_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    tree, task = _tree(tmp_path, "text stream"), "stream_lm"
    _, state = train(tree, task, 2)
    _, state = train(tree, task, 2, state, skip=[[3, 5]])  # drawn: 0-5, trained 0-2 and 5
    with pytest.raises(ValueError, match=r"^data.skip_batches range \[4, 7\] overlaps batches already trained: "
                                         r"checkpoint \(in memory\) has trained batch 5 \(it has drawn batches 0 to 5\)"):
        train(tree, task, 1, state, skip=[[4, 7]])
    again, _ = train(tree, task, 1, state, skip=[[3, 5]])  # the same key given again is fine
    assert len(again) == 1


@pytest.mark.parametrize("value, message", [
    ([[5, 3]], "data.skip_batches[0] [5, 3] is reversed"),
    ([[0, 2], [5, 5]], "data.skip_batches[1] [5, 5] is empty (end is exclusive)"),
    ([[1, 2, 3]], "data.skip_batches[0] is [1, 2, 3]; a range is [start, end]"),
    ([[-1, 2]], "data.skip_batches[0] is [-1, 2]"),
    ([[5.0, 10]], "data.skip_batches[0] is [5.0, 10]; a range is [start, end] with whole numbers >= 0"),
    ([[1, 2.5]], "data.skip_batches[0] is [1, 2.5]; a range is [start, end] with whole numbers >= 0"),
    ([[True, 3]], "data.skip_batches[0] is [True, 3]"),
    ([[1, "1e18"]], "data.skip_batches[0] is [1, '1e18']"),
    ("1-3", "data.skip_batches is '1-3'"),
])
def test_bad_ranges_name_key_and_value(value: Any, message: str) -> None:
    with pytest.raises(ValueError) as info:
        SkipRanges(value)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_ranges_merge_and_cover() -> None:
    assert parse_ranges([[7, 9], [1, 3], [3, 4], [8, 12]]) == [(1, 4), (7, 12)]
    assert merge([(5, 6), (0, 1)]) == [(0, 1), (5, 6)]
    assert uncovered((1, 4), [(1, 4)]) is None and uncovered((1, 5), [(1, 4)]) == 4 and uncovered((0, 2), []) == 0
    skips = SkipRanges([[1, 3]])
    assert list(skips.filter(iter("abcde"))) == ["a", "d", "e"] and skips.state()["skipped"] == 2


def test_a_run_with_ranges_resumes_exactly_through_the_shared_helper(tmp_path: Path) -> None:
    from tests.resume import check_resume
    from tests.training.test_trainer import run_trainer

    tree = tiny_tree(write_corpus(tmp_path / "a.txt", 300), data={"steps_per_epoch": 8, "skip_batches": [[2, 4], [6, 7]]})
    reference = check_resume(run_trainer, {"tree": tree, "task": "stream_lm"}, stops=[3, 5], fresh_process=False)
    assert len(reference) == 8
    straight = copy.deepcopy(tree)
    del straight["data"]["skip_batches"]
    straight["training"]["epochs"] = 2  # 11 steps: the 8 trained plus the 3 skipped
    plain, _ = run_trainer({"tree": straight, "task": "stream_lm"}, None, 11)
    assert [r["input_ids"].tobytes() for r in reference] == \
        [r["input_ids"].tobytes() for i, r in enumerate(plain) if i not in (2, 3, 6)]


@pytest.mark.timeout(120)  # before the check, these runs read and dropped batches forever
@pytest.mark.parametrize("skip, first", [([[5, 10**18]], 5), ([[0, 10**23]], 0), ([[2, 3], [5, 10**18]], 5)])
def test_a_range_longer_than_the_run_is_refused_before_reading_it(tmp_path: Path, skip: Any, first: int) -> None:
    tree, task = _tree(tmp_path, "text stream"), "stream_lm"
    with pytest.raises(ValueError) as info:
        train(tree, task, 40, skip=skip)
    message = str(info.value)
    assert message.startswith(f"data.skip_batches range [{first}, {skip[-1][1]}] would make this run read and drop ")
    assert "more than the 40 steps it trains" in message and "\n" not in message


def test_what_a_run_can_skip_is_worked_out_per_range_without_reading() -> None:
    skips = SkipRanges([[3, 40], [10**9, 10**18]])  # 37 dropped of 40 steps; the second is never reached
    assert skips.dropped(0, 40) == 37
    skips = SkipRanges([[3, 44]])
    with pytest.raises(ValueError, match=r"\[3, 44\] would make this run read and drop 41 batches, more than"):
        skips.dropped(0, 40)
    assert skips.dropped(0, 3) == 0  # the run ends at batch 3, before the range: nothing is read
    assert SkipRanges([[0, 10**23]]).dropped(0, 0) == 0
    resumed = SkipRanges()
    resumed.restore(([(3, 5), (50, 55)], 60, 7))  # drawn past both: nothing more to drop
    assert resumed.dropped(53, 100) == 0
    resumed.restore(([(3, 5), (50, 10**18)], 10, 2))
    with pytest.raises(ValueError, match=r"\[50, 1000000000000000000\] would make this run read and drop"):
        resumed.dropped(8, 100)  # 40 trained batches reach batch 50
