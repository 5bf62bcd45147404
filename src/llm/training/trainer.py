"""The training loop: AdamW, warmup + cosine, grad clipping, AMP on CUDA, DDP, exact resume."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from llm.training.checkpoint import (
    check_data_fingerprint,
    check_resume_config,
    check_run_folder,
    checkpoint_payload,
    load_checkpoint,
    remove_checkpoints,
    resolve_checkpoint,
    save_checkpoint,
)
from llm.training.core.loading import ConfigError
from llm.training.ledger import RunLedger
from llm.training.metrics import METRICS_FILE, RunMeter
from llm.training.model import TransformerLM
from llm.training.peer_watch import PeerWatch
from llm.training.progress import FitResult, start_line, step_line, summary_line
from llm.training.prometheus import serve_training_metrics
from llm.training.resume_plan import restore_schedule
from llm.training.runtime import (
    autocast,
    gather,
    init_distributed,
    leave_process_group,
    make_deterministic,
    resolve_device,
    rng_state,
    seed_all,
    set_rng_state,
)
from llm.training.schedule import WarmupCosine, build_optimizer
from llm.training.skip_ranges import SkipRanges
from llm.training.source_metrics import tokens_by_source
from llm.training.tasks import TrainData, build_task_data
from llm.training.validation import ValidationSet, build_validation, evaluate

Callback = Callable[["Trainer", dict, float], None]


class Trainer:
    """Builds model, optimizer, schedule and task data from a TrainConfig; `fit()` trains.

    `callbacks` are called as `cb(trainer, batch, loss)` at the end of every step, after
    any checkpoint of that step was written. A fresh run (or one resumed from elsewhere)
    refuses a `checkpoint_dir` that holds another run unless `overwrite` is true; then that
    run's checkpoints are removed once this run's first checkpoint is on disk.
    """

    def __init__(
        self,
        config: Any,
        task: str,
        callbacks: Sequence[Callback] = (),
        log: Callable[[str], None] = print,
        overwrite: bool = False,
    ):
        self.config, self.task, self.callbacks = config, task, list(callbacks)
        tc = config.training
        device_hint = "cuda" if tc.device.startswith("cuda") or (tc.device == "auto" and torch.cuda.is_available()) else "cpu"
        if tc.deterministic:
            make_deterministic()
        cc = config.checkpoint
        if cc.resume_from_checkpoint:  # fail before the (maybe slow) data set-up
            resolve_checkpoint(cc.resume_from_checkpoint)
        # Checkpoints of an earlier run in checkpoint_dir that this run replaces (--overwrite).
        self._replaced = check_run_folder(cc.checkpoint_dir, cc.resume_from_checkpoint, overwrite)
        self.env = init_distributed(device_hint)
        # logging.prometheus_port, before the data: a port in use is said before anything is read
        self.prometheus = serve_training_metrics(config.logging, self.env.rank)
        self.device = resolve_device(tc.device, self.env.local_rank)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self._log = log
        self.skips = SkipRanges(config.data.skip_batches, bool(config.data.skip_documents))  # data.skip_batches, checked before the data is built
        self.data: TrainData = build_task_data(task, config, self.env.rank, self.env.world_size)
        self.tokenizer = self.data.tokenizer
        self.ledger = RunLedger(config, self.data, self.env, self.log)  # RUN_DIR/ledger/<run> (ledger.py)
        self.steps_per_epoch = self._steps_per_epoch()
        self.planned_steps = tc.epochs * self.steps_per_epoch
        if tc.max_steps is not None:
            self.planned_steps = min(self.planned_steps, tc.max_steps)

        seed_all(tc.seed)  # identical initial weights on every rank and every run
        self.raw_model = self._build_model().to(self.device)
        seed_all(tc.seed + 1 + self.env.rank)  # dropout and friends: different per rank
        self.model: torch.nn.Module = self.raw_model
        if tc.compile:
            self.model = torch.compile(self.model)
        if self.env.world_size > 1:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.model = DistributedDataParallel(self.model, device_ids=ids)
        self.optimizer = build_optimizer(self.raw_model, tc.lr, tc.weight_decay)
        self.schedule = WarmupCosine(tc.warmup_steps, self.planned_steps, tc.min_lr_ratio)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self.schedule)
        use_fp16 = self.device.type == "cuda" and tc.amp_dtype == "fp16"
        self.scaler = torch.amp.GradScaler("cuda", enabled=use_fp16)
        # a task with its own eval data (sft) gives it; else data.val_dataset_path
        self.val: ValidationSet | None = self.data.validation() or build_validation(config, self.tokenizer)

        self.step = 0
        self.epoch = 0
        self.step_in_epoch = 0
        self.cycle_epoch = 0
        self.tokens_seen = 0
        self.last_checkpoint: str | None = None
        self._batches: Any = None
        if config.checkpoint.resume_from_checkpoint:
            self.resume(config.checkpoint.resume_from_checkpoint)
        else:
            self.ledger.start(replacing=bool(self._replaced))

    def _steps_per_epoch(self) -> int:
        configured = self.config.data.steps_per_epoch
        if configured:
            return configured
        if self.data.steps_per_pass:
            return self.data.steps_per_pass
        raise ConfigError(
            f"data.steps_per_epoch is required for --task {self.task} with data_source "
            f"{self.config.data.data_source!r}; set it in the YAML or pass --steps-per-epoch"
        )

    def _build_model(self) -> TransformerLM:
        mc = self.config.model
        vocab = mc.vocab_size or self.tokenizer.vocab_size
        if vocab < self.tokenizer.vocab_size:
            raise ConfigError(
                f"model.vocab_size {vocab} is smaller than the tokenizer's vocabulary "
                f"({self.tokenizer.vocab_size}); remove it to use the tokenizer's size"
            )
        return TransformerLM(
            vocab_size=vocab,
            max_seq_len=self.config.data.max_seq_len,
            d_model=mc.d_model,
            n_layers=mc.n_layers,
            n_heads=mc.n_heads,
            d_ff=mc.d_ff,
            dropout=mc.dropout,
        )

    def log(self, message: str) -> None:
        """Print on rank 0 only, so a DDP job logs each line once."""
        if self.env.is_main:
            self._log(message)

    # ----- checkpoints --------------------------------------------------------------------

    def state_payload(self) -> dict[str, Any]:
        """Everything a resume needs; collective under DDP (gathers every rank's cursor and RNG)."""
        stream_data = self.data.checkpoint_state()
        rng_states = gather(rng_state(), self.env)
        return {
            "model_state_dict": self.raw_model.state_dict(),
            "optimizer_state_dict": self.optimizer.state_dict(),
            "scheduler_state_dict": self.scheduler.state_dict(),
            "scaler_state_dict": self.scaler.state_dict(),
            "step": self.step,
            "epoch": self.epoch,
            "step_in_epoch": self.step_in_epoch,
            "tokens_seen": self.tokens_seen,
            "cycle_start": self.schedule.cycle_start,
            "cycle_epoch": self.cycle_epoch,  # the epoch the schedule's cycle began at (a batch change counts from it)
            "total_steps": self.schedule.total,
            "stream_data": stream_data,
            "stream_source": self.data.fingerprint(),
            "skip_batches": self.skips.state(),
            "ledger": self.ledger.state(self.skips.next_batch, stream_data),
            "rng_states": rng_states,
            "world_size": self.env.world_size,
            "task": self.task,
            "config": self.config.model_dump(mode="json"),
        }

    def save(self) -> str | None:
        """Write a checkpoint of the current step (rank 0 writes; all ranks take part)."""
        cc = self.config.checkpoint
        if not cc.checkpoint_dir:
            return None
        payload = checkpoint_payload(self.state_payload, cc.checkpoint_dir, self.step)
        path = None
        if self.env.is_main:
            saved = save_checkpoint(cc.checkpoint_dir, self.step, payload, cc.keep_last_n)
            path = str(saved)
            self.log(f"saved checkpoint {path}")
            if self._replaced:  # only now: until this run has a checkpoint, the old run stays whole
                remove_checkpoints(self._replaced, keep=saved)
                self._replaced = []
            self.ledger.replaced_gone()  # with them, their ledger (and stale ones)
        if self.env.world_size > 1:
            dist.barrier()  # nobody runs ahead of a checkpoint that is not on disk yet
        self.last_checkpoint = path
        return path

    def resume(self, path: str | Path) -> None:
        """Restore model, optimizer, schedule, RNG and data cursor from a checkpoint on disk."""
        self.load_payload(load_checkpoint(path))

    def load_payload(self, ckpt: dict[str, Any]) -> None:
        """Restore from a checkpoint dict (`state_payload()` or `load_checkpoint()`'s result).

        The data fingerprint is checked first, so a changed source is refused before anything
        is overwritten.
        """
        where = ckpt.get("path", "(in memory)")
        check_data_fingerprint(ckpt.get("stream_source"), self.data.fingerprint(), where,
                               sources_may_change=self.config.data.mixture_changes == "allow")
        if ckpt.get("task", self.task) != self.task:
            raise ValueError(f"checkpoint {where} was written by --task {ckpt['task']}, not --task {self.task}")
        check_resume_config(ckpt, self.config.model_dump(mode="json"), self.env.world_size,
                            defaults=type(self.config)().model_dump(mode="json"))
        skips = self.skips.check(ckpt.get("skip_batches"), where, int(ckpt["step"]))
        try:
            self.raw_model.load_state_dict(ckpt["model_state_dict"])
        except RuntimeError as exc:
            first = str(exc).strip().splitlines()[1:2] or [str(exc)]
            raise ValueError(
                f"checkpoint {where} does not fit the model config ({first[0].strip()}); use the model: section it was trained with"
            ) from None
        self.optimizer.load_state_dict(ckpt["optimizer_state_dict"])
        self.scheduler.load_state_dict(ckpt["scheduler_state_dict"])
        self.scaler.load_state_dict(ckpt.get("scaler_state_dict", {}))
        self.ledger.resume(ckpt)  # before the data's state: the loader takes the ledger's position from it
        self.data.load_state_dict(ckpt["stream_data"])
        [self.log(line) for line in self.skips.resume_documents(ckpt["stream_data"], self.config.data.skip_documents)]
        self.skips.restore(skips)
        self._batches = None
        self.step = int(ckpt["step"])
        self.epoch = int(ckpt["epoch"])
        self.step_in_epoch = int(ckpt.get("step_in_epoch", 0))
        self.tokens_seen = int(ckpt.get("tokens_seen", 0))
        rng = ckpt.get("rng_states") or []
        if len(rng) == self.env.world_size:
            set_rng_state(rng[self.env.rank])
        else:  # another world size: no saved stream for this rank, derive a fresh one
            seed_all(self.config.training.seed + 1 + self.env.rank + self.step)
        restore_schedule(self, ckpt)  # resume_plan.py: the schedule and the line saying what it trains
        self.log(f"resumed from {where} at step {self.step} (epoch {self.epoch})")

    # ----- training -----------------------------------------------------------------------

    def _autocast(self) -> Any:
        return autocast(self.device, self.config.training.amp_dtype)

    def train_step(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """One optimizer step on one rank-local batch; returns the (unreduced) loss."""
        self.model.train()
        input_ids = batch["input_ids"].to(self.device, non_blocking=True)
        labels = batch["labels"].to(self.device, non_blocking=True)
        positions = batch.get("position_ids")
        if positions is not None:
            positions = positions.to(self.device, non_blocking=True)
        with self._autocast():
            logits, loss = self.model(input_ids, labels, positions)
        self.ledger.trained(logits, labels)  # each row's loss to the ledger (checkpoint.ledger_loss)
        self.scaler.scale(loss).backward()
        if self.config.training.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), self.config.training.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return loss.detach()

    def _mean_over_ranks(self, value: torch.Tensor) -> float:
        if self.env.world_size > 1:
            value = value.clone()
            dist.all_reduce(value)
            value /= self.env.world_size
        return float(value)

    @property
    def metrics_path(self) -> str | None:
        """`<checkpoint_dir>/metrics.jsonl`, where the run's log is recorded (None: checkpoint_dir is null)."""
        cc = self.config.checkpoint
        return str(Path(cc.checkpoint_dir) / METRICS_FILE) if cc.checkpoint_dir else None

    @property
    def total_steps(self) -> int:
        """The step at which this run stops."""
        return self.schedule.total

    def fit(self, stop_after: int | None = None) -> FitResult:
        """Train until `total_steps`, saving every `save_interval_steps` and at each epoch end.

        `stop_after` ends this call after that many steps (no extra checkpoint), e.g. to
        train in slices from a notebook; a later `fit()` continues where it stopped.
        """
        tc, cc = self.config.training, self.config.checkpoint
        start_step = self.step
        losses: list[float] = []
        val_losses: list[float] = []
        if self.step == 0:
            self.log(start_line(self))
        self.skips.dropped(self.step, self.total_steps)  # a range too long to read through: refused before reading
        if self._batches is None:  # one iterator for the whole run: loaders keep their position
            self._batches = self.skips.filter(self.data.batches(), on_skip=self.ledger.skipped)
        batches = self._batches
        meter = RunMeter(cc.checkpoint_dir, self.step, self.total_steps, self.env.is_main, lambda s: gather(s, self.env))
        # a rank stuck on its data is named by the ranks waiting for it (peer_watch.py)
        peers = PeerWatch(self.env.rank, self.env.world_size, self.config.data.watchdog_s, self._log)
        end = self.total_steps if stop_after is None else min(self.total_steps, self.step + stop_after)
        try:
            while self.step < end:
                # Data loading must not consume the training RNG: a DataLoader draws its base seed
                # from torch's global generator whenever it starts, at points that move with resumes.
                rng, waiting = torch.get_rng_state(), time.perf_counter()
                peers.waiting(self.step + 1)
                batch = next(batches)
                peers.training()
                waited, rows = time.perf_counter() - waiting, batch["input_ids"].numel()
                meter.waited(waited, rows)
                if self.prometheus is not None:
                    self.prometheus.batch(waited, rows)
                torch.set_rng_state(rng)
                loss = self.train_step(batch)
                tokens = batch["input_ids"].numel() * self.env.world_size
                self.step += 1
                self.step_in_epoch += 1
                self.tokens_seen += tokens
                meter.add_tokens(tokens)
                epoch_end = self.step_in_epoch >= self.steps_per_epoch
                if epoch_end:
                    self.epoch, self.step_in_epoch = self.epoch + 1, 0
                if self.step % tc.log_interval_steps == 0 or epoch_end or self.step == self.total_steps:
                    mean_loss = self._mean_over_ranks(loss)
                    losses.append(mean_loss)
                    stats = meter.window(self.step)
                    self.log(step_line(self, mean_loss, epoch_end, stats))
                    lr = self.scheduler.get_last_lr()[0]
                    by_source = tokens_by_source(self.data)  # a mixture's per-source counts (collective)
                    if self.prometheus is not None:
                        self.prometheus.logged(by_source)
                    meter.record(self.step, epoch=self.epoch, loss=mean_loss, lr=lr, tokens=self.tokens_seen,
                                 **{k: round(v, 4) for k, v in stats.items() if k != "eta_s"}, **by_source,
                                 **self.skips.metrics())
                if self.val is not None and (
                    epoch_end or (tc.val_interval_steps and self.step % tc.val_interval_steps == 0)
                ):
                    val = self.validate()
                    val_losses.append(val)
                    self.log(f"step {self.step} | val_loss {val:.4f}")
                    meter.record(self.step, val_loss=val)
                interval = cc.save_interval_steps and self.step % cc.save_interval_steps == 0
                if interval or epoch_end or self.step == self.total_steps:
                    self.save()
                for callback in self.callbacks:
                    callback(self, batch, float(loss))
        finally:
            peers.close()  # also when a step raises: a later fit() starts its own
        result = FitResult(self.step - start_step, self.epoch, self.tokens_seen, meter.elapsed,
                           losses, val_losses, self.last_checkpoint)
        meter.close()
        self.log(summary_line(self, result, meter.tokens))
        return result

    def validate(self) -> float:
        """Mean loss over the first `val_batches` batches of the validation set, split over ranks."""
        if self.val is None:
            raise ValueError("no validation set: set data.val_dataset_path")
        tc = self.config.training
        return evaluate(self.raw_model, self.val, tc.batch_size, tc.val_batches, self.env, self.device, self._autocast)

    def close(self) -> None:
        """Stop the data loader's workers, stop serving metrics and leave the process group this trainer joined."""
        if self.prometheus is not None:
            self.prometheus.close()
        if self._batches is not None:
            self._batches.close()  # shuts DataLoader workers down now, not at interpreter exit
            self._batches = None
        if dist.is_available() and dist.is_initialized():
            self.model = self.raw_model  # DDP holds the group: drop it so leave_process_group destroys it
            leave_process_group()
