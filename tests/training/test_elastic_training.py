"""llm-train resumed at another global batch size, or with sources added under data.mixture_changes: allow."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from llm.training.checkpoint import check_resume_config
from llm.training.core.loading import build_config
from llm.training.trainer import Trainer


def _corpus(path: Path, n: int = 60) -> Path:
    # hex digests: every block of the token stream is distinct, so rows can be told apart
    path.write_text("\n".join(hashlib.sha256(str(i).encode()).hexdigest() for i in range(n)) + "\n")
    return path


def _tree(corpus: Path, out: Path, batch: int, resume: str | None = None, epochs: int = 1) -> dict:
    return {
        "data": {"data_source": "local", "dataset_path": str(corpus), "max_seq_len": 16, "cache_dir": str(out / "cache")},
        "model": {"d_model": 16, "n_layers": 1, "n_heads": 2},
        "training": {"batch_size": batch, "lr": 1e-3, "warmup_steps": 1, "seed": 1, "epochs": epochs},
        "checkpoint": {"checkpoint_dir": str(out / "ckpt"), "save_interval_steps": 3, "resume_from_checkpoint": resume},
    }


def _rows(tree: dict, stop_after: int | None = None) -> tuple[list[bytes], Trainer]:
    rows: list[bytes] = []
    trainer = Trainer(build_config(tree), "lm", callbacks=[lambda t, b, loss: rows.extend(
        r.tobytes() for r in b["input_ids"].numpy())], log=lambda _: None)
    trainer.fit(stop_after=stop_after)
    return rows, trainer


@pytest.mark.parametrize("epochs", [1, 2])
def test_lm_resumed_at_another_global_batch_trains_every_block_once_per_epoch(tmp_path: Path, epochs: int) -> None:
    corpus = _corpus(tmp_path / "c.txt")
    straight, done = _rows(_tree(corpus, tmp_path / "a", 4, epochs=epochs))
    head, first = _rows(_tree(corpus, tmp_path / "b", 4, epochs=epochs), stop_after=3)
    assert first.step == 3
    tail, second = _rows(_tree(corpus, tmp_path / "b", 2, str(tmp_path / "b" / "ckpt" / "latest"), epochs=epochs))
    # the data resumes exactly: the same blocks in the same order, regrouped into smaller batches
    assert head + tail == straight
    assert second.epoch == done.epoch == epochs
    assert len(tail) == len(straight) - 12 and second.step == 3 + len(tail) // 2


def test_a_batch_change_is_no_longer_a_config_change_but_other_keys_still_are() -> None:
    saved = {"training": {"batch_size": 8, "lr": 1.0}, "data": {"datasets": [{"path": "a"}], "mixture_changes": "refuse"}}
    now = {"training": {"batch_size": 4, "lr": 1.0}, "data": {"datasets": [{"path": "a"}], "mixture_changes": "refuse"}}
    check_resume_config({"config": saved, "world_size": 1}, now, 1)  # batch size alone: accepted
    grown = {**now, "data": {"datasets": [{"path": "a"}, {"path": "b"}], "mixture_changes": "refuse"}}
    with pytest.raises(ValueError, match=r"data.datasets: .*data.mixture_changes: allow"):
        check_resume_config({"config": saved, "world_size": 1}, grown, 1)
    allowed = {**now, "data": {"datasets": [{"path": "a"}, {"path": "b"}], "mixture_changes": "allow"}}
    check_resume_config({"config": saved, "world_size": 1}, allowed, 1)


def test_stream_lm_takes_a_new_source_on_resume_with_mixture_changes_allow(tmp_path: Path) -> None:
    a, b = _corpus(tmp_path / "a.txt", 80), tmp_path / "b.txt"
    b.write_text("\n".join(f"the second source, line {i}" for i in range(80)) + "\n")

    def tree(entries: list[dict], resume: str | None, changes: str = "allow") -> dict:
        return {
            "data": {"data_source": "local", "max_seq_len": 16, "steps_per_epoch": 6, "datasets": entries,
                     "streaming_dataset_mixing_strategy": "round_robin", "mixture_changes": changes},
            "model": {"d_model": 16, "n_layers": 1, "n_heads": 2},
            "training": {"batch_size": 2, "lr": 1e-3, "warmup_steps": 1, "seed": 1},
            "checkpoint": {"checkpoint_dir": str(tmp_path / "ckpt"), "save_interval_steps": 3, "resume_from_checkpoint": resume},
        }

    one = [{"path": str(a), "name": "a"}]
    both = [*one, {"path": str(b), "name": "b"}]
    first = Trainer(build_config(tree(one, None)), "stream_lm", log=lambda _: None)
    first.fit(stop_after=3)
    latest = str(tmp_path / "ckpt" / "latest")
    with pytest.raises(ValueError, match="mixture_changes"):
        Trainer(build_config(tree(both, latest, "refuse")), "stream_lm", log=lambda _: None)
    seen: list[dict] = []
    second = Trainer(build_config(tree(both, latest)), "stream_lm", log=lambda _: None,
                     callbacks=[lambda t, batch, loss: seen.append(batch)])
    second.fit()
    counts = second.data.source_counts()
    assert second.step == 6 and set(counts) == {"a", "b"} and counts["b"]["samples"] > 0
