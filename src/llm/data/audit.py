"""`audit_ledger`: a ledger audited by the wing that wrote it (shards, or text and SFT), one call for every CLI."""

from __future__ import annotations

from llm.data.ledger.audit import AuditReport, audit
from llm.data.ledger.format import checksum_rule
from llm.data.ledger.reader import Ledger
from llm.data.sft.holdout import redraw_held_out
from llm.data.sft.ledger_audit import SampleRebuild
from llm.data.shards.read.ledger_audit import ShardAuditor
from llm.data.text.ledger_audit import TextAuditor, audit_text


def audit_ledger(ledger: Ledger, verify: bool = True, weights: list[float] | None = None) -> AuditReport:
    """Text and SFT ledgers re-read their files; shard ledgers rebuild each source's order and bytes.

    `verify`: compare the rows with the data as stored now; `weights`: a mixture's configured weights, for the
    shard audit's shares (a text ledger's header carries its own)."""
    if any(s.get("type") == "text" for s in ledger.sources):
        auditor = TextAuditor(ledger.sources, read=verify, sample_rebuild=SampleRebuild, held_out=redraw_held_out)
        return audit_text(ledger, auditor)
    shards = ShardAuditor(ledger.sources, checksum_rule(ledger.header))  # a version 1 ledger: its own rule
    report = audit(ledger, expected_items=shards.expected_items, verify=shards.verify if verify else None,
                   weights=weights)
    report.problems += shards.problems
    return report
