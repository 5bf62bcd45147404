"""`llm-data audit LEDGER`: every sample a run trained on, counted from its ledger and checked against the data."""

from __future__ import annotations

import argparse
from typing import Any

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


def run_audit(args: argparse.Namespace) -> int:
    from llm.data.audit import audit_ledger
    from llm.data.ledger.reader import read_ledger

    report = audit_ledger(read_ledger(args.ledger), verify=not args.no_verify)
    for line in report.lines():
        print(line)
    return 0 if report.ok else 1
