"""`packing: best_fit` in training: the model keeps each packed document to itself, and a run resumes exactly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from llm.data.text.stream import StreamingTextDataModule
from llm.training.core.data_config import DataConfig
from llm.training.core.loading import build_config
from llm.training.model import TransformerLM
from llm.training.trainer import Trainer
from tests.resume import check_resume
from tests.training.test_trainer import run_trainer, tiny_tree, write_corpus


def test_a_packed_block_trains_as_its_documents_alone(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "demo.txt", 80)
    data = DataConfig(dataset_path=str(corpus), max_seq_len=64, packing="best_fit", packing_buffer=8)
    batch = next(iter(StreamingTextDataModule(data, 4, loop=False).train_dataloader()))
    torch.manual_seed(0)
    model = TransformerLM(vocab_size=257, max_seq_len=64, d_model=32, n_layers=2, n_heads=2).eval()
    with torch.no_grad():
        _, packed = model(batch["input_ids"], batch["labels"], batch["position_ids"])
        losses, count = [], 0
        for ids, labels, pos in zip(batch["input_ids"], batch["labels"], batch["position_ids"]):
            starts = [*np.flatnonzero(pos.numpy() == 0), len(pos)]
            for a, b in zip(starts, starts[1:]):  # each document in a row of its own
                logits, _ = model(ids[None, a:b], labels[None, a:b])
                losses.append(F.cross_entropy(logits[0], labels[a:b], ignore_index=-100, reduction="sum"))
                count += int((labels[a:b] != -100).sum())
    assert len(losses) > 2 * len(batch["input_ids"])  # several documents per block
    assert torch.allclose(packed, sum(losses) / count, atol=1e-5)


def test_a_best_fit_run_resumes_exactly(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "demo.txt", 200)
    tree = tiny_tree(corpus, data={"steps_per_epoch": 6, "packing": "best_fit", "packing_buffer": 4})
    reference = check_resume(run_trainer, {"tree": tree, "task": "stream_lm"}, stops=[2, 4], fresh_process=False)
    assert len(reference) == 6


def test_axolotl_pretraining_dataset_with_best_fit_trains_on_document_boundaries(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "demo.txt", 200)
    tree = {"pretraining_dataset": [{"path": str(corpus)}], "max_steps": 2, "sequence_len": 32, "micro_batch_size": 4,
            "packing": "best_fit", "packing_buffer": 4, "output_dir": None}
    seen: list[dict] = []
    trainer = Trainer(build_config(tree), "stream_lm", callbacks=[lambda t, b, loss: seen.append(b)], log=lambda _: None)
    trainer.fit()
    trainer.close()
    assert len(seen) == 2 and all((b["position_ids"] == 0).sum() > len(b["input_ids"]) for b in seen)


def test_best_fit_on_blocks_cut_elsewhere_is_refused(tmp_path: Path) -> None:
    from llm.training.core.loading import ConfigError

    corpus = write_corpus(tmp_path / "demo.txt", 50)
    tree = tiny_tree(corpus, data={"steps_per_epoch": 2, "packing": "best_fit"})
    with pytest.raises(ConfigError, match="data.packing 'best_fit' packs text streamed on the fly, not --task lm's"):
        Trainer(build_config(tree), "lm", log=lambda _: None)
