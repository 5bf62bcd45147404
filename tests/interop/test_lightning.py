"""PyTorch Lightning: Trainer.fit with our StreamingDataLoader, stopped, resumed from its checkpoint, same data."""

from __future__ import annotations

import pytest
import torch

from tests.interop.samples import audited_once, trainer_loader

lightning = pytest.importorskip("lightning", reason="lightning is not installed (the `interop` extra)")


class _Recorder(lightning.LightningModule):
    """A tiny model that remembers the first token of every row it trained on, per global step."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(1000, 4)
        self.seen: list[list[int]] = []

    def training_step(self, batch, batch_idx):
        self.seen.append(batch[:, 0].tolist())
        return self.emb(batch).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class _Data(lightning.LightningDataModule):
    def __init__(self, folder, ledger=None):
        super().__init__()
        self.folder, self.ledger = folder, ledger

    def train_dataloader(self):
        return trainer_loader(self.folder, ledger=self.ledger)


def _trainer(tmp_path, max_steps: int, every: int | None = None):
    from lightning.pytorch.callbacks import ModelCheckpoint

    callbacks = [ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=every, save_top_k=-1,
                                 filename="{step}")] if every else []
    return lightning.Trainer(accelerator="cpu", devices=1, max_steps=max_steps, logger=False, callbacks=callbacks,
                             enable_checkpointing=bool(every), enable_progress_bar=False, enable_model_summary=False)


@pytest.mark.parametrize("where", ["mid-epoch", "epoch end"])
def test_lightning_resume_continues_the_data_exactly(trainer_tokens, tmp_path, where):
    per_epoch = len(trainer_loader(trainer_tokens))
    stop = 5 if where == "mid-epoch" else per_epoch
    total = per_epoch + 5  # crosses an epoch boundary
    assert stop < total
    reference = _Recorder()
    _trainer(tmp_path / "ref", total).fit(reference, datamodule=_Data(trainer_tokens))
    assert len(reference.seen) == total

    first, ledger = _Recorder(), tmp_path / "ledger"  # docs/interop.md: the ledger is committed with each checkpoint
    _trainer(tmp_path / "ckpt", stop, every=stop).fit(first, datamodule=_Data(trainer_tokens, ledger))
    ckpt = tmp_path / "ckpt" / f"step={stop}.ckpt"
    saved = torch.load(ckpt, weights_only=False)["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]
    assert saved["samples_consumed"] == (stop % per_epoch) * 4  # Lightning saved our state, not a prefetched one

    second = _Recorder()
    _trainer(tmp_path / "ckpt2", total, every=total).fit(second, datamodule=_Data(trainer_tokens, ledger), ckpt_path=ckpt)
    assert first.seen + second.seen == reference.seen
    assert audited_once(ledger) == total * 4  # every trained sample once, across the stop


class _IngestLogger(lightning.Callback):
    """docs/optimized-shards.md's example: the loader's figures every `every` steps, as Lightning metrics."""

    def __init__(self, loader, every: int = 4):
        self.loader, self.every, self.logged = loader, every, []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step % self.every == 0:
            stats = self.loader.stats(reset=True)  # this window's figures; the next window starts now
            figures = {f"data/{k}": float(v) for k, v in stats.items() if v is not None}
            pl_module.log_dict(figures, on_step=True)
            self.logged.append(stats)


def test_lightning_logs_the_loaders_ingest_figures(trainer_tokens, tmp_path):
    data = _Data(trainer_tokens)
    loader = data.train_dataloader()
    data.train_dataloader = lambda: loader  # the callback reads the loader Lightning iterates
    callback = _IngestLogger(loader, every=4)
    trainer = lightning.Trainer(accelerator="cpu", devices=1, max_steps=12, logger=False, callbacks=[callback],
                                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(_Recorder(), datamodule=data)
    assert [s["batches"] for s in callback.logged] == [4, 4, 4]
    assert all(s["tokens"] == 4 * 4 * 32 and s["wait_p99_ms"] >= s["wait_p50_ms"] for s in callback.logged)
    assert trainer.callback_metrics["data/batches"] == 4
