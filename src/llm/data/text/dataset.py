"""The worker side of a text stream: one consumer's partitions -> records -> tokens -> packed batches.

Topology: the source's partitions are fixed; consumer `rank * W + worker` (W =
DataLoader workers, at least 1) owns its share (`partitions.assign_partitions`).
Every batch a worker yields carries the cursors of the partitions it touched;
the main-process loader (`stream.py`) applies them only when it hands the batch
over, so its state is exact whatever the prefetching. Workers never end before
the loader stops them (a finished worker sends "done" markers), so the
DataLoader serves them strictly in turn.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import replace
from functools import partial
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info

from llm.data.inputs.dedup import DedupTextSource
from llm.data.inputs.mixture import as_mixture
from llm.data.inputs.partitions import assign_partitions, stripe_partitions
from llm.data.inputs.source import Partition, Record, TextSource
from llm.data.mix.choosers import choose
from llm.data.pack.window import WindowCutter
from llm.data.text.blocks import TokenBlocks, chunk_windows
from llm.data.text.provenance import pieces_array, record_name, track
from llm.data.text.ring import MessageRing
from llm.data.text.skips import Skips, skip_record
from llm.data.text.wire import grouped, one_message
from llm.data.tokenize.protocol import Tokenizer
from llm.data.topology import current_topology
from llm.data.waiting import mark_reading
from llm.data.worker_errors import send


def _done(worker: int) -> dict:
    """The marker a worker sends once its partitions are read (and until the loader stops it)."""
    return {"worker": worker, "done": True, "cursors": {}, "digests": b"", "counts": {}}


class StreamingTextDataset(IterableDataset):
    """Batches `{"input_ids", "labels", "_state"}` from the partitions this rank/worker owns.

    `labels` are shifted (`labels[i]` is the token after `input_ids[i]`); padding
    in the last block of a partition has label -100. `_state` carries the
    cursors and is consumed by `StreamingTextDataModule`'s loader. With
    `packed=True` a batch travels as one byte string (`_windows`: the windows, or
    `_packed`: int32 planes), which pickles through DataLoader workers faster than tensors.
    `batch_format` replaces the packing into blocks (fine-tuning samples).
    """

    def __init__(
        self,
        source: TextSource,
        tokenizer: Tokenizer,
        max_seq_len: int,
        batch_size: int = 1,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        cursors: dict[str, dict] | None = None,
        worker_rotation: int = 0,
        chunk_records: int = 64,
        chunk_chars: int = 1 << 20,
        packed: bool = False,
        batch_format: Any = None,
        mix_seed: int = 0,
        mix_weights: list[float] | None = None,
        mix_anchors: dict[str, list[int]] | None = None,
        packing_buffer: int | None = None,
        ledger: bool = False,
        skips: Skips | None = None,
        group: int = 1,
    ):
        self.source = source
        self.tokenizer = tokenizer
        self.max_seq_len = max_seq_len
        self.batch_size = batch_size
        self.rank, self.world_size = rank, world_size
        self.cursors = dict(cursors or {})
        self.worker_rotation = worker_rotation
        self.chunk_records, self.chunk_chars = chunk_records, chunk_chars
        self.packed = packed
        self.format = batch_format or TokenBlocks(tokenizer, max_seq_len, packed, packing_buffer)
        self.mix_seed = mix_seed  # a `random` mixture's draws: the module derives it from the root seed
        self._consumer = 0  # rank * workers + worker, set when iterating: seeds a random mixture's draws
        # a schedule's weights at this step (None: the mixture's), and the partitions' (records, tokens)
        # at the schedule's last change point: each segment's shares count from there
        self.mix_weights = mix_weights
        self.mix_anchors = dict(mix_anchors or {})
        self.ledger = ledger  # batches carry what each row holds (text/provenance.py) for the run ledger
        self.skips = dict(skips or {})  # records dropped by id (text/skips.py): (source, file) -> records
        # in a DataLoader worker, `group` > 0: items go out `group` at a time, one `{"_group": [...]}` per
        # message (wire.grouped); the pipe's cost is per message, and `wire.ungrouped` restores the order.
        # 0: one item a message, packed windows each as their own bytes (`_windows`)
        self.group = group
        # shared slots for the grouped messages' windows (text/ring.py), set by `text_loader` before its workers fork
        self.ring: MessageRing | None = None

    def __iter__(self) -> Iterator[dict]:
        items = self._items()
        seal = getattr(self.format, "seal", None)
        info = get_worker_info()
        if self.group > 0 and info is not None:
            if seal is not None and self.ring is not None:  # this worker writes its windows into its own slots
                seal = partial(seal, ring=self.ring.writer(info.id))
            return grouped(items, self.group, seal)
        return (one_message(seal, item) for item in items) if seal is not None else items

    def _items(self) -> Iterator[dict]:
        rank, world = current_topology(self.rank, self.world_size)
        info = get_worker_info()
        n_workers = info.num_workers if info else 1
        worker = ((info.id if info else 0) + self.worker_rotation) % n_workers
        self.source.begin()
        if self.ledger and isinstance(self.source, DedupTextSource):
            self.source.report_drops = True  # dropped duplicates come as events: the ledger accounts for them
        self._consumer = rank * n_workers + worker  # seeds a random mixture's draws
        parts = assign_partitions(
            stripe_partitions(self.source.partitions()), self._consumer, world * n_workers
        )
        try:
            yield from self._batches(parts, worker)
        except GeneratorExit:  # closed; matched first: at interpreter exit this module's globals may be None
            raise
        except Exception as e:
            # the DataLoader would wrap it in a worker traceback: send the error itself (worker_errors.py)
            sent = send(e, f"text DataLoader worker process {info.id}") if info is not None else None
            if sent is None:
                raise
            yield {"_state": {**_done(worker), "error": sent}}
        while info is not None:  # keep the DataLoader's round robin intact until it stops us
            yield {"_state": _done(worker)}

    def _batches(self, parts: list[Partition], worker: int) -> Iterator[dict]:
        fmt = self.format
        rows_tokens = getattr(fmt, "rows_tokens", None)  # a batch's trained tokens in one call (TokenBlocks)
        rows: list[Any] = []
        row_sources: list[int] = []  # the source of each row: the per-source accounting
        held: list[Any] = []  # with a ledger: what each row holds (text/provenance.py)
        dropped: list[Any] = []  # and the records read that make no row, once the cursor has passed them
        touched: dict[str, tuple[Any, deque]] = {}

        def state(done: bool) -> dict:
            cursors, digests = {}, []
            for key, (packer, queue) in touched.items():
                # a plain window cutter's buffer goes as an array (pack/window.py); the main process lists it
                cursor = packer.wire_cursor() if type(packer) is WindowCutter else packer.cursor()
                cursors[key] = cursor
                if self.ledger:  # drops the cursor went past go with this state: exactly once across resumes
                    dropped.extend(packer.released(cursor))
                while queue and queue[0][0] <= cursor["records"]:
                    digests.append(queue.popleft()[1])
            return {"worker": worker, "done": done, "cursors": cursors, "digests": b"".join(digests)}

        def batch() -> dict:
            counts: dict[int, list[int]] = {}
            if rows_tokens is not None and row_sources.count(row_sources[0]) == len(row_sources):  # one source
                counts[row_sources[0]] = [rows_tokens(rows), len(rows)]
            else:
                for row, s in zip(rows, row_sources):
                    tally = counts.setdefault(s, [0, 0])
                    tally[0] += fmt.row_tokens(row)
                    tally[1] += 1
            out: dict[str, Any] = {**fmt.batch(rows), "_state": {**state(False), "counts": counts}}
            if self.ledger:
                out["_state"]["ledger"] = pieces_array(held, dropped, fmt.packed_rows(rows))
                held.clear()
                dropped.clear()
            rows.clear()
            row_sources.clear()
            for key in [k for k, (p, _) in touched.items() if p.done]:
                del touched[key]
            return out

        chunk: list[tuple[Record, Any, int]] = []

        def flush(encoded: list[Any] | None = None) -> Iterator[dict]:
            if not chunk:
                return
            items = encoded or fmt.encode([r[0] for r, _, _ in chunk], [i for _, _, i in chunk])
            size = self.batch_size
            packer, queue = chunk[0][1]
            if (type(packer) is WindowCutter and not packer.skip and len(chunk) > 1
                    and all(t[0] is packer for _, t, _ in chunk)):  # one plain cutter: the whole chunk at once
                yield from chunk_windows(packer, queue, chunk, items, rows, row_sources, size, batch)
                chunk.clear()
                return
            for ((_, after, digest), (packer, queue), source), item in zip(chunk, items):
                if digest is not None:
                    queue.append((packer.records + 1, digest))
                for window in packer.feed(item, after):  # most short documents complete no window
                    rows.append(window)
                    row_sources.append(source)
                    if self.ledger:
                        held.append(packer.last)
                    if len(rows) == size:
                        yield batch()
            chunk.clear()

        chars, limit_records, limit_chars = 0, self.chunk_records, self.chunk_chars
        for event in self._events(parts, touched):
            if event[0] == "record":  # the common event first: a short document's cost is per event
                chunk.append(event[1:])
                chars += len(event[1][0])
                if len(chunk) >= limit_records or chars >= limit_chars:
                    yield from flush()
                    chars = 0
                continue
            if event[0] == "end":  # a group is read to its end: its last, short windows
                yield from flush()
                chars = 0
                for packer in event[1]:
                    for window in packer.finish():
                        rows.append(window)
                        row_sources.append(event[2])
                        if self.ledger:
                            held.append(packer.last)
                        if len(rows) == self.batch_size:
                            yield batch()
                continue
            if event[0] == "drop":  # a duplicate the source dropped: accounted for once the cursor passes it
                event[1].drop(event[2])
                continue
            if event[0] == "skip":  # a record dropped by id: its cursor moves as if fed (text/skips.py)
                yield from flush()
                chars = 0
                (_, after, digest), (packer, queue) = event[1], event[2]
                if digest is not None:  # the seen-set commits it as if it were read: a copy elsewhere stays a duplicate
                    queue.append((packer.records + 1, digest))
                skip_record(packer, after, fmt.tokens(event[4]) if len(event) > 4 else 0)
                continue
            if event[0] == "encoded":  # drawn by tokens: encoded when drawn, fed in draw order
                yield from flush()
                chars = 0
                chunk.append(event[1:4])
                yield from flush([event[4]])
                continue
            raise AssertionError(f"unknown text stream event {event[0]!r}")
        yield from flush()
        if rows:
            yield batch()
        last = {**state(True), "counts": {}, "stats": dict(self.source.stats)}
        if self.ledger and dropped:  # drops after the last row: the module keeps them for the next step
            last["ledger"] = pieces_array([], dropped)
        yield {"_state": last}

    def _events(self, parts: list[Partition], touched: dict) -> Iterator[tuple]:
        """("record", record, (packer, queue), source) and ("end", packers) events, the sources mixed."""
        by_source: dict[int, list[Partition]] = {}
        for p in parts:
            by_source.setdefault(p.source, []).append(p)
        streams = {i: self._source_events(ps, touched, i) for i, ps in sorted(by_source.items())}
        mixture = as_mixture(self.source)
        if mixture is None or len(streams) == 1:
            for stream in streams.values():
                yield from stream
            return
        # draws (records, tokens) from each source since the schedule's last change point
        counts, tokens, drawn = [0] * len(mixture.sources), [0] * len(mixture.sources), 0
        for p in parts:
            cursor = self.cursors.get(p.key, {})
            records, anchor = int(cursor.get("records", 0)), self.mix_anchors.get(p.key, (0, 0))
            counts[p.source] += records - anchor[0]
            tokens[p.source] += int(cursor.get("tokens", 0)) - anchor[1]
            drawn += records
        weights = self.mix_weights or mixture.weights
        by_tokens = mixture.unit == "tokens"
        if by_tokens:  # each draw needs the tokens of the records drawn before it: encode as they are read
            # a shared seen-set drops a record another source read first: read strictly in draw order there
            ahead = 1 if isinstance(self.source, DedupTextSource) else self.chunk_records
            streams = {i: self._encoded(stream, i, ahead) for i, stream in streams.items()}
        live = sorted(streams)
        while live:
            i = choose(mixture.strategy, live, counts, weights, self.mix_seed, self._consumer,
                       tokens if by_tokens else None, drawn)
            for event in streams[i]:
                if event[0] in ("encoded", "skip") and len(event) > 4:  # a skipped record counts as drawn
                    tokens[i] += self.format.tokens(event[4])
                yield event
                if event[0] not in ("end", "drop"):  # a dropped duplicate is no draw
                    counts[i] += 1
                    drawn += 1
                    break
            else:
                live.remove(i)

    def _encoded(self, stream: Iterator[tuple], source: int, ahead: int) -> Iterator[tuple]:
        """One source's events, its records encoded up to `ahead` at a time ("encoded" events, item last).

        Reading ahead inside one source changes nothing it yields: which source is drawn
        next depends only on the events already taken, and each source's order is its own.
        """
        pending: list[tuple] = []

        def encode() -> list[tuple]:
            records = [e for e in pending if e[0] in ("record", "skip")]  # a skip's tokens count in the draws
            items = iter(self.format.encode([e[1][0] for e in records], [source] * len(records)))
            out = [(("encoded" if e[0] == "record" else "skip"), *e[1:], next(items))
                   if e[0] in ("record", "skip") else e for e in pending]
            pending.clear()
            return out

        count = 0
        for event in stream:
            pending.append(event)
            count += event[0] in ("record", "skip")
            if event[0] == "end" or count >= ahead:
                yield from encode()
                count = 0
        yield from encode()

    def _source_events(self, parts: list[Partition], touched: dict, source: int) -> Iterator[tuple]:
        """One source's events: its groups in order, each group's records then its end."""
        fmt = self.format
        for group in _groups(parts):
            live: list[tuple[Partition, Any, deque]] = []
            resumed_cut: set[int] = set()  # packers resumed inside a record's cut: that record is read already
            for part in group:
                cursor = self.cursors.get(part.key)
                if cursor is not None and cursor.get("done"):
                    continue
                packer = fmt.packer(cursor)
                if self.ledger:  # the packer's rows name their documents (text/provenance.py)
                    pass_ = int((cursor or {}).get("pass", 0))
                    packer = track(packer, cursor, record_name(part), source, pass_)
                live.append((part, packer, deque()))
                touched[part.key] = live[-1][1:]
                if (cursor or {}).get("skip"):
                    resumed_cut.add(id(packer))
            if not live:
                continue
            # stripes of one base are read together: one pass over the base serves them all
            route = _router(live)
            start = min(packer.offset for _, packer, _ in live)
            base = live[0][0]
            if base.base is not None:
                base = replace(base, key=base.base, stripe=None, stripes=1, base=None)
            mark_reading(f"partition {base.key}")  # what the data watchdog names (llm/data/waiting.py)
            records = self.source.iter_partition(base, start, lambda row, r=route: r(row) is not None)
            drop = self.skips.get((source, record_name(live[0][0]))) if self.skips else None
            if live[0][0].stripe is None and drop is None and not resumed_cut:  # one target, nothing to skip
                target = live[0][1:]
                for record in records:
                    if record[2] == b"":  # a duplicate dropped (report_drops)
                        yield ("drop", target[0], record[1])
                    else:
                        yield ("record", record, target, source)
                yield ("end", [packer for _, packer, _ in live], source)
                continue
            for record in records:
                target = route(record[1])
                if target is not None and record[2] == b"":  # a duplicate dropped (report_drops)
                    yield ("drop", target[0], record[1])
                elif target is not None:  # sources may ignore `want`
                    cut = id(target[0]) in resumed_cut
                    resumed_cut.discard(id(target[0]))
                    skip = drop is not None and record[1] in drop and not cut
                    yield ("skip" if skip else "record", record, target, source)
            yield ("end", [packer for _, packer, _ in live], source)


def _groups(parts: list[Partition]) -> list[list[Partition]]:
    """Owned partitions grouped by base (stripes of one file / shard together), in order."""
    groups: dict[str, list[Partition]] = {}
    for p in parts:
        groups.setdefault(p.group, []).append(p)
    return list(groups.values())


def _router(live: list[tuple[Partition, WindowCutter, deque]]):
    """row -> (packer, digest queue) of the live partition that owns that row, or None."""
    if live[0][0].stripe is None:
        only = live[0][1:]
        return lambda row: only
    stripes = live[0][0].stripes
    # a stripe resumes after its own cursor: rows up to it were consumed already
    table = {p.stripe: (packer.offset, (packer, queue)) for p, packer, queue in live}

    def route(row: int):
        hit = table.get((row - 1) % stripes)
        return hit[1] if hit is not None and row > hit[0] else None

    return route
