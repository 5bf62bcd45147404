"""`StreamingTextDataModule`: config -> source, tokenizer and loader, with the stream's exact state.

The module runs the workers (`dataset.py`), applies each batch's cursors when
it hands the batch over, and owns the state: every partition's cursor, which
worker serves next, and the dedup seen-set's commit (`checkpoint_state()`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from llm.data.inputs.dedup import DedupTextSource
from llm.data.inputs.mixture import as_mixture
from llm.data.inputs.partitions import STRIPES, owned_partitions, stripe_partitions
from llm.data.inputs.readers import require_records
from llm.data.inputs.registry import build_text_source
from llm.data.inputs.source import (
    FINGERPRINT_MISMATCH,
    Partition,
    TextSource,
    validate_source_fingerprint,
)
from llm.data.ledger.writer import check_ledger_state
from llm.data.mix.progress import MixProgress
from llm.data.pack.best_fit import check_open_blocks, window_slots
from llm.data.pack.window import listed, new_cursor
from llm.data.seeds import check_seed
from llm.data.stage import Stage
from llm.data.text.changes import SourceChange, source_change
from llm.data.text.dataset import StreamingTextDataset
from llm.data.text.ledger import LedgerHooks, TextLedger
from llm.data.text.loaders import StreamingTextLoader, batches_as_they_are, val_loader
from llm.data.text.skips import SkipHooks
from llm.data.text.state import (
    STATE_VERSION,
    check_known_partitions,
    check_layout,
    check_not_all_seen,
    check_seen_count,
    merge_stream_states,
    mixture_seed,
    warn_uncommitted,
)
from llm.data.text.wire import group_size, open_group, ungrouped, unpack
from llm.data.text.workers import text_loader
from llm.data.topology import current_topology
from llm.data.waiting import WorkerSlots
from llm.data.watchdog import Watchdog
from llm.data.worker_errors import reraise

__all__ = ["FINGERPRINT_MISMATCH", "StreamingTextDataModule", "StreamingTextLoader", "merge_stream_states"]


class StreamingTextDataModule(SkipHooks, LedgerHooks, Stage):
    """Config -> source, tokenizer, dataset and loader, a `Stage` (state / check / restore).

    `state_dict()` / `load_state_dict()` are the contract's public names; a refused state (`StateError`)
    leaves the module exactly as it was. `train_dataloader()` yields `steps_per_epoch` batches per epoch,
    continuing the stream where the previous epoch stopped; when this rank's partitions are all read it
    starts a new pass over them (`loop=False`: stop instead). `ledger=FOLDER`: the run ledger (text/ledger.py);
    `skip_documents`: ids of records dropped wherever they would be read (a list or a file; text/skips.py).
    """
    piece_slots = staticmethod(window_slots)  # the slots one of best fit's pieces fills (sft: a sample's)

    def __init__(
        self,
        config: Any,
        batch_size: int,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        steps_per_epoch: int | None = None,
        loop: bool = True,
        source: TextSource | None = None,
        tokenizer: Any = None,
        seed: int | None = None,
        ledger: str | os.PathLike | None = None,
        skip_documents: list[str] | str | os.PathLike | None = None,
    ):
        from llm.data.tokenize.foreign import as_tokenizer

        # a DataConfig or a TextStreamConfig (text/settings.py): both give the typed settings
        settings = self.settings = config.text_stream()
        self.config = config
        self.batch_size = batch_size
        self.steps_per_epoch = steps_per_epoch or settings.steps_per_epoch
        if self.steps_per_epoch is None and loop:
            raise ValueError(
                "steps_per_epoch is required for streaming data; set data.steps_per_epoch "
                "(or --steps-per-epoch) to the number of batches in one epoch"
            )
        self.loop = loop
        # the root seed (training.seed): a random mixture's draws derive from it
        self.seed = check_seed(settings.seed if seed is None else seed, "seed")
        self._version = STATE_VERSION  # a resumed version-1 state keeps its own derivation (and version)
        self.rank, self.world_size = rank, world_size
        self.num_workers = settings.num_workers
        self.source = source if source is not None else build_text_source(settings.source)
        self.tokenizer = as_tokenizer(settings.tokenizer if tokenizer is None else tokenizer)  # or a foreign object
        self.max_seq_len = settings.max_seq_len
        self._cursors: dict[str, dict] = {}
        self._next_worker: dict[str, int] = {}
        self._last_key: str | None = None
        self._uncommitted: list[bytes] = []
        self._parts: list[Partition] | None = None
        self._pass_stats: dict[str, int] = {}
        self._entries_checked = False  # has a mixture's every entry been seen to hold a record?
        self._handed_over = False  # has this module handed any batch over (this run)?
        mixture = as_mixture(self.source)  # position, a schedule's segment, per-source counts (mix/progress.py)
        self.progress = MixProgress(self._source_names(), *((mixture.schedule, mixture.weights) if mixture else ()),
                                    seq_len=self.max_seq_len)
        self._switched = False  # did the last pass stop at a schedule's change point?
        self._ledger: TextLedger | None = None
        self._ledger_state: dict | None = None  # the ledger position of the last state loaded
        self._set_skips(skip_documents)
        if ledger is not None:
            self.attach_ledger(ledger)
        self._watch = Watchdog(type(self).__name__, settings.watchdog_s, settings.watchdog,  # llm/data/watchdog.py
                               WorkerSlots(self.num_workers) if self.num_workers else None)

    def _ledger_topology(self) -> tuple[int, dict]:
        rank, world = current_topology(self.rank, self.world_size)
        return rank, {"world_size": world, "batch_size": self.batch_size, "num_workers": self.num_workers}

    def _source_names(self) -> list[str]:
        """Names of the sources in the accounting: the mixture's entries, or the one source's path stem."""
        mixture, source = as_mixture(self.source), self.settings.source
        if mixture is not None:
            return list(mixture.names)
        return [source.source_name() if source is not None else "data"]

    def source_counts(self) -> dict[str, dict[str, int]]:  # per source, this rank's: {name: {tokens, samples}}
        return self.progress.source_counts()

    # -- identity -------------------------------------------------------------------------
    def source_fingerprint(self) -> dict:
        """The source's fingerprint plus the tokenizer and block length: all that shapes the stream."""
        return {
            **self.source.source_fingerprint(),
            "tokenizer": self.tokenizer.fingerprint(),
            "max_seq_len": self.max_seq_len,
            "stripes": STRIPES,
            **self.settings.packing_fingerprint(),
        }

    def partitions(self) -> list[Partition]:
        """The stream's fixed partitions: byte ranges whole, row-offset partitions in stripes."""
        if self._parts is None:
            self._parts = stripe_partitions(self.source.partitions())
        return self._parts

    def _own(self) -> list[Partition]:
        rank, world = current_topology(self.rank, self.world_size)
        return owned_partitions(self.partitions(), rank, world, self.num_workers)

    # -- iteration ------------------------------------------------------------------------
    def train_dataloader(self) -> StreamingTextLoader:
        """An iterable over `{"input_ids", "labels"}` int64 batches of shape (batch, max_seq_len)."""
        return StreamingTextLoader(self)

    def val_dataloader(self) -> Iterable[dict] | None:
        """One pass over `val_dataset_path` (local files, same tokenizer and blocks); None when unset."""
        return val_loader(self) if self.settings.val_dataset_path else None

    def _iterate(self) -> Iterator[dict]:
        rank, world = current_topology(self.rank, self.world_size)
        own = self._own()
        if not own:
            raise ValueError(
                f"rank {rank} of {world} owns none of the {len(self.partitions())} partitions of the "
                f"data source; use more input files / shards or fewer ranks"
            )
        if self._ledger is not None:
            self._ledger.open(*self._ledger_topology())
        mixture = as_mixture(self.source)
        if mixture is not None and not self._entries_checked:
            mixture.require_records()
            self._entries_checked = True
        limit = self.steps_per_epoch
        steps, passes_without_data = 0, 0
        while limit is None or steps < limit:
            if all(self._cursors.get(p.key, {}).get("done") for p in own):
                if not self.loop or passes_without_data:
                    return
                for p in own:  # a new pass over this rank's partitions
                    self._cursors[p.key] = new_cursor() | {"pass": self._cursors[p.key].get("pass", 0) + 1}
                self.progress.new_pass([p.key for p in own])
            before = steps
            # a pass picked up mid-way may only have the end of its partitions left to mark done
            mid_pass = any(self._cursors.get(p.key, {}).get("offset") or self._cursors.get(p.key, {}).get("records")
                           for p in own)
            self._pass_stats = {}
            for item in self._one_pass(rank, world):
                steps += 1
                yield item
                if limit is not None and steps >= limit:
                    return
            if self._switched:  # a schedule's change point: the same pass goes on with the new weights
                continue
            passes_without_data = int(steps == before and not mid_pass)
            if passes_without_data:
                check_not_all_seen(self._pass_stats, self._dedup(), self._handed_over)
                self._check_not_empty(own)
            if not self.loop:
                return

    def batch_format(self) -> Any:  # how records become batches; None: tokens packed into blocks (dataset.TokenBlocks)
        return None

    def _one_pass(self, rank: int, world: int) -> Iterator[dict]:
        workers = max(1, self.num_workers)
        key, mixture = str(rank), as_mixture(self.source)
        self.progress.enter_segment(self._cursors, [p.key for p in self._own()])
        self._switched = False
        ds = StreamingTextDataset(
            self.source, self.tokenizer, self.max_seq_len, self.batch_size,
            rank=rank, world_size=world, cursors=self._cursors,
            worker_rotation=self._next_worker.get(key, 0), packed=self.num_workers > 0,
            batch_format=self.batch_format(), mix_seed=self._mix_seed(),
            # a mixture reads at most `streaming_buffer_per_dataset` records ahead before encoding
            chunk_records=min(64, mixture.buffer) if mixture is not None else 64, packing_buffer=self.settings.best_fit_buffer(),
            mix_weights=self.progress.weights_now(), mix_anchors=self.progress.anchors,
            ledger=self._ledger is not None, skips=self.document_skips(),
            group=group_size(self.batch_size * (self.max_seq_len + 1)) if self.num_workers else 0,
        )
        if self.num_workers:  # each worker tokenizes on its own core; the Rust thread pool would only oversubscribe
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        # workers of a source in object storage start from a forkserver (text/workers.py)
        loader = text_loader(ds, self.num_workers, self.source.uses_object_store, batches_as_they_are, self._watch, self.steps_per_epoch)
        done: set[int] = set()
        items = self._watch.watched(loader)  # the wait for each message counts, not the batches it holds
        if ds.group:  # several batches a message, their windows converted at once (text/wire.py)
            items = ungrouped(items, self.num_workers,
                              lambda m: open_group(m, self.max_seq_len, self.tokenizer.eos_id, ds.ring))
        for item in items:
            st = item.pop("_state")
            if st.get("error"):  # a worker's error, sent as itself
                reraise(st["error"])
            self._apply(st)
            self._next_worker[key] = (st["worker"] + 1) % workers
            if st["done"]:
                if self._ledger is not None and "ledger" in st:  # dropped after the pass's last row
                    self._ledger.dropped(st["ledger"])
                for k, v in st.get("stats", {}).items():
                    self._pass_stats[k] = self._pass_stats.get(k, 0) + v
                done.add(st["worker"])
                if len(done) == workers:
                    return
                continue
            self._handed_over = True
            self.progress.handed_over(st["counts"], self.batch_size * world)
            if "_packed" in item or "_windows" in item:  # bytes from a worker (dataset.py)
                item.update(unpack(item, self.max_seq_len, self.settings.best_fit_buffer(), self.tokenizer.eos_id))
            if self._ledger is not None:  # the rows as the trainer gets them, with what the worker packed
                self._ledger.record(item["input_ids"], st["ledger"])
            yield item
            if self.progress.at_change():  # new weights from here: restart the workers
                self._switched = True
                return

    def _mix_seed(self) -> int:
        """The seed of a `random` mixture's draws in this pass: derive_seed(root, "text.mixture", pass)."""
        return mixture_seed(self._version, self.seed, min((self._cursors.get(p.key, {}).get("pass", 0)
                                                           for p in self._own()), default=0))

    def _check_not_empty(self, own: list[Partition]) -> None:
        """Local files that yielded no record at all (read whole by this rank) are named, not trained on."""
        files, read = self.source.local_files(), sum(self._cursors.get(p.key, {}).get("records", 0) for p in own)
        if files and not read and len(own) == len(self.partitions()):
            require_records(files, self.settings.text_column)

    def _apply(self, st: dict) -> None:
        for k, cursor in st["cursors"].items():
            prev = self._cursors.get(k, {})
            self._cursors[k] = cursor | {"pass": prev.get("pass", 0)}
            self._last_key = k
        dedup = self._dedup()
        if st["digests"] and dedup is not None:  # only a dedup source sends digests
            dedup.mark_consumed(st["digests"])
            self._uncommitted.append(st["digests"])

    # -- state (the Stage contract: state / check / restore) --------------------------------
    def _dedup(self) -> DedupTextSource | None:
        """The source's seen-set, when it deduplicates (a dedup source or a mixture with dedup entries)."""
        return self.source if isinstance(self.source, DedupTextSource) else None

    def state(self) -> dict:
        """This rank's state: the cursors of its partitions. A pure getter (no I/O, no collective).

        `line_index` (per rank, records consumed) is informational; `partitions` is what resumes. With
        dedup, `seen_hashes.count` is what the seen-hashes file holds and `pending` the consumed records
        not in it yet: `checkpoint_state()` commits them."""
        rank, world = current_topology(self.rank, self.world_size)
        own = {p.key for p in self._own()}
        partitions = {k: listed(c) for k, c in self._cursors.items() if k in own}  # buffers come as arrays
        records = sum(c["records"] for c in partitions.values())
        last = self._cursors.get(self._last_key or "", {})
        state = {
            "version": self._version,
            "seed": self.seed,
            "fingerprint": self.source_fingerprint(),
            "world_size": world,
            "num_workers": self.num_workers,
            "partitions": partitions,
            "next_worker": {str(rank): self._next_worker.get(str(rank), 0)},
            "line_index": {str(rank): records},
            "token_buffer": list(listed(last).get("token_buffer", [])),
            **self.progress.state(rank, own),
        }
        dedup = self._dedup()
        if dedup is not None:
            pending = sum(len(d) for d in self._uncommitted) // dedup.digest_bytes if dedup.writes else 0
            state["seen_hashes"] = {
                "path": str(dedup.seen_hashes_path or ""),
                "count": dedup.committed_count,
                "pending": pending,
            }
        return self._skip_state(state)

    def state_dict(self) -> dict:
        """`state()`; with a ledger, also commits the batches handed out since the last commit."""
        state = self.state()
        if self._ledger is not None:
            state["ledger"] = self._ledger.commit(*self._ledger_topology(), self._cursors, self._own())
        return state

    def checkpoint_state(self) -> dict:
        """The state to store in a checkpoint: every rank's cursors, the dedup seen-set staged, the ledger committed.

        Collective under torch.distributed (every rank calls it, each gets the whole job's state). The
        digests consumed since the seen-hashes file's last commit ride in the state; `save_checkpoint`
        appends them once the checkpoint is on disk (your own: `llm.data.dedup.publish_seen_hashes(state)`)."""
        rank, world = current_topology(self.rank, self.world_size)
        state, dedup = self.state_dict(), self._dedup()
        digests = b"".join(self._uncommitted)
        self._uncommitted = []
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        if distributed and self.rank is None:  # collective
            gathered: list[Any] = [None] * world
            torch.distributed.all_gather_object(gathered, (state, digests))
            state = merge_stream_states([s for s, _ in gathered])
            state["token_buffer"] = gathered[0][0]["token_buffer"]
            others = b"".join(d for r, (_, d) in enumerate(gathered) if r != rank)
            if others and dedup is not None:
                dedup.mark_consumed(others)
            digests = b"".join(d for _, d in gathered)
        if dedup is not None:
            state["seen_hashes"] = dedup.stage_commit(digests)
        return state

    def check(self, state: Any) -> None:
        """Raise StateError naming the key when `state` cannot resume this stream; changes nothing."""
        check_layout(state)
        change = self._source_change(state)
        if change is None:
            validate_source_fingerprint(state.get("fingerprint"), self.source_fingerprint())
        partitions = change.remap(state["partitions"]) if change else state["partitions"]
        check_known_partitions(partitions, [p.key for p in self.partitions()])
        check_open_blocks(partitions, self.max_seq_len, self.settings.best_fit_buffer(), self.piece_slots)
        check_seen_count(self._dedup(), state.get("seen_hashes"))
        if state.get("ledger") is not None:
            check_ledger_state(state["ledger"], "data state 'ledger'")
        self.progress.check(state, sources_changed=change is not None)
        self._check_skips(state)

    def _source_change(self, state: dict) -> SourceChange | None:
        """How a state's cursors move to this run's sources when a mixture's sources changed (text/changes.py)."""
        mixture = as_mixture(self.source)
        given = mixture.given_names if mixture is not None else self.progress.names
        return source_change(state, self.source_fingerprint(), self.progress.names, given,
                             self.settings.mixture_changes == "allow")

    def restore(self, state: dict) -> None:
        """Continue from a checked `state`: exactly on the same topology, by reassigning partitions on another."""
        seen = state.get("seen_hashes")
        dedup = self._dedup()
        if seen and dedup is not None:
            # a state saved without a seen-hashes file says nothing about this run's file: keep it whole
            dedup.restore_committed(seen)
        change = self._source_change(state)
        partitions = change.remap(state["partitions"]) if change else state["partitions"]
        self._cursors = {k: dict(c) for k, c in partitions.items()}
        self._version = state.get("version", 1) if state.get("version", 1) == 1 else STATE_VERSION
        rank, world = current_topology(self.rank, self.world_size)
        # other sources deal the partitions anew, as another topology does
        same = state.get("world_size") == world and state.get("num_workers") == self.num_workers and change is None
        self._next_worker = dict(state.get("next_worker", {})) if same else {}
        self.progress.restore(state, rank, same, self.batch_size * world, sources_changed=change is not None)
        if change is not None:  # the shares start again here: anchor this rank's partitions now
            self.progress.enter_segment(self._cursors, [p.key for p in self._own()])
        self._uncommitted = []
        self._restore_skips(state)
        self._ledger_state = state.get("ledger")
        if self._ledger is not None:
            self._ledger.resume_from(self._ledger_state)
        warn_uncommitted(seen)
