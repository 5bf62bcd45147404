"""`llm-train audit|why|spikes RUN_DIR`: prove and explain a run from its ledger (run_audit.py, ledger_why.py)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from llm.data.ledger.format import LedgerError
from llm.training.cli_help import HelpFormatter
from llm.training.ledger_why import spikes, why
from llm.training.run_audit import open_run, run_audit

COMMANDS = ("audit", "why", "spikes")
EPILOG = """examples:
  llm-train audit runs/a                 # every sample exactly once? exit 0 only then
  llm-train why runs/a --step 120        # each row of step 120: source, shard or file, documents, text, loss
  llm-train spikes runs/a --top 5        # the steps whose loss jumps most above its moving median

RUN_DIR is the run's checkpoint.checkpoint_dir: the ledger is the one its latest checkpoint names
(RUN_DIR/ledger/<run>). docs/proving-a-run.md walks through a run."""


def at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least `low` (a --top of -3 printed "no spike" instead of an error)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is below {low}")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llm-train", description="prove and explain a run from its ledger",
                                     epilog=EPILOG, formatter_class=HelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser("audit", help="count every sample the run trained on; exit 0 only when each was trained once")
    cmd.add_argument("run_dir", metavar="RUN_DIR")
    cmd.add_argument("--no-verify", action="store_true", help="do not re-read the data to compare checksums")
    cmd = sub.add_parser("why", help="what one step trained on: each row's source, documents, text and loss")
    cmd.add_argument("run_dir", metavar="RUN_DIR")
    cmd.add_argument("--step", type=int, required=True, help="the training step (as the log counts it)")
    cmd.add_argument("--rank", type=int, help="only this rank's rows (default: every rank)")
    cmd.add_argument("--preview", type=at_least(0), default=80, help="characters of decoded text per document (0: none)")
    cmd = sub.add_parser("spikes", help="the steps whose loss jumps most above its moving median, with their documents")
    cmd.add_argument("run_dir", metavar="RUN_DIR")
    cmd.add_argument("--top", type=at_least(1), default=5, help="how many steps (default 5)")
    # the median needs 3 steps before a step (ledger_why.py): a smaller window never finds a spike
    cmd.add_argument("--window", type=at_least(3), default=20, help="steps in the moving median (default 20, at least 3)")
    cmd.add_argument("--preview", type=at_least(0), default=60, help="characters of decoded text per document (0: none)")
    return parser


def main(argv: list[str]) -> int:
    """`llm-train audit|why|spikes ...`; a bad input is one line on stderr (exit 2)."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "audit":
            report, view = run_audit(args.run_dir, verify=not args.no_verify)
            print(f"ledger: {view.ledger.folder} (checkpoint {view.checkpoint})")
            if view.past:
                print(f"note: {view.past}")
            for line in report.lines():
                print(line)
            return 0 if report.ok else 1
        view = open_run(args.run_dir)
        lines = (why(view, args.step, args.rank, args.preview) if args.command == "why"
                 else spikes(view, args.top, args.window, args.preview))
        for line in lines:
            print(line)
        return 0
    except (LedgerError, ValueError, OSError) as exc:
        print(f"llm-train {args.command}: error: {exc}", file=sys.stderr)
        return 2
