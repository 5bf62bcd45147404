"""`tokens_by_source` in metrics.jsonl (and TensorBoard, and the plot): a mixture's per-source tokens, equal to
an independent count of the batches trained on, kept across a resume from the checkpoint."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llm.data.stage import StateError
from llm.training import metrics
from llm.training.core.loading import build_config
from llm.training.metrics import read_metrics
from llm.training.plot import plot_run
from llm.training.trainer import Trainer
from tests.data.text.test_token_mixing import count_by_source, write_corpora
from tests.training.test_trainer import tiny_tree


class Board:
    """A SummaryWriter stand-in that keeps the scalars (tensorboard is an optional extra)."""

    scalars: list[tuple[str, float, int]] = []

    def add_scalar(self, key: str, value: float, step: int) -> None:
        self.scalars.append((key, value, step))

    def close(self) -> None:
        pass


def mixture_tree(tmp_path: Path, **checkpoint: object) -> dict:
    short, long = write_corpora(tmp_path / "data", 800, 60)
    return tiny_tree(short, data={"datasets": [{"dataset_path": short}, {"dataset_path": long, "name": "books"}],
                                  "streaming_dataset_mixing_strategy": "weighted",
                                  "streaming_mixing_schedule": [{"step": 0, "weights": [0.5, 0.5]},
                                                                {"step": 6, "weights": [0.3, 0.7]}],
                                  "streaming_mixing_unit": "tokens", "steps_per_epoch": 8, "dataset_path": ""},
                     training={"epochs": 1, "log_interval_steps": 4},
                     checkpoint={"checkpoint_dir": str(tmp_path / "run"), "save_interval_steps": 3, **checkpoint})


def train(tree: dict, stop_after: int | None = None) -> list[dict]:
    batches: list[dict] = []
    trainer = Trainer(build_config(tree), "stream_lm", log=lambda _: None,
                      callbacks=[lambda t, batch, loss: batches.append({k: v.numpy() for k, v in batch.items()})])
    trainer.fit(stop_after=stop_after)
    trainer.close()
    return batches


@pytest.mark.slow  # end to end (a model trained and resumed): CI runs it
def test_metrics_hold_each_sources_tokens_as_the_batches_count_them(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(metrics, "_tensorboard", lambda folder: Board())
    Board.scalars = []
    tree = mixture_tree(tmp_path)
    head = train(tree, stop_after=3)  # a checkpoint at step 3, then a resume from it
    resumed = {**tree, "checkpoint": {**tree["checkpoint"], "resume_from_checkpoint": str(tmp_path / "run" / "latest")}}
    past = [{"step": 0, "weights": [0.5, 0.5]}, {"step": 2, "weights": [0.3, 0.7]}]  # step 2 was trained
    with pytest.raises(StateError, match="gives other weights at step 2 than the run that saved this state, which has "
                                         "read to step 3; change the schedule only from step 3 on"):
        train({**resumed, "data": {**tree["data"], "streaming_mixing_schedule": past}})
    future = [{"step": 0, "weights": [0.5, 0.5]}, {"step": 5, "weights": [0.3, 0.7]}]  # moved, still ahead: accepted
    tail = train({**resumed, "data": {**tree["data"], "streaming_mixing_schedule": future}})
    batches = head + tail
    assert len(batches) == 8
    records = [r for r in read_metrics(tmp_path / "run") if "tokens_by_source" in r]
    assert [r["step"] for r in records] == [4, 8]
    for r in records:  # each logged count is the batches' own count up to that step (across the resume)
        counted = count_by_source(batches[: r["step"]])
        assert r["tokens_by_source"] == {"short": counted["short"][0], "books": counted["long"][0]}
        assert r["samples_by_source"] == {"short": counted["short"][1], "books": counted["long"][1]}
    final = records[-1]["tokens_by_source"]
    assert ("tokens_by_source/books", final["books"], 8) in Board.scalars
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib (the dev extra installs it)")
    from PIL import Image

    image = Image.open(plot_run(tmp_path / "run"))
    assert image.height == 1500  # a fifth panel (after loss, speed, wait, remote): each source's token share
    assert np.asarray(image).std() > 0


def test_the_meter_writes_per_source_scalars_and_the_plot_draws_their_shares(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(metrics, "_tensorboard", lambda folder: Board())
    Board.scalars = []
    meter = metrics.RunMeter(tmp_path, 0, 2)
    for step, (a, b) in enumerate([(100, 300), (250, 550)], start=1):
        meter.record(step, loss=1.0, tokens_by_source={"wiki": a, "code": b})
    meter.close()
    assert ("tokens_by_source/code", 550, 2) in Board.scalars and ("tokens_by_source/wiki", 100, 1) in Board.scalars
    assert [r["tokens_by_source"] for r in read_metrics(tmp_path)] == [{"wiki": 100, "code": 300},
                                                                      {"wiki": 250, "code": 550}]
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib (the dev extra installs it)")
    import matplotlib.figure

    shares: dict[str, list[float]] = {}
    original = matplotlib.figure.Figure.savefig

    def keep(self, *args, **kwargs):  # read the last (shares) panel's curves before the figure is written
        shares.update({str(line.get_label()): list(line.get_ydata()) for line in self.axes[-1].lines})
        return original(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    plot_run(tmp_path)
    assert shares == {"code": [75.0, 68.75], "wiki": [25.0, 31.25]}


def _sum_on_rank(rank: int, port: int, out: Path) -> None:
    import json

    import torch.distributed as dist

    from llm.training.source_metrics import sum_over_ranks

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        mine = {"wiki": {"tokens": 1000 * (rank + 1), "samples": rank + 1}, "code": {"tokens": 7, "samples": 1}}
        (out / f"rank{rank}.json").write_text(json.dumps(sum_over_ranks(mine)))
    finally:
        dist.destroy_process_group()


def test_the_counts_are_summed_over_ranks_with_torch_distributed(tmp_path: Path) -> None:
    import json
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_sum_on_rank, args=(port, tmp_path), nprocs=2, start_method="fork")
    want = {"wiki": {"tokens": 3000, "samples": 3}, "code": {"tokens": 14, "samples": 2}}
    assert [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)] == [want, want]
