"""A run's ledger, found from the checkpoint the run stands on, and `llm-train audit`'s report of it.

RUN_DIR is a run's `checkpoint.checkpoint_dir` (or one of its `step_<N>` folders). The latest
checkpoint names its ledger (`meta.json`: `ledger: {folder, run, step}`, `config`), so these
commands read only the ledger, the checkpoint's config and the data on disk, never the weights.
Steps a killed run committed to the ledger past its last checkpoint are not counted (a resume drops
them). `llm-data audit LEDGER` audits a ledger folder that a user's own loop wrote.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from llm.data.audit import audit_ledger
from llm.data.ledger.audit import AuditReport
from llm.data.ledger.format import LedgerError
from llm.data.ledger.reader import Ledger, read_ledger
from llm.training.checkpoint import META_FILE, list_checkpoints, load_checkpoint, resolve_checkpoint
from llm.training.ledger import ledger_folder


@dataclasses.dataclass
class RunView:
    """What the commands read: the checkpoint the run stands on, its config, and its ledger (cut at it)."""

    checkpoint: Path
    config: dict[str, Any]
    ledger: Ledger
    past: str | None  # a note on steps committed past the checkpoint, not counted


def _meta(step_folder: Path) -> dict[str, Any]:
    """meta.json, or the checkpoint itself for one written before meta.json carried the ledger and config."""
    try:
        meta = json.loads((step_folder / META_FILE).read_text())
    except (OSError, ValueError):
        meta = {}
    if "config" not in meta:
        meta = load_checkpoint(step_folder)
    return meta


def open_run(run_dir: str | Path) -> RunView:
    """The ledger of the run RUN_DIR's latest checkpoint stands on; ValueError (one sentence) when there is none."""
    if not Path(run_dir).is_dir():
        raise ValueError(f"RUN_DIR {run_dir} is not a folder; pass the run's checkpoint.checkpoint_dir")
    step_folder = resolve_checkpoint(run_dir, setting="RUN_DIR")
    meta = _meta(step_folder)
    named = meta.get("ledger")
    if not isinstance(named, dict) or not isinstance(named.get("run"), str):
        raise ValueError(f"checkpoint {step_folder} has no run ledger (checkpoint.ledger was off, the task writes "
                         "none yet, or an llm before ledgers wrote it); nothing to audit")
    tip = named.get("generation")  # the chain of resumes this checkpoint stands on, not a branch made elsewhere
    ledger = read_ledger(ledger_folder(named, step_folder), run=named["run"], tip=tip if isinstance(tip, int) else None)
    _check_dataset(ledger, meta.get("stream_source"), step_folder)
    ledger, past = _cut(ledger, named.get("step"))
    lost = _lost_to_kills(ledger, step_folder.parent)
    if lost:
        past = "; ".join(filter(None, [past, lost]))
    return RunView(step_folder, meta.get("config") or {}, ledger, past)


def _lost_to_kills(ledger: Ledger, run_dir: Path) -> str | None:
    """Abandoned steps of generations no checkpoint of this run folder stands on: a resumed run killed before
    its first checkpoint, or a branch resumed from one of its checkpoints into another folder; set apart
    with a note, not named as a fault (a resume from an older checkpoint here, over steps that checkpoints
    here stand on, stays one)."""
    standing = set()
    for _, folder in list_checkpoints(run_dir):
        try:
            named = json.loads((folder / META_FILE).read_text()).get("ledger") or {}
        except (OSError, ValueError):
            return None  # a checkpoint we cannot read might stand on any generation: keep them all named
        standing.add(named.get("generation"))
    if None in standing:
        return None
    lost = [a for a in ledger.abandoned if a[1] not in standing]
    if not lost:
        return None
    ledger.abandoned[:] = [a for a in ledger.abandoned if a[1] in standing]
    return "; ".join(f"rank {r} generation {g} steps {a}-{b} were trained on a branch the latest checkpoint does "
                     "not stand on (a resume from an earlier checkpoint, a run stopped before its first checkpoint "
                     "landed here, or one resumed into another folder), and are not counted" for r, g, a, b in lost)


def _check_dataset(ledger: Ledger, trained_on: Any, step_folder: Path) -> None:
    """A ledger whose sources are not the data the checkpoint trained on belongs to another dataset."""
    fingerprint = trained_on.get("fingerprint") if isinstance(trained_on, dict) else None
    if not isinstance(fingerprint, str) or not ledger.sources:
        return  # a text run names its data by content, a mixture by its sources: audit checks each source
    if all(s.get("fingerprint") != fingerprint for s in ledger.sources):
        found = ", ".join(f"{s.get('name')} ({str(s.get('fingerprint'))[:12]})" for s in ledger.sources)
        raise LedgerError(f"ledger {ledger.folder} was written for dataset {found}, but checkpoint {step_folder} "
                          f"trained on dataset {fingerprint[:12]}; pass the run folder whose ledger this is")


def _cut(ledger: Ledger, step: Any) -> tuple[Ledger, str | None]:
    """The ledger up to the checkpoint's step: a killed run's steps past it are dropped by a resume, not counted."""
    if not isinstance(step, int) or not len(ledger.rows):
        return ledger, None
    last = ledger.generations.max()
    past = (ledger.generations == last) & (ledger.rows["step"] > step)
    if not past.any():
        return ledger, None
    keep = ~past
    remap = np.cumsum(keep) - 1
    pieces = ledger.pieces[keep[ledger.pieces["row_ref"]]]
    pieces["row_ref"] = remap[pieces["row_ref"]]
    steps = ledger.rows["step"][past]
    note = (f"steps {int(steps.min())}-{int(steps.max())} were committed after the latest checkpoint (batch {step}) "
            "and are not counted: the run was stopped before that checkpoint landed, and a resume drops them")
    skipped = ledger.skipped[keep] if len(ledger.skipped) == len(keep) else ledger.skipped
    return dataclasses.replace(ledger, rows=ledger.rows[keep], ranks=ledger.ranks[keep],
                               generations=ledger.generations[keep], pieces=pieces, skipped=skipped), note


def weights_of(config: dict[str, Any], n_sources: int) -> list[float] | None:
    """A mixture's configured weights, normalised (None: one source, or weights that are not a plain list)."""
    weights = (config.get("data") or {}).get("streaming_mixing_weights")
    if n_sources < 2 or not isinstance(weights, list) or len(weights) != n_sources:
        return None
    total = float(sum(weights))
    return [float(w) / total for w in weights] if total > 0 else None


def run_audit(run_dir: str | Path, verify: bool = True) -> tuple[AuditReport, RunView]:
    view = open_run(run_dir)
    report = audit_ledger(view.ledger, verify, weights_of(view.config, len(view.ledger.sources)))
    return report, view
