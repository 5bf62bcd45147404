"""Atomic checkpoints: `<dir>/step_<N>/`, a `latest` pointer file, `keep_last_n` pruning."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from llm.data.inputs.dedup import publish_seen_hashes
from llm.data.inputs.source import FINGERPRINT_MISMATCH, fingerprint_diff
from llm.data.storage.local import fsync_dir, write_file
from llm.training.core.loading import ConfigError

CHECKPOINT_FILE = "checkpoint.pt"
META_FILE = "meta.json"
LATEST = "latest"
_STEP_DIR = re.compile(r"^step_(\d+)$")
_TMP_PREFIX = ".tmp-"


def _json_default(value: Any) -> Any:
    return value.tolist() if hasattr(value, "tolist") else str(value)


def list_checkpoints(checkpoint_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete `step_<N>` folders under `checkpoint_dir`, oldest first."""
    root = Path(checkpoint_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and (child / CHECKPOINT_FILE).is_file():
            found.append((int(match.group(1)), child))
    return sorted(found)


def unwritable(root: Path, name: str, e: OSError) -> OSError:
    """The one sentence for a checkpoint that could not be written (disk full, quota, read-only)."""
    previous = run_step(root)
    kept = f"the previous checkpoint step_{previous} is intact" if previous is not None else "no earlier checkpoint exists"
    error = OSError(f"cannot write checkpoint {root / name} ({e.strerror or e}); {kept}: free space in {root} and resume")
    error.errno = e.errno
    return error


def checkpoint_payload(make: Any, checkpoint_dir: str | Path, step: int) -> dict[str, Any]:
    """`make()`'s payload; its own writes (the ledger's segment, before the checkpoint) failing is this save failing."""
    try:
        return make()
    except OSError as e:
        raise unwritable(Path(checkpoint_dir), f"step_{step}", e) from e


def save_checkpoint(
    checkpoint_dir: str | Path, step: int, payload: dict[str, Any], keep_last_n: int | None = None
) -> Path:
    """Write `payload` to `<checkpoint_dir>/step_<step>` atomically, point `latest` at it, prune.

    The folder is built under a temporary name and renamed into place, and `latest` is
    replaced only after that, so a crash (even kill -9) at any moment leaves the previous
    checkpoint and pointer intact. Only then are the dedup digests the data state carries
    appended to the seen-hashes file: a digest counts once its checkpoint exists (a crash
    before leaves the file as it was; one after is finished when the checkpoint is resumed).
    """
    root = Path(checkpoint_dir)
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(f"{_TMP_PREFIX}*"):  # leftovers of a save that was killed
        shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink(missing_ok=True)
    name = f"step_{step}"
    tmp = root / f"{_TMP_PREFIX}{name}-{os.getpid()}"
    try:
        tmp.mkdir()
        _write_payload(tmp / CHECKPOINT_FILE, payload)
        # the ledger and config too: `llm-train audit/why/spikes` read them without loading the weights
        meta = {k: payload.get(k) for k in ("step", "epoch", "stream_source", "world_size", "task", "ledger", "config")}
        write_file(tmp / META_FILE, json.dumps(meta, indent=2, default=_json_default).encode())
        fsync_dir(tmp)
    except OSError as e:  # disk full, quota, read-only: this save is dropped whole, the last one stays
        shutil.rmtree(tmp, ignore_errors=True)
        raise unwritable(root, name, e) from e
    final = root / name
    if final.exists():  # re-saving a step: move the old copy aside, never delete it first
        old = root / f"{_TMP_PREFIX}old-{name}-{os.getpid()}"
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    pointer = root / f"{_TMP_PREFIX}{LATEST}-{os.getpid()}"
    write_file(pointer, f"{name}\n".encode())
    os.replace(pointer, root / LATEST)
    fsync_dir(root)
    publish_seen_hashes(payload.get("stream_data"))
    if keep_last_n:
        _prune(root, keep_last_n, keep=final)
    return final


class _FdWriter:
    """What torch.save writes to: every byte through os.write in a loop, so a full disk raises ENOSPC here."""

    def __init__(self, fd: int):
        self.fd = fd
        self.error: OSError | None = None

    def write(self, data: bytes) -> int:
        view = memoryview(data).cast("B")
        try:
            while view:
                view = view[os.write(self.fd, view) :]
        except OSError as e:
            self.error = e  # torch's zip writer re-raises it as a RuntimeError about positions
            raise
        return len(data)

    def flush(self) -> None:
        pass


def _write_payload(path: Path, payload: dict[str, Any]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    writer = _FdWriter(fd)
    try:
        torch.save(payload, writer)  # type: ignore[arg-type]
        os.fsync(fd)
    except Exception:
        if writer.error is not None:
            raise writer.error from None
        raise
    finally:
        os.close(fd)


# Keys that may change when a run is resumed: how long it runs, what it logs and
# validates, where it saves, how one machine reads (topology), and the batch size (every
# data state counts samples and tokens, never steps: docs/training.md); every other key
# changes the run and is refused.
RESUMABLE_KEYS = (
    "training.epochs", "training.max_steps", "training.log_interval_steps", "training.val_interval_steps",
    "training.val_batches", "training.device", "training.compile", "training.batch_size", "data.num_workers",
    "data.val_dataset_path", "data.cache_dir", "data.skip_batches",  # skip ranges: checked by skip_ranges.py
    "data.skip_documents",  # a union with the checkpoint's: the data state keeps them (skip_documents.py)
    "data.streaming_mixing_schedule",  # for steps not trained yet: the data state refuses a change to the past
    "data.mixture_changes", "data.watchdog_s", "data.watchdog",  # the data watchdog only reports
    "logging.prometheus_port", "logging.prometheus_host",  # where the figures are served, not what is trained
)
# With `data.mixture_changes: allow`, a mixture's sources and their weights may change too: the data
# state matches sources by name and fingerprint and refuses an ambiguous change (text/changes.py).
MIXTURE_KEYS = ("data.datasets", "data.streaming_mixing_weights", "data.streaming_buffer_per_dataset")


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(tree, dict):
        return {prefix.rstrip("."): tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(_flat(value, f"{prefix}{key}."))
    return out


def config_changes(saved: dict[str, Any], current: dict[str, Any], saved_world: Any, world: int,
                   defaults: dict[str, Any] | None = None) -> list[str]:
    """The config keys that differ from a checkpoint's, as `key: saved -> current`, minus RESUMABLE_KEYS.

    A key the checkpoint lacks was added to the config after it was written: it ran with the key's
    default, so only a value other than `defaults`' is a change.
    """
    a, b, d = _flat(saved), _flat(current), _flat(defaults or {})
    mixture_may_change = b.get("data.mixture_changes") == "allow"
    changes = []
    for key in sorted(set(a) | set(b)):
        if key in RESUMABLE_KEYS or key.startswith("checkpoint.") or (mixture_may_change and key in MIXTURE_KEYS):
            continue
        if key not in a and key in d and b.get(key) == d[key]:
            continue
        if a.get(key) != b.get(key):
            changes.append(f"{key}: {a.get(key, '(absent)')!r} -> {b.get(key, '(absent)')!r}")
    return changes


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


_SOURCE_KEYS = ("sources", "deduplicated", "type")  # what a mixture's list of sources changes in its fingerprint


def _differs(expected: Any, actual: Any) -> str:
    return "; ".join(fingerprint_diff(json.loads(_canonical(expected)), json.loads(_canonical(actual))))


def check_data_fingerprint(expected: Any, actual: Any, where: str, sources_may_change: bool = False) -> None:
    """Refuse a checkpoint written for other data, naming only the keys that differ (`max_seq_len: 128 -> 64`).

    A mixture's list of sources may change with `sources_may_change` (`data.mixture_changes: allow`): the
    data state then matches them by name and fingerprint. Without it, such a change names that option."""
    if any(isinstance(fp, dict) and "sources" in fp for fp in (expected, actual)):
        rest = [{k: v for k, v in fp.items() if k not in _SOURCE_KEYS} if isinstance(fp, dict) else fp
                for fp in (expected, actual)]
        if _canonical(rest[0]) == _canonical(rest[1]):  # nothing differs but the sources
            if sources_may_change or _canonical(expected) == _canonical(actual):
                return
            raise ValueError(
                f"{FINGERPRINT_MISMATCH}: checkpoint {where} was trained on another list of sources "
                f"({_differs(expected, actual)}); set data.mixture_changes: allow to add or remove a mixture's "
                "sources on resume, or resume with the sources it was trained on"
            )
        expected, actual = rest  # name the other keys that differ
    if _canonical(expected) != _canonical(actual):
        raise ValueError(
            f"{FINGERPRINT_MISMATCH}: checkpoint {where} was written for other data: {_differs(expected, actual)} "
            "(checkpoint -> this config); resume with the data config it was trained on"
        )


def check_resume_config(ckpt: dict[str, Any], current: dict[str, Any], world: int,
                        defaults: dict[str, Any] | None = None) -> None:
    """Refuse to resume a checkpoint under a config that changes the run (one sentence naming the keys).

    `defaults`: the config's defaults, for keys newer than the checkpoint (see `config_changes`)."""
    saved = ckpt.get("config")
    if not isinstance(saved, dict):  # written before checkpoints stored their config
        return
    changes = config_changes(saved, current, ckpt.get("world_size"), world, defaults)
    if changes:
        raise ConfigError(
            f"checkpoint {ckpt.get('path', '(in memory)')} was trained with another config: {'; '.join(changes)} "
            "(checkpoint -> this config); resume with the config it was saved with (only epochs, max_steps, batch_size, "
            "logging, validation, device, compile, num_workers, checkpoint settings and, with data.mixture_changes: "
            "allow, a mixture's datasets may change), or start a fresh run"
        )


def _prune(root: Path, keep_last_n: int, keep: Path) -> None:
    checkpoints = list_checkpoints(root)
    oldest = checkpoints[: max(0, len(checkpoints) - keep_last_n)]
    remove_checkpoints([path for _, path in oldest], keep)


def run_step(checkpoint_dir: str | Path) -> int | None:
    """The step of the run `checkpoint_dir` holds (its `latest`, else its newest step_<N>); None if none."""
    root = Path(checkpoint_dir)
    try:
        match = _STEP_DIR.match((root / LATEST).read_text(encoding="utf-8", errors="replace").strip())
    except OSError:
        match = None
    if match:
        return int(match.group(1))
    found = list_checkpoints(root)
    return found[-1][0] if found else None


def check_run_folder(checkpoint_dir: str | Path | None, resume_from: str | Path | None, overwrite: bool) -> list[Path]:
    """Refuse to start a run over another one in `checkpoint_dir`; the folders it may replace.

    Resuming from a checkpoint inside `checkpoint_dir` continues that run. A fresh run, or
    one resumed from elsewhere, would move `latest` and overwrite the other run's step_<N>:
    that is a ConfigError unless `overwrite`, in which case the other run's checkpoints are
    returned, for the caller to remove once its own first checkpoint is written.
    """
    if not checkpoint_dir:
        return []
    step = run_step(checkpoint_dir)
    if step is None:
        return []
    if resume_from and resolve_checkpoint(resume_from).resolve().parent == Path(checkpoint_dir).resolve():
        return []
    if not overwrite:
        raise ConfigError(
            f"checkpoint.checkpoint_dir {checkpoint_dir} already holds a run at step {step}; resume it with "
            f"checkpoint.resume_from_checkpoint: {Path(checkpoint_dir) / LATEST}, pass --overwrite to replace it, "
            "or choose another checkpoint_dir"
        )
    return [path for _, path in list_checkpoints(checkpoint_dir)]


def remove_checkpoints(paths: list[Path], keep: Path) -> None:
    """Delete these step_<N> folders, except `keep` (a step the new run has just re-saved)."""
    for path in paths:
        if path.resolve() != keep.resolve():
            shutil.rmtree(path, ignore_errors=True)


def resolve_checkpoint(path: str | Path, setting: str = "checkpoint.resume_from_checkpoint") -> Path:
    """The `step_<N>` folder that `path` names: a step folder, a `latest` file, or a checkpoint_dir.

    `setting` is what the user set `path` with, named in the error (llm-generate: `--checkpoint`).
    """
    p = Path(path)
    if p.is_dir() and (p / CHECKPOINT_FILE).is_file():
        return p
    if p.is_dir() and (p / LATEST).is_file():
        p = p / LATEST
    # a run killed after its step_<N> was renamed into place but before `latest` was written: its newest step
    folder = p if p.is_dir() else p.parent if p.name == LATEST and not p.exists() else None
    newest = list_checkpoints(folder) if folder is not None else []
    if newest:
        return newest[-1][1]
    if p.is_file() and p.name == CHECKPOINT_FILE:
        return p.parent
    if p.is_file():
        target = p.read_text(encoding="utf-8", errors="replace").strip()
        resolved = p.parent / target
        if not _STEP_DIR.match(target) or not (resolved / CHECKPOINT_FILE).is_file():
            raise FileNotFoundError(
                f"checkpoint pointer {p} names {target!r}, which is not a complete step_<N> "
                f"checkpoint in {p.parent}; point {setting} at an existing step_<N> folder"
            )
        return resolved
    if p.is_dir():
        raise FileNotFoundError(
            f"checkpoint folder {p} holds no checkpoint (no {CHECKPOINT_FILE}, no `{LATEST}` file); set {setting} "
            "to a step_<N> folder, its `latest` file, or a checkpoint_dir holding one"
        )
    raise FileNotFoundError(
        f"checkpoint {p} does not exist; set {setting} to a step_<N> "
        "folder, its `latest` file, or a checkpoint_dir holding one"
    )


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint written by `save_checkpoint` (follows `latest`).

    The dict holds `model_state_dict`, `optimizer_state_dict`, `scheduler_state_dict`,
    `step`, `epoch`, `stream_data`, `stream_source`, `rng_states` and the run's config,
    plus `path`: the step folder it was read from.
    """
    folder = resolve_checkpoint(path)
    try:
        # weights_only=False: stream cursors may carry numpy scalars; checkpoints are our own files.
        payload = torch.load(folder / CHECKPOINT_FILE, map_location=map_location, weights_only=False)
    except Exception as exc:  # any unreadable file is the same user-facing problem
        raise ValueError(f"checkpoint file {folder / CHECKPOINT_FILE} cannot be read ({exc})") from exc
    if not isinstance(payload, dict) or "model_state_dict" not in payload:
        raise ValueError(f"checkpoint file {folder / CHECKPOINT_FILE} is not a checkpoint written by llm-train")
    payload["path"] = str(folder)
    return payload
