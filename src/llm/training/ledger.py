"""llm-train's run ledger: where it lives, its run id, each row's loss, and the batches skipped.

The ledger of a run is `RUN_DIR/ledger/<run>/` (RUN_DIR: `checkpoint.checkpoint_dir`), one folder
per run id, so a fresh run over another one (`--overwrite`) never mixes its steps into the other's
ledger: the replaced run's ledger goes with its checkpoints, once this run's first checkpoint is on
disk, and a ledger without any checkpoint (a run killed before its first save) is stale and removed
when a fresh run starts. Every checkpoint names its ledger (`ledger: {folder, run}`), so a resume,
also from a checkpoint stored elsewhere, continues the ledger the checkpoint stands on.

The segments themselves are written by the task's data (the shard loader; the text and SFT
modules) when the checkpoint asks for its state: what the workers read, committed with the cursor.
"""

from __future__ import annotations

import math
import secrets
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from llm.data.ledger.writer import written_elsewhere
from llm.training.checkpoint import run_step
from llm.training.runtime import DistEnv, gather

LEDGER_DIR = "ledger"
IGNORE_INDEX = -100


def row_losses(logits: torch.Tensor, labels: torch.Tensor) -> np.ndarray:
    """Each row's mean token loss from the logits and labels the step already has (NaN: no target)."""
    with torch.no_grad():
        per_token = F.cross_entropy(logits.detach().float().transpose(1, 2), labels, ignore_index=IGNORE_INDEX,
                                    reduction="none")
        counted = (labels != IGNORE_INDEX).sum(dim=1)
        mean = per_token.sum(dim=1) / counted.clamp(min=1)
        return torch.where(counted > 0, mean, torch.full_like(mean, math.nan)).cpu().numpy()


def ledger_folder(named: dict[str, Any], checkpoint: str | Path | None) -> Path:
    """The ledger folder a checkpoint names: beside it (a run folder moved whole) or where it was written."""
    run = named.get("run")
    candidates = [Path(checkpoint).parent / LEDGER_DIR / str(run)] if checkpoint else []
    candidates.append(Path(str(named.get("folder"))))
    for folder in candidates:
        if folder.is_dir():
            return folder
    raise ValueError(f"checkpoint {checkpoint or '(in memory)'} names the ledger of run {run}, found in neither "
                     f"{' nor '.join(str(c) for c in candidates)}; restore that folder, or resume with "
                     "--set checkpoint.ledger=false")


class RunLedger:
    """The trainer's side of the ledger: which folder and run, and what each step did with its batch."""

    def __init__(self, config: Any, data: Any, env: DistEnv, log: Any):
        cc = config.checkpoint
        self.data, self.env, self.log = data, env, log
        self.root = Path(cc.checkpoint_dir) / LEDGER_DIR if cc.checkpoint_dir else None
        self.on = bool(cc.ledger and self.root is not None and data.writes_ledger)
        self.losses = self.on and cc.ledger_loss
        self.folder: Path | None = None
        self.run: str | None = None
        self._replaced: list[Path] = []

    def start(self, replacing: bool) -> None:
        """A fresh run: a new run id (rank 0's, on every rank: a collective) in its own folder."""
        if not self.on or self.root is None:
            return
        run = gather(secrets.token_hex(8), self.env)[0]
        if self.env.is_main and self.root.is_dir() and (replacing or run_step(self.root.parent) is None):
            # --overwrite's replaced run, or ledgers no checkpoint stands on (stale): removed once this run's
            # first checkpoint is on disk, so until then an interrupted start leaves them as they were
            self._replaced = sorted(p for p in self.root.iterdir() if p.is_dir() and p.name != run)
        self._attach(self.root / run, run)

    def resume(self, ckpt: dict[str, Any]) -> None:
        """Continue the ledger the checkpoint names (before the data's state is loaded)."""
        if not self.on:
            return
        self._replaced = []  # a resume stands on an earlier ledger: nothing is replaced
        named = ckpt.get("ledger")
        if not isinstance(named, dict) or not isinstance(named.get("run"), str):
            self.on = self.losses = False
            self.log(f"checkpoint {ckpt.get('path', '(in memory)')} has no run ledger (checkpoint.ledger was off, or "
                     "it predates ledgers): this run writes none; start a fresh run to have one")
            return
        self._attach(ledger_folder(named, ckpt.get("path")), named["run"])

    def _attach(self, folder: Path, run: str) -> None:
        self.folder, self.run = folder, run
        self.data.attach_ledger(str(folder), run)

    def state(self, batches_drawn: int, data_state: Any) -> dict[str, Any] | None:
        """What a checkpoint stores: the ledger's folder, run id, last step and generation (None: no ledger).

        The ledger counts every batch the data handed over, skipped ones too: its step is `batches_drawn`.
        The generation is the data state's (`ledger: {run, generation, step}`), so `audit` knows which
        generations a checkpoint stands on (one that none stands on was lost to a kill, not abandoned)."""
        if not self.on or self.folder is None:
            return None
        position = data_state.get("ledger") if isinstance(data_state, dict) else None
        generation = position.get("generation") if isinstance(position, dict) else None
        return {"folder": str(self.folder.resolve()), "run": self.run, "step": batches_drawn, "generation": generation}

    def replaced_gone(self) -> None:
        """This run's checkpoint is on disk: the ledgers of the run it replaced, and stale ones, go."""
        for folder in self._replaced:
            holder = written_elsewhere(folder)
            if holder:  # another run started in this checkpoint_dir and writes it still: not stale, kept
                self.log(f"ledger {folder} is kept: it is being written by {holder}")
                continue
            shutil.rmtree(folder, ignore_errors=True)
        self._replaced = []

    def trained(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """The batch handed over last was trained: its rows' losses go to the ledger (checkpoint.ledger_loss)."""
        if self.losses:
            self.data.ledger_loss(row_losses(logits, labels))

    def skipped(self) -> None:
        """The batch handed over last was read and dropped (data.skip_batches)."""
        if self.on:
            self.data.ledger_skip()
