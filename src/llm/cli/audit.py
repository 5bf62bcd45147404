"""`llm-data audit LEDGER`: every sample a run trained on, counted from its ledger and checked against the data."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from llm.data.ledger.format import HEADER_NAME, LedgerError

AUDIT_EPILOG = """examples:
  llm-data audit runs/x/ledger          # the folder given to StreamingDataLoader(..., ledger=...)

Counts each sample's appearances per epoch and source from what the workers read, checks the
tokens against the data as stored now, and names what was repeated, lost or changed. For a text
or SFT stream (StreamingTextDataModule(..., ledger=...)): each record's token ranges trained once,
records missing from a pass (the files are read again), dedup drops accounted for. Exits 0
only when every sample was trained exactly once. docs/proving-a-run.md"""


def add_audit_command(add: Any) -> None:
    """Register `audit` with the `add(name, help, epilog)` of cli/data.py."""
    cmd = add("audit", "prove a run trained on every sample exactly once, from its ledger", AUDIT_EPILOG)
    cmd.add_argument("ledger", metavar="LEDGER", help="the ledger folder a run wrote")
    cmd.add_argument("--no-verify", action="store_true", help="do not re-read the data to compare checksums")


def check_ledger_folder(folder: Path) -> None:
    """A path that is no ledger folder, named for what it is: missing, an llm-train run or checkpoint, the
    `ledger` folder above a run's ledgers (a folder that holds no ledger at all is read_ledger's to name)."""
    if not folder.exists():
        raise LedgerError(f"ledger folder {folder} does not exist; pass the folder given to ledger=")
    if not folder.is_dir() or (folder / HEADER_NAME).exists():
        return
    if any((folder / name).exists() for name in ("latest", "checkpoint.pt", "meta.json")) or any(folder.glob("step_*")):
        raise LedgerError(f"{folder} is an llm-train run or checkpoint folder, not a ledger; audit it with "
                          f"`llm-train audit {folder}`")
    runs = sorted(p.name for p in folder.iterdir() if (p / HEADER_NAME).is_file())
    if runs:
        raise LedgerError(f"{folder} holds the ledgers of runs {', '.join(runs)}, not one ledger; pass one of them "
                          f"({folder / runs[-1]}), or audit the run with `llm-train audit RUN_DIR`")


def run_audit(args: argparse.Namespace) -> int:
    from llm.data.audit import audit_ledger
    from llm.data.ledger.reader import read_ledger

    check_ledger_folder(Path(args.ledger))
    report = audit_ledger(read_ledger(args.ledger), verify=not args.no_verify)
    for line in report.lines():
        print(line)
    return 0 if report.ok else 1
