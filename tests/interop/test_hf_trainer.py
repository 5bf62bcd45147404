"""Hugging Face transformers.Trainer with our loader (docs/interop.md's recipe): stop, resume, same data."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.interop.samples import audited_once

transformers = pytest.importorskip("transformers", reason="transformers is not installed")
pytest.importorskip("accelerate", reason="accelerate is not installed (transformers.Trainer needs it)")


def _loader(folder, ledger=None):
    from llm.data import StreamingDataLoader, StreamingDataset, TokensLoader

    ds = StreamingDataset(folder, item_loader=TokensLoader(block_size=32, document_boundaries=True), shuffle=True, seed=7)
    return StreamingDataLoader(ds, batch_size=4, ledger=ledger)


class _Recorder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(1000, 4)
        self.seen: list[list[int]] = []

    def forward(self, input_ids, position_ids=None):
        if self.training:
            self.seen.append(input_ids[:, 0].tolist())
        return {"loss": self.emb(input_ids).pow(2).mean()}


class StreamingTrainer(transformers.Trainer):
    """The recipe: our loader is the train dataloader (it shards by rank itself; no accelerate wrapping)."""

    def __init__(self, *args, train_loader, **kwargs):
        self.train_loader = train_loader
        super().__init__(*args, **kwargs)

    def get_train_dataloader(self):
        return self.train_loader


class SaveLoaderState(transformers.TrainerCallback):
    """Our loader's state next to every Trainer checkpoint: checkpoint-N/data_state.pt."""

    def __init__(self, loader):
        self.loader = loader

    def on_save(self, args, state, control, **kwargs):
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        torch.save(self.loader.state_dict(), folder / "data_state.pt")


def _fit(folder, out: Path, max_steps: int, save_steps: int | None = None, resume: Path | None = None,
         ledger: Path | None = None) -> _Recorder:
    loader, model = _loader(folder, ledger), _Recorder()
    if resume is not None:
        loader.load_state_dict(torch.load(resume / "data_state.pt"))
    args = transformers.TrainingArguments(
        output_dir=str(out), max_steps=max_steps, per_device_train_batch_size=4, learning_rate=0.01,
        save_strategy="steps" if save_steps else "no", save_steps=save_steps or 500, report_to=[],
        logging_strategy="no", use_cpu=True, ignore_data_skip=True,  # our state resumes; do not skip batches again
        dataloader_num_workers=0, disable_tqdm=True,
    )
    trainer = StreamingTrainer(model=model, args=args, train_loader=loader, callbacks=[SaveLoaderState(loader)])
    trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    return model


@pytest.mark.parametrize("where", ["mid-epoch", "epoch end"])
def test_hf_trainer_resume_continues_the_data_exactly(trainer_tokens, tmp_path, where):
    per_epoch = len(_loader(trainer_tokens))
    stop = 5 if where == "mid-epoch" else per_epoch
    total = per_epoch + 5
    reference = _fit(trainer_tokens, tmp_path / "ref", total)
    assert len(reference.seen) == total
    ledger = tmp_path / "run" / "ledger"  # committed by SaveLoaderState's state_dict() at each save
    first = _fit(trainer_tokens, tmp_path / "run", stop, save_steps=stop, ledger=ledger)
    second = _fit(trainer_tokens, tmp_path / "run", total, save_steps=total,
                  resume=tmp_path / "run" / f"checkpoint-{stop}", ledger=ledger)
    assert first.seen + second.seen == reference.seen
    assert audited_once(ledger) == total * 4  # every trained sample once, across the stop
