"""Audit's rebuild of a text or SFT ledger's rows from the records as stored now: each row's checksum again.

A token row (a text stream's packed window) is its pieces' token ranges of the documents (ids, then
EOS), padded with EOS to `max_seq_len`. An SFT row is its samples (sft/ledger_audit.py makes each record a
sample again with the run's prompt format and tokenizer), padded with the pad id to the longest row of
its batch (one rank's step). Besides the checksums it names:

* a document whose last range stops short of its end (tokens never trained, unless a packer holds it);
* an SFT record whose sample is now another length than the run trained (the record changed);
* the records of the first row that no longer matches, so a changed record is named by file and record.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from llm.data.ledger.audit import SHOW, AuditReport
from llm.data.ledger.format import checksum_rule
from llm.data.ledger.reader import Ledger
from llm.data.tokenize.documents import encode_each
from llm.data.tokenize.tokenizers import load_tokenizer

Encode = Callable[[list[str]], list[Any]]


def _encoder(info: dict[str, Any], report: AuditReport, sample_rebuild: Any) -> tuple[Encode, int] | None:
    """How source `info` made its records into ids, and the id its rows are padded with; None (said why) if not."""
    stream = info.get("stream") or {}
    try:
        tokenizer = load_tokenizer(stream["tokenizer"])
    except (OSError, ValueError, KeyError) as e:
        report.unchecked.append(f"{info['name']}: its rows are not rebuilt, its tokenizer {stream.get('tokenizer')} "
                                f"cannot be loaded ({e})")
        return None
    if tokenizer.fingerprint() != stream.get("tokenizer_fingerprint"):
        report.accounted.append(f"{info['name']}: tokens not checked (the tokenizer {stream['tokenizer']} "
                                "is not the one the run used)")
        return None
    if stream.get("rows") == "tokens":
        eos = int(stream["eos_id"])
        return (lambda texts: [np.append(ids, eos) for ids in encode_each(tokenizer, texts)]), eos
    if isinstance(info.get("sft"), dict) and sample_rebuild is not None:  # sft/ledger_audit.py SampleRebuild
        try:
            rebuild = sample_rebuild(info["sft"], tokenizer)
        except (OSError, ValueError) as e:
            report.unchecked.append(f"{info['name']}: its samples are not rebuilt, its prompt format cannot be made "
                                    f"again ({e})")
            return None
        return rebuild.samples, rebuild.pad_id
    report.unchecked.append(f"{info['name']}: its SFT rows are not rebuilt (the ledger was written before it recorded "
                            "the prompt format); its counts are audited")
    return None


def verify_rows(ledger: Ledger, auditor: Any, trained: np.ndarray, flight: np.ndarray, say: Callable[[Any], str],
                report: AuditReport) -> int:
    """Rebuild every trained row whose source is read again and compare its checksum; returns the holes found."""
    names = ledger.names
    holes, changed, usable = 0, 0, {}
    docs: dict[tuple[int, str, int], Any] = {}
    for s, info in enumerate(ledger.sources):
        mine = trained[trained["source"] == s]
        if not auditor.readable(s) or not len(mine):
            continue
        made = _encoder(info, report, getattr(auditor, "sample_rebuild", None))
        if made is None:
            continue
        encode, pad = made
        stream = info.get("stream") or {}
        usable[s] = (pad, stream.get("rows"), int(stream.get("max_seq_len") or 0))
        wanted = {(names[int(n)], int(i)) for n, i in np.unique(mine[["name", "item"]]).tolist()}
        texts = auditor.documents(s, wanted)
        keys = list(texts)
        docs.update(((s, *k), ids) for k, ids in zip(keys, encode([texts[k] for k in keys])))
        if stream.get("rows") == "tokens":
            holes += _short_documents(ledger, auditor, mine, flight, docs, s, report)
        else:
            changed += _changed_samples(names, mine, docs, s, say, report)
    if changed:
        report.problems.append(f"{changed} SFT record{'s' * (changed > 1)} changed since the run (named above): the "
                               "samples made of them now differ in length from what the run trained")
    _compare(ledger, trained, docs, usable, say, report)
    return holes


def _short_documents(ledger: Ledger, auditor: Any, mine: np.ndarray, flight: np.ndarray, docs: dict, s: int,
                     report: AuditReport) -> int:
    """Documents whose last range stops before their last id (greedy's next window holds the EOS)."""
    names, holes = ledger.names, 0
    ends: dict[tuple[str, int, int], int] = {}
    held = {(names[int(n)], int(i), int(e)) for e, n, i in flight[flight["source"] == s][["epoch", "name", "item"]].tolist()}
    for p in mine:
        key = (names[int(p["name"])], int(p["item"]), int(p["epoch"]))
        ends[key] = max(ends.get(key, 0), int(p["end"]))
    for (name, item, epoch), end in ends.items():
        doc = docs.get((s, name, item))
        if doc is not None and end < len(doc) - 1 and (name, item, epoch) not in held:  # held: its tail is to come
            holes += 1
            if len(report.missing) < SHOW:
                report.missing.append(f"{ledger.sources[s]['name']} pass {epoch} {auditor.where(name, item)} tokens "
                                      f"{end}-{len(doc) - 1} never trained")
    return holes


def _changed_samples(names: list[str], mine: np.ndarray, docs: dict, s: int, say: Callable[[Any], str],
                     report: AuditReport) -> int:
    """SFT pieces (each a whole sample) whose record now makes a sample of another length."""
    found = 0
    for p in mine:
        sample = docs.get((s, names[int(p["name"])], int(p["item"])))
        now = -1 if sample is None else len(sample)
        if now != int(p["end"]) - int(p["start"]) or int(p["start"]) != 0:
            found += 1
            if found <= SHOW:
                what = "no sample (it is gone, no longer parses, or has nothing to train on)" if sample is None \
                    else f"a sample of {now} tokens"
                report.problems.append(f"{say(p)} changed since the run: it now makes {what}, the run trained "
                                       f"{int(p['end'])} tokens of it")
    return found


def _compare(ledger: Ledger, trained: np.ndarray, docs: dict, usable: dict[int, tuple[int, Any, int]],
             say: Callable[[Any], str], report: AuditReport) -> None:
    """Every row whose pieces all come from rebuilt sources, rebuilt and checksummed; the first mismatch named."""
    names = ledger.names
    by_row = trained[np.argsort(trained["row_ref"], kind="stable")]  # each row's pieces together, in their order
    rows: dict[int, np.ndarray] = {}
    samples: dict[int, np.ndarray] = {}
    blocked: set[int] = set()  # batches holding a row not rebuilt: an SFT batch's width is unknown then
    batch_of = (ledger.ranks.astype(np.int64) << 56) | (ledger.generations.astype(np.int64) << 40) | \
        ledger.rows["step"].astype(np.int64)
    empty = np.zeros(0, np.int64)
    pad_id = 0
    for row in np.split(by_row, np.flatnonzero(np.diff(by_row["row_ref"])) + 1) if len(by_row) else []:
        r, s = int(row["row_ref"][0]), int(row["source"][0])
        if s not in usable:
            blocked.add(int(batch_of[r]))
            continue
        pad, kind, width = usable[s]
        parts = [_ids(docs.get((int(p["source"]), names[int(p["name"])], int(p["item"]))))[int(p["start"]):int(p["end"])]
                 for p in row]
        held = np.concatenate(parts) if parts else empty
        if kind == "tokens":  # a window of max_seq_len, the rest EOS
            ids = np.full(width, pad, np.int64)
            ids[: len(held)] = held[: width]
            rows[r] = ids
        else:
            samples[r], pad_id = held, pad
    samples = {r: ids for r, ids in samples.items() if int(batch_of[r]) not in blocked}
    rows.update(pad_batches(samples, batch_of, pad_id))  # one tokenizer, one pad id for every source of a stream
    if not rows:
        return
    bad: list[int] = []
    by_width: dict[int, list[int]] = {}
    for r, ids in rows.items():
        by_width.setdefault(len(ids), []).append(r)
    checksum = checksum_rule(ledger.header)  # version 1 ledgers: their own rule
    for group in by_width.values():  # the checksum of many rows of one width at once
        crcs = checksum(np.stack([rows[r] for r in group]))
        bad += [r for r, c in zip(group, crcs.tolist()) if int(c) != int(ledger.rows["crc"][r])]
    bad.sort()
    if bad:
        r = bad[0]
        held = trained[trained["row_ref"] == r]
        records = ", ".join(say(p) for p in held[:SHOW]) + (", ..." if len(held) > SHOW else "")
        report.problems.append(f"{len(bad)} of {len(rows)} trained rows no longer match the files on disk (first: "
                               f"step {int(ledger.rows['step'][r])} row {int(ledger.rows['row'][r])}, holding "
                               f"{records}); the data changed since the run")


def _ids(doc: Any) -> np.ndarray:
    """A rebuilt document's ids; none when it is gone or makes no sample (its row then cannot match)."""
    return np.zeros(0, np.int64) if doc is None else np.asarray(doc, np.int64)

def pad_batches(rows: dict[int, np.ndarray], batch_of: np.ndarray, pad_id: int) -> dict[int, np.ndarray]:
    """Each row padded with `pad_id` to the longest row of its batch (`batch_of`: per ledger row, its batch key)."""
    width: dict[int, int] = {}
    for r, ids in rows.items():
        width[int(batch_of[r])] = max(width.get(int(batch_of[r]), 0), len(ids))
    out = {}
    for r, ids in rows.items():
        row = np.full(width[int(batch_of[r])], pad_id, np.int64)
        row[: len(ids)] = ids
        out[r] = row
    return out
